"""Targets: a class, a zero-shot label, or a difference of two, explained the same way by every method."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_image

from vitviz.capture.forward import preprocess
from vitviz.capture.gradients import explain_targets
from vitviz.capture.targets import Target, TargetError, resolve_target, targets_arrays
from vitviz.methods import METHODS, MethodError, explain, explain_many
from vitviz.methods.gradcam import gradcam_map
from vitviz.models.load import load_model
from vitviz.models.zeroshot import encode_labels, label_target, parse_labels


def test_a_target_is_a_linear_functional_of_the_scores():
    s = np.array([[1.0, 5.0, -2.0], [0.5, 0.25, 4.0]])
    t = Target.of_class(1, minus=2)
    np.testing.assert_allclose(t.select(s), [7.0, -3.75])
    np.testing.assert_allclose(t.weights(3) @ s.T, [7.0, -3.75])
    st = torch.tensor(s, requires_grad=True)
    t.select(st).sum().backward()
    np.testing.assert_allclose(st.grad.numpy(), [[0, 1, -1], [0, 1, -1]])
    assert Target.of_class(2).select(s).tolist() == [-2.0, 4.0]
    assert t.name({0: "a", 1: "b", 2: "c"}) == "b (1) minus c (2)"
    assert Target.of_class(0).name() == "class 0"


def test_labels_keep_their_text_and_unknown_labels_are_refused():
    labels = parse_labels("cat, dog, car")
    t = Target.of_label(labels, "dog", minus="car")
    assert (t.index, t.minus, t.labels) == (1, 2, ("cat", "dog", "car"))
    assert t.prompts == labels.prompts and t.name() == "label 'dog' minus label 'car'"
    arrays = targets_arrays(t)
    assert str(arrays["target_kind"]) == "label" and str(arrays["target_label"]) == "dog"
    assert int(arrays["target_minus"]) == 2 and str(arrays["target_minus_label"]) == "car"
    with pytest.raises(TargetError, match="'bird' is not one of the labels"):
        Target.of_label(labels, "bird")
    with pytest.raises(TargetError, match="two different"):
        Target.of_class(1, minus=1)
    with pytest.raises(TargetError, match="outside"):
        Target(5, labels=("a", "b"))


def test_resolve_keeps_class_indices_working():
    assert resolve_target(2) == Target.of_class(2)
    assert resolve_target(1) == Target.of_class(1)
    assert resolve_target(None, predicted=lambda: 0) == Target.of_class(0)
    assert resolve_target(None, predicted=lambda: None) is None
    with pytest.raises(TargetError):
        resolve_target("cat")


def test_integrated_gradients_of_a_difference_is_the_difference(tiny_models):
    """IG is linear in the function explained (same integration points): map(a - b) = map(a) - map(b)."""
    loaded, image = tiny_models["vit"], random_image(3, (32, 32))
    kw = dict(n_steps=8, batch_size=8)
    a = explain(loaded, image, "integrated_gradients", target=Target.of_class(0), **kw).values.astype(np.float64)
    b = explain(loaded, image, "integrated_gradients", target=2, **kw).values.astype(np.float64)
    d = explain(loaded, image, "integrated_gradients", target=Target.of_class(0, minus=2), **kw)
    assert d.class_index == 0 and d.target == "zero (0) minus two (2)"
    np.testing.assert_allclose(d.values, a - b, rtol=1e-4, atol=1e-6)
    assert np.abs(a - b).max() > 1e-3


def test_gradcam_weights_of_a_difference_by_hand(tiny_models):
    """Grad-CAM of logit[a] - logit[b] by hand: ReLU(A @ mean_t(dy_a/dA - dy_b/dA)) on the last block's input."""
    loaded, image = tiny_models["vit"], random_image(4, (32, 32))
    pixels, _ = preprocess(loaded, [image], (32, 32))
    got = explain(loaded, image, "gradcam", target=Target.of_class(1, minus=0)).values
    x = {}
    h = loaded.model.vit.layers[-1].register_forward_pre_hook(lambda m, a, k: x.update(a=a[0]), with_kwargs=True)
    try:
        with torch.enable_grad():
            p = pixels.clone().requires_grad_(True)
            logits = loaded.model(pixel_values=p).logits[0]
            (g,) = torch.autograd.grad(logits[1] - logits[0], [x["a"]])
    finally:
        h.remove()
    a, g = x["a"][0, 1:].detach().double(), g[0, 1:].double()
    by_hand = torch.relu(a @ g.mean(0)).reshape(4, 4).numpy()
    np.testing.assert_allclose(got, by_hand, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        gradcam_map(loaded, pixels, (32, 32), 1), explain(loaded, image, "gradcam", target=1).values, rtol=1e-6
    )


@pytest.fixture(scope="module")
def clip(modern_dirs):
    return load_model(str(modern_dirs["clip"]), device="cpu")


def test_label_scores_are_the_models_logits_per_image(clip):
    labels = parse_labels("cat, dog, car")
    image = random_image(6, (32, 32))
    pixels, _ = preprocess(clip, [image], (32, 32))
    bound = Target.of_label(labels, "dog", minus="cat").bind(clip)
    tok = clip.text.tokenizer(list(labels.prompts), padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = clip.model(pixel_values=pixels, input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
        out = clip.family.forward(clip.model, clip.family.model_inputs(clip, pixels, (32, 32)))
        got = bound.scores(out)
    torch.testing.assert_close(got, ref.logits_per_image, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bound(out), ref.logits_per_image[:, 1] - ref.logits_per_image[:, 0])


def test_class_specific_methods_explain_a_zero_shot_label(clip):
    labels = parse_labels("cat, dog, car")
    image = random_image(7, (32, 32))
    t = Target.of_label(labels, "car")
    with pytest.raises(MethodError, match="backbone without a classifier"):
        explain(clip, image, "gradcam")
    text = encode_labels(clip.model, clip.text, labels)
    ref_target = label_target(clip.family, clip.model, text[2])  # the page's own label target (zeroshot.py)
    ref = explain_targets(clip, image, {2: ("car", ref_target)})[2].patch_map()
    got = explain(clip, image, "relevance", target=t)
    np.testing.assert_allclose(got.values, ref, rtol=1e-5, atol=1e-7)
    assert got.target == "label 'car'"
    pixels, _ = preprocess(clip, [image], (32, 32))
    cam = gradcam_map(clip, pixels, (32, 32), lambda out: ref_target(out))
    np.testing.assert_allclose(explain(clip, image, "gradcam", target=t).values, cam, rtol=1e-5, atol=1e-7)
    maps = explain_many(clip, image, target=t)
    assert set(maps) == set(METHODS) and all(m.class_index == 2 for m in maps.values())


def test_class_target_out_of_range_and_labels_on_a_classifier_are_refused(tiny_models):
    loaded, image = tiny_models["vit"], random_image(8, (32, 32))
    with pytest.raises(MethodError, match=r"class 7 is outside 0\.\.2"):
        explain(loaded, image, "gradcam", target=Target.of_class(0, minus=7))
    with pytest.raises(MethodError, match="no text tower"):
        explain(loaded, image, "gradcam", target=Target.of_label(["cat", "dog"], "cat"))
