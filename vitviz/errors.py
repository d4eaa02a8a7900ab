"""vitviz's own exceptions: each message says what went wrong and what to do next."""

from __future__ import annotations

__all__ = [
    "VitvizError",
    "ModelLoadError",
    "UnsupportedModelError",
    "ImageError",
    "CaptureError",
    "BudgetError",
]


class VitvizError(Exception):
    """Base class: anything a user did wrong or a model cannot do, with a readable message."""


class ModelLoadError(VitvizError):
    """A model could not be found, fetched or loaded."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint loads, but its family has no adapter (e.g. ResNet, Swin)."""


class ImageError(VitvizError):
    """Uploaded bytes are not an image vitviz can read."""


class CaptureError(VitvizError):
    """The forward pass produced nothing to show (e.g. no attention weights)."""


class BudgetError(VitvizError):
    """The capture would need more memory than the configured budget."""
