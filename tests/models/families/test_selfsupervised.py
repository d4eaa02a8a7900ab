"""DINOv3, ViT-MAE, I-JEPA, AIMv2, data2vec-vision, ViT-MSN: layouts, parity, MAE's order, rollout, relevance.

Every model is a tiny random-weight ``transformers`` model written to a folder
(safetensors + an image processor config) and loaded through vitviz's own loader.
References never use vitviz's code: the models' own ``output_attentions`` (eager),
attention recomputed by hand from the q / k projections (DINOv3 with its rotary
embeddings written out here, ViT-MAE from embeddings built here in grid order),
AIMv2's pooling head written out here, dense rollout and Chefer relevance from
``reference``.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import relevance_reference, rollout_reference

from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes, explain_targets
from vitviz.errors import BudgetError
from vitviz.models.families import family_for
from vitviz.models.families.selfsupervised import Aimv2, Data2VecVision, _MaskRatioView
from vitviz.models.hooks import installed_sites
from vitviz.models.load import load_model
from vitviz.record import POOLED

TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8
)
LABELS = {"id2label": {0: "a", 1: "b", 2: "c"}, "label2id": {"a": 0, "b": 1, "c": 2}}
OTHER = (24, 40)  # a non-square input: grid 3 x 5 instead of the native 4 x 4
KEYS = ("dinov3", "mae", "ijepa", "aimv2_vision", "aimv2_native", "aimv2", "data2vec", "msn")
RESIZABLE = tuple(k for k in KEYS if k not in ("aimv2_vision", "aimv2"))  # learned AIMv2 tables: native size only
CLASSIFIERS = ("ijepa", "data2vec", "msn")
EXPECTED = {  # model_type, class loaded, prefix kinds, readout, blocks (layers + pooling head)
    "dinov3": ("dinov3_vit", "DINOv3ViTModel", ("CLS", "REG0", "REG1"), "cls", 2),
    "mae": ("vit_mae", "ViTMAEForPreTraining", ("CLS",), "cls", 2),
    "ijepa": ("ijepa", "IJepaForImageClassification", (), "pooled", 2),
    "aimv2_vision": ("aimv2_vision_model", "Aimv2VisionModel", (), "head", 3),
    "aimv2_native": ("aimv2_vision_model", "Aimv2VisionModel", (), "pooled", 2),
    "aimv2": ("aimv2", "Aimv2Model", (), "head", 3),
    "data2vec": ("data2vec-vision", "Data2VecVisionForImageClassification", ("CLS",), "pooled", 2),
    "msn": ("vit_msn", "ViTMSNForImageClassification", ("CLS",), "cls", 2),
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(key: str):
    import transformers as tf

    if key == "dinov3":
        return tf.DINOv3ViTModel(tf.DINOv3ViTConfig(**TINY, num_register_tokens=2))
    if key == "mae":  # the released checkpoints' class: vitviz runs its encoder (``vit``) only
        mae = dict(decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2)
        return tf.ViTMAEForPreTraining(tf.ViTMAEConfig(**TINY, **mae, decoder_intermediate_size=32))
    if key == "ijepa":
        return tf.IJepaForImageClassification(tf.IJepaConfig(**TINY, **LABELS))
    if key == "aimv2_vision":
        return tf.Aimv2VisionModel(tf.Aimv2VisionConfig(**TINY))
    if key == "aimv2_native":
        return tf.Aimv2VisionModel(tf.Aimv2VisionConfig(**TINY, is_native=True, use_head=False))
    if key == "aimv2":
        text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100)
        text.update(max_position_embeddings=16, eos_token_id=2, pad_token_id=1, bos_token_id=0)
        return tf.Aimv2Model(tf.Aimv2Config(vision_config=dict(TINY), text_config=text, projection_dim=16))
    if key == "data2vec":
        return tf.Data2VecVisionForImageClassification(
            tf.Data2VecVisionConfig(**TINY, **LABELS, use_relative_position_bias=True)
        )
    if key == "msn":
        return tf.ViTMSNForImageClassification(tf.ViTMSNConfig(**TINY, **LABELS))
    raise KeyError(key)


def _save(key: str, folder: Path, *, seed: int = 0) -> Path:
    from transformers import ViTImageProcessor

    torch.manual_seed(seed)
    model = _model(key)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # far from the 0.02-std init: peaked attention, non-zero tables, biases that matter
        for name, p in model.named_parameters():
            if key == "mae" and ("position_embeddings" in name or "pos_embed" in name):
                continue  # MAE's tables are the fixed 2-D sin-cos the model built
            if "relative_position_bias_table" in name:
                p.copy_(1.5 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                fan_in = p[0].numel() if p.dim() in (2, 4) else p.shape[-1]
                gain = 4.0 if name.endswith(("q_proj.weight", "k_proj.weight", "query.weight", "key.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * gain / fan_in**0.5)
            elif name.endswith("weight") or "lambda" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-selfsupervised")
    return {k: _save(k, root / k) for k in KEYS}


@pytest.fixture(scope="module")
def models(dirs):
    return {k: load_model(str(d), device="cpu") for k, d in dirs.items()}


@pytest.fixture(scope="module")
def mae_reference(dirs):
    """A second ViT-MAE instance whose *own* config has mask_ratio 0 (the shared model's keeps 0.75)."""
    from transformers import ViTMAEModel

    model = ViTMAEModel.from_pretrained(dirs["mae"], mask_ratio=0.0, attn_implementation="eager")
    return model.eval().requires_grad_(False)


def _pixels(loaded, image, size=None) -> tuple[torch.Tensor, tuple[int, int]]:
    hw = input_size_for(loaded, size)
    return preprocess(loaded, [image], hw)[0], hw


def _tower(loaded):
    return loaded.model.vision_model if loaded.config.model_type == "aimv2" else loaded.model


def _own_forward(key, loaded, pixels, mae_reference=None):
    """The model's own forward with ``output_attentions`` (eager): (output, per-layer probabilities (B, H, T, T))."""
    model = loaded.model
    if key == "mae":
        n = pixels.shape[-2] // 8 * (pixels.shape[-1] // 8)
        noise = torch.arange(n, dtype=torch.float32)[None]  # grid order, given to a model whose own ratio is 0
        out = mae_reference(pixel_values=pixels, noise=noise, interpolate_pos_encoding=True, output_attentions=True)
    elif key in ("ijepa", "msn"):
        out = model(pixel_values=pixels, interpolate_pos_encoding=True, output_attentions=True)
    elif key == "aimv2":
        out = model.get_image_features(pixel_values=pixels, output_attentions=True)
    else:
        out = model(pixel_values=pixels, output_attentions=True)
    return out, list(out.attentions)


def _head_by_hand(loaded, out):
    """AIMv2's pooling head written out here: (image feature, probabilities (B, H, 1, N)) from the final tokens."""
    tower = _tower(loaded)
    head = tower.head
    hidden = out.last_hidden_state  # the final tokens after the tower's RMSNorm (get_image_features keeps them too)
    b, n, d = hidden.shape
    heads = tower.config.num_attention_heads
    hd = d // heads
    k = head.k_proj(hidden).view(b, n, heads, hd).transpose(1, 2)
    v = head.v_proj(hidden).view(b, n, heads, hd).transpose(1, 2)
    q = head.cls_token.view(1, heads, 1, hd)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)  # (B, H, 1, N)
    feature = head.output_proj((a @ v).transpose(1, 2).reshape(b, d))
    if loaded.config.model_type == "aimv2":
        feature = loaded.model.visual_projection(feature)
    return feature, a


# --- 1. loading and layout -------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_loads_from_a_folder_with_its_layout(models, key):
    loaded = models[key]
    model_type, cls, prefix, readout, blocks = EXPECTED[key]
    assert loaded.config.model_type == model_type and type(loaded.model).__name__ == cls
    assert family_for(loaded.config) is loaded.family and model_type in loaded.family.model_types
    assert loaded.has_classifier == (key in CLASSIFIERS)
    assert loaded.patch_size == 8 and loaded.default_size == (32, 32)
    cap = capture(loaded, random_image(0), attention_dtype="float32")
    assert len(cap.stages) == 1 and cap.grid == (4, 4)
    assert cap.prefix_kinds == prefix and cap.num_tokens == len(prefix) + 16
    assert cap.readout == readout and cap.num_blocks == blocks == len(installed_sites(loaded.model))
    assert [b.kind for b in cap.blocks] == ["global"] * 2 + ["pool"] * (blocks - 2)
    assert cap.blocks[-1].attention.shape == ((4, 16) if blocks == 3 else (4, len(prefix) + 16, len(prefix) + 16))
    assert cap.token_norms.shape == (blocks + 1, cap.num_tokens)
    assert cap.patch_weights.shape == (32, 3, 8, 8)
    assert loaded.family.attention_numel(loaded.config, cap.input_size) == sum(b.attention.size for b in cap.blocks)
    assert (cap.logits is not None) == (key in CLASSIFIERS)
    if key in CLASSIFIERS:
        assert cap.predictions[0].index == int(np.argmax(cap.logits))
    assert cap.token_label(len(prefix) + 5) == "patch (1, 1)"
    assert not cap.is_hierarchical and cap.attentions.shape == (2, 4, cap.num_tokens, cap.num_tokens)
    for layer, b in enumerate(cap.blocks[:2]):
        np.testing.assert_array_equal(cap.attentions[layer], b.attention)
    if blocks == 3:
        assert cap.block_label(2) == "pooling head"


def test_patch_weights_are_the_first_convolution(models):
    convs = {
        "dinov3": lambda m: m.embeddings.patch_embeddings,
        "mae": lambda m: m.vit.embeddings.patch_embeddings.projection,
        "ijepa": lambda m: m.ijepa.embeddings.patch_embeddings.projection,
        "aimv2_vision": lambda m: m.embeddings.patch_embed,
        "aimv2": lambda m: m.vision_model.embeddings.patch_embed,
        "data2vec": lambda m: m.data2vec_vision.embeddings.patch_embeddings.projection,
        "msn": lambda m: m.vit.embeddings.patch_embeddings.projection,
    }
    for key, conv in convs.items():
        np.testing.assert_array_equal(models[key].patch_weights, conv(models[key].model).weight.numpy())


@pytest.mark.parametrize("key", RESIZABLE)
def test_another_size_gives_its_grid(models, key):
    loaded = models[key]
    cap = capture(loaded, random_image(1, size=(100, 60)), size=OTHER, attention_dtype="float32")
    assert cap.input_size == OTHER and cap.grid == (3, 5)
    assert cap.num_tokens == len(EXPECTED[key][2]) + 15
    assert all(b.attention.shape[-1] == cap.num_tokens for b in cap.blocks)


@pytest.mark.parametrize("key", ["aimv2_vision", "aimv2"])
def test_learned_aimv2_table_refuses_other_sizes(models, key):
    with pytest.raises(BudgetError, match=r"runs only at 32 x 32 px.*learned position table.*Choose 32 px"):
        capture(models[key], random_image(2), size=OTHER)
    with pytest.raises(BudgetError, match="runs only at"):
        explain_targets(models[key], random_image(2), {0: ("x", lambda out: out.pooler_output.sum())}, size=48)


@pytest.mark.parametrize("key", KEYS)
def test_huge_input_is_refused_before_any_forward(models, key):
    with pytest.raises(BudgetError):
        capture(models[key], random_image(0), size=2048)


def test_budget_message_where_the_size_is_allowed(models):
    with pytest.raises(BudgetError, match="smaller input size"):
        capture(models["dinov3"], random_image(0), size=2048)
    with pytest.raises(BudgetError, match="gradients"):
        explain_classes(models["msn"], random_image(0), [0], size=1024)


# --- 2. parity with the models' own attention -------------------------------------------------


@pytest.mark.parametrize(("key", "size"), [(k, None) for k in KEYS] + [(k, OTHER) for k in RESIZABLE])
def test_every_block_equals_the_models_own_output_attentions(models, mae_reference, key, size):
    loaded = models[key]
    img = random_image(3)
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    pixels, _ = _pixels(loaded, img, size)
    with torch.no_grad():
        out, own = _own_forward(key, loaded, pixels, mae_reference)
        assert len(own) == 2
        for b, a in zip(cap.blocks, own, strict=False):
            np.testing.assert_allclose(b.attention, a[0].numpy(), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(b.fused, a[0].mean(0).numpy(), rtol=1e-4, atol=1e-6)
            assert (b.entropy_norm < 0.97).any()  # peaked: a wrong row would show
        if EXPECTED[key][4] == 3:  # the pooling head against the head written out here
            feature, probe = _head_by_hand(loaded, out)
            np.testing.assert_allclose(cap.blocks[2].attention, probe[0, :, 0].numpy(), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(cap.blocks[2].attention.sum(-1), 1.0, atol=1e-5)
            np.testing.assert_allclose(out.pooler_output.numpy(), feature.numpy(), rtol=1e-4, atol=1e-6)
    if key in CLASSIFIERS:
        np.testing.assert_allclose(cap.logits, out.logits[0].numpy(), rtol=1e-4, atol=1e-6)


def test_default_float16_record_matches_output_attentions(models):
    loaded = models["dinov3"]
    img = random_image(4)
    cap = capture(loaded, img)
    assert cap.attention_precision == "float16"
    with torch.no_grad():
        own = loaded.model(pixel_values=_pixels(loaded, img)[0], output_attentions=True).attentions
    np.testing.assert_allclose(cap.attentions.astype(np.float32), torch.cat(own).numpy(), atol=1e-3)


# --- 3. DINOv3: registers and rotary embeddings -------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def _dinov3_by_hand(loaded, image, size=None, *, rotate: str = "patches") -> list[np.ndarray]:
    """softmax(q k^T / sqrt(d)) from each layer's q / k projections, RoPE applied here to ``rotate`` tokens.

    RoPE as in the DINOv3 paper: patch centres on [-1, 1] (row, column), periods
    ``theta ** (4 i / head_dim)``, angle ``2 pi * coord / period``, the row angles then
    the column angles, repeated for both halves; ``x cos + rotate_half(x) sin``.
    """
    cfg = loaded.config
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    grabbed: dict[str, torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(loaded.model.model.layer):
        for what in ("q_proj", "k_proj"):
            mod = getattr(layer.attention, what)
            handles.append(mod.register_forward_hook(lambda m, a, o, k=f"{i}.{what}": grabbed.__setitem__(k, o)))
    try:
        pixels, (h, w) = _pixels(loaded, image, size)
        with torch.no_grad():
            loaded.model(pixel_values=pixels)
    finally:
        for handle in handles:
            handle.remove()
    gh, gw = h // 8, w // 8
    ys = (torch.arange(gh, dtype=torch.float64) + 0.5) / gh * 2 - 1
    xs = (torch.arange(gw, dtype=torch.float64) + 0.5) / gw * 2 - 1
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    periods = cfg.rope_theta ** (torch.arange(0, d // 4, dtype=torch.float64) * 4 / d)
    angles = torch.cat([2 * math.pi * yy.reshape(-1, 1) / periods, 2 * math.pi * xx.reshape(-1, 1) / periods], dim=1)
    angles = torch.cat([angles, angles], dim=1)  # (N, d)
    cos, sin = angles.cos(), angles.sin()
    p = 1 + cfg.num_register_tokens
    out = []
    for i in range(cfg.num_hidden_layers):
        q = grabbed[f"{i}.q_proj"][0].double().view(-1, heads, d).transpose(0, 1)
        k = grabbed[f"{i}.k_proj"][0].double().view(-1, heads, d).transpose(0, 1)
        if rotate == "patches":
            q = torch.cat([q[:, :p], q[:, p:] * cos + _rotate_half(q[:, p:]) * sin], dim=1)
            k = torch.cat([k[:, :p], k[:, p:] * cos + _rotate_half(k[:, p:]) * sin], dim=1)
        out.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1).numpy())
    return out


@pytest.mark.parametrize("size", [None, OTHER])
def test_dinov3_equals_recomputation_with_rotary_on_patches_only(models, size):
    loaded = models["dinov3"]
    img = random_image(5)
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    ref = _dinov3_by_hand(loaded, img, size)
    for b, a in zip(cap.blocks, ref, strict=True):
        np.testing.assert_allclose(b.attention, a, rtol=1e-4, atol=1e-6)
    without = _dinov3_by_hand(loaded, img, size, rotate="none")  # the reference notices a missing rotation
    assert max(np.abs(b.attention - a).max() for b, a in zip(cap.blocks, without, strict=True)) > 1e-2


def test_dinov3_registers_are_prefix_tokens(models):
    loaded = models["dinov3"]
    cap = capture(loaded, random_image(6))
    assert loaded.config.num_register_tokens == 2
    assert cap.token_kinds[:4] == ("CLS", "REG0", "REG1", "patch")
    assert [cap.token_label(i) for i in range(3)] == ["CLS", "REG0", "REG1"]
    assert cap.default_query(0) == 0 and cap.token_centre(0, 2) is None


# --- 4. ViT-MAE: every patch, in grid order -----------------------------------------------------


def _mae_by_hand(loaded, image, size=None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Token norms entering layer 0 and every layer's softmax(q k^T / sqrt(d)), in grid order built here.

    The embeddings are assembled here without ``random_masking``: CLS + its table
    row, then patch i + table row i + 1 for i in row-major order (the table
    interpolated by the model's own ``interpolate_pos_encoding`` at other sizes).
    """
    model = loaded.base_model  # the encoder of the pre-training checkpoint
    cfg = model.config
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    pixels, (h, w) = _pixels(loaded, image, size)
    emb = model.embeddings
    with torch.no_grad():
        patches = emb.patch_embeddings(pixels)
        table = emb.interpolate_pos_encoding(patches, h, w)
        tokens = torch.cat([emb.cls_token + table[:, :1], patches + table[:, 1:]], dim=1)
        norms = tokens[0].norm(dim=-1).numpy()
        attn = []
        x = tokens
        for layer in model.layers:
            y = layer.layernorm_before(x)
            q = layer.attention.q_proj(y)[0].view(-1, heads, d).transpose(0, 1)
            k = layer.attention.k_proj(y)[0].view(-1, heads, d).transpose(0, 1)
            attn.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1).numpy())
            x = layer(x)
    return norms, attn


@pytest.mark.parametrize("size", [None, OTHER])
def test_mae_sees_every_patch_in_grid_order(models, size):
    loaded = models["mae"]
    img = random_image(7)
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    norms, ref = _mae_by_hand(loaded, img, size)
    np.testing.assert_allclose(cap.token_norms[0], norms, rtol=1e-5)
    for b, a in zip(cap.blocks, ref, strict=True):
        np.testing.assert_allclose(b.attention, a, rtol=1e-4, atol=1e-6)
    again = capture(loaded, img, size=size, attention_dtype="float32")
    np.testing.assert_array_equal(again.attentions, cap.attentions)


def test_mae_default_noise_would_shuffle_the_maps(models, mae_reference):
    """With mask ratio 0 but the model's own random noise, tokens come in a random order: other attention."""
    loaded = models["mae"]
    img = random_image(8)
    cap = capture(loaded, img, attention_dtype="float32")
    pixels, _ = _pixels(loaded, img)
    torch.manual_seed(1)
    with torch.no_grad():
        shuffled = mae_reference(pixel_values=pixels, output_attentions=True)
    assert shuffled.attentions[0].shape[-1] == 17  # all kept, but ...
    assert not torch.equal(shuffled.ids_restore[0], torch.arange(16))  # ... not in grid order
    assert np.abs(cap.attentions[0] - shuffled.attentions[0][0].numpy()).max() > 1e-2
    by_grid = [np.asarray(a) for a in _mae_by_hand(loaded, img)[1]]
    assert np.abs(by_grid[0] - shuffled.attentions[0][0].numpy()).max() > 1e-2


def test_mae_shared_config_keeps_its_mask_ratio(models):
    loaded = models["mae"]
    model, cfg = loaded.base_model, loaded.config
    capture(loaded, random_image(9))
    assert cfg.mask_ratio == 0.75 and model.config is cfg and loaded.model.decoder.config is not cfg
    view = model.embeddings.config
    assert isinstance(view, _MaskRatioView) and view._shared is cfg  # a view of the same object, not a copy
    assert view.mask_ratio == 0.75 and view.hidden_size == cfg.hidden_size
    pixels, _ = _pixels(loaded, random_image(9))
    with torch.no_grad():  # outside vitviz the model masks as transformers does: 1 CLS + 16 / 4 patches
        direct = model(pixel_values=pixels)
    assert direct.last_hidden_state.shape[1] == 1 + 4 and int(direct.mask.sum()) == 12
    with torch.no_grad():  # and so does the whole pre-training model
        assert int(loaded.model(pixel_values=pixels).mask.sum()) == 12


def test_mae_ratio_is_per_call_across_threads(models):
    """Captures and direct calls at once: every capture sees all 16 patches, every direct call 4."""
    loaded = models["mae"]
    img = random_image(10)
    pixels, _ = _pixels(loaded, img)
    expected = capture(loaded, img, attention_dtype="float32").attentions

    def job(i: int):
        if i % 2:
            with torch.no_grad():
                return loaded.base_model(pixel_values=pixels).last_hidden_state.shape[1]
        return capture(loaded, img, attention_dtype="float32").attentions

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(job, range(8)))
    for i, r in enumerate(results):
        if i % 2:
            assert r == 5
        else:
            np.testing.assert_array_equal(r, expected)


# --- 5. position information ---------------------------------------------------------------------


def test_position_information_per_family(models):
    from transformers.models.aimv2.modeling_aimv2 import build_2d_sinusoidal_position_embedding

    dino = models["dinov3"].position
    assert dino.tables == () and dino.biases == ()
    assert "rotary" in dino.note and "no position-embedding table" in dino.note and "registers" in dino.note

    mae = models["mae"].position
    table = models["mae"].base_model.embeddings.position_embeddings[0]
    assert len(mae.tables) == 1 and mae.tables[0].grid == (4, 4) and "sin-cos" in mae.note
    assert not table[0].any()  # the CLS row (zeros) is the one left out
    np.testing.assert_array_equal(mae.tables[0].embeddings, table[1:].numpy())

    ijepa = models["ijepa"].position  # one row per patch, no prefix rows
    np.testing.assert_array_equal(
        ijepa.tables[0].embeddings, models["ijepa"].model.ijepa.embeddings.position_embeddings[0].numpy()
    )
    msn = models["msn"].position
    np.testing.assert_array_equal(
        msn.tables[0].embeddings, models["msn"].model.vit.embeddings.position_embeddings[0, 1:]
    )

    for key in ("aimv2_vision", "aimv2"):  # learned: the embedding table itself
        pos = models[key].position
        weight = _tower(models[key]).embeddings.position_embedding.weight
        assert pos.tables[0].grid == (4, 4)
        np.testing.assert_array_equal(pos.tables[0].embeddings, weight.numpy())
    native = models["aimv2_native"].position  # fixed sin-cos with AIMv2's (column, row) half order
    sincos = build_2d_sinusoidal_position_embedding(4, 4, embed_dim=32)
    sincos = torch.cat([sincos[:, 16:], sincos[:, :16]], dim=1)
    np.testing.assert_allclose(native.tables[0].embeddings, sincos.numpy(), atol=1e-5)
    assert "not learned" in native.note

    d2v = models["data2vec"].position
    assert d2v.tables == () and "relative position bias" in d2v.note and "every layer" in d2v.note


def test_data2vec_position_sentences_follow_the_config():
    from transformers import Data2VecVisionConfig

    fam = Data2VecVision()
    shared = fam.position_note(Data2VecVisionConfig(use_shared_relative_position_bias=True))
    assert "shared by all layers" in shared and "no absolute" in shared
    both = fam.position_note(
        Data2VecVisionConfig(use_relative_position_bias=True, use_absolute_position_embeddings=True)
    )
    assert "also has absolute" in both
    assert "no position information" in fam.position_note(Data2VecVisionConfig())
    assert fam.position_note(Data2VecVisionConfig(use_absolute_position_embeddings=True)) == ""


def test_data2vec_absolute_table_without_prefix_row(tmp_path):
    from transformers import Data2VecVisionConfig, Data2VecVisionModel, ViTImageProcessor

    torch.manual_seed(0)
    model = Data2VecVisionModel(Data2VecVisionConfig(**TINY, use_absolute_position_embeddings=True))
    with torch.no_grad():
        model.embeddings.position_embeddings.normal_()
    model.save_pretrained(tmp_path, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    table = loaded.position.tables[0]
    np.testing.assert_array_equal(table.embeddings, model.embeddings.position_embeddings[0, 1:].detach().numpy())
    assert "no position information" not in loaded.position_note
    cap = capture(loaded, random_image(0), size=OTHER)  # the absolute table is interpolated by the model itself
    assert cap.grid == (3, 5) and cap.readout == "pooled"


# --- 6. AIMv2's pooling head ---------------------------------------------------------------------


def test_aimv2_head_is_the_models_own_outside_vitviz(models):
    """The explicit head reproduces the fused kernel's feature, and outside a capture nothing is replaced."""
    from vitviz.models.families.selfsupervised import _AIMV2_HEAD, pool_with_weights

    loaded = models["aimv2_vision"]
    fam: Aimv2 = loaded.family
    pixels, _ = _pixels(loaded, random_image(11))
    with torch.no_grad():
        plain = loaded.model(pixel_values=pixels)
        assert _AIMV2_HEAD.get() is None
        own = fam.forward(loaded.model, {"pixel_values": pixels})
        mine, probs = pool_with_weights(loaded.model.head, plain.last_hidden_state)
    np.testing.assert_allclose(own.pooler_output.numpy(), plain.pooler_output.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mine.numpy(), plain.pooler_output.numpy(), rtol=1e-5, atol=1e-6)
    assert probs.shape == (1, 4, 1, 16)


def test_aimv2_two_tower_gives_the_image_embedding_and_no_logits(models):
    loaded = models["aimv2"]
    img = random_image(12)
    cap = capture(loaded, img, attention_dtype="float32")
    pixels, _ = _pixels(loaded, img)
    with torch.no_grad():
        features = loaded.model.get_image_features(pixel_values=pixels).pooler_output
    assert cap.logits is None and cap.predictions == ()
    assert cap.image_embedding.shape == (16,)
    np.testing.assert_allclose(cap.image_embedding, features[0].numpy(), rtol=1e-5, atol=1e-6)
    assert capture(models["aimv2_vision"], img).image_embedding is None


# --- 7. rollout and relevance --------------------------------------------------------------------


def _readout(key: str, num_tokens: int, prefix: int) -> np.ndarray:
    """CLS one-hot, or the mean over the patch rows where the model mean-pools (data2vec's classifier, I-JEPA)."""
    u = np.zeros(num_tokens)
    if prefix and key != "data2vec":
        u[0] = 1.0
    else:
        u[prefix:] = 1.0 / (num_tokens - prefix)
    return u


@pytest.mark.parametrize("key", KEYS)
def test_rollout_equals_dense_reference(models, mae_reference, key):
    loaded = models[key]
    img = random_image(13)
    cap = capture(loaded, img, attention_dtype="float32")
    pixels, _ = _pixels(loaded, img)
    with torch.no_grad():
        out, own = _own_forward(key, loaded, pixels, mae_reference)
        dense = [a[0].double().mean(0).numpy() for a in own]
        p = cap.num_prefix_tokens
        if EXPECTED[key][4] == 3:
            readout = _head_by_hand(loaded, out)[1][0, :, 0].double().mean(0).numpy()
        else:
            readout = _readout(key, cap.num_tokens, p)
    expected = rollout_reference(dense, [0] * len(dense), {}, readout)
    row, stage = capture_rollout(cap)  # the model's readout: CLS, the head's row, or the pooled query
    assert stage == 0
    np.testing.assert_allclose(row, expected, rtol=1e-4, atol=1e-7)


_PROBE = torch.linspace(-1.0, 1.0, 32)


def _target(key: str):
    """A scalar of the output for backbones; the class logit 1 for classifiers."""
    if key in CLASSIFIERS:
        return lambda out: out.logits[0, 1]
    if key in ("aimv2_vision", "aimv2"):
        return lambda out: (out.pooler_output[0] * _PROBE[: out.pooler_output.shape[-1]]).sum()
    if key == "aimv2_native":
        return lambda out: (out.last_hidden_state[0].mean(0) * _PROBE).sum()
    return lambda out: (out.last_hidden_state[0, 0] * _PROBE).sum()


@pytest.mark.parametrize("key", KEYS)
def test_relevance_equals_chefer_reference_with_own_gradients(models, mae_reference, key):
    loaded = models[key]
    img = random_image(14)
    target = _target(key)
    if key in CLASSIFIERS:
        got = explain_classes(loaded, img, [1])[1]
    else:
        got = explain_targets(loaded, img, {1: ("probe", target)})[1]
    pixels, _ = _pixels(loaded, img)
    pixels.requires_grad_(True)
    with torch.enable_grad():
        out, own = _own_forward(key, loaded, pixels, mae_reference)
        tensors = list(own)
        if EXPECTED[key][4] == 3:
            feature, probe = _head_by_hand(loaded, out)
            np.testing.assert_allclose(feature.detach().numpy(), out.pooler_output.detach().numpy(), atol=1e-5)
            scalar = (feature[0] * _PROBE[: feature.shape[-1]]).sum()
            tensors.append(probe)
        else:
            scalar = target(out)
        grads = torch.autograd.grad(scalar, tensors)
    abar = [(g[0] * a[0]).detach().double().clamp(min=0).mean(0).numpy() for g, a in zip(grads, tensors, strict=True)]
    if EXPECTED[key][4] == 3:
        abar[-1] = abar[-1][0]  # the probe's one row
    t = got.relevance.shape[0]
    p = len(EXPECTED[key][2])
    if EXPECTED[key][4] == 3:
        readout, abar = abar[-1], abar[:-1]
        assert got.readout == "pooling head"
    else:
        readout = _readout(key, t, p)
        assert got.readout == ("CLS" if readout[0] == 1 else "pooled query")
    expected = relevance_reference(abar, [0] * len(abar), {}, readout)
    assert np.abs(expected).max() > 0
    assert got.grid == (4, 4) and got.num_prefix_tokens == p
    np.testing.assert_allclose(got.relevance, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


def test_data2vec_reads_the_mean_of_its_patches_not_cls(models):
    """``use_mean_pooling``: the classifier reads LayerNorm(mean of the final patch tokens); CLS is not read."""
    loaded = models["data2vec"]
    img = random_image(15)
    cap = capture(loaded, img, attention_dtype="float32")
    assert cap.readout == "pooled" and cap.prefix_kinds == ("CLS",)
    np.testing.assert_allclose(capture_rollout(cap)[0], capture_rollout(cap, query=POOLED)[0], atol=1e-7)
    assert np.abs(capture_rollout(cap)[0] - capture_rollout(cap, query=0)[0]).max() > 1e-4
    assert explain_classes(loaded, img, [0])[0].readout == "pooled query"
    model = loaded.model
    pixels, _ = _pixels(loaded, img)
    with torch.no_grad():
        hidden = model.data2vec_vision(pixel_values=pixels).last_hidden_state
        logits = model.classifier(model.data2vec_vision.pooler.layernorm(hidden[:, 1:].mean(1)))
    np.testing.assert_allclose(cap.logits, logits[0].numpy(), rtol=1e-5, atol=1e-6)
