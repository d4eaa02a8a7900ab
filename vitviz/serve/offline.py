"""A public server whose Hugging Face hub is out of reach offers only the models it can load without it.

Visitors can neither download a model nor copy a cache to the server, so where the hub
cannot be reached (``HF_HUB_OFFLINE`` set, or no connection) the model list keeps the
names that load from this machine alone (the bundled demos, the operator's folders and
hub ids already in the Hugging Face cache), and any other name gets :data:`HUB_OFFLINE`,
which advises nothing a visitor cannot do.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlparse

from vitviz.demo import bundled

__all__ = ["HUB_OFFLINE", "hub_online", "loads_offline", "offered"]

HUB_OFFLINE = (
    "'{name}' is not on this server, and the server cannot reach the Hugging Face hub just now. "
    "Choose another model from the list."
)
_TRUE = {"1", "true", "yes", "on"}


def _connect(result: list[bool]) -> None:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=5):
            result.append(True)
    except OSError:
        result.append(False)


def hub_online(timeout: float = 2.0) -> bool:
    """Whether the hub can be reached: never with ``HF_HUB_OFFLINE`` set, else one TCP connection.

    The whole check, name lookup included (which a socket timeout does not bound), takes at
    most ``timeout`` seconds: a probe that has not answered by then counts as offline.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return False
    result: list[bool] = []
    probe = threading.Thread(target=_connect, args=(result,), daemon=True)
    probe.start()
    probe.join(timeout)
    return bool(result and result[0])


def loads_offline(name: str) -> bool:
    """Whether ``name`` loads without the hub: a bundled demo, a folder here, or a hub id in the local cache."""
    text = name.strip()
    if text in bundled() or Path(text).expanduser().is_dir():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(text, "config.json"), str)
    except Exception:  # not a valid repo id, or no huggingface_hub: not loadable offline
        return False


def offered(names: Iterable[str], online: bool, available: Callable[[str], bool] = loads_offline) -> tuple[str, ...]:
    """``names`` as they are when the hub is online; else only those ``available`` without it."""
    names = tuple(names)
    return names if online else tuple(n for n in names if available(n))
