"""Hybrid R50+ViT-B/16 at 384 px: vitviz's Run of a new image against the model's plain forward (issue 34).

    python -m benchmarks.hybrid [--runs 5] [--device cpu|cuda]

:func:`hybrid_overhead`: random weights (speed does not depend on them), the R50+ViT-B/16
configuration of the paper (ResNet (3, 4, 9), ViT-B, 1 x 1 patches on the stride-16 map) at
384 px: 577 tokens. *Plain inference*: the model loaded with SDPA attention, the image
preprocessed and run under ``inference_mode``, logits read. *Full analysis*: ``get_run`` (the
cache cleared first, so each timing builds one): one forward with eager attention that fills the
capture record (every block's attention in float16, rollout's head means), every named point
(each block's input, output, heads' outputs, MLP output) and the autograd graph from the pixels
to the logits, which relevance, Grad-CAM and the causal views then read without a second
forward. The ResNet runs once in both; its activations are kept only by autograd's graph, and
no vitviz hook records inside it. Also timed: the Run without its graph (``gradients=False``), and
the same three timings for a ``transformers`` ViT-B/16 at 384 px (577 tokens, 12 blocks: the
control), so that what the hybrid adds can be told from what any ViT's Run costs on the device.
Interleaved, medians; goal: the hybrid's full analysis <= 1.3x its plain inference.
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

from benchmarks.common import median_time  # noqa: E402

__all__ = ["hybrid_overhead", "make_r50_vit_b16", "make_vit_b16", "print_row"]


def make_r50_vit_b16(folder: Path, side: int = 384) -> Path:
    """A random R50+ViT-B/16 classifier (1000 classes) for ``side`` px, saved with the paper's processor."""
    from vitviz.zoo.hybrid import HybridViTConfig, HybridViTForImageClassification

    torch.manual_seed(0)
    config = HybridViTConfig(image_size=side, resnet_depths=(3, 4, 9), num_labels=1000)
    return _save(HybridViTForImageClassification(config), folder, side)


def make_vit_b16(folder: Path, side: int = 384) -> Path:
    """The control: a random transformers ViT-B/16 classifier at ``side`` px (the same 577 tokens and blocks)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    return _save(ViTForImageClassification(ViTConfig(image_size=side, num_labels=1000)), folder, side)


def _save(model: torch.nn.Module, folder: Path, side: int) -> Path:
    from transformers import ViTImageProcessor

    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": side, "width": side}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


def _overhead(folder: Path, runs: int, device: str | None) -> dict:
    from vitviz.capture.forward import preprocess
    from vitviz.capture.run import clear_runs, get_run
    from vitviz.models.load import load_model

    loaded = load_model(str(folder), device=device)
    plain = type(loaded.model).from_pretrained(folder, attn_implementation="sdpa", trust_remote_code=False).eval()
    plain.requires_grad_(False).to(loaded.device)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
    size = loaded.default_size

    def plain_inference():
        pixels, _ = preprocess(loaded, [image], size)
        with torch.inference_mode():
            return plain(pixel_values=pixels).logits.float().cpu()

    def eager_inference():  # the loaded model itself: eager attention, vitviz's hooks idle (no call active)
        pixels, _ = preprocess(loaded, [image], size)
        with torch.inference_mode():
            return loaded.model(pixel_values=pixels).logits.float().cpu()

    def full_analysis(gradients: bool = True):
        clear_runs(loaded.model)
        return get_run(loaded, image, gradients=gradients)

    plain_inference(), full_analysis(), full_analysis(False), eager_inference()  # warm-up
    # Interleaved, so that drift of the machine's speed hits every side alike.
    triples = [
        (
            median_time(plain_inference, 1, warmup=0),
            median_time(full_analysis, 1, warmup=0),
            median_time(lambda: full_analysis(False), 1, warmup=0),
            median_time(eager_inference, 1, warmup=0),
        )
        for _ in range(runs)
    ]
    run = full_analysis()
    same = float((run.scores.cpu() - plain_inference()[0]).abs().max())
    t_plain, t_full, t_light, t_eager = (statistics.median(t[i] for t in triples) for i in range(4))
    clear_runs(loaded.model)
    return {
        "tokens": run.capture.num_tokens,
        "blocks": run.capture.num_blocks,
        "plain_s": round(t_plain, 4),
        "vitviz_run_s": round(t_full, 4),
        "run_over_plain": round(t_full / t_plain, 3),
        "run_without_graph_s": round(t_light, 4),
        "run_without_graph_over_plain": round(t_light / t_plain, 3),
        "plain_eager_s": round(t_eager, 4),
        "plain_eager_over_plain": round(t_eager / t_plain, 3),
        "has_graph": run.has_graph,
        "record_MiB": round(run.capture.nbytes / 2**20, 2),
        "max_logit_difference": same,
    }


def hybrid_overhead(runs: int, device: str | None = None, *, control: bool = True) -> dict:
    """The hybrid's Run against its plain forward, and (``control``) the same for a ViT-B/16 at 384 px, in one
    process on one device (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = {
            "model": "R50+ViT-B/16 (random weights)",
            "input": "384 x 384 px",
            "device": str(torch.device(device) if device else ("cuda" if torch.cuda.is_available() else "cpu")),
            "runs": runs,
            **_overhead(make_r50_vit_b16(Path(tmp) / "r50-vit-b16-384"), runs, device),
        }
        if control:
            out["control_vit_b16_384"] = _overhead(make_vit_b16(Path(tmp) / "vit-b16-384"), runs, device)
    return out


def print_row(r: dict) -> None:
    c = r.get("control_vit_b16_384")
    print(
        f"Hybrid {r['model']} at {r['input']} ({r['tokens']} tokens, {r['device']}): plain SDPA forward "
        f"{r['plain_s']} s, vitviz Run (record, named points, graph) {r['vitviz_run_s']} s = "
        f"{r['run_over_plain']}x (goal <= 1.3; without the graph {r['run_without_graph_over_plain']}x); record "
        f"{r['record_MiB']} MiB" + (f"; ViT-B/16 at 384 px in the same run: {c['run_over_plain']}x" if c else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hybrid", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the best available)")
    parser.add_argument("--no-control", action="store_true", help="skip the ViT-B/16 control")
    args = parser.parse_args(argv)
    result = hybrid_overhead(args.runs, args.device, control=not args.no_control)
    print(json.dumps(result, indent=2))
    print_row(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
