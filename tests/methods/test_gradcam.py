"""``gradcam``: against an independent computation with test-local hooks and ``backward()``."""

import numpy as np
import pytest
import torch
from conftest import random_image

from vitviz.capture.forward import input_size_for, preprocess
from vitviz.methods import explain


def _reference(loaded, image, layer, num_prefix, grid, cls, **forward_kwargs) -> np.ndarray:
    """Grad-CAM by hand: a forward pre-hook keeps the layer's input, ``backward()`` fills its ``.grad``."""
    seen = {}

    def keep(module, args, kwargs):
        seen["x"] = args[0] if args else kwargs["hidden_states"]

    handle = layer.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        pixels, _ = preprocess(loaded, [image], input_size_for(loaded, None, image.size))
        pixels.requires_grad_(True)
        with torch.enable_grad():
            logits = loaded.model(pixel_values=pixels, **forward_kwargs).logits
            x = seen["x"]
            x.retain_grad()
            logits[0, cls].backward()
    finally:
        handle.remove()
    n = grid[0] * grid[1]
    a = x.detach()[0, num_prefix : num_prefix + n]  # (N, C)
    weights = x.grad[0, num_prefix : num_prefix + n].mean(dim=0)  # (C,)
    return torch.relu(a @ weights).reshape(grid).numpy()


@pytest.mark.parametrize(("key", "prefix"), [("vit", 1), ("deit", 2), ("beit", 1)])
def test_plain_models_match_hooks_and_autograd(key, prefix, tiny_models):
    loaded, image = tiny_models[key], random_image(11, (40, 48))
    layer = loaded.model.base_model.layers[-1]
    peaks = []
    for cls in range(3):
        m = explain(loaded, image, "gradcam", target=cls)
        ref = _reference(loaded, image, layer, prefix, m.grid, cls, interpolate_pos_encoding=True)
        np.testing.assert_allclose(m.values, ref, rtol=1e-4, atol=1e-7)
        peaks.append(ref.max())
    assert max(peaks) > 0  # not an all-zero comparison


def test_swin_uses_the_last_block_input_placed_by_nearest_cell(hier_models):
    loaded, image = hier_models["swin"], random_image(12, (64, 64))
    layer = loaded.model.swin.encoder.layers[-1].blocks[-1]
    for cls in range(3):
        m = explain(loaded, image, "gradcam", target=cls)
        assert m.source_grid == (8, 8) and m.grid == (16, 16)
        ref = _reference(loaded, image, layer, 0, (8, 8), cls)
        np.testing.assert_allclose(m.values, np.kron(ref, np.ones((2, 2))), rtol=1e-4, atol=1e-7)


def test_the_last_block_output_would_give_nothing_for_a_cls_model(tiny_models):
    """Why the block's input: the classifier reads CLS only, so the output's patch tokens get no gradient."""
    loaded = tiny_models["vit"]
    seen = {}
    handle = loaded.model.vit.layers[-1].register_forward_hook(lambda mod, args, out: seen.update(y=out))
    try:
        pixels, _ = preprocess(loaded, [random_image(1)], (32, 32))
        pixels.requires_grad_(True)
        with torch.enable_grad():
            logits = loaded.model(pixel_values=pixels).logits
            y = seen["y"][0] if isinstance(seen["y"], tuple) else seen["y"]
            (grad,) = torch.autograd.grad(logits[0, 0], [y])
    finally:
        handle.remove()
    assert torch.all(grad[0, 1:] == 0) and torch.any(grad[0, 0] != 0)
