"""AttnLRP's cost in forward-equivalents (issue 24: <= 3 per image on CPU).

:func:`attnlrp_cost`: median wall time of :func:`vitviz.methods.attnlrp.relevance` (one forward
with a graph through the rule copy, one backward) over the median of the model's plain forward
(``class_logits`` under ``inference_mode``), interleaved, ViT-B/16 at 224 with random weights.
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
from vitviz.methods.attnlrp import relevance  # noqa: E402
from vitviz.methods.base import Inputs, class_logits  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402

__all__ = ["attnlrp_cost"]


def attnlrp_cost(folder: str | Path, *, runs: int = 3) -> dict:
    loaded = load_model(str(folder))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8))
    inputs = Inputs(loaded, image)
    x, hw = inputs.pixels(), inputs.input_size

    def forward():
        with torch.inference_mode():
            class_logits(loaded, x, hw)

    def lrp():
        relevance(loaded, x, hw, target=0)

    forward(), lrp()  # warm-up
    pairs = [(median_time(forward, 1, warmup=0), median_time(lrp, 1, warmup=0)) for _ in range(runs)]
    t_fwd = statistics.median(p for p, _ in pairs)
    t_lrp = statistics.median(q for _, q in pairs)
    return {
        "model": "vit-b16-224",
        "forward_s": round(t_fwd, 4),
        "attnlrp_s": round(t_lrp, 4),
        "forward_equivalents": round(t_lrp / t_fwd, 2),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attnlrp", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(attnlrp_cost(make_model("vit-b16-224", Path(tmp) / "vit"), runs=args.runs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
