"""Attention-pattern patching and path patching against naive references written here from plain forward hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_image

from vitviz.capture.forward import input_size_for, preprocess
from vitviz.causal.paths import HeadPatchingCancelled, path_patching, pattern_patching
from vitviz.models.load import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _pixels(loaded, img):
    hw = input_size_for(loaded, None, img.size)
    return preprocess(loaded, [img], hw)[0], hw


def _layers(loaded):
    return list(
        loaded.model.base_model.layers
        if hasattr(loaded.model.base_model, "layers")
        else loaded.model.base_model.encoder.layer
    )


def _logits(loaded, pixels, hw, hooks=()):
    handles = [register() for register in hooks]
    try:
        with torch.no_grad():
            fam = loaded.family
            return fam.forward(loaded.model, fam.model_inputs(loaded, pixels, hw)).logits[0]
    finally:
        for h in handles:
            h.remove()


def _split(x, heads):
    b, t, _ = x.shape
    return x.reshape(b, t, heads, -1).transpose(1, 2)


def _probs(att, x, heads):
    q, k = _split(att.q_proj(x), heads), _split(att.k_proj(x), heads)
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)


def _record_patterns(loaded, pixels, hw):
    """Every block's probabilities (1, H, T, T), recomputed by plain hooks from the module's own projections."""
    heads = loaded.model.config.num_attention_heads
    got = {}

    def hook(i):
        def f(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            got[i] = _probs(module, x, heads)

        return f

    layers = _layers(loaded)
    _logits(
        loaded,
        pixels,
        hw,
        [
            lambda i=i, layer=layer: layer.attention.register_forward_hook(hook(i), with_kwargs=True)
            for i, layer in enumerate(layers)
        ],
    )
    return got


def _with_pattern(loaded, pixels, hw, layer, head, pattern):
    heads = loaded.model.config.num_attention_heads

    def hook(module, args, kwargs, output):
        x = args[0] if args else kwargs["hidden_states"]
        b, t, _ = x.shape
        a = _probs(module, x, heads).clone()
        a[:, head] = pattern[:, head]
        z = (a @ _split(module.v_proj(x), heads)).transpose(1, 2).reshape(b, t, -1)
        return (module.o_proj(z), a)

    att = _layers(loaded)[layer].attention
    return _logits(loaded, pixels, hw, [lambda: att.register_forward_hook(hook, with_kwargs=True)])


def test_pattern_patching_equals_the_naive_reference(tiny_models):
    loaded = tiny_models["vit"]
    tgt, src = random_image(21), random_image(22)
    got = pattern_patching(loaded, tgt, src, target=1)
    pt, hw = _pixels(loaded, tgt)
    ps, _ = _pixels(loaded, src)
    source_patterns = _record_patterns(loaded, ps, hw)
    clean = _logits(loaded, pt, hw)
    assert got.clean == pytest.approx(float(clean[1]), abs=1e-5)
    assert got.source == pytest.approx(float(_logits(loaded, ps, hw)[1]), abs=1e-5)
    for layer in range(2):
        for head in range(4):
            ref = _with_pattern(loaded, pt, hw, layer, head, source_patterns[layer])
            assert got.values[layer, head] == pytest.approx(float(ref[1]), abs=2e-5), (layer, head)
    assert got.complete and got.kind == "pattern"
    assert got.forward_equivalents == pytest.approx(2 + 4 * (2 + 1) / 2)  # two clean runs + H (L + 1) / 2
    assert np.ptp(got.values) > 1e-4  # the grid is not flat: the check can fail


def _tiny_dinov2_classifier(tmp_path):
    from transformers import Dinov2Config, Dinov2ForImageClassification, ViTImageProcessor

    torch.manual_seed(3)
    cfg = Dinov2Config(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        id2label={0: "a", 1: "b", 2: "c"},
        label2id={"a": 0, "b": 1, "c": 2},
    )
    model = Dinov2ForImageClassification(cfg)
    with torch.no_grad():  # random layer scales: the path's change is scaled by them, a check that can fail
        for layer in model.dinov2.encoder.layer:
            layer.layer_scale1.lambda1.uniform_(0.5, 2.0)
            layer.layer_scale2.lambda1.uniform_(0.5, 2.0)
    model.save_pretrained(tmp_path, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    return load_model(str(tmp_path), device="cpu")


def _record(loaded, pixels, hw):
    """Each block's head outputs z (the output projection's input) and the last block's output, by plain hooks."""
    got = {}
    hooks = []
    layers = _layers(loaded)
    for i, layer in enumerate(layers):
        hooks.append(
            lambda i=i, layer=layer: layer.attention.o_proj.register_forward_pre_hook(
                lambda m, a: got.update({("z", i): a[0]})
            )
        )
    hooks.append(
        lambda: layers[-1].register_forward_hook(
            lambda m, a, o: got.update({"last": o[0] if isinstance(o, tuple) else o})
        )
    )
    _logits(loaded, pixels, hw, hooks)
    return got


def _readout(loaded, x):
    model = loaded.model
    normed = model.base_model.layernorm(x)
    if (
        hasattr(model.base_model, "encoder")
        and hasattr(model, "classifier")
        and model.classifier.in_features == 2 * x.shape[-1]
    ):
        return model.classifier(torch.cat((normed[:, 0], normed[:, 1:].mean(1)), dim=-1))[0]  # DINOv2
    return model.classifier(normed[:, 0])[0]


@pytest.mark.parametrize("which", ["vit", "dinov2"])
def test_path_patching_to_the_readout_equals_the_naive_reference(tiny_models, tmp_path, which):
    loaded = tiny_models["vit"] if which == "vit" else _tiny_dinov2_classifier(tmp_path)
    tgt, src = random_image(23), random_image(24)
    got = path_patching(loaded, tgt, src, target=2)
    pt, hw = _pixels(loaded, tgt)
    ps, _ = _pixels(loaded, src)
    a, b = _record(loaded, pt, hw), _record(loaded, ps, hw)
    layers = _layers(loaded)
    heads = loaded.model.config.num_attention_heads
    with torch.no_grad():
        for layer, block in enumerate(layers):
            w = block.attention.o_proj.weight
            d = w.shape[1] // heads
            scale = block.layer_scale1.lambda1 if hasattr(block, "layer_scale1") else 1.0
            for head in range(heads):
                cols = slice(head * d, (head + 1) * d)
                delta = (b[("z", layer)][..., cols] - a[("z", layer)][..., cols]) @ w[:, cols].T * scale
                ref = _readout(loaded, a["last"] + delta)[2]
                assert got.values[layer, head] == pytest.approx(float(ref), abs=2e-5), (which, layer, head)
    n = len(layers)
    assert got.forward_equivalents <= 2 + n * heads
    assert np.ptp(got.values) > 1e-4


def test_path_patching_to_a_receiver_equals_the_naive_reference(tiny_models):
    """Sender (0, h) to the query of head 3 in block 1: the naive reference freezes block 0's MLP by a plain hook,
    records block 1's queries, then replaces only head 3's query columns in a clean forward."""
    loaded = tiny_models["vit"]
    tgt, src = random_image(25), random_image(26)
    got = path_patching(loaded, tgt, src, target=0, receivers=[(1, 3, "q")])
    pt, hw = _pixels(loaded, tgt)
    ps, _ = _pixels(loaded, src)
    layers = _layers(loaded)
    clean_mlp = {}
    _logits(loaded, pt, hw, [lambda: layers[0].mlp.register_forward_hook(lambda m, a, o: clean_mlp.update({0: o}))])
    src_z = _record(loaded, ps, hw)[("z", 0)]
    d = src_z.shape[-1] // 4
    for head in range(4):
        cols = slice(head * d, (head + 1) * d)
        seen = {}

        def patch_z(m, a, cols=cols):
            z = a[0].clone()
            z[..., cols] = src_z[..., cols]
            return (z,)

        _logits(
            loaded,
            pt,
            hw,
            [
                lambda: layers[0].attention.o_proj.register_forward_pre_hook(patch_z),
                lambda: layers[0].mlp.register_forward_hook(lambda m, a, o: clean_mlp[0]),
                lambda seen=seen: layers[1].attention.q_proj.register_forward_hook(
                    lambda m, a, o: seen.update({"q": o})
                ),
            ],
        )

        def patch_q(m, a, o, seen=seen):
            out = o.clone()
            out[..., 3 * d : 4 * d] = seen["q"][..., 3 * d : 4 * d]
            return out

        ref = _logits(loaded, pt, hw, [lambda: layers[1].attention.q_proj.register_forward_hook(patch_q)])
        assert got.values[0, head] == pytest.approx(float(ref[0]), abs=2e-5), head
    assert np.all(np.isnan(got.values[1]))  # senders in the receiver's block or later are not defined
    assert got.receivers == ((1, 3, "q"),)


def test_bounds_cancel_and_refusals(tiny_models, hier_dirs):
    loaded = tiny_models["vit"]
    tgt, src = random_image(27), random_image(28)
    capped = pattern_patching(loaded, tgt, src, target=0, chunk=2, max_work=4.0 * 17)  # 17 tokens: 4 fwd-eq
    assert not capped.complete and "capped" in capped.notes and np.isnan(capped.values).any()
    assert not np.isnan(capped.values[0, :2]).any()
    with pytest.raises(HeadPatchingCancelled) as exc:
        path_patching(loaded, tgt, src, target=0, cancel=lambda: True)
    assert np.isnan(exc.value.partial.values).all()
    with pytest.raises(ValueError, match="receiver"):
        path_patching(loaded, tgt, src, receivers=[(5, 0, "q")])
    held = []

    class Slot:
        def __enter__(self):
            held.append(1)

        def __exit__(self, *a):
            return False

    pattern_patching(loaded, tgt, src, target=0, chunk=1, slot=Slot)
    assert len(held) == 8  # one slot per batch: other visitors' forwards run between them
    from vitviz.causal.notes import NotDefined

    mv2 = load_model(str(hier_dirs["mobilevitv2"]), device="cpu")
    with pytest.raises(NotDefined, match=r"Path patching .* no .*attn\.z point"):
        path_patching(mv2, random_image(1, size=(128, 128)), random_image(2, size=(128, 128)))
