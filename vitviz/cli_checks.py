"""Checks of command-line options, so that bad input gets a one-line message, never a traceback.

:class:`UsageError` is an option that cannot work (``python -m vitviz`` exits with 2, as
argparse does); other :class:`~vitviz.errors.VitvizError` s exit with 1. The checks that
need the model (its patch size, its classes) run right after loading, before any image.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

from vitviz.errors import VitvizError

__all__ = [
    "UsageError",
    "OutputError",
    "MAX_SIZE",
    "input_size",
    "query_point",
    "check_output_folder",
    "check_against_model",
    "read_labels_file",
    "unique_targets",
    "terminal_text",
    "MAX_ECHO_CHARS",
]

MAX_SIZE = 8192  # pixels per side of the model input; memory budgets refuse far less long before
MAX_ECHO_CHARS = 2000  # of one message printed to the terminal; the rest is counted, not printed
# C0 controls but tab and newline, DEL, C1 controls (an 8-bit CSI), and the Unicode bidi overrides and isolates,
# which reorder what the terminal shows after them
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: object, max_chars: int = MAX_ECHO_CHARS) -> str:
    """``text`` as it may be printed to a terminal: control characters escaped, at most ``max_chars`` characters.

    Whatever a user or a file supplied (labels, template, CSV cells, file names) may hold escape
    sequences (``ESC [2J`` clears the screen, ``ESC ]0;...BEL`` retitles the window) or bidi overrides;
    each such character is shown as its escape (``\\x1b``, ``\\u202e``) instead. Tab and newline pass.
    """
    text = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
    if len(text) > max_chars:
        text = f"{text[:max_chars]}... ({len(text) - max_chars:,} more characters not shown)"
    return text


class UsageError(VitvizError):
    """An option value that cannot work: exit code 2."""


class OutputError(VitvizError):
    """An output path that cannot be written (read-only, a file where a folder is needed): exit code 1."""


def input_size(values: list[int] | None, option: str = "--size") -> int | tuple[int, int] | None:
    """``--size PX`` or ``--size H W`` -> ``PX`` or ``(H, W)``; None when not given.

    Raises:
        UsageError: more than two numbers, or a side below 1 or above :data:`MAX_SIZE`.
    """
    if values is None:
        return None
    if len(values) not in (1, 2):
        raise UsageError(f"{option} takes one number (a square) or two (H W), got {len(values)}.")
    for v in values:
        if not 1 <= v <= MAX_SIZE:
            raise UsageError(f"{option} {v}: each side must be between 1 and {MAX_SIZE} pixels.")
    return values[0] if len(values) == 1 else (values[0], values[1])


def query_point(text: str) -> tuple[float, float]:
    """``X,Y`` -> (x, y): two numbers from 0 to :data:`MAX_SIZE` (pixels of the model input; points past its
    edge are clipped to it).

    Raises:
        ValueError: anything else (argparse turns it into its usage message).
    """
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError(f"expected X,Y in pixels of the model input, got {text[:40]!r}")
    try:
        x, y = (float(v) for v in parts)
    except ValueError:
        raise ValueError(f"expected X,Y in pixels of the model input, got {text[:40]!r}") from None
    if not (math.isfinite(x) and math.isfinite(y)) or not (0 <= x <= MAX_SIZE and 0 <= y <= MAX_SIZE):
        raise ValueError(f"X,Y must be pixels of the model input, from 0 to {MAX_SIZE}; got {text[:40]!r}")
    return x, y


def _writable_folder(folder: Path, option: str) -> None:
    """Raise :class:`OutputError` unless a file can be created in ``folder`` (which exists)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".vitviz-write-test-", dir=folder)
    except OSError as exc:
        raise OutputError(f"{option} {folder}: cannot write there ({exc.strerror or exc}).") from None
    os.close(fd)
    os.unlink(name)


def check_output_folder(
    path: str | Path, option: str = "--out", *, must_be_empty: bool = False, create: bool = True
) -> Path:
    """The folder an option names, checked writable: created if missing (``create``), else its nearest existing
    parent is checked.

    Raises:
        UsageError: it is a file, a symbolic link, or (``must_be_empty``) a folder with files.
        OutputError: it (or its parent) cannot be created or written.
    """
    out = Path(path)
    if len(str(out)) > 4096:
        raise UsageError(f"{option}: a path of {len(str(out))} characters is too long.")
    if out.is_symlink():
        raise UsageError(f"{option} {out} is a symbolic link; give a real folder.")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {out} is a file, not a folder; give a folder.")
    if must_be_empty and out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{option} {out} exists and is not empty; choose another {option}.")
    if not create:
        parent = out if out.is_dir() else out.absolute().parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise UsageError(f"{option} {out}: {parent} is not a folder.")
        _writable_folder(parent, option)
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{option} {out}: cannot create it ({exc.strerror or exc}).") from None
    _writable_folder(out, option)
    return out


def check_against_model(
    loaded,
    size: int | tuple[int, int] | None,
    class_index: int | None,
    *,
    labels=None,
    option_size: str = "--size",
) -> None:
    """Options that depend on the model: input sides of at least one patch, a class the model (or, zero-shot,
    the typed ``labels``) has.

    Raises:
        UsageError: a side below the family's size multiple, or a class index out of range.
    """
    if size is not None:
        m = int(loaded.family.size_multiple(loaded.config))
        sides = (size, size) if isinstance(size, int) else size
        if min(sides) < m:
            raise UsageError(
                f"{option_size} {' '.join(str(s) for s in (sides[:1] if isinstance(size, int) else sides))}: "
                f"smaller than one patch of '{loaded.name}' ({m} px); give at least {m}."
            )
    if class_index is not None:
        count = len(labels.names) if labels is not None else len(loaded.id2label or {})
        if not count:
            raise UsageError(f"--class {class_index}: '{loaded.name}' has no classifier; drop --class.")
        if not 0 <= class_index < count:
            raise UsageError(f"--class {class_index}: '{loaded.name}' has classes 0 to {count - 1}.")


def read_labels_file(path: str | Path, option: str = "--labels") -> list[str]:
    """Non-empty stripped lines of a UTF-8 text file.

    Raises:
        UsageError: missing, not a regular file, or not text.
    """
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{option} {p}: no such file.")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option} {p}: cannot be read as UTF-8 text ({exc}).") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def unique_targets(stems: list[str]) -> list[str]:
    """Output stems without collisions, in order: the second ``x`` becomes ``x-1``, the third ``x-2``; a stem
    another input has as its own (``x-1.jpg``) is skipped."""
    later = Counter(stems)
    seen: set[str] = set()
    out = []
    for stem in stems:
        later[stem] -= 1
        name, n = stem, 0
        while name in seen or (name != stem and later[name] > 0):
            n += 1
            name = f"{stem}-{n}"
        seen.add(name)
        out.append(name)
    return out
