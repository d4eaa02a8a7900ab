"""The one interface: every method on every tiny family, placement between grids, errors that say why."""

import numpy as np
import pytest
from conftest import random_image

from vitviz.capture.forward import capture
from vitviz.methods import (
    METHODS,
    MethodError,
    MethodMap,
    available_methods,
    explain,
    explain_many,
    get_method,
    place_on_grid,
    pool_to_grid,
    why_unavailable,
)
from vitviz.methods.base import cell_of_pixels

CLASSIFIERS = ("vit", "deit", "beit")
HIER = ("swin", "swinv2", "cvt", "pvt", "pvt_v2", "mobilevit", "mobilevitv2", "hiera")


def _model(key, tiny_models, hier_models):
    return tiny_models[key] if key in tiny_models else hier_models[key]


@pytest.mark.parametrize("key", CLASSIFIERS + HIER)
def test_every_method_gives_a_finite_map_on_the_first_stage_grid(key, tiny_models, hier_models):
    loaded = _model(key, tiny_models, hier_models)
    image = random_image(5, (52, 44))
    cap = capture(loaded, image)
    names = available_methods(loaded)
    maps = explain_many(loaded, image, names, target=1, seed=3)
    assert tuple(maps) == names
    for name, m in maps.items():
        assert isinstance(m, MethodMap) and m.method == name
        assert m.grid == cap.grid and m.values.shape == cap.grid, name
        assert m.input_size == cap.input_size
        assert m.values.dtype == np.float32 and np.all(np.isfinite(m.values)), name
        assert m.class_index == 1 and m.definition
        assert not m.values.flags.writeable
    if key.startswith("mobilevit"):
        assert names == ("attention", "gradcam", "integrated_gradients", "random")
    else:  # AttnLRP: the transformers ViT, DeiT, DINOv2 and CLIP towers only
        assert names == tuple(n for n in METHODS if n != "attnlrp" or not METHODS[n].unavailable(loaded))


@pytest.mark.parametrize("method", ["rollout", "relevance"])
def test_mobilevit_refuses_rollout_and_relevance_with_the_family_note(method, hier_models):
    loaded = hier_models["mobilevit"]
    note = loaded.family.rollout_note(loaded.config)
    assert note and note in why_unavailable(loaded, method)
    with pytest.raises(MethodError, match="not defined for MobileViT"):
        explain(loaded, random_image(0), method, target=0)


def test_backbones_get_class_agnostic_methods_only(tiny_models):
    loaded = tiny_models["dino"]
    assert available_methods(loaded) == ("attention", "rollout", "random")
    assert explain(loaded, random_image(0), "attention").class_index is None
    with pytest.raises(MethodError, match="backbone without a classifier"):
        explain(loaded, random_image(0), "gradcam", target=0)


def test_default_class_is_the_prediction_and_bad_input_is_refused(tiny_models):
    loaded = tiny_models["vit"]
    image = random_image(2)
    top = capture(loaded, image).predictions[0].index
    assert explain(loaded, image, "gradcam").class_index == top
    assert {m.class_index for m in explain_many(loaded, image, ["gradcam", "random"]).values()} == {top}
    with pytest.raises(MethodError, match="outside"):
        explain(loaded, image, "relevance", target=3)
    with pytest.raises(MethodError, match="unknown explanation method"):
        explain(loaded, image, "saliency")
    assert get_method("integrated_gradients", n_steps=4).n_steps == 4
    assert get_method("integrated_gradients") is METHODS["integrated_gradients"]


def test_place_on_grid_nearest_up_block_average_down():
    v = np.arange(4, dtype=np.float32).reshape(2, 2)
    np.testing.assert_array_equal(place_on_grid(v, (2, 2)), v)
    np.testing.assert_array_equal(place_on_grid(v, (4, 4)), np.kron(v, np.ones((2, 2))))
    # 2 -> 3 rows: target centres 1/6, 1/2, 5/6 lie in source cells 0, 1, 1
    np.testing.assert_array_equal(place_on_grid(v, (3, 2)), v[[0, 1, 1]])
    fine = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(place_on_grid(fine, (2, 2)), fine.reshape(2, 2, 2, 2).mean(axis=(1, 3)))
    # 3 -> 2: source centres 1/6, 1/2, 5/6 fall in target cells 0, 1, 1
    col = np.array([[1.0], [2.0], [4.0]])
    np.testing.assert_allclose(place_on_grid(col, (2, 1))[:, 0], [1.0, 3.0])


def test_pool_to_grid_sums_each_cell_by_hand():
    rng = np.random.default_rng(0)
    pixels = rng.normal(size=(10, 15))  # 3 x 4 cells over 10 x 15 px: uneven cells
    pooled = pool_to_grid(pixels, (3, 4))
    expected = np.zeros((3, 4))
    for y in range(10):
        for x in range(15):
            expected[y * 3 // 10, x * 4 // 15] += pixels[y, x]
    np.testing.assert_allclose(pooled, expected)
    assert cell_of_pixels((3, 4), (10, 15))[9, 14] == 11
