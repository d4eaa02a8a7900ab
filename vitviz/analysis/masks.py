"""DINO attention masks (Caron et al. 2021, "Emerging Properties in Self-Supervised ViTs")."""

from __future__ import annotations

import numpy as np

__all__ = ["dino_masks", "mass_masks"]


def mass_masks(maps: np.ndarray, *, tau: float = 0.6) -> np.ndarray:
    """Per-head masks keeping ``tau`` of each map's mass: ``(H, gh, gw)`` float -> bool, same shape.

    Each head's map is normalised to sum to 1 and sorted ascending; a cell is kept
    when the cumulative sum up to and including it exceeds ``1 - tau`` (so the kept
    cells are the largest ones, holding at least ``tau`` of the mass).
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    a = np.asarray(maps, dtype=np.float64).reshape(maps.shape[0], -1)
    a = a / np.maximum(a.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    order = np.argsort(a, axis=-1, kind="stable")
    cum = np.cumsum(np.take_along_axis(a, order, axis=-1), axis=-1)
    keep_sorted = cum > 1.0 - tau
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep.reshape(maps.shape)


def dino_masks(attn: np.ndarray, *, num_prefix_tokens: int, grid: tuple[int, int], tau: float = 0.6) -> np.ndarray:
    """Per-head masks keeping ``tau`` of the last layer's CLS attention mass: ``(L, H, T, T)`` -> bool ``(H, gh, gw)``.

    The CLS row over patches of each head is the map of :func:`mass_masks`. Models
    without a CLS token use the last block's pooled query instead (see
    ``vitviz.analysis.blocks.global_query``).
    """
    rows = np.asarray(attn[-1, :, 0, num_prefix_tokens:], dtype=np.float64)
    return mass_masks(rows.reshape(rows.shape[0], *grid), tau=tau)
