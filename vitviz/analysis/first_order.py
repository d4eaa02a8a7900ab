"""Activation patching maths, numpy only: attribution-patching estimates and their rank agreement with the exact values.

Definitions (``docs/definitions.md#attribution-patching``). Two images, target and source, at the
same input size. **Attribution patching** (Nanda 2023; Syed et al. 2023) estimates
the effect of patching an activation ``a`` from the source into the target's run to
first order: ``grad_target(y) . (a_source - a_target)`` at that point, where ``y`` is
the measured scalar (a class logit, a label score, or a difference of two) and the
gradient is taken in the target's clean run. The patched value is estimated as the
clean value plus that effect, so that it reads like the exact grid (a logit).
"""

from __future__ import annotations

import numpy as np

__all__ = ["residual_estimate", "head_estimate", "rank_correlation"]


def residual_estimate(grad: np.ndarray, target: np.ndarray, source: np.ndarray) -> np.ndarray:
    """First-order effect of patching each token of each block's output: ``(L, T)`` float64.

    ``grad``, ``target``, ``source``: ``(L, T, D)`` (the gradient of ``y`` at block l's
    output in the target's run, block l's output in the target's and source's runs).
    ``out[l, t] = sum_d grad[l, t, d] * (source[l, t, d] - target[l, t, d])``.
    """
    g = np.asarray(grad, np.float64)
    delta = np.asarray(source, np.float64) - np.asarray(target, np.float64)
    if g.shape != delta.shape or g.ndim != 3:
        raise ValueError(f"gradient {g.shape} and activations {delta.shape} must both be (L, T, D)")
    return np.einsum("ltd,ltd->lt", g, delta)


def head_estimate(grad: np.ndarray, target: np.ndarray, source: np.ndarray, num_heads: int) -> np.ndarray:
    """First-order effect of patching each head's ``z`` (all tokens) of one block: ``(H,)`` float64.

    ``grad``, ``target``, ``source``: ``(T, H * d)`` (the output projection's input:
    head h in columns ``h*d .. (h+1)*d - 1``). ``out[h] = sum_{t, j in head h} grad[t, j] *
    (source[t, j] - target[t, j])``.
    """
    g = np.asarray(grad, np.float64)
    delta = np.asarray(source, np.float64) - np.asarray(target, np.float64)
    if g.shape != delta.shape or g.ndim != 2 or g.shape[1] % num_heads:
        raise ValueError(f"gradient {g.shape} and z {delta.shape} must both be (T, H * d) with H = {num_heads}")
    return (g * delta).sum(axis=0).reshape(num_heads, -1).sum(axis=1)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x`` (n,), ties sharing their mean rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two arrays of the same shape (NaN entries of either left out).

    Pearson correlation of the ranks (ties get their mean rank); NaN when fewer than 2
    entries remain or one side is constant.
    """
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: {np.shape(a)} and {np.shape(b)}")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(x) < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / den) if den > 0 else float("nan")
