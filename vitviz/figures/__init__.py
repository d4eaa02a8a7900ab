"""Plotly figure builders (``views``), raster overlays for export (``overlay``), coloured prompt words (``words``)."""

from vitviz.figures.views import *  # noqa: F403
from vitviz.figures.views import SIMILARITY_SCALE, __all__  # noqa: F401
from vitviz.figures.words import token_relevance_html  # noqa: F401
