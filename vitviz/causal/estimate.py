"""The fast estimate of head importance: attribution patching (Nanda 2023; Syed et al. 2023).

Every head's knock-out effect to first order at once, ``sum_{t, j in head h}
dy_c/dz_l[t, j] * (z'_l[t, j] - z_l[t, j])`` with ``z'`` the knocked-out value (mean
or zero), from one forward and one backward pass (about 3 forward-equivalents): the
gradient comes from the clean Run's graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES, check_budget, input_size_for
from vitviz.capture.targets import Target
from vitviz.causal.notes import (
    KnockoutMode,
    NotDefined,
    causal_notes,
    check_mode,
    clean_run,
    head_projections,
    projections,
    z_name,
)
from vitviz.errors import CaptureError
from vitviz.models.load import LoadedModel
from vitviz.record import frozen

__all__ = ["HeadEstimate", "fast_estimate"]


@dataclass(frozen=True)
class HeadEstimate:
    """Attribution patching: ``effects`` ``(L, H)`` float32 first-order estimates of the knock-out effects."""

    effects: np.ndarray = field(repr=False)
    clean_logits: np.ndarray = field(repr=False)
    class_index: int  # the target's class or label (``target.index``)
    mode: KnockoutMode
    num_heads: tuple[int, ...]
    target: Target | None = None


def fast_estimate(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    target: Target | int | None = None,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> HeadEstimate:
    """Attribution patching: every head's knock-out effect to first order, from one forward and one backward.

    ``effects[l, h] = sum_{t, j in head h} dy / dz_l[t, j] * (z'_l[t, j] - z_l[t, j])``, ``y`` the value of
    ``target`` (as in :func:`~vitviz.causal.knockout.head_importance`; None: the top-1).
    """
    check_mode(mode)
    if not any(p is not None for p in head_projections(loaded)):
        raise NotDefined(causal_notes(loaded)["knockout"])
    hw = input_size_for(loaded, size, image.size)
    check_budget(loaded, hw, batch=1, gradients=True, budget=budget_bytes)  # the graph must fit
    run = clean_run(loaded, image, size, budget_bytes, target)
    if not run.has_graph:
        raise CaptureError(f"the clean run of '{loaded.name}' kept no autograd graph; the estimate needs one")
    bound = run.bind(target)
    order = [i for i, p in enumerate(projections(run)) if p is not None]
    names = [z_name(run, i) for i in order]
    grads = run.gradients(lambda out: bound(out)[0], names)
    heads = run.num_heads
    table = np.full((len(run.sites), max(heads)), np.nan, np.float32)
    for i, name, g in zip(order, names, grads, strict=True):
        z = run.activation(name)
        flat = z.reshape(-1, z.shape[-1])
        knocked = flat.mean(dim=0, keepdim=True) if mode == "mean" else torch.zeros_like(flat[:1])
        g = torch.zeros_like(flat) if g is None else g.reshape(-1, z.shape[-1])
        per_col = (g * (knocked - flat)).sum(dim=0)  # (H * d,)
        table[i, : heads[i]] = per_col.reshape(heads[i], -1).sum(dim=1).float().cpu().numpy()
    t = bound.target
    return HeadEstimate(frozen(table), frozen(run.scores.cpu().numpy()), t.index, mode, heads, t)
