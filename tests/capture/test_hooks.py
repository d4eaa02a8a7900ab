"""The capture hooks: installed once per model, recording only inside a capture call, safe under threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import HIER_KEYS, random_image

from vitviz.capture.forward import capture
from vitviz.models import hooks
from vitviz.models.load import load_model


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hier_models(hier_dirs):
    return {k: load_model(str(d), device="cpu") for k, d in hier_dirs.items()}


@pytest.mark.parametrize("key", HIER_KEYS)
def test_installed_once_and_silent_outside_a_capture(hier_models, key):
    loaded = hier_models[key]
    sites = hooks.installed_sites(loaded.model)
    assert list(hooks.install(loaded.model, loaded.family).sites) == sites  # a second install is a no-op
    count = _hook_count(loaded.model)
    capture(loaded, random_image(0))
    assert _hook_count(loaded.model) == count
    seen = []

    class Spy:
        def on_attention(self, *a):
            seen.append("a")

        def on_block(self, *a):
            seen.append("b")

    import torch

    from vitviz.capture.forward import input_size_for, preprocess

    pixels, _ = preprocess(loaded, [random_image(0)], input_size_for(loaded))
    with torch.no_grad():
        loaded.model(pixel_values=pixels)  # no recorder set: the hooks stay silent
        assert seen == []
        with hooks.recording(Spy()):
            loaded.model(pixel_values=pixels)
    assert seen.count("a") == seen.count("b") == len(sites)


@pytest.mark.parametrize("key", HIER_KEYS)
def test_sixteen_threads_equal_serial(hier_models, key):
    loaded = hier_models[key]
    images = [random_image(60 + i, size=(48 + 5 * i, 40 + 3 * i)) for i in range(16)]
    alone = [capture(loaded, img, attention_dtype="float32") for img in images]
    with ThreadPoolExecutor(max_workers=16) as pool:
        together = list(pool.map(lambda img: capture(loaded, img, attention_dtype="float32"), images))
    for a, b in zip(alone, together, strict=True):
        assert [x.geometry for x in a.blocks] == [x.geometry for x in b.blocks]
        for x, y in zip(a.blocks, b.blocks, strict=True):
            np.testing.assert_allclose(x.attention, y.attention, atol=1e-6)
            np.testing.assert_allclose(x.distance, y.distance, rtol=1e-5)
        np.testing.assert_allclose(a.logits, b.logits, atol=1e-5)


def test_a_failing_forward_leaves_no_recorder_behind(hier_models):
    loaded = hier_models["cvt"]
    img = random_image(3)
    expected = capture(loaded, img, attention_dtype="float32")
    layer = hooks.installed_sites(loaded.model)[2].block
    original = layer.forward

    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure in block 2")

    layer.forward = broken
    try:
        with pytest.raises(RuntimeError, match="simulated"):
            capture(loaded, img)
    finally:
        layer.forward = original
    assert hooks.current() is None
    again = capture(loaded, img, attention_dtype="float32")
    for x, y in zip(again.blocks, expected.blocks, strict=True):
        np.testing.assert_array_equal(x.attention, y.attention)
