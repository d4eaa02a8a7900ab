"""The hybrid ViT (vitviz.zoo.hybrid and its family adapter) on tiny checkpoints in the JAX code's layout.

The model's logits are checked against the JAX code's forward in ``tests/zoo/test_vit_npz.py``;
here every view reads the converted model: attention recomputed from each block's own q and k
weights (test-local hooks), rollout and relevance against the brute-force references, Grad-CAM on
the last CNN stage against gradients taken here, knock-outs against a test-local edit of the
projection's input, the logit lens and attribution, the position table on the feature grid, and
the token sequence's account of what a token is.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_image
from jax_vit import tiny_arrays, write_npz
from reference import relevance_reference, rollout_reference

from vitviz import causal as C
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.capture.run import get_run
from vitviz.methods import MethodError, available_methods, explain, get_method, why_unavailable
from vitviz.models.load import load_model
from vitviz.zoo.hybrid import (
    HybridViTConfig,
    HybridViTForImageClassification,
    HybridViTModel,
    receptive_field,
    token_grid,
    total_stride,
)
from vitviz.zoo.vit_npz import convert_vit_npz

pytestmark = pytest.mark.usefixtures("one_thread")

SIDE = 32  # the tiny hybrid: ResNet (1, 2) units, stride 8, a 4 x 4 grid at 32 px


def save_tiny_hybrid(folder: Path, *, seed: int = 0, representation: int | None = None) -> Path:
    """A tiny R?+ViT in the JAX layout (ResNet (1, 2), width 32, 2 blocks of 4 heads, 3 classes), converted."""
    arrays = tiny_arrays(seed=seed, resnet=(1, 2), patch=1, grid=4, classes=3, representation=representation)
    path = write_npz(folder.parent / f"{folder.name}.npz", arrays)
    convert_vit_npz(path, folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(str(save_tiny_hybrid(tmp_path_factory.mktemp("hybrid") / "tiny")), device="cpu")


@pytest.fixture(scope="module")
def tiny_rep(tmp_path_factory):
    folder = save_tiny_hybrid(tmp_path_factory.mktemp("hybrid-rep") / "tiny", seed=1, representation=16)
    return load_model(str(folder), device="cpu")


# --- the model's arithmetic ----------------------------------------------------------------------------------


def _r50(**kw) -> HybridViTConfig:
    return HybridViTConfig(resnet_depths=(3, 4, 9), **kw)


def test_strides_grids_and_the_published_configurations():
    r50 = _r50()
    assert (
        total_stride(r50) == 16 and token_grid(r50, (384, 384)) == (24, 24) and token_grid(r50, (224, 224)) == (14, 14)
    )
    r26 = HybridViTConfig(resnet_depths=(2, 2, 2, 2), hidden_size=384, num_attention_heads=6, intermediate_size=1536)
    assert total_stride(r26) == 32 and token_grid(r26, (384, 384)) == (12, 12)
    stem = HybridViTConfig(resnet_depths=(), patch_size=8)  # R+ViT-Ti/16: the root alone, 8 x 8 cells per token
    assert total_stride(stem) == 32 and token_grid(stem, (224, 224)) == (7, 7)
    assert total_stride(HybridViTConfig(resnet_depths=None, patch_size=16)) == 16
    with torch.device("meta"):  # the R50's parameter shapes, no memory
        model = HybridViTForImageClassification(_r50(num_labels=1000))
    emb = model.vit.embeddings
    assert emb.projection.weight.shape == (768, 1024, 1, 1) and len(emb.backbone.encoder.stages) == 3
    assert [len(s.layers) for s in emb.backbone.encoder.stages] == [3, 4, 9]
    assert emb.position_embeddings.shape == (1, 1 + 14 * 14, 768)


@pytest.mark.parametrize("side", [32, 40, 44, 57])
def test_the_token_grid_is_the_feature_map_the_model_computes(tiny, side):
    with torch.no_grad():
        out = tiny.model(pixel_values=torch.zeros(1, 3, side, side + 8), output_feature_map=True)
    assert tuple(out.feature_map.shape[-2:]) == token_grid(tiny.config, (side, side + 8))


def _rf_from_modules(model: HybridViTModel | HybridViTForImageClassification) -> int:
    """The receptive field composed from the built modules' own kernels and strides (root conv, max-pool, each
    unit's 3 x 3 convolution, the patch projection): ``rf = (rf - 1) * stride + k``, output to input."""
    emb = model.base_model.embeddings
    bb = emb.backbone
    layers = [bb.embedder.convolution, bb.embedder.pooler]
    layers += [unit.conv2 for stage in bb.encoder.stages for unit in stage.layers]
    layers.append(emb.projection)
    rf = 1
    for m in reversed(layers):
        k, s = m.kernel_size, m.stride
        k, s = (k[0] if isinstance(k, tuple) else k), (s[0] if isinstance(s, tuple) else s)
        rf = (rf - 1) * s + k
    return rf


def test_the_receptive_field_composes_the_layers(tiny):
    assert receptive_field(tiny.config) == _rf_from_modules(tiny.model) == 43
    with torch.device("meta"):
        r50 = HybridViTModel(_r50())
    assert receptive_field(r50.config) == _rf_from_modules(r50) == 363


def test_registration_is_idempotent_and_auto_classes_build_the_model():
    from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

    from vitviz.zoo import hybrid

    hybrid._register()
    cfg = AutoConfig.for_model(
        "hybrid_vit",
        resnet_depths=(1,),
        resnet_width=8,
        num_groups=4,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        image_size=16,
    )
    assert isinstance(AutoModelForImageClassification.from_config(cfg), HybridViTForImageClassification)
    assert isinstance(AutoModel.from_config(cfg), HybridViTModel)
    with pytest.raises(ValueError, match="multiple of 8"):
        HybridViTConfig(resnet_width=12)


# --- attention, rollout, relevance -------------------------------------------------------------------------


def _reference_run(model, pixels: torch.Tensor, grad: bool = False):
    """Each block's probabilities from its own q and k projections (a hook on the attention's input), and the live
    probabilities each block multiplied with v (a hook on its output), independent of vitviz."""
    recomputed, live = [], []

    def before(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        b, t, d = x.shape
        h = module.num_attention_heads
        q = module.q_proj(x).reshape(b, t, h, -1).transpose(1, 2)
        k = module.k_proj(x).reshape(b, t, h, -1).transpose(1, 2)
        recomputed.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), dim=-1).detach())

    def after(module, args, output):
        live.append(output[1])

    attns = [layer.attention for layer in model.base_model.layers]
    handles = [a.register_forward_pre_hook(before, with_kwargs=True) for a in attns]
    handles += [a.register_forward_hook(after) for a in attns]
    try:
        with torch.enable_grad() if grad else torch.no_grad():
            out = model(pixel_values=pixels.clone().requires_grad_(grad))
    finally:
        for handle in handles:
            handle.remove()
    return out, recomputed, live


def test_every_captured_attention_is_what_the_blocks_computed(tiny):
    img = random_image(3, (50, 40))
    cap = capture(tiny, img, attention_dtype="float32")
    assert cap.family == "Hybrid ViT" and cap.grid == (4, 4) and cap.prefix_kinds == ("CLS",)
    assert cap.patch_size == 8 and cap.input_size == (SIDE, SIDE) and cap.readout == "cls"
    assert cap.attentions.shape == (2, 4, 17, 17)
    pixels, _ = preprocess(tiny, [img], (SIDE, SIDE))
    out, probs, _ = _reference_run(tiny.model, pixels)
    for i, p in enumerate(probs):
        np.testing.assert_allclose(cap.blocks[i].attention, p[0].numpy(), atol=1e-6)
    assert max(float(p.max()) for p in probs) > 0.5  # peaked: a wrong key order would not pass
    np.testing.assert_allclose(cap.logits, out.logits[0].numpy(), atol=1e-5)


def test_another_input_size_runs_on_the_map_of_that_size(tiny):
    cap = capture(tiny, random_image(4), size=(48, 64), attention_dtype="float32")
    assert cap.input_size == (48, 64) and cap.grid == (6, 8) and cap.num_tokens == 1 + 48
    pixels, _ = preprocess(tiny, [random_image(4)], (48, 64))
    _, probs, _ = _reference_run(tiny.model, pixels)
    np.testing.assert_allclose(cap.blocks[1].attention, probs[1][0].numpy(), atol=1e-5)


def test_rollout_and_relevance_follow_the_definitions(tiny):
    img, c = random_image(5), 2
    cap = capture(tiny, img, attention_dtype="float32")
    row, stage = capture_rollout(cap)
    dense = [cap.blocks[i].attention.astype(np.float64).mean(axis=0) for i in range(2)]
    readout = np.zeros(17)
    readout[0] = 1.0  # the CLS row
    np.testing.assert_allclose(row, rollout_reference(dense, [0, 0], {}, readout), rtol=1e-5, atol=1e-7)
    assert stage == 0 and row.shape == (17,)
    pixels, _ = preprocess(tiny, [img], (SIDE, SIDE))
    out, _, live = _reference_run(tiny.model, pixels, grad=True)
    grads = torch.autograd.grad(out.logits[0, c], live)
    abar = [(g * a).clamp(min=0).mean(dim=1)[0].detach().double().numpy() for g, a in zip(grads, live, strict=True)]
    want = relevance_reference(abar, [0, 0], {}, readout)
    got = explain_classes(tiny, img, [c])[c]
    np.testing.assert_allclose(got.relevance, want, rtol=1e-4, atol=1e-7)
    assert np.abs(want[1:]).max() > 0


# --- methods -------------------------------------------------------------------------------------------------


def test_every_method_gives_a_map_on_the_token_grid_and_attnlrp_says_why_not(tiny):
    names = available_methods(tiny)
    assert {"attention", "rollout", "relevance", "gradcam", "integrated_gradients", "random"} <= set(names)
    assert "attnlrp" not in names and "hybrid_vit" in why_unavailable(tiny, "attnlrp")
    img = random_image(6)
    for name in names:
        m = explain(tiny, img, name, target=1)
        assert m.grid == (4, 4) and np.isfinite(m.values).all(), name
    cnn = explain(tiny, img, "gradcam", target=1, layer="cnn")
    assert cnn.grid == (4, 4) and cnn.source_grid == (4, 4) and "CNN stage" in cnn.definition


def test_gradcam_on_the_last_cnn_stage_is_gradcam_of_the_resnet_map(tiny):
    """Against the map the patch projection read, and its gradient, taken here (a hook on the projection)."""
    img, c = random_image(7), 0
    pixels, _ = preprocess(tiny, [img], (SIDE, SIDE))
    kept = {}

    def keep(module, args):
        kept["a"] = args[0]

    handle = tiny.model.vit.embeddings.projection.register_forward_pre_hook(keep)
    try:
        with torch.enable_grad():
            out = tiny.model(pixel_values=pixels.clone().requires_grad_(True))
            (g,) = torch.autograd.grad(out.logits[0, c], [kept["a"]])
    finally:
        handle.remove()
    a = kept["a"][0].detach().double()
    w = g[0].double().mean(dim=(1, 2))
    want = torch.relu((w[:, None, None] * a).sum(0)).numpy()
    got = explain(tiny, img, "gradcam", target=c, layer="cnn").values
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert want.max() > 0
    tokens = explain(tiny, img, "gradcam", target=c).values  # the other layer: another map
    assert not np.allclose(tokens, got)


def test_gradcam_on_a_cnn_stage_is_refused_where_there_is_none(tiny_models, tiny_rep, tmp_path):
    gc = get_method("gradcam", layer="cnn")
    assert "no CNN feature map" in why_unavailable(tiny_models["vit"], gc)
    with pytest.raises(MethodError, match="no CNN feature map"):
        explain(tiny_models["vit"], random_image(0, (32, 32)), gc, target=0)
    assert not why_unavailable(tiny_rep, gc)  # the tiny_rep fixture has a ResNet
    arrays = tiny_arrays(seed=3, representation=8)  # a plain ViT with pre_logits: the zoo class, no ResNet
    convert_vit_npz(write_npz(tmp_path / "plain.npz", arrays), tmp_path / "plain")
    plain = load_model(str(tmp_path / "plain"), device="cpu")
    assert "no ResNet" in why_unavailable(plain, gc)
    with pytest.raises(ValueError, match="layer"):
        get_method("gradcam", layer="stem")


# --- causal views --------------------------------------------------------------------------------------------


def test_knock_outs_lens_and_attribution(tiny):
    img, c = random_image(8), 2
    notes = C.causal_notes(tiny)
    assert not any(notes.values()), notes
    got = C.head_importance(tiny, img, target=c, mode="zero")
    assert got.effects.shape == (2, 4)
    pixels, _ = preprocess(tiny, [img], (SIDE, SIDE))
    with torch.no_grad():
        clean = tiny.model(pixel_values=pixels).logits[0, c]
    d = 32 // 4
    for block, head in ((0, 1), (1, 3)):

        def zero(module, args, head=head):
            z = args[0].clone()
            z[..., head * d : (head + 1) * d] = 0
            return (z,)

        handle = tiny.model.vit.layers[block].attention.o_proj.register_forward_pre_hook(zero)
        try:
            with torch.no_grad():
                knocked = tiny.model(pixel_values=pixels).logits[0, c]
        finally:
            handle.remove()
        assert got.effects[block, head] == pytest.approx(float(knocked - clean), abs=1e-5)
    lens = C.logit_lens(tiny, img)
    np.testing.assert_allclose(lens.logits[-1], get_run(tiny, img).scores.numpy(), rtol=1e-5, atol=1e-5)
    att = C.direct_logit_attribution(tiny, img, target=c)
    assert att.total == pytest.approx(att.logit, rel=1e-4, abs=1e-5)


def test_a_representation_layer_keeps_the_lens_and_refuses_attribution(tiny_rep):
    img = random_image(9)
    notes = C.causal_notes(tiny_rep)
    assert not notes["knockout"] and not notes["lens"]
    assert "pre_logits" in notes["attribution"] and "not an affine function" in notes["attribution"]
    with pytest.raises(C.NotDefined, match="pre_logits"):
        C.direct_logit_attribution(tiny_rep, img)
    lens = C.logit_lens(tiny_rep, img)  # row L goes through tanh(pre_logits) and equals the logits
    np.testing.assert_allclose(lens.logits[-1], get_run(tiny_rep, img).scores.numpy(), rtol=1e-5, atol=1e-5)
    assert "pre_logits" in lens.readout


# --- what the model shows of itself ---------------------------------------------------------------------------


def test_the_position_table_is_on_the_feature_grid(tiny):
    info = tiny.position
    table = info.tables[0]
    assert table.grid == (4, 4) and table.name == "feature-map cells"
    np.testing.assert_array_equal(table.embeddings, tiny.model.vit.embeddings.position_embeddings[0, 1:].numpy())
    assert "32 px" in info.note and "bilinearly" in info.note


def test_the_filters_are_the_standardised_root_convolution(tiny):
    w = tiny.model.vit.embeddings.backbone.embedder.convolution.weight.detach().double()
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    want = (w - mean) / ((w - mean).pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt() + 1e-5)
    assert tiny.patch_weights.shape == (32, 3, 7, 7)
    np.testing.assert_allclose(tiny.patch_weights, want.numpy(), rtol=1e-5, atol=1e-5)


def test_the_token_note_says_tokens_are_cnn_cells(tiny):
    note = tiny.family.token_note(tiny.config)
    assert "not pixel patches" in note and "at stride 8 px" in note and "43 x 43 px receptive field" in note
    assert "2 stages (1, 2 units)" in note and "1 x 1 projection embeds each of its cells" in note
    cap = capture(tiny, random_image(10))
    assert cap.token_kinds == ("CLS",) + ("patch",) * 16
