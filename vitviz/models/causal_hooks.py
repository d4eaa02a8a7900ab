"""The causal views' hook on each block's output projection, installed once per model at load time.

The pre-hook reads the current context's plan (a ``ContextVar`` set by :mod:`vitviz.capture.causal` for the
length of one causal call): without a plan it does nothing, so threads that share a cached model never see
each other's knock-outs. It lives here, below ``capture``, because :func:`vitviz.models.load.load_model`
installs it (never lazily while others run the model); what a plan does is up to ``vitviz.capture.causal``.
"""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

import torch

from vitviz.errors import CaptureError
from vitviz.models.hooks import Site, installed_sites

if TYPE_CHECKING:
    from vitviz.models.load import LoadedModel

__all__ = ["PLAN", "Plan", "install_causal_hooks"]


class Plan(Protocol):
    """What this context's projection hooks do with block ``index``'s heads' outputs ``z`` ``(B, T, H*d)``:
    return a replacement, or None to leave them."""

    def __call__(self, index: int, z: torch.Tensor) -> torch.Tensor | None: ...


PLAN: ContextVar[Plan | None] = ContextVar("vitviz_causal_plan", default=None)
_INSTALL_LOCK = threading.Lock()
_PROJECTIONS: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()  # beside the model


def _projection_hook(index: int):
    def hook(module, args):
        plan = PLAN.get()
        if plan is None:
            return None
        out = plan(index, args[0])
        return None if out is None else (out, *args[1:])

    return hook


def _hookable(site: Site, proj: torch.nn.Linear | None) -> torch.nn.Linear | None:
    """``proj`` unless the forward never calls it as a module (``nn.MultiheadAttention`` reads ``out_proj.weight``)."""
    if proj is None:
        return None
    for m in (site.attention, *site.block.modules()):
        if isinstance(m, torch.nn.MultiheadAttention) and m.out_proj is proj:
            return None
    return proj


def install_causal_hooks(loaded: LoadedModel) -> tuple[torch.nn.Linear | None, ...]:
    """Register, once per model, the pre-hook on every block's output projection; return the projections
    (None for blocks without one). Idle unless a causal call in the current context sets a plan. Safe to call
    at load time (recommended) or lazily (the first causal call does it)."""
    model = loaded.model
    found = _PROJECTIONS.get(model)
    if found is not None:
        return found
    with _INSTALL_LOCK:
        found = _PROJECTIONS.get(model)
        if found is not None:
            return found
        projs = tuple(_hookable(s, loaded.family.head_projection(s)) for s in installed_sites(model))
        if len({id(p) for p in projs if p is not None}) != sum(p is not None for p in projs):
            raise CaptureError(f"the {loaded.family.name} adapter names one output projection for two blocks")
        for i, proj in enumerate(projs):
            if proj is not None:
                proj.register_forward_pre_hook(_projection_hook(i))
        _PROJECTIONS[model] = projs
        return projs
