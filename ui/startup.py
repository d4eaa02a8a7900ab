"""What the app imports once, before sessions run side by side in the server's threads.

Plotly asks whether a value is a pandas ``Series``, a numpy array or a PIL image only when that
module is already in ``sys.modules`` (``get_module(..., should_load=False)``), without taking the
import lock. When one session's thread imported pandas (Streamlit does, for a table) while another
built a figure, Plotly met a half-imported pandas: "partially initialized module 'pandas' has no
attribute 'Series'", shown to the visitor as "Something went wrong (AttributeError)" (issue 33.5).
Importing them here, when the app's library is first imported, closes that window; the command line
never imports ``ui``, so ``vitviz --help`` does not pay for pandas.
"""

from __future__ import annotations

import importlib

__all__ = ["PRELOADED", "preload"]

PRELOADED = ("numpy", "pandas", "PIL.Image")  # what plotly's validators and JSON encoder look up without importing


def preload() -> None:
    """Import :data:`PRELOADED` (a no-op after the first call)."""
    for name in PRELOADED:
        importlib.import_module(name)
