"""Sparse-autoencoder rows (issue 35), ViT-B/16 at 224 (random weights) with a random TopK SAE at ``blocks.6.out``.

    python -m benchmarks.sae [--runs 5] [--images 32] [--width 16] [--k 32]

* ``features``: what the Features page adds for a new image once it has the image's Run: the encoder on every
  token, each token's top features and one feature's map (``vitviz.sae.run.features`` + ``top`` + ``map``),
  against one plain inference of the same image (goal: Run reuse keeps the feature views' own cost small; the
  issue's row is "<= 1.2x one forward" for the whole, which needs the Run's forward itself to be ~1x);
* ``edit``: one feature clamped, the edited run (``vitviz.sae.run.edited``: from the block after the point on),
  against one plain inference (goal <= 1.5x);
* ``collect``: activations of ``--images`` images at the point through the hook registry
  (``vitviz.sae.activations.point_values``, batches of 16), against the bare inference loop over the same
  batches (goal: rate >= 0.8x the bare loop's);
* ``train_step``: one training step of vitviz's trainer (sparse TopK path, AuxK bookkeeping, decoder rows kept
  at unit norm) against a bare PyTorch TopK step of the same shapes (dense encode, ``topk``, dense decode, MSE,
  Adam) (goal: >= 0.8x the bare step's rate, i.e. a time ratio <= 1.25).

Every ratio compares timings interleaved in one run on one machine (medians). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import make_model, median_time  # noqa: E402
from vitviz.capture.forward import preprocess  # noqa: E402
from vitviz.capture.run import clear_runs, get_run  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402
from vitviz.sae.activations import point_values  # noqa: E402
from vitviz.sae.model import SAEConfig, SparseAutoencoder  # noqa: E402
from vitviz.sae.run import FeatureEdit, edited, features  # noqa: E402
from vitviz.sae.train import _step_loss  # noqa: E402

POINT = "blocks.6.out"


def _sae(d_in: int, width: int, k: int) -> SparseAutoencoder:
    torch.manual_seed(0)
    sae = SparseAutoencoder(SAEConfig(d_in=d_in, d_sae=d_in * width, k=k, point=POINT, tokens="patches"))
    with torch.no_grad():
        sae.W_dec.copy_(torch.randn_like(sae.W_dec))
        sae.normalise_decoder()
        sae.W_enc.copy_(sae.W_dec.T)
    return sae


def _pairs(a, b, runs: int) -> tuple[float, float]:
    a(), b()
    got = [(median_time(a, 1, warmup=0), median_time(b, 1, warmup=0)) for _ in range(runs)]
    return statistics.median(x for x, _ in got), statistics.median(y for _, y in got)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--k", type=int, default=32)
    args = ap.parse_args(argv)
    out: dict = {"model": "vit-b16-224 (random weights)", "point": POINT, "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(str(make_model("vit-b16-224", Path(tmp) / "vit")))
        rng = np.random.default_rng(0)
        images = [Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)) for _ in range(args.images)]
        hw = loaded.default_size
        sae = _sae(768, args.width, args.k)

        def plain():
            pixels, _ = preprocess(loaded, images[:1], hw)
            with torch.inference_mode():
                loaded.model(pixel_values=pixels)

        run = get_run(loaded, images[0])

        def feature_views():
            f = features(run, sae)
            f.top()
            f.map(0)

        t_plain, t_feat = _pairs(plain, feature_views, args.runs)
        out["features"] = {"plain_s": t_plain, "features_s": t_feat, "ratio": t_feat / t_plain}
        _, t_edit = _pairs(plain, lambda: edited(run, sae, [FeatureEdit(0, "clamp", 5.0)]), args.runs)
        out["edit"] = {"plain_s": t_plain, "edit_s": t_edit, "ratio": t_edit / t_plain}
        clear_runs()

        batches = [images[i : i + 16] for i in range(0, len(images), 16)]

        def bare_loop():
            for b in batches:
                pixels, _ = preprocess(loaded, b, hw)
                with torch.inference_mode():
                    loaded.model(pixel_values=pixels)

        def collect_loop():
            for b in batches:
                point_values(loaded, POINT, b, hw)

        t_bare, t_coll = _pairs(bare_loop, collect_loop, max(1, args.runs // 2))
        out["collect"] = {"bare_s": t_bare, "collect_s": t_coll, "rate_ratio": t_bare / t_coll}

        x = torch.randn(4096, 768)
        trained = _sae(768, args.width, args.k)
        opt = torch.optim.Adam(trained.parameters(), lr=1e-4)
        since = torch.zeros(trained.d_sae, dtype=torch.long)

        def vitviz_step():
            loss, _ = _step_loss(trained, x, since, 10**9, 0.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            trained.remove_parallel_gradient()
            opt.step()
            trained.normalise_decoder()

        W_enc = torch.nn.Parameter(trained.W_enc.detach().clone())
        W_dec = torch.nn.Parameter(trained.W_dec.detach().clone())
        b_enc = torch.nn.Parameter(torch.zeros(trained.d_sae))
        b_dec = torch.nn.Parameter(torch.zeros(768))
        bare_opt = torch.optim.Adam([W_enc, W_dec, b_enc, b_dec], lr=1e-4)

        def bare_step():
            pre = (x - b_dec) @ W_enc + b_enc
            v, i = torch.topk(pre, args.k, dim=-1)
            f = torch.zeros_like(pre).scatter(-1, i, v.relu())
            loss = (f @ W_dec + b_dec - x).pow(2).sum(-1).mean()
            bare_opt.zero_grad(set_to_none=True)
            loss.backward()
            bare_opt.step()

        t_bare_step, t_step = _pairs(bare_step, vitviz_step, args.runs)
        out["train_step"] = {
            "bare_s": t_bare_step,
            "vitviz_s": t_step,
            "rate_ratio": t_bare_step / t_step,
            "shape": f"4096 tokens x 768 -> {trained.d_sae}, k {args.k}",
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
