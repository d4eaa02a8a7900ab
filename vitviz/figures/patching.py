"""Figures of activation patching: a blocks x positions grid of patched logits, centred on the clean logit (no torch)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from vitviz.figures.views import SIMILARITY_SCALE

__all__ = ["patching_grid_figure"]

_MARGIN = dict(l=10, r=10, t=40, b=10)


def patching_grid_figure(
    values: np.ndarray,
    *,
    clean: float,
    source: float,
    title: str,
    x_title: str,
    x_labels: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    marked_row: int | None = None,
    scale_from: int = 0,
) -> go.Figure:
    """``values`` ``(L, X)``: the patched logit per block (rows, forward order) and position (columns).

    The colour is the change from the clean logit (``values - clean``) on a red-blue scale
    centred on 0; the hover shows the patched logit, the clean and the source logit. NaN
    cells (not computed, no such head) stay blank. ``marked_row`` outlines one block.
    ``scale_from``: the colour scale spans the largest change in columns ``scale_from``.. (the patches, where
    the prefix tokens' columns would dwarf them); cells before it beyond that span take the scale's end colour.
    """
    v = np.asarray(values, np.float64)
    n_rows, n_cols = v.shape
    rows = list(row_labels) if row_labels is not None else [f"block {i}" for i in range(n_rows)]
    cols = list(x_labels) if x_labels is not None else [str(i) for i in range(n_cols)]
    change = v - clean
    scaled = change[:, scale_from:] if np.isfinite(change[:, scale_from:]).any() else change
    span = float(np.nanmax(np.abs(scaled))) if np.isfinite(scaled).any() else 0.0
    custom = np.stack(
        [
            np.broadcast_to(np.array(rows, dtype=object)[:, None], v.shape),
            np.broadcast_to(np.array(cols, dtype=object)[None, :], v.shape),
            v.astype(object),
        ],
        axis=-1,
    )
    fig = go.Figure(
        go.Heatmap(
            z=change,
            x=np.arange(n_cols),
            y=np.arange(n_rows),
            colorscale=SIMILARITY_SCALE,
            zmid=0.0,
            zmin=-span if span else None,
            zmax=span if span else None,
            customdata=custom,
            colorbar=dict(title=dict(text="patched - clean logit", side="right"), thickness=12),
            hovertemplate=(
                "%{customdata[0]}, %{customdata[1]}<br>patched logit %{customdata[2]:.4g}"
                f"<br>clean {clean:.4g}, source {source:.4g}<extra></extra>"
            ),
            hoverongaps=False,
        )
    )
    shapes = []
    if marked_row is not None:
        shapes.append(
            dict(
                type="rect",
                x0=-0.5,
                x1=n_cols - 0.5,
                y0=marked_row - 0.5,
                y1=marked_row + 0.5,
                line=dict(color="#00e5ff", width=2),
            )
        )
    fig.update_layout(
        title=title,
        xaxis=dict(title=x_title),
        yaxis=dict(title="block", tickvals=list(range(n_rows)), ticktext=rows, autorange="reversed"),
        height=min(720, max(240, 120 + 24 * n_rows)),  # the colour bar's title fits beside a few blocks
        margin=_MARGIN,
        shapes=shapes,
    )
    return fig
