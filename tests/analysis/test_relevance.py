import numpy as np
import pytest
import torch
from conftest import random_image

from vitviz.analysis.relevance import chefer_relevance
from vitviz.capture.forward import input_size_for, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.errors import CaptureError


def test_one_layer_hand_computed():
    a = np.array([[[[0.5, 0.5], [0.2, 0.8]]]])
    g = np.array([[[[1.0, -1.0], [2.0, 0.5]]]])
    # G*A = [[.5, -.5], [.4, .4]] -> clamp -> R = I + that
    np.testing.assert_allclose(chefer_relevance(a, g), [[1.5, 0.0], [0.4, 1.4]])


def test_two_layers_hand_computed_and_heads_averaged():
    a1 = np.array([[[0.5, 0.5], [0.2, 0.8]], [[1.0, 0.0], [0.0, 1.0]]])
    g1 = np.array([[[1.0, -1.0], [2.0, 0.5]], [[1.0, 1.0], [1.0, 1.0]]])
    abar1 = np.array([[0.75, 0.0], [0.2, 0.7]])  # mean of [[.5,0],[.4,.4]] and I
    a2 = np.full((2, 2, 2), 0.5)
    g2 = np.ones((2, 2, 2))
    abar2 = np.full((2, 2), 0.5)
    r1 = np.eye(2) + abar1
    expected = r1 + abar2 @ r1
    np.testing.assert_allclose(chefer_relevance(np.stack([a1, a2]), np.stack([g1, g2])), expected)


def _torch_reference(loaded, image, cls: int, pooled: bool = False, start_layer: int = 0) -> np.ndarray:
    """Independent route: retain_grad + backward() on the attentions, relevance rolled in torch.

    The row read out: CLS, or the mean of the patch rows where the classifier mean-pools (BEiT).
    """
    pixels, _ = preprocess(loaded, [image], input_size_for(loaded))
    pixels.requires_grad_(True)
    out = loaded.model(pixel_values=pixels, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    out.logits[0, cls].backward()
    t = out.attentions[0].shape[-1]
    r = torch.eye(t, dtype=torch.float64)
    start_layer = start_layer % len(out.attentions)
    for i, a in enumerate(out.attentions):  # MM-Explainability's interpret(start_layer=...)
        if i < start_layer:
            continue
        cam = (a.grad[0].double() * a[0].detach().double()).clamp(min=0).mean(0)
        r = r + cam @ r
    p = len(loaded.family.prefix_kinds(loaded.config))
    return (r[p:].mean(0) if pooled else r[0]).numpy()


@pytest.mark.parametrize("key", ["vit", "deit", "beit"])
def test_matches_independent_torch_implementation(tiny_models, key):
    loaded = tiny_models[key]
    img = random_image(4)
    got = explain_classes(loaded, img, [2, 0])
    pooled = key == "beit"  # BEiT's classifier mean-pools the patch tokens
    assert got[2].readout == ("pooled query" if pooled else "CLS")
    for c in (2, 0):
        ref = _torch_reference(loaded, img, c, pooled)
        np.testing.assert_allclose(got[c].relevance, ref, rtol=1e-4, atol=1e-6)
    assert got[2].patch_map().shape == (4, 4)
    assert not np.allclose(got[2].relevance, got[0].relevance)  # really class-specific
    assert all(p.grad is None for p in loaded.model.parameters())  # shared model untouched


@pytest.mark.parametrize("key", ["vit", "beit"])
def test_relevance_from_a_later_block_matches_mm_explainability_start_layer(tiny_models, key):
    from vitviz.methods import explain

    loaded, img, pooled = tiny_models[key], random_image(5), key == "beit"
    n = loaded.config.num_hidden_layers
    everything = explain_classes(loaded, img, [1])[1].relevance
    np.testing.assert_array_equal(explain_classes(loaded, img, [1], start_block=0)[1].relevance, everything)
    for k in (1, n - 1, -1):
        got = explain_classes(loaded, img, [1], start_block=k)[1]
        np.testing.assert_allclose(got.relevance, _torch_reference(loaded, img, 1, pooled, k), rtol=1e-4, atol=1e-6)
        assert got.start_block == k % n
    last = explain_classes(loaded, img, [1], start_block=-1)[1].relevance
    assert not np.allclose(last, everything)
    m = explain(loaded, img, "relevance", target=1, from_block=-1)
    np.testing.assert_array_equal(m.values, explain_classes(loaded, img, [1], start_block=-1)[1].patch_map())
    assert "from block -1 (counted from the end" in m.definition
    for bad in (n, -n - 1):
        with pytest.raises(CaptureError, match=f"0..{n - 1}"):
            explain_classes(loaded, img, [1], start_block=bad)


def test_backbone_without_classifier_is_refused(tiny_models):
    with pytest.raises(CaptureError, match="classifier"):
        explain_classes(tiny_models["dino"], random_image(0), [0])


def test_bad_class_index(tiny_models):
    with pytest.raises(ValueError):
        explain_classes(tiny_models["vit"], random_image(0), [7])
