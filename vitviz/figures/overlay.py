"""Raster overlays of grid maps on the image (for PNG export; the app draws with Plotly)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from PIL import Image

__all__ = ["COLORSCALE", "colorize", "upsample", "overlay"]

# Inferno, the colour scale the app's figures use too (plotly.colors.sequential.Inferno).
COLORSCALE = (
    "#000004",
    "#1b0c41",
    "#4a0c6b",
    "#781c6d",
    "#a52c60",
    "#cf4446",
    "#ed6925",
    "#fb9b06",
    "#f7d13d",
    "#fcffa4",
)
_LUT_KEYS = np.array([[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in COLORSCALE], dtype=np.float64)


def colorize(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] ``(h, w)`` -> RGB uint8 ``(h, w, 3)`` on the Inferno scale."""
    v = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64)), 0.0, 1.0) * (len(COLORSCALE) - 1)
    lo = np.floor(v).astype(int)
    hi = np.minimum(lo + 1, len(COLORSCALE) - 1)
    t = (v - lo)[..., None]
    return np.round(_LUT_KEYS[lo] * (1 - t) + _LUT_KEYS[hi] * t).astype(np.uint8)


def upsample(
    grid_map: np.ndarray, size: tuple[int, int], *, mode: Literal["nearest", "bilinear"] = "nearest"
) -> np.ndarray:
    """``(gh, gw) -> (h, w)`` float32; nearest keeps each patch a visible square."""
    h, w = size
    img = Image.fromarray(np.asarray(grid_map, dtype=np.float32), mode="F")
    resample = Image.Resampling.NEAREST if mode == "nearest" else Image.Resampling.BILINEAR
    return np.asarray(img.resize((w, h), resample), dtype=np.float32)


def overlay(
    image: np.ndarray, grid_map: np.ndarray, *, alpha: float = 0.6, mode: Literal["nearest", "bilinear"] = "bilinear"
) -> Image.Image:
    """Blend a map (normalised to its max) over an RGB uint8 image ``(h, w, 3)``."""
    m = np.asarray(grid_map, dtype=np.float64)
    lo, hi = float(m.min()), float(m.max())
    m = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
    heat = colorize(upsample(m, image.shape[:2], mode=mode)).astype(np.float64)
    out = (1 - alpha) * image.astype(np.float64) + alpha * heat
    return Image.fromarray(np.round(out).astype(np.uint8), "RGB")
