"""Knock-outs, head importance, logit lens, direct logit attribution and the fast estimate (vitviz.causal).

Every knock-out is checked against an independent recomputation: a test-local
pre-hook on the output projection (found here by its module name, not through the
family adapter) that zeroes or replaces the head's slice on a full forward.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import torch
from conftest import TINY, random_image

from vitviz import causal as C
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.capture.targets import Target
from vitviz.models.hooks import current, installed_sites

LABELS = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}
_PROJ_NAME = re.compile(r"attention\.(o_proj|output\.dense|proj)$")


pytestmark = pytest.mark.usefixtures("one_thread")


def _randomise(model: torch.nn.Module) -> None:
    """Random relative-position tables and layer scales (random-weight models start them at zero / one)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("lambda1"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)


def _save(folder, arch: str, config, side: int, perturb: float = 0.0):
    import transformers
    from transformers import ViTImageProcessor

    torch.manual_seed(0)
    model = getattr(transformers, arch)(config)
    _randomise(model)
    if perturb:
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * perturb)
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": side, "width": side}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


def _extra_specs():
    from transformers import (
        BeitConfig,
        CvtConfig,
        DeiTConfig,
        Dinov2Config,
        Dinov2WithRegistersConfig,
        MobileViTConfig,
        MobileViTV2Config,
        PvtConfig,
        SwinConfig,
    )

    tiny4 = {**TINY, "patch_size": 4}
    return {
        "deit_plain": ("DeiTForImageClassification", DeiTConfig(**TINY, **LABELS), 32, 0.0),
        "dinov2_cls": (
            "Dinov2ForImageClassification",
            Dinov2Config(**tiny4, use_swiglu_ffn=True, **LABELS),
            32,
            0.0,
        ),
        "dinov2_reg_cls": (
            "Dinov2WithRegistersForImageClassification",
            Dinov2WithRegistersConfig(**tiny4, num_register_tokens=2, **LABELS),
            32,
            0.0,
        ),
        "beit_cls": (
            "BeitForImageClassification",
            BeitConfig(**TINY, use_mean_pooling=False, use_relative_position_bias=True, **LABELS),
            32,
            0.0,
        ),
        "swin": (
            "SwinForImageClassification",
            SwinConfig(
                image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, **LABELS
            ),
            64,
            0.0,
        ),
        "pvt": (
            "PvtForImageClassification",
            PvtConfig(
                image_size=64,
                depths=[1, 1, 1, 1],
                hidden_sizes=[16, 16, 32, 32],
                num_attention_heads=[1, 1, 2, 2],
                mlp_ratios=[2, 2, 2, 2],
                **LABELS,
            ),
            64,
            0.0,
        ),
        "cvt": (
            "CvtForImageClassification",
            CvtConfig(depth=[1, 2, 3], embed_dim=[16, 32, 48], num_heads=[1, 2, 3], **LABELS),
            64,
            0.0,
        ),
        "mobilevit": (  # random MobileViT weights give all-zero logits: perturb every parameter
            "MobileViTForImageClassification",
            MobileViTConfig(
                image_size=64,
                hidden_sizes=[16, 24, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                num_attention_heads=2,
                expand_ratio=2.0,
                **LABELS,
            ),
            64,
            0.2,
        ),
        "mobilevitv2": (
            "MobileViTV2ForImageClassification",
            MobileViTV2Config(image_size=64, width_multiplier=0.125, n_attn_blocks=[1, 2, 1], **LABELS),
            64,
            0.0,
        ),
    }


@pytest.fixture(scope="module")
def models(tiny_models, tmp_path_factory):
    from vitviz.models.load import load_model

    root = tmp_path_factory.mktemp("causal-models")
    out = {k: tiny_models[k] for k in ("vit", "deit", "beit", "dino")}
    for key, (arch, config, side, perturb) in _extra_specs().items():
        out[key] = load_model(str(_save(root / key, arch, config, side, perturb)), device="cpu")
    return out


# --- independent references ------------------------------------------------------------------------


def _projections(model) -> list[torch.nn.Linear]:
    return [m for n, m in model.named_modules() if _PROJ_NAME.search(n) and isinstance(m, torch.nn.Linear)]


def _forward(loaded, pixels, hw):
    kwargs = loaded.family.forward_kwargs(loaded.config, hw)
    with torch.no_grad(), loaded.family.running(loaded.model):
        return loaded.model(pixel_values=pixels, **kwargs)


def _num_heads(loaded, image) -> list[int]:
    return [b.geometry.num_heads for b in capture(loaded, image).blocks]


def _reference(loaded, image, heads, mode) -> np.ndarray:
    """Logits ``(C,)`` with ``heads`` knocked out by test-local pre-hooks on a full forward."""
    hw = input_size_for(loaded, None, image.size)
    pixels, _ = preprocess(loaded, [image], hw)
    projs = _projections(loaded.model)
    counts = _num_heads(loaded, image)
    assert len(projs) == len(counts)
    seen: dict[int, torch.Tensor] = {}
    grab = [
        p.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].clone())) for i, p in enumerate(projs)
    ]
    try:
        _forward(loaded, pixels, hw)
    finally:
        for h in grab:
            h.remove()

    def edit(i):
        def hook(module, args):
            z = args[0].clone()
            d = z.shape[-1] // counts[i]
            for layer, head in heads:
                if layer == i:
                    cols = slice(head * d, (head + 1) * d)
                    value = seen[i].reshape(-1, z.shape[-1]).mean(0)[cols] if mode == "mean" else 0.0
                    z[..., cols] = value
            return (z,)

        return hook

    handles = [projs[i].register_forward_pre_hook(edit(i)) for i in {layer for layer, _ in heads}]
    try:
        return _forward(loaded, pixels, hw).logits[0].float().numpy()
    finally:
        for h in handles:
            h.remove()


def _model_logits(loaded, image) -> np.ndarray:
    hw = input_size_for(loaded, None, image.size)
    pixels, _ = preprocess(loaded, [image], hw)
    return _forward(loaded, pixels, hw).logits[0].float().numpy()


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _state(model) -> torch.Tensor:
    return torch.cat([t.detach().flatten().float() for t in (*model.parameters(), *model.buffers())])


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


# --- knock-outs ---------------------------------------------------------------------------------------

KNOCKOUT_KEYS = ("vit", "deit", "beit", "deit_plain", "dinov2_cls", "dinov2_reg_cls", "beit_cls")
HIER_KEYS = ("swin", "pvt", "cvt", "mobilevit")


@pytest.mark.parametrize("key", KNOCKOUT_KEYS + HIER_KEYS)
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_each_knockout_equals_an_independent_hook(models, key, mode):
    loaded = models[key]
    img = random_image(3)
    imp = C.head_importance(loaded, img, mode=mode)
    counts = _num_heads(loaded, img)
    assert imp.num_heads == tuple(counts) and imp.complete
    for layer in (0, len(counts) - 1):
        head = counts[layer] - 1
        ref = _reference(loaded, img, [(layer, head)], mode)
        np.testing.assert_allclose(imp.logits[layer, head], ref, rtol=1e-5, atol=1e-5)
        assert imp.effects[layer, head] == pytest.approx(
            ref[imp.class_index] - imp.clean_logits[imp.class_index], abs=1e-5
        )
    np.testing.assert_allclose(imp.clean_logits, _model_logits(loaded, img), rtol=1e-5, atol=1e-6)
    assert np.all(np.isnan(imp.effects) == (np.arange(imp.effects.shape[1])[None] >= np.array(counts)[:, None]))
    assert np.nanmax(np.abs(imp.effects)) > 0  # the knock-outs do something


@pytest.mark.parametrize("key", ["vit", "beit_cls", "dinov2_reg_cls", "swin"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_several_heads_at_once(models, key, mode):
    loaded = models[key]
    img = random_image(4)
    heads = [(0, 1), (1, 0), (1, 1)]
    ref = _reference(loaded, img, heads, mode)
    for from_cache in (True, False):
        ko = C.knock_out(loaded, img, heads, mode=mode, from_cache=from_cache)
        np.testing.assert_allclose(ko.logits, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ko.effect, ref - ko.clean_logits, atol=1e-5)
    assert ko.heads == tuple(heads)


def test_zero_knockout_equals_zeroed_value_projection(models):
    """Independent of the head-slice layout: zeroing head h's rows of v_proj makes its output exactly zero."""
    loaded = models["vit"]
    img = random_image(5)
    layer, head = 1, 2
    from transformers import ViTForImageClassification

    twin = ViTForImageClassification.from_pretrained(loaded.source, attn_implementation="eager").eval()
    v = twin.vit.layers[layer].attention.v_proj
    d = v.out_features // loaded.config.num_attention_heads
    with torch.no_grad():
        v.weight[head * d : (head + 1) * d] = 0
        v.bias[head * d : (head + 1) * d] = 0
    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    with torch.no_grad():
        ref = twin(pixel_values=pixels, interpolate_pos_encoding=True).logits[0].numpy()
    ko = C.knock_out(loaded, img, [(layer, head)], mode="zero")
    np.testing.assert_allclose(ko.logits, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key", KNOCKOUT_KEYS)
def test_knockouts_from_the_cached_residual_equal_full_forwards(models, key):
    loaded = models[key]
    img = random_image(6)
    cached = C.head_importance(loaded, img, mode="mean", chunk=3)
    full = C.head_importance(loaded, img, mode="mean", from_cache=False)
    assert cached.from_cache and not full.from_cache
    np.testing.assert_allclose(cached.logits, full.logits, rtol=1e-5, atol=1e-6)
    n, h = cached.effects.shape
    assert cached.forward_equivalents == pytest.approx(1 + h * (n + 1) / 2)  # 1 + H (L + 1) / 2
    assert full.forward_equivalents == pytest.approx(1 + n * h)


def test_progress_and_cancel(models):
    loaded = models["vit"]
    img = random_image(7)
    calls: list[tuple[int, int]] = []
    full = C.head_importance(loaded, img, chunk=3, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(3, 8), (4, 8), (7, 8), (8, 8)]  # chunks of 3 never mix blocks (4 heads per block)
    asked = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(C.Cancelled, match="after 4 of 8") as info:
        C.head_importance(loaded, img, chunk=3, cancel=cancel)
    part = info.value.partial
    assert not part.complete and np.isnan(part.effects[1]).all()
    np.testing.assert_allclose(part.effects[0], full.effects[0], atol=1e-6)


# --- logit lens -----------------------------------------------------------------------------------------

LENS_KEYS = ("vit", "deit", "deit_plain", "beit", "beit_cls", "dinov2_cls", "dinov2_reg_cls")


@pytest.mark.parametrize("key", LENS_KEYS)
def test_logit_lens_last_row_is_the_model_logits(models, key):
    loaded = models[key]
    img = random_image(8)
    lens = C.logit_lens(loaded, img)
    n = loaded.config.num_hidden_layers
    assert lens.logits.shape == (n + 1, 3) and lens.defined.all() and lens.note == ""
    np.testing.assert_allclose(lens.logits[n], _model_logits(loaded, img), rtol=1e-5, atol=1e-6)
    assert not np.allclose(lens.logits[0], lens.logits[n])


def _embeddings(loaded, img):
    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    emb = loaded.model.base_model.embeddings
    with torch.no_grad():
        if loaded.family.interpolate_kwarg:
            return emb(pixels, interpolate_pos_encoding=True)
        return emb(pixels)


def test_logit_lens_row_zero_by_hand(models):
    img = random_image(9)
    vit = models["vit"]
    with torch.no_grad():
        e = _embeddings(vit, img)
        ref = vit.model.classifier(vit.model.vit.layernorm(e)[:, 0])[0].numpy()
    np.testing.assert_allclose(C.logit_lens(vit, img).logits[0], ref, rtol=1e-5, atol=1e-6)

    deit = models["deit"]  # distilled: the mean of both heads
    with torch.no_grad():
        z = deit.model.deit.layernorm(_embeddings(deit, img))
        ref = ((deit.model.cls_classifier(z[:, 0]) + deit.model.distillation_classifier(z[:, 1])) / 2)[0].numpy()
    np.testing.assert_allclose(C.logit_lens(deit, img).logits[0], ref, rtol=1e-5, atol=1e-6)

    dino = models["dinov2_reg_cls"]  # CLS + mean of the patches, registers unread
    with torch.no_grad():
        z = dino.model.base_model.layernorm(_embeddings(dino, img))
        ref = dino.model.classifier(torch.cat([z[:, 0], z[:, 3:].mean(1)], -1))[0].numpy()
    np.testing.assert_allclose(C.logit_lens(dino, img).logits[0], ref, rtol=1e-5, atol=1e-6)


def test_logit_lens_on_swin_reads_the_last_stage_only(models):
    loaded = models["swin"]
    img = random_image(10)
    lens = C.logit_lens(loaded, img)
    assert lens.defined.tolist() == [False, False, False, True, True]  # embeddings, stage 1 (2 blocks), stage 2
    assert np.isnan(lens.logits[:3]).all() and "last stage" in lens.note
    np.testing.assert_allclose(lens.logits[4], _model_logits(loaded, img), rtol=1e-5, atol=1e-6)


# --- direct logit attribution -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", LENS_KEYS)
def test_attribution_parts_sum_to_the_logit(models, key):
    loaded = models[key]
    img = random_image(11)
    logits = _model_logits(loaded, img)
    for c in range(3):
        att = C.direct_logit_attribution(loaded, img, target=c)
        assert att.logit == pytest.approx(float(logits[c]), rel=1e-5, abs=1e-6)
        total = np.sum(att.heads) + np.sum(att.mlps) + att.rest
        assert abs(total - logits[c]) <= 1e-4 * max(abs(logits[c]), 1e-3)
        assert att.heads.shape == (loaded.config.num_hidden_layers, loaded.config.num_attention_heads)


def _grab(model, modules, pre: bool):
    got: dict[int, torch.Tensor] = {}
    hooks = []
    for i, m in enumerate(modules):
        if pre:
            hooks.append(m.register_forward_pre_hook(lambda mod, a, i=i: got.__setitem__(i, a[0].detach().clone())))
        else:
            hooks.append(m.register_forward_hook(lambda mod, a, o, i=i: got.__setitem__(i, o.detach().clone())))
    return got, hooks


def test_attribution_of_one_head_and_one_mlp_by_hand(models):
    loaded = models["vit"]
    model = loaded.model
    img = random_image(12)
    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    layers = model.vit.layers
    z, h1 = _grab(model, [layer.attention.o_proj for layer in layers], pre=True)
    mlp, h2 = _grab(model, [layer.mlp for layer in layers], pre=False)
    last, h3 = _grab(model, [model.vit.layernorm], pre=True)
    try:
        logits = _forward(loaded, pixels, hw).logits[0]
    finally:
        for h in h1 + h2 + h3:
            h.remove()
    c = int(torch.argmax(logits))
    norm = model.vit.layernorm
    x = last[0][0, 0].double()
    sigma = torch.sqrt(x.var(unbiased=False) + norm.eps)
    w_c = model.classifier.weight[c].double()

    def through_head(u: torch.Tensor) -> float:  # frozen-scale LayerNorm, then the classifier without its bias
        return float(w_c @ (norm.weight.double() * (u - u.mean()) / sigma))

    att = C.direct_logit_attribution(loaded, img)
    layer, head = 1, 3
    d = loaded.config.hidden_size // loaded.config.num_attention_heads
    cols = slice(head * d, (head + 1) * d)
    w_o = layers[layer].attention.o_proj.weight.double()
    assert att.heads[layer, head] == pytest.approx(through_head(w_o[:, cols] @ z[layer][0, 0, cols].double()), abs=1e-6)
    u = mlp[0][0, 0].double() - layers[0].mlp.fc2.bias.double()
    assert att.mlps[0] == pytest.approx(through_head(u), abs=1e-6)
    assert att.norm_scale[0] == pytest.approx(float(sigma), rel=1e-6)


def test_attribution_by_hand_with_layer_scale_and_a_patch_mean_head(models):
    """DINOv2 classifier (random layer scales, SwiGLU): a head's part reads every token with its own frozen scale."""
    loaded = models["dinov2_cls"]
    model = loaded.model
    img = random_image(13)
    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    layers = model.dinov2.encoder.layer
    z, h1 = _grab(model, [layer.attention.o_proj for layer in layers], pre=True)
    last, h2 = _grab(model, [model.dinov2.layernorm], pre=True)
    try:
        logits = _forward(loaded, pixels, hw).logits[0]
    finally:
        for h in h1 + h2:
            h.remove()
    c = int(torch.argmin(logits))
    layer, head = 0, 1
    lam = layers[layer].layer_scale1.lambda1.double()
    assert not torch.allclose(lam, torch.ones_like(lam))
    d = loaded.config.hidden_size // loaded.config.num_attention_heads
    cols = slice(head * d, (head + 1) * d)
    u = lam * (z[layer][0, :, cols].double() @ layers[layer].attention.o_proj.weight[:, cols].double().T)  # (T, D)
    x = last[0][0].double()
    norm = model.dinov2.layernorm
    sigma = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)
    n = norm.weight.double() * (u - u.mean(-1, keepdim=True)) / sigma
    w = model.classifier.weight[c].double()
    dim = loaded.config.hidden_size
    ref = float(w[:dim] @ n[0] + w[dim:] @ n[1:].mean(0))
    att = C.direct_logit_attribution(loaded, img, target=c)
    assert att.heads[layer, head] == pytest.approx(ref, abs=1e-6)


def test_attribution_not_defined_for_hierarchical_models(models):
    for key in ("swin", "pvt"):
        with pytest.raises(C.NotDefined, match=r"not defined|no readout head"):
            C.direct_logit_attribution(models[key], random_image(0))
    assert "patch merging" in C.causal_notes(models["swin"])["attribution"]


# --- the fast estimate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["mean", "zero"])
def test_fast_estimate_tracks_the_exact_table(models, mode):
    """Measured on the tiny random ViT, these 3 images: Spearman 1.00, 1.00, 1.00 (mean) and 1.00, 1.00, 0.98
    (zero), Pearson >= 0.9995 (random small models are nearly linear in a head's output). The assertion is
    deliberately loose; the demo model's numbers come from ``benchmarks/causal.py``."""
    loaded = models["vit"]
    for seed in range(3):
        img = random_image(20 + seed)
        est = C.fast_estimate(loaded, img, mode=mode)
        exact = C.head_importance(loaded, img, mode=mode)
        assert est.class_index == exact.class_index and est.effects.shape == exact.effects.shape
        np.testing.assert_allclose(est.clean_logits, exact.clean_logits, rtol=1e-5, atol=1e-6)
        assert _spearman(est.effects.ravel(), exact.effects.ravel()) > 0.5


# --- the shared model ------------------------------------------------------------------------------------


def test_shared_model_unchanged_after_knockouts_and_failures(models):
    loaded = models["beit_cls"]
    img, other = random_image(30), random_image(31)
    C.knock_out(loaded, img, [(0, 0)])  # installs the projection hooks (once per model)
    hooks, state, before = _hook_count(loaded.model), _state(loaded.model), _model_logits(loaded, other)

    C.head_importance(loaded, img, mode="zero")
    C.logit_lens(loaded, img)
    C.direct_logit_attribution(loaded, img)
    C.fast_estimate(loaded, img)

    def boom(done, total):
        raise RuntimeError("progress callback failed")

    with pytest.raises(RuntimeError, match="progress callback failed"):
        C.head_importance(loaded, img, chunk=1, progress=boom)

    block = loaded.model.beit.layers[1]

    def fail_in_forward(module, args, kwargs):
        state = current()
        if state is not None and state.points is not None and state.points.edits:
            raise RuntimeError("failure inside a knocked-out forward")

    handle = block.register_forward_pre_hook(fail_in_forward, with_kwargs=True)
    try:
        for from_cache in (True, False):
            with pytest.raises(RuntimeError, match="inside a knocked-out forward"):
                C.knock_out(loaded, img, [(0, 1)], from_cache=from_cache)
    finally:
        handle.remove()
    assert current() is None
    assert _hook_count(loaded.model) == hooks
    assert torch.equal(_state(loaded.model), state)
    np.testing.assert_array_equal(_model_logits(loaded, other), before)
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert all(p.grad is None for p in loaded.model.parameters())


def test_threads_sharing_the_model_never_see_a_knockout(models):
    loaded = models["vit"]
    img, other = random_image(32), random_image(33)
    before = _model_logits(loaded, other)
    errors: list[BaseException] = []

    def knock():
        try:
            for _ in range(3):
                C.head_importance(loaded, img, mode="zero", chunk=1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=knock)
    worker.start()
    seen = []
    while worker.is_alive() or not seen:
        seen.append(_model_logits(loaded, other))
    worker.join()
    assert not errors
    for got in seen:
        np.testing.assert_array_equal(got, before)


# --- bad input, undefined analyses, export ---------------------------------------------------------------------


def test_bad_input_is_refused_clearly(models):
    loaded = models["vit"]
    img = random_image(40)
    with pytest.raises(ValueError, match=r"block 5 is outside 0\.\.1"):
        C.knock_out(loaded, img, [(5, 0)])
    with pytest.raises(ValueError, match=r"head 4 is outside 0\.\.3 \(block 1\)"):
        C.knock_out(loaded, img, [(1, 4)])
    with pytest.raises(ValueError, match="all 8 heads"):
        C.knock_out(loaded, img, [(b, h) for b in range(2) for h in range(4)])
    with pytest.raises(ValueError, match="no heads"):
        C.knock_out(loaded, img, [])
    with pytest.raises(ValueError, match=r"\(block, head\)"):
        C.knock_out(loaded, img, [3])
    with pytest.raises(ValueError, match=r"class index 3 is outside 0\.\.2"):
        C.head_importance(loaded, img, target=3)
    with pytest.raises(ValueError, match="class index -1"):
        C.direct_logit_attribution(loaded, img, target=-1)
    with pytest.raises(ValueError, match="'mean' or 'zero'"):
        C.fast_estimate(loaded, img, mode="half")
    with pytest.raises(C.NotDefined, match="no classifier"):
        C.head_importance(models["dino"], img)
    with pytest.raises(C.NotDefined, match="no per-head output projection"):
        C.head_importance(models["mobilevitv2"], img)
    assert C.causal_notes(models["mobilevitv2"])["knockout"]


def test_causal_arrays_for_export(models):
    img = random_image(41)
    arrays, why = C.causal_arrays(models["vit"], img)
    assert why == {}
    assert arrays["logit_lens"].shape == (3, 3) and arrays["head_ablation"].shape == (2, 4)
    assert arrays["head_attribution"].shape == (2, 4) and arrays["mlp_attribution"].shape == (2,)
    assert arrays["attribution_rest"].shape == () and arrays["explained_class"].dtype == np.int64
    c = int(arrays["explained_class"])
    zero = C.head_importance(models["vit"], img, mode="zero")
    np.testing.assert_allclose(arrays["head_ablation"], zero.effects, atol=1e-6)
    total = arrays["head_attribution"].sum() + arrays["mlp_attribution"].sum() + arrays["attribution_rest"]
    assert total == pytest.approx(float(arrays["logit_lens"][-1, c]), rel=1e-4, abs=1e-6)

    arrays, why = C.causal_arrays(models["swin"], img, target=1)
    assert set(why) == {"head_attribution", "mlp_attribution", "attribution_rest"}
    assert arrays["head_ablation"].shape == (4, 4) and arrays["logit_lens"].shape == (5, 3)


# --- the demo model: a head that matters ------------------------------------------------------------------------


def test_demo_model_has_a_head_whose_knockout_changes_the_prediction(demo_model):
    """Measured: on shapes sample 2 (a star, predicted "star" with logit 7.22), the mean knock-out of block 0, head 1
    lowers the star logit by 6.99 and the prediction becomes "square" (5.95 against 0.24); it is the one head that
    flips this sample. Over samples 0..299, 48 have a head whose single mean knock-out flips the top-1 (heads 1, 2
    and 3 of block 0: 23, 15 and 10 samples), 52 with zero knock-outs; no head of a later block flips any."""
    from vitviz.data.shapes import CLASSES, make_sample

    sample = make_sample(2)
    imp = C.head_importance(demo_model, sample.image, mode="mean")
    assert imp.effects.shape == (4, 4)
    flips = [tuple(int(v) for v in p) for p in np.argwhere(imp.top1_changed)]
    assert flips == [(0, 1)]
    assert CLASSES[int(np.argmax(imp.clean_logits))] == CLASSES[sample.label] == "star"
    assert CLASSES[int(np.argmax(imp.logits[0, 1]))] == "square"
    assert imp.effects[0, 1] == pytest.approx(-6.99, abs=0.01)
    ko = C.knock_out(demo_model, sample.image, [(0, 1)], mode="mean", from_cache=False)
    np.testing.assert_allclose(ko.logits, imp.logits[0, 1], atol=1e-5)
    zero = C.head_importance(demo_model, sample.image, mode="zero")
    assert [tuple(int(v) for v in p) for p in np.argwhere(zero.top1_changed)] == [(0, 1)]


# --- zero-shot two-tower models: label scores ---------------------------------------------------------------

_TEXT = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    vocab_size=64,
    max_position_embeddings=16,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
)
_VISION = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8
)


@pytest.fixture(scope="module")
def two_tower(tmp_path_factory):
    import transformers as tf

    from vitviz.models.load import load_model

    root = tmp_path_factory.mktemp("causal-two-tower")
    out = {}
    for key, arch, config in (
        ("clip", "CLIPModel", tf.CLIPConfig(text_config=_TEXT, vision_config=_VISION, projection_dim=24)),
        ("siglip", "SiglipModel", tf.SiglipConfig(text_config={**_TEXT, "hidden_size": 32}, vision_config=_VISION)),
    ):
        out[key] = load_model(str(_save(root / key, arch, config, 32, perturb=0.3)), device="cpu")
    return out


def _prompts_as_ids(loaded, ids: torch.Tensor):
    """``loaded`` with a text tower whose tokenizer reads prompt ``"p{k}"`` as the token ids ``ids[k]`` (the saved
    test model has no tokenizer): its label scores are the model's own for those ids."""
    import dataclasses

    from vitviz.models.zeroshot import TextTower

    def tokenizer(prompts, **_):
        return {"input_ids": ids[[int(p[1:]) for p in prompts]]}

    return dataclasses.replace(loaded, text=TextTower(tokenizer, "longest", ids.shape[1], "softmax", "{}"))


@pytest.mark.parametrize("key", ["clip", "siglip"])
def test_zero_shot_label_scores_knockouts_equal_the_models_own_scores(two_tower, key):
    """Label scores are the model's own ``logits_per_image`` (text through its text tower); each knock-out against
    a test-local hook on the vision tower's ``self_attn.out_proj``."""
    loaded = two_tower[key]
    model = loaded.model
    img = random_image(50)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (3, 6), generator=gen)
    ids[:, -1] = 2  # CLIP pools at the end-of-text token
    loaded = _prompts_as_ids(loaded, ids)  # prompt "p{k}" is the token ids of row k
    target = Target.of_label(("p0", "p1", "p2"), 0)
    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    projs = [
        m
        for n, m in model.named_modules()
        if re.fullmatch(r"vision_model\.encoder\.layers\.\d+\.self_attn\.out_proj", n)
    ]
    d = _VISION["hidden_size"] // _VISION["num_attention_heads"]
    layer, head = 1, 2

    def zero(module, args):
        z = args[0].clone()
        z[..., head * d : (head + 1) * d] = 0
        return (z,)

    with torch.no_grad():
        clean = model(input_ids=ids, pixel_values=pixels).logits_per_image[0].numpy()
        handle = projs[layer].register_forward_pre_hook(zero)
        try:
            ref = model(input_ids=ids, pixel_values=pixels).logits_per_image[0].numpy()
        finally:
            handle.remove()
    imp = C.head_importance(loaded, img, mode="zero", target=target)
    np.testing.assert_allclose(imp.clean_logits, clean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(imp.logits[layer, head], ref, rtol=1e-5, atol=1e-5)
    assert not imp.from_cache and imp.effects.shape[0] == len(installed_sites(model))
    if key == "siglip":  # the pooling head's nn.MultiheadAttention never calls out_proj as a module: no row
        assert np.isnan(imp.effects[-1]).all()
    est = C.fast_estimate(loaded, img, mode="zero", target=target)
    assert est.class_index == imp.class_index
    with pytest.raises(C.NotDefined, match="zero-shot"):
        C.head_importance(loaded, img)
    arrays, why = C.causal_arrays(loaded, img, target=target)
    assert arrays["head_ablation"].shape == imp.effects.shape and "logit_lens" not in arrays
    assert "zero-shot" in why["logit_lens"] and "zero-shot" in why["head_attribution"]


def test_a_capture_with_heads_knocked_out_shows_the_downstream_attention(demo_model):
    from vitviz.capture.forward import capture
    from vitviz.causal import capture_knocked_out, knock_out
    from vitviz.data.shapes import make_sample

    loaded = demo_model
    img = make_sample(220).image
    clean = capture(loaded, img, attention_dtype="float32")
    cap, ko = capture_knocked_out(loaded, img, [(0, 3), (1, 2)], mode="mean", attention_dtype="float32")
    ref = knock_out(loaded, img, [(0, 3), (1, 2)], mode="mean")
    np.testing.assert_allclose(ko.logits, ref.logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ko.clean_logits, clean.logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cap.logits, ko.logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cap.blocks[0].attention, clean.blocks[0].attention, atol=1e-6)  # before: unchanged
    assert np.abs(cap.blocks[1].attention - clean.blocks[1].attention).max() > 1e-2  # after: changed
    again = capture(loaded, img, attention_dtype="float32")  # and the shared model is untouched
    np.testing.assert_array_equal(again.blocks[1].attention, clean.blocks[1].attention)


def test_lens_probabilities_and_ranks_by_hand():
    from vitviz.causal import LogitLens

    logits = np.array([[0.0, 1.0, 2.0], [3.0, 1.0, 0.0], [np.nan, np.nan, np.nan]], np.float32)
    lens = LogitLens(logits, np.array([True, True, False]), "CLS", "")
    p = lens.probabilities()
    np.testing.assert_allclose(p[0], np.exp([0, 1, 2]) / np.exp([0, 1, 2]).sum(), rtol=1e-6)
    assert np.isnan(p[2]).all()
    np.testing.assert_array_equal(lens.ranks(0)[:2], [3, 1])
    assert np.isnan(lens.ranks(0)[2])
