"""Plotly figure builders (``views``) and raster overlays for export (``overlay``)."""

from vitviz.figures.views import *  # noqa: F403
from vitviz.figures.views import SIMILARITY_SCALE, __all__  # noqa: F401
