"""Plotly figure builders (``views``), raster overlays for export (``overlay``), coloured prompt words (``words``),
the rule for flat maps (``flat``)."""

from vitviz.figures.flat import FLAT_RELATIVE, flat_limits, flat_note, is_flat  # noqa: F401
from vitviz.figures.views import *  # noqa: F403
from vitviz.figures.views import SIMILARITY_SCALE, __all__  # noqa: F401
from vitviz.figures.words import token_relevance_html  # noqa: F401
