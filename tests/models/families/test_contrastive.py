"""CLIP, SigLIP and SigLIP 2 (NaFlex) image towers against the models' own outputs and independent recomputations.

Every model is a tiny random-weight model written to a folder with its own image
processor and loaded through ``load_model``. The references never use the
adapter's code: encoder attention comes from the model's own ``output_attentions``
(eager), the pooling head is recomputed from its ``in_proj_weight`` /
``in_proj_bias``, ``out_proj``, LayerNorm and MLP, NaFlex inputs come from the
SigLIP 2 image processor itself, and rollout / relevance are full matrix products
(``tests/reference.py``) over dense matrices built here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import relevance_reference, rollout_reference

from vitviz.analysis.blocks import dense, row_map, select
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes, explain_targets
from vitviz.errors import BudgetError
from vitviz.models.families.contrastive import Clip, Siglip, Siglip2, naflex_size, vision_tower
from vitviz.models.hooks import installed_sites
from vitviz.models.load import load_model
from vitviz.record import POOLED

TEXT = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    vocab_size=64,
    max_position_embeddings=16,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
FIXED = dict(image_size=32, patch_size=8)  # native grid 4 x 4
NAFLEX = dict(patch_size=4, num_patches=64)  # native table 8 x 8, a budget of 64 patches
LABELS = {"id2label": {0: "a", 1: "b", 2: "c"}, "label2id": {"a": 0, "b": 1, "c": 2}}

KEYS = ("clip", "clip_vision_model", "siglip", "siglip_vision_model", "siglip2", "siglip2_vision_model")
TWO_TOWER = ("clip", "siglip", "siglip2")
POOLING = ("siglip", "siglip_vision_model", "siglip2", "siglip2_vision_model")
NAFLEX_KEYS = ("siglip2", "siglip2_vision_model")
NON_SQUARE = (24, 48)  # fixed-size towers: a 3 x 6 grid, position tables interpolated
TALL, WIDE = (40, 70), (70, 40)  # NaFlex: image (w, h) -> grids 10 x 6 and 6 x 10 of the 64-patch budget


def _config(key: str, classifier: bool = False):
    import transformers as tf

    labels = LABELS if classifier else {}
    if key == "clip":
        return tf.CLIPConfig(text_config=TEXT, vision_config={**VISION, **FIXED}, projection_dim=24, **labels)
    if key == "clip_vision_model":
        return tf.CLIPVisionConfig(**VISION, **FIXED)
    if key == "siglip":
        return tf.SiglipConfig(text_config=TEXT, vision_config={**VISION, **FIXED}, **labels)
    if key == "siglip_vision_model":
        return tf.SiglipVisionConfig(**VISION, **FIXED)
    if key == "siglip2":
        return tf.Siglip2Config(text_config=TEXT, vision_config={**VISION, **NAFLEX}, **labels)
    return tf.Siglip2VisionConfig(**VISION, **NAFLEX)


_CLASSES = {
    "clip": "CLIPModel",
    "clip_vision_model": "CLIPVisionModel",
    "siglip": "SiglipModel",
    "siglip_vision_model": "SiglipVisionModel",
    "siglip2": "Siglip2Model",
    "siglip2_vision_model": "Siglip2VisionModel",
}


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Random weights far from the init (zero biases, xavier q/k): peaked attention, biases that matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                gain = 3.0 if name.endswith(("q_proj.weight", "k_proj.weight", "in_proj_weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * gain / p[0].numel() ** 0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def _save(key: str, folder, *, classifier: bool = False, seed: int = 0):
    import transformers as tf

    torch.manual_seed(seed)
    config = _config(key, classifier)
    if classifier:
        cls = {"clip": tf.CLIPForImageClassification, "siglip2": tf.Siglip2ForImageClassification}[key]
    else:
        cls = getattr(tf, _CLASSES[key])
    model = cls(config)
    _perturb(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    if key.startswith("clip"):
        proc = tf.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    elif key.startswith("siglip2"):
        proc = tf.Siglip2ImageProcessorPil(patch_size=NAFLEX["patch_size"], max_num_patches=NAFLEX["num_patches"])
    else:
        proc = tf.SiglipImageProcessorPil(size={"height": 32, "width": 32})
    proc.save_pretrained(folder)
    return folder


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("contrastive")
    return {k: _save(k, root / k, seed=i) for i, k in enumerate(KEYS)}


@pytest.fixture(scope="module")
def models(folders):
    return {k: load_model(str(d), device="cpu") for k, d in folders.items()}


@pytest.fixture(scope="module")
def processors(folders):
    from transformers import AutoImageProcessor

    return {k: AutoImageProcessor.from_pretrained(str(folders[k])) for k in NAFLEX_KEYS}


def _layers(loaded):
    return list(vision_tower(loaded.model).encoder.layers)


def _head(loaded):
    tower = vision_tower(loaded.model)
    return tower.head if getattr(tower, "use_head", False) else None


def _image(key: str, size):
    """NaFlex takes its grid from the image; the fixed-size towers from ``size``."""
    if key in NAFLEX_KEYS and size is not None:
        return random_image(3, size=size)
    return random_image(3, size=(50, 42))


def _size(key: str, size):
    return None if key in NAFLEX_KEYS else size


def _inputs(loaded, image, size=None, processors=None, key=None) -> tuple[tuple[int, int], dict]:
    """Model inputs for ``image``: the SigLIP 2 processor's own output for NaFlex, else resized pixels."""
    hw = input_size_for(loaded, size, image.size)
    if processors is not None and key in processors:
        got = processors[key](images=image, return_tensors="pt")
        return hw, {k: got[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")}
    pixels, _ = preprocess(loaded, [image], hw)
    return hw, {"pixel_values": pixels, "interpolate_pos_encoding": True}


def _pool_reference(head, x: torch.Tensor, mask: torch.Tensor | None):
    """The pooling head by hand: per-head ``softmax(q k^T / sqrt(d))`` of the probe over the keys, and its output.

    Returns the attention ``(B, H, 1, S)`` (the tensor multiplied with the values: a view
    of it would not be on the gradient's path) and the pooled output ``(B, D)``; padding
    keys (``mask == 0``) are left out of the softmax.
    """
    mha = head.attention
    d, h = mha.embed_dim, mha.num_heads
    hd = d // h
    w, b = mha.in_proj_weight, mha.in_proj_bias
    bsz, s, _ = x.shape
    probe = head.probe.expand(bsz, 1, d)
    q = (probe @ w[:d].T + b[:d]).view(bsz, 1, h, hd).transpose(1, 2)
    k = (x @ w[d : 2 * d].T + b[d : 2 * d]).view(bsz, s, h, hd).transpose(1, 2)
    v = (x @ w[2 * d :].T + b[2 * d :]).view(bsz, s, h, hd).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)  # (B, H, 1, S)
    if mask is not None:
        scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    attn = torch.softmax(scores, dim=-1)
    out = mha.out_proj((attn @ v).transpose(1, 2).reshape(bsz, 1, d))
    pooled = out + head.mlp(head.layernorm(out))
    return attn, pooled[:, 0]


def _reference(loaded, key, image, size=None, processors=None, *, keep_graph=False):
    """The model's own eager attention (``output_attentions``), final tokens, pooling head recomputed by hand."""
    hw, inputs = _inputs(loaded, image, size, processors, key)
    if keep_graph:
        inputs["pixel_values"] = inputs["pixel_values"].clone().requires_grad_(True)
    with torch.set_grad_enabled(keep_graph):
        out = vision_tower(loaded.model)(**inputs, output_attentions=True)
        head = _head(loaded)
        pool = pooled = None
        if head is not None:
            pool, pooled = _pool_reference(head, out.last_hidden_state, inputs.get("pixel_attention_mask"))
    return dict(hw=hw, inputs=inputs, out=out, attentions=out.attentions, pool=pool, pooled=pooled)


def _real_tokens(cap) -> int:
    return cap.num_prefix_tokens + cap.grid[0] * cap.grid[1]


# --- 1. loading, sites, layout ----------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_loads_by_folder_with_its_sites(models, key):
    loaded = models[key]
    fam = loaded.family
    expected = {"clip": Clip, "siglip": Siglip, "siglip2": Siglip2}[key.split("_")[0]]
    assert type(fam) is expected
    assert fam.name == {Clip: "CLIP", Siglip: "SigLIP", Siglip2: "SigLIP 2"}[expected]
    assert loaded.config.model_type in fam.model_types
    assert type(loaded.model).__name__ == _CLASSES[key]
    assert not loaded.has_classifier
    assert loaded.patch_size == fam.patch_size(loaded.config) == (4 if key in NAFLEX_KEYS else 8)
    assert fam.size_multiple(loaded.config) == loaded.patch_size
    assert fam.interpolate_kwarg == (key not in NAFLEX_KEYS)
    sites = installed_sites(loaded.model)
    layers = _layers(loaded)
    head = _head(loaded)
    assert len(sites) == len(layers) + (head is not None)
    for site, layer in zip(sites, layers, strict=False):
        assert site.block is layer and site.attention is layer.self_attn
    if key in POOLING:
        assert head is not None
        assert sites[-1].block is head and sites[-1].attention is head.attention
        assert isinstance(sites[-1].attention, torch.nn.MultiheadAttention)
    else:
        assert head is None
    if key in TWO_TOWER:  # the text tower's layers are not sites
        text_layers = set(map(id, loaded.model.text_model.encoder.layers))
        assert not text_layers & {id(s.block) for s in sites}


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("size", [None, "other"])
def test_record_layout_prefix_grid_blocks_and_pool(models, processors, key, size):
    loaded = models[key]
    naflex = key in NAFLEX_KEYS
    other = TALL if naflex else NON_SQUARE
    img = _image(key, other if size else None)
    cap = capture(loaded, img, size=_size(key, other if size else None), attention_dtype="float32")
    p = loaded.patch_size
    if naflex:
        grid = (10, 6) if size else (7, 9)  # images (w x h) 40 x 70 and 50 x 42 in a budget of 64 patches
        assert cap.input_size == (grid[0] * p, grid[1] * p)
    else:
        grid = (3, 6) if size else (4, 4)
        assert cap.input_size == (NON_SQUARE if size else (32, 32))
    assert cap.image.shape == (*cap.input_size, 3)
    assert cap.grid == grid and len(cap.stages) == 1 and cap.patch_size == p
    assert cap.prefix_kinds == (("CLS",) if key.startswith("clip") else ())
    assert cap.family == loaded.family.name
    n_layers = VISION["num_hidden_layers"]
    heads = VISION["num_attention_heads"]
    kinds = ["global"] * n_layers + (["pool"] if key in POOLING else [])
    assert [b.kind for b in cap.blocks] == kinds
    assert cap.stages[0].blocks == tuple(range(len(kinds)))
    trailing = NAFLEX["num_patches"] - grid[0] * grid[1] if naflex else 0
    t = _real_tokens(cap)
    for b in cap.blocks:
        g = b.geometry
        assert (g.stage, g.grid, g.prefix_kinds, g.num_heads, g.trailing) == (
            0,
            grid,
            cap.prefix_kinds,
            heads,
            trailing,
        )
        assert b.attention.shape == ((heads, t + trailing) if b.kind == "pool" else (heads, t + trailing, t + trailing))
    assert cap.readout == ("head" if key in POOLING else "cls")
    assert block_label_ok(cap)
    assert loaded.family.attention_numel(loaded.config, cap.input_size) == sum(b.attention.size for b in cap.blocks)
    assert cap.logits is None and cap.predictions == ()
    norms = cap.stages[0].token_norms
    assert norms.shape == (len(cap.blocks) + 1, t)  # padding tokens left out
    if key in POOLING:  # the pooling head's row: the post-normed final tokens it reads (and changes none of)
        ref = _reference(loaded, key, img, _size(key, other if size else None), processors)
        final = ref["out"].last_hidden_state[0, :t].norm(dim=-1).numpy()
        np.testing.assert_allclose(norms[-1], final, rtol=1e-5)
        assert np.abs(norms[-1] - norms[-2]).max() > 1e-3  # not the last layer's output: post_layernorm ran
    if key.startswith("clip"):  # a plain one-grid ViT: the (L, H, T, T) stack is there
        assert cap.attentions.shape == (n_layers, heads, t, t)


def block_label_ok(cap) -> bool:
    labels = [cap.block_label(i) for i in range(cap.num_blocks)]
    expected = [f"block {i}" for i in range(VISION["num_hidden_layers"])]
    return labels == expected + (["pooling head"] if cap.blocks[-1].kind == "pool" else [])


# --- 2. parity with the model's own attention ------------------------------------------


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("size", [None, "other"])
def test_encoder_attention_equals_output_attentions(models, processors, key, size):
    loaded = models[key]
    other = TALL if key in NAFLEX_KEYS else NON_SQUARE
    img = _image(key, other if size else None)
    cap = capture(loaded, img, size=_size(key, other if size else None), attention_dtype="float32")
    ref = _reference(loaded, key, img, _size(key, other if size else None), processors)  # NaFlex: processor inputs
    assert ref["hw"] == cap.input_size
    assert len(ref["attentions"]) == VISION["num_hidden_layers"]
    for b, a in zip(cap.blocks, ref["attentions"], strict=False):
        a = a[0].numpy()
        np.testing.assert_allclose(b.attention, a, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b.fused, a.mean(0), rtol=1e-4, atol=1e-6)
    peaked = [b.entropy_norm.min() for b in cap.blocks if b.kind == "global"]
    assert min(peaked) < 0.9  # far from uniform: a wrong row would be noticed


@pytest.mark.parametrize("key", POOLING)
@pytest.mark.parametrize("size", [None, "other"])
def test_pool_head_attention_per_head_and_its_mean(models, processors, key, size):
    """Per head: recomputed from ``in_proj_weight`` / ``in_proj_bias``; head mean: what MHA returns by default."""
    loaded = models[key]
    other = TALL if key in NAFLEX_KEYS else NON_SQUARE
    img = _image(key, other if size else None)
    cap = capture(loaded, img, size=_size(key, other if size else None), attention_dtype="float32")
    ref = _reference(loaded, key, img, _size(key, other if size else None), processors)
    pool = cap.blocks[-1]
    expected = ref["pool"][0, :, 0].numpy()  # (H, S)
    np.testing.assert_allclose(pool.attention, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(pool.attention.sum(-1), 1.0, atol=1e-5)
    assert np.abs(expected - expected.mean(0)).max() > 1e-3  # heads differ: per-head weights are not the mean
    head = _head(loaded)
    x = ref["out"].last_hidden_state
    probe = head.probe.expand(1, 1, -1)
    mask = ref["inputs"].get("pixel_attention_mask")
    padding = None if mask is None else mask == 0
    with torch.no_grad():  # ``forward`` itself: no pre-hook, torch's defaults (head-averaged weights)
        _, averaged = head.attention.forward(probe, x, x, key_padding_mask=padding)
    assert averaged.shape == (1, 1, x.shape[1])
    np.testing.assert_allclose(pool.fused, averaged[0, 0].numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(cap.image_embedding, ref["pooled"][0].numpy(), rtol=1e-4, atol=1e-5)
    assert np.isnan(pool.distance).all() and (pool.entropy > 0).all()


@pytest.mark.parametrize("key", ["siglip", "siglip2"])
def test_pool_weights_pair_with_gradients(models, processors, key):
    """MHA's per-head weights are a view made after the product with the values: only its base is on the path."""
    loaded = models[key]
    _, inputs = _inputs(loaded, random_image(4), None, processors, key)
    inputs["pixel_values"] = inputs["pixel_values"].clone().requires_grad_(True)
    got = {}

    def keep(module, args, output) -> None:
        got["w"] = output[1]

    handle = _head(loaded).attention.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            out = vision_tower(loaded.model)(**inputs)
            view = got["w"]
            assert view.shape == (1, VISION["num_attention_heads"], 1, out.last_hidden_state.shape[1])
            g_view, g_base = torch.autograd.grad(out.pooler_output[0, 0], [view, view._base], allow_unused=True)
    finally:
        handle.remove()
    assert g_view is None
    assert g_base is not None and g_base.abs().max() > 0


@pytest.mark.parametrize("key", ["siglip", "siglip2"])
def test_a_batch_equals_single_images(models, key):
    """Two images in one forward: the pooling head's (B * H, 1, S) weights split per image, batch-major."""
    from vitviz.capture.forward import capture_batch

    loaded = models[key]
    images = [random_image(10, size=TALL), random_image(11, size=TALL)]
    batch = capture_batch(loaded, images, attention_dtype="float32")
    for img, got in zip(images, batch, strict=True):
        single = capture(loaded, img, attention_dtype="float32")
        assert got.input_size == single.input_size
        for a, b in zip(got.blocks, single.blocks, strict=True):
            np.testing.assert_allclose(a.attention, b.attention, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got.image_embedding, single.image_embedding, rtol=1e-4, atol=1e-5)
    assert np.abs(batch[0].blocks[-1].attention - batch[1].blocks[-1].attention).max() > 1e-4


# --- 3. image embedding, logits, forward --------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_image_embedding_is_what_the_model_compares_with_text(models, processors, key):
    loaded = models[key]
    img = random_image(5)
    cap = capture(loaded, img, attention_dtype="float32")
    _, inputs = _inputs(loaded, img, None, processors, key)
    model = loaded.model
    with torch.no_grad():
        if key in TWO_TOWER:
            features = model.get_image_features(**inputs).pooler_output[0].numpy()
            if key == "clip":  # the projection of the post-normed CLS state
                tower_out = model.vision_model(**inputs)
                np.testing.assert_allclose(features, model.visual_projection(tower_out.pooler_output)[0].numpy())
        else:
            features = model(**inputs).pooler_output
            features = None if key == "clip_vision_model" else features[0].numpy()
    if features is None:  # a CLIPVisionModel has no projection: nothing to compare with text
        assert cap.image_embedding is None
    else:
        assert cap.image_embedding.shape == features.shape
        np.testing.assert_allclose(cap.image_embedding, features, rtol=1e-5, atol=1e-6)
    assert loaded.family.logits(model, None) is None and cap.logits is None


@pytest.mark.parametrize("key", ["clip", "siglip2"])
def test_classifiers_read_out_the_pooled_query(tmp_path, key):
    """``*ForImageClassification`` shares the model type: logits from the model, readout the mean-pooled tokens."""
    loaded = load_model(str(_save(key, tmp_path / key, classifier=True, seed=7)), device="cpu")
    assert loaded.has_classifier and loaded.family.readout(loaded.config) == "pooled"
    img = random_image(6, size=(70, 40))
    cap = capture(loaded, img, attention_dtype="float32")
    _, inputs = _inputs(loaded, img)
    if key == "siglip2":
        pixels, _ = preprocess(loaded, [img], cap.input_size)
        inputs = loaded.family.model_inputs(loaded, pixels, cap.input_size)
    with torch.no_grad():
        logits = loaded.model(**inputs).logits[0].numpy()
    np.testing.assert_allclose(cap.logits, logits, rtol=1e-5, atol=1e-6)
    assert [b.kind for b in cap.blocks] == ["global"] * VISION["num_hidden_layers"]  # the head feeds no logit
    assert cap.readout == "pooled" and cap.image_embedding is None
    row, _ = capture_rollout(cap, query=POOLED)
    assert row.shape == (cap.grid[0] * cap.grid[1] + cap.num_prefix_tokens,) and row.sum() == pytest.approx(1.0)
    rel = explain_classes(loaded, img, [1])[1]
    assert np.isfinite(rel.relevance).all() and np.abs(rel.relevance).max() > 0


# --- 4. NaFlex: sizes, inputs, padding ------------------------------------------------------


@pytest.mark.parametrize("key", NAFLEX_KEYS)
def test_naflex_grids_follow_the_processor(models, processors, key):
    loaded, proc = models[key], processors[key]
    p = loaded.patch_size
    for wh in [(50, 42), TALL, WIDE, (100, 100), (300, 20), (13, 500), (33, 47), (7, 9), (2000, 1500)]:
        img = random_image(0, size=wh)
        got = proc(images=img, return_tensors="pt")
        gh, gw = got["spatial_shapes"][0].tolist()
        assert input_size_for(loaded, None, wh) == (gh * p, gw * p), wh  # the model's own budget by default
        assert gh * gw <= NAFLEX["num_patches"]
        for size in (512, (64, 200)):  # a size asked for sets the budget to its patch count
            budget = (size // p) ** 2 if isinstance(size, int) else (size[0] // p) * (size[1] // p)
            expected = proc(images=img, max_num_patches=budget, return_tensors="pt")["spatial_shapes"][0].tolist()
            assert input_size_for(loaded, size, wh) == (expected[0] * p, expected[1] * p), (wh, size)
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    rng = np.random.default_rng(0)
    for h, w, patch, budget in zip(
        *rng.integers(1, 3000, (2, 200)), rng.choice([4, 14, 16], 200), rng.choice([64, 256, 1024], 200), strict=True
    ):
        assert naflex_size((int(h), int(w)), int(patch), int(budget)) == get_image_size_for_max_num_patches(
            int(h), int(w), int(patch), int(budget)
        )


@pytest.mark.parametrize("key", NAFLEX_KEYS)
def test_naflex_inputs_equal_the_processor(models, processors, key):
    loaded, proc = models[key], processors[key]
    for wh in [(50, 42), TALL, (300, 20), (100, 100)]:
        img = random_image(1, size=wh)
        hw = input_size_for(loaded, None, img.size)
        pixels, resized = preprocess(loaded, [img], hw)
        mine = loaded.family.model_inputs(loaded, pixels, hw)
        assert set(mine) == {"pixel_values", "pixel_attention_mask", "spatial_shapes"}
        same_image = proc(images=resized[0], do_resize=False, return_tensors="pt")  # the same resized image
        from_original = proc(images=img, return_tensors="pt")  # the processor's own resize too
        for ref in (same_image, from_original):
            assert mine["pixel_values"].shape == ref["pixel_values"].shape == (1, 64, 48)
            np.testing.assert_allclose(mine["pixel_values"].numpy(), ref["pixel_values"].numpy(), atol=1e-6)
            assert torch.equal(mine["pixel_attention_mask"], ref["pixel_attention_mask"])
            assert mine["pixel_attention_mask"].dtype == ref["pixel_attention_mask"].dtype
            assert torch.equal(mine["spatial_shapes"], ref["spatial_shapes"])


def test_naflex_patch_order_and_patch_weights_match_a_convolution(models):
    """The linear patch embedding over the processor's patches equals a convolution with ``patch_weights``."""
    loaded = models["siglip2"]
    img = random_image(2, size=TALL)
    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    inputs = loaded.family.model_inputs(loaded, pixels, hw)
    emb = vision_tower(loaded.model).embeddings.patch_embedding
    p = loaded.patch_size
    w = torch.from_numpy(np.array(loaded.patch_weights))
    assert w.shape == (VISION["hidden_size"], 3, p, p)
    with torch.no_grad():
        linear = emb(inputs["pixel_values"])[0, : (hw[0] // p) * (hw[1] // p)]
        conv = torch.nn.functional.conv2d(pixels, w, emb.bias, stride=p)[0].flatten(1).T
    np.testing.assert_allclose(linear.numpy(), conv.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", NAFLEX_KEYS)
def test_naflex_padding_is_left_out_of_maps_and_reported(models, key):
    loaded = models[key]
    cap = capture(loaded, random_image(2, size=TALL), attention_dtype="float32")
    gh, gw = cap.grid
    n = gh * gw
    pad = NAFLEX["num_patches"] - n
    assert pad == 4
    for b in cap.blocks:
        g = b.geometry
        assert g.trailing == pad
        mat = select(b)
        if b.kind == "global":
            assert np.abs(b.attention[:, :n, n:]).max() == 0  # padding keys are masked for real queries
            assert np.abs(b.attention[:, n:, :n]).sum() > 0  # padding queries attend: their rows must be dropped
            m = row_map(g, mat, 3)
            np.testing.assert_allclose(m.values, mat[3, :n].reshape(gh, gw))
            assert m.padding == pytest.approx(float(mat[3, n:].sum()), abs=1e-7)
            pooled = row_map(g, mat, POOLED)
            np.testing.assert_allclose(pooled.values, mat[:n, :n].mean(0).reshape(gh, gw), rtol=1e-6)
            assert not np.allclose(pooled.values, mat[:, :n].mean(0).reshape(gh, gw))  # padding rows would change it
            assert dense(g, mat).shape == (n, n)
        else:
            m = row_map(g, mat, 0)
            assert m.values.shape == (gh, gw) and m.padding == pytest.approx(float(mat[n:].sum()), abs=1e-7)
            assert np.abs(b.attention[:, n:]).max() == 0
        assert b.entropy_norm.max() <= 1.0 + 1e-6  # normalised by the real keys only
    full = capture(loaded, random_image(2, size=(100, 100)))  # an 8 x 8 grid fills the budget: no padding
    assert full.grid == (8, 8) and all(b.geometry.trailing == 0 for b in full.blocks)


# --- 5. rollout and relevance -------------------------------------------------------------


def _dense_real(a: torch.Tensor, t: int) -> np.ndarray:
    """Head-mean of one block's model attention over the real tokens (padding rows and columns dropped)."""
    return a[0].detach().double().mean(0)[:t, :t].numpy()


@pytest.mark.parametrize("key", ["clip", "siglip", "siglip2", "siglip2_vision_model"])
def test_rollout_reads_out_from_cls_or_the_pooling_head(models, processors, key):
    loaded = models[key]
    img = random_image(7, size=TALL)
    cap = capture(loaded, img, attention_dtype="float32")
    ref = _reference(loaded, key, img, None, processors)
    t = _real_tokens(cap)
    dense_blocks = [_dense_real(a, t) for a in ref["attentions"]]
    if key == "clip":
        readout = np.eye(t)[0]
    else:
        readout = ref["pool"][0, :, 0].double().mean(0)[:t].numpy()  # the fused pooling-head row, padding dropped
    expected = rollout_reference(dense_blocks, [0] * len(dense_blocks), {}, readout)
    row, stage = capture_rollout(cap)
    assert stage == 0 and row.shape == (t,)
    np.testing.assert_allclose(row, expected, rtol=1e-4, atol=1e-7)
    if key != "clip":  # the pooling head's row matters: the mean-pooled readout gives another map
        pooled = rollout_reference(dense_blocks, [0] * len(dense_blocks), {}, np.full(t, 1.0 / t))
        assert np.abs(pooled - expected).max() > 1e-4


@pytest.mark.parametrize("key", ["clip", "siglip", "siglip2"])
def test_relevance_for_an_image_embedding_component(models, processors, key):
    loaded = models[key]
    family, model = loaded.family, loaded.model
    img = random_image(8, size=WIDE)

    def first_component(out):
        return family.image_embedding(model, out)[0, 0]

    got = explain_targets(loaded, img, {0: ("embedding[0]", first_component)})[0]
    ref = _reference(loaded, key, img, None, processors, keep_graph=True)
    cap = capture(loaded, img)
    t = _real_tokens(cap)
    if key == "clip":
        target = model.visual_projection(ref["out"].pooler_output)[0, 0]
        tensors = list(ref["attentions"])
    else:
        np.testing.assert_allclose(ref["pooled"].detach().numpy(), ref["out"].pooler_output.detach().numpy(), atol=1e-5)
        target = ref["pooled"][0, 0]  # the hand-made head: its attention is on the path
        tensors = [*ref["attentions"], ref["pool"]]
    grads = torch.autograd.grad(target, tensors)
    abar = [
        (g[0] * a[0]).detach().double().clamp(min=0).mean(0)[:t, :t].numpy()
        for a, g in zip(ref["attentions"], grads, strict=False)
    ]
    if key == "clip":
        readout = np.eye(t)[0]
    else:
        readout = (grads[-1][0, :, 0] * ref["pool"][0, :, 0]).detach().double().clamp(min=0).mean(0)[:t].numpy()
    expected = relevance_reference(abar, [0] * len(abar), {}, readout)
    assert got.readout == ("CLS" if key == "clip" else "pooling head")
    assert got.grid == cap.grid and got.num_prefix_tokens == cap.num_prefix_tokens
    assert got.relevance.shape == (t,) and np.abs(expected).max() > 0
    np.testing.assert_allclose(got.relevance, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


# --- 6. position tables, patch filters, budget -----------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_position_tables_on_the_native_grid(models, key):
    loaded = models[key]
    table = vision_tower(loaded.model).embeddings.position_embedding.weight.detach().numpy()
    info = loaded.position
    assert len(info.tables) == 1 and info.biases == ()
    pt = info.tables[0]
    if key.startswith("clip"):  # CLS row first: dropped
        assert pt.grid == (4, 4)
        np.testing.assert_array_equal(pt.embeddings, table[1:])
    elif key in NAFLEX_KEYS:  # the native table, resized per image by the model
        assert pt.grid == (8, 8)
        np.testing.assert_array_equal(pt.embeddings, table)
        assert "resizes this 8 x 8 table to each image's patch grid" in info.note
    else:
        assert pt.grid == (4, 4)
        np.testing.assert_array_equal(pt.embeddings, table)
    assert key in NAFLEX_KEYS or info.note == ""
    assert not pt.embeddings.flags.writeable
    cap = capture(loaded, random_image(9))
    assert cap.position_grid == pt.grid and cap.position_embeddings is pt.embeddings


@pytest.mark.parametrize("key", ["clip", "siglip_vision_model"])
def test_patch_weights_are_the_patch_convolution(models, key):
    loaded = models[key]
    conv = vision_tower(loaded.model).embeddings.patch_embedding
    np.testing.assert_array_equal(loaded.patch_weights, conv.weight.detach().numpy())
    assert loaded.patch_weights.shape == (VISION["hidden_size"], 3, 8, 8)


@pytest.mark.parametrize("key", ["clip", "siglip"])
def test_huge_input_is_refused_before_any_forward(models, key):
    loaded = models[key]
    with pytest.raises(BudgetError, match="smaller input size"):
        capture(loaded, random_image(0), size=2048)
    with pytest.raises(BudgetError, match="gradients"):
        explain_targets(loaded, random_image(0), {0: ("x", lambda out: out.last_hidden_state.sum())}, size=1024)


def test_naflex_never_exceeds_its_budget(models):
    loaded = models["siglip2"]
    fam, cfg = loaded.family, loaded.config
    for wh in [(4000, 3000), (30, 4000)]:
        hw = input_size_for(loaded, None, wh)
        assert (hw[0] // 4) * (hw[1] // 4) <= NAFLEX["num_patches"]
        t = NAFLEX["num_patches"]
        assert fam.attention_numel(cfg, hw) == VISION["num_hidden_layers"] * 4 * t * t + 4 * t
        big = input_size_for(loaded, 64, wh)  # a budget of (64 / 4)^2 = 256 patches, over the model's 64
        t = (big[0] // 4) * (big[1] // 4)
        assert NAFLEX["num_patches"] < t <= 256
        assert fam.attention_numel(cfg, big) == VISION["num_hidden_layers"] * 4 * t * t + 4 * t
