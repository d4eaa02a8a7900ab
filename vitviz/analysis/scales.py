"""Colour scales for a panel of maps from different methods: per map, shared across the panel, or [0, max].

Pure numpy. Each scaling returns values for one colour bar on ``[zmin, zmax]`` and each map's own
range, so a page can print what the colours stand for.

* ``"fixed [0, max]"`` (the default): each map divided by its own maximum, shown on [0, 1];
  a flat map stays flat (one colour), negative values fall below the bar's bottom. It invents no
  contrast: only a map's ratio to its peak shows.
* ``"per map"``: each map stretched from its minimum to its maximum; the smallest differences of
  a nearly flat map fill the whole scale (contrast invented), a constant map is all 0.
* ``"shared"``: one minimum and maximum over the whole panel; maps of small magnitude look dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["SCALES", "Scaled", "scale_maps"]

Scale = Literal["fixed [0, max]", "per map", "shared"]
SCALES: tuple[Scale, ...] = ("fixed [0, max]", "per map", "shared")


@dataclass(frozen=True)
class Scaled:
    values: np.ndarray  # (K, gh, gw) float32, for one colour bar on [zmin, zmax]
    zmin: float
    zmax: float
    ranges: np.ndarray  # (K, 2) float64: each map's own (min, max) before scaling
    colorbar_title: str


def scale_maps(maps: np.ndarray, how: Scale = "fixed [0, max]") -> Scaled:
    """``maps`` ``(K, gh, gw)`` scaled by ``how`` (see the module docstring); the input is not changed."""
    m = np.asarray(maps, dtype=np.float64)
    if m.ndim != 3:
        raise ValueError(f"maps must be (K, gh, gw), got shape {m.shape}")
    lo = m.reshape(len(m), -1).min(axis=1)
    hi = m.reshape(len(m), -1).max(axis=1)
    ranges = np.stack([lo, hi], axis=1)
    if how == "fixed [0, max]":
        peak = np.where(hi > 0, hi, 1.0)
        out, zmin, zmax, title = m / peak[:, None, None], 0.0, 1.0, "value / the map's max (0 = zero)"
    elif how == "per map":
        span = np.where(hi > lo, hi - lo, 1.0)
        out = (m - lo[:, None, None]) / span[:, None, None]
        zmin, zmax, title = 0.0, 1.0, "each map from its min (0) to its max (1)"
    elif how == "shared":
        out, zmin, zmax = m, float(lo.min()), float(hi.max())
        title = "raw value, one scale for the panel"
    else:
        raise ValueError(f"unknown scale {how!r}; choose one of {SCALES}")
    return Scaled(out.astype(np.float32), zmin, zmax, ranges, title)
