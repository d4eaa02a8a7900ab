"""Benchmarks of "Does this head matter?" (``vitviz.causal``); each function returns a dict of numbers.

    python -m benchmarks.causal [--runs 3] [--images 50] [--naive]

* :func:`head_importance_cost`: exact head importance and the fast estimate of a
  ViT-B/16 at 224 (random weights), in forward-equivalents: each timing divided by
  the plain forward of the same loaded model (eager attention, inference mode,
  no capture) timed in the same round, rounds interleaved, medians.
* :func:`one_run_views`: Heads (the capture), Rollout, Relevance, the logit lens,
  attribution and the fast estimate of one image: forward passes through the model's
  own forward and wall time, each view running its own clean forward (the run cache
  cleared before each, as before the Run) against all of them reading one Run.
* :func:`fast_vs_exact_rank_correlation`: on the bundled demo model, the Spearman
  rank correlation between the fast estimate and the exact knock-out table
  ``(L, H)`` of each image (shapes samples 0..n-1), its mean and spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vitviz.capture.forward import preprocess  # noqa: E402
from vitviz.causal import fast_estimate, head_importance  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402

__all__ = ["head_importance_cost", "one_run_views", "fast_vs_exact_rank_correlation", "spearman"]


def _seconds(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t


def one_run_views(folder: str | Path, *, runs: int = 3) -> dict:
    """Forward passes and wall time of six views of one image: each with its own clean forward, or one Run."""
    from vitviz.analysis.rollout import capture_rollout
    from vitviz.capture.gradients import explain_classes
    from vitviz.capture.run import clear_runs, get_run
    from vitviz.causal import direct_logit_attribution, logit_lens

    loaded = load_model(str(folder))
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
    calls = [0]
    handle = loaded.model.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))

    def views(shared: bool) -> None:
        clear_runs()
        cap = get_run(loaded, image).capture
        capture_rollout(cap)
        c = cap.predictions[0].index
        for view in (
            lambda: explain_classes(loaded, image, [c]),
            lambda: logit_lens(loaded, image),
            lambda: direct_logit_attribution(loaded, image, target=c),
            lambda: fast_estimate(loaded, image, target=c),
        ):
            if not shared:
                clear_runs()  # as before the Run: every view makes its own clean forward
            view()

    try:
        views(True)  # warm-up
        out: dict[str, dict] = {}
        times: dict[str, list[float]] = {"separate": [], "shared": []}
        for _ in range(runs):
            for name in ("separate", "shared"):
                calls[0] = 0
                times[name].append(_seconds(lambda name=name: views(name == "shared")))
                out.setdefault(name, {})["forwards"] = calls[0]
    finally:
        handle.remove()
        clear_runs()
    sep, shared = statistics.median(times["separate"]), statistics.median(times["shared"])
    return {
        "model": Path(folder).name,
        "views": "heads, rollout, relevance, logit lens, attribution, fast estimate",
        "forwards_separate": out["separate"]["forwards"],
        "forwards_shared": out["shared"]["forwards"],
        "separate_s": round(sep, 3),
        "shared_s": round(shared, 3),
        "shared_over_separate": round(shared / sep, 3),
    }


def head_importance_cost(folder: str | Path, *, runs: int = 3, naive: bool = False) -> dict:
    """Wall time of exact head importance (mean knock-outs, copies started from the cached residual) and of the
    fast estimate, in forward-equivalents of the model saved at ``folder`` (a ViT-B/16 at 224 for the reported
    numbers). ``naive=True`` also times full forwards for every knock-out (145 forward-equivalents of work)."""
    loaded = load_model(str(folder))
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
    size = loaded.default_size
    pixels, _ = preprocess(loaded, [image], size)
    inputs = loaded.family.model_inputs(loaded, pixels, size)

    def plain():
        with torch.inference_mode():
            loaded.family.forward(loaded.model, inputs)

    exact = lambda: head_importance(loaded, image, mode="mean")  # noqa: E731
    fast = lambda: fast_estimate(loaded, image, mode="mean")  # noqa: E731
    full = lambda: head_importance(loaded, image, mode="mean", from_cache=False)  # noqa: E731
    plain(), fast(), exact()  # warm-up (hooks installed, allocator warm)
    rows: dict[str, list[float]] = {"plain": [], "exact": [], "fast": [], "naive": []}
    ratios: dict[str, list[float]] = {"exact": [], "fast": [], "naive": []}
    for _ in range(runs):
        for name, fn in (("exact", exact), ("fast", fast), ("naive", full)):
            if name == "naive" and not naive:
                continue
            before = _seconds(plain)
            t = _seconds(fn)
            after = _seconds(plain)
            rows["plain"] += [before, after]
            rows[name].append(t)
            ratios[name].append(t / ((before + after) / 2))
    work = head_importance(loaded, image).forward_equivalents
    out = {
        "blocks": loaded.config.num_hidden_layers,
        "heads": loaded.config.num_attention_heads,
        "threads": torch.get_num_threads(),
        "runs": runs,
        "plain_forward_s": round(statistics.median(rows["plain"]), 4),
        "exact_s": round(statistics.median(rows["exact"]), 3),
        "fast_s": round(statistics.median(rows["fast"]), 3),
        "exact_forward_equivalents": round(statistics.median(ratios["exact"]), 1),
        "fast_forward_equivalents": round(statistics.median(ratios["fast"]), 2),
        "exact_work_forward_equivalents": work,  # counted: 1 + H (L + 1) / 2 block passes / L
    }
    if naive:
        out["naive_s"] = round(statistics.median(rows["naive"]), 3)
        out["naive_forward_equivalents"] = round(statistics.median(ratios["naive"]), 1)
    return out


def _ranks(a: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank)."""
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a), float)
    ranks[order] = np.arange(len(a), dtype=float)
    for v in np.unique(a):
        tie = a == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two equally long vectors (NaN entries dropped pairwise)."""
    a, b = np.asarray(a, float).ravel(), np.asarray(b, float).ravel()
    keep = ~(np.isnan(a) | np.isnan(b))
    ra, rb = _ranks(a[keep]), _ranks(b[keep])
    return float(np.corrcoef(ra, rb)[0, 1])


def fast_vs_exact_rank_correlation(n_images: int = 50, *, mode: str = "mean") -> dict:
    """Per image of the demo model (shapes samples 0..n-1): Spearman between the fast estimate and the exact
    knock-out effects on the predicted class, over the 16 heads; summary statistics over images."""
    from vitviz.data.shapes import make_sample

    loaded = load_model("demo")
    rhos, pearsons, top_agree = [], [], []
    t = time.perf_counter()
    for seed in range(n_images):
        image = make_sample(seed).image
        exact = head_importance(loaded, image, mode=mode).effects.ravel()
        est = fast_estimate(loaded, image, mode=mode).effects.ravel()
        rhos.append(spearman(est, exact))
        pearsons.append(float(np.corrcoef(est, exact)[0, 1]))
        top_agree.append(int(np.argmax(np.abs(est))) == int(np.argmax(np.abs(exact))))
    r = np.asarray(rhos)
    return {
        "images": n_images,
        "mode": mode,
        "spearman_mean": round(float(r.mean()), 3),
        "spearman_std": round(float(r.std()), 3),
        "spearman_min": round(float(r.min()), 3),
        "spearman_median": round(float(np.median(r)), 3),
        "spearman_q10": round(float(np.quantile(r, 0.1)), 3),
        "pearson_median": round(float(np.median(pearsons)), 3),
        "same_top_head_share": round(float(np.mean(top_agree)), 3),
        "seconds": round(time.perf_counter() - t, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--naive", action="store_true", help="also time full forwards for every knock-out")
    args = parser.parse_args(argv)
    from benchmarks.common import make_model

    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        vit = make_model("vit-b16-224", Path(tmp) / "vit")
        results["head_importance_cost"] = head_importance_cost(vit, runs=args.runs, naive=args.naive)
        results["one_run"] = one_run_views(vit, runs=args.runs)
    results["fast_vs_exact"] = [fast_vs_exact_rank_correlation(args.images, mode=m) for m in ("mean", "zero")]
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
