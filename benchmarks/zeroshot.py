"""Benchmarks of the zero-shot models (CLIP ViT-B/16, SigLIP-base at 224, random weights).

    python -m benchmarks.zeroshot [--runs 5]

* :func:`overhead`: vitviz's full analysis of a new image (capture, rollout, maps,
  summaries) against the plain SDPA image tower (``get_image_features``), interleaved,
  medians; the ratio is the goal (<= 1.3).
* :func:`label_change`: what a change of the typed labels costs: 10 prompts through the
  text tower only (``encode_labels``, as the app does); goal <= 300 ms on CPU. Also one
  label edited among the ten: the app caches each prompt's embedding, so one prompt runs.

The folders carry a word-level tokenizer of their own (no downloads); CLIP's BPE gives
prompts of the same few tokens, SigLIP pads to its 64 positions either way.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import median_time  # noqa: E402
from benchmarks.common import overhead as run_overhead  # noqa: E402
from vitviz.models.load import load_model  # noqa: E402
from vitviz.models.zeroshot import encode_labels, parse_labels  # noqa: E402

__all__ = ["make_zero_shot", "overhead", "label_change", "last_token_gain", "label_change_profile", "LABELS"]

LABELS = "cat, dog, car, bird, airplane, ship, truck, horse, frog, deer"  # 10 labels
MODELS = {
    "clip-b16-224": ("CLIPModel", "CLIPConfig", {"vision_config": {"patch_size": 16, "image_size": 224}}),
    "siglip-base-224": ("SiglipModel", "SiglipConfig", {}),  # the defaults are SigLIP-base/16 at 224
}


def make_zero_shot(kind: str, folder: Path) -> Path:
    """A random-weight two-tower model saved with an image processor and a word tokenizer."""
    import transformers
    from transformers import ViTImageProcessor

    from vitviz.demo.tokenizer import word_tokenizer

    arch, config, kwargs = MODELS[kind]
    torch.manual_seed(0)
    model = getattr(transformers, arch)(getattr(transformers, config)(**kwargs))
    model.config.text_config.eos_token_id = 3  # the word tokenizer's <eos>, where CLIP reads its text embedding
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    words = ["a", "photo", "of", "the"] + [w.strip() for w in LABELS.split(",")]
    word_tokenizer(words, max_length=int(model.config.text_config.max_position_embeddings)).save_pretrained(folder)
    return folder


def overhead(kind: str, folder: Path, runs: int) -> dict:
    """The image tower's full analysis against its plain SDPA ``get_image_features`` (``benchmarks.run.overhead``)."""
    return run_overhead(kind, folder, runs, arch=MODELS[kind][0], image_tower=True)


def label_change(kind: str, folder: Path, runs: int) -> dict:
    """Milliseconds from new label text to new label embeddings (text tower only, 10 prompts)."""
    loaded = load_model(str(folder))
    assert loaded.text is not None, "the benchmark folder needs a tokenizer"
    texts = [LABELS, LABELS.replace("cat", "kitten"), LABELS.replace("dog", "puppy")]  # each run: new prompts
    k = iter(range(10**6))

    def change():
        labels = parse_labels(texts[next(k) % len(texts)], loaded.text.template)
        encode_labels(loaded.model, loaded.text, labels)

    def edit_one():  # the app caches each prompt's embedding: editing one label encodes one prompt
        word = ("kitten", "puppy", "lorry")[next(k) % 3]
        encode_labels(loaded.model, loaded.text, parse_labels(word, loaded.text.template))

    t, t1 = median_time(change, runs, warmup=1), median_time(edit_one, runs, warmup=1)
    return {
        "model": kind,
        "labels": 10,
        "label_change_ms": round(1000 * t, 1),
        "one_label_edited_ms": round(1000 * t1, 1),
    }


def last_token_gain(folder: Path, runs: int) -> dict:
    """SigLIP: 10 new labels with the last text block run for the pooled token only (``encode_labels``) against
    the model's whole ``get_text_features`` (before), interleaved, medians of ``runs``."""
    import vitviz.models.zeroshot as zs

    loaded = load_model(str(folder))
    labels = parse_labels(LABELS, loaded.text.template)
    real = zs._pools_last

    def before():
        zs._pools_last = lambda model: False
        try:
            encode_labels(loaded.model, loaded.text, labels)
        finally:
            zs._pools_last = real

    def after():
        encode_labels(loaded.model, loaded.text, labels)

    times: dict[str, list[float]] = {"before": [], "after": []}
    import time

    for fn in (before, after):  # warm-up
        fn()
    for _ in range(runs):
        for name, fn in (("before", before), ("after", after)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {
        "labels": 10,
        "torch_threads": torch.get_num_threads(),
        "before_ms": round(1000 * med["before"], 1),
        "after_ms": round(1000 * med["after"], 1),
        "after_over_before": round(med["after"] / med["before"], 3),
    }


def _text_tower_flops(text_config, prompts: int, tokens: int, last_token_only: bool) -> float:
    """Floating-point operations (multiply and add counted apart) of a pre-norm text tower's matrix products for
    ``prompts`` prompts of ``tokens`` positions; with ``last_token_only`` the last block computes its keys and values
    for every position and the rest for the pooled one only (:func:`vitviz.models.zeroshot._last_token_features`)."""
    d, f, n = text_config.hidden_size, text_config.intermediate_size, text_config.num_hidden_layers
    head = 2 * d * int(getattr(text_config, "projection_size", None) or d) * prompts  # the pooled token's head
    per_token = 2 * (4 * d * d + 2 * d * f)  # q, k, v, o projections and the two MLP layers
    attention = 2 * 2 * tokens * tokens * d  # q k^T and a v, all heads
    full = prompts * (tokens * per_token + attention)
    if not last_token_only:
        return float(n * full + head)
    last = prompts * (tokens * 2 * 2 * d * d + per_token - 2 * 2 * d * d + 2 * 2 * tokens * d)
    return float((n - 1) * full + last + head)


def label_change_profile(folder: Path, runs: int) -> dict:
    """Where a change to 10 new labels goes (SigLIP-base): the tokenizer, the text tower (timed apart), the rest of
    ``encode_labels``; the tower's matrix-product work counted, the share of the tower's time the profiler puts in
    matrix products, and this machine's matrix-product rate for the tower's largest product (same threads, same
    run): ``arithmetic_floor_ms`` is the counted work at that rate, the time no reordering of the same arithmetic
    can beat. Wall clock and this process's CPU time; run with one thread (``OMP_NUM_THREADS=1``) on a shared
    machine for the CPU-time split, and with all threads on an idle one for the wall-clock figure."""
    import time

    from torch.profiler import ProfilerActivity, profile

    import vitviz.models.zeroshot as zs

    loaded = load_model(str(folder))
    tower, model = loaded.text, loaded.model
    labels = parse_labels(LABELS, tower.template)
    cfg = model.config.text_config

    def tokenize():
        return tower.tokenizer(
            list(labels.prompts),
            padding=tower.padding,
            truncation=True,
            max_length=tower.max_length,
            return_tensors="pt",
        )

    ids = tokenize()["input_ids"]
    last_only = zs._pools_last(model)

    def tower_only():
        with torch.inference_mode():
            if last_only:
                zs._last_token_features(model.text_model, ids)
            else:
                model.get_text_features(input_ids=ids)

    x = torch.randn(ids.numel(), cfg.hidden_size)
    w, b = torch.randn(cfg.intermediate_size, cfg.hidden_size), torch.randn(cfg.intermediate_size)

    def gemm():
        torch.addmm(b, x, w.t())

    cases = {
        "encode_labels": lambda: encode_labels(model, tower, labels),
        "tokenizer": tokenize,
        "tower": tower_only,
        "gemm": gemm,
    }
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for name, fn in cases.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    med_cpu = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tower_only()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::addmm", "aten::mm", "aten::bmm"))
    flops = _text_tower_flops(cfg, len(labels.prompts), int(ids.shape[1]), last_only)
    rate = 2 * x.shape[0] * x.shape[1] * w.shape[0] / med["gemm"]  # FLOP/s of the tower's largest product
    return {
        "labels": len(labels.prompts),
        "positions": int(ids.shape[1]),
        "torch_threads": torch.get_num_threads(),
        "encode_labels_ms": round(1000 * med["encode_labels"], 1),
        "tokenizer_ms": round(1000 * med["tokenizer"], 2),
        "text_tower_ms": round(1000 * med["tower"], 1),
        "rest_ms": round(1000 * (med["encode_labels"] - med["tokenizer"] - med["tower"]), 1),
        "tower_matmul_share": round(matmul / total, 3),
        "tower_GFLOP": round(flops / 1e9, 1),
        "machine_matmul_GFLOP_per_s": round(rate / 1e9, 1),
        "arithmetic_floor_ms": round(1000 * flops / rate, 1),
        "tower_over_floor": round(med["tower"] / (flops / rate), 2),
        # CPU time of this process (steadier where other jobs share the cores; with one thread, the work itself)
        "cpu_encode_labels_ms": round(1000 * med_cpu["encode_labels"], 1),
        "cpu_tokenizer_ms": round(1000 * med_cpu["tokenizer"], 2),
        "cpu_text_tower_ms": round(1000 * med_cpu["tower"], 1),
        "cpu_arithmetic_floor_ms": round(
            1000 * flops / (2 * x.shape[0] * x.shape[1] * w.shape[0] / med_cpu["gemm"]), 1
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zeroshot")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--siglip-gain", action="store_true", help="only SigLIP: last-block shortcut vs before")
    parser.add_argument("--siglip-profile", action="store_true", help="only SigLIP: where a label change goes")
    args = parser.parse_args(argv)
    if args.siglip_profile:
        with tempfile.TemporaryDirectory() as tmp:
            folder = make_zero_shot("siglip-base-224", Path(tmp) / "siglip")
            print(json.dumps(label_change_profile(folder, args.runs), indent=1))
        return 0
    if args.siglip_gain:
        with tempfile.TemporaryDirectory() as tmp:
            folder = make_zero_shot("siglip-base-224", Path(tmp) / "siglip")
            print(json.dumps(last_token_gain(folder, args.runs), indent=1))
        return 0
    out: dict = {"overhead": [], "label_change": []}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in MODELS:
            folder = make_zero_shot(kind, Path(tmp) / kind)
            out["overhead"].append(overhead(kind, folder, args.runs))
            out["label_change"].append(label_change(kind, folder, args.runs))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
