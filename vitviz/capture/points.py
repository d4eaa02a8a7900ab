"""The named hook points, for the analyses: see :mod:`vitviz.models.points` (installed at load, so it lives there)."""

from vitviz.models.points import (  # noqa: F401
    _ACTIVE,
    Edit,
    EditOp,
    Point,
    Points,
    PointState,
    active,
    block_name,
    install_points,
    installed_points,
)

__all__ = [
    "Edit",
    "EditOp",
    "Point",
    "Points",
    "PointState",
    "install_points",
    "installed_points",
    "block_name",
    "active",
]
