"""A difference target ("A minus B") is handled in one place (``Target.select`` / ``Target.weights``): every causal
analysis linear in the scores gives, for ``Target.of_class(a, minus=b)``, exactly the difference of its values for
``a`` and for ``b`` (knock-out effects, the fast estimate, the per-patch lens, attribution, activation, pattern and
path patching), on the bundled demo ViT and, for label targets, the bundled demo CLIP."""

from __future__ import annotations

import numpy as np
import pytest

from vitviz import causal as C
from vitviz.capture.targets import Target
from vitviz.data.shapes import make_sample

pytestmark = pytest.mark.usefixtures("one_thread")

A, B = 3, 1  # two classes of the demo ViT


def _close(got, a, b, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(a, np.float64) - b, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def images():
    return make_sample(4).image, make_sample(9).image


def test_knock_out_effects_and_the_estimate(demo_model, images):
    img, _ = images
    d = Target.of_class(A, minus=B)
    for mode in ("zero", "mean"):
        got = C.head_importance(demo_model, img, target=d, mode=mode)
        a = C.head_importance(demo_model, img, target=A, mode=mode)
        b = C.head_importance(demo_model, img, target=B, mode=mode)
        _close(got.effects, a.effects, b.effects)
        assert got.target == d and got.class_index == A
        est = C.fast_estimate(demo_model, img, target=d, mode=mode)
        ea = C.fast_estimate(demo_model, img, target=A, mode=mode)
        eb = C.fast_estimate(demo_model, img, target=B, mode=mode)
        _close(est.effects, ea.effects, eb.effects)
    ko = C.knock_out(demo_model, img, [(0, 1), (2, 3)], mode="zero")
    assert d.select(ko.effect) == pytest.approx(ko.effect[A] - ko.effect[B])


def test_lens_and_attribution(demo_model, images):
    img, _ = images
    d = Target.of_class(A, minus=B)
    lens = C.patch_lens(demo_model, img, target=d)
    _close(lens, C.patch_lens(demo_model, img, target=A), C.patch_lens(demo_model, img, target=B))
    got = C.direct_logit_attribution(demo_model, img, target=d)
    a = C.direct_logit_attribution(demo_model, img, target=A)
    b = C.direct_logit_attribution(demo_model, img, target=B)
    _close(got.heads, a.heads, b.heads, rtol=1e-9, atol=1e-9)
    _close(got.mlps, a.mlps, b.mlps, rtol=1e-9, atol=1e-9)
    assert got.rest == pytest.approx(a.rest - b.rest, rel=1e-9, abs=1e-9)
    assert got.logit == pytest.approx(a.logit - b.logit, rel=1e-6, abs=1e-6)
    assert got.total == pytest.approx(got.logit, rel=1e-4, abs=1e-4)
    arrays, _ = C.causal_arrays(demo_model, img, target=d)
    _close(arrays["head_attribution"], a.heads, b.heads, rtol=1e-9, atol=1e-9)


def test_patching(demo_model, images):
    img_t, img_s = images
    d = Target.of_class(A, minus=B)
    kw = dict(estimate=True, exact=True)
    got = C.activation_patching(demo_model, img_t, img_s, target=d, **kw)
    a = C.activation_patching(demo_model, img_t, img_s, target=A, **kw)
    b = C.activation_patching(demo_model, img_t, img_s, target=B, **kw)
    for name in ("residual", "heads", "residual_estimate", "heads_estimate"):
        _close(getattr(got, name), getattr(a, name), getattr(b, name), rtol=1e-4, atol=1e-5)
    assert got.clean == pytest.approx(a.clean - b.clean, rel=1e-5, abs=1e-5)
    for grid in (C.pattern_patching, C.path_patching):
        g, ga, gb = (grid(demo_model, img_t, img_s, target=t).values for t in (d, A, B))
        _close(g, ga, gb, rtol=1e-4, atol=1e-5)


def test_label_differences_of_a_zero_shot_model(images):
    from vitviz.capture.run import get_run
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import parse_labels

    clip = load_model("demo-clip", device="cpu")
    labels = parse_labels("circle, square, star", clip.text.template)
    img, _ = images
    d = Target.of_label(labels, "square", minus="circle")
    got = C.head_importance(clip, img, target=d, mode="zero")
    a = C.head_importance(clip, img, target=Target.of_label(labels, "square"), mode="zero")
    b = C.head_importance(clip, img, target=Target.of_label(labels, "circle"), mode="zero")
    _close(got.effects, a.effects, b.effects)
    np.testing.assert_array_equal(got.clean_logits, a.clean_logits)  # one Run: the labels' scores
    run = get_run(clip, img, labels=labels)  # the Run's scores are its labels': a target of others is refused
    with pytest.raises(ValueError, match="does not read this run's scores"):
        run.target(Target.of_label(("circle", "star"), 0))
    with pytest.raises(ValueError, match="does not read this run's scores"):
        run.target(Target.of_class(0))
