"""Figures of an SAE's features: a feature's activation histogram, clean-versus-edited predictions, and the feature
card's top examples, histogram over a data set and direct effects (no torch)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

__all__ = [
    "feature_histogram_figure",
    "edited_predictions_figure",
    "feature_crops_figure",
    "index_histogram_figure",
    "effects_figure",
    "label_search_figure",
    "attribution_figure",
]


def _ranked_bars_layout(fig: go.Figure, *, title: str, what: str, height: int, left: int, **extra) -> go.Figure:
    """The layout every horizontal bar chart here shares: first row on top, ``what`` along x."""
    fig.update_layout(
        title=title,
        xaxis_title=what,
        yaxis=dict(autorange="reversed"),
        height=height,
        margin=dict(l=left, r=10, t=50, b=40),
        **extra,
    )
    return fig


def _histogram_layout(fig: go.Figure, *, title: str, xaxis, yaxis_title: str) -> go.Figure:
    """The layout both activation histograms share."""
    fig.update_layout(
        title=title, xaxis=xaxis, yaxis_title=yaxis_title, height=300, margin=dict(l=50, r=10, t=50, b=40), bargap=0.05
    )
    return fig


def feature_histogram_figure(values: np.ndarray, *, feature: int, where: str, bins: int = 30) -> go.Figure:
    """The histogram of one feature's activations ``values`` (any shape) where it is active (> 0); the title says
    on how many of them it is active (its density over ``where``, e.g. "this image's patches")."""
    v = np.asarray(values, np.float64).ravel()
    on = v[v > 0]
    fig = go.Figure(go.Histogram(x=on, nbinsx=bins, marker_color="#ff9f1c", name="active"))
    share = len(on) / max(len(v), 1)
    return _histogram_layout(
        fig,
        title=f"Feature {feature}: active on {len(on)} of {len(v)} of {where} ({share:.0%})",
        xaxis=dict(title="activation (where active)"),
        yaxis_title="count",
    )


def edited_predictions_figure(
    names: Sequence[str], clean: np.ndarray, edited: np.ndarray, *, title: str, what: str = "probability"
) -> go.Figure:
    """Bars of the clean and the edited run's ``what`` per class, side by side."""
    fig = go.Figure(
        [
            go.Bar(
                y=list(names), x=np.asarray(clean, np.float64), orientation="h", name="clean", marker_color="#4c78a8"
            ),
            go.Bar(
                y=list(names), x=np.asarray(edited, np.float64), orientation="h", name="edited", marker_color="#f58518"
            ),
        ]
    )
    return _ranked_bars_layout(fig, title=title, what=what, height=80 + 40 * len(names), left=90, barmode="group")


def feature_crops_figure(
    images: Sequence[np.ndarray], titles: Sequence[str], *, title: str, cols: int = 4
) -> go.Figure:
    """The top examples, each an RGB ``(h, w, 3)`` uint8 crop (the feature's map already blended in), in a grid."""
    from plotly.subplots import make_subplots

    n = max(len(images), 1)
    cols = max(1, min(cols, n))
    rows = -(-n // cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[str(t) for t in titles] or [""],
        horizontal_spacing=0.02,
        vertical_spacing=0.12 / max(rows, 1),
    )
    for k, img in enumerate(images):
        fig.add_trace(go.Image(z=np.asarray(img, np.uint8)), row=k // cols + 1, col=k % cols + 1)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, ticks="")  # crops: no axes at all
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, ticks="")
    fig.update_annotations(font_size=10)
    fig.update_layout(title=title, height=60 + 190 * rows, margin=dict(l=10, r=10, t=70, b=10))
    return fig


def index_histogram_figure(
    counts: np.ndarray, edges: np.ndarray, *, feature: int, frequency: float, tokens: int
) -> go.Figure:
    """A feature's active values over a data set: ``counts`` in the bins of ``edges`` (log-spaced; the index's), on
    a log axis; the title gives the activation frequency over ``tokens`` tokens."""
    c = np.asarray(counts, np.float64)
    e = np.asarray(edges, np.float64)
    used = np.nonzero(c)[0]
    lo, hi = (used[0], used[-1] + 1) if len(used) else (0, len(c))
    centres = np.sqrt(e[:-1] * e[1:])[lo:hi]
    fig = go.Figure(
        go.Bar(
            x=centres,
            y=c[lo:hi],
            width=(e[1:] - e[:-1])[lo:hi],
            marker_color="#ff9f1c",
            customdata=np.stack([e[:-1][lo:hi], e[1:][lo:hi]], axis=-1),
            hovertemplate="%{customdata[0]:.3g} to %{customdata[1]:.3g}: %{y} tokens<extra></extra>",
        )
    )
    return _histogram_layout(
        fig,
        title=f"Feature {feature} over the data set: active on {frequency:.2%} of {tokens:,} tokens",
        xaxis=dict(title="activation (where active), log scale", type="log"),
        yaxis_title="tokens",
    )


def effects_figure(
    positive: Sequence[tuple[str, float]], negative: Sequence[tuple[str, float]], *, title: str, what: str
) -> go.Figure:
    """The most positive and most negative direct effects, as bars (positive on top, largest first)."""
    rows = list(positive) + list(reversed(list(negative)))
    names = [n for n, _ in rows]
    vals = np.array([v for _, v in rows], np.float64)
    fig = go.Figure(
        go.Bar(
            y=names,
            x=vals,
            orientation="h",
            marker_color=["#2ca02c" if v > 0 else "#d62728" for v in vals],
            hovertemplate="%{y}: %{x:.4g}<extra></extra>",
        )
    )
    return _ranked_bars_layout(fig, title=title, what=what, height=90 + 26 * max(len(rows), 1), left=110)


def label_search_figure(features: Sequence[int], values: Sequence[float], *, label: str) -> go.Figure:
    """Features ranked by the cosine of their direct-effect direction with a label's text embedding."""
    fig = go.Figure(
        go.Bar(
            y=[f"feature {int(i)}" for i in features],
            x=np.asarray(values, np.float64),
            orientation="h",
            marker_color="#4c78a8",
            hovertemplate="%{y}: cosine %{x:.3f}<extra></extra>",
        )
    )
    return _ranked_bars_layout(
        fig,
        title=f'Features whose direct effect points toward "{label}"',
        what="cosine with the label's text embedding",
        height=90 + 24 * max(len(features), 1),
        left=100,
    )


def attribution_figure(
    features: Sequence[int], estimate: Sequence[float], exact: Sequence[float], *, target: str
) -> go.Figure:
    """Features' attribution to a target: the first-order estimate (gradient x activation) beside the exact effect of
    zeroing each (``target(clean) - target(zeroed)``), one pair of bars per feature, in the order given."""
    names = [f"feature {int(i)}" for i in features]
    fig = go.Figure(
        [
            go.Bar(
                y=names,
                x=np.asarray(estimate, np.float64),
                orientation="h",
                name="estimate (gradient x activation)",
                marker_color="#4c78a8",
                hovertemplate="%{y}: estimate %{x:.4g}<extra></extra>",
            ),
            go.Bar(
                y=names,
                x=np.asarray(exact, np.float64),
                orientation="h",
                name="exact (zeroed)",
                marker_color="#f58518",
                hovertemplate="%{y}: exact %{x:.4g}<extra></extra>",
            ),
        ]
    )
    return _ranked_bars_layout(
        fig,
        title=f"Features' attribution to {target}",
        what="target clean minus target without the feature (before softmax)",
        height=110 + 34 * max(len(names), 1),
        left=100,
        barmode="group",
        legend=dict(orientation="h", y=-0.15),
    )
