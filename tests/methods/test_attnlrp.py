"""AttnLRP: conservation (the paper's property) on tiny random ViTs and CLIPs, and the shared model untouched.

With every bias, CLS token and position embedding set to zero, nothing but the softmaxes
absorbs relevance, so the map over the input pixels sums to the explained logit exactly
(CP-LRP) or to the logit minus what the softmaxes absorbed (AttnLRP; the ledger adds that
up from the gradients at each softmax's input and output). Tolerance: 1e-4 relative,
float32 models.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from conftest import random_image, save_tiny

from vitviz.capture.forward import capture
from vitviz.methods import METHODS, MethodError, explain
from vitviz.methods.attnlrp import relevance
from vitviz.methods.base import Inputs, class_logits
from vitviz.models.load import load_model
from vitviz.models.zeroshot import encode_labels, parse_labels

pytestmark = pytest.mark.usefixtures("one_thread")

ADDITIVE = ("bias", "position_embedding", "cls_token", "class_embedding")


def _zero_additive(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(a in name for a in ADDITIVE):
                p.zero_()


def _random_additive(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(a in name for a in ADDITIVE):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


def _tiny_clip_classifier(folder):
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    config = tf.CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4),
        vision_config={**vision, "image_size": 32, "patch_size": 8},
        projection_dim=24,
        id2label={0: "a", 1: "b", 2: "c"},
        label2id={"a": 0, "b": 1, "c": 2},
    )
    torch.manual_seed(0)
    tf.CLIPForImageClassification(config).save_pretrained(folder)
    tf.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    return load_model(str(save_tiny("vit", tmp_path_factory.mktemp("lrp") / "vit")), device="cpu")


@pytest.fixture(scope="module")
def clip_classifier(tmp_path_factory):
    return load_model(str(_tiny_clip_classifier(tmp_path_factory.mktemp("lrp") / "clip")), device="cpu")


def _check_conservation(loaded, **target):
    inputs = Inputs(loaded, random_image(3))
    x = inputs.pixels()
    for variant in ("cp", "attnlrp"):
        r = relevance(loaded, x, inputs.input_size, variant=variant, ledger=True, **target)
        assert r.attention_calls > 0
        total = r.pixels.sum() + r.softmax_absorbed
        assert total == pytest.approx(r.target, rel=1e-4, abs=1e-6), variant
        if variant == "cp":
            assert r.softmax_absorbed == 0.0
        else:
            assert abs(r.softmax_absorbed) > 1e-4 * abs(r.target)  # the ledger is not trivially zero
    return inputs, x


def test_vit_relevance_conserves_the_logit(vit):
    _zero_additive(vit.model)
    inputs, x = _check_conservation(vit, target=1)
    with torch.no_grad():
        logit = float(class_logits(vit, x, inputs.input_size)[0, 1])
    r = relevance(vit, x, inputs.input_size, target=1)
    assert r.target == pytest.approx(logit, rel=1e-5)  # the rules change the backward only
    assert r.attention_calls == vit.config.num_hidden_layers


def test_clip_classifier_relevance_conserves_the_logit(clip_classifier):
    _zero_additive(clip_classifier.model)
    _check_conservation(clip_classifier, target=2)


def test_zero_shot_clip_label_score_is_conserved():
    loaded = load_model("demo-clip", device="cpu")  # a fresh copy: the zeroing stays in this test
    _zero_additive(loaded.model)
    text = encode_labels(loaded.model, loaded.text, parse_labels("cat, dog"))
    _check_conservation(loaded, label_embedding=text[1])


def test_biases_absorb_relevance_so_the_check_can_fail(tmp_path):
    loaded = load_model(str(save_tiny("vit", tmp_path / "vit")), device="cpu")
    _random_additive(loaded.model)
    inputs = Inputs(loaded, random_image(3))
    r = relevance(loaded, inputs.pixels(), inputs.input_size, target=0, variant="cp", ledger=True)
    assert abs(r.pixels.sum() - r.target) > 1e-3 * max(1.0, abs(r.target))


def test_the_shared_model_is_untouched_and_the_map_sums_the_pixels(vit):
    before = {n: p.detach().clone() for n, p in vit.model.named_parameters()}
    implementation = vit.config._attn_implementation
    image = random_image(4)
    m = explain(vit, image, "attnlrp", target=0)
    assert vit.config._attn_implementation == implementation
    assert all(torch.equal(before[n], p) for n, p in vit.model.named_parameters())
    assert all(p.grad is None for p in vit.model.parameters())
    inputs = Inputs(vit, image)
    r = relevance(vit, inputs.pixels(), inputs.input_size, target=0)
    assert m.values.shape == inputs.grid and m.values.sum() == pytest.approx(r.pixels.sum(), rel=1e-4, abs=1e-6)
    assert len(capture(vit, image).blocks) == vit.config.num_hidden_layers  # captures still work after it


def test_unsupported_family_and_bad_targets_get_messages(vit):
    swin = load_model("demo-swin", device="cpu")
    assert "ViT, DeiT, DINOv2 (without registers) and CLIP" in METHODS["attnlrp"].unavailable(swin)
    with pytest.raises(MethodError, match=r"ViT, DeiT, DINOv2 \(without registers\) and CLIP"):
        explain(swin, random_image(0), "attnlrp", target=0)
    inputs = Inputs(vit, random_image(0))
    with pytest.raises(MethodError, match="one target"):
        relevance(vit, inputs.pixels(), inputs.input_size)
    assert np.isfinite(relevance(vit, inputs.pixels(), inputs.input_size, target=0).pixels).all()


def test_threads_sharing_the_model_get_their_own_rules(vit):
    import threading

    inputs = Inputs(vit, random_image(6))
    x, hw = inputs.pixels(), inputs.input_size
    alone = {v: relevance(vit, x, hw, target=0, variant=v).pixels for v in ("cp", "attnlrp")}
    got: dict = {}

    def work(variant: str) -> None:
        for _ in range(3):
            got.setdefault(variant, []).append(relevance(vit, x, hw, target=0, variant=variant).pixels)

    threads = [threading.Thread(target=work, args=(v,)) for v in ("cp", "attnlrp")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not np.allclose(alone["cp"], alone["attnlrp"])  # the two variants differ, so a mix-up would show
    for v in ("cp", "attnlrp"):
        assert len(got[v]) == 3 and all(np.allclose(g, alone[v], rtol=1e-5, atol=1e-8) for g in got[v])


def test_label_targets_and_differences_through_the_method_interface():
    from vitviz.capture.targets import Target

    loaded = load_model("demo-clip", device="cpu")
    labels = parse_labels("cat, dog, car")
    image = random_image(7)
    one = {k: explain(loaded, image, "attnlrp", target=Target.of_label(labels, k)).values for k in ("cat", "dog")}
    diff = explain(loaded, image, "attnlrp", target=Target.of_label(labels, "cat", minus="dog"))
    assert diff.target == "label 'cat' minus label 'dog'"
    # gradient x input is linear in the explained value: the map of a difference is the difference of the maps
    np.testing.assert_allclose(diff.values, one["cat"] - one["dog"], rtol=1e-4, atol=1e-6)
    inputs = Inputs(loaded, image)
    text = encode_labels(loaded.model, loaded.text, labels)
    r = relevance(loaded, inputs.pixels(), inputs.input_size, label_embedding=text[0])
    assert one["cat"].sum() == pytest.approx(r.pixels.sum(), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("key", ["deit", "dinov2"])
def test_deit_and_dinov2_classifiers_conserve_too(key, tmp_path):
    from conftest import TINY

    if key == "deit":
        folder = save_tiny("deit", tmp_path / key)
    else:  # a DINOv2 with a classifier (layer scales on the residual branches)
        config = tf.Dinov2Config(**{**TINY, "patch_size": 4}, num_labels=3)
        torch.manual_seed(0)
        tf.Dinov2ForImageClassification(config).save_pretrained(tmp_path / key)
        tf.ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(tmp_path / key)
        folder = tmp_path / key
    loaded = load_model(str(folder), device="cpu")
    _zero_additive(loaded.model)
    _check_conservation(loaded, target=1)
    swiglu = load_model(str(folder), device="cpu")
    swiglu.config.use_swiglu_ffn = True  # a config flag only: the message is what is checked
    assert "SwiGLU" in METHODS["attnlrp"].unavailable(swiglu)
