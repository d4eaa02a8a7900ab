"""``integrated_gradients``: completeness, the mean-image baseline and pooling to the grid by hand."""

import numpy as np
import torch
from conftest import random_image

from vitviz.capture.forward import input_size_for, preprocess
from vitviz.methods import explain
from vitviz.methods.integrated_gradients import mean_baseline, pixel_attributions


def test_completeness_the_map_sums_to_the_logit_change(tiny_models):
    loaded, image = tiny_models["vit"], random_image(21, (32, 32))
    pixels, _ = preprocess(loaded, [image], (32, 32))
    base = pixels.mean(dim=(2, 3), keepdim=True).expand_as(pixels)  # per-channel mean image
    torch.testing.assert_close(mean_baseline(pixels), base.contiguous())
    with torch.no_grad():
        fx, fb = loaded.model(pixel_values=pixels).logits[0], loaded.model(pixel_values=base).logits[0]
    for cls in range(3):
        m = explain(loaded, image, "integrated_gradients", target=cls, n_steps=64, batch_size=64)
        change = float(fx[cls] - fb[cls])
        assert abs(change) > 1e-2
        assert abs(float(m.values.astype(np.float64).sum()) - change) < 1e-5  # measured: about 2e-8
        assert "64 steps" in m.definition


def test_pixel_attributions_pooled_to_the_grid_by_hand(hier_models):
    loaded, image = hier_models["swin"], random_image(22, (64, 64))
    hw = input_size_for(loaded, None, image.size)
    pixels, _ = preprocess(loaded, [image], hw)
    attr = pixel_attributions(loaded, pixels, hw, 1, n_steps=6, batch_size=6)  # (3, h, w)
    assert attr.shape == (3, *hw)
    m = explain(loaded, image, "integrated_gradients", target=1, n_steps=6, batch_size=6)
    gh, gw = m.grid
    ph, pw = hw[0] // gh, hw[1] // gw
    by_hand = np.array(
        [[attr[:, r * ph : (r + 1) * ph, c * pw : (c + 1) * pw].sum() for c in range(gw)] for r in range(gh)]
    )
    np.testing.assert_allclose(m.values, by_hand, rtol=1e-5, atol=1e-9)
    assert (m.values < 0).any() and (m.values > 0).any()  # signed
