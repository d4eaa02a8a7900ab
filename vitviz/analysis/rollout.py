"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Notation as in ``docs/definitions.md#notation``: ``attn`` is ``(L, H, T, T)``, rows are queries,
columns keys, every row sums to 1; tokens ``0..P-1`` are prefix tokens (CLS,
DIST, registers), ``P..T-1`` the patches in row-major grid order.
"""

from __future__ import annotations

import numpy as np

from vitviz.analysis.blocks import left_apply, row_sums, select
from vitviz.analysis.flow import propagate
from vitviz.analysis.maps import Fusion, fuse_heads
from vitviz.record import Capture, Geometry

__all__ = [
    "discard_smallest",
    "rollout_layer_matrix",
    "rollout_matrix",
    "rollout",
    "discard_native",
    "rollout_step",
    "capture_rollout",
]


def discard_smallest(fused: np.ndarray, *, num_prefix_tokens: int, ratio: float) -> np.ndarray:
    """Zero the fraction ``ratio`` of smallest entries of a fused ``(T, T)`` matrix.

    Exact rule: the candidates are the entries in patch-key columns, ``fused[:, P:]``
    (``T * N`` values; prefix-token columns are never discarded). The
    ``floor(ratio * T * N)`` smallest candidates are set to 0; ties go to the lower
    flat index (row-major). Returns a new array; ``fused`` is not modified.
    """
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"discard ratio must be in [0, 1), got {ratio}")
    out = np.array(fused, dtype=np.float32, copy=True)
    patch_cols = out[:, num_prefix_tokens:]  # a view: writes land in ``out``
    k = int(np.floor(ratio * patch_cols.size))
    if k:
        flat = patch_cols.reshape(-1).copy()
        flat[np.argsort(flat, kind="stable")[:k]] = 0.0
        out[:, num_prefix_tokens:] = flat.reshape(patch_cols.shape)
    return out


def rollout_layer_matrix(
    layer_attn: np.ndarray,
    *,
    num_prefix_tokens: int,
    fusion: Fusion = "mean",
    discard_ratio: float = 0.0,
) -> np.ndarray:
    """One layer's rollout factor ``B = rownorm(0.5 * F + 0.5 * I)``: ``(H, T, T) -> (T, T)`` float32."""
    fused = fuse_heads(layer_attn, how=fusion)
    if discard_ratio > 0:
        fused = discard_smallest(fused, num_prefix_tokens=num_prefix_tokens, ratio=discard_ratio)
    b = 0.5 * fused + 0.5 * np.eye(fused.shape[-1], dtype=np.float32)
    return b / b.sum(axis=-1, keepdims=True)


def _layer_range(num_layers: int, start: int, stop: int | None) -> range:
    stop = num_layers if stop is None else stop
    if not 0 <= start < stop <= num_layers:
        raise ValueError(f"layer range [{start}, {stop}) is empty or outside 0..{num_layers}")
    return range(start, stop)


def rollout_matrix(
    attn: np.ndarray,
    *,
    num_prefix_tokens: int,
    start: int = 0,
    stop: int | None = None,
    fusion: Fusion = "mean",
    discard_ratio: float = 0.0,
) -> np.ndarray:
    """Full rollout ``R = B_{stop-1} @ ... @ B_start``: ``(L, H, T, T) -> (T, T)`` float32.

    Layers ``start <= l < stop`` (0-based, ``stop`` exclusive; default all). Every row
    of ``R`` sums to 1. Costs ``O(L T^3)``; use :func:`rollout` for a single query.
    """
    layers = _layer_range(attn.shape[0], start, stop)
    r = np.eye(attn.shape[-1], dtype=np.float32)
    for layer in layers:
        b = rollout_layer_matrix(
            attn[layer], num_prefix_tokens=num_prefix_tokens, fusion=fusion, discard_ratio=discard_ratio
        )
        r = b @ r
    return r


def rollout(
    attn: np.ndarray,
    *,
    num_prefix_tokens: int,
    query: int = 0,
    start: int = 0,
    stop: int | None = None,
    fusion: Fusion = "mean",
    discard_ratio: float = 0.0,
) -> np.ndarray:
    """Row ``query`` of the rollout matrix: ``(L, H, T, T) -> (T,)`` float32, summing to 1.

    Equal to ``rollout_matrix(...)[query]`` but computed as vector-matrix products
    from the latest layer down (``O(L T^2)``), which keeps large inputs interactive.
    The CLS map is ``rollout(...)[P:]`` reshaped to the patch grid (not normalised).
    """
    layers = _layer_range(attn.shape[0], start, stop)
    row = np.zeros(attn.shape[-1], dtype=np.float32)
    row[query] = 1.0
    for layer in reversed(layers):
        b = rollout_layer_matrix(
            attn[layer], num_prefix_tokens=num_prefix_tokens, fusion=fusion, discard_ratio=discard_ratio
        )
        row = row @ b
    return row


def discard_native(g: Geometry, mat: np.ndarray, *, ratio: float) -> np.ndarray:
    """Zero the fraction ``ratio`` of smallest entries of a block's fused native matrix.

    Candidates: every entry in a grid-key column (prefix-token columns are never
    discarded): ``mat[:, P:]`` of global attention, which is :func:`discard_smallest`
    exactly; every window entry, or every unfolded entry, of the other kinds. The
    ``floor(ratio * count)`` smallest are set to 0, ties to the lower flat index.
    """
    if g.kind == "global":
        return discard_smallest(mat, num_prefix_tokens=g.num_prefix, ratio=ratio)
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"discard ratio must be in [0, 1), got {ratio}")
    flat = np.array(mat, dtype=np.float32, copy=True).reshape(-1)
    k = int(np.floor(ratio * flat.size))
    if k:
        flat[np.argsort(flat, kind="stable")[:k]] = 0.0
    return flat.reshape(mat.shape)


def rollout_step(g: Geometry, mat: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``r @ B`` with ``B = rownorm(0.5 * dense(F) + 0.5 * I)``, from F's native form."""
    v = r / (0.5 * row_sums(g, mat).astype(np.float64) + 0.5)
    return 0.5 * left_apply(g, mat, v) + 0.5 * v


def capture_rollout(
    cap: Capture,
    *,
    query: int | None = None,
    start: int = 0,
    stop: int | None = None,
    fusion: Fusion = "mean",
    discard_ratio: float = 0.0,
) -> tuple[np.ndarray, int]:
    """Rollout of a readout row through every block and stage of a capture (``docs/definitions.md#rollout-through-stages``).

    Per block: fuse heads (mean: the float32 values kept before storage), discard
    (optional, :func:`discard_native`), ``B = rownorm(0.5 * dense(F) + 0.5 * I)``; merges
    between stages as in :mod:`vitviz.analysis.flow`. ``query``: a token of the
    last block's stage, ``POOLED``, or None for what the model reads (its CLS token,
    its pooling head, or the pooled query: ``Capture.readout``). Returns the row over the tokens of the stage of
    block ``start`` (the first stage by default), renormalised to sum to 1, and that
    stage's index. For a plain ViT this equals :func:`rollout`.
    """
    if cap.rollout_note:
        raise ValueError(cap.rollout_note)
    stop = cap.num_blocks if stop is None else stop
    mats = {}
    for b in range(start, stop):
        mat = select(cap.blocks[b], fusion=fusion)
        discard = discard_ratio > 0 and cap.blocks[b].kind != "pool"  # the readout row is kept whole
        mats[b] = discard_native(cap.blocks[b].geometry, mat, ratio=discard_ratio) if discard else mat
    geoms = [b.geometry for b in cap.blocks]
    row, stage = propagate(
        geoms, cap.stages, mats, rollout_step, query=query, start=start, stop=stop, readout=cap.readout
    )
    total = row.sum()
    return (row / total if total > 0 else row).astype(np.float32), stage
