"""Maps over the photo at the photo's own resolution: raster overlays (Pillow, numpy) and their Plotly figure.

Maps are computed on a token grid ``(gh, gw)``; here, and only here, they are upsampled
(``docs/definitions.md#display-conventions``). A grid spans the whole photo (the model
sees the whole photo, resized, never cropped), so cell ``(r, c)`` covers rows
``[r H / gh, (r + 1) H / gh)`` and columns ``[c W / gw, (c + 1) W / gw)`` of an
``H x W`` photo, whatever its size.

* **Upsampling** (:func:`upsample`): ``nearest`` gives pixel ``(y, x)`` the value of the
  cell its centre ``(y + 0.5, x + 0.5)`` falls in, so each cell stays a visible block;
  ``bilinear`` interpolates between cell centres, half-pixel aligned (source position
  ``(y + 0.5) gh / H - 0.5``, clamped to the grid's edge cells), which is
  ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)``.
* **Colour limits** (:func:`colour_limits`): each map on its own ``[min, max]``
  (``per_map``) or every map of a set (the heads of a block, the blocks of a model)
  on the set's common ``[min, max]`` (``shared``), so that maps can be compared.
  A value ``v`` is drawn at ``(v - lo) / (hi - lo)`` of the Inferno scale, clipped to
  [0, 1]; a flat map (``hi == lo``) is drawn at the scale's bottom.
* **Blend** (:func:`photo_overlay`): ``out = (1 - a) photo + a colour``, with
  ``a = opacity`` where the normalised value is at least ``threshold``, else 0 (the
  photo shows through below the threshold), rounded to uint8.
* **Export size** (:func:`export_size`): the photo's own size, scaled down to at most
  :data:`MAX_EXPORT_SIDE` pixels on its long side.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Literal

import numpy as np
import plotly.graph_objects as go
from PIL import Image

__all__ = [
    "COLORSCALE",
    "MAX_EXPORT_SIDE",
    "Scale",
    "Upsampling",
    "colorize",
    "upsample",
    "colour_limits",
    "export_size",
    "fit_photo",
    "photo_overlay",
    "overlay",
    "png_bytes",
    "photo_overlay_figure",
    "image_config",
]

Upsampling = Literal["nearest", "bilinear"]
Scale = Literal["per_map", "shared"]
MAX_EXPORT_SIDE = 2048

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
    """Values in [0, 1] ``(h, w)`` -> RGB uint8 ``(h, w, 3)`` on the Inferno scale (linear between its 10 stops)."""
    v = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64)), 0.0, 1.0) * (len(COLORSCALE) - 1)
    lo = np.floor(v).astype(int)
    hi = np.minimum(lo + 1, len(COLORSCALE) - 1)
    t = (v - lo)[..., None]
    return np.round(_LUT_KEYS[lo] * (1 - t) + _LUT_KEYS[hi] * t).astype(np.uint8)


def _weights(n_in: int, n_out: int, mode: Upsampling) -> np.ndarray:
    """``(n_out, n_in)`` float64 matrix taking a row of cells to a row of pixels (module docstring)."""
    centres = (np.arange(n_out) + 0.5) * n_in / n_out  # pixel centres in cell units
    w = np.zeros((n_out, n_in), dtype=np.float64)
    if mode == "nearest":
        w[np.arange(n_out), np.minimum(np.floor(centres).astype(int), n_in - 1)] = 1.0
        return w
    if mode != "bilinear":
        raise ValueError(f"upsampling must be 'nearest' or 'bilinear', got {mode!r}")
    src = np.clip(centres - 0.5, 0.0, n_in - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    t = src - lo
    np.add.at(w, (np.arange(n_out), lo), 1.0 - t)
    np.add.at(w, (np.arange(n_out), hi), t)
    return w


def upsample(grid_map: np.ndarray, size: tuple[int, int], *, mode: Upsampling = "nearest") -> np.ndarray:
    """``(gh, gw) -> (h, w)`` float32, ``size = (h, w)``: nearest or bilinear (module docstring).

    Separable: ``W_rows @ map @ W_cols.T``, two small matrices, so a 2048 px photo costs
    a few milliseconds.
    """
    m = np.asarray(grid_map, dtype=np.float64)
    if m.ndim != 2 or min(m.shape) < 1:
        raise ValueError(f"a map must be 2-D (gh, gw), got shape {m.shape}")
    h, w = size
    return (_weights(m.shape[0], h, mode) @ m @ _weights(m.shape[1], w, mode).T).astype(np.float32)


def colour_limits(maps: Sequence[np.ndarray], *, scale: Scale = "per_map") -> list[tuple[float, float]]:
    """``(lo, hi)`` per map: its own min and max (``per_map``) or the min and max over all ``maps`` (``shared``).

    ``maps``: K arrays (any shapes: maps on different grids can share a scale). Non-finite
    values are ignored; a map without finite values gets ``(0, 0)``.
    """

    def finite_range(m: np.ndarray) -> tuple[float, float]:
        v = np.asarray(m, dtype=np.float64)
        v = v[np.isfinite(v)]
        return (float(v.min()), float(v.max())) if v.size else (0.0, 0.0)

    if scale not in ("per_map", "shared"):
        raise ValueError(f"scale must be 'per_map' or 'shared', got {scale!r}")
    own = [finite_range(m) for m in maps]
    if scale == "per_map" or not own:
        return own
    lo, hi = min(r[0] for r in own), max(r[1] for r in own)
    return [(lo, hi)] * len(own)


def export_size(wh: tuple[int, int], max_side: int = MAX_EXPORT_SIDE) -> tuple[int, int]:
    """``(w, h)`` of an export: the photo's own size, scaled down (aspect kept) to at most ``max_side`` on its long side."""
    w, h = int(wh[0]), int(wh[1])
    if w < 1 or h < 1:
        raise ValueError(f"an image needs a positive size, got {w} x {h}")
    long = max(w, h)
    if long <= max_side:
        return w, h
    return max(1, round(w * max_side / long)), max(1, round(h * max_side / long))


def fit_photo(photo: Image.Image, max_side: int = MAX_EXPORT_SIDE) -> np.ndarray:
    """The photo as RGB uint8 ``(h, w, 3)`` at :func:`export_size` (Lanczos where it is scaled down)."""
    rgb = photo.convert("RGB")
    wh = export_size(rgb.size, max_side)
    if wh != rgb.size:
        rgb = rgb.resize(wh, Image.Resampling.LANCZOS)
    return np.asarray(rgb)


def photo_overlay(
    photo: np.ndarray,
    grid_map: np.ndarray,
    *,
    limits: tuple[float, float] | None = None,
    mode: Upsampling = "bilinear",
    opacity: float = 0.6,
    threshold: float = 0.0,
) -> np.ndarray:
    """A ``(gh, gw)`` map over an RGB uint8 photo ``(h, w, 3)`` at the photo's size -> ``(h, w, 3)`` uint8.

    ``limits``: the values drawn at the bottom and top of the colour scale (default the
    map's own min and max, see :func:`colour_limits`); ``threshold`` in [0, 1]: cells whose
    normalised value is below it are not coloured; ``opacity`` in [0, 1]: of the colour.
    The caller's arrays are not changed.
    """
    img = np.asarray(photo)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"the photo must be RGB (h, w, 3), got shape {img.shape}")
    if not 0.0 <= opacity <= 1.0 or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"opacity and threshold must be in [0, 1], got {opacity} and {threshold}")
    lo, hi = colour_limits([grid_map])[0] if limits is None else limits
    up = upsample(grid_map, img.shape[:2], mode=mode).astype(np.float64)
    v = np.clip((up - lo) / (hi - lo), 0.0, 1.0) if hi > lo else np.zeros_like(up)
    alpha = np.where(v >= threshold, opacity, 0.0)[..., None]
    out = (1.0 - alpha) * img.astype(np.float64) + alpha * colorize(v).astype(np.float64)
    return np.round(out).astype(np.uint8)


def overlay(
    image: np.ndarray, grid_map: np.ndarray, *, alpha: float = 0.6, mode: Upsampling = "bilinear"
) -> Image.Image:
    """Blend a map (on its own min..max) over an RGB uint8 image ``(h, w, 3)``: :func:`photo_overlay` as a PIL image."""
    return Image.fromarray(photo_overlay(image, grid_map, mode=mode, opacity=alpha), "RGB")


def png_bytes(rgb: np.ndarray | Image.Image) -> bytes:
    """An RGB uint8 ``(h, w, 3)`` array (or a PIL image) as PNG file bytes."""
    img = rgb if isinstance(rgb, Image.Image) else Image.fromarray(np.asarray(rgb, dtype=np.uint8), "RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def image_config(wh: tuple[int, int], *, filename: str = "vitviz", fmt: Literal["png", "svg"] = "png") -> dict:
    """Plotly's config for a figure whose client-side download (camera button) is ``wh`` = (w, h) pixels."""
    w, h = export_size(wh)
    return {"toImageButtonOptions": {"format": fmt, "filename": filename, "width": w, "height": h, "scale": 1}}


def photo_overlay_figure(
    composite: np.ndarray,
    *,
    limits: tuple[float, float],
    colorbar_title: str,
    title: str = "",
    display_side: int = 1024,
    height: int = 560,
) -> go.Figure:
    """A composite from :func:`photo_overlay` ``(h, w, 3)`` with the colour bar of its ``limits`` (lo, hi).

    The picture is sent at most ``display_side`` pixels on its long side (a JPEG data
    URI), spanning ``w x h`` axis units so that coordinates stay the photo's pixels;
    the full-size PNG is :func:`png_bytes` of the composite. The colour bar is drawn by
    an invisible one-point marker trace on the Inferno scale from ``lo`` to ``hi``.
    """
    h, w = composite.shape[:2]
    img = Image.fromarray(np.asarray(composite, dtype=np.uint8), "RGB")
    img.thumbnail((display_side, display_side))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    uri = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    lo, hi = limits
    scale = [[i / (len(COLORSCALE) - 1), c] for i, c in enumerate(COLORSCALE)]
    fig = go.Figure(
        [
            go.Image(
                source=uri,
                x0=w / img.width / 2,
                y0=h / img.height / 2,
                dx=w / img.width,
                dy=h / img.height,
                hoverinfo="skip",
            ),
            go.Scatter(
                x=[0],
                y=[0],
                mode="markers",
                marker=dict(
                    size=0,
                    opacity=0,
                    color=[lo],
                    cmin=lo,
                    cmax=hi if hi > lo else lo + 1e-12,
                    colorscale=scale,
                    showscale=True,
                    colorbar=dict(title=dict(text=colorbar_title, side="right"), thickness=12),
                ),
                hoverinfo="skip",
                showlegend=False,
            ),
        ]
    )
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=40, b=10), height=height)
    fig.update_xaxes(visible=False, range=[0, w], constrain="domain")
    fig.update_yaxes(visible=False, range=[h, 0], scaleanchor="x")
    return fig
