"""Learned embeddings: position-embedding similarity and patch-filter principal components
(ViT paper, Figure 7 centre and left)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["position_similarity", "PatchComponents", "patch_components", "token_norm_outliers"]


def position_similarity(pos: np.ndarray) -> np.ndarray:
    """Cosine similarity between patch position embeddings: ``(N, D) -> (N, N)`` float64.

    ``pos`` holds the patch rows only (prefix rows already dropped). Tile ``i`` of
    the ViT figure is row ``i`` reshaped to the native grid; the diagonal is 1.
    """
    e = np.asarray(pos, dtype=np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    return e @ e.T


@dataclass(frozen=True, eq=False)
class PatchComponents:
    components: np.ndarray  # (k, C, p, p) unit-norm principal directions
    explained_variance_ratio: np.ndarray  # (k,)


def patch_components(weight: np.ndarray, *, k: int = 28) -> PatchComponents:
    """Principal components of the patch projection filters: ``(D, C, p, p) -> (k, C, p, p)``.

    The D filters, flattened to ``C * p * p`` values, are centred over D; the
    components are the top right-singular vectors, sign fixed so that each
    component's largest-magnitude entry is positive.
    """
    d = weight.shape[0]
    flat = weight.reshape(d, -1).astype(np.float64)
    flat = flat - flat.mean(axis=0, keepdims=True)
    _, s, vt = np.linalg.svd(flat, full_matrices=False)
    k = min(k, vt.shape[0])
    comps = vt[:k]
    signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(axis=1)])
    comps = comps * np.where(signs == 0, 1.0, signs)[:, None]
    var = s**2
    ratio = var[:k] / var.sum() if var.sum() > 0 else np.zeros(k)
    return PatchComponents(comps.reshape(k, *weight.shape[1:]), ratio)


def token_norm_outliers(norms: np.ndarray, *, factor: float = 3.0) -> np.ndarray:
    """Boolean ``(L+1, T)``: tokens whose norm exceeds ``factor`` x the layer's median norm.

    High-norm tokens (Darcet et al. 2024, "Vision Transformers Need Registers") stand out this way.
    """
    med = np.median(norms, axis=-1, keepdims=True)
    return norms > factor * med
