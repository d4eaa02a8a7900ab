"""A loaded model's weights, named by a digest: files built on a model (an SAE's feature index) record it, so a
model of the same name with other weights (retrained into the same folder, another revision of a hub id) is told
apart, and the same weights under another name (a copied folder) are recognised."""

from __future__ import annotations

import hashlib
import threading
import weakref

import torch

__all__ = ["weights_digest"]

_DIGESTS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def weights_digest(model_or_loaded) -> str:
    """SHA-256 (hex) of a model's state: each tensor's name, dtype, shape and bytes, names sorted. Computed once
    per loaded model (about 1 s per GB of weights on one core) and kept beside it."""
    model = getattr(model_or_loaded, "model", model_or_loaded)
    with _LOCK:
        known = _DIGESTS.get(model)
    if known is not None:
        return known
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in sorted(model.state_dict().items()):
            t = t.detach().cpu().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    digest = h.hexdigest()
    with _LOCK:
        _DIGESTS[model] = digest
    return digest
