"""Image intake: whatever bytes arrive become an RGB ``PIL.Image`` or an :class:`ImageError`.

Used by the app and the command line alike, so both refuse the same things with
the same words. Pixels are never decoded before the size check, so a
decompression bomb costs nothing.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from struct import error as struct_error

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vitviz.errors import ImageError

__all__ = ["MAX_PIXELS", "MAX_BYTES", "Intake", "read_image", "load_image"]

MAX_PIXELS = 40_000_000  # about a 7000 x 5700 photo; larger is refused before decoding
MAX_BYTES = 200 * 1024 * 1024
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
    data: bytes | bytearray | memoryview, *, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_BYTES
) -> Intake:
    """Decode uploaded bytes to RGB, or raise :class:`ImageError` saying why not.

    Handles EXIF orientation, every Pillow mode (1, L, LA, P, RGBA, CMYK, I;16, I, F),
    animated files (first frame), truncated and corrupt files, and images with more
    than ``max_pixels`` pixels (refused from the header, before decoding).
    """
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
            if getattr(img, "n_frames", 1) > 1:
                notes.append(f"animated image: using the first of its {img.n_frames} frames")
                img.seek(0)
            img.load()
            img = ImageOps.exif_transpose(img) or img
            rgb = _to_rgb(img, notes)
            rgb.load()
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
