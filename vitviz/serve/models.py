"""A thread-safe model cache bounded by the memory the models take, not by their number.

The models live in a :class:`~vitviz.cache.BoundedCache` (vitviz's one LRU, bounded here by bytes only);
what this module adds is the loading policy around it.

``st.cache_resource(max_entries=3)`` keeps three models whatever their size: three
ViT-Huge checkpoints take 7.5 GB, three demos 2 MB. :class:`ModelCache` keeps the most
recently used models whose parameters and buffers fit in ``max_bytes`` together, and drops
the least recently used first. Sessions never hold a model between reruns, they ask the
cache each time, so a model dropped while a visitor was away is loaded again on their next
rerun (:meth:`ModelCache.get` says "Reloading …" through ``on_progress``).

Loading rules:

* concurrent requests for the same model load it once; the others wait for it (and get its
  error, if it fails with an ordinary exception). If the loading visitor leaves (a
  ``BaseException`` such as Streamlit's ``StopException`` or ``KeyboardInterrupt``), the
  next waiter loads it instead;
* at most ``max_loading`` different models load at once (public mode: 1), so memory peaks at
  the budget plus one model, not plus one model per visitor;
* a model larger than the whole budget is refused with :class:`ModelTooLargeError`: before
  loading when its size is known (``expected_bytes`` from the hub's metadata, or an earlier
  load), otherwise after loading (it is then dropped). Where ``refuse_oversize`` is off (local
  mode) such a model is served and kept alone instead.

Waiting callers call ``on_progress(message)`` every ``poll_s`` seconds: a callback that raises
(Streamlit stops a script that way when its visitor leaves) ends the wait at once.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vitviz.cache import BoundedCache
from vitviz.errors import ModelLoadError

__all__ = ["ModelCache", "ModelCacheStats", "ModelTooLargeError", "model_nbytes", "TOO_LARGE"]

V = TypeVar("V")
Progress = Callable[[str], None]

TOO_LARGE = (
    "'{name}' needs {size:.2f} GiB of memory, more than the {budget:.2f} GiB this server keeps for all its models. "
    "Choose a smaller model."
)
_FORGET_AFTER = 256  # names remembered as "dropped" or with a known size


class ModelTooLargeError(ModelLoadError):
    """The model alone needs more memory than the cache's whole budget."""

    def __init__(self, name: str, size: int, budget: int) -> None:
        super().__init__(TOO_LARGE.format(name=name, size=size / 2**30, budget=budget / 2**30))
        self.name, self.size, self.budget = name, size, budget


def _tensor_bytes(tensors: Any) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


def model_nbytes(obj: Any) -> int:
    """Bytes of a model's parameters plus buffers: ``sum(p.numel() * p.element_size())``.

    ``obj`` is a module (anything with ``parameters()``, optionally ``buffers()``) or an object
    holding one as ``.model`` (:class:`vitviz.models.load.LoadedModel`).
    """
    module = obj if hasattr(obj, "parameters") else getattr(obj, "model", None)
    if module is None or not hasattr(module, "parameters"):
        raise TypeError(f"cannot size {type(obj).__name__}: it has neither parameters() nor .model")
    total = _tensor_bytes(module.parameters())
    if hasattr(module, "buffers"):
        total += _tensor_bytes(module.buffers())
    return total


@dataclass(frozen=True)
class ModelCacheStats:
    names: tuple[str, ...]  # least recently used first
    nbytes: int
    max_bytes: int
    loading: tuple[str, ...]
    hits: int
    loads: int
    reloads: int  # loads of a model dropped earlier to make room
    evictions: int
    refused: int


class _Pending:
    """One load in flight; waiters block on ``done``."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.has_value = False
        self.error: Exception | None = None


class ModelCache(Generic[V]):
    """Least-recently-used models whose sizes (``size_of``, default :func:`model_nbytes`) fit in ``max_bytes``."""

    def __init__(
        self,
        max_bytes: int,
        *,
        size_of: Callable[[V], int] = model_nbytes,
        refuse_oversize: bool = True,
        max_loading: int = 1,
        poll_s: float = 0.25,
        on_evict: Callable[[V], None] | None = None,
    ) -> None:
        if max_bytes < 1:
            raise ValueError("a model cache needs room for at least one byte")
        self.max_bytes, self.refuse_oversize, self.poll_s = int(max_bytes), refuse_oversize, poll_s
        self._size_of = size_of
        self._on_evict = on_evict  # e.g. drop what else holds the model (its cached runs), so its memory goes
        # Bounded by bytes alone; a model over the budget is stored only where it is served (kept alone then).
        self._models: BoundedCache[V] = BoundedCache(
            max_entries=2**31, max_bytes=self.max_bytes, size_of=size_of, keep_oversize=True, on_evict=self._dropped_lru
        )
        self._pending: dict[Hashable, _Pending] = {}
        self._sizes: OrderedDict[Hashable, int] = OrderedDict()  # last measured size per name
        self._dropped: OrderedDict[Hashable, None] = OrderedDict()  # evicted, not loaded since
        # Reentrant: the LRU calls back (_dropped_lru) when a store under this lock makes room.
        self._lock = threading.RLock()
        self._loading = threading.BoundedSemaphore(max_loading) if max_loading > 0 else None
        self._hits = self._loads = self._reloads = self._evictions = self._refused = 0

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> ModelCache:
        """Budget ``settings.model_memory_bytes``; public mode refuses oversize models and loads one at a time."""
        kwargs.setdefault("refuse_oversize", settings.public)
        kwargs.setdefault("max_loading", 1 if settings.public else 0)
        return cls(settings.model_memory_bytes, **kwargs)

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, name: Hashable) -> bool:
        return name in self._models

    @property
    def nbytes(self) -> int:
        """Bytes of the cached models together."""
        return self._models.nbytes

    def sizes(self) -> dict[Hashable, int]:
        """Bytes of each cached model, least recently used first."""
        return self._models.sizes()

    def stats(self) -> ModelCacheStats:
        with self._lock:
            return ModelCacheStats(
                names=tuple(str(k) for k in self._models.sizes()),
                nbytes=self.nbytes,
                max_bytes=self.max_bytes,
                loading=tuple(str(k) for k in self._pending),
                hits=self._hits,
                loads=self._loads,
                reloads=self._reloads,
                evictions=self._evictions,
                refused=self._refused,
            )

    def get(
        self,
        name: Hashable,
        loader: Callable[[], V],
        *,
        on_progress: Progress | None = None,
        expected_bytes: int | None = None,
    ) -> V:
        """The cached model ``name``, loading it with ``loader()`` if it is not (or no longer) cached.

        Args:
            on_progress: called with a short message when loading or waiting starts, then every
                ``poll_s`` seconds while waiting; an exception it raises ends the call.
            expected_bytes: the model's memory if known beforehand (``ModelRequest.memory_bytes``).

        Raises:
            ModelTooLargeError: the model needs more than the whole budget (``refuse_oversize``).
            whatever ``loader`` raises (nothing is cached then).
        """
        while True:
            with self._lock:
                value = self._models.peek(name)  # now the most recently used (models are never None)
                if value is not None:
                    self._hits += 1
                    return value
                self._refuse_if_known_too_large(name, expected_bytes)
                pending = self._pending.get(name)
                owner = pending is None
                if owner:
                    pending = self._pending[name] = _Pending()
            assert pending is not None
            if owner:
                return self._load(name, loader, pending, on_progress, expected_bytes)
            self._wait(pending.done.wait, f"Waiting for {name}: another visitor is loading it…", on_progress)
            if pending.error is not None:
                raise pending.error
            if pending.has_value:
                return pending.value
            # the loading visitor left before finishing: go round, and load it ourselves

    def drop(self, name: Hashable) -> bool:
        """Forget ``name`` (e.g. after a failed capture); whether it was cached."""
        with self._lock:
            if name not in self._models:
                return False
            self._evicted(self._models.pop(name))
            return True

    def _evicted(self, value: V) -> None:
        if self._on_evict is not None:
            try:
                self._on_evict(value)
            except Exception:  # a failing clean-up must not break the cache; the model still goes
                logging.getLogger(__name__).exception("on_evict failed")

    def clear(self) -> None:
        with self._lock:
            for value in self._models.clear():
                self._evicted(value)

    def _dropped_lru(self, name: Hashable, value: V) -> None:
        """The LRU dropped ``name`` to make room: counted, remembered (a later load is a reload), let go."""
        with self._lock:
            self._evictions += 1
            self._remember(self._dropped, name, None)
        self._evicted(value)

    # -- internals ---------------------------------------------------------------------------

    def _refuse_if_known_too_large(self, name: Hashable, expected: int | None) -> None:
        known = expected if expected is not None else self._sizes.get(name)
        if self.refuse_oversize and known is not None and known > self.max_bytes:
            self._refused += 1
            raise ModelTooLargeError(str(name), known, self.max_bytes)

    def _wait(self, ready: Callable[[float], bool], message: str, on_progress: Progress | None) -> None:
        """Until ``ready(timeout)`` says yes, call ``on_progress(message)`` every ``poll_s`` seconds."""
        while not ready(0):
            if on_progress is not None:
                on_progress(message)
            if ready(self.poll_s):
                return

    def _load(
        self,
        name: Hashable,
        loader: Callable[[], V],
        pending: _Pending,
        on_progress: Progress | None,
        expected: int | None,
    ) -> V:
        try:
            if self._loading is not None:
                loading = self._loading
                self._wait(
                    lambda t: loading.acquire(timeout=t), "Waiting for another model to finish loading…", on_progress
                )
            try:
                with self._lock:
                    reload = name in self._dropped
                if on_progress is not None:
                    on_progress(
                        f"Reloading {name} (it was unloaded to make room for other models)…"
                        if reload
                        else f"Loading {name}…"
                    )
                if expected is not None:
                    self._models.make_room(self.max_bytes - expected)  # make room first: lower peak memory
                value = loader()
            finally:
                if self._loading is not None:
                    self._loading.release()
            size = int(self._size_of(value))
            with self._lock:
                self._remember(self._sizes, name, size)
                self._loads += 1
                self._reloads += reload
                self._dropped.pop(name, None)
                if size > self.max_bytes and self.refuse_oversize:
                    self._refused += 1
                    raise ModelTooLargeError(str(name), size, self.max_bytes)  # the value is dropped
                self._models.put(name, value, size)  # evicts the least recent until it fits (or keeps it alone)
            pending.value, pending.has_value = value, True
            return value
        except Exception as exc:  # an ordinary failure: waiters get it too
            pending.error = exc
            raise
        finally:  # a BaseException (the visitor left) leaves neither value nor error: a waiter takes over
            with self._lock:
                if self._pending.get(name) is pending:
                    del self._pending[name]
            pending.done.set()

    @staticmethod
    def _remember(table: OrderedDict, key: Hashable, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > _FORGET_AFTER:
            table.popitem(last=False)
