"""When is a map flat, and how a flat map is drawn: one rule for every figure (docs/conventions.md).

A map is **flat** when its finite values spread over less than :data:`FLAT_RELATIVE` of their mean magnitude,
``(max - min) / |mean| < FLAT_RELATIVE``, or are all equal (all zero included). Stretching such a map from its
minimum to its maximum would invent contrast (a relevance map of 0.0017362 .. 0.0017387 drawn as a sharp peak).
A flat map is drawn on a fixed scale instead, :func:`flat_limits`: from ``min(0, min)`` to ``max(0, max)``
(``[0, 1]`` for an all-zero map), so it shows as one colour, and :func:`flat_note` says so in words.

Pure numpy: no Plotly, no Streamlit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FLAT_RELATIVE", "flat_limits", "flat_note", "is_flat"]

FLAT_RELATIVE = 1e-2  # (max - min) / |mean| below this: flat


def _finite(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v)]


def is_flat(values: np.ndarray) -> bool:
    """Whether the map's finite values are flat (module docstring); a map without finite values is not."""
    v = _finite(values)
    if v.size == 0:
        return False
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        return True
    mean = abs(float(v.mean()))
    return mean > 0 and (hi - lo) / mean < FLAT_RELATIVE


def flat_limits(values: np.ndarray) -> tuple[float, float] | None:
    """The fixed colour scale ``(zmin, zmax)`` of a flat map, None for a map that is not flat."""
    if not is_flat(values):
        return None
    v = _finite(values)
    lo, hi = min(0.0, float(v.min())), max(0.0, float(v.max()))
    return (lo, hi) if hi > lo else (0.0, 1.0)


def flat_note(values: np.ndarray, what: str = "This map") -> str:
    """A sentence for under a flat map ('' when it is not flat): its range and the fixed scale it is drawn on."""
    limits = flat_limits(values)
    if limits is None:
        return ""
    v = _finite(values)
    lo, hi = float(v.min()), float(v.max())
    if lo == hi == 0.0:
        return f"{what} is zero everywhere: it singles out no patch (drawn on the fixed scale [0, 1])."
    mean = abs(float(v.mean()))
    spread = "every value is equal" if hi == lo else f"relative range {(hi - lo) / mean:.1e}"
    return (
        f"{what} is flat: its values lie in {lo:.6g} .. {hi:.6g} ({spread}, below {FLAT_RELATIVE:g} of their mean), "
        f"so it is drawn on the fixed scale [{limits[0]:.4g}, {limits[1]:.4g}], not stretched: it singles out no "
        "patch."
    )
