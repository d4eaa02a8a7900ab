import numpy as np
import plotly.graph_objects as go
import pytest

from vitviz import figures
from vitviz.capture.forward import predictions_from_logits


def _trace(fig: go.Figure, kind: str):
    return [t for t in fig.data if t.type == kind]


def test_image_figure_grid_lines_and_patch_hover():
    img = np.zeros((32, 48, 3), np.uint8)
    fig = figures.image_figure(img, patch_size=8, num_prefix_tokens=2)
    assert len(fig.layout.shapes) == (48 // 8 + 1) + (32 // 8 + 1)
    targets = _trace(fig, "scatter")[0]
    assert len(targets.x) == 4 * 6
    # patch (1, 2): token 2 + 1*6 + 2 = 10, centred at (20, 12) px
    i = 1 * 6 + 2
    assert (targets.x[i], targets.y[i]) == (20, 12)
    assert list(targets.customdata[i][:3]) == [10, 1, 2]
    assert "4 x 6 patches (rows x columns) of 8 px" in fig.layout.title.text


def test_map_figure_places_the_map_on_the_image_and_marks_the_query():
    m = np.arange(12, dtype=float).reshape(3, 4)
    fig = figures.map_figure(
        np.zeros((24, 32, 3), np.uint8),
        m,
        patch_size=8,
        num_prefix_tokens=1,
        title="t",
        colorbar_title="attention (raw)",
        marked=(2, 1),
    )
    heat = _trace(fig, "heatmap")[0]
    np.testing.assert_array_equal(heat.z, m)
    assert (heat.x0, heat.dx, heat.y0, heat.dy) == (4, 8, 4, 8)
    assert heat.colorbar.title.text == "attention (raw)"
    targets = _trace(fig, "scatter")[0]
    assert targets.customdata[7][3] == 7.0  # hover value = the map value of that patch
    rect = fig.layout.shapes[0]
    assert (rect.x0, rect.x1, rect.y0, rect.y1) == (8, 16, 16, 24)


def test_small_multiples_tiles_share_one_scale():
    maps = np.random.default_rng(0).random((5, 2, 3))
    fig = figures.small_multiples_figure(maps, [f"h{i}" for i in range(5)], colorbar_title="raw", cols=3)
    heat = _trace(fig, "heatmap")[0]
    big = np.asarray(heat.z, dtype=float)
    gap = figures.tile_gap(2)  # tiles of two rows: three empty rows for the next row's titles
    assert gap == 3 and big.shape == (2 * 2 + gap, 3 * 4 - 1)
    np.testing.assert_array_equal(big[2 + gap : 4 + gap, 4:7], maps[4])  # tile 4: row 1, column 1
    assert np.isnan(big[2 : 2 + gap]).all()  # gap rows between the tile rows
    assert (heat.zmin, heat.zmax) == (maps.min(), maps.max())
    assert [a.text for a in fig.layout.annotations] == [f"h{i}" for i in range(5)]
    targets = _trace(fig, "scatter")[0]
    assert (targets.x[4], targets.y[4], targets.customdata[4][0]) == (5, 2 + gap + 0.5, 4)  # centre of tile 4
    with_image = figures.small_multiples_figure(
        maps, ["a"] * 5, colorbar_title="raw", cols=3, image=np.zeros((16, 24, 3), np.uint8)
    )
    assert len(with_image.layout.images) == 5 and with_image.layout.images[4].x == 3.5


def test_token_sequence_prefix_first():
    fig = figures.token_sequence_figure(("CLS", "REG0", "REG1") + ("patch",) * 6, (2, 3))
    bar = fig.data[0]
    assert list(bar.text[:4]) == ["CLS", "REG0", "REG1", "p0"]
    assert "3 prefix token(s) + 6 patches = 9 tokens" in fig.layout.title.text


def test_predictions_most_probable_on_top():
    preds = predictions_from_logits(np.array([0.0, 2.0, 1.0]), {0: "a", 1: "b", 2: "c"}, 3)
    assert [p.label for p in preds] == ["b", "c", "a"]
    probs = np.exp([0.0, 2.0, 1.0]) / np.exp([0.0, 2.0, 1.0]).sum()
    assert preds[0].probability == pytest.approx(probs[1])
    fig = figures.predictions_figure(preds)
    assert list(fig.data[0].y)[-1] == "b (1)"  # horizontal bars draw bottom-up


def test_layer_head_figure_click_targets():
    v = np.arange(6.0).reshape(2, 3)
    fig = figures.layer_head_figure(v, title="t", colorbar_title="c")
    np.testing.assert_array_equal(_trace(fig, "heatmap")[0].z, v)
    assert [list(c) for c in _trace(fig, "scatter")[0].customdata][4] == [1, 1, 4.0]  # block, head, value


def test_position_similarity_tiles():
    rng = np.random.default_rng(0)
    sim = rng.uniform(-1, 1, (9, 9))
    fig = figures.position_similarity_figure(sim, (3, 3))
    big = np.asarray(_trace(fig, "heatmap")[0].z, dtype=float)
    # tile of position (1, 2) starts at row 1*(3+1), col 2*(3+1)
    np.testing.assert_allclose(big[4:7, 8:11], sim[1 * 3 + 2].reshape(3, 3))
    assert np.isnan(big[3, 0])  # gap between tiles
    targets = _trace(fig, "scatter")[0]
    assert [list(c) for c in targets.customdata][5] == [1, 2]


def test_position_similarity_subsamples_large_grids():
    sim = np.eye(37 * 37)
    fig = figures.position_similarity_figure(sim, (37, 37), max_tiles=16)
    assert "every 3th position" in fig.layout.title.text
    assert len(_trace(fig, "scatter")[0].x) == 13 * 13


def test_patch_components_tiles_scaled_per_tile():
    comps = np.zeros((2, 3, 2, 2))
    comps[0, 0, 0, 0] = 5.0
    comps[1] = -1.0
    comps[1, 2, 1, 1] = 1.0
    fig = figures.patch_components_figure(comps, np.array([0.7, 0.2]), cols=2, scale=1)
    canvas = np.asarray(fig.data[0].z)
    assert canvas[1, 1, 0] == 255 and canvas[1, 1, 1] == 0  # component 0: its max is red
    assert canvas[2, 6, 2] == 255  # component 1 sits in the second cell (cell width 4)


def test_prefix_attention_and_norms_figures():
    fig = figures.prefix_attention_figure(np.array([0.3, 0.1]), ("CLS", "DIST"), patch_total=0.6)
    assert list(fig.data[0].x) == ["CLS", "DIST", "all patches"]
    assert list(figures.prefix_attention_figure(np.array([0.3, 0.1]), ("CLS", "DIST"), title="t").data[0].x) == [
        "CLS",
        "DIST",
    ]
    norms = np.ones((3, 5))
    fig2 = figures.token_norms_figure(norms, ("CLS",) + ("patch",) * 4)
    assert fig2.data[0].z.shape == (3, 5)
