"""DINO attention masks (Caron et al. 2021, "Emerging Properties in Self-Supervised ViTs")."""

from __future__ import annotations

import numpy as np

__all__ = ["dino_masks"]


def dino_masks(attn: np.ndarray, *, num_prefix_tokens: int, grid: tuple[int, int], tau: float = 0.6) -> np.ndarray:
    """Per-head masks keeping ``tau`` of the last layer's CLS attention mass.

    ``attn`` is ``(L, H, T, T)``; returns bool ``(H, gh, gw)``. For each head, the CLS
    row over patches is normalised to sum to 1 and sorted ascending; a patch is kept
    when the cumulative sum up to and including it exceeds ``1 - tau`` (so the kept
    patches are the largest ones, holding at least ``tau`` of the mass).
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    a = attn[-1, :, 0, num_prefix_tokens:].astype(np.float64)  # (H, N)
    a /= np.maximum(a.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    order = np.argsort(a, axis=-1, kind="stable")
    cum = np.cumsum(np.take_along_axis(a, order, axis=-1), axis=-1)
    keep_sorted = cum > 1.0 - tau
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep.reshape(a.shape[0], *grid)
