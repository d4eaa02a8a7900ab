"""A thread-safe LRU cache bounded by entries *and* bytes: every cache vitviz keeps (captures, Runs, results).

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

    ``size_of(value)`` gives a value's size. A value larger than ``max_bytes`` is
    returned but not kept. Concurrent calls for the same key compute it once.
    """

    def __init__(self, *, max_entries: int, max_bytes: int, size_of: Callable[[V], int]) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("a cache needs room for at least one entry and one byte")
        self.max_entries, self.max_bytes, self._size_of = max_entries, max_bytes, size_of
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

    def _store(self, key: Hashable, value: V) -> None:
        size = int(self._size_of(value))
        with self._lock:
            if key in self._data:  # a replacement: the old value's bytes leave with it
                self.nbytes -= self._data.pop(key)[1]
            if size > self.max_bytes:
                return
            self._data[key] = (value, size)
            self.nbytes += size
            while len(self._data) > self.max_entries or self.nbytes > self.max_bytes:
                _, (_, old) = self._data.popitem(last=False)
                self.nbytes -= old

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.nbytes = 0
