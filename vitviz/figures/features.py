"""Figures of an SAE's features: a feature's activation histogram and clean-versus-edited predictions (no torch)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

__all__ = ["feature_histogram_figure", "edited_predictions_figure"]


def feature_histogram_figure(values: np.ndarray, *, feature: int, where: str, bins: int = 30) -> go.Figure:
    """The histogram of one feature's activations ``values`` (any shape) where it is active (> 0); the title says
    on how many of them it is active (its density over ``where``, e.g. "this image's patches")."""
    v = np.asarray(values, np.float64).ravel()
    on = v[v > 0]
    fig = go.Figure(go.Histogram(x=on, nbinsx=bins, marker_color="#ff9f1c", name="active"))
    share = len(on) / max(len(v), 1)
    fig.update_layout(
        title=f"Feature {feature}: active on {len(on)} of {len(v)} of {where} ({share:.0%})",
        xaxis_title="activation (where active)",
        yaxis_title="count",
        height=300,
        margin=dict(l=50, r=10, t=50, b=40),
        bargap=0.05,
    )
    return fig


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
    fig.update_layout(
        title=title,
        barmode="group",
        xaxis_title=what,
        yaxis=dict(autorange="reversed"),
        height=80 + 40 * len(names),
        margin=dict(l=90, r=10, t=50, b=40),
    )
    return fig
