"""The feature card's figures: what each draws is the numbers it was given."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from vitviz.figures.features import effects_figure, feature_crops_figure, index_histogram_figure, label_search_figure


def test_crops_histogram_effects_and_label_search():
    crops = [np.full((8, 6, 3), v, np.uint8) for v in (10, 200, 90)]
    fig = feature_crops_figure(crops, ["a", "b", "c"], title="Feature 3", cols=2)
    assert isinstance(fig, go.Figure) and [t.type for t in fig.data] == ["image"] * 3
    assert np.array_equal(np.asarray(fig.data[1].z), crops[1])
    assert [a.text for a in fig.layout.annotations] == ["a", "b", "c"]

    edges = np.logspace(-4, 4, 65)
    counts = np.zeros(64, np.int64)
    counts[[30, 33]] = [5, 2]
    fig = index_histogram_figure(counts, edges, feature=3, frequency=0.25, tokens=28)
    bars = fig.data[0]
    assert list(bars.y) == [5, 0, 0, 2]  # the bins from the first to the last used
    np.testing.assert_allclose(bars.x[0], np.sqrt(edges[30] * edges[31]))
    assert fig.layout.xaxis.type == "log" and "25.00% of 28 tokens" in fig.layout.title.text

    fig = effects_figure([("cat", 2.0), ("dog", 0.5)], [("car", -1.0), ("bus", -0.1)], title="t", what="logit")
    assert list(fig.data[0].y) == ["cat", "dog", "bus", "car"] and list(fig.data[0].x) == [2.0, 0.5, -0.1, -1.0]

    fig = label_search_figure([4, 1], [0.9, 0.2], label="dog")
    assert list(fig.data[0].y) == ["feature 4", "feature 1"] and '"dog"' in fig.layout.title.text
