"""The images of an evaluation: a folder of images, or a CSV of files, labels and object boxes.

Two inputs are accepted by :func:`read_dataset`:

* **A folder**: every file with an image suffix (``.png .jpg .jpeg .webp .bmp .gif .tif
  .tiff``, any case) under it, sub-folders included, in sorted order; hidden files and
  folders (``.name``) are ignored. Other files are reported and skipped, and so are
  entries that are not regular files (a FIFO named ``x.png``, a link to ``/dev/zero``)
  and files over :data:`vitviz.data.images.MAX_BYTES`: their size is checked before
  anything is read, and they are never opened.
* **A CSV** in the format ``python -m vitviz demo-data`` writes
  (:func:`vitviz.data.shapes.write_dataset`): columns ``file,label,x0,y0,x1,y1``;
  ``file`` is relative to the CSV's folder (or absolute); ``label`` (optional) is the
  true class, as text; the box ``(x0, y0, x1, y1)`` (optional as a whole: all four
  columns or none; a row may leave all four cells empty) is the object's box in pixels
  of the ORIGINAL image, x1/y1 exclusive.

Nothing is decoded while listing: a row with a missing file, a bad number or an empty
box is reported (:class:`Skipped`) and the listing goes on. The CSV is read row by row, and
at most ``max_rows`` rows (default :data:`MAX_ROWS`, ``evaluate --max-rows``) are read: the
rest is not, and one entry says so (2,000,000 rows took a run past 3 GB). What was skipped is
summarised (:class:`SkipLog`): every entry counted, the first :data:`KEPT_SKIPPED` kept with
their reasons (a results file of 300,000 skipped rows carried 76 MB of them). Decoding and the check that
the box lies inside the image happen per image, in whichever engine runs it
(:func:`load_item`), so a damaged file costs only its own row.

Every item has a stable id, its path relative to the folder (or the CSV's ``file``
cell, normalised): a resumed run recognises what it has already done by it.
"""

from __future__ import annotations

import csv
import math
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from PIL import Image

from vitviz.data.images import MAX_BYTES, load_image
from vitviz.errors import VitvizError

__all__ = [
    "IMAGE_SUFFIXES",
    "CSV_COLUMNS",
    "BOX_COLUMNS",
    "DataError",
    "Item",
    "Skipped",
    "SkipLog",
    "MAX_ROWS",
    "MAX_FILES",
    "KEPT_SKIPPED",
    "Dataset",
    "read_dataset",
    "read_folder",
    "read_csv",
    "load_item",
    "scale_box",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
CSV_COLUMNS = ("file", "label", "x0", "y0", "x1", "y1")  # what ``demo-data`` writes
BOX_COLUMNS = ("x0", "y0", "x1", "y1")
MAX_ROWS = 100_000  # rows of a CSV read (blank lines aside); evaluate --max-rows sets another
# Entries (files, folders, links) a folder's listing reads, all sub-folders together; evaluate --max-files sets
# another. The listing holds about 200 bytes an entry (its path), so a folder of millions costs at most ~200 MB.
MAX_FILES = 1_000_000
KEPT_SKIPPED = 100  # skipped inputs kept with their reasons (all are counted)

Box = tuple[float, float, float, float]


class DataError(VitvizError):
    """A data set (folder or CSV) or one of its images cannot be used; the message says why."""


@dataclass(frozen=True)
class Item:
    """One image to evaluate.

    ``image_id``: stable id (path relative to the folder, or the CSV's ``file`` cell in
    POSIX form); ``path``: where the file is; ``label``: the true class from the CSV
    (None without); ``box``: ``(x0, y0, x1, y1)`` in pixels of the original image, x1/y1
    exclusive (None without); ``source``: where it was listed (``labels.csv:7``).
    """

    image_id: str
    path: str
    label: str | None = None
    box: Box | None = None
    source: str = ""

    def to_dict(self) -> dict:
        """Plain types only (for Ray Data and JSON)."""
        return {
            "image_id": self.image_id,
            "path": self.path,
            "label": self.label,
            "box": None if self.box is None else list(self.box),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Item:
        box = d.get("box")
        return cls(
            image_id=str(d["image_id"]),
            path=str(d["path"]),
            label=d.get("label"),
            box=None if box is None else tuple(float(v) for v in box),
            source=str(d.get("source") or ""),
        )


@dataclass(frozen=True)
class Skipped:
    """Something that was not evaluated: ``where`` (a file or ``labels.csv:7``) and ``reason``."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


class SkipLog(list):
    """What was skipped, summarised: a list of the first ``keep`` entries (:class:`Skipped`), plus ``total``, every
    entry counted. ``append`` and ``extend`` count; a million bad rows keep ``keep`` of them. :meth:`note` keeps an
    entry whatever ``keep`` says (that the rest of a file was not read)."""

    def __init__(self, entries: Sequence[Skipped] = (), *, keep: int = KEPT_SKIPPED) -> None:
        super().__init__()
        self.keep, self.total = int(keep), 0
        self._noted: set[int] = set()  # ids of the entries kept by note()
        self.extend(entries)

    def append(self, entry: Skipped) -> None:
        self.total += 1
        if len(self) - len(self._noted) < self.keep:
            super().append(entry)

    def note(self, entry: Skipped) -> None:
        self.total += 1
        self._noted.add(id(entry))
        super().append(entry)

    def extend(self, entries) -> None:
        noted = getattr(entries, "_noted", set())
        for entry in entries:
            (self.note if id(entry) in noted else self.append)(entry)
        if isinstance(entries, SkipLog):
            self.total += entries.left_out

    @property
    def noted(self) -> list[Skipped]:
        """The entries :meth:`note` kept."""
        return [e for e in self if id(e) in self._noted]

    @property
    def left_out(self) -> int:
        """Entries counted but not kept."""
        return self.total - len(self)


@dataclass
class Dataset:
    """The items to evaluate and what was skipped while listing them."""

    source: Path
    kind: str  # "folder" or "csv"
    items: list[Item] = field(default_factory=list)
    skipped: SkipLog = field(default_factory=SkipLog)
    has_labels: bool = False
    has_boxes: bool = False


def read_dataset(
    path: str | Path, *, limit: int | None = None, max_rows: int = MAX_ROWS, max_files: int = MAX_FILES
) -> Dataset:
    """A folder of images or a CSV (module docstring); ``limit``: stop after that many usable items;
    ``max_rows``: read at most that many rows of a CSV (or entries of a folder), saying so when there are more;
    ``max_files``: a folder's listing reads at most that many entries (:func:`read_folder`).

    Raises :class:`DataError` when ``path`` is neither, or when the CSV lacks columns.
    """
    p = Path(path)
    if limit is not None and limit < 1:
        raise DataError(f"--limit must be at least 1, got {limit}")
    if max_rows < 1:
        raise DataError(f"--max-rows must be at least 1, got {max_rows}")
    if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 1:
        raise DataError(f"--max-files must be at least 1, got {max_files}")
    if p.is_dir():
        return read_folder(p, limit=limit, max_rows=max_rows, max_files=max_files)
    if p.is_file():
        if p.suffix.lower() == ".csv":
            return read_csv(p, limit=limit, max_rows=max_rows)
        raise DataError(
            f"'{p}' is a file but not a .csv: give a folder of images or a CSV with columns {','.join(CSV_COLUMNS)} "
            "(as `python -m vitviz demo-data` writes)"
        )
    raise DataError(f"'{p}' does not exist: give a folder of images or a CSV with columns {','.join(CSV_COLUMNS)}")


def _not_a_regular_file(path: Path, max_bytes: int = MAX_BYTES) -> str | None:
    """Why ``path`` cannot be read as an image file (None when it can): only regular files (a symbolic link to
    one is fine) of at most ``max_bytes``; FIFOs, devices and sockets are never opened."""
    try:
        st = path.stat()  # follows a symbolic link, without opening anything
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) else "not a file"
        return f"not a regular file ({kind}): not read"
    if st.st_size > max_bytes:
        return f"{st.st_size / 2**20:.0f} MB, more than the {max_bytes / 2**20:.0f} MB an image may have: not read"
    return None


def _read_regular(path: str | Path, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, checked on the open file (no race with a swap)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in cannot block
    except OSError as exc:
        raise DataError(f"'{path}' cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"'{path}' is not a regular file: not read")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DataError(f"'{path}' is larger than the {max_bytes / 2**20:.0f} MB an image may have: not read")
    return data


def _hidden(rel: PurePath) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _more_than(max_rows: int, where: str, what: str) -> Skipped:
    return Skipped(
        where, f"{what} more than {max_rows:,} rows: the rest was not read (evaluate --max-rows N reads more)"
    )


def list_folder(root: Path, max_files: int = MAX_FILES) -> tuple[list[str], list[Skipped], Skipped | None]:
    """The relative paths (posix) of the non-folder entries under ``root``, hidden ones (``.name``) left out, read
    one folder at a time with an explicit stack (no recursion: a tree nested thousands deep is fine) and at most
    ``max_files`` entries in all, folders and links included, so memory stays bounded whatever the folder holds.

    Links to folders are not followed (a link loop cannot hang the listing; it is reported). Returns the paths,
    what was left out on the way (links to folders, folders that cannot be read), and, when the bound was reached,
    one entry saying how many entries of the folder being read were not listed and how many folders were never
    opened (None when everything was listed).
    """
    found: list[str] = []
    skipped: list[Skipped] = []
    stack: list[str] = [""]  # folders still to read, relative to root
    seen = 0
    while stack:
        rel_dir = stack.pop()
        folder = root / rel_dir if rel_dir else root
        try:
            it = os.scandir(folder)
        except OSError as exc:
            skipped.append(Skipped(str(folder), f"cannot be read ({exc.strerror or exc}): not listed"))
            continue
        with it:
            entries = []
            unlisted = 0
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if seen >= max_files:  # the bound: count the rest of this folder, keep nothing
                    unlisted += 1
                    continue
                seen += 1
                entries.append(entry)
            subfolders = []
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    linked_dir = not is_dir and entry.is_symlink() and entry.is_dir()
                except OSError:
                    is_dir = linked_dir = False
                if is_dir:
                    subfolders.append(rel)
                elif linked_dir:
                    skipped.append(Skipped(str(root / rel), "a link to a folder: not followed"))
                else:
                    found.append(rel)
            stack.extend(reversed(subfolders))  # depth first, in name order
        if unlisted:
            note = Skipped(
                str(root),
                f"the listing stopped at {max_files:,} entries (files, folders and links; evaluate --max-files N "
                f"lists more): {unlisted:,} more in '{folder}' and the contents of {len(stack):,} folder(s) not yet "
                "opened were not listed",
            )
            return found, skipped, note
    return found, skipped, None


def read_folder(
    folder: str | Path, *, limit: int | None = None, max_rows: int = MAX_ROWS, max_files: int = MAX_FILES
) -> Dataset:
    """Every image file under ``folder`` (recursively, sorted; the first ``max_rows`` files); other files are skipped
    and reported. The listing reads at most ``max_files`` entries (:func:`list_folder`), saying so when it stops."""
    root = Path(folder)
    ds = Dataset(source=root, kind="folder")
    listed, left_out, stopped = list_folder(root, max_files)
    if stopped is not None:
        ds.skipped.note(stopped)
    ds.skipped.extend(left_out)
    listed.sort()
    for n, rel in enumerate(listed):
        if limit is not None and len(ds.items) >= limit:
            break
        if n >= max_rows:
            ds.skipped.note(_more_than(max_rows, str(root), "the folder holds"))
            break
        f = root / rel
        if f.suffix.lower() not in IMAGE_SUFFIXES:
            hint = " (to use its labels and boxes, pass the CSV itself as --data)" if f.suffix.lower() == ".csv" else ""
            ds.skipped.append(Skipped(str(f), f"not an image file (expected {' '.join(IMAGE_SUFFIXES)}){hint}"))
            continue
        why = _not_a_regular_file(f)
        if why:
            ds.skipped.append(Skipped(str(f), why))
            continue
        ds.items.append(Item(image_id=rel, path=str(f), source=str(f)))
    if not ds.items and not ds.skipped:
        raise DataError(f"the folder '{root}' holds no image files ({' '.join(IMAGE_SUFFIXES)})")
    return ds


def _number(row: dict, column: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{column} = {text!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"{column} = {text!r} is not a finite number")
    return value


def _box(row: dict) -> Box | None:
    cells = [(row.get(c) or "").strip() for c in BOX_COLUMNS]
    if not any(cells):
        return None
    if not all(cells):
        empty = [c for c, v in zip(BOX_COLUMNS, cells, strict=True) if not v]
        raise DataError(f"the box is incomplete: {', '.join(empty)} empty (fill all four or none)")
    x0, y0, x1, y1 = (_number(row, c) for c in BOX_COLUMNS)
    if not (x0 < x1 and y0 < y1):
        raise DataError(f"the box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) is empty: it needs x0 < x1 and y0 < y1")
    return (x0, y0, x1, y1)


SHOWN_COLUMNS = 8  # column names a message quotes (a CSV of 200,000 columns printed 1.5 MB of them)


def _names(header: Sequence[str]) -> str:
    """The first :data:`SHOWN_COLUMNS` names, each cut to 40 characters, and how many more there are."""
    shown = [h if len(h) <= 40 else h[:40] + "..." for h in header[:SHOWN_COLUMNS]]
    more = f" and {len(header) - SHOWN_COLUMNS:,} more" if len(header) > SHOWN_COLUMNS else ""
    return ", ".join(shown) + more


def read_csv(path: str | Path, *, limit: int | None = None, max_rows: int = MAX_ROWS) -> Dataset:
    """Rows of a ``file,label,x0,y0,x1,y1`` CSV (module docstring), read one at a time, at most ``max_rows`` of them
    (blank lines aside); bad rows are skipped and reported (:class:`SkipLog`)."""
    csv_path = Path(path)
    root = csv_path.parent
    ds = Dataset(source=csv_path, kind="csv")
    try:
        fh = csv_path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(f"cannot read '{csv_path}': {exc.strerror or exc}") from None
    with fh:
        try:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"'{csv_path}' is not a readable CSV: {exc}") from None
        reader.fieldnames = header
        expected = f"expected the columns {','.join(CSV_COLUMNS)} as `python -m vitviz demo-data` writes them"
        if not header:
            raise DataError(f"'{csv_path}' is empty: {expected}")
        missing = [c for c in ("file",) if c not in header]
        box_missing = [c for c in BOX_COLUMNS if c not in header]
        if len(box_missing) not in (0, len(BOX_COLUMNS)):
            missing += box_missing
        if missing:
            raise DataError(
                f"'{csv_path}' lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"(it has {_names(header)}): {expected} (label and the four box columns are optional, "
                "the box as a whole)"
            )
        ds.has_labels = "label" in header
        ds.has_boxes = not box_missing
        seen: dict[str, str] = {}
        rows = 0
        try:
            for row in reader:
                if limit is not None and len(ds.items) >= limit:
                    break
                where = f"{csv_path.name}:{reader.line_num}"
                if not any((v or "").strip() for k, v in row.items() if k is not None):
                    continue  # a blank line
                if rows >= max_rows:
                    ds.skipped.note(_more_than(max_rows, where, "the CSV has"))
                    break
                rows += 1
                try:
                    item = _row_item(row, root, where, ds.has_boxes)
                except DataError as exc:
                    ds.skipped.append(Skipped(where, str(exc)))
                    continue
                if item.image_id in seen:
                    ds.skipped.append(
                        Skipped(where, f"'{item.image_id}' is listed again (first at {seen[item.image_id]})")
                    )
                    continue
                seen[item.image_id] = where
                ds.items.append(item)
        except (csv.Error, UnicodeDecodeError) as exc:
            ds.skipped.note(Skipped(f"{csv_path.name}:{reader.line_num}", f"the rest of the CSV is unreadable: {exc}"))
    if not ds.items and not ds.skipped:
        raise DataError(f"'{csv_path}' lists no images")
    return ds


def _row_item(row: dict, root: Path, where: str, has_boxes: bool) -> Item:
    if None in row:  # csv puts surplus cells under the key None
        raise DataError(f"the row has {len(row) - 1 + len(row[None])} cells, the header {len(row) - 1}")
    name = (row.get("file") or "").strip()
    if not name:
        raise DataError("the file cell is empty")
    path = Path(name) if Path(name).is_absolute() else root / name
    if not path.exists():
        raise DataError(f"no such file '{path}'")
    why = _not_a_regular_file(path)
    if why:
        raise DataError(f"'{path}': {why}")
    box = _box(row) if has_boxes else None
    label = (row.get("label") or "").strip() or None
    return Item(image_id=PurePath(name).as_posix(), path=str(path), label=label, box=box, source=where)


def load_item(item: Item) -> Image.Image:
    """The item's image as RGB, or :class:`DataError` / :class:`~vitviz.errors.ImageError` saying why not.

    Checks that the box (if any) lies inside the image: ``0 <= x0 < x1 <= width`` and
    likewise for y.
    """
    image = load_image(_read_regular(item.path))
    if item.box is not None:
        x0, y0, x1, y1 = item.box
        w, h = image.size
        if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
            raise DataError(f"the box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) lies outside the {w} x {h} image")
    return image


def scale_box(box: Sequence[float], image_wh: tuple[int, int], input_hw: tuple[int, int]) -> Box:
    """A box in pixels of the original ``image_wh`` (w, h) -> pixels of the ``input_hw`` (h, w) model input.

    The app resizes the whole image to the input size (no crop,
    :func:`vitviz.capture.forward.preprocess`), so each axis scales by its own factor.
    """
    (w, h), (ih, iw) = image_wh, input_hw
    x0, y0, x1, y1 = (float(v) for v in box)
    sx, sy = iw / w, ih / h
    return (x0 * sx, y0 * sy, x1 * sx, y1 * sy)
