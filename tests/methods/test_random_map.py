"""``random``: the seeded floor."""

import numpy as np
from conftest import random_image

from vitviz.methods import explain


def test_seeded_uniform_reproducible_and_seed_dependent(tiny_models, hier_models):
    for loaded in (tiny_models["dinov2"], hier_models["swin"]):
        image = random_image(0, (64, 64))
        a = explain(loaded, image, "random", seed=7)
        b = explain(loaded, image, "random", seed=7)
        c = explain(loaded, image, "random", seed=8)
        np.testing.assert_array_equal(a.values, b.values)
        assert not np.array_equal(a.values, c.values)
        np.testing.assert_array_equal(a.values, np.random.default_rng(7).random(a.grid).astype(np.float32))
        assert a.values.min() >= 0 and a.values.max() < 1
        assert "default_rng(7)" in a.definition
