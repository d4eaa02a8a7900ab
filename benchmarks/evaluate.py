"""Throughput of ``python -m vitviz evaluate``: the local engine against Ray on a local cluster of this machine.

    python -m benchmarks.evaluate [--n 40] [--methods all] [--cpus 2]

The demo model on ``n`` demo images (a seed of their own), every method that applies
(or ``--methods``). Both engines run the same images through :func:`evaluate_dataset`
into fresh result files. ``*_end_to_end_images_per_s`` counts everything the command
does (listing, model loading, for Ray its start-up and the actors' model loads);
``*_steady_images_per_s`` is the rate between the first and the last finished image,
(n - 1) / (t_last - t_first). Local runs with torch's default threads; Ray with one
actor per CPU of a ``num_cpus=cpus`` local cluster, one thread each. Goal on one
machine: ``ray_over_local`` (steady) >= 0.7.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vitviz.data.shapes import write_dataset  # noqa: E402
from vitviz.evaluate.run import evaluate_dataset  # noqa: E402

__all__ = ["evaluate_throughput", "engine_throughput", "labels_throughput"]

DATA_SEED = 31337  # demo images never used for training (write_dataset: seed * 1_000_003 + i)


def engine_throughput(
    csv_path: Path,
    out: Path,
    *,
    engine: str,
    methods: Sequence[str] | None,
    actors: int | None = None,
    model: str = "demo",
    labels: str | None = None,
) -> dict:
    """One run of one engine: end-to-end and steady images/s (module docstring)."""
    stamps: list[float] = []
    last = [0]

    def progress(done: int, total: int) -> None:
        if done > last[0]:
            stamps.extend([time.perf_counter()] * (done - last[0]))
            last[0] = done

    t0 = time.perf_counter()
    report = evaluate_dataset(
        model, csv_path, out, methods=methods, engine=engine, progress=progress, ray_actors=actors, labels=labels
    )
    total = time.perf_counter() - t0
    n = report.evaluated
    steady = (n - 1) / (stamps[-1] - stamps[0]) if n > 1 and stamps[-1] > stamps[0] else float("nan")
    return {
        "images": n,
        "seconds": round(total, 2),
        "end_to_end_images_per_s": round(n / total, 3),
        "steady_images_per_s": round(steady, 3),
        "first_image_after_s": round(stamps[0] - t0, 2) if stamps else None,
        "methods": list(report.methods),
    }


def evaluate_throughput(
    n: int = 40, *, methods: Sequence[str] | None = None, cpus: int = 2, folder: Path | None = None
) -> dict:
    """Local engine vs Ray on a local ``cpus``-CPU cluster, demo model, ``n`` images; a dict for the JSON report."""
    import ray

    from vitviz.evaluate.ray_engine import start_local_ray

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(folder or tmp)
        csv_path = write_dataset(root / "shapes", n=n, seed=DATA_SEED)
        local = engine_throughput(csv_path, root / "local.parquet", engine="local", methods=methods)
        t = time.perf_counter()
        start_local_ray(num_cpus=cpus)
        startup = time.perf_counter() - t
        try:
            remote = engine_throughput(csv_path, root / "ray.parquet", engine="ray", methods=methods, actors=cpus)
        finally:
            ray.shutdown()
    remote["seconds"] = round(remote["seconds"] + startup, 2)
    remote["end_to_end_images_per_s"] = round(remote["images"] / remote["seconds"], 3)
    return {
        "model": "demo",
        "images": n,
        "methods": local["methods"],
        "torch_threads_local": torch.get_num_threads(),
        "ray_cpus": cpus,
        "ray_startup_s": round(startup, 2),
        "local": local,
        "ray": remote,
        "ray_over_local": round(remote["steady_images_per_s"] / local["steady_images_per_s"], 2),
        "ray_over_local_end_to_end": round(remote["end_to_end_images_per_s"] / local["end_to_end_images_per_s"], 2),
        "target_ray_over_local": 0.7,
    }


def labels_throughput(n: int = 20, *, methods: Sequence[str] | None = None, repeats: int = 2) -> dict:
    """``evaluate --labels`` on demo-clip (its five class names) against ``evaluate`` on demo, same images, local.

    Runs alternate (demo, demo-clip, demo, ...) ``repeats`` times; the best steady rate of each
    counts. Goal: demo-clip's images/s within 20 % of demo's (``labels_over_classes`` >= 0.8).
    """
    from vitviz.demo.clip import LABELS

    rates: dict[str, list[dict]] = {"demo": [], "demo-clip": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        csv_path = write_dataset(root / "shapes", n=n, seed=DATA_SEED)
        for r in range(repeats):
            for model, labels in (("demo", None), ("demo-clip", LABELS)):
                out = root / f"{model}-{r}.parquet"
                rates[model].append(
                    engine_throughput(csv_path, out, engine="local", methods=methods, model=model, labels=labels)
                )
    best = {m: max(x["steady_images_per_s"] for x in runs) for m, runs in rates.items()}
    return {
        "images": n,
        "methods": rates["demo"][0]["methods"],
        "labels": LABELS,
        "torch_threads": torch.get_num_threads(),
        "demo_steady_images_per_s": best["demo"],
        "demo_clip_labels_steady_images_per_s": best["demo-clip"],
        "labels_over_classes": round(best["demo-clip"] / best["demo"], 2),
        "target_labels_over_classes": 0.8,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.evaluate")
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--methods", default=None, help="comma-separated (default: all that apply)")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--labels", action="store_true", help="evaluate --labels on demo-clip vs evaluate on demo")
    args = parser.parse_args(argv)
    methods = None if args.methods is None else args.methods.split(",")
    if args.labels:
        print(json.dumps(labels_throughput(args.n, methods=methods), indent=2))
        return 0
    print(json.dumps(evaluate_throughput(args.n, methods=methods, cpus=args.cpus), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
