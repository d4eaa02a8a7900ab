"""Views as functions of their state: a pane (``common.Current``) and frozen settings in, a drawn map out.

Streamlit wiring only: the numbers come from :mod:`vitviz` (``head_maps``, ``capture_rollout`` through the
cached ``common.get_rollout``, relevance through ``common.get_relevance``), the figures from
:mod:`vitviz.figures`. No ``draw_*`` function reads session state; ``key`` prefixes every key it draws (its
map is ``f"{key}_map"``), so one page can draw the same view twice with two states, as the Side by side page
does. Each view also has its computing half (``head_map``, ``rollout_map``, ``relevance_map``), which a page
calls when it needs the numbers before drawing (a colour scale shared by two panes).

A title starts lower case and gets a capital when drawn without ``title_prefix`` ("A. demo: " in a pane).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import streamlit as st

from pages import common
from vitviz import figures
from vitviz.analysis.blocks import head_maps, window_edges
from vitviz.record import POOLED
from vitviz.text import plotly_plain

__all__ = [
    "HeadSettings",
    "RelevanceSettings",
    "RolloutSettings",
    "ViewMap",
    "draw_head_map",
    "draw_relevance",
    "draw_rollout",
    "head_map",
    "relevance_map",
    "rollout_map",
    "rollout_row",
]


@dataclass(frozen=True, eq=False)
class ViewMap:
    """What a view draws: ``values`` (gh, gw) over the image, on stage ``stage``'s grid (a click lands there)."""

    values: np.ndarray
    title: str  # lower case first ("layer 3, head 0: where CLS looks")
    colorbar_title: str
    stage: int
    marked: tuple[int, int] | None = None  # the query's cell
    windows: tuple | None = None  # a windowed block's window edges (rows, cols), when asked for


@dataclass(frozen=True)
class HeadSettings:
    """One head's map (or the mean of a block's heads) for a query."""

    block: int
    query: int  # a token of the block's stage, or POOLED
    head: int | None = 0  # None: the mean of the block's heads
    looking: bool = True  # where the query looks (its row); False: who looks at it (its column)
    windows: bool = False  # outline a windowed block's windows


@dataclass(frozen=True)
class RolloutSettings:
    """Attention rollout through blocks ``start``..``end``."""

    start: int = 0
    end: int | None = None  # None: the last block
    query: int | None = None  # a token of block ``end``'s stage, POOLED, or None: what the model reads
    fusion: str = "mean"  # vitviz.analysis.maps.FUSIONS
    discard: float = 0.0  # smallest entries zeroed per block


@dataclass(frozen=True)
class RelevanceSettings:
    """Chefer et al.'s relevance for one class logit, or a zero-shot label's score (``prompt``)."""

    class_index: int
    label: str
    prompt: str | None = None  # zero-shot models: the label's prompt
    start_block: int = 0  # relevance through blocks k..L-1


def _titled(prefix: str, title: str) -> str:
    return prefix + title if prefix else title[:1].upper() + title[1:]


def _draw(cur: common.Current, m: ViewMap, *, key: str, title_prefix: str, config, clickable: bool, **figure_kw):
    """The map over the pane's image; a clickable one reruns the page with the clicked cell's customdata."""
    fig = figures.map_figure(
        cur.cap.image,
        m.values,
        title=_titled(title_prefix, m.title),
        colorbar_title=m.colorbar_title,
        marked=m.marked,
        windows=m.windows,
        click_hint="click to make it the query" if clickable else "",
        **figure_kw,
    )
    select = {"on_select": "rerun", "selection_mode": "points"} if clickable else {}
    common.chart(fig, key=f"{key}_map", config=dict(config or {}), **select)


def head_looks(cur: common.Current, s: HeadSettings) -> bool:
    """Whether the map is the query's row: always for the pooled query and for blocks without per-query keys."""
    kind = cur.cap.blocks[s.block].geometry.kind
    return s.looking or s.query == POOLED or kind in ("separable", "pool")


def head_what(cur: common.Current, s: HeadSettings) -> str:
    """ "where CLS looks" or "who looks at patch (3, 4)"."""
    who = cur.cap.token_label(s.query, cur.cap.blocks[s.block].stage)
    return f"where {who} looks" if head_looks(cur, s) else f"who looks at {who}"


def head_map(cur: common.Current, s: HeadSettings) -> ViewMap:
    """Block ``s.block``'s map for the query: head ``s.head``, or the mean of its heads (``head_maps``)."""
    cap = cur.cap
    block = cap.blocks[s.block]
    maps = head_maps(block, s.query, direction="query" if head_looks(cur, s) else "key")
    if s.head is None:
        values, which = maps.values.mean(axis=0, dtype=np.float32), f"mean of {block.num_heads} heads"
        colorbar = f"mean attention (raw, {cap.attention_precision})"
    else:
        values, which = maps.values[s.head], f"head {s.head}"
        colorbar = f"attention (raw, {cap.attention_precision})"
    marked = None
    centre = cap.token_centre(block.stage, s.query)
    if centre is not None:
        h_px, w_px = cap.input_size
        marked = (int(centre[1] * maps.grid[0] // h_px), int(centre[0] * maps.grid[1] // w_px))
    g = block.geometry
    windows = window_edges(g) if g.kind == "window" and s.windows else None
    title = f"{cap.block_label(s.block)}, {which}: {head_what(cur, s)}"
    return ViewMap(values, title, colorbar, block.stage, marked, windows)


def draw_head_map(
    cur: common.Current,
    s: HeadSettings,
    *,
    key: str,
    title_prefix: str = "",
    config: Mapping | None = None,
    **figure_kw,
) -> ViewMap:
    """Draw :func:`head_map` (chart ``f"{key}_map"``; a click's customdata picks a query at the map's stage).

    ``figure_kw``: options of ``vitviz.figures.map_figure`` (``zmin``, ``zmax``, ``height``, ...).
    """
    m = head_map(cur, s)
    _draw(cur, m, key=key, title_prefix=title_prefix, config=config, clickable=True, **figure_kw)
    return m


def rollout_row(cur: common.Current, s: RolloutSettings) -> tuple[np.ndarray, int]:
    """The whole rollout row (prefix tokens first) and the stage it lies on (``capture_rollout``), cached."""
    end = cur.cap.num_blocks - 1 if s.end is None else s.end
    return common.get_rollout(
        *cur.key, cur.cap, query=s.query, start=s.start, stop=end + 1, fusion=s.fusion, discard=s.discard
    )


def rollout_map(cur: common.Current, s: RolloutSettings) -> ViewMap:
    """The rollout row of ``s.query`` through blocks ``s.start``..``s.end`` on block ``s.start``'s stage grid.

    Raises ``ValueError`` (a model rollout is not defined for) or ``VitvizError``.
    """
    cap = cur.cap
    end = cap.num_blocks - 1 if s.end is None else s.end
    row, stage = rollout_row(cur, s)
    grid = cap.stages[stage]
    who = "what the model reads" if s.query is None else cap.token_label(s.query, cap.blocks[end].stage)
    precision = "float32 mean" if s.fusion == "mean" else cap.attention_precision
    title = f"rollout of {who}, {'blocks' if cap.is_hierarchical else 'layers'} {s.start}-{end}"
    return ViewMap(row[grid.num_prefix :].reshape(grid.grid), title, f"rollout (raw, {precision})", stage)


def draw_rollout(
    cur: common.Current,
    s: RolloutSettings,
    *,
    key: str,
    title_prefix: str = "",
    config: Mapping | None = None,
    **figure_kw,
) -> ViewMap:
    """Draw :func:`rollout_map` (chart ``f"{key}_map"``) and, for a hierarchical model, how its grid was reached."""
    m = rollout_map(cur, s)
    _draw(cur, m, key=key, title_prefix=title_prefix, config=config, clickable=True, **figure_kw)
    if cur.cap.is_hierarchical:
        st.caption(
            f"On stage {m.stage + 1}'s grid: windows undone, reduced keys spread over the tokens they came from, "
            "merged tokens averaged (ALGORITHMS.md). The row sums to 1."
        )
    return m


def relevance(cur: common.Current, s: RelevanceSettings):
    """The explanation itself (``vitviz.capture.gradients``): cached server-wide, computed in the queue."""
    with st.spinner("Computing gradients for the relevance map…"):
        return common.get_relevance(
            *cur.key, s.class_index, cur.image_bytes, prompt=s.prompt, label=s.label, start_block=s.start_block
        )


def relevance_map(cur: common.Current, s: RelevanceSettings) -> ViewMap:
    """Relevance over the first stage's patches for the class or label (``Explanation.patch_map``)."""
    exp = relevance(cur, s)
    return ViewMap(
        exp.patch_map(), f"relevance for '{plotly_plain(exp.label)}' (Chefer et al. 2021)", "relevance (raw)", 0
    )


def draw_relevance(
    cur: common.Current,
    s: RelevanceSettings,
    *,
    key: str,
    title_prefix: str = "",
    config: Mapping | None = None,
    **figure_kw,
) -> ViewMap:
    """Draw :func:`relevance_map` (chart ``f"{key}_map"``)."""
    m = relevance_map(cur, s)
    _draw(cur, m, key=key, title_prefix=title_prefix, config=config, clickable=False, **figure_kw)
    return m
