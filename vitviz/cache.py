"""A thread-safe LRU cache bounded by entries *and* bytes: every cache vitviz keeps (models, captures, Runs, results).

``st.cache_resource`` bounds only the number of entries; one DINOv2-base capture at
518 px holds about 0.5 GB, and one Run with its autograd graph can hold several, so a
count alone does not bound memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["BoundedCache"]

V = TypeVar("V")


class BoundedCache(Generic[V]):
    """Least-recently-used cache holding at most ``max_entries`` values and ``max_bytes`` bytes.

    ``size_of(value)`` gives a value's size. A value larger than ``max_bytes`` is returned but not kept, unless
    ``keep_oversize``: then it is kept alone. Concurrent calls for the same key compute it once. ``on_evict(key,
    value)`` is called for each value dropped to make room (never for a replacement, :meth:`pop` or
    :meth:`clear`), after the cache's lock is released, so it may call back into the cache.
    """

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        size_of: Callable[[V], int],
        keep_oversize: bool = False,
        on_evict: Callable[[Hashable, V], None] | None = None,
    ) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("a cache needs room for at least one entry and one byte")
        self.max_entries, self.max_bytes, self._size_of = max_entries, max_bytes, size_of
        self.keep_oversize, self._on_evict = keep_oversize, on_evict
        self._data: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[Hashable, list] = {}  # key -> [lock, callers using it]; gone when none is
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    @property
    def pending(self) -> int:
        """Keys with a computation running or waited for (each holds one lock; none is kept after)."""
        with self._lock:
            return len(self._key_locks)

    def peek(self, key: Hashable) -> V | None:
        """The value kept under ``key`` (now the most recently used), or None; computes nothing."""
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key][0]

    def discard(self, where: Callable[[Hashable, V], bool]) -> None:
        """Drop every entry for which ``where(key, value)`` is true."""
        with self._lock:
            for key in [k for k, (v, _) in self._data.items() if where(k, v)]:
                _, size = self._data.pop(key)
                self.nbytes -= size

    def get_or_compute(
        self, key: Hashable, compute: Callable[[], V], *, accept: Callable[[V], bool] | None = None
    ) -> V:
        """The value under ``key``, computed once (concurrent callers wait for it) when missing, or when the kept
        one is not ``accept``-ed (then it is replaced)."""
        with self._lock:
            if key in self._data and (accept is None or accept(self._data[key][0])):
                self._data.move_to_end(key)
                return self._data[key][0]
            entry = self._key_locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:  # one computation per key; other keys proceed in parallel
                with self._lock:
                    if key in self._data and (accept is None or accept(self._data[key][0])):
                        self._data.move_to_end(key)
                        return self._data[key][0]
                value = compute()  # exceptions propagate and nothing is stored
                self._store(key, value)
                return value
        finally:  # success or failure, the last caller of a key drops its lock: failed keys keep nothing
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0 and self._key_locks.get(key) is entry:
                    del self._key_locks[key]

    def put(self, key: Hashable, value: V, size: int | None = None) -> None:
        """Keep ``value`` under ``key`` as the most recently used (``size``: its bytes, if already known)."""
        self._store(key, value, size)

    def _store(self, key: Hashable, value: V, size: int | None = None) -> None:
        size = int(self._size_of(value) if size is None else size)
        with self._lock:
            if key in self._data:  # a replacement: the old value's bytes leave with it
                self.nbytes -= self._data.pop(key)[1]
            if size > self.max_bytes and not self.keep_oversize:
                return
            self._data[key] = (value, size)
            self.nbytes += size
            evicted = self._shrink(self.max_bytes, self.max_entries, keep=key)
        self._evicted(evicted)

    def make_room(self, room: int) -> None:
        """Drop least recently used values until at most ``room`` bytes are kept (before a large value arrives)."""
        with self._lock:
            evicted = self._shrink(room, self.max_entries)
        self._evicted(evicted)

    def _shrink(self, room: int, entries: int, keep: Hashable = None) -> list[tuple[Hashable, V]]:
        """Pop least recently used entries (never ``keep``) until they fit (lock held); what was popped."""
        out = []
        for key in list(self._data):
            if self.nbytes <= room and len(self._data) <= entries:
                break
            if key == keep and keep is not None:
                continue
            value, size = self._data.pop(key)
            self.nbytes -= size
            out.append((key, value))
        return out

    def _evicted(self, evicted: list[tuple[Hashable, V]]) -> None:
        if self._on_evict is not None:
            for key, value in evicted:
                self._on_evict(key, value)

    def pop(self, key: Hashable) -> V | None:
        """Remove and return the value under ``key`` (None if there is none)."""
        with self._lock:
            item = self._data.pop(key, None)
            if item is None:
                return None
            self.nbytes -= item[1]
            return item[0]

    def sizes(self) -> dict[Hashable, int]:
        """Bytes of each kept value, least recently used first."""
        with self._lock:
            return {k: size for k, (_, size) in self._data.items()}

    def clear(self) -> list[V]:
        """Drop every value; returns them (least recently used first)."""
        with self._lock:
            values = [v for v, _ in self._data.values()]
            self._data.clear()
            self.nbytes = 0
        return values
