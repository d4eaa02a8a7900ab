"""A difference target (class A minus class B) explained by the methods: against references written by hand."""

from __future__ import annotations

import numpy as np
from conftest import random_image
from target_reference import relevance_by_hand

from vitviz.capture.forward import preprocess
from vitviz.capture.targets import Target
from vitviz.methods import explain


def test_relevance_of_a_difference_is_chefer_on_the_difference_of_logits(tiny_models):
    loaded, image = tiny_models["vit"], random_image(11, (32, 32))
    pixels, _ = preprocess(loaded, [image], (32, 32))
    for start in (0, 1):
        got = explain(loaded, image, "relevance", target=Target.of_class(2, minus=0), from_block=start)
        want = relevance_by_hand(loaded.model, pixels, 2, 0, (4, 4), start=start)
        np.testing.assert_allclose(got.values, want, rtol=1e-4, atol=1e-7)
        assert got.target == "two (2) minus zero (0)"
        single = relevance_by_hand(loaded.model, pixels, 2, None, (4, 4), start=start)
        assert np.abs(want - single).max() > 1e-4  # the difference is not class A's map
    # relevance is not linear in the target (the clamp): A minus B is not map(A) - map(B)
    a = explain(loaded, image, "relevance", target=2).values
    b = explain(loaded, image, "relevance", target=0).values
    assert not np.allclose(explain(loaded, image, "relevance", target=Target.of_class(2, minus=0)).values, a - b)


def test_attnlrp_of_a_difference_is_the_difference(tiny_models):
    """AttnLRP is a modified gradient times the input, linear in the output's seed: map(a - b) = map(a) - map(b)."""
    loaded, image = tiny_models["vit"], random_image(12, (32, 32))
    a = explain(loaded, image, "attnlrp", target=1).values.astype(np.float64)
    b = explain(loaded, image, "attnlrp", target=2).values.astype(np.float64)
    d = explain(loaded, image, "attnlrp", target=Target.of_class(1, minus=2))
    np.testing.assert_allclose(d.values, a - b, rtol=1e-4, atol=1e-6)
    assert np.abs(a - b).max() > 1e-4
