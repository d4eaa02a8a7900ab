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
                    f"most {self.total / 2**20:,.0f} MB of images at once. Downscale it and upload again."
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
    """Decode uploaded bytes to RGB, or raise :class:`ImageError` saying why not.

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
        raise ImageError("The file is empty. Upload a PNG, JPEG, WebP, BMP, GIF or TIFF image.")
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
                f"{max_pixels / 1e6:.0f} megapixels. Downscale it and upload again."
            )
        if max(w, h) > max_side:
            raise ImageError(
                f"The image is {w} x {h} pixels; vitviz accepts sides of at most {max_side:,} pixels. "
                "Crop or downscale it and upload again."
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
                "This file is not an image vitviz can read. Upload a PNG, JPEG, WebP, BMP, GIF or TIFF image."
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
            "The image file is damaged or truncated and cannot be decoded. Re-export it and upload again."
        ) from None
    return Intake(image=rgb, notes=tuple(notes))


def load_image(path_or_image: str | Path | Image.Image | bytes) -> Image.Image:
    """Convenience: a path, bytes or PIL image -> RGB image (same rules as :func:`read_image`)."""
    if isinstance(path_or_image, Image.Image):
        return _to_rgb(path_or_image, [])
    if isinstance(path_or_image, (bytes, bytearray, memoryview)):
        return read_image(path_or_image).image
    path = Path(path_or_image)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(f"Cannot read '{path}': {exc.strerror or exc}.") from None
    return read_image(data).image
