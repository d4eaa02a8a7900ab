"""One convention for numbers and names across the figures (issue 32.4, docs/conventions.md): every index
0-based ("block l", "after block l", patches p0.., registers REG0..), sizes "W x H px" and grids
"rows x columns" said as such, and every heatmap's hover shows its value ("estimate" where it is one)."""

from __future__ import annotations

import numpy as np

from vitviz import figures


def test_token_norm_rows_are_the_embeddings_then_after_each_block_and_patches_count_from_p0():
    norms = np.arange(5 * 7, dtype=float).reshape(5, 7)  # a 4-block model: embeddings + 4 rows
    kinds = ("CLS", "REG0") + ("patch",) * 5
    fig = figures.token_norms_figure(norms, kinds)
    hm = fig.data[0]
    rows = [str(r[0][0]) for r in hm.customdata]
    assert rows == ["embeddings", "after block 0", "after block 1", "after block 2", "after block 3"]
    tokens = [str(t[1]) for t in hm.customdata[0]]
    assert tokens == ["CLS", "REG0", "p0", "p1", "p2", "p3", "p4"]
    assert "%{z" in hm.hovertemplate and "layer" not in hm.hovertemplate
    assert list(fig.layout.yaxis.ticktext) == ["emb", "0", "1", "2", "3"]
    assert fig.layout.yaxis.title.text == "block"
    # a later stage: its row 0 is the stage's input
    fig = figures.token_norms_figure(
        norms, kinds, row_labels=["stage 1 input", *(f"after block {b}" for b in (3, 4, 5, 6))]
    )
    assert str(fig.data[0].customdata[0][0][0]) == "stage 1 input"


def test_block_head_hovers_show_the_value_and_say_estimate_where_it_is_one():
    values = np.array([[0.5, -0.25], [1.0, np.nan]])
    fig = figures.layer_head_figure(values, title="t", colorbar_title="change of the logit (logits)")
    targets = next(t for t in fig.data if t.type == "scatter")  # the click targets lie over the heatmap
    assert "customdata[2]" in targets.hovertemplate
    assert [float(c[2]) for c in targets.customdata] == [0.5, -0.25, 1.0]
    assert list(fig.layout.yaxis.ticktext) == ["block 0", "block 1"]
    est = figures.layer_head_figure(values, title="t", colorbar_title="c", value_name="estimate")
    assert "estimate" in next(t for t in est.data if t.type == "scatter").hovertemplate


def test_the_patch_grid_says_rows_x_columns_and_pixels_width_x_height():
    image = np.zeros((96, 144, 3), np.uint8)  # 96 px high, 144 px wide: 12 x 18 patches of 8 px
    fig = figures.image_figure(image, patch_size=8, num_prefix_tokens=1)
    title = fig.layout.title.text.replace("<br>", " ")  # it wraps to the figure's width
    assert "12 x 18 patches (rows x columns)" in title and "144 x 96 px (width x height)" in title


def test_a_stage_boundary_spans_the_heads_of_its_blocks_only():
    """demo-swin's summaries: 2, 4 and 8 heads per stage; the line between stages 0 and 1 stopped at the table's
    right edge, across cells neither block has."""
    values = np.full((4, 8), np.nan)
    values[0:2, :2], values[2, :4], values[3, :8] = 1.0, 2.0, 3.0
    fig = figures.layer_head_figure(values, title="t", colorbar_title="c", stage_of_block=[0, 0, 1, 2])
    lines = [(s.y0, s.x1) for s in fig.layout.shapes if s.type == "line"]
    assert lines == [(1.5, 3.5), (2.5, 7.5)]
