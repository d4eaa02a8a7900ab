"""Image intake: whatever bytes arrive become an RGB ``PIL.Image`` or an :class:`ImageError`.

Used by the app and the command line alike, so both refuse the same things with
the same words. Pixels are never decoded before the size check, so a
decompression bomb costs nothing: the pixel count and the longest side are read
from the header (a 150 KB PNG of 1 x 39 million pixels would cost about 0.9 GB to
decode). Decoding itself is bounded for the whole process by :data:`DECODE_BUDGET`
(a byte budget shared by every thread, so by every session of a server; a page
reload cannot reset it): each decode reserves what it will cost, and waits while
others hold the budget.
"""

from __future__ import annotations

import io
import os
import re
import stat
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from struct import error as struct_error

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vitviz.errors import ImageError

__all__ = [
    "MAX_PIXELS",
    "MAX_SIDE",
    "MAX_BYTES",
    "DECODE_BUDGET",
    "DecodeBudget",
    "Intake",
    "configure",
    "decode_cost",
    "read_image",
    "mirrored_png",
    "read_file",
    "image_from_array",
    "load_image",
]

MAX_PIXELS = 40_000_000  # about a 7000 x 5700 photo; larger is refused before decoding
MAX_SIDE = 16_384  # longest side in pixels: a long thin image is refused before decoding, whatever its pixel count
MAX_BYTES = 200 * 1024 * 1024
DECODE_BUDGET_BYTES = 2 * 2**30  # images being decoded at once in this process
DECODE_WAIT_S = 30.0  # how long a decode waits for the budget before it is refused
MIRROR_BYTES_PER_PIXEL = 10  # mirroring an RGB image (3) and encoding it as PNG (its rows and output, about 7)


class DecodeBudget:
    """A byte budget shared by every thread of the process: decodes reserve their cost and wait for room.

    ``reserve(cost)`` blocks until ``cost`` fits beside what others hold (FIFO is not
    promised; a decode that alone exceeds the budget is refused at once), and raises
    :class:`ImageError` after ``wait_s`` seconds. Thread-safe; one object per process.
    """

    def __init__(self, total_bytes: int, wait_s: float = DECODE_WAIT_S) -> None:
        if total_bytes < 1 or wait_s < 0:
            raise ValueError("a decode budget needs a positive size and a wait of 0 s or more")
        self.total, self.wait_s = int(total_bytes), float(wait_s)
        self.used = 0
        self.peak = 0  # the most held at once since the last resize (for tests and logs)
        self._cond = threading.Condition()

    def resize(self, total_bytes: int, wait_s: float | None = None) -> None:
        """A new size (and wait); ``peak`` starts again from what is held now."""
        with self._cond:
            self.total = int(total_bytes)
            self.peak = self.used
            if wait_s is not None:
                self.wait_s = float(wait_s)
            self._cond.notify_all()

    def reserve(self, cost: int) -> None:
        cost = max(1, int(cost))
        with self._cond:
            if cost > self.total:
                raise ImageError(
                    f"Decoding this image would take about {cost / 2**20:,.0f} MB of memory; this server decodes at "
                    f"most {self.total / 2**20:,.0f} MB of images at once. Downscale it and try again."
                )
            deadline = time.monotonic() + self.wait_s
            while self.used + cost > self.total:
                left = deadline - time.monotonic()
                if left <= 0 or (not self._cond.wait(left) and self.used + cost > self.total):
                    raise ImageError("The server is busy decoding other large images. Please try again in a moment.")
            self.used += cost
            self.peak = max(self.peak, self.used)

    def release(self, cost: int) -> None:
        with self._cond:
            self.used -= max(1, int(cost))
            self._cond.notify_all()


DECODE_BUDGET = DecodeBudget(DECODE_BUDGET_BYTES)
_LIMITS = {"max_pixels": MAX_PIXELS, "max_side": MAX_SIDE}


def configure(*, max_pixels: int | None = None, max_side: int | None = None, budget_bytes: int | None = None) -> None:
    """Process-wide defaults of :func:`read_image` (a server sets them once from its settings)."""
    if max_pixels is not None:
        _LIMITS["max_pixels"] = int(max_pixels)
    if max_side is not None:
        _LIMITS["max_side"] = int(max_side)
    if budget_bytes is not None:
        DECODE_BUDGET.resize(budget_bytes)


def decode_cost(size: tuple[int, int], mode: str) -> int:
    """Bytes decoding an image of ``size`` (w, h) and ``mode`` to RGB may hold at its peak.

    Pillow keeps 1 to 4 bytes a pixel; the RGB copy, the orientation fix and the alpha
    flattening add about 16 more; high bit depth modes go through float64 arrays (about 30).
    """
    w, h = size
    per_pixel = 36 if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F") else 20
    return w * h * per_pixel


FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")


@dataclass(frozen=True)
class Intake:
    image: Image.Image  # RGB
    notes: tuple[str, ...]  # what was done to it, to show the user (first frame, flattened alpha, ...)


def _to_rgb(img: Image.Image, notes: list[str]) -> Image.Image:
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        # High bit depth: stretch the actual range to 8 bits, as a viewer would.
        arr = np.asarray(img, dtype=np.float64)
        finite = arr[np.isfinite(arr)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        scaled = np.zeros_like(arr) if hi <= lo else (np.nan_to_num(arr, nan=lo, posinf=hi, neginf=lo) - lo) / (hi - lo)
        notes.append(f"{mode} image scaled from [{lo:g}, {hi:g}] to 8 bits")
        return Image.fromarray((np.clip(scaled, 0, 1) * 255).round().astype(np.uint8), "L").convert("RGB")
    if (mode == "P" and "transparency" in img.info) or mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        notes.append("transparency flattened onto white")
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode == "CMYK":
        notes.append("CMYK converted to RGB")
    return img.convert("RGB")


def read_image(
    data: bytes | bytearray | memoryview,
    *,
    max_pixels: int | None = None,
    max_bytes: int = MAX_BYTES,
    max_side: int | None = None,
    budget: DecodeBudget | None = None,
) -> Intake:
    """Decode an image file's bytes (an upload, a file read) to RGB, or raise :class:`ImageError` saying why not.

    Handles EXIF orientation, every Pillow mode (1, L, LA, P, RGBA, CMYK, I;16, I, F),
    animated files (first frame), truncated and corrupt files, and images with more
    than ``max_pixels`` pixels or a side longer than ``max_side`` (refused from the
    header, before decoding; defaults: :data:`MAX_PIXELS`, :data:`MAX_SIDE` or what
    :func:`configure` set). The decoding reserves its cost in ``budget`` (default: the
    process-wide :data:`DECODE_BUDGET`) and waits for room there.
    """
    return _intake(data, max_pixels=max_pixels, max_bytes=max_bytes, max_side=max_side, budget=budget)


def _png_of_mirror(rgb: Image.Image) -> bytes:
    buf = io.BytesIO()
    ImageOps.mirror(rgb).save(buf, format="PNG")
    return buf.getvalue()


def mirrored_png(
    data: bytes | bytearray | memoryview,
    *,
    max_pixels: int | None = None,
    max_bytes: int = MAX_BYTES,
    max_side: int | None = None,
    budget: DecodeBudget | None = None,
) -> bytes:
    """The image of ``data`` mirrored left to right, as PNG bytes: decoded, mirrored and encoded inside ``budget``.

    The same checks as :func:`read_image`; the reservation covers the decode and
    :data:`MIRROR_BYTES_PER_PIXEL` more per pixel for the mirrored copy and its encoding, all
    held until the PNG is written (Side by side's "flipped copy" decoded outside the budget on
    every rerun: two sessions with a 6300 x 6300 PNG took a server from 0.4 to 3.0 GB).
    """
    return _intake(
        data,
        max_pixels=max_pixels,
        max_bytes=max_bytes,
        max_side=max_side,
        budget=budget,
        extra_per_pixel=MIRROR_BYTES_PER_PIXEL,
        then=_png_of_mirror,
    )


def _intake(
    data: bytes | bytearray | memoryview,
    *,
    max_pixels: int | None,
    max_bytes: int,
    max_side: int | None,
    budget: DecodeBudget | None,
    extra_per_pixel: int = 0,
    then=None,
):
    """:func:`read_image`'s checks and decode; ``then(rgb)``, if given, runs inside the same reservation (which holds
    ``extra_per_pixel`` more bytes a pixel for it) and its result is returned instead of the :class:`Intake`."""
    max_pixels = _LIMITS["max_pixels"] if max_pixels is None else max_pixels
    max_side = _LIMITS["max_side"] if max_side is None else max_side
    budget = DECODE_BUDGET if budget is None else budget
    data = bytes(data)
    if not data:
        raise ImageError("The file is empty: give a PNG, JPEG, WebP, BMP, GIF or TIFF image.")
    if len(data) > max_bytes:
        raise ImageError(f"The file is {len(data) / 2**20:.0f} MB; the limit is {max_bytes / 2**20:.0f} MB.")
    notes: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Pillow's notes on damaged metadata
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=FORMATS)
        w, h = img.size
        if w < 1 or h < 1:
            raise ImageError("The image has no pixels.")
        if w * h > max_pixels:
            raise ImageError(
                f"The image is {w} x {h} = {w * h / 1e6:.0f} megapixels; vitviz accepts at most "
                f"{max_pixels / 1e6:.0f} megapixels. Downscale it and try again."
            )
        if max(w, h) > max_side:
            raise ImageError(
                f"The image is {w} x {h} pixels; vitviz accepts sides of at most {max_side:,} pixels. "
                "Crop or downscale it and try again."
            )
        cost = decode_cost((w, h), img.mode) + extra_per_pixel * w * h
        budget.reserve(cost)  # waits while other sessions decode (outside catch_warnings: it is process-global)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                if getattr(img, "n_frames", 1) > 1:
                    notes.append(f"animated image: using the first of its {img.n_frames} frames")
                    img.seek(0)
                img.load()
                img = ImageOps.exif_transpose(img) or img
                rgb = _to_rgb(img, notes)
                rgb.load()
                if then is not None:
                    return then(rgb)
        finally:
            budget.release(cost)
    except ImageError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        if isinstance(exc, UnidentifiedImageError):
            raise ImageError(
                "This file is not an image vitviz can read: give a PNG, JPEG, WebP, BMP, GIF or TIFF image."
            ) from None
        raise ImageError(
            f"The image is too large to decode safely (limit {max_pixels / 1e6:.0f} megapixels)."
        ) from None
    except (
        OSError,
        SyntaxError,
        ValueError,
        TypeError,
        EOFError,
        IndexError,
        KeyError,
        struct_error,
        ZeroDivisionError,
        MemoryError,
        RuntimeError,
        AttributeError,
        NotImplementedError,
        OverflowError,
    ):
        raise ImageError(
            "The image file is damaged or truncated and cannot be decoded. Re-export it and try again."
        ) from None
    return Intake(image=rgb, notes=tuple(notes))


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def read_file(path: str | Path, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (a symbolic link to one is fine), of at most ``max_bytes``.

    A FIFO, a device (``/dev/zero``), a socket or a folder is refused before it is opened, and a file over
    ``max_bytes`` before it is read; the checks are repeated on the open file, so a file swapped in between
    is refused too. Raises :class:`ImageError` saying why.
    """
    try:
        st = os.stat(path)  # follows a symbolic link, opens nothing
    except OSError as exc:
        raise ImageError(f"Cannot read '{path}': {exc.strerror or exc}.") from None
    _check_regular(path, st, max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in cannot block
    except OSError as exc:
        raise ImageError(f"Cannot read '{path}': {exc.strerror or exc}.") from None
    with os.fdopen(fd, "rb") as fh:
        _check_regular(path, os.fstat(fh.fileno()), max_bytes)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ImageError(f"'{path}' is larger than {max_bytes / 2**20:.0f} MB, the limit of an image file.")
    return data


def _check_regular(path: str | Path, st: os.stat_result, max_bytes: int) -> None:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise ImageError(f"'{path}' is a folder: give an image file.")
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
        )
        raise ImageError(
            f"'{path}' is not a regular file ({kind}): vitviz reads image files only, and did not read it."
        )
    if st.st_size > max_bytes:
        raise ImageError(
            f"'{path}' is {st.st_size / 2**20:.0f} MB; the limit of an image file is {max_bytes / 2**20:.0f} MB."
        )


def _check_size(w: int, h: int) -> None:
    """The limits :func:`read_image` applies from a file's header, for pixels that arrive decoded."""
    if w < 1 or h < 1:
        raise ImageError(f"The image is {w} x {h}: it has no pixels.")
    max_pixels, max_side = _LIMITS["max_pixels"], _LIMITS["max_side"]
    if w * h > max_pixels:
        raise ImageError(
            f"The image is {w} x {h} = {w * h / 1e6:.1f} megapixels; vitviz accepts at most "
            f"{max_pixels / 1e6:.0f} megapixels. Downscale it and try again."
        )
    if max(w, h) > max_side:
        raise ImageError(
            f"The image is {w} x {h} pixels; vitviz accepts sides of at most {max_side:,} pixels. "
            "Crop or downscale it and try again."
        )


_CHANNELS = {1: "L", 3: "RGB", 4: "RGBA"}


def image_from_array(array: np.ndarray) -> Image.Image:
    """An RGB image from an array, or :class:`ImageError` saying why not.

    Shapes: ``(h, w)`` grey, ``(h, w, c)`` or ``(c, h, w)`` with ``c`` 1 (grey), 3 (RGB) or 4 (RGBA,
    flattened onto white); an array whose first and last axes both could be channels is read as
    ``(h, w, c)``. Values: integers (``uint8`` and any other integer type) must lie in 0..255 and are taken as
    they are; floats must be finite and lie in 0..1, and become ``round(255 * x)``; booleans are 0 or 255.
    The pixel limits of uploads (:func:`read_image`) apply. The caller's array is never changed.
    """
    a = np.asarray(array)
    if a.dtype.kind not in "biuf":
        raise ImageError(f"An image array holds numbers; this one holds {a.dtype} values.")
    if a.ndim == 3 and a.shape[-1] not in _CHANNELS and a.shape[0] in _CHANNELS:
        a = np.moveaxis(a, 0, -1)  # (c, h, w), as torch and torchvision keep images
    if a.ndim not in (2, 3):
        hint = " (a batch? pass one image, e.g. array[0])" if a.ndim == 4 else ""
        raise ImageError(
            f"An image array is (h, w), (h, w, c) or (c, h, w); this one is {a.ndim}-d, shape {a.shape}{hint}."
        )
    if a.ndim == 3 and a.shape[-1] not in _CHANNELS:
        raise ImageError(
            f"An image array has 1, 3 or 4 channels (grey, RGB, RGBA) on its first or last axis; shape {a.shape} has "
            "none of them."
        )
    _check_size(a.shape[1], a.shape[0])
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.dtype.kind == "b":
        a = a.astype(np.uint8) * 255
    elif a.dtype.kind == "f":
        if not np.isfinite(a).all():
            bad = int(np.isnan(a).sum())
            raise ImageError(
                f"The image array holds {bad:,} NaN and {int((~np.isfinite(a)).sum()) - bad:,} infinite values: "
                "give finite values in 0..1."
            )
        lo, hi = float(a.min()), float(a.max())
        if lo < 0 or hi > 1:
            raise ImageError(
                f"A float image array is read as 0..1; this one spans {lo:g}..{hi:g}. Divide it by 255 if it is "
                "0..255, or convert it to uint8."
            )
        a = np.rint(a.astype(np.float64) * 255).astype(np.uint8)
    elif a.dtype != np.uint8:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi > 255:
            raise ImageError(f"An integer image array is read as 0..255; this one spans {lo}..{hi}.")
        a = a.astype(np.uint8)
    mode = "L" if a.ndim == 2 else _CHANNELS[a.shape[-1]]
    return _to_rgb(Image.fromarray(np.ascontiguousarray(a), mode), [])


def load_image(path_or_image: str | Path | Image.Image | bytes | np.ndarray) -> Image.Image:
    """A path, encoded bytes, a PIL image or an array (:func:`image_from_array`) -> RGB image, by the rules of
    :func:`read_image` (the same pixel limits). Paths: regular files of at most :data:`MAX_BYTES`
    (:func:`read_file`); URLs are refused with a message (vitviz reads no network)."""
    if isinstance(path_or_image, Image.Image):
        _check_size(*path_or_image.size)
        return _to_rgb(path_or_image, [])
    if isinstance(path_or_image, np.ndarray):
        return image_from_array(path_or_image)
    if isinstance(path_or_image, (bytes, bytearray, memoryview)):
        return read_image(path_or_image).image
    if isinstance(path_or_image, str) and _URL.match(path_or_image.strip()):
        raise ImageError(
            f"'{path_or_image[:200]}' is a URL: vitviz reads local files only. Download it first, e.g. "
            "urllib.request.urlretrieve(url, 'photo.jpg'), and give the file."
        )
    if not isinstance(path_or_image, (str, os.PathLike)):
        raise ImageError(
            f"An image is a path, encoded bytes, a PIL image or an array; got {type(path_or_image).__name__}."
        )
    return read_image(read_file(path_or_image)).image
