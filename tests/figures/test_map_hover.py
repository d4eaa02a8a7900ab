"""A map's hover text promises a click only where the page makes the click do it (issue 22 item 3)."""

import numpy as np

from vitviz import figures


def _hover(fig) -> str:
    return next(t.hovertemplate for t in fig.data if t.type == "scatter")


def test_map_hover_promises_nothing_unless_asked():
    grid = np.arange(6, dtype=np.float32).reshape(2, 3)
    plain = figures.map_figure(None, grid, title="t", colorbar_title="c")
    assert "click" not in _hover(plain)
    hinted = figures.map_figure(None, grid, title="t", colorbar_title="c", click_hint="click to make it the query")
    assert _hover(hinted).endswith("<br>click to make it the query<extra></extra>")
