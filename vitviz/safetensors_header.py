"""A safetensors file's header, read and checked before any tensor is: what a checkpoint claims it holds.

The file is an 8-byte little-endian header length, a JSON table ``name -> {dtype, shape,
data_offsets}``, then the data. :func:`read_header` checks that the length fits the file, that the
table is JSON of the right shape, and that each entry's span holds ``prod(shape) * itemsize`` bytes
inside the data area; callers turn :class:`HeaderError` into their own message.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DTYPE_BYTES", "MAX_HEADER", "Entry", "HeaderError", "read_header"]

MAX_HEADER = 100 * 2**20  # bytes of a safetensors header
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


class HeaderError(ValueError):
    """The header cannot be trusted; ``kind``: "length", "json", "table", "entry", "span" (an entry's bytes do
    not match its shape) or "outside" (they leave the data area); ``name``: the entry at fault ("" for the whole
    header); ``str()``: the detail."""

    def __init__(self, kind: str, name: str = "", detail: str = "") -> None:
        super().__init__(detail or kind)
        self.kind, self.name = kind, name


@dataclass(frozen=True)
class Entry:
    """One tensor as the header describes it: ``count`` values of ``itemsize`` bytes at ``begin .. end``."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    begin: int
    end: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> tuple[list[Entry], int]:
    """The entries of ``path``'s header and the size of its data area (bytes); :class:`HeaderError` when the
    length, the JSON, an entry, or an entry's span (its bytes against its shape, inside the data) is wrong."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > min(size - 8, MAX_HEADER):
            raise HeaderError("length")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise HeaderError("json") from None
    if not isinstance(header, dict):
        raise HeaderError("table")
    data = size - 8 - n
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            itemsize = DTYPE_BYTES[info["dtype"]]
            begin, end = (int(v) for v in info["data_offsets"])
            shape = tuple(int(d) for d in info["shape"])
        except (KeyError, TypeError, ValueError):
            raise HeaderError("entry", str(name)) from None
        entry = Entry(str(name), shape, itemsize, begin, end)
        if end - begin != entry.count * itemsize:
            raise HeaderError(
                "span",
                str(name),
                f"has shape {list(shape)} ({entry.count * itemsize} bytes) but {end - begin} bytes of data",
            )
        if not 0 <= begin <= end <= data:
            raise HeaderError("outside", str(name), f"lies outside the file's {data} bytes of data")
        entries.append(entry)
    return entries, data
