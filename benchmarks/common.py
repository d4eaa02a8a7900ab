"""Helpers the benchmark sections share: timing, the synthetic models, vitviz's full analysis and its overhead.

Sections (``benchmarks.zeroshot``, ``benchmarks.causal``, ...) import these from here, and the driver
(``benchmarks.run``) imports the sections: the imports go one way.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vitviz.analysis.blocks import global_query, head_maps  # noqa: E402
from vitviz.analysis.embeddings import position_similarity  # noqa: E402
from vitviz.analysis.rollout import capture_rollout  # noqa: E402
from vitviz.analysis.stats import summary_table  # noqa: E402
from vitviz.capture.forward import capture, preprocess  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402

__all__ = ["MODELS", "full_analysis", "make_model", "median_time", "overhead"]


def median_time(fn: Callable[[], object], runs: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


MODELS = {  # name: (transformers class, config kwargs, input side)
    "vit-b16-224": ("ViTForImageClassification", "ViTConfig", {"num_labels": 1000}, 224),
    "dinov2-base-518": ("Dinov2Model", "Dinov2Config", {"image_size": 518, "patch_size": 14}, 518),
    "swin-t-224": ("SwinForImageClassification", "SwinConfig", {"num_labels": 1000}, 224),  # the default is Swin-T
}


def make_model(kind: str, folder: Path) -> Path:
    import transformers
    from transformers import ViTImageProcessor

    arch, config, kwargs, side = MODELS[kind]
    torch.manual_seed(0)
    getattr(transformers, arch)(getattr(transformers, config)(**kwargs)).save_pretrained(folder)
    ViTImageProcessor(size={"height": side, "width": side}).save_pretrained(folder)
    return folder


def full_analysis(loaded, image: Image.Image):
    """What the app computes for a new image: capture (with per-head summaries), rollout, the last block's
    global maps, the summary tables and position similarity."""
    cap = capture(loaded, image)
    capture_rollout(cap)
    head_maps(cap.blocks[-1], global_query(cap.blocks[-1]))
    summary_table(cap.blocks, "distance"), summary_table(cap.blocks, "entropy")
    if loaded.position_embeddings is not None:
        position_similarity(loaded.position_embeddings)
    return cap


def overhead(kind: str, folder: Path, runs: int, *, arch: str | None = None, image_tower: bool = False) -> dict:
    """vitviz's full analysis of a new image against the plain SDPA forward (``image_tower``: a two-tower
    model's ``get_image_features``), interleaved, medians; ``arch``: the transformers class (default from MODELS)."""
    import transformers

    loaded = load_model(str(folder))
    plain = (
        getattr(transformers, arch or MODELS[kind][0])
        .from_pretrained(folder, attn_implementation="sdpa", trust_remote_code=False)
        .eval()
    )
    plain.to(loaded.device)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
    size = loaded.default_size
    forward = plain.get_image_features if image_tower else plain

    def plain_inference():
        pixels, _ = preprocess(loaded, [image], size)
        with torch.inference_mode():
            forward(pixel_values=pixels)

    plain_inference(), full_analysis(loaded, image)  # warm-up
    # Interleaved, so that drift of the machine's speed hits both sides alike.
    pairs = [
        (median_time(plain_inference, 1, warmup=0), median_time(lambda: full_analysis(loaded, image), 1, warmup=0))
        for _ in range(runs)
    ]
    t_plain = statistics.median(p for p, _ in pairs)
    t_full = statistics.median(f for _, f in pairs)
    cap = full_analysis(loaded, image)
    return {
        "model": kind,
        "tokens": sum(s.num_tokens for s in cap.stages),
        "blocks": cap.num_blocks,
        "plain_s": round(t_plain, 4),
        "vitviz_s": round(t_full, 4),
        "overhead_ratio": round(t_full / t_plain, 3),
        "record_MiB": round(cap.nbytes / 2**20, 2),
        "attention_precision": cap.attention_precision,
    }
