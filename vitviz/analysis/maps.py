"""Attention maps on the patch grid: head fusion, "where q looks", "who looks at q".

``attn`` arrays are post-softmax, rows = queries, columns = keys; tokens ``0..P-1``
are prefix tokens, ``P..T-1`` patches in row-major order of the ``(gh, gw)`` grid.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = [
    "Fusion",
    "FUSIONS",
    "fuse_heads",
    "to_grid",
    "query_map",
    "key_map",
    "prefix_attention",
    "prefix_attention_to",
    "patch_attention_total",
]

Fusion = Literal["mean", "max", "min"]
FUSIONS: tuple[Fusion, ...] = ("mean", "max", "min")


def fuse_heads(attn: np.ndarray, *, how: Fusion = "mean") -> np.ndarray:
    """Fuse the head axis: ``(..., H, T, T) -> (..., T, T)`` float32.

    ``mean`` keeps rows summing to 1; ``max`` and ``min`` do not.
    """
    a = np.asarray(attn)
    if how == "mean":
        return a.mean(axis=-3, dtype=np.float32)
    if how == "max":
        return a.max(axis=-3).astype(np.float32)
    if how == "min":
        return a.min(axis=-3).astype(np.float32)
    raise ValueError(f"unknown head fusion {how!r}; choose one of {FUSIONS}")


def to_grid(values: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Patch values ``(..., N)`` -> ``(..., gh, gw)``; refuses a mismatched grid."""
    gh, gw = grid
    if values.shape[-1] != gh * gw:
        raise ValueError(f"{values.shape[-1]} patch values do not fill a {gh} x {gw} grid")
    return values.reshape(*values.shape[:-1], gh, gw)


def query_map(attn: np.ndarray, *, query: int, num_prefix_tokens: int, grid: tuple[int, int]) -> np.ndarray:
    """Where token ``query`` looks: ``(..., T, T) -> (..., gh, gw)``, i.e. ``A[..., q, P:]``.

    ``query=0`` is the CLS map. Values are raw attention weights (not normalised).
    """
    return to_grid(np.asarray(attn)[..., query, num_prefix_tokens:].astype(np.float32), grid)


def key_map(attn: np.ndarray, *, key: int, num_prefix_tokens: int, grid: tuple[int, int]) -> np.ndarray:
    """Who looks at token ``key``: ``(..., T, T) -> (..., gh, gw)``, i.e. ``A[..., P:, k]``."""
    return to_grid(np.asarray(attn)[..., num_prefix_tokens:, key].astype(np.float32), grid)


def prefix_attention(attn: np.ndarray, *, query: int, num_prefix_tokens: int) -> np.ndarray:
    """Attention token ``query`` pays to each prefix token: ``(..., T, T) -> (..., P)``.

    Invisible on the image, so shown beside it.
    """
    return np.asarray(attn)[..., query, :num_prefix_tokens].astype(np.float32)


def prefix_attention_to(attn: np.ndarray, *, key: int, num_prefix_tokens: int) -> np.ndarray:
    """Attention each prefix token pays to token ``key``: ``(..., T, T) -> (..., P)``, i.e. ``A[..., :P, k]``."""
    return np.asarray(attn)[..., :num_prefix_tokens, key].astype(np.float32)


def patch_attention_total(attn: np.ndarray, *, query: int, num_prefix_tokens: int) -> np.ndarray:
    """Total attention token ``query`` pays to all patches: ``(..., T, T) -> (...)``, summed in float64.

    With the prefix shares it makes up the whole row (1, up to storage precision).
    """
    return np.asarray(attn)[..., query, num_prefix_tokens:].astype(np.float64).sum(axis=-1)
