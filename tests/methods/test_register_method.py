"""``register_method``: a method written outside vitviz joins ``METHODS`` and every function that reads it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_image

from vitviz.methods import METHODS, Method, available_methods, explain, get_method, register_method


@pytest.fixture(autouse=True)
def methods():
    """Every test here leaves ``METHODS`` as it found it."""
    saved = dict(METHODS)
    yield
    METHODS.clear()
    METHODS.update(saved)


class Ones(Method):
    name = "ones"
    title = "All ones"
    definition = "1 in every cell of a 2 x 2 grid"
    class_specific = False

    def compute(self, inputs, target, seed):
        return np.ones((2, 2))


def test_a_registered_method_is_explained_and_placed_on_the_grid(tiny_models):
    loaded = tiny_models["vit"]  # 32 px, 8 px patches: a 4 x 4 grid
    register_method(Ones())
    assert get_method("ones") is METHODS["ones"]
    assert "ones" in available_methods(loaded)
    m = explain(loaded, random_image(0), "ones")
    assert m.source_grid == (2, 2) and m.values.shape == (4, 4)
    assert np.array_equal(m.values, np.ones((4, 4), np.float32))  # each finer cell takes its coarse cell's value


def test_a_taken_name_is_refused_unless_replace():
    class Fake(Ones):
        name = "rollout"

    with pytest.raises(ValueError, match="'rollout' exists"):
        register_method(Fake())
    assert type(METHODS["rollout"]).__name__ == "Rollout"
    register_method(Fake(), replace=True)
    assert isinstance(METHODS["rollout"], Fake)


def test_bad_methods_are_refused():
    with pytest.raises(TypeError, match="Method instance"):
        register_method(Ones)

    class Nameless(Method):
        pass

    with pytest.raises(ValueError, match="has no name"):
        register_method(Nameless())
