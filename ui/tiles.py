"""Tiles that say "click to show it large", and do: a clicked tile is drawn large under the tiles.

Streamlit wiring only (``vitviz.figures.small_multiples_figure`` and ``map_figure`` draw). The tiles are a
clickable chart (``ui.click_chart``); the tile shown large is the chart's own last click, so it lives while
the tiles are drawn and goes with them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import streamlit as st

from ui import common
from vitviz import figures

__all__ = ["HINT", "draw_tiles"]

HINT = "click to show it large"


def draw_tiles(
    maps: np.ndarray,
    titles: Sequence[str],
    *,
    key: str,
    colorbar_title: str,
    image: np.ndarray | None = None,
    tile_image: bool = False,
    zmin: float | None = None,
    zmax: float | None = None,
    colorscale=figures.ATTENTION_SCALE,
    title: str = "",
    cols: int = 6,
    large_height: int = 440,
    **tile_kw,
) -> int | None:
    """``(K, gh, gw)`` maps as tiles on one colour scale (chart ``key``) and the clicked one large under them
    (chart ``f"{key}_large"``), on the same scale and over ``image`` when given (the tiles too with ``tile_image``:
    each tile then carries a thumbnail of it). Returns the tile shown large.

    ``tile_kw``: more options of ``figures.small_multiples_figure`` (``tile_px``, ``opacity``).
    """
    maps = np.asarray(maps)
    if zmin is None and zmax is None:  # a flat set on its fixed scale (vitviz.figures.flat)
        zmin, zmax = figures.flat_limits(maps) or (None, None)
    lo = float(np.nanmin(maps)) if zmin is None else float(zmin)
    hi = float(np.nanmax(maps)) if zmax is None else float(zmax)
    fig = figures.small_multiples_figure(
        maps,
        list(titles),
        colorbar_title=colorbar_title,
        cols=cols,
        zmin=lo,
        zmax=hi,
        colorscale=colorscale,
        image=image if tile_image else None,
        click_hint=HINT,
        **tile_kw,
    )
    if title:
        fig.update_layout(title=title, margin=dict(l=10, r=10, t=60, b=10), height=fig.layout.height + 30)
    common.chart(fig, key=key, on_select="rerun", selection_mode="points")
    data = common.clicked_point(st.session_state.get(key))
    if data is None or not 0 <= int(data[0]) < len(maps):
        st.caption("Click a tile to show it large.")
        return None
    i = int(data[0])
    side = max(maps.shape[1:])
    common.chart(
        figures.map_figure(
            image,
            maps[i],
            title=f"{titles[i]}, large",
            colorbar_title=colorbar_title,
            patch_size=None if image is not None else max(1, 320 // side),
            zmin=lo,
            zmax=hi,
            colorscale=colorscale,
            height=large_height,
        ),
        key=f"{key}_large",
    )
    st.caption("Shown large: the tile clicked last, on the tiles' colour scale; click another tile to change it.")
    return i
