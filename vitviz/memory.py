"""Keep freed memory in the process instead of handing it back to the system after every run.

A :class:`~vitviz.capture.session.Run` that keeps its autograd graph allocates about
120 MB for ViT-B/16 at 224 px (the tensors the backward needs, the attention record).
glibc's malloc returns the top of its heap to the system once more than its trim
threshold (at most 64 MB by default) is free, and serves blocks above its mmap
threshold with their own mappings, unmapped on free: each new Run then touches fresh
pages, and the kernel's page faults (about 30,000 for that Run) cost 15-25 % of a
forward pass in system time (measured with ``os.times`` on this 2-core machine).
:func:`keep_freed_memory` raises both thresholds, so a new Run reuses the memory of the
one evicted before it. The process keeps up to :data:`TRIM_BYTES` of free heap; nothing
else changes (the same numbers, the same allocations).

The app, the command line and the benchmarks call it once at start; importing vitviz
does not (a notebook's allocator is left as it is). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

__all__ = ["MMAP_BYTES", "TRIM_BYTES", "keep_freed_memory"]

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 32 * 1024 * 1024  # glibc's largest accepted mmap threshold on 64-bit systems
TRIM_BYTES = 1024 * 1024 * 1024

_done: bool | None = None
_lock = threading.Lock()


def keep_freed_memory() -> bool:
    """Raise glibc's trim and mmap thresholds once per process; True when they are set (False off glibc)."""
    global _done
    with _lock:
        if _done is None:
            _done = _set()
        return _done


def _set() -> bool:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
