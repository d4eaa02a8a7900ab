"""Hiera-B at 224 px (random weights): vitviz's full analysis of a new image against the model's plain inference.

    python -m benchmarks.hiera [--runs 9]

* plain: the model's own forward (``HieraForImageClassification``; Hiera has one attention
  implementation, which computes its weights: there is no SDPA path to compare with) in
  inference mode, preprocessing included;
* vitviz, ``run``: what the app does for a new image, from its Run
  (:func:`vitviz.capture.run.get_run`: one forward recording every named point and the
  capture, with the autograd graph within the memory budget), then rollout, the last block's
  global maps and the per-head summary tables (which compute the summaries);
* vitviz, ``capture``: the same analysis from a plain capture (``benchmarks.common.full_analysis``,
  as the other rows of the overhead table).

Interleaved, medians; the cached Run is dropped before each timing. The goal (issue 34) is the
Run's full analysis <= 1.5x plain inference.
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

from benchmarks.common import full_analysis, median_time  # noqa: E402
from vitviz.analysis.blocks import global_query, head_maps  # noqa: E402
from vitviz.analysis.rollout import capture_rollout  # noqa: E402
from vitviz.analysis.stats import summary_table  # noqa: E402
from vitviz.capture.forward import preprocess  # noqa: E402
from vitviz.capture.run import clear_runs, get_run  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402

__all__ = ["make_hiera", "overhead", "run_analysis"]


def make_hiera(folder: Path, **config) -> Path:
    """A random-weight ``HieraForImageClassification``: Hiera-B by default (``HieraConfig()``'s defaults: embed_dim
    96, depths 2-3-16-3, heads 1-2-4-8, 8 x 8 mask units), 1000 classes, 224 px."""
    from transformers import HieraConfig, HieraForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    HieraForImageClassification(HieraConfig(num_labels=1000, **config)).save_pretrained(folder)
    side = int(HieraConfig(**config).image_size[0])
    ViTImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return folder


def run_analysis(loaded, image: Image.Image):
    """The app's analysis of a new image from its Run: the Run, rollout, the last block's maps, the summaries."""
    run = get_run(loaded, image)
    cap = run.capture
    capture_rollout(cap)
    head_maps(cap.blocks[-1], global_query(cap.blocks[-1]))
    summary_table(cap.blocks, "distance"), summary_table(cap.blocks, "entropy")
    return run


def overhead(folder: Path, runs: int, *, name: str = "hiera-b-224") -> dict:
    """Plain inference against the Run's full analysis and the capture's, interleaved (module docstring)."""
    from transformers import HieraForImageClassification

    loaded = load_model(str(folder))
    plain = HieraForImageClassification.from_pretrained(folder, trust_remote_code=False).eval().to(loaded.device)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
    size = loaded.default_size

    def plain_inference():
        pixels, _ = preprocess(loaded, [image], size)
        with torch.inference_mode():
            plain(pixel_values=pixels)

    def fresh_run():
        clear_runs(loaded.model)  # a new image: no cached Run
        run_analysis(loaded, image)

    plain_inference(), fresh_run(), full_analysis(loaded, image)  # warm-up
    rounds = [
        (
            median_time(plain_inference, 1, warmup=0),
            median_time(fresh_run, 1, warmup=0),
            median_time(lambda: full_analysis(loaded, image), 1, warmup=0),
        )
        for _ in range(runs)
    ]
    t_plain, t_run, t_cap = (statistics.median(r[i] for r in rounds) for i in range(3))
    clear_runs(loaded.model)
    run = run_analysis(loaded, image)
    cap = run.capture
    out = {
        "model": name,
        "tokens": sum(s.num_tokens for s in cap.stages),
        "blocks": cap.num_blocks,
        "plain_s": round(t_plain, 4),
        "vitviz_s": round(t_run, 4),
        "overhead_ratio": round(t_run / t_plain, 3),
        "capture_s": round(t_cap, 4),
        "capture_ratio": round(t_cap / t_plain, 3),
        "has_graph": run.has_graph,
        "record_MiB": round(cap.nbytes / 2**20, 2),
        "attention_precision": cap.attention_precision,
        "device": str(loaded.device),
        "torch_threads": torch.get_num_threads(),
    }
    clear_runs(loaded.model)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hiera")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = overhead(make_hiera(Path(tmp) / "hiera"), args.runs)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
