"""Deformable attention (DAT) drawn as it ran: one query's attention over its sampled key points.

:func:`deformable_figure` draws what :func:`vitviz.capture.deformable.query_points` gives over
the image: a marker per sampled point, its area and colour growing with the weight, the
query as a star and, on request, each offset as an arrow from its reference point to the
point sampled (placement rules in :mod:`vitviz.capture.deformable`).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from vitviz.record import QueryPoints

__all__ = ["deformable_figure"]

_MARGIN = dict(l=10, r=10, t=40, b=10)


def deformable_figure(image: np.ndarray, qp: QueryPoints, *, arrows: bool = False, title: str = "") -> go.Figure:
    """The query's attention over its sampled points, drawn over ``image`` (the model input, ``(h, w, 3)`` uint8).

    Marker area and colour: the raw weight (a softmax over the samples; the colour bar
    runs from 0 to the largest weight). ``arrows``: each offset, from reference point to
    sampled point. The axes extend past the image where points left the map.
    """
    from vitviz.figures.views import ATTENTION_SCALE, _data_uri, rgb_scale

    h, w = image.shape[:2]
    fig = go.Figure(go.Image(source=_data_uri(image), hoverinfo="skip"))
    wmax = float(qp.weights.max()) if qp.weights.size else 1.0
    sizes = 5 + 25 * np.sqrt(qp.weights / max(wmax, 1e-12))
    custom = np.column_stack([qp.weights, qp.references, qp.on_map])
    fig.add_trace(
        go.Scatter(
            x=qp.points[:, 0],
            y=qp.points[:, 1],
            mode="markers",
            marker=dict(
                size=sizes,
                color=qp.weights,
                colorscale=rgb_scale(ATTENTION_SCALE),
                cmin=0.0,
                cmax=wmax,
                opacity=0.85,
                line=dict(color="white", width=1),
                colorbar=dict(title="attention<br>(raw, sums to 1)"),
            ),
            customdata=custom,
            hovertemplate=(
                "sampled at (%{x:.1f}, %{y:.1f}) px<br>weight %{customdata[0]:.4f}<br>"
                "reference (%{customdata[1]:.1f}, %{customdata[2]:.1f}) px<br>"
                "on the map: %{customdata[3]:.0%}<extra></extra>"
            ),
            name="sampled keys",
        )
    )
    if qp.query is not None:
        fig.add_trace(
            go.Scatter(
                x=[qp.query[0]],
                y=[qp.query[1]],
                mode="markers",
                name="query",
                marker=dict(symbol="star", size=16, color="#2ca02c", line=dict(color="white", width=1)),
                hovertemplate="query (%{x:.1f}, %{y:.1f}) px<extra></extra>",
            )
        )
    if arrows:
        fig.update_layout(
            annotations=[
                dict(
                    x=float(p[0]),
                    y=float(p[1]),
                    ax=float(r[0]),
                    ay=float(r[1]),
                    xref="x",
                    yref="y",
                    axref="x",
                    ayref="y",
                    showarrow=True,
                    arrowhead=2,
                    arrowsize=1,
                    arrowwidth=1,
                    arrowcolor="rgba(0,255,255,0.8)",
                    text="",
                )
                for p, r in zip(qp.points, qp.references, strict=True)
            ]
        )
    xs = np.concatenate([[0.0, w], qp.points[:, 0]])
    ys = np.concatenate([[0.0, h], qp.points[:, 1]])
    pad = 0.02 * max(h, w)
    fig.update_xaxes(visible=False, range=[xs.min() - pad, xs.max() + pad], constrain="domain")
    fig.update_yaxes(visible=False, range=[ys.max() + pad, ys.min() - pad], scaleanchor="x")
    fig.update_layout(
        title=title or f"head {qp.head}: attention over {len(qp.weights)} sampled points",
        margin=_MARGIN,
        height=480,
        showlegend=False,
    )
    return fig
