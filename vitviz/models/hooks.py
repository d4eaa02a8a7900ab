"""Attention hooks, installed once per model and switched on per call.

The way ``transformers`` records its own outputs: each attention site of a model
gets forward hooks when the model is loaded, and they do nothing unless a capture
call in the *current context* has set a recorder (a ``ContextVar``). Threads that
share one cached model therefore never see each other's tensors, nothing is
registered or removed while other threads run the model (PyTorch iterates a
module's hook dict during its forward), and a forward that fails leaves nothing
behind: the recorder belongs to the failed call and is dropped with it.

A family adapter names the sites (``Site``): the module whose forward output holds
the attention probabilities, and the block module whose forward finishes the block.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = ["Site", "Recorder", "install", "recording", "installed_sites", "model_lock"]


@dataclass(frozen=True, eq=False)
class Site:
    """One attention block: ``attention`` yields the probabilities, ``block`` ends the block.

    ``attention`` and ``block`` may be the same module (Swin's layer returns both).
    ``stage`` is the adapter's stage index; ``extra`` holds what the adapter needs
    to read the block's geometry (e.g. the block's own sub-modules).
    """

    index: int
    stage: int
    attention: torch.nn.Module
    block: torch.nn.Module
    extra: Any = None


class Recorder(Protocol):
    def on_attention(self, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None: ...

    def on_block(self, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None: ...


_ACTIVE: ContextVar[Recorder | None] = ContextVar("vitviz_recorder", default=None)
_INSTALL_LOCK = threading.Lock()
# Kept beside the models, not on them: a model stays picklable and deep-copyable (a copy has no sites).
_SITES: weakref.WeakKeyDictionary[torch.nn.Module, list[Site]] = weakref.WeakKeyDictionary()
_LOCKS: weakref.WeakKeyDictionary[torch.nn.Module, threading.Lock] = weakref.WeakKeyDictionary()


def _attention_hook(site: Site):
    def hook(module, args, kwargs, output):
        rec = _ACTIVE.get()
        if rec is not None:
            rec.on_attention(site, module, args, kwargs, output)

    return hook


def _block_hook(site: Site):
    def hook(module, args, kwargs, output):
        rec = _ACTIVE.get()
        if rec is not None:
            rec.on_block(site, module, args, kwargs, output)

    return hook


def install(model: torch.nn.Module, sites: list[Site]) -> list[Site]:
    """Register the hooks of ``sites`` on ``model`` once; later calls return the installed sites."""
    with _INSTALL_LOCK:
        existing = _SITES.get(model)
        if existing is not None:
            return existing
        for site in sites:
            site.attention.register_forward_hook(_attention_hook(site), with_kwargs=True)
            site.block.register_forward_hook(_block_hook(site), with_kwargs=True)
        _SITES[model] = sites
        _LOCKS[model] = threading.Lock()
        return sites


def installed_sites(model: torch.nn.Module) -> list[Site]:
    sites = _SITES.get(model)
    if sites is None:
        raise RuntimeError("vitviz's attention hooks are not installed on this model: load it with load_model()")
    return sites


def model_lock(model: torch.nn.Module) -> threading.Lock:
    """A lock per model, for families whose forward writes to the shared module (Swin v1)."""
    return _LOCKS[model]


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Make ``recorder`` receive this context's hook calls for the duration of the block."""
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
