"""vitviz's own Integrated Gradients against captum's (the independent reference): the same numbers, bit for bit.

vitviz does not import captum at run time (``captum.attr`` pulls in matplotlib and
IPython: seconds of the Compare page's first open); the test does, as the reference.
"""

import subprocess
import sys

import numpy as np
import pytest
from conftest import random_image

from vitviz.capture.forward import input_size_for, preprocess
from vitviz.capture.targets import Target
from vitviz.methods.base import class_logits
from vitviz.methods.integrated_gradients import _forward, gauss_legendre, mean_baseline, pixel_attributions

captum_attr = pytest.importorskip("captum.attr")


def _captum(loaded, pixels, hw, target, n_steps, batch_size):
    x = pixels.detach()
    if isinstance(target, int):
        ig, which = captum_attr.IntegratedGradients(lambda b: class_logits(loaded, b, hw)), target
    else:
        ig, which = captum_attr.IntegratedGradients(lambda b: target(_forward(loaded, b, hw))), None
    attr = ig.attribute(x, baselines=mean_baseline(x), target=which, n_steps=n_steps, internal_batch_size=batch_size)
    return attr[0].double().numpy()


@pytest.mark.parametrize(("n_steps", "batch_size"), [(32, 8), (7, 3), (5, 16)])
def test_class_target_equals_captum(tiny_models, n_steps, batch_size):
    loaded, image = tiny_models["vit"], random_image(31, (32, 32))
    hw = input_size_for(loaded, None, image.size)
    pixels, _ = preprocess(loaded, [image], hw)
    ours = pixel_attributions(loaded, pixels, hw, 1, n_steps=n_steps, batch_size=batch_size)
    ref = _captum(loaded, pixels, hw, 1, n_steps, batch_size)
    assert np.abs(ref).max() > 1e-4  # not a trivially zero map
    np.testing.assert_array_equal(ours, ref)


def test_difference_target_equals_captum(tiny_models):
    loaded, image = tiny_models["vit"], random_image(32, (32, 32))
    hw = input_size_for(loaded, None, image.size)
    pixels, _ = preprocess(loaded, [image], hw)
    bound = Target(2, minus=0).bind(loaded)
    ours = pixel_attributions(loaded, pixels, hw, bound, n_steps=9, batch_size=4)
    np.testing.assert_array_equal(ours, _captum(loaded, pixels, hw, bound, 9, 4))


def test_gauss_legendre_is_captums_rule():
    from captum.attr._utils.approximation_methods import approximation_parameters

    step_sizes, alphas = approximation_parameters("gausslegendre")
    for n in (1, 2, 32):
        steps, points = gauss_legendre(n)
        assert steps == step_sizes(n) and points == alphas(n)
    steps, points = gauss_legendre(2)  # by hand: nodes +-1/sqrt(3) on [-1, 1], weights 1
    np.testing.assert_allclose(points, [0.5 - 0.5 / np.sqrt(3), 0.5 + 0.5 / np.sqrt(3)])
    np.testing.assert_allclose(steps, [0.5, 0.5])


def test_explaining_does_not_import_captum():
    code = (
        "import sys; from vitviz.models.load import load_model; from vitviz.methods import explain; "
        "from vitviz.data.shapes import make_sample; "
        "m = explain(load_model('demo', device='cpu'), make_sample(1).image, 'integrated_gradients', n_steps=2); "
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('captum', 'matplotlib', 'IPython')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
