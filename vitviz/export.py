"""Batch export of captures and analyses to ``.npz`` + a rollout overlay PNG per image."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vitviz.analysis.embeddings import position_similarity
from vitviz.analysis.rollout import rollout
from vitviz.analysis.stats import attention_entropy, mean_attention_distance
from vitviz.capture.run import Capture, capture_batch
from vitviz.data.images import load_image
from vitviz.errors import VitvizError
from vitviz.figures.overlay import overlay
from vitviz.models.load import LoadedModel

__all__ = ["capture_arrays", "ExportReport", "export_images"]


def capture_arrays(cap: Capture, *, pos_similarity: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The arrays written for one capture (no object arrays: loads with ``allow_pickle=False``).

    ``rollout`` is the CLS rollout over all layers, mean fusion, no discard, not normalised.
    """
    attn = cap.attentions.astype(np.float32)
    p = cap.num_prefix_tokens
    arrays = {
        "attentions": attn,
        "num_prefix_tokens": np.array(p),
        "token_kinds": np.array(cap.token_kinds),
        "grid": np.array(cap.grid),
        "input_size": np.array(cap.input_size),
        "patch_size": np.array(cap.patch_size),
        "rollout": rollout(attn, num_prefix_tokens=p)[p:].reshape(cap.grid),
        "mean_attention_distance": mean_attention_distance(
            attn, num_prefix_tokens=p, grid=cap.grid, patch_size=cap.patch_size
        ),
        "attention_entropy": attention_entropy(attn),
        "logits": cap.logits if cap.logits is not None else np.zeros(0, np.float32),
        "top_k_indices": np.array([pr.index for pr in cap.predictions], dtype=np.int64),
        "top_k_labels": np.array([pr.label for pr in cap.predictions], dtype=str),
        "token_norms": cap.token_norms,
    }
    if pos_similarity is not None:
        arrays["position_similarity"] = pos_similarity
    elif cap.position_embeddings is not None:
        arrays["position_similarity"] = position_similarity(cap.position_embeddings)
    return arrays


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:  # an open file keeps numpy from appending ".npz" to the temp name
        np.savez(fh, **arrays)  # uncompressed: zlib on ~20 MB of float32 attention cost seconds per image
    os.replace(tmp, path)  # atomic: a crash never leaves half a file under the real name


@dataclass
class ExportReport:
    written: list[Path] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (input, message)


def _batches(items: Sequence, size: int) -> Iterable[Sequence]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def export_images(
    loaded: LoadedModel,
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    size: int | tuple[int, int] | None = None,
    batch_size: int = 8,
    progress: Callable[[int], None] | None = None,
) -> ExportReport:
    """Write ``<stem>.npz`` and ``<stem>_rollout.png`` per image under ``out``.

    Unreadable images are reported in ``failed`` and skipped; everything written
    before a failure stays. ``progress(n)`` is called after each ``n`` images.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = ExportReport()
    sim = position_similarity(loaded.position_embeddings) if loaded.position_embeddings is not None else None
    for chunk in _batches(list(paths), batch_size):
        images, names = [], []
        for p in chunk:
            try:
                images.append(load_image(p))
                names.append(Path(p))
            except VitvizError as exc:
                report.failed.append((str(p), str(exc)))
        try:
            caps = capture_batch(loaded, images, size=size)
        except VitvizError as exc:
            report.failed.extend((str(p), str(exc)) for p in names)
            caps = []
        for path, cap in zip(names, caps, strict=True):
            arrays = capture_arrays(cap, pos_similarity=sim)
            target = out / f"{path.stem}.npz"
            _write_npz(target, arrays)
            overlay(cap.image, arrays["rollout"]).save(out / f"{path.stem}_rollout.png")
            report.written.append(target)
        if progress:
            progress(len(chunk))
    return report


def print_failures(report: ExportReport) -> None:
    for name, msg in report.failed:
        print(f"error: {name}: {msg}", file=sys.stderr)
