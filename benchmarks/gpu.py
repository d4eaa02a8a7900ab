"""vitviz on a GPU: placement, CPU/GPU parity, reduced precision, speed, memory, the causal path and the methods.

    python -m benchmarks.gpu --out DIR [--device cuda|cpu] [--quick] [--steps env,placement,...]

Writes ``DIR/gpu.json`` (every figure, or each step's error text and traceback) and
``DIR/gpu.txt`` (a short summary), and prints progress as it goes. One failing step never
loses the others: each step, and each part of a step, records its result or its error.

Steps (the checklist of the team's GPU.md):

``env``        versions, the GPU, TF32 defaults, and that no plotly / streamlit module is loaded
``placement``  demo and a random ViT-B/16 on the device: a capture and a Run hold numpy arrays only, and GPU
               memory goes back to the model's own size (after the capture; after ``clear_runs()`` for a Run)
``parity``     float32 CPU against the device with TF32 off (attention, rollout, relevance, summaries within 1e-4),
               then with TF32 on (the largest differences)
``precision``  float16 and bfloat16: top-1 on ``assets/examples/*``, attention against float32, the record's dtypes
``speed``      medians of interleaved runs after warm-up, synchronised: a fresh Run and a plain capture over the
               plain SDPA forward (ViT-B/16 at 224, DINOv2-base at 518); batched export (8, 32) over one image at
               a time; the ``evaluate`` local engine's images per second
``memory``     peak GPU memory per capture and per Run (ViT-B/16 at 224, 384, 518; DINOv2 at 518) against the
               budget's estimate; inputs over the budget are refused with BudgetError before any allocation
``causal``     head importance, activation patching and the other causal analyses on demo on the device, and
               their largest difference from the CPU
``methods``    every explanation method of ``vitviz.methods.METHODS`` on demo on the device, against the CPU

``--quick`` shrinks the two random models (2 blocks, width 64) and their input sizes, and repeats less: a
check that every step runs, for the CPU (``tests/bench/test_benchmark_gpu.py``). The keys are the same.

Imports only the engine's torch path (no ``vitviz.figures``, no plotly): the device machine has neither
plotly nor streamlit. Random weights for ViT-B/16 and DINOv2-base (built from configs, saved with
``save_pretrained``, loaded by ``vitviz.models.load.load_model``); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the device machine: never ask the hub
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from vitviz.analysis.rollout import capture_rollout  # noqa: E402
from vitviz.analysis.stats import summary_table  # noqa: E402
from vitviz.capture.forward import (  # noqa: E402
    DEFAULT_BUDGET_BYTES,
    capture,
    capture_batch,
    input_size_for,
    preprocess,
)
from vitviz.capture.gradients import explain_classes  # noqa: E402
from vitviz.capture.run import clear_runs, get_run  # noqa: E402
from vitviz.errors import BudgetError  # noqa: E402
from vitviz.models.load import LoadedModel, load_model  # noqa: E402

__all__ = ["STEPS", "Plan", "plan_for", "main", "run_steps", "summary_lines"]

FORBIDDEN = ("plotly", "streamlit")  # not installed on the device machine: the engine's torch path must not need them
EXAMPLES = ROOT / "assets" / "examples"
PARITY_TOL = 1e-4  # float32 CPU against the device, TF32 off
PRECISION_TOL = 1e-2  # attention of a float16 / bfloat16 model against float32
EXPORT_GOAL = 1.5  # batched export over one image at a time, images per second
T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[gpu {time.perf_counter() - T0:7.1f}s] {message}", flush=True)


# --- the plan: model configs, sizes, repeats --------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a run measures. ``quick``: tiny stand-ins of the two random models and few repeats (keys unchanged)."""

    quick: bool
    vit: dict  # ViTConfig kwargs (ViTForImageClassification, 1000 labels)
    vit_side: int
    dino: dict  # Dinov2Config kwargs (Dinov2Model, a backbone)
    dino_side: int
    memory_sides: tuple[int, ...]  # ViT-B/16 inputs of the memory step
    repeats: int  # interleaved timing rounds after warm-up
    batches: tuple[int, ...]
    eval_images: int


def plan_for(quick: bool) -> Plan:
    if quick:
        tiny = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
        return Plan(
            quick=True,
            vit={**tiny, "num_labels": 1000, "image_size": 64, "patch_size": 16},
            vit_side=64,
            dino={**tiny, "patch_size": 14, "image_size": 126},
            dino_side=126,
            memory_sides=(64, 96, 128),
            repeats=2,
            batches=(8, 32),
            eval_images=3,
        )
    return Plan(
        quick=False,
        vit={"num_labels": 1000},  # ViTConfig() defaults: ViT-B/16 at 224
        vit_side=224,
        dino=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, patch_size=14, image_size=518),
        dino_side=518,
        memory_sides=(224, 384, 518),
        repeats=7,
        batches=(8, 32),
        eval_images=16,
    )


def make_models(plan: Plan, folder: Path) -> dict[str, Path]:
    """Random-weight ViT-B/16 (1000 classes) and DINOv2-base saved with save_pretrained (seeded), with processors."""
    import transformers
    from transformers import ViTImageProcessor

    out = {}
    specs = {
        "vit": ("ViTForImageClassification", transformers.ViTConfig(**plan.vit), plan.vit_side),
        "dino": ("Dinov2Model", transformers.Dinov2Config(**plan.dino), plan.dino_side),
    }
    for key, (arch, config, side) in specs.items():
        torch.manual_seed(0)
        path = folder / key
        getattr(transformers, arch)(config).save_pretrained(path)
        ViTImageProcessor(size={"height": side, "width": side}).save_pretrained(path)
        out[key] = path
    return out


ARCH = {"vit": "ViTForImageClassification", "dino": "Dinov2Model", "demo": "ViTForImageClassification"}


# --- small helpers ----------------------------------------------------------------------------------


def attempt(fn: Callable[[], dict]) -> dict:
    """``fn()``'s result, or its error and traceback: one failing part never loses the others."""
    t = time.perf_counter()
    try:
        out = fn()
        out = out if isinstance(out, dict) else {"value": out}
        return {"ok": True, **out, "seconds": round(time.perf_counter() - t, 3)}
    except Exception as exc:  # recorded, not raised: the run goes on
        log(f"  error: {type(exc).__name__}: {str(exc)[:300]}")
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc()[-6000:],
            "seconds": round(time.perf_counter() - t, 3),
        }


def is_cuda(dev: torch.device) -> bool:
    return dev.type == "cuda"


def sync(dev: torch.device) -> None:
    if is_cuda(dev):
        torch.cuda.synchronize(dev)


def allocated(dev: torch.device) -> int | None:
    """Bytes of live tensors on the GPU (None on the CPU), after a synchronise and a garbage collection."""
    if not is_cuda(dev):
        return None
    gc.collect()
    sync(dev)
    return int(torch.cuda.memory_allocated(dev))


def release(dev: torch.device) -> None:
    clear_runs()
    gc.collect()
    if is_cuda(dev):
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def warm_up(loaded: LoadedModel, image: Image.Image) -> None:
    """One capture and one Run, dropped: what the first products leave allocated for good (cuBLAS workspaces,
    which the caching allocator counts as allocated) is then part of the baseline, not a leak."""
    capture(loaded, image)
    get_run(loaded, image)
    release(loaded.device)


def model_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def diff(a, b) -> dict:
    """Largest absolute difference of two arrays, and the reference's largest magnitude (for scale)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        return {"max_abs": float("inf"), "ref_max": float("nan"), "shape_mismatch": [list(a.shape), list(b.shape)]}
    both = np.isfinite(a) & np.isfinite(b)
    if not np.array_equal(np.isfinite(a), np.isfinite(b)):
        return {"max_abs": float("inf"), "ref_max": float("nan"), "nan_mismatch": True}
    d = float(np.abs(a[both] - b[both]).max()) if both.any() else 0.0
    return {"max_abs": d, "ref_max": float(np.abs(a[both]).max()) if both.any() else 0.0}


def example_images() -> dict[str, Image.Image]:
    files = sorted(p for p in EXAMPLES.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    return {p.name: Image.open(p).convert("RGB") for p in files}


def noise_image(seed: int, hw: tuple[int, int] = (480, 640)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*hw, 3), dtype=np.uint8))


@contextlib.contextmanager
def tf32(on: bool) -> Iterator[None]:
    """TF32 for float32 matrix products and convolutions on or off, restored afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def loaded_modules() -> dict:
    """Which of the forbidden packages (and other heavy optional ones) this process has imported."""
    tops = {m.split(".")[0] for m in sys.modules}
    return {
        "forbidden_loaded": sorted(t for t in tops if t in FORBIDDEN),
        "optional_loaded": sorted(t for t in tops if t in ("captum", "matplotlib", "ray", "pandas", "torchvision")),
    }


def record_holdings(cap) -> dict:
    """Where a Capture's arrays live: numpy arrays counted; anything else named; tensors that lazy summaries hold
    (a Run's capture computes its per-head summaries on first read, from weights its closure keeps)."""
    numpy_count, others, pending = 0, [], []

    def visit(path: str, value) -> None:
        nonlocal numpy_count
        if value is None:
            return
        if isinstance(value, np.ndarray):
            numpy_count += 1
        else:
            device = str(value.device) if isinstance(value, torch.Tensor) else ""
            others.append(f"{path}: {type(value).__name__} {device}".strip())

    for name in ("image", "logits", "attention_stack", "image_embedding", "patch_weights"):
        visit(name, getattr(cap, name))
    for i, t in enumerate(cap.position.tables):
        visit(f"position.tables[{i}]", t.embeddings)
    for i, b in enumerate(cap.position.biases):
        visit(f"position.biases[{i}]", b.bias)
    for i, s in enumerate(cap.stages):
        visit(f"stages[{i}].token_norms", s.token_norms)
        for j, p in enumerate(s.parents or ()):
            visit(f"stages[{i}].parents[{j}]", p)
    for b in cap.blocks:
        visit(f"blocks[{b.index}].attention", b.attention)
        visit(f"blocks[{b.index}].fused", b.fused)
        s = b.summaries
        if s.computed:
            for k, v in enumerate(s.get()):
                visit(f"blocks[{b.index}].summaries[{k}]", v)
        else:
            for cell in getattr(s._compute, "__closure__", None) or ():
                v = cell.cell_contents
                if isinstance(v, torch.Tensor):
                    pending.append((str(v.device), int(v.numel() * v.element_size())))
    return {
        "numpy_arrays": numpy_count,
        "not_numpy": others,
        "lazy_summary_tensors": len(pending),
        "lazy_summary_bytes": sum(n for _, n in pending),
        "lazy_summary_devices": sorted({d for d, _ in pending}),
    }


def timed(fn: Callable[[], object], dev: torch.device, setup: Callable[[], object] | None = None) -> float:
    if setup is not None:
        setup()
    sync(dev)
    t = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t


def interleaved(fns: dict[str, Callable[[], object]], dev, repeats: int, setups: dict | None = None) -> dict:
    """Median seconds of each function: one warm-up of each (two for the first), then ``repeats`` rounds that
    run every function once in turn (drift of the machine's speed hits all alike)."""
    setups = setups or {}
    for k, fn in fns.items():
        for _ in range(2 if k == next(iter(fns)) else 1):
            timed(fn, dev, setups.get(k))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            times[k].append(timed(fn, dev, setups.get(k)))
    return {k: statistics.median(v) for k, v in times.items()}


# --- the steps ----------------------------------------------------------------------------------------


class Session:
    """Models loaded once and shared by the steps (loads are the slow part of a short run)."""

    def __init__(self, plan: Plan, dev: torch.device, folder: Path) -> None:
        self.plan, self.dev, self.folder = plan, dev, folder
        self._paths: dict[str, Path] | None = None
        self._loaded: dict[tuple[str, str, str], LoadedModel] = {}
        self.images = example_images()

    def path(self, key: str) -> str:
        if key == "demo":
            return "demo"
        if self._paths is None:
            log("building the random-weight models (ViT-B/16, DINOv2-base) ...")
            self._paths = make_models(self.plan, self.folder)
        return str(self._paths[key])

    def model(self, key: str, device: str | torch.device | None = None, dtype: str = "float32") -> LoadedModel:
        dev = str(device or self.dev)
        k = (key, dev, dtype)
        if k not in self._loaded:
            self._loaded[k] = load_model(self.path(key), device=dev, dtype=dtype)
        return self._loaded[k]

    def drop(self, key: str, device: str | torch.device | None = None, dtype: str = "float32") -> None:
        self._loaded.pop((key, str(device or self.dev), dtype), None)
        release(self.dev)


def step_env(s: Session) -> dict:
    import transformers

    dev = s.dev
    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
        "device": str(dev),
        "gpu_name": torch.cuda.get_device_name(dev) if is_cuda(dev) else None,
        "gpu_total_MiB": round(torch.cuda.get_device_properties(dev).total_memory / 2**20) if is_cuda(dev) else None,
        "gpu_capability": list(torch.cuda.get_device_capability(dev)) if is_cuda(dev) else None,
        "cpu_threads": torch.get_num_threads(),
        "tf32_defaults": {
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        },
        "default_budget_MiB": DEFAULT_BUDGET_BYTES // 2**20,
        "VITVIZ_MEMORY_BUDGET_MB": os.environ.get("VITVIZ_MEMORY_BUDGET_MB"),
        "quick": s.plan.quick,
        "examples": sorted(s.images),
        **loaded_modules(),
    }
    return out


def step_placement(s: Session) -> dict:
    dev = s.dev
    out = {}
    for key, image in (("demo", s.images["demo-circle.png"]), ("vit", s.images["cat-chelsea.jpg"])):

        def one(key=key, image=image) -> dict:
            release(dev)
            base0 = allocated(dev)
            loaded = s.model(key)
            params = model_bytes(loaded.model)
            on_device = sorted({str(p.device) for p in loaded.model.parameters()})
            loaded_only = allocated(dev)
            warm_up(loaded, image)
            base = allocated(dev)
            cap = capture(loaded, image)
            after_capture = allocated(dev)
            holdings = record_holdings(cap)
            del cap
            after_capture_dropped = allocated(dev)
            clear_runs()
            run = get_run(loaded, image)
            with_run = allocated(dev)
            run_holdings = record_holdings(run.capture)
            has_graph = run.has_graph
            del run
            clear_runs()
            run_cleared = allocated(dev)
            kept = get_run(loaded, image).capture  # a record that outlives its Run (a view keeps it)
            clear_runs()
            after_clear = allocated(dev)
            summary_table(kept.blocks, "distance")  # reads every block's lazy summaries
            after_summaries = allocated(dev)
            del kept
            after_all = allocated(dev)

            def delta(x):
                return None if x is None or base is None else x - base

            return {
                "model_param_bytes": params,
                "parameter_devices": on_device,
                "allocated_before_load": base0,
                "allocated_model": None if loaded_only is None or base0 is None else loaded_only - base0,
                "allocated_with_model": loaded_only,
                "allocated_after_warm_up": base,  # the baseline of every *_bytes below
                "warm_up_kept_bytes": None if base is None else base - loaded_only,
                "capture_record": holdings,
                "capture_left_on_gpu_bytes": delta(after_capture),
                "capture_left_after_drop_bytes": delta(after_capture_dropped),
                "run_has_graph": has_graph,
                "run_record": run_holdings,
                "run_holds_bytes": delta(with_run),
                "run_left_after_clear_runs_bytes": delta(run_cleared),
                "run_capture_kept_after_clear_runs_bytes": delta(after_clear),
                "run_capture_kept_after_summaries_read_bytes": delta(after_summaries),
                "after_everything_dropped_bytes": delta(after_all),
                "capture_clean": not holdings["not_numpy"] and not holdings["lazy_summary_tensors"],
                "back_to_model_size": None if after_all is None else after_all == base,
                "run_cleared_to_model_size": None if run_cleared is None else run_cleared == base,
            }

        log(f"placement: {key}")
        out[key] = attempt(one)
    return out


def _quantities(loaded: LoadedModel, image: Image.Image, cls: int | None) -> dict[str, np.ndarray]:
    """Every number the parity check compares, from one model on one image (``cls``: the class explained)."""
    clear_runs()
    cap = capture(loaded, image, attention_dtype="float32")
    q: dict[str, np.ndarray] = {"logits": cap.logits, "attention": cap.attentions}
    q["fused"] = np.stack([b.fused for b in cap.blocks])
    q["rollout"] = capture_rollout(cap)[0]
    for what in ("distance", "entropy", "entropy_norm"):
        q[what] = summary_table(cap.blocks, what)
    c = int(np.argmax(cap.logits)) if cls is None else cls
    q["relevance"] = explain_classes(loaded, image, [c])[c].relevance  # its own forward (no Run cached)
    run = get_run(loaded, image)  # the Run's lazy summaries and its graph's relevance (explain_run)
    q["run_entropy"] = summary_table(run.capture.blocks, "entropy")
    q["run_distance"] = summary_table(run.capture.blocks, "distance")
    q["run_relevance"] = explain_classes(loaded, image, [c])[c].relevance
    q["class"] = np.asarray(c)
    clear_runs()
    return q


def step_parity(s: Session) -> dict:
    out = {}
    for key, image in (("demo", s.images["demo-circle.png"]), ("vit", s.images["cat-chelsea.jpg"])):

        def one(key=key, image=image) -> dict:
            ref = _quantities(s.model(key, "cpu"), image, None)
            c = int(ref["class"])
            with tf32(False):
                off = _quantities(s.model(key), image, c)
            with tf32(True):
                on = _quantities(s.model(key), image, c)
            names = [k for k in ref if k != "class"]
            d_off = {k: diff(ref[k], off[k]) for k in names}
            d_on = {k: diff(ref[k], on[k]) for k in names}
            worst_off = max(names, key=lambda k: d_off[k]["max_abs"])
            worst_on = max(names, key=lambda k: d_on[k]["max_abs"])
            return {
                "class": c,
                "tf32_off": d_off,
                "tf32_on": d_on,
                "tf32_off_within_tol": all(d_off[k]["max_abs"] <= PARITY_TOL for k in names),
                "tf32_off_worst": [worst_off, d_off[worst_off]["max_abs"]],
                "tf32_on_worst": [worst_on, d_on[worst_on]["max_abs"]],
                "top1_same": int(np.argmax(off["logits"])) == c and int(np.argmax(on["logits"])) == c,
            }

        log(f"parity: {key}")
        out[key] = attempt(one)
        s.drop(key, "cpu")
    out["tolerance"] = PARITY_TOL
    return out


def step_precision(s: Session) -> dict:
    out = {}
    for key in ("demo", "vit"):
        ref_model = s.model(key)
        with tf32(False):
            refs = {n: capture(ref_model, im, attention_dtype="float32") for n, im in s.images.items()}
        for dtype in ("float16", "bfloat16"):

            def one(key=key, dtype=dtype, refs=refs) -> dict:
                loaded = s.model(key, dtype=dtype)
                per_image = {}
                for name, im in s.images.items():
                    ref = refs[name]
                    got = capture(loaded, im, attention_dtype="float32")
                    top = np.sort(ref.logits)[::-1]
                    per_image[name] = {
                        "top1_float32": int(np.argmax(ref.logits)),
                        "top1": int(np.argmax(got.logits)),
                        "float32_margin": float(top[0] - top[1]),
                        "attention_max_abs": diff(ref.attentions, got.attentions)["max_abs"],
                        "logits_max_abs": diff(ref.logits, got.logits)["max_abs"],
                    }
                default = capture(loaded, s.images["cat-chelsea.jpg"])  # the default float16 storage
                b = default.blocks[0]
                dtypes = {
                    "attention": str(b.attention.dtype),
                    "fused": str(b.fused.dtype),
                    "summaries": str(b.distance.dtype),
                    "logits": str(default.logits.dtype),
                    "token_norms": str(default.stages[0].token_norms.dtype),
                }
                run_check = attempt(lambda: _reduced_run(loaded, s.images["cat-chelsea.jpg"]))
                release(s.dev)
                worst = max(v["attention_max_abs"] for v in per_image.values())
                return {
                    "images": per_image,
                    "top1_unchanged": all(v["top1"] == v["top1_float32"] for v in per_image.values()),
                    "attention_max_abs": worst,
                    "attention_within_tol": worst <= PRECISION_TOL,
                    "record_dtypes": dtypes,
                    "summaries_float": dtypes["summaries"] in ("float32", "float64")
                    and dtypes["fused"] in ("float32", "float64"),
                    "run_and_relevance": run_check,
                }

            log(f"precision: {key} {dtype}")
            out[f"{key}_{dtype}"] = attempt(one)
            s.drop(key, dtype=dtype)
    out["tolerance"] = PRECISION_TOL
    return out


def _reduced_run(loaded: LoadedModel, image: Image.Image) -> dict:
    """A Run, its relevance and rollout on a reduced-precision model: that they run, and their dtypes."""
    clear_runs()
    run = get_run(loaded, image)
    c = int(torch.argmax(run.scores))
    rel = explain_classes(loaded, image, [c])[c].relevance
    roll = capture_rollout(run.capture)[0]
    out = {
        "has_graph": run.has_graph,
        "scores_dtype": str(run.scores.dtype),
        "relevance_finite": bool(np.isfinite(rel).all()),
        "rollout_finite": bool(np.isfinite(roll).all()),
        "relevance_dtype": str(rel.dtype),
        "readout_problem": run.readout_problem[:300],  # the logit lens and attribution refuse when it is set
    }
    clear_runs()
    return out


def _overhead(s: Session, key: str) -> dict:
    import transformers

    dev, plan = s.dev, s.plan
    loaded = s.model(key)
    plain = (
        getattr(transformers, ARCH[key])
        .from_pretrained(s.path(key), attn_implementation="sdpa", trust_remote_code=False)
        .eval()
        .to(dev)
    )
    image = noise_image(0)
    hw = input_size_for(loaded, None, image.size)
    fam = loaded.family

    def plain_forward():
        pixels, _ = preprocess(loaded, [image], hw)
        with torch.inference_mode():
            plain(pixel_values=pixels)

    def eager_forward():  # vitviz's own model (eager attention, hooks installed but idle)
        pixels, _ = preprocess(loaded, [image], hw)
        with torch.inference_mode(), fam.running(loaded.model):
            fam.forward(loaded.model, fam.model_inputs(loaded, pixels, hw))

    def fresh_run():
        get_run(loaded, image)

    t = interleaved(
        {
            "plain_sdpa": plain_forward,
            "eager_idle_hooks": eager_forward,
            "capture": lambda: capture(loaded, image),
            "run": fresh_run,
        },
        dev,
        plan.repeats,
        setups={"run": clear_runs},
    )
    clear_runs()
    run = get_run(loaded, image)
    has_graph, tokens = run.has_graph, run.capture.num_tokens
    del run
    return {
        "input": list(hw),
        "tokens": tokens,
        "run_has_graph": has_graph,
        **{f"{k}_s": round(v, 5) for k, v in t.items()},
        "run_over_plain": round(t["run"] / t["plain_sdpa"], 2),
        "capture_over_plain": round(t["capture"] / t["plain_sdpa"], 2),
        "eager_over_plain": round(t["eager_idle_hooks"] / t["plain_sdpa"], 2),
    }


def _export(s: Session, key: str) -> dict:
    dev, plan = s.dev, s.plan
    loaded = s.model(key)
    n = max(plan.batches)
    images = [noise_image(100 + i, (256, 256)) for i in range(n)]
    fns: dict[str, Callable[[], object]] = {}
    for k in plan.batches:
        fns[f"one_at_a_time_{k}"] = lambda k=k: [capture(loaded, im) for im in images[:k]]
        fns[f"batch_{k}"] = lambda k=k: capture_batch(loaded, images[:k])
    t = interleaved(fns, dev, max(1, plan.repeats // 2))
    out: dict = {"input": list(input_size_for(loaded, None, images[0].size))}
    for k in plan.batches:
        single, batch = k / t[f"one_at_a_time_{k}"], k / t[f"batch_{k}"]
        out[f"one_at_a_time_images_per_s_{k}"] = round(single, 2)
        out[f"batch_{k}_images_per_s"] = round(batch, 2)
        out[f"batch_{k}_over_one_at_a_time"] = round(batch / single, 2)
    out["goal"] = EXPORT_GOAL
    out["meets_goal"] = all(out[f"batch_{k}_over_one_at_a_time"] >= EXPORT_GOAL for k in plan.batches)
    release(dev)
    return out


def _evaluate(s: Session, device: str) -> dict:
    from vitviz.data.shapes import write_dataset
    from vitviz.evaluate.run import evaluate_dataset

    before = loaded_modules()
    stamps: list[float] = []
    last = [0]

    def progress(done: int, total: int) -> None:
        if done > last[0]:
            stamps.extend([time.perf_counter()] * (done - last[0]))
            last[0] = done

    with tempfile.TemporaryDirectory() as tmp:
        csv_path = write_dataset(Path(tmp) / "data", n=s.plan.eval_images, seed=31337)
        t0 = time.perf_counter()
        report = evaluate_dataset(
            "demo", csv_path, Path(tmp) / "out.parquet", engine="local", device=device, progress=progress
        )
        total = time.perf_counter() - t0
    n = report.evaluated
    steady = (n - 1) / (stamps[-1] - stamps[0]) if n > 1 and stamps[-1] > stamps[0] else float("nan")
    return {
        "device": device,
        "images": n,
        "methods": list(report.methods),
        "skipped": [f"{x}"[:300] for x in report.skipped[:5]],
        "seconds": round(total, 2),
        "end_to_end_images_per_s": round(n / total, 3),
        "steady_images_per_s": round(steady, 3),
        "forbidden_loaded_by_evaluate": sorted(
            set(loaded_modules()["forbidden_loaded"]) - set(before["forbidden_loaded"])
        ),
    }


def step_speed(s: Session) -> dict:
    out = {}
    for key in ("vit", "dino"):
        log(f"speed: overhead {key}")
        out[f"overhead_{key}"] = attempt(lambda key=key: _overhead(s, key))
        release(s.dev)  # the plain SDPA copy is gone with _overhead's frame
    for key in ("vit", "demo"):
        log(f"speed: batched export {key}")
        out[f"export_{key}"] = attempt(lambda key=key: _export(s, key))
    log("speed: evaluate (local engine)")
    out["evaluate"] = attempt(lambda: _evaluate(s, str(s.dev)))
    if is_cuda(s.dev):
        log("speed: evaluate on the CPU, for scale")
        out["evaluate_cpu"] = attempt(lambda: _evaluate(s, "cpu"))
    else:
        out["evaluate_cpu"] = {"ok": True, "skipped": "the device is the CPU"}
    return out


def _peak(dev: torch.device, fn: Callable[[], object]) -> tuple[object, int | None, int | None]:
    """``fn()``, its peak GPU memory over what was allocated before, and what it left allocated (None on CPU)."""
    release(dev)
    base = allocated(dev)
    if is_cuda(dev):
        torch.cuda.reset_peak_memory_stats(dev)
    got = fn()
    sync(dev)
    if not is_cuda(dev):
        return got, None, None
    return got, int(torch.cuda.max_memory_allocated(dev)) - base, allocated(dev) - base


def _sizes(s: Session, key: str, sides: tuple[int, ...]) -> list[dict]:
    dev = s.dev
    loaded = s.model(key)
    image = noise_image(7)
    warm_up(loaded, image)
    rows = []
    for side in sides:

        def one(side=side) -> dict:
            release(dev)
            base = allocated(dev)
            hw = input_size_for(loaded, side, image.size)
            estimate = loaded.family.attention_numel(loaded.config, hw) * 4
            cap, cap_peak, _ = _peak(dev, lambda: capture(loaded, image, size=side))
            tokens = cap.num_tokens
            del cap
            run, run_peak, run_held = _peak(dev, lambda: get_run(loaded, image, size=side))
            has_graph = run.has_graph
            del run
            release(dev)
            left = allocated(dev)
            return {
                "side": side,
                "input": list(hw),
                "tokens": tokens,
                "attention_estimate_MiB": round(estimate / 2**20, 1),
                "capture_peak_MiB": None if cap_peak is None else round(cap_peak / 2**20, 1),
                "capture_peak_over_estimate": None if cap_peak is None else round(cap_peak / estimate, 2),
                "run_has_graph": has_graph,
                "run_peak_MiB": None if run_peak is None else round(run_peak / 2**20, 1),
                "run_peak_over_estimate": None
                if run_peak is None
                else round(run_peak / (estimate * (2 if has_graph else 1)), 2),
                "run_held_MiB": None if run_held is None else round(run_held / 2**20, 1),
                "left_after_clear_runs_bytes": None if left is None else left - base,
            }

        log(f"memory: {key} at {side}")
        rows.append(attempt(one))
    return rows


def _refusals(s: Session) -> dict:
    """Inputs over the default budget: refused with BudgetError, and no GPU memory allocated for them."""
    dev = s.dev
    loaded = s.model("vit")
    image = noise_image(7)
    p = loaded.patch_size
    side = loaded.default_size[0]
    while loaded.family.attention_numel(loaded.config, input_size_for(loaded, side)) * 4 <= DEFAULT_BUDGET_BYTES:
        side += p
    largest = side - p
    cases = {
        "capture": lambda: capture(loaded, image, size=side),
        "run": lambda: get_run(loaded, image, size=side),
        "relevance": lambda: explain_classes(loaded, image, [0], size=largest),  # the graph doubles the need
        "batch_32": lambda: capture_batch(loaded, [image] * 32, size=largest),
    }
    out: dict = {
        "budget_MiB": DEFAULT_BUDGET_BYTES // 2**20,
        "smallest_refused_side": side,
        "largest_allowed_side": largest,
        "largest_allowed_estimate_MiB": round(
            loaded.family.attention_numel(loaded.config, input_size_for(loaded, largest)) * 4 / 2**20, 1
        ),
    }
    for name, fn in cases.items():

        def one(fn=fn) -> dict:
            release(dev)
            before = allocated(dev)
            if is_cuda(dev):
                torch.cuda.reset_peak_memory_stats(dev)
            try:
                fn()
                refused, message = False, ""
            except BudgetError as exc:
                refused, message = True, str(exc)
            after = allocated(dev)
            peak = int(torch.cuda.max_memory_allocated(dev)) if is_cuda(dev) else None
            return {
                "refused": refused,
                "message": message[:300],
                "allocated_before": before,
                "allocated_after": after,
                "peak_above_before": None if peak is None else peak - before,
                "nothing_allocated": None if peak is None else peak == before,
            }

        out[name] = attempt(one)
    release(dev)
    return out


def step_memory(s: Session) -> dict:
    out = {"vit": _sizes(s, "vit", s.plan.memory_sides), "dino": _sizes(s, "dino", (s.plan.dino_side,))}
    log("memory: budget refusals")
    out["refusals"] = attempt(lambda: _refusals(s))
    ratios = [
        r["capture_peak_over_estimate"]
        for r in out["vit"] + out["dino"]
        if r.get("ok") and r["capture_peak_over_estimate"]
    ]
    ref = out["refusals"]
    if ratios and ref.get("ok") and is_cuda(s.dev):
        total = torch.cuda.get_device_properties(s.dev).total_memory
        worst = max(ratios)
        predicted = ref["largest_allowed_estimate_MiB"] * worst
        out["budget_vs_gpu"] = {
            "worst_capture_peak_over_estimate": worst,
            "predicted_peak_at_largest_allowed_MiB": round(predicted, 1),
            "gpu_total_MiB": round(total / 2**20),
            "refuses_before_gpu_runs_out": predicted < total / 2**20,
        }
    else:
        out["budget_vs_gpu"] = None
    return out


def _causal_parts(s: Session, device: str) -> dict[str, dict]:
    """Every causal analysis on demo on ``device``: each part's arrays (or its error)."""
    from vitviz.causal import (
        activation_patching,
        capture_knocked_out,
        causal_arrays,
        direct_logit_attribution,
        fast_estimate,
        head_importance,
        knock_out,
        logit_lens,
        patch_lens,
        path_patching,
        pattern_patching,
    )

    loaded = s.model("demo", device)
    a, b = s.images["demo-circle.png"], s.images["demo-star.png"]

    def patching():
        p = activation_patching(loaded, a, b)
        return {
            "residual": p.residual,
            "heads": p.heads,
            "residual_estimate": p.residual_estimate,
            "heads_estimate": p.heads_estimate,
            "forward_equivalents": np.asarray(p.forward_equivalents),
        }

    def arrays():
        got, _ = causal_arrays(loaded, a)
        return got

    parts: dict[str, Callable[[], dict]] = {
        "head_importance": lambda: {
            "effects": (h := head_importance(loaded, a)).effects,
            "forward_equivalents": np.asarray(h.forward_equivalents),
        },
        "head_importance_full_forwards": lambda: {"effects": head_importance(loaded, a, from_cache=False).effects},
        "activation_patching": patching,
        "fast_estimate": lambda: {"effects": fast_estimate(loaded, a).effects},
        "logit_lens": lambda: {"logits": logit_lens(loaded, a).logits},
        "direct_logit_attribution": lambda: {"heads": (d := direct_logit_attribution(loaded, a)).heads, "mlps": d.mlps},
        "knock_out": lambda: {"logits": knock_out(loaded, a, [(0, 0), (1, 1)]).logits},
        "capture_knocked_out": lambda: {"attention": capture_knocked_out(loaded, a, [(0, 0)])[0].attentions},
        "causal_arrays": arrays,
        "patch_lens": lambda: {"lens": patch_lens(loaded, a)},
        "pattern_patching": lambda: {"values": pattern_patching(loaded, a, b).values},
        "path_patching": lambda: {"values": path_patching(loaded, a, b).values},
        "path_patching_to_q": lambda: {"values": path_patching(loaded, a, b, receivers=[(3, 0, "q")]).values},
    }
    out = {}
    for name, fn in parts.items():
        clear_runs()
        out[name] = attempt(lambda fn=fn: {"arrays": fn()})
    return out


def step_causal(s: Session) -> dict:
    dev = s.dev
    warm_up(s.model("demo"), s.images["demo-circle.png"])  # the baseline below: the model, warm
    with tf32(False):
        log("causal: demo on the CPU (reference)")
        ref = _causal_parts(s, "cpu")
        release(dev)
        base = allocated(dev)
        log(f"causal: demo on {dev}")
        got = _causal_parts(s, str(dev))
    release(dev)
    left = allocated(dev)
    from vitviz.causal import patching

    grads_kept = len(patching._GRADS)  # gradients kept for the next source image: outlive clear_runs()
    patching._GRADS.clear()
    release(dev)
    left_after_grads = allocated(dev)
    out: dict = {}
    for name, g in got.items():
        r = ref[name]
        if not g["ok"]:
            out[name] = {k: v for k, v in g.items() if k != "arrays"}
            continue
        entry = {"ok": True, "seconds": g["seconds"]}
        if r["ok"]:
            entry["max_abs_vs_cpu"] = {
                k: diff(r["arrays"][k], v)["max_abs"] for k, v in g["arrays"].items() if v is not None
            }
        else:
            entry["cpu_error"] = r["error"]
        entry["shapes"] = {k: list(np.shape(v)) for k, v in g["arrays"].items() if v is not None}
        # NaN marks what a table leaves undefined (a block with fewer heads); infinity is never right.
        entry["no_infinity"] = {
            k: not bool(np.isinf(np.asarray(v, np.float64)).any()) for k, v in g["arrays"].items() if v is not None
        }
        out[name] = entry
    out["errors"] = sorted(k for k, v in got.items() if not v["ok"])
    out["allocated_model"] = base
    out["left_after_clear_runs_bytes"] = None if left is None or base is None else left - base
    out["patching_gradients_kept"] = grads_kept
    out["left_after_patching_gradients_cleared_bytes"] = (
        None if left_after_grads is None or base is None else left_after_grads - base
    )
    return out


def step_methods(s: Session) -> dict:
    from vitviz.methods import METHODS, explain

    image = s.images["demo-circle.png"]
    out: dict = {}
    with tf32(False):
        for name in METHODS:

            def one(name=name) -> dict:
                ref = explain(s.model("demo", "cpu"), image, name)
                clear_runs()
                got = explain(s.model("demo"), image, name)
                clear_runs()
                return {
                    "grid": list(got.values.shape),
                    "finite": bool(np.isfinite(got.values).all()),
                    "class": got.class_index,
                    "max_abs_vs_cpu": diff(ref.values, got.values)["max_abs"],
                    "ref_max": float(np.abs(ref.values).max()),
                }

            log(f"methods: {name}")
            out[name] = attempt(one)
    out["failed"] = sorted(k for k, v in out.items() if isinstance(v, dict) and not v.get("ok"))
    return out


STEPS: dict[str, Callable[[Session], dict]] = {
    "env": step_env,
    "placement": step_placement,
    "parity": step_parity,
    "precision": step_precision,
    "speed": step_speed,
    "memory": step_memory,
    "causal": step_causal,
    "methods": step_methods,
}


def run_steps(plan: Plan, device: str, steps: list[str], after_step: Callable[[dict], None] | None = None) -> dict:
    """Run ``steps`` in order; each step's result (or its error) under its name, plus ``imports`` and ``seconds``.
    ``after_step(results so far)`` after each step (the files are written then: a run stopped at its time limit
    keeps what it finished)."""
    results: dict = {}
    try:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA was asked for and is not available on this machine")
    except Exception as exc:
        return {"fatal": f"{type(exc).__name__}: {exc}"}
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(plan, dev, Path(tmp))
        for name in steps:
            log(f"step {name} ...")
            t = time.perf_counter()
            got = attempt(lambda name=name: STEPS[name](session))
            results[name] = got
            log(f"step {name} done in {time.perf_counter() - t:.1f}s")
            if after_step is not None:
                after_step({**results, "seconds": round(time.perf_counter() - T0, 1), "unfinished": True})
    results["imports_at_end"] = loaded_modules()
    results["seconds"] = round(time.perf_counter() - T0, 1)
    return results


# --- the report -----------------------------------------------------------------------------------


def _g(d: dict | None, *keys, default=None):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def summary_lines(r: dict) -> list[str]:
    """The human-readable summary of a results dict (``gpu.txt``)."""
    if "fatal" in r:
        return [f"FATAL: {r['fatal']}"]
    lines = []
    env = r.get("env", {})
    lines.append(
        f"vitviz GPU check: device {env.get('device')} ({env.get('gpu_name')}), torch {env.get('torch')}, "
        f"transformers {env.get('transformers')}, python {env.get('python')}, quick={env.get('quick')}, "
        f"{r.get('seconds')} s in all"
    )
    if r.get("unfinished"):
        lines.append("UNFINISHED: the steps below are those done so far")
    lines.append(
        f"imports: forbidden modules loaded at start {env.get('forbidden_loaded')}, at end "
        f"{_g(r, 'imports_at_end', 'forbidden_loaded')}; TF32 defaults {env.get('tf32_defaults')}"
    )
    for name in STEPS:
        step = r.get(name)
        if step is None:
            continue
        if not step.get("ok"):
            lines.append(f"[{name}] FAILED: {step.get('error', '')[:300]}")
            continue
        lines.append(f"[{name}] ({step.get('seconds')} s)")
        lines.extend("  " + line for line in _step_lines(name, step))
    return lines


def _err(part: dict) -> str:
    return f"ERROR {part.get('error', '')[:240]}"


def _step_lines(name: str, s: dict) -> list[str]:
    out = []
    if name == "placement":
        for key in ("demo", "vit"):
            p = s.get(key, {})
            if not p.get("ok"):
                out.append(f"{key}: {_err(p)}")
                continue
            out.append(
                f"{key}: params on {p['parameter_devices']}; capture record numpy-only={p['capture_clean']} "
                f"(not numpy: {p['capture_record']['not_numpy'] or 'none'}); after capture "
                f"{_mib(p['capture_left_on_gpu_bytes'])} above the model ({_mib(p['allocated_model'])}); "
                f"Run (graph={p['run_has_graph']}) holds {_mib(p['run_holds_bytes'])}, "
                f"{_mib(p['run_left_after_clear_runs_bytes'])} after clear_runs; its capture kept after "
                f"clear_runs holds {_mib(p['run_capture_kept_after_clear_runs_bytes'])} "
                f"({p['run_record']['lazy_summary_tensors']} lazy summary tensors on "
                f"{p['run_record']['lazy_summary_devices']}), {_mib(p['run_capture_kept_after_summaries_read_bytes'])} "
                f"after its summaries are read; back to the model's size: {p['back_to_model_size']}"
            )
    elif name == "parity":
        for key in ("demo", "vit"):
            p = s.get(key, {})
            if not p.get("ok"):
                out.append(f"{key}: {_err(p)}")
                continue
            off = ", ".join(f"{k} {v['max_abs']:.1e}" for k, v in p["tf32_off"].items())
            out.append(f"{key} TF32 off: within {PARITY_TOL:g}: {p['tf32_off_within_tol']} ({off})")
            out.append(f"{key} TF32 on: largest {p['tf32_on_worst'][0]} {p['tf32_on_worst'][1]:.2e}")
    elif name == "precision":
        for k, p in s.items():
            if not isinstance(p, dict):
                continue
            if not p.get("ok"):
                out.append(f"{k}: {_err(p)}")
                continue
            rc = p["run_and_relevance"]
            out.append(
                f"{k}: top-1 unchanged on {len(p['images'])} examples: {p['top1_unchanged']}; attention max abs "
                f"{p['attention_max_abs']:.2e} (within {PRECISION_TOL:g}: {p['attention_within_tol']}); dtypes "
                f"{p['record_dtypes']}; Run+relevance: {'ok' if rc.get('ok') else _err(rc)}"
            )
    elif name == "speed":
        for key in ("vit", "dino"):
            p = s.get(f"overhead_{key}", {})
            if not p.get("ok"):
                out.append(f"overhead {key}: {_err(p)}")
                continue
            out.append(
                f"overhead {key} at {p['input']}: plain SDPA {p['plain_sdpa_s'] * 1e3:.1f} ms, eager {p['eager_idle_hooks_s'] * 1e3:.1f} ms, "
                f"capture {p['capture_s'] * 1e3:.1f} ms ({p['capture_over_plain']}x), fresh Run "
                f"{p['run_s'] * 1e3:.1f} ms ({p['run_over_plain']}x, graph={p['run_has_graph']})"
            )
        for key in ("vit", "demo"):
            p = s.get(f"export_{key}", {})
            if not p.get("ok"):
                out.append(f"export {key}: {_err(p)}")
                continue
            ratios = ", ".join(f"batch {k}: {p[f'batch_{k}_over_one_at_a_time']}x" for k in (8, 32))
            out.append(
                f"export {key}: one at a time {p['one_at_a_time_images_per_s_32']} img/s; {ratios} "
                f"(goal {EXPORT_GOAL}x met: {p['meets_goal']})"
            )
        for k in ("evaluate", "evaluate_cpu"):
            p = s.get(k, {})
            if not p.get("ok"):
                out.append(f"{k}: {_err(p)}")
            elif "skipped" in p and isinstance(p["skipped"], str):
                out.append(f"{k}: {p['skipped']}")
            else:
                out.append(
                    f"{k} on {p['device']}: {p['images']} images, {p['steady_images_per_s']} img/s steady, "
                    f"{p['end_to_end_images_per_s']} end to end; skipped {p['skipped'] or 'none'}"
                )
    elif name == "memory":
        for key in ("vit", "dino"):
            for p in s.get(key, []):
                if not p.get("ok"):
                    out.append(f"{key}: {_err(p)}")
                    continue
                out.append(
                    f"{key} {p['input']}: estimate {p['attention_estimate_MiB']} MiB; capture peak "
                    f"{p['capture_peak_MiB']} MiB ({p['capture_peak_over_estimate']}x); Run peak {p['run_peak_MiB']} "
                    f"MiB (graph={p['run_has_graph']}, {p['run_peak_over_estimate']}x), holds {p['run_held_MiB']} MiB"
                )
        ref = s.get("refusals", {})
        if not ref.get("ok"):
            out.append(f"refusals: {_err(ref)}")
        else:
            out.append(
                f"budget {ref['budget_MiB']} MiB: smallest refused side {ref['smallest_refused_side']}, largest "
                f"allowed {ref['largest_allowed_side']} ({ref['largest_allowed_estimate_MiB']} MiB)"
            )
            for case in ("capture", "run", "relevance", "batch_32"):
                c = ref.get(case, {})
                out.append(
                    f"  {case}: "
                    + (
                        f"refused={c['refused']}, nothing allocated={c['nothing_allocated']}"
                        if c.get("ok")
                        else _err(c)
                    )
                )
        if s.get("budget_vs_gpu"):
            b = s["budget_vs_gpu"]
            out.append(
                f"predicted peak at the largest allowed input {b['predicted_peak_at_largest_allowed_MiB']} MiB of "
                f"{b['gpu_total_MiB']} MiB: refuses before the GPU runs out: {b['refuses_before_gpu_runs_out']}"
            )
    elif name == "causal":
        for k, p in s.items():
            if not isinstance(p, dict) or "ok" not in p:
                continue
            if not p["ok"]:
                out.append(f"{k}: {_err(p)}")
            else:
                worst = max(p.get("max_abs_vs_cpu", {}).values(), default=float("nan"))
                out.append(f"{k}: ok, largest difference from the CPU {worst:.2e}")
        out.append(
            f"left on the GPU after clear_runs: {_mib(s.get('left_after_clear_runs_bytes'))} "
            f"(patching gradients kept: {s.get('patching_gradients_kept')}; after clearing them "
            f"{_mib(s.get('left_after_patching_gradients_cleared_bytes'))})"
        )
    elif name == "methods":
        for k, p in s.items():
            if not isinstance(p, dict):
                continue
            out.append(
                f"{k}: ok, grid {p['grid']}, largest difference from the CPU {p['max_abs_vs_cpu']:.2e} "
                f"(values up to {p['ref_max']:.2e})"
                if p.get("ok")
                else f"{k}: {_err(p)}"
            )
        out.append(f"failed: {s.get('failed') or 'none'}")
    return out


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def _clean_floats(o):
    """NaN and infinity as strings: the JSON stays standard."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: _clean_floats(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean_floats(v) for v in o]
    return o


def write(out: Path, results: dict) -> str:
    """``gpu.json`` and ``gpu.txt`` under ``out``; returns the text."""
    plain = _clean_floats(json.loads(json.dumps(results, default=_json_default)))
    (out / "gpu.json").write_text(json.dumps(plain, indent=1))
    text = "\n".join(summary_lines(results)) + "\n"
    (out / "gpu.txt").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu.json and gpu.txt")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny stand-ins of the random models, few repeats")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    args = parser.parse_args(argv)
    steps = [x.strip() for x in args.steps.split(",") if x.strip()]
    unknown = [x for x in steps if x not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {', '.join(STEPS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"vitviz GPU check on {args.device} (quick={args.quick}); steps {steps}")
    results = run_steps(plan_for(args.quick), args.device, steps, after_step=lambda r: write(out, r))
    text = write(out, results)
    print(text, flush=True)
    log(f"wrote {out / 'gpu.json'} and {out / 'gpu.txt'}")
    return 0 if "fatal" not in results else 1


if __name__ == "__main__":
    sys.exit(main())
