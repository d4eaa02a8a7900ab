"""Class-specific relevance (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability").

``R = I``; for l = 1..L: ``Abar_l = mean_h(clamp(G_l * A_l, min=0))``, ``R = R + Abar_l @ R``,
where ``G_l = d y_c / d A_l`` is the gradient of the class logit (before softmax)
with respect to block l's own attention. The map is the readout row of ``R`` (CLS,
else the pooled query) over the first stage's grid; no row normalisation.

Hierarchical models: ``Abar_l`` is formed in the block's native form (windows,
reduced keys) and applied through its dense view; stages merge as in rollout
(``vitviz.analysis.flow``), and a CLS token entering at a later stage starts with a
zero row. The gradients come from one backward pass per class
(``vitviz.capture.gradients``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vitviz.analysis.blocks import left_apply
from vitviz.analysis.flow import propagate
from vitviz.record import Geometry, Stage

__all__ = ["chefer_relevance", "relevance_abar", "relevance_step", "relevance_row", "Explanation"]


def chefer_relevance(attn: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """Relevance matrix of a plain ViT from attention and its gradients: ``(L, H, T, T) x 2 -> (T, T)`` float64.

    ``grads[l]`` must be the gradient with respect to ``attn[l]`` (same layer).
    """
    if attn.shape != grads.shape:
        raise ValueError(f"attention {attn.shape} and gradients {grads.shape} differ in shape")
    t = attn.shape[-1]
    r = np.eye(t)
    for a, g in zip(attn, grads, strict=True):
        abar = np.clip(g.astype(np.float64) * a.astype(np.float64), 0.0, None).mean(axis=0)
        r = r + abar @ r
    return r


def relevance_abar(g: Geometry, attn: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """``mean_h(clamp(G * A, min=0))`` of one block in native form, head axis removed, float64."""
    prod = np.clip(grad.astype(np.float64) * attn.astype(np.float64), 0.0, None)
    if g.kind == "separable":
        return prod
    return prod.mean(axis=0 if g.kind in ("global", "pool") else 1)


def relevance_step(g: Geometry, abar: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``r @ (I + dense(Abar))``."""
    return r + left_apply(g, abar, r)


def relevance_row(
    geometries: Sequence[Geometry],
    stages: Sequence[Stage],
    abars: dict[int, np.ndarray],
    *,
    query: int | None = None,
    readout: str = "cls",
) -> np.ndarray:
    """The readout row of ``R`` over the first stage's tokens, raw: ``(T_1,)`` float64."""
    row, _ = propagate(geometries, stages, abars, relevance_step, query=query, readout=readout)
    return row


@dataclass(frozen=True, eq=False)
class Explanation:
    """Relevance of every first-stage token for one class: ``relevance`` (T,) is the readout row of ``R``."""

    class_index: int
    label: str
    relevance: np.ndarray = field(repr=False)
    num_prefix_tokens: int
    grid: tuple[int, int]
    readout: str = "CLS"  # which row: "CLS" or "pooled query"
    start_block: int = 0  # relevance ran through blocks start_block..L-1 (0: all, MM-Explainability's start_layer)

    def patch_map(self) -> np.ndarray:
        """``(gh, gw)`` relevance of the grid tokens, raw (not normalised)."""
        return self.relevance[self.num_prefix_tokens :].reshape(self.grid)
