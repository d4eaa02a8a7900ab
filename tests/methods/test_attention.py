"""``attention``: the last block's global map, head mean, placed on the first stage's grid."""

import numpy as np
from conftest import random_image

from vitviz.analysis.blocks import global_query, head_maps
from vitviz.capture.forward import capture
from vitviz.methods import explain, place_on_grid
from vitviz.record import POOLED


def test_plain_vit_is_the_cls_row_of_the_last_layer_head_mean(tiny_models):
    loaded, image = tiny_models["deit"], random_image(1)
    cap = capture(loaded, image, attention_dtype="float32")
    a = cap.attentions[-1]  # (H, T, T)
    expected = a[:, 0, 2:].mean(axis=0).reshape(cap.grid)  # CLS row, DIST and CLS columns left out
    m = explain(loaded, image, "attention")
    np.testing.assert_allclose(m.values, expected, rtol=1e-5, atol=1e-7)
    # the same as the per-head view of the last block, averaged (float16 storage: 1e-3)
    hm = head_maps(cap.blocks[-1], global_query(cap.blocks[-1]))
    np.testing.assert_allclose(m.values, hm.values.mean(axis=0), atol=1e-3)


def test_swin_is_the_pooled_query_of_the_last_block_on_the_first_grid(hier_models):
    loaded, image = hier_models["swin"], random_image(2, (64, 64))
    cap = capture(loaded, image)
    last = cap.blocks[-1]
    assert global_query(last) == POOLED
    hm = head_maps(last, POOLED)  # (H, 8, 8) on the last stage's grid
    m = explain(loaded, image, "attention")
    assert m.source_grid == hm.grid == (8, 8) and m.grid == (16, 16)
    np.testing.assert_allclose(m.values, np.kron(hm.values.mean(axis=0), np.ones((2, 2))), atol=1e-3)
    np.testing.assert_allclose(m.values, place_on_grid(hm.values.mean(axis=0), (16, 16)), atol=1e-3)
