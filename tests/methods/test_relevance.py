"""``relevance``: Chefer et al.'s readout row, for the class asked."""

import numpy as np
from conftest import random_image

from vitviz.capture.gradients import explain_classes
from vitviz.methods import explain


def test_equals_explain_classes_for_each_class(tiny_models, hier_models):
    for loaded, image in ((tiny_models["beit"], random_image(6)), (hier_models["cvt"], random_image(7, (64, 64)))):
        for c in (0, 2):
            expected = explain_classes(loaded, image, [c])[c].patch_map()
            m = explain(loaded, image, "relevance", target=c)
            assert m.class_index == c
            np.testing.assert_array_equal(m.values, expected.astype(np.float32))
