"""Views as functions of their state: a pane (``common.Current``) and frozen settings in, a drawn view out.

Streamlit wiring only: the numbers come from :mod:`vitviz` (``head_maps``, ``row_map``, ``capture_rollout``
through the cached ``cached.get_rollout``, relevance of a ``Target`` through ``cached.get_target_relevance``),
the figures from :mod:`vitviz.figures`. No view reads session state; ``key`` prefixes every key it draws, so
one page can draw the same view twice with two states, as the Side by side page does:

* ``draw_head_map`` (one head, or the mean of a block's heads, for a query): chart ``f"{key}_map"``;
* ``draw_head_side`` (the query's attention to tokens off the image, and the files): chart ``f"{key}_prefix"``,
  downloads ``f"{key}-npz"``, ``f"{key}-csv"``;
* ``draw_head_grid`` (every head of a block for a query): chart ``f"{key}_grid"``;
* ``draw_deformable`` (a DAT deformable block's sampled keys): chart ``f"{key}_map"``, checkbox ``f"{key}_arrows"``;
* ``draw_knockout`` (the top classes before and after knocking heads out, and a block's heads after):
  charts ``f"{key}_predictions"``, ``f"{key}_heads"``;
* ``draw_blocks`` (every block of a stage, heads fused, for a query): chart ``f"{key}_{stage}"``;
* ``draw_masks`` (DINO's masks of every head of a block): chart ``f"{key}_grid"``;
* ``draw_summaries`` (a per-head summary of every block, and distance against depth): charts ``f"{key}_map"``,
  ``f"{key}_depth"``, downloads ``f"{key}-npz"``, ``f"{key}-csv"``;
* ``draw_rollout``, ``draw_relevance``, ``draw_feature`` (an SAE feature's activation): chart ``f"{key}_map"``;
* ``draw_lens`` (the logit lens): chart ``f"{key}_chart"``, downloads ``f"{key}-npz"``, ``f"{key}-csv"``.

The maps also have their computing half (``head_map``, ``rollout_map``, ``relevance_map``, ``feature_map``), which a page
calls when it needs the numbers before drawing (a colour scale shared by two panes). A title starts lower
case and gets a capital when drawn without ``title_prefix`` (a pane's is "A. demo: ").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import streamlit as st

from ui import cached, common, tiles
from vitviz import figures
from vitviz.analysis.blocks import HeadMaps, global_query, head_maps, row_map, select, summed_to, window_edges
from vitviz.analysis.masks import mass_masks
from vitviz.analysis.stats import SUMMARIES, summary_table
from vitviz.capture.targets import Target
from vitviz.errors import VitvizError
from vitviz.figures.animation import lens_rows
from vitviz.record import POOLED
from vitviz.tables import long_table
from vitviz.text import md_plain, plotly_plain

__all__ = [
    "BlocksSettings",
    "FeatureSettings",
    "HeadSettings",
    "KnockoutSettings",
    "LensSettings",
    "MasksSettings",
    "RelevanceSettings",
    "RolloutSettings",
    "SummarySettings",
    "ViewMap",
    "draw_blocks",
    "draw_deformable",
    "draw_feature",
    "feature_map",
    "draw_head_grid",
    "draw_head_map",
    "draw_head_side",
    "draw_knockout",
    "draw_lens",
    "draw_masks",
    "draw_relevance",
    "draw_rollout",
    "draw_summaries",
    "head_looks",
    "head_map",
    "head_what",
    "relevance",
    "relevance_map",
    "rollout_map",
    "rollout_row",
]


@dataclass(frozen=True, eq=False)
class ViewMap:
    """What a view draws: ``values`` (gh, gw) over the image, on stage ``stage``'s grid (a click lands there)."""

    values: np.ndarray
    title: str  # lower case first ("block 3, head 0: where CLS looks")
    colorbar_title: str
    stage: int
    marked: tuple[int, int] | None = None  # the query's cell
    windows: tuple | None = None  # a windowed block's window edges (``window_edges``), when asked for


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
    """Chefer et al.'s relevance for a target: a class logit or a zero-shot label's score (before softmax), or the
    difference of two (``Target.of_class(c, minus)``, ``Target.of_label(labels, k, minus)``)."""

    target: Target
    start_block: int = 0  # relevance through blocks k..L-1


@dataclass(frozen=True, eq=False)
class FeatureSettings:
    """An SAE feature's activation over the patches (:func:`vitviz.sae.run.features`, ``.map(feature)``)."""

    sae: object  # a vitviz.sae.SparseAutoencoder
    feature: int


@dataclass(frozen=True)
class BlocksSettings:
    """Where one query looks in every block of one stage, the heads of each block fused."""

    stage: int
    query: int  # a token of that stage, or POOLED
    fusion: str = "mean"  # vitviz.analysis.maps.FUSIONS


@dataclass(frozen=True)
class MasksSettings:
    """DINO's masks: per head, the smallest set of patches holding ``tau`` of the global query's attention."""

    tau: float = 0.6
    block: int = -1  # the last block by default


@dataclass(frozen=True)
class SummarySettings:
    """One per-head summary of every block (``vitviz.analysis.stats.SUMMARIES``), a (block, head) cell marked."""

    metric: str = "distance"
    marked: tuple[int, int] | None = None


@dataclass(frozen=True)
class KnockoutSettings:
    """Heads knocked out together, what replaces them, the class followed, and the maps shown after."""

    heads: tuple[tuple[int, int], ...]  # (block, head) pairs
    mode: str = "mean"  # "mean": the head's output averaged over the image's tokens; "zero"
    class_index: int | None = None  # None: the image's top-1
    after: HeadSettings | None = None  # the block and query whose heads are shown after the knock-out


@dataclass(frozen=True)
class LensSettings:
    """The logit lens: the probability of the final top ``top`` classes after each block, and the top-1's rank."""

    top: int = 5


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
    clicks = {"on_select": "rerun", "selection_mode": "points"} if clickable else {}
    common.chart(fig, key=f"{key}_map", config=dict(config or {}), **clicks)
    if "zmin" not in figure_kw and "zmax" not in figure_kw:  # the figure drew a flat map on its fixed scale
        note = figures.flat_note(m.values)
        if note:
            st.caption(note)


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
    windows = window_edges(g, maps.grid) if g.kind == "window" and s.windows else None  # a finer key grid: scaled
    title = f"{cap.block_label(s.block)}, {which}: {head_what(cur, s)}"
    return ViewMap(values, title, colorbar, block.stage, marked, windows)


def draw_head_grid(cur: common.Current, s: HeadSettings, *, key: str, **figure_kw) -> HeadMaps:
    """Every head of block ``s.block`` for the query, one tile each on one colour scale (chart ``f"{key}_grid"``;
    a click's customdata is ``[head]``). Returns the maps (``head_maps``); ``s.head`` does not apply.

    ``figure_kw``: options of ``vitviz.figures.small_multiples_figure``.
    """
    cap = cur.cap
    block = cap.blocks[s.block]
    maps = head_maps(block, s.query, direction="query" if head_looks(cur, s) else "key")
    fig = figures.small_multiples_figure(
        maps.values,
        [f"head {h}" for h in range(block.num_heads)],
        colorbar_title=f"attention (raw, {cap.attention_precision})",
        image=cap.image,
        click_hint="click to show it large",  # the page draws the clicked head large
        **{"cols": 6, **figure_kw},
    )
    common.chart(fig, key=f"{key}_grid", on_select="rerun", selection_mode="points")
    return maps


def draw_head_side(cur: common.Current, s: HeadSettings, *, key: str) -> None:
    """Beside the head map: the attention between the query and the tokens off the image (chart ``f"{key}_prefix"``)
    and the files of the head view (downloads ``f"{key}-npz"``, ``f"{key}-csv"``: every head's map)."""
    cap = cur.cap
    block = cap.blocks[s.block]
    g, head = block.geometry, s.head or 0
    maps = head_maps(block, s.query, direction="query" if head_looks(cur, s) else "key")
    if head_looks(cur, s):
        total = float(maps.values[head].sum(dtype=np.float64))
        names, values = list(g.prefix_kinds), maps.prefix[head]
        if maps.padding[head] > 0:
            names, values = [*names, "padding"], np.append(values, maps.padding[head])
        common.chart(figures.prefix_attention_figure(values, names, patch_total=total), key=f"{key}_prefix")
        st.caption(
            "Raw attention weights of this query: its row sums to 1 over all its keys, "
            "including tokens not on the image (prefix tokens, and padding in windowed blocks)."
        )
    else:
        title = f"Attention the prefix tokens pay to {cap.token_label(s.query, block.stage)} (raw)"
        fig = figures.prefix_attention_figure(maps.prefix[head], g.prefix_kinds, title=title)
        common.chart(fig, key=f"{key}_prefix")
    common.downloads(
        f"block{s.block}_head{head}_token{s.query}",
        key,
        csv=long_table(maps.values, ("head", "row", "col"), f"attention weight (raw, {cap.attention_precision})"),
        map=maps.values[head],
        all_heads=maps.values,
        attention=select(block, head=head),
    )


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


def draw_deformable(cur: common.Current, s: HeadSettings, *, key: str) -> None:
    """A DAT deformable block in its native form: head ``s.head``'s attention from the query over the points it
    sampled (chart ``f"{key}_map"``, checkbox ``f"{key}_arrows"``); nothing for a block that is not deformable."""
    from vitviz.capture.deformable import query_points
    from vitviz.figures.deformable import deformable_figure

    samples = cached.get_deformable(cur).get(s.block)
    if samples is None or s.head is None:
        return
    arrows = st.checkbox("Show the offsets (reference point -> sampled point)", key=f"{key}_arrows")
    qp = query_points(samples, s.head, s.query)
    title = (
        f"{cur.cap.block_label(s.block)}, head {s.head}: {head_what(cur, s)}, over its {len(qp.weights)} sampled keys"
    )
    common.chart(deformable_figure(cur.cap.image, qp, arrows=arrows, title=_titled("", title)), key=f"{key}_map")
    st.caption(
        "Deformable attention samples the block input at a reference grid moved by learned offsets; the map "
        "above spreads each sampled key's weight onto the 4 cells around it (bilinear, as sampled), dropping "
        "what fell outside the image. Relevance gets nothing from deformable blocks (their spread map is not on "
        "the gradient path)."
    )


def draw_knockout(cur: common.Current, s: KnockoutSettings, *, key: str):
    """The top classes before and after knocking ``s.heads`` out (chart ``f"{key}_predictions"``) and the heads
    of block ``s.after.block`` after it (chart ``f"{key}_heads"``); returns the ``Knockout`` or None (a message
    says why). One forward with the heads replaced, cached (``cached.get_knockout``)."""
    cap, ranked = cur.cap, common.classes(cur)
    if ranked is None or not s.heads:
        return None
    try:
        with st.spinner("Running the model with those heads knocked out…"):
            knocked, ko = cached.get_knockout(cur, s.heads, s.mode)
    except (VitvizError, ValueError) as exc:
        st.error(str(exc))
        return None
    known = {p.index: p.label for p in ranked.ranked}
    cls = s.class_index if s.class_index in known else ranked.ranked[0].index
    after = ranked.rerank(ko.logits, cur.model.id2label)
    what, score = ("label", "Image-text score") if ranked.labels else ("class", "Logit")  # zero-shot: labels, scores
    left, right = st.columns(2)
    with left:
        title = f"Top {'labels' if ranked.labels else 'classes'} before and after ({ranked.legend})"
        common.chart(figures.comparison_figure(ranked.ranked[:5], after, title=title), key=f"{key}_predictions")
        top = (
            f"The top {what} changes to '{md_plain(after[0].label)}'."
            if after[0].index != ranked.ranked[0].index
            else f"The top {what} stays."
        )
        st.caption(
            f"{score} of '{md_plain(known[cls])}': {ko.clean_logits[cls]:.3f} -> {ko.logits[cls]:.3f} "
            f"(effect {ko.effect[cls]:+.3f}). {top}"
        )
    with right:
        first = min(b for b, _ in s.heads)
        if s.after is not None and s.after.block > first:
            b = s.after
            direction = "query" if head_looks(cur, b) else "key"
            values = head_maps(knocked.blocks[b.block], b.query, direction=direction).values
            st.caption(f"{_titled('', cap.block_label(b.block))} after the knock-out: {head_what(cur, b)}.")
            tiles.draw_tiles(
                values,
                [f"{cap.block_label(b.block)}, head {h} after the knock-out" for h in range(len(values))],
                key=f"{key}_heads",
                colorbar_title="attention (raw)",
                image=cap.image,
                tile_image=True,
                cols=4,
            )
        elif first >= cap.num_blocks - 1:  # nothing after the last block: no attention downstream
            st.caption(
                f"{_titled('', cap.block_label(first))} is the model's last block: no block's attention comes after "
                "it, so the knock-out shows only in the prediction."
            )
        else:
            st.caption(
                f"Pick a block after {cap.block_label(first)} (on the Block slider, or in the instant view) to see how "
                "the knock-out changes the attention downstream; blocks up to the first knocked-out one are unchanged."
            )
    return ko


def draw_blocks(cur: common.Current, s: BlocksSettings, *, key: str) -> np.ndarray:
    """A heading and one tile per block of stage ``s.stage`` (chart ``f"{key}_{s.stage}"``); returns the tiles
    ``(B, gh, gw)``: each block's fused attention (``select``) read at the query's row (``row_map``)."""
    cap = cur.cap
    stage = cap.stages[s.stage]
    rows = [row_map(cap.blocks[b].geometry, select(cap.blocks[b], fusion=s.fusion), s.query) for b in stage.blocks]
    gathered = len({r.grid for r in rows}) > 1  # Hiera: a query-pooling block's keys are the finer tokens before it
    maps = np.stack([summed_to(r.values, stage.grid) if gathered else r.values for r in rows])
    where = (
        f"stage {stage.index} ({stage.grid[0]} x {stage.grid[1]} tokens, rows x columns): "
        if len(cap.stages) > 1
        else ""
    )
    st.subheader(f"{where}where {cap.token_label(s.query, stage.index)} looks, block by block ({s.fusion} of heads)")
    precision = "float32 mean" if s.fusion == "mean" else cap.attention_precision
    tiles.draw_tiles(
        maps,
        [cap.block_label(b) for b in stage.blocks],
        key=f"{key}_{s.stage}",
        colorbar_title=f"attention (raw, {precision})",
        image=cap.image,  # the large map over the image (a cell spans its share of the image on any grid)
    )
    if gathered:
        st.caption(
            "The stage's first block pools its queries and attends to the previous stage's tokens: its tile sums "
            "the weight on the tokens inside each token of this stage (the Heads page shows them one by one)."
        )
    return maps


def draw_masks(cur: common.Current, s: MasksSettings, *, key: str) -> np.ndarray:
    """One tile per head of block ``s.block`` (chart ``f"{key}_grid"``); returns the masks ``(H, gh, gw)`` of
    ``mass_masks`` on the block's map for its global query (CLS, else pooled), 1 kept and 0 dropped."""
    block = cur.cap.blocks[s.block]
    masks = mass_masks(head_maps(block, global_query(block)).values, tau=s.tau).astype(np.float32)
    tiles.draw_tiles(
        masks,
        [f"{cur.cap.block_label(block.index)}, head {h}" for h in range(block.num_heads)],
        key=f"{key}_grid",
        colorbar_title="kept (1) / dropped (0)",
        image=cur.cap.image,
        zmin=0,
        zmax=1,
    )
    return masks


def draw_summaries(cur: common.Current, s: SummarySettings, *, key: str) -> np.ndarray:
    """Block x head table of the summary (chart ``f"{key}_map"``; a click's customdata is ``[block, head]``), its
    files (download keys ``f"{key}-npz"``, ``f"{key}-csv"``: all three summaries) and the distance against depth
    (chart ``f"{key}_depth"``). Returns the table ``(L, H_max)``, NaN where a block has fewer heads."""
    cap = cur.cap
    table = {metric: summary_table(cap.blocks, metric) for metric in SUMMARIES}
    stages = [b.stage for b in cap.blocks] if len(cap.stages) > 1 else None
    left, right = st.columns(2)
    with left:
        fig = figures.layer_head_figure(
            table[s.metric],
            title=f"{SUMMARIES[s.metric]}<br>(click a cell to open that head)",
            colorbar_title=SUMMARIES[s.metric],
            marked=s.marked,
            row_labels=[cap.block_label(b) for b in range(cap.num_blocks)],
            stage_of_block=stages,
            value_name=SUMMARIES[s.metric],
        )
        common.chart(fig, key=f"{key}_map", on_select="rerun", selection_mode="points")
        st.caption("Computed from the float32 weights as each block ran; blank cells are heads a block does not have.")
        common.downloads(
            "summaries",
            key,
            csv={
                **long_table(table["distance"], ("block", "head"), SUMMARIES["distance"]),
                SUMMARIES["entropy"]: table["entropy"].reshape(-1),
                SUMMARIES["entropy_norm"]: table["entropy_norm"].reshape(-1),
            },
            mean_attention_distance=table["distance"],
            attention_entropy=table["entropy"],
            attention_entropy_normalised=table["entropy_norm"],
        )
    with right:
        fig = figures.distance_depth_figure(table["distance"], image_px=max(cap.input_size), stage_of_block=stages)
        common.chart(fig, key=f"{key}_depth")
    return table[s.metric]


def rollout_row(cur: common.Current, s: RolloutSettings) -> tuple[np.ndarray, int]:
    """The whole rollout row (prefix tokens first) and the stage it lies on (``capture_rollout``), cached."""
    end = cur.cap.num_blocks - 1 if s.end is None else s.end
    return cached.get_rollout(
        *cur.key, cur.cap, query=s.query, start=s.start, stop=end + 1, fusion=s.fusion, discard=s.discard
    )


def rollout_map(cur: common.Current, s: RolloutSettings) -> ViewMap:
    """The rollout row of ``s.query`` through blocks ``s.start``..``s.end`` on block ``s.start``'s stage grid.

    Raises ``ValueError`` where rollout is not defined for the model (``Capture.rollout_note``), or ``VitvizError``.
    """
    cap = cur.cap
    end = cap.num_blocks - 1 if s.end is None else s.end
    row, stage = rollout_row(cur, s)
    grid = cap.stages[stage]
    who = "what the model reads" if s.query is None else cap.token_label(s.query, cap.blocks[end].stage)
    precision = "float32 mean" if s.fusion == "mean" else cap.attention_precision
    title = f"rollout of {who}, blocks {s.start}-{end}"
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
            f"On stage {m.stage}'s grid: windows undone, reduced keys spread over the tokens they came from, "
            "merged tokens averaged. The row sums to 1. Definition: vitviz docs, Definitions > Rollout through stages."
        )
    return m


def relevance(cur: common.Current, s: RelevanceSettings):
    """The explanation itself (``vitviz.capture.gradients``, through ``cached.get_target_relevance``): cached
    server-wide, computed in the queue. Its ``label`` is the target's name (``Target.name``)."""
    with st.spinner("Computing gradients for the relevance map…"):
        return cached.get_target_relevance(cur, s.target, s.start_block)


def relevance_map(cur: common.Current, s: RelevanceSettings) -> ViewMap:
    """Relevance over the first stage's patches for the target (``Explanation.patch_map``)."""
    exp = relevance(cur, s)
    name = s.target.name(cur.model.id2label)
    return ViewMap(exp.patch_map(), f"relevance for {plotly_plain(name)} (Chefer et al. 2021)", "relevance (raw)", 0)


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


def draw_lens(cur: common.Current, s: LensSettings, *, key: str):
    """The logit lens of a classifier (chart ``f"{key}_chart"``, downloads ``f"{key}-npz"``, ``f"{key}-csv"``),
    or why there is none; returns the ``Lens`` (``vitviz.causal.logit_lens``) or None."""
    cap = cur.cap
    ranked = common.classes(cur)
    notes = cached.get_causal_notes(cap.model_name)
    partial = (  # hierarchical with a readout head: the last stage's rows only
        cur.model.family.hierarchical
        and cur.model.has_classifier
        and cur.model.family.readout_head(cur.model.model) is not None
    )
    if notes["lens"] and not partial:
        st.info(notes["lens"])
        return None
    if ranked is None or ranked.labels is not None:
        st.info("The logit lens reads class logits through the model's own head: it needs a classifier.")
        return None
    try:
        with st.spinner("Reading the residual stream through the model's head…"):
            lens = cached.get_lens(cur)
    except VitvizError as exc:
        st.error(str(exc))
        return None
    top = np.argsort(-lens.logits[-1])[: s.top]
    probs = lens.probabilities()[:, top]
    names = [cur.model.id2label.get(int(c), f"class {c}") for c in top]
    rows, ticks = lens_rows(cap)
    fig = figures.lens_figure(
        probs, names, lens.ranks(int(top[0])), target=names[0], row_labels=rows, tick_labels=ticks
    )
    common.chart(fig, key=f"{key}_chart")
    shown = [rows[r] for r in np.flatnonzero(lens.defined)]
    where = (
        ""
        if len(shown) == len(lens.defined)
        else f" Points drawn: {', '.join(shown)}; the other rows are not defined here."
    )
    st.caption(
        f"Each point: the residual stream after that block, through the model's final norm and head "
        f"({lens.readout}); the last is the model's own prediction." + where + (f" {lens.note}" if lens.note else "")
    )
    common.downloads(
        "logit_lens",
        key,
        csv={
            "residual stream": np.asarray(rows),
            **{f"probability of '{n}'": probs[:, k] for k, n in enumerate(names)},
            f"rank of '{names[0]}' (1 = top)": lens.ranks(int(top[0])),
        },
        logit_lens=lens.logits,
    )
    return lens


def feature_map(cur: common.Current, s: FeatureSettings) -> ViewMap:
    """The feature's activation on each patch of the pane's image at the SAE's point (the image's Run, no forward of
    its own). Raises :class:`vitviz.sae.model.SAEError` where the pane's model lacks the SAE's point or width."""
    from ui.feature_views import features_of

    feats = features_of(cur, s.sae)
    return ViewMap(feats.map(int(s.feature)), f"feature {int(s.feature)} at {feats.point}", "activation", 0)


def draw_feature(
    cur: common.Current,
    s: FeatureSettings,
    *,
    key: str,
    title_prefix: str = "",
    config: Mapping | None = None,
    **figure_kw,
) -> ViewMap:
    """Draw :func:`feature_map` (chart ``f"{key}_map"``; a click lands on the pane's grid)."""
    m = feature_map(cur, s)
    _draw(cur, m, key=key, title_prefix=title_prefix, config=config, clickable=True, **figure_kw)
    return m
