"""``rollout``: the readout row of ``capture_rollout`` on the first stage's grid."""

import numpy as np
from conftest import random_image

from vitviz.analysis.rollout import capture_rollout, rollout
from vitviz.capture.forward import capture
from vitviz.methods import explain


def test_plain_vit_equals_the_dense_rollout_cls_row(tiny_models):
    loaded, image = tiny_models["vit"], random_image(3)
    cap = capture(loaded, image, attention_dtype="float32")
    row = rollout(cap.attentions.astype(np.float64), num_prefix_tokens=1)
    m = explain(loaded, image, "rollout")
    np.testing.assert_allclose(m.values, row[1:].reshape(cap.grid), rtol=1e-5)


def test_hierarchical_equals_capture_rollout(hier_models):
    loaded, image = hier_models["pvt_v2"], random_image(4, (64, 64))
    cap = capture(loaded, image)
    row, stage = capture_rollout(cap)
    assert stage == 0
    m = explain(loaded, image, "rollout")
    np.testing.assert_array_equal(m.values, row.reshape(cap.grid).astype(np.float32))
    assert m.source_grid == m.grid == (16, 16)
