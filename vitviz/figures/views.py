"""Plotly figure builders: arrays in, ``go.Figure`` out; no I/O, no Streamlit.

Conventions: attention uses the Inferno scale, similarities a diverging scale on
[-1, 1], norms Viridis. Every colour bar title says whether values are raw or
normalised. Maps live on the patch grid and are drawn over the image in pixel
coordinates (nearest upsampling: one square per patch). Overlay figures carry an
invisible scatter of patch centres whose ``customdata`` is ``[token, row, col]``,
so a click selects a patch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from vitviz.figures.flat import flat_limits
from vitviz.record import Prediction
from vitviz.text import plotly_plain

__all__ = [
    "ATTENTION_SCALE",
    "fit_text",
    "rgb_scale",
    "image_figure",
    "map_figure",
    "small_multiples_figure",
    "tile_gap",
    "token_sequence_figure",
    "predictions_figure",
    "prefix_attention_figure",
    "layer_head_figure",
    "distance_depth_figure",
    "position_similarity_figure",
    "patch_components_figure",
    "token_norms_figure",
    "comparison_figure",
    "lens_figure",
    "curves_figure",
    "areas_figure",
]

ATTENTION_SCALE = "Inferno"
SIMILARITY_SCALE = "RdBu_r"
NORM_SCALE = "Viridis"
KIND_COLOURS = {"CLS": "#d62728", "DIST": "#9467bd", "REG": "#2ca02c", "patch": "#1f77b4"}
_MARGIN = dict(l=10, r=10, t=40, b=10)


def rgb_scale(scale: str | Sequence) -> list[list]:
    """A Plotly colour scale (a name or ``[[position, colour], ...]``) with every colour as ``rgb(r, g, b)``.

    Streamlit's chart element rewrites the colours ``#000001``..``#000010`` anywhere in a figure (its
    placeholders for theme colours), and Inferno starts at ``#000004``: its bottom rendered pink. Written
    as ``rgb(0, 0, 4)`` the colour survives.
    """
    from plotly.colors import get_colorscale, hex_to_rgb

    pairs = get_colorscale(scale) if isinstance(scale, str) else scale
    out = []
    for pos, colour in pairs:
        if isinstance(colour, str) and colour.startswith("#"):
            colour = "rgb({}, {}, {})".format(*hex_to_rgb(colour))
        out.append([float(pos), colour])
    return out


def fit_text(fig: go.Figure, *, title_chars: int = 80) -> go.Figure:
    """Room for every text of ``fig`` (changed in place, and returned): each axis grows the margin to hold its tick
    labels and title (``automargin``), so neither is cut at the figure's edge nor drawn over the other; a title
    longer than ``title_chars`` wraps at word boundaries, the top margin and the height growing by a line each.

    The figures here keep margins of 10 px (maps fill their column); at 1366 x 768 a half-width column is about
    450 px wide, where a bar chart's class names and a block x head table's block names did not fit.
    """
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    title, extra = _wrapped(fig.layout.title.text, title_chars)
    if extra:
        top = fig.layout.margin.t if fig.layout.margin.t is not None else 40
        fig.update_layout(title_text=title, margin_t=top + extra)
        if fig.layout.height is not None:
            fig.update_layout(height=fig.layout.height + extra)
    return fig


def _kind_colour(kind: str) -> str:
    return KIND_COLOURS["REG"] if kind.startswith("REG") else KIND_COLOURS.get(kind, KIND_COLOURS["patch"])


def _image_axes(fig: go.Figure, h: int, w: int, **where) -> None:
    fig.update_xaxes(visible=False, range=[0, w], constrain="domain", **where)
    fig.update_yaxes(visible=False, range=[h, 0], scaleanchor=(where.get("col") and f"x{where['col']}") or "x", **where)


def _patch_targets(
    grid: tuple[int, int], cell: float | tuple[float, float], prefix: int, hover: str, values: np.ndarray | None = None
) -> go.Scatter:
    """Invisible markers on cell centres: the only hover/click targets (heatmaps cannot be selected).

    ``customdata`` rows: ``[token, row, col, value, x, y, patch]`` with (x, y) the cell centre in
    pixels of the model input, so a click can pick the token at that point on any stage, and ``patch``
    the cell's 0-based row-major index (p0..).
    """
    gh, gw = grid
    ch, cw = (cell, cell) if np.isscalar(cell) else cell
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    vals = np.zeros(gh * gw) if values is None else np.asarray(values, dtype=np.float64).ravel()
    x, y = (cols + 0.5) * cw, (rows + 0.5) * ch
    return go.Scatter(
        x=x,
        y=y,
        mode="markers",
        marker=dict(size=max(4, min(24, 400 // max(gh, gw))), opacity=0.0, symbol="square"),
        customdata=np.stack([prefix + np.arange(gh * gw), rows, cols, vals, x, y, np.arange(gh * gw)], axis=1),
        hovertemplate=hover,
        name="patches",
        showlegend=False,
    )


def image_figure(image: np.ndarray, *, patch_size: int, num_prefix_tokens: int, title: str = "") -> go.Figure:
    """The image cut into its P x P patches; hover names each patch (row, col, sequence position)."""
    h, w = image.shape[:2]
    grid = (h // patch_size, w // patch_size)
    fig = go.Figure(go.Image(source=_data_uri(image), hoverinfo="skip"))
    lines = [dict(type="line", x0=x, x1=x, y0=0, y1=h) for x in range(0, w + 1, patch_size)]
    lines += [dict(type="line", x0=0, x1=w, y0=y, y1=y) for y in range(0, h + 1, patch_size)]
    fig.update_layout(shapes=[{**s, "line": dict(color="rgba(255,255,255,0.7)", width=1)} for s in lines])
    fig.add_trace(
        _patch_targets(
            grid,
            patch_size,
            num_prefix_tokens,
            "patch p%{customdata[6]} (row %{customdata[1]}, col %{customdata[2]})<br>index %{customdata[0]} in the "
            "sequence<extra></extra>",
        )
    )
    default = f"{grid[0]} x {grid[1]} patches (rows x columns) of {patch_size} px; input {w} x {h} px (width x height)"
    # the title fits the figure's own width (about its plot height times the image's aspect ratio)
    text, extra = _wrapped(title or default, max(28, int((480 - 50) * w / h / 8.5)))
    fig.update_layout(title=text, margin={**_MARGIN, "t": _MARGIN["t"] + extra}, height=480 + extra)
    _image_axes(fig, h, w)
    return fig


def map_figure(
    image: np.ndarray | None,
    grid_map: np.ndarray,
    *,
    title: str,
    colorbar_title: str,
    patch_size: float | None = None,
    num_prefix_tokens: int = 0,
    zmin: float | None = None,
    zmax: float | None = None,
    colorscale: str = ATTENTION_SCALE,
    opacity: float = 1.0,
    marked: tuple[int, int] | None = None,
    windows: tuple[Sequence[int], Sequence[int]] | None = None,
    height: int = 480,
    click_hint: str = "",
) -> go.Figure:
    """A ``(gh, gw)`` map over the image (or alone), clickable cell by cell.

    ``click_hint`` ends each cell's hover text ("click to make it the query" where a click does that);
    by default the hover promises nothing. Without ``zmin`` and ``zmax``, the colour scale spans the map's
    range, except for a flat map (:mod:`vitviz.figures.flat`), drawn on its fixed scale.

    Cells span the image evenly (``image`` height / gh by width / gw pixels), so maps
    on a stage grid or a coarser key grid sit where their tokens are; without an
    image each cell is ``patch_size`` (default 1) pixels. ``marked`` outlines a cell;
    ``windows`` (row edges, column edges in cells) draws window boundaries.
    """
    gh, gw = grid_map.shape
    if zmin is None and zmax is None:  # a flat map on a fixed scale, not stretched (vitviz.figures.flat)
        zmin, zmax = flat_limits(grid_map) or (None, None)
    if image is not None:
        h, w = image.shape[:2]
    else:
        h, w = gh * (patch_size or 1), gw * (patch_size or 1)
    ch, cw = h / gh, w / gw
    fig = go.Figure()
    if image is not None:
        fig.add_trace(go.Image(source=_data_uri(image), hoverinfo="skip"))
    fig.add_trace(
        go.Heatmap(
            z=grid_map,
            x0=cw / 2,
            dx=cw,
            y0=ch / 2,
            dy=ch,
            zmin=zmin,
            zmax=zmax,
            colorscale=rgb_scale(colorscale),
            opacity=opacity if image is not None else 1.0,
            colorbar=dict(title=dict(text=colorbar_title, side="right"), thickness=12),
            hoverinfo="skip",
        )
    )
    fig.add_trace(
        _patch_targets(
            (gh, gw),
            (ch, cw),
            num_prefix_tokens,
            "cell (row %{customdata[1]}, col %{customdata[2]}): %{customdata[3]:.4g}"
            + (f"<br>{click_hint}" if click_hint else "")
            + "<extra></extra>",
            grid_map,
        )
    )
    shapes = []
    if windows is not None:
        line = dict(color="rgba(0,229,255,0.8)", width=1.5, dash="dot")
        shapes += [dict(type="line", x0=0, x1=w, y0=r * ch, y1=r * ch, line=line) for r in windows[0]]
        shapes += [dict(type="line", x0=c * cw, x1=c * cw, y0=0, y1=h, line=line) for c in windows[1]]
    if marked is not None:
        r, c = marked
        shapes.append(
            dict(
                type="rect", x0=c * cw, x1=(c + 1) * cw, y0=r * ch, y1=(r + 1) * ch, line=dict(color="#00e5ff", width=3)
            )
        )
    # the title fits the figure's own width (about its height times the map's aspect ratio, plus the colour bar)
    chars = max(28, int(((height - 50) * w / h + 90) / 8.5))
    title, extra = _wrapped(title, chars)
    fig.update_layout(title=title, margin={**_MARGIN, "t": _MARGIN["t"] + extra}, height=height + extra, shapes=shapes)
    _image_axes(fig, h, w)
    return fig


def _wrapped(title: str, chars: int) -> tuple[str, int]:
    """``title`` on lines of at most ``chars`` characters (at word boundaries), and the pixels the extra lines take."""
    import textwrap

    if not title or "<br>" in title or len(title) <= chars:
        return title, 0
    lines = textwrap.wrap(title, chars, break_long_words=False, break_on_hyphens=False)
    return "<br>".join(lines), 20 * (len(lines) - 1)


def _data_uri(image: np.ndarray, *, max_side: int | None = None, quality: int = 90) -> str:
    """The image as a JPEG data URI: a tenth of the bytes of a per-pixel ``z`` array, and faster to draw."""
    import base64
    import io

    from PIL import Image

    img = Image.fromarray(image)
    if max_side:
        img.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def tile_gap(rows: int) -> int:
    """Empty cells between two rows of tiles of ``rows`` cells in :func:`small_multiples_figure` (one between
    columns): room for a line of title over tiles of few, large cells."""
    return 1 if rows >= 12 else (2 if rows >= 6 else 3)


def small_multiples_figure(
    maps: np.ndarray,
    titles: Sequence[str],
    *,
    colorbar_title: str,
    cols: int = 4,
    zmin: float | None = None,
    zmax: float | None = None,
    colorscale: str = ATTENTION_SCALE,
    tile_px: int = 170,
    image: np.ndarray | None = None,
    opacity: float = 1.0,
    click_hint: str = "",
) -> go.Figure:
    """``(K, gh, gw)`` maps as a grid of tiles on one shared colour scale (default: shared min/max).

    ``click_hint`` ends each tile's hover ("click to show it large" where a click does that); by default
    the hover promises nothing.

    All tiles live in one heatmap with one-cell gaps: a single trace keeps the figure
    fast to build and to draw (12 subplots cost ten times as much). With ``image``
    (h, w, 3) uint8, each tile is drawn over it. Each tile has an invisible click
    target whose ``customdata`` is ``[tile index]``.
    """
    k, gh, gw = maps.shape
    if zmin is None and zmax is None:  # a flat set of tiles on a fixed scale, not stretched (vitviz.figures.flat)
        zmin, zmax = flat_limits(maps) or (None, None)
    cols = max(1, min(cols, k))
    rows = -(-k // cols)
    # rows of tiles lie ``gap`` cells apart: room for the next row's titles (a 6 x 6 grid's one cell was less than a
    # line of text, and the titles sat on the tiles above)
    gap = tile_gap(gh)
    stride = gh + gap
    big = np.full((rows * stride - gap, cols * (gw + 1) - 1), np.nan)
    for i, m in enumerate(maps):
        r, c = divmod(i, cols)
        big[r * stride : r * stride + gh, c * (gw + 1) : c * (gw + 1) + gw] = m
    tile_r, tile_c = np.divmod(np.arange(k), cols)
    fig = go.Figure(
        [
            go.Heatmap(
                z=big,
                zmin=float(np.min(maps)) if zmin is None else zmin,
                zmax=float(np.max(maps)) if zmax is None else zmax,
                colorscale=rgb_scale(colorscale),
                opacity=opacity if image is not None else 1.0,
                colorbar=dict(title=dict(text=colorbar_title, side="right"), thickness=12),
                hovertemplate="value %{z:.4g}<extra></extra>",
                hoverongaps=False,
            ),
            go.Scatter(
                x=tile_c * (gw + 1) + (gw - 1) / 2,
                y=tile_r * stride + (gh - 1) / 2,
                mode="markers",
                marker=dict(size=tile_px // 2, opacity=0.0, symbol="square"),
                customdata=np.arange(k)[:, None],
                text=list(titles),
                hovertemplate="%{text}" + (f": {click_hint}" if click_hint else "") + "<extra></extra>",
                showlegend=False,
            ),
        ]
    )
    if image is not None:
        uri = _data_uri(image, max_side=160, quality=80)
        fig.update_layout(
            images=[
                dict(
                    source=uri,
                    xref="x",
                    yref="y",
                    x=c * (gw + 1) - 0.5,
                    y=r * stride - 0.5,
                    sizex=gw,
                    sizey=gh,
                    xanchor="left",
                    yanchor="top",
                    sizing="stretch",
                    layer="below",
                )
                for r, c in zip(tile_r, tile_c, strict=True)
            ]
        )
    fig.update_layout(
        annotations=[
            dict(
                x=(i % cols) * (gw + 1) + (gw - 1) / 2,
                y=(i // cols) * stride - 0.5,
                text=t,
                showarrow=False,
                yanchor="bottom",
                font=dict(size=11),
            )
            for i, t in enumerate(titles)
        ],
        xaxis=dict(visible=False, constrain="domain"),
        yaxis=dict(visible=False, autorange="reversed", scaleanchor="x"),
        margin=dict(l=10, r=10, t=30, b=10),
        height=int(rows * tile_px + 60),
    )
    return fig


def token_sequence_figure(token_kinds: Sequence[str], grid: tuple[int, int], *, max_patches: int = 48) -> go.Figure:
    """The flattened input sequence: prefix tokens in front, then patches in row-major order."""
    prefix = [k for k in token_kinds if k != "patch"]
    n = len(token_kinds) - len(prefix)
    shown = list(range(min(n, max_patches)))
    labels = prefix + [f"p{i}" for i in shown] + (["…"] if n > len(shown) else [])
    kinds = prefix + ["patch"] * len(shown) + (["patch"] if n > len(shown) else [])
    hover = [f"{k}: token {i}" for i, k in enumerate(prefix)]
    hover += [
        f"patch {i}: row {divmod(i, grid[1])[0]}, col {divmod(i, grid[1])[1]} (token {len(prefix) + i})" for i in shown
    ]
    if n > len(shown):
        hover.append(f"{n - len(shown)} more patches (token {len(prefix) + len(shown)} to {len(token_kinds) - 1})")
    fig = go.Figure(
        go.Bar(
            x=list(range(len(labels))),
            y=[1] * len(labels),
            marker_color=[_kind_colour(k) for k in kinds],
            text=labels,
            textposition="inside",
            hovertext=hover,
            hoverinfo="text",
        )
    )
    fig.update_layout(
        title=f"Input sequence: {len(prefix)} prefix token(s) + {n} patches = {len(token_kinds)} tokens",
        height=150,
        margin=_MARGIN,
        bargap=0.08,
        yaxis=dict(visible=False),
        xaxis=dict(visible=False),
    )
    return fig


def predictions_figure(predictions: Sequence[Prediction], *, how: str = "softmax of the logits") -> go.Figure:
    """Top-k classes (or zero-shot labels), most probable on top; ``how`` says how probabilities were made."""
    preds = list(predictions)[::-1]
    fig = go.Figure(
        go.Bar(
            x=[p.probability for p in preds],
            y=[f"{plotly_plain(p.label)} ({p.index})" for p in preds],  # labels may be typed by a visitor
            orientation="h",
            customdata=[[p.index, p.logit] for p in preds],
            hovertemplate="%{y}<br>probability %{x:.2%}<br>logit %{customdata[1]:.3f}<extra></extra>",
            marker_color="#ff7f0e",
            text=[f"{p.probability:.1%}" for p in preds],
            textposition="auto",
        )
    )
    fig.update_layout(
        title=f"Top predictions ({how})",
        xaxis=dict(title="probability", range=[0, 1], tickformat=".0%"),
        height=60 + 36 * max(1, len(preds)),
        margin=_MARGIN,
    )
    return fig


def prefix_attention_figure(
    values: np.ndarray,
    kinds: Sequence[str],
    *,
    patch_total: float | None = None,
    title: str = "Attention to tokens not on the image (raw)",
) -> go.Figure:
    """A bar per prefix token (values in [0, 1]), plus one for all patches together when ``patch_total`` is given
    (the default title then says so: the patches are on the image)."""
    if patch_total is not None and title == "Attention to tokens not on the image (raw)":
        title = "Where the query's attention goes (raw)"  # tokens off the image, and all patches together
    names = list(kinds) + ([] if patch_total is None else ["all patches"])
    vals = [float(v) for v in values] + ([] if patch_total is None else [float(patch_total)])
    fig = go.Figure(
        go.Bar(
            x=names,
            y=vals,
            marker_color=[_kind_colour(k) for k in kinds] + ([] if patch_total is None else ["#7f7f7f"]),
            hovertemplate="%{x}: %{y:.4f}<extra></extra>",
            text=[f"{v:.3f}" for v in vals],
            textposition="auto",
        )
    )
    fig.update_layout(title=title, yaxis=dict(range=[0, 1]), height=260, margin=_MARGIN)
    return fig


def _stage_starts(stage_of_block: Sequence[int] | None) -> list[int]:
    """Indices of the first block of every stage after the first."""
    if stage_of_block is None:
        return []
    return [b for b in range(1, len(stage_of_block)) if stage_of_block[b] != stage_of_block[b - 1]]


def layer_head_figure(
    values: np.ndarray,
    *,
    title: str,
    colorbar_title: str,
    marked: tuple[int, int] | None = None,
    row_labels: Sequence[str] | None = None,
    stage_of_block: Sequence[int] | None = None,
    diverging: bool = False,
    value_name: str = "value",
) -> go.Figure:
    """A blocks x heads heatmap (rows = blocks in forward order); click a cell to open that head.

    ``diverging``: a red-blue scale centred on 0 (effects and attributions, which take both signs).
    ``value_name``: how the hover names a cell's value ("estimate" for an estimate).

    ``nan`` cells (heads a block does not have) stay blank and are not clickable;
    a line separates stages.
    """
    num_layers, num_heads = values.shape
    labels = list(row_labels) if row_labels is not None else [f"block {i}" for i in range(num_layers)]
    fig = go.Figure(
        go.Heatmap(
            z=values,
            x=np.arange(num_heads),
            y=np.arange(num_layers),
            colorscale=rgb_scale(SIMILARITY_SCALE if diverging else NORM_SCALE),
            zmid=0.0 if diverging else None,
            colorbar=dict(title=dict(text=colorbar_title, side="right"), thickness=12),
            customdata=np.broadcast_to(np.array(labels, dtype=object)[:, None], values.shape),
            hovertemplate=f"%{{customdata}}, head %{{x}}<br>{value_name} %{{z:.4g}}<extra></extra>",
            hoverongaps=False,
        )
    )
    cells_l, cells_h = np.nonzero(np.isfinite(values))
    fig.add_trace(
        go.Scatter(  # the click targets lie over the cells: their hover carries the value too
            x=cells_h,
            y=cells_l,
            mode="markers",
            marker=dict(size=14, opacity=0.0, symbol="square"),
            customdata=np.stack([cells_l, cells_h, values[cells_l, cells_h]], axis=1),
            text=[labels[i] for i in cells_l],
            hovertemplate=f"%{{text}}, head %{{customdata[1]}}<br>{value_name} %{{customdata[2]:.4g}}<br>click to open"
            "<extra></extra>",
            showlegend=False,
        )
    )
    heads_of = np.isfinite(values).sum(axis=1)  # heads each block has (its finite cells)
    shapes = [  # a stage's boundary spans the cells on either side of it, not the blank cells beyond them
        dict(
            type="line",
            x0=-0.5,
            x1=max(heads_of[b - 1], heads_of[b]) - 0.5,
            y0=b - 0.5,
            y1=b - 0.5,
            line=dict(color="white", width=3),
        )
        for b in _stage_starts(stage_of_block)
    ]
    if marked is not None:
        shapes.append(
            dict(
                type="rect",
                x0=marked[1] - 0.5,
                x1=marked[1] + 0.5,
                y0=marked[0] - 0.5,
                y1=marked[0] + 0.5,
                line=dict(color="#00e5ff", width=3),
            )
        )
    fig.update_layout(
        title=title,
        xaxis=dict(title="head", dtick=1),
        yaxis=dict(
            title="block",
            tickvals=list(range(num_layers)),
            ticktext=labels,
            autorange="reversed",
        ),
        height=min(720, max(280, 120 + 24 * num_layers)) + (20 if "<br>" in title else 0),
        margin={**_MARGIN, "t": 60 if "<br>" in title else 40},  # the colour bar's title fits beside a few blocks
        clickmode="event+select",
        dragmode=False,
        shapes=shapes,
    )
    return fig


def distance_depth_figure(
    distances: np.ndarray,
    *,
    image_px: int,
    stage_of_block: Sequence[int] | None = None,
    spread: np.ndarray | None = None,
) -> go.Figure:
    """Mean attention distance per head against depth (ViT paper, Figure 7 right); stage boundaries marked.

    ``distances`` ``(L, H)`` pixels (``nan`` for heads a block does not have);
    ``spread`` ``(L, H)`` optional standard deviation over images, drawn as error bars.
    """
    num_layers, num_heads = distances.shape
    fig = go.Figure()
    for h in range(num_heads):
        fig.add_trace(
            go.Scatter(
                x=np.arange(num_layers),
                y=distances[:, h],
                mode="markers",
                name=f"head {h}",
                marker=dict(size=8),
                error_y=None if spread is None else dict(type="data", array=spread[:, h], visible=True, thickness=1),
                hovertemplate=f"head {h}<br>block %{{x}}<br>%{{y:.1f}} px<extra></extra>",
            )
        )
    starts = _stage_starts(stage_of_block)
    shapes = [
        dict(type="line", x0=b - 0.5, x1=b - 0.5, y0=0, y1=image_px, line=dict(color="grey", dash="dash"))
        for b in starts
    ]
    notes = (
        [
            dict(x=b, y=image_px, text=f"stage {i}", showarrow=False, yanchor="top", xanchor="left")
            for i, b in enumerate([0, *starts])
        ]
        if starts
        else []
    )
    fig.update_layout(
        title="Mean attention distance by depth (one point per head)",
        xaxis=dict(title="network depth (block)", dtick=1),
        yaxis=dict(title="mean attention distance (pixels)", range=[0, image_px]),
        height=420,
        margin=_MARGIN,
        shapes=shapes,
        annotations=notes,
    )
    return fig


def position_similarity_figure(similarity: np.ndarray, grid: tuple[int, int], *, max_tiles: int = 16) -> go.Figure:
    """ViT paper Figure 7 (centre): tile (r, c) shows the cosine similarity of position (r, c) to all others.

    Tiles are laid out on the position grid; for grids wider than ``max_tiles`` every
    k-th position is shown (each tile stays at full resolution).
    """
    g_rows, g_cols = grid
    step = max(1, -(-max(g_rows, g_cols) // max_tiles))
    rows, cols = list(range(0, g_rows, step)), list(range(0, g_cols, step))
    gap = 1
    big = np.full((len(rows) * (g_rows + gap), len(cols) * (g_cols + gap)), np.nan)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            y0, x0 = i * (g_rows + gap), j * (g_cols + gap)
            big[y0 : y0 + g_rows, x0 : x0 + g_cols] = similarity[r * g_cols + c].reshape(g_rows, g_cols)
    fig = go.Figure(
        go.Heatmap(
            z=big,
            zmin=-1,
            zmax=1,
            colorscale=rgb_scale(SIMILARITY_SCALE),
            hoverinfo="skip",
            colorbar=dict(title=dict(text="cosine similarity (raw)", side="right"), thickness=12),
            hoverongaps=False,
        )
    )
    tile_r, tile_c = np.meshgrid(np.arange(len(rows)), np.arange(len(cols)), indexing="ij")
    fig.add_trace(
        go.Scatter(  # one invisible click target per tile (heatmap cells cannot be selected)
            x=(tile_c.ravel() * (g_cols + gap) + (g_cols - 1) / 2),
            y=(tile_r.ravel() * (g_rows + gap) + (g_rows - 1) / 2),
            mode="markers",
            marker=dict(size=max(6, 480 // max(len(rows), len(cols))), opacity=0.0, symbol="square"),
            customdata=np.stack([np.array(rows)[tile_r.ravel()], np.array(cols)[tile_c.ravel()]], axis=1),
            hovertemplate="position (%{customdata[0]}, %{customdata[1]}): click to see it large<extra></extra>",
            showlegend=False,
        )
    )
    sub = "" if step == 1 else f" (every {step}th position shown)"
    fig.update_layout(
        title=f"Position embedding similarity, {g_rows} x {g_cols} positions{sub}",
        xaxis=dict(visible=False, constrain="domain"),
        yaxis=dict(visible=False, autorange="reversed", scaleanchor="x"),
        height=560,
        margin=_MARGIN,
    )
    return fig


def _tile_rgb(component: np.ndarray) -> np.ndarray:
    """(C, p, p) -> (p, p, 3) uint8, scaled per tile to its own min/max."""
    c = component if component.shape[0] == 3 else np.repeat(component[:1], 3, axis=0)
    lo, hi = float(c.min()), float(c.max())
    scaled = (c - lo) / (hi - lo) if hi > lo else np.zeros_like(c)
    return (np.transpose(scaled, (1, 2, 0)) * 255).round().astype(np.uint8)


def patch_components_figure(
    components: np.ndarray, explained: np.ndarray, *, cols: int = 7, scale: int = 4
) -> go.Figure:
    """ViT paper Figure 7 (left): principal components of the patch filters as RGB tiles (scaled per tile)."""
    k, _, p, _ = components.shape
    rows = -(-k // cols)
    cell = p * scale + 2
    canvas = np.full((rows * cell, cols * cell, 3), 255, np.uint8)
    for i in range(k):
        tile = np.kron(_tile_rgb(components[i]), np.ones((scale, scale, 1), np.uint8))
        r, c = divmod(i, cols)
        canvas[r * cell + 1 : r * cell + 1 + p * scale, c * cell + 1 : c * cell + 1 + p * scale] = tile
    fig = go.Figure(go.Image(z=canvas, hoverinfo="skip"))
    centres_r, centres_c = np.divmod(np.arange(k), cols)
    fig.add_trace(
        go.Scatter(
            x=centres_c * cell + cell / 2,
            y=centres_r * cell + cell / 2,
            mode="markers",
            marker=dict(opacity=0.0, size=20),
            customdata=np.stack([np.arange(k), explained[:k] * 100], axis=1),
            hovertemplate="component %{customdata[0]}<br>%{customdata[1]:.1f}% of variance<extra></extra>",
            showlegend=False,
        )
    )
    fig.update_layout(
        title=f"First {k} principal components of the patch-embedding filters (each tile scaled to its own range)",
        margin=_MARGIN,
        height=int(rows * cell * 2.2 + 60),
    )
    _image_axes(fig, rows * cell, cols * cell)
    return fig


def token_norms_figure(
    norms: np.ndarray, token_kinds: Sequence[str], *, row_labels: Sequence[str] | None = None
) -> go.Figure:
    """Residual-stream norm of every token ``(R, T)``: row 0 the tokens entering (the embeddings), row r after
    block r - 1. ``row_labels`` ``(R,)``: what each row is (default "embeddings", "after block 0", ...; a later
    stage's rows name its own blocks). Patches are named p0.. as on the Overview (prefix tokens by kind)."""
    n_rows = norms.shape[0]
    rows = (
        list(row_labels) if row_labels is not None else ["embeddings", *(f"after block {b}" for b in range(n_rows - 1))]
    )
    if len(rows) != n_rows:
        raise ValueError(f"{len(rows)} row labels for {n_rows} rows")
    n_prefix = sum(k != "patch" for k in token_kinds)
    tokens = [k if k != "patch" else f"p{i - n_prefix}" for i, k in enumerate(token_kinds)]
    custom = np.stack(
        [
            np.broadcast_to(np.array(rows, dtype=object)[:, None], norms.shape),
            np.broadcast_to(np.array(tokens, dtype=object)[None, :], norms.shape),
        ],
        axis=-1,
    )
    ticks = ["emb" if r == "embeddings" else r.removeprefix("after block ") for r in rows]
    fig = go.Figure(
        go.Heatmap(
            z=norms,
            x=np.arange(norms.shape[1]),
            y=np.arange(n_rows),
            colorscale=rgb_scale(NORM_SCALE),
            customdata=custom,
            hovertemplate="%{customdata[0]}<br>token %{x} (%{customdata[1]})<br>L2 norm %{z:.4g}<extra></extra>",
            colorbar=dict(title=dict(text="L2 norm (raw)", side="right"), thickness=12),
        )
    )
    fig.update_layout(
        title=f"Token norms through the network (row 0: {rows[0]}; then after each block; outliers stand out)",
        xaxis=dict(title="token (prefix tokens first, then patches p0..)"),
        yaxis=dict(title="block", autorange="reversed", tickvals=list(range(n_rows)), ticktext=ticks),
        height=min(520, 140 + 24 * n_rows),
        margin=_MARGIN,
    )
    return fig


def comparison_figure(before: Sequence[Prediction], after: Sequence[Prediction], *, title: str) -> go.Figure:
    """Probabilities of the same classes before and after an intervention (grouped bars, most probable first)."""
    names = [plotly_plain(p.label) for p in before]  # labels may be typed by a visitor
    after_by = {p.index: p for p in after}
    fig = go.Figure(
        [
            go.Bar(
                x=names,
                y=[p.probability for p in before],
                name="before",
                marker_color="#7f7f7f",
                hovertemplate="%{x}: %{y:.2%} before<extra></extra>",
            ),
            go.Bar(
                x=names,
                y=[after_by[p.index].probability if p.index in after_by else 0.0 for p in before],
                name="after",
                marker_color="#d62728",
                hovertemplate="%{x}: %{y:.2%} after<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        title=title, barmode="group", yaxis=dict(range=[0, 1], tickformat=".0%"), height=300, margin=_MARGIN
    )
    return fig


def lens_figure(
    probabilities: np.ndarray,
    labels: Sequence[str],
    ranks: np.ndarray,
    *,
    target: str,
    row_labels: Sequence[str] | None = None,
    tick_labels: Sequence[str] | None = None,
) -> go.Figure:
    """Logit lens: the probability of a few classes after each block (row 0: the embeddings) and the rank of
    the final top-1 class (1 = top), against depth. ``probabilities`` ``(L+1, K)``, ``ranks`` ``(L+1,)``;
    ``nan`` where the lens is not defined. ``row_labels`` ``(L+1,)``: what each row is, as the rest of the app
    names blocks (default: "embeddings", then "after block 0" .. "after block L-1", 0-based like the Block slider);
    ``tick_labels`` ``(L+1,)``: their short forms on the x axis (default: "emb", then 0 .. L-1).
    """
    from plotly.subplots import make_subplots

    depth = np.arange(probabilities.shape[0])
    if row_labels is None:
        row_labels = ["embeddings", *(f"after block {b}" for b in range(len(depth) - 1))]
    if len(row_labels) != len(depth):
        raise ValueError(f"{len(row_labels)} row labels for {len(depth)} rows")
    rows = np.asarray(list(row_labels), dtype=object)
    # ticks: "emb", then the block's 0-based index, the numbers the Block slider shows
    if tick_labels is None:
        tick_labels = ["emb", *(str(b) for b in range(len(depth) - 1))]
    ticks = dict(tickmode="array", tickvals=depth, ticktext=list(tick_labels))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("probability of the top classes", f"rank of '{target}'"))
    for k, name in enumerate(labels):
        fig.add_trace(
            go.Scatter(
                x=depth,
                y=probabilities[:, k],
                customdata=rows,
                mode="lines+markers",
                name=name,
                hovertemplate=f"{name}<br>%{{customdata}}: %{{y:.2%}}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=depth,
            y=ranks,
            customdata=rows,
            mode="lines+markers",
            name=f"rank of {target}",
            showlegend=False,
            hovertemplate="%{customdata}: rank %{y}<extra></extra>",
            line=dict(color="#000000"),
        ),
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text="residual stream after block (emb: the embeddings)", **ticks)
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=1)
    fig.update_yaxes(autorange="reversed", title_text="rank (1 = top)", row=1, col=2)
    fig.update_layout(
        title="Logit lens: what the model would predict after each block",
        height=400,
        margin=dict(l=10, r=10, t=80, b=10),  # the title above the two subplots' titles
    )
    return fig


def curves_figure(fractions: np.ndarray, curves: dict[str, tuple[np.ndarray, np.ndarray]], *, target: str) -> go.Figure:
    """Deletion and insertion curves of several maps in one figure: probability of ``target`` against the fraction
    of patches deleted (left) or inserted (right); ``curves``: method -> (deletion (K,), insertion (K,))."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("deletion (lower is more faithful)", "insertion (higher is more faithful)")
    )
    for i, (name, (deletion, insertion)) in enumerate(curves.items()):
        colour = "#7f7f7f" if name == "random" else qualitative.Plotly[i % len(qualitative.Plotly)]
        dash = "dot" if name == "random" else "solid"
        for col, ys in ((1, deletion), (2, insertion)):
            fig.add_trace(
                go.Scatter(
                    x=fractions,
                    y=ys,
                    mode="lines",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line=dict(color=colour, dash=dash),
                    hovertemplate=f"{name}<br>%{{x:.0%}} of patches: %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="fraction of patches", tickformat=".0%")
    fig.update_yaxes(title_text=f"probability of '{target}'", range=[0, 1], row=1, col=1)
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(
        title="Deletion and insertion curves (Petsiuk et al. 2018)", height=420, margin=dict(l=10, r=10, t=80, b=10)
    )
    return fig


def areas_figure(deletion: dict[str, np.ndarray], insertion: dict[str, np.ndarray]) -> go.Figure:
    """Distributions of the deletion and insertion areas per method over a data set (box plots with every point)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("deletion area (lower is more faithful)", "insertion area (higher is more faithful)"),
    )
    for col, values in ((1, deletion), (2, insertion)):
        for name, v in values.items():
            fig.add_trace(
                go.Box(
                    y=v,
                    name=name,
                    boxpoints="outliers",
                    showlegend=False,
                    marker_color="#7f7f7f" if name == "random" else None,
                    hovertemplate=f"{name}: %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(range=[0, 1])
    fig.update_layout(title="Areas over the images, per method", height=440, margin=dict(l=10, r=10, t=80, b=10))
    return fig
