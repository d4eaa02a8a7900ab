"""Benchmarks of activation patching (``vitviz.causal.patching``); each function returns a dict of numbers.

    python -m benchmarks.patching [--runs 3] [--pairs 50] [--residual-size 96]

* :func:`patching_cost`: a ViT-B/16 (random weights) on the CPU, in forward-equivalents:
  each timing divided by the plain forward of the same model at the same input size
  (eager attention, inference mode), timed in the same round, medians. Per-head exact
  patching and the estimate at 224 px; the full residual grid (every block x every
  token) at ``residual_size`` px (default 96: T = 37; at 224, T = 197, the counted work
  is reported beside it). The cached clean runs are dropped before every timed call,
  so both clean forwards are counted.
* :func:`estimate_vs_exact`: on the bundled demo model, ``pairs`` pairs of shapes
  samples (target 2i, source 2i + 1): Spearman's rank correlation between
  attribution patching and exact patching, per pair, for the residual grid (L x T)
  and the head grid (L x H); summary statistics over pairs.
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

from vitviz.analysis.first_order import rank_correlation  # noqa: E402
from vitviz.capture.forward import preprocess  # noqa: E402
from vitviz.capture.run import clear_runs  # noqa: E402
from vitviz.causal.patching import activation_patching  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402

__all__ = ["patching_cost", "estimate_cost", "estimate_vs_exact"]


def _seconds(fn: Callable[[], object]) -> float:
    clear_runs()
    t = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t


def _image(seed: int, side: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))


def _ratio(loaded, size: tuple[int, int], fn: Callable[[], object], runs: int) -> tuple[float, float, float, object]:
    """(median seconds of ``fn``, median plain forward, median ratio, ``fn``'s last result), rounds interleaved.

    Warm-up: the plain forward only (the patching calls are long enough that their first call is typical)."""
    pixels, _ = preprocess(loaded, [_image(0, size[0])], size)
    inputs = loaded.family.model_inputs(loaded, pixels, size)

    def plain():
        with torch.inference_mode():
            loaded.family.forward(loaded.model, inputs)

    plain()
    plain()  # warm-up
    times, plains, ratios = [], [], []
    result = None
    for _ in range(runs):
        before = _seconds(plain)
        clear_runs()
        t = time.perf_counter()
        result = fn()
        t = time.perf_counter() - t
        after = _seconds(plain)
        times.append(t)
        plains += [before, after]
        ratios.append(t / ((before + after) / 2))
    return statistics.median(times), statistics.median(plains), statistics.median(ratios), result


def patching_cost(folder: str | Path, *, runs: int = 3, residual_size: int = 96) -> dict:
    """Forward-equivalents of per-head exact patching and the estimate (224 px) and of the full residual grid
    (``residual_size`` px) for the model saved at ``folder`` (a ViT-B/16 for the reported numbers)."""
    loaded = load_model(str(folder))
    size = loaded.default_size
    tgt, src = _image(1, size[0]), _image(2, size[0])
    n_layers = loaded.config.num_hidden_layers

    def heads():
        return activation_patching(loaded, tgt, src, residual=False, estimate=False)

    def estimate():
        return activation_patching(loaded, tgt, src, exact=False)

    small = (residual_size, residual_size)
    tgt_s, src_s = _image(3, residual_size), _image(4, residual_size)

    def residual():
        return activation_patching(loaded, tgt_s, src_s, size=small, heads=False, estimate=False)

    e_s, _, e_ratio, e = _ratio(loaded, size, estimate, runs)
    h_s, plain_s, h_ratio, h = _ratio(loaded, size, heads, runs)
    r_s, plain_small, r_ratio, r = _ratio(loaded, small, residual, runs)
    tokens_small = 1 + (residual_size // 16) ** 2
    tokens_224 = 1 + (size[0] // 16) ** 2
    clear_runs()
    return {
        "blocks": n_layers,
        "heads": loaded.config.num_attention_heads,
        "threads": torch.get_num_threads(),
        "runs": runs,
        "plain_forward_s": round(plain_s, 4),
        "heads_exact_s": round(h_s, 3),
        "heads_exact_forward_equivalents": round(h_ratio, 1),
        "heads_exact_work": h.forward_equivalents,  # counted: 2 + H (L + 1) / 2
        "estimate_s": round(e_s, 3),
        "estimate_forward_equivalents": round(e_ratio, 2),
        "estimate_work": e.forward_equivalents,  # counted: 2 clean runs + 1 backward
        "residual_size": residual_size,
        "residual_tokens": tokens_small,
        "residual_plain_forward_s": round(plain_small, 4),
        "residual_exact_s": round(r_s, 2),
        "residual_exact_forward_equivalents": round(r_ratio, 1),
        "residual_over_L_T": round(r_ratio / (n_layers * tokens_small), 3),
        "residual_work": r.forward_equivalents,  # counted: 2 + T (L - 1) / 2
        "residual_work_224_over_L_T": round((2 + tokens_224 * (n_layers - 1) / 2) / (n_layers * tokens_224), 3),
    }


def estimate_cost(folder: str | Path, *, runs: int = 5, side: int | None = None) -> dict:
    """Attribution patching (``exact=False``) in forward-equivalents, now and as before (the source image got a
    full Run: attention, summaries, capture), in the same rounds: ``total`` with no Run cached (the target's
    clean Run with its graph + the source + one backward), ``marginal`` given the page's clean Run of the target
    (the source + one backward). Each timing is divided by the plain forward (inference mode) timed in the same
    round; medians over ``runs`` rounds, by wall clock and by this process's CPU time (steadier on a shared
    machine: other jobs' load does not count). ``now_another_source``: given the clean Run and an estimate made,
    the estimate for another source image of the same target (the gradients are kept: no backward). ``side``: the
    input size in px (default: the model's; larger inputs make the full Run's attention summaries weigh more)."""
    import vitviz.causal.patching as P
    from vitviz.capture.run import get_activations, get_run

    loaded = load_model(str(folder))
    size = loaded.default_size if side is None else (side, side)
    tgt, src = _image(1, size[0]), _image(2, size[0])
    pixels, _ = preprocess(loaded, [tgt], size)
    inputs = loaded.family.model_inputs(loaded, pixels, size)

    def full_source(loaded, image, *, size, labels, budget_bytes, parts=()):
        return get_run(loaded, image, size=size, labels=labels, budget_bytes=budget_bytes, gradients=False)

    def plain():
        with torch.inference_mode():
            loaded.family.forward(loaded.model, inputs)

    def estimate(before: bool, marginal: bool):
        def call():
            P.get_activations = full_source if before else get_activations
            try:
                return activation_patching(loaded, tgt, src, size=size, exact=False)
            finally:
                P.get_activations = get_activations

        def prepare():
            clear_runs()
            if marginal:
                get_run(loaded, tgt, size=size)

        return prepare, call

    cases = {
        f"{w}_{k}": estimate(w == "before", k == "marginal") for w in ("before", "now") for k in ("total", "marginal")
    }
    src2 = _image(5, size[0])

    def prepare_second():  # the page's clean Run and one estimate made: the user picks another source image
        clear_runs()
        P._GRADS.clear()
        get_run(loaded, tgt, size=size)
        activation_patching(loaded, tgt, src, size=size, exact=False)

    cases["now_another_source"] = (
        prepare_second,
        lambda: activation_patching(loaded, tgt, src2, size=size, exact=False),
    )
    plain(), plain()  # warm-up
    for prepare, call in cases.values():
        prepare(), call()
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}

    def timed(fn) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - w, time.process_time() - c

    for _ in range(runs):
        for name, (prepare, call) in cases.items():
            p1 = timed(plain)
            prepare()
            w, c = timed(call)
            p2 = timed(plain)
            wall[name].append(w / ((p1[0] + p2[0]) / 2))
            cpu[name].append(c / ((p1[1] + p2[1]) / 2))
    clear_runs()
    out: dict = {"threads": torch.get_num_threads(), "runs": runs, "input_px": size[0]}
    for name in cases:
        out[f"{name}_forward_equivalents"] = round(statistics.median(wall[name]), 2)
        out[f"{name}_forward_equivalents_cpu"] = round(statistics.median(cpu[name]), 2)
    return out


def estimate_vs_exact(pairs: int = 50) -> dict:
    """Per pair of demo images: Spearman of the estimate against exact patching (residual and heads grids)."""
    from vitviz.data.shapes import make_sample

    loaded = load_model("demo")
    res_rho, head_rho, top_same = [], [], []
    t = time.perf_counter()
    for i in range(pairs):
        p = activation_patching(loaded, make_sample(2 * i).image, make_sample(2 * i + 1).image)
        res_rho.append(rank_correlation(p.residual_estimate, p.residual))
        head_rho.append(rank_correlation(p.heads_estimate, p.heads))
        eff, est = p.heads - p.clean, p.heads_estimate - p.clean
        top_same.append(int(np.nanargmax(np.abs(eff))) == int(np.nanargmax(np.abs(est))))
    clear_runs()

    def summary(r: list[float]) -> dict:
        a = np.asarray(r)
        a = a[~np.isnan(a)]
        return {
            "mean": round(float(a.mean()), 3),
            "median": round(float(np.median(a)), 3),
            "q10": round(float(np.quantile(a, 0.1)), 3),
            "min": round(float(a.min()), 3),
            "pairs_defined": len(a),
        }

    return {
        "pairs": pairs,
        "residual_spearman": summary(res_rho),
        "heads_spearman": summary(head_rho),
        "same_top_head_share": round(float(np.mean(top_same)), 3),
        "seconds": round(time.perf_counter() - t, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--residual-size", type=int, default=96)
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--estimate-only", action="store_true", help="only the estimate's cost, before and now")
    parser.add_argument("--estimate-side", type=int, default=None, help="input px for --estimate-only")
    args = parser.parse_args(argv)
    from benchmarks.common import make_model

    if args.estimate_only:
        with tempfile.TemporaryDirectory() as tmp:
            vit = make_model("vit-b16-224", Path(tmp) / "vit")
            got = estimate_cost(vit, runs=args.runs, side=args.estimate_side)
            print(json.dumps({"estimate_cost": got}, indent=2))
        return 0

    results: dict = {"estimate_vs_exact": estimate_vs_exact(args.pairs)}
    print(json.dumps(results, indent=2), flush=True)
    if not args.skip_cost:
        with tempfile.TemporaryDirectory() as tmp:
            vit = make_model("vit-b16-224", Path(tmp) / "vit")
            results["patching_cost"] = patching_cost(vit, runs=args.runs, residual_size=args.residual_size)
            results["estimate_cost"] = estimate_cost(vit, runs=args.runs)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
