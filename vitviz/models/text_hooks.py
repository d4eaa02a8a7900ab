"""The text tower's hooks for prompt-word relevance, installed once per model at load (before it is shared).

They record only inside a call that set this context's recorder (``_ACTIVE``), like the image
hooks of :mod:`vitviz.models.hooks`; :mod:`vitviz.models.prompt_relevance` reads what they record.
Here, below ``zeroshot``, so that loading a text tower can install them without an import cycle.
"""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar

import torch

__all__ = ["install_text_hooks"]

_ACTIVE: ContextVar[list | None] = ContextVar("vitviz_text_recorder", default=None)
_LOCK = threading.Lock()
_INSTALLED: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()


def _text_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    text = getattr(model, "text_model", None)
    layers = getattr(getattr(text, "encoder", None), "layers", None)
    if layers is None:
        return []
    attns = [getattr(layer, "self_attn", None) for layer in layers]
    return [] if any(a is None for a in attns) else attns  # a layout vitviz does not know: no prompt relevance


def install_text_hooks(model: torch.nn.Module) -> int:
    """Hooks on the text tower's attention modules and embeddings, once per model; returns the number of blocks."""
    with _LOCK:
        if model in _INSTALLED:
            return _INSTALLED[model]
        attns = _text_layers(model)
        if attns:

            def on_attention(module, args, kwargs, output):
                rec = _ACTIVE.get()
                if rec is not None:
                    rec.append(output[1])  # (B, H, T, T): the probabilities the block multiplied with the values

            def on_embeddings(module, args, output):
                rec = _ACTIVE.get()
                if rec is not None:  # the graph starts here: token ids carry no gradient
                    return output.detach().requires_grad_(True)
                return None

            for a in attns:
                a.register_forward_hook(on_attention, with_kwargs=True)
            model.text_model.embeddings.register_forward_hook(on_embeddings)
        _INSTALLED[model] = len(attns)
        return len(attns)
