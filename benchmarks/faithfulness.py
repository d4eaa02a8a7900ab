"""Cost of the faithfulness curves: deletion + insertion of one image for one map, against one forward pass.

    python -m benchmarks.faithfulness [--runs 3] [--batch-size 20]

Random-weight ViT-B/16 at 224 px (N = 196 patches, 21 points per curve). The map is a
seeded random one: computing a method's map is not part of the curves' cost. Both
sides run the same loaded model (eager attention, nothing recorded) and include
preprocessing; timings are interleaved (curves, then a forward, per run) and the
medians reported. ``floor_ratio`` is what the forwards alone cost at the measured
per-image rate of one batch: the curves cannot be cheaper than that on this device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vitviz.capture.forward import preprocess  # noqa: E402
from vitviz.evaluate.faithfulness import Perturbations  # noqa: E402
from vitviz.methods.base import class_logits  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402

__all__ = ["curves_cost", "make_vit_b16"]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t


def make_vit_b16(folder: Path) -> Path:
    """A random-weight ViT-B/16 classifier (1000 classes, 224 px) saved to ``folder``."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    ViTForImageClassification(ViTConfig(num_labels=1000)).save_pretrained(folder)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def curves_cost(folder: str | Path, *, runs: int = 3, batch_size: int = 20) -> dict:
    """Deletion + insertion of one image (one map) / one forward pass of one image, medians of interleaved runs.

    Returns seconds for one forward (``forward_s``), for both curves from the raw image
    (``curves_s``: preprocessing, blur, the original and every perturbed image), their
    ratio (``curves_over_forward``), the images forwarded (``forwards``), the per-image
    cost inside one batch of ``batch_size`` (``batched_per_image_s``), the ratio the
    forwards alone impose at that rate (``floor_ratio``) and the time spent building
    the perturbed inputs (``build_inputs_s``).
    """
    loaded = load_model(str(folder))
    hw = loaded.default_size
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8))
    values = np.random.default_rng(1).random((hw[0] // loaded.patch_size, hw[1] // loaded.patch_size))

    def forward() -> None:
        pixels, _ = preprocess(loaded, [image], hw)
        with torch.inference_mode():
            class_logits(loaded, pixels, hw)

    last: dict = {}

    def curves() -> None:
        pert = Perturbations(loaded, image, batch_size=batch_size)
        last["result"] = pert.curves(values)
        last["pert"] = pert

    forward(), curves()  # warm-up
    pairs = [(_timed(curves), _timed(forward)) for _ in range(runs)]
    t_curves = statistics.median(c for c, _ in pairs)
    t_forward = statistics.median(f for _, f in pairs)

    pert = last["pert"]
    batch = pert.images(np.zeros((pert.batch_size, pert.num_cells), dtype=np.uint8))

    def batched() -> None:
        with torch.inference_mode():
            class_logits(loaded, batch, hw)

    t_batch = statistics.median(_timed(batched) for _ in range(max(1, runs // 2)))
    codes = np.random.default_rng(2).integers(0, 3, (2 * (pert.forwards - 1), pert.num_cells)).astype(np.uint8)
    t_build = statistics.median(_timed(lambda: pert.images(codes)) for _ in range(3)) / 2  # one map's images
    per_image = t_batch / pert.batch_size
    result = last["result"]
    return {
        "model": "vit-b16-224",
        "device": str(loaded.device),
        "patches": pert.num_cells,
        "points_per_curve": len(result.steps),
        "forwards": pert.forwards,
        "batch_size": pert.batch_size,
        "forward_s": round(t_forward, 4),
        "curves_s": round(t_curves, 4),
        "curves_over_forward": round(t_curves / t_forward, 2),
        "batched_per_image_s": round(per_image, 4),
        "floor_ratio": round(pert.forwards * per_image / t_forward, 2),
        "build_inputs_s": round(t_build, 4),
        "target_ratio": 3.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faithfulness")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = curves_cost(make_vit_b16(Path(tmp) / "vit"), runs=args.runs, batch_size=args.batch_size)
    out["torch_threads"] = torch.get_num_threads()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
