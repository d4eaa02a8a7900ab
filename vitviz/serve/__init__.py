"""Public mode: the engine that makes vitviz safe and fair to put on a public server.

Nothing here imports Streamlit; the app wires these pieces in:

* :mod:`vitviz.serve.settings`: one switch (``VITVIZ_PUBLIC=1`` or ``[public] enabled = true``
  in ``vitviz.toml``) and the limits that come with it (:class:`ServeSettings`);
* :mod:`vitviz.serve.policy`: which model names a visitor may load; typed paths are refused
  with one message that reveals nothing about the server's files, typed hub ids are
  checked (family, download size) before any weight is downloaded;
* :mod:`vitviz.serve.models`: a model cache bounded by the memory the models take;
* :mod:`vitviz.serve.queue`: at most K forward passes at once, the others wait in a FIFO queue;
* :mod:`vitviz.serve.limits`: per-session rate limits (uploads, model changes).

Outside public mode nothing changes for a local user, and the command line never uses any of it.
"""

from __future__ import annotations

from vitviz.serve.limits import AddressLimits, RateLimit, RateLimitError, SessionLimits, hub_download_limit
from vitviz.serve.models import ModelCache, ModelCacheStats, ModelTooLargeError, model_nbytes
from vitviz.serve.policy import (
    Hub,
    ModelRequest,
    PolicyError,
    allowlist,
    check_model_request,
    load_request,
    vet_model_request,
)
from vitviz.serve.queue import ForwardQueue, QueueStats
from vitviz.serve.settings import DEMOS, ServeSettings, SettingsError, load_settings

__all__ = [
    "DEMOS",
    "ForwardQueue",
    "Hub",
    "ModelCache",
    "ModelCacheStats",
    "ModelRequest",
    "ModelTooLargeError",
    "PolicyError",
    "QueueStats",
    "AddressLimits",
    "RateLimit",
    "RateLimitError",
    "ServeSettings",
    "SessionLimits",
    "SettingsError",
    "allowlist",
    "check_model_request",
    "hub_download_limit",
    "load_request",
    "load_settings",
    "model_nbytes",
    "vet_model_request",
]
