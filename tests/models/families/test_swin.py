"""Swin and Swin V2: every block's attention against an independent recomputation in the original frame.

The reference never uses vitviz's window code: it computes q and k for every
position of the padded grid from the block's own projections, and for each real
query allows the keys of its shifted window, adds the relative bias at the offset
inside that window and the shift mask between regions, and takes the softmax.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import centres, mean_distance_reference, merge_matrix, relevance_reference, rollout_reference

from vitviz.analysis.blocks import dense, row_map, select
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.errors import BudgetError
from vitviz.models.load import load_model


def _save(folder, version: int, *, seed: int = 0):
    from transformers import (
        SwinConfig,
        SwinForImageClassification,
        Swinv2Config,
        Swinv2ForImageClassification,
        ViTImageProcessor,
    )

    torch.manual_seed(seed)
    cfg_cls, model_cls = (
        (SwinConfig, SwinForImageClassification) if version == 1 else (Swinv2Config, Swinv2ForImageClassification)
    )
    labels = {"id2label": {0: "a", 1: "b", 2: "c"}, "label2id": {"a": 0, "b": 1, "c": 2}}
    cfg = cfg_cls(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, **labels)
    model = model_cls(cfg)
    with torch.no_grad():  # random-weight tables start at zero: fill them so a test ignoring the bias fails
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.normal_(0.0, 1.5)
            elif name.endswith(("q_proj.weight", "k_proj.weight", "query.weight", "key.weight")):
                p.mul_(8.0)  # peaked attention, far from uniform
            elif "logit_scale" in name:
                p.fill_(np.log(30.0))
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def swin(tmp_path_factory):
    return load_model(str(_save(tmp_path_factory.mktemp("swin"), 1)), device="cpu")


@pytest.fixture(scope="module")
def swinv2(tmp_path_factory):
    return load_model(str(_save(tmp_path_factory.mktemp("swinv2"), 2)), device="cpu")


def _layers(loaded):
    return [blk for stage in loaded.base_model.encoder.layers for blk in stage.blocks]


def _regions(idx: np.ndarray, n: int, w: int, s: int) -> np.ndarray:
    """Swin's shift-mask regions along one axis of the shifted padded grid."""
    return (idx >= n - w).astype(int) + (idx >= n - s).astype(int) if s else np.zeros_like(idx)


def _reference_blocks(loaded, image, size=None, *, keep_graph=False):
    """Per block: dense attention (H, N, Npad) of every real query over the padded grid, and the geometry used.

    Computed from the block's input, its own projections and bias, in original coordinates.
    """
    v2 = loaded.family.name == "Swin V2"
    grabbed, handles = [], []
    for layer in _layers(loaded):
        handles.append(
            layer.register_forward_hook(
                lambda m, a, k, o: grabbed.append((m, a[0], a[1], int(m.window_size), int(m.shift_size))),
                with_kwargs=True,
            )
        )
    try:
        hw = input_size_for(loaded, size)
        pixels, _ = preprocess(loaded, [image], hw)
        with loaded.family.running(loaded.model), torch.no_grad():
            loaded.model(pixel_values=pixels, **loaded.family.forward_kwargs(loaded.config, hw))
    finally:
        for h in handles:
            h.remove()
    out = []
    for layer, x, (gh, gw), w, s in grabbed:
        attn = layer.attention.self if v2 else layer.attention
        heads = attn.num_attention_heads
        hp, wp = -(-gh // w) * w, -(-gw // w) * w
        feats = x[0] if v2 else layer.layernorm_before(x[0])
        grid = torch.zeros(hp, wp, feats.shape[-1])
        grid[:gh, :gw] = feats.view(gh, gw, -1)
        flat = grid.view(hp * wp, -1)
        if v2:
            q = torch.nn.functional.normalize(attn.query(flat).view(-1, heads, attn.attention_head_size), dim=-1)
            k = torch.nn.functional.normalize(attn.key(flat).view(-1, heads, attn.attention_head_size), dim=-1)
            scale = torch.clamp(attn.logit_scale, max=np.log(100.0)).exp().view(heads, 1, 1)
            table = 16 * torch.sigmoid(attn.continuous_position_bias_mlp(attn.relative_coords_table).view(-1, heads))
        else:
            q = attn.q_proj(flat).view(-1, heads, attn.head_dim)
            k = attn.k_proj(flat).view(-1, heads, attn.head_dim)
            scale = attn.scaling
            table = attn.relative_position_bias.relative_position_bias_table
        logits = torch.einsum("qhd,khd->hqk", q, k) * scale  # (H, Npad, Npad)
        rows, cols = np.divmod(np.arange(hp * wp), wp)
        sr, sc = (rows - s) % hp, (cols - s) % wp  # shifted frame
        same_window = (sr[:, None] // w == sr[None, :] // w) & (sc[:, None] // w == sc[None, :] // w)
        reg = _regions(sr, hp, w, s) * 3 + _regions(sc, wp, w, s)
        dr = (sr[:, None] % w) - (sr[None, :] % w) + w - 1
        dc = (sc[:, None] % w) - (sc[None, :] % w) + w - 1
        bias = table[torch.from_numpy(dr * (2 * w - 1) + dc).view(-1)].view(hp * wp, hp * wp, heads).permute(2, 0, 1)
        logits = logits + bias + torch.from_numpy(np.where(reg[:, None] != reg[None, :], -100.0, 0.0)).float()
        logits = logits.masked_fill(torch.from_numpy(~same_window), float("-inf"))
        probs = torch.softmax(logits, dim=-1).numpy()
        real = (rows < gh) & (cols < gw)
        out.append(dict(probs=probs[:, real], real=real, grid=(gh, gw), padded=(hp, wp), window=w, shift=s))
    return out


def _on_grid(ref_row: np.ndarray, real: np.ndarray, grid) -> tuple[np.ndarray, float]:
    return ref_row[real].reshape(grid), float(ref_row[~real].sum())


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("size", [None, 72])  # 72 px: 18 x 18 then 9 x 9 tokens, both padded to windows of 4
def test_every_query_map_equals_the_recomputation(swin, swinv2, version, size):
    loaded = swin if version == 1 else swinv2
    img = random_image(1, size=(70, 50))
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    refs = _reference_blocks(loaded, img, size)
    assert len(cap.blocks) == len(refs) == 4
    assert any(b.geometry.shift for b in cap.blocks) and (size is None or cap.blocks[0].geometry.padded == (20, 20))
    for block, ref in zip(cap.blocks, refs, strict=True):
        g = block.geometry
        assert (g.grid, g.padded, g.window, g.shift) == (ref["grid"], ref["padded"], ref["window"], ref["shift"])
        n = g.grid[0] * g.grid[1]
        for h in range(block.num_heads):
            for q in (0, n // 2 + 1, n - 1):
                m = row_map(g, select(block, head=h), q)
                values, pad = _on_grid(ref["probs"][h, q], ref["real"], g.grid)
                np.testing.assert_allclose(m.values, values, atol=2e-6)
                assert m.padding == pytest.approx(pad, abs=2e-6)
        np.testing.assert_allclose(block.attention.sum(-1), 1.0, atol=1e-5)


def _dense_fused(ref, heads_axis_mean=True) -> np.ndarray:
    real = ref["real"]
    return ref["probs"].mean(0)[:, real] if heads_axis_mean else ref["probs"][:, :, real]


@pytest.mark.parametrize("version", [1, 2])
def test_rollout_equals_the_dense_definition(swin, swinv2, version):
    loaded = swin if version == 1 else swinv2
    img = random_image(2, size=(64, 64))
    cap = capture(loaded, img, size=72, attention_dtype="float32")
    refs = _reference_blocks(loaded, img, 72)
    dense = [_dense_fused(r) for r in refs]
    stage_of = [b.stage for b in cap.blocks]
    merges = {1: merge_matrix((18, 18), (9, 9), lambda r, c: (r // 2, c // 2))}
    readout = np.full(81, 1 / 81)  # Swin reads the mean of its final tokens
    expected = rollout_reference(dense, stage_of, merges, readout)
    got, stage = capture_rollout(cap)
    assert stage == 0 and got.shape == (324,)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)
    # a later block range lives on its own stage's grid
    part, stage = capture_rollout(cap, start=2)
    assert stage == 1 and part.shape == (81,)


@pytest.mark.parametrize("version", [1, 2])
def test_relevance_equals_the_dense_definition(swin, swinv2, version):
    loaded = swin if version == 1 else swinv2
    img = random_image(3)
    hw = input_size_for(loaded, 72)
    kept, handles = [], []
    for layer in _layers(loaded):
        target = layer.attention.self.dropout if version == 2 else layer
        handles.append(target.register_forward_hook(lambda m, a, o: kept.append(o if version == 2 else o[1])))
    try:
        pixels, _ = preprocess(loaded, [img], hw)
        pixels.requires_grad_(True)
        with loaded.family.running(loaded.model), torch.enable_grad():
            logits = loaded.model(pixel_values=pixels, **loaded.family.forward_kwargs(loaded.config, hw)).logits
            grads = torch.autograd.grad(logits[0, 1], kept)
    finally:
        for h in handles:
            h.remove()
    cap = capture(loaded, img, size=72, attention_dtype="float32")
    abar = []
    for block, a, g in zip(cap.blocks, kept, grads, strict=True):
        prod = torch.clamp(a.detach() * g, min=0).mean(1).numpy()  # (nW, w*w, w*w), heads averaged
        abar.append(dense(block.geometry, prod))  # window placement is checked against loops in test_blocks
    merges = {1: merge_matrix((18, 18), (9, 9), lambda r, c: (r // 2, c // 2))}
    expected = relevance_reference(abar, [b.stage for b in cap.blocks], merges, np.full(81, 1 / 81))
    got = explain_classes(loaded, img, [1], size=72)[1]
    assert got.grid == (18, 18) and got.readout == "pooled query"
    np.testing.assert_allclose(got.relevance, expected, rtol=1e-4, atol=1e-8)


def test_summaries_equal_the_definitions(swin):
    img = random_image(4)
    cap = capture(swin, img, size=72, attention_dtype="float32")
    refs = _reference_blocks(swin, img, 72)
    for block, ref in zip(cap.blocks, refs, strict=True):
        c = centres(ref["grid"], (72, 72))
        for h in range(block.num_heads):
            rows = ref["probs"][h][:, ref["real"]]  # real keys only, renormalised inside the reference
            assert block.distance[h] == pytest.approx(mean_distance_reference(rows, c, c), rel=1e-4)
            p = ref["probs"][h]
            inside = p > 0
            ent = -(np.where(inside, p * np.log(np.where(inside, p, 1)), 0)).sum(1)
            assert block.entropy[h] == pytest.approx(float(ent.mean()), rel=1e-4)


@pytest.mark.parametrize("first", [32, 64])
def test_a_small_or_large_input_never_changes_the_shared_model(tmp_path, swin, first):
    """Swin v1 writes window and shift on its layers; vitviz restores them before every forward."""
    fresh = load_model(str(_save(tmp_path / "fresh", 1)), device="cpu")
    img = random_image(5)
    capture(swin, img, size=first)
    for size in (None, 96):
        a = capture(swin, img, size=size, attention_dtype="float32")
        b = capture(fresh, img, size=size, attention_dtype="float32")
        assert [x.geometry for x in a.blocks] == [x.geometry for x in b.blocks]
        for x, y in zip(a.blocks, b.blocks, strict=True):
            np.testing.assert_array_equal(x.attention, y.attention)
        np.testing.assert_array_equal(a.logits, b.logits)
        fresh = load_model(str(tmp_path / "fresh"), device="cpu")  # fresh again for the next size


def test_too_small_inputs_are_refused_before_any_forward(swin):
    with pytest.raises(BudgetError, match="smaller than a window"):
        capture(swin, random_image(0), size=24)
    capture(swin, random_image(0))  # and the model still works


def test_sixteen_threads_share_one_model(swin):
    images = [random_image(40 + i, size=(50 + 3 * i, 40 + 2 * i)) for i in range(16)]
    sizes = [None, 72] * 8
    alone = [capture(swin, img, size=s, attention_dtype="float32") for img, s in zip(images, sizes, strict=True)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        together = list(
            pool.map(lambda i: capture(swin, images[i], size=sizes[i], attention_dtype="float32"), range(16))
        )
    for a, b in zip(alone, together, strict=True):
        for x, y in zip(a.blocks, b.blocks, strict=True):
            np.testing.assert_array_equal(x.attention, y.attention)
        np.testing.assert_array_equal(a.logits, b.logits)


def test_token_norms_match_the_stage_hidden_states(swin):
    img = random_image(6)
    cap = capture(swin, img, size=72)
    pixels, _ = preprocess(swin, [img], (72, 72))
    with torch.no_grad():
        hidden = swin.model(pixel_values=pixels, output_hidden_states=True, interpolate_pos_encoding=True).hidden_states
    # hidden_states: embeddings, then each stage's output after its patch merging (the next stage's input)
    np.testing.assert_allclose(cap.stages[0].token_norms[0], hidden[0][0].norm(dim=-1).numpy(), rtol=1e-5)
    np.testing.assert_allclose(cap.stages[1].token_norms[0], hidden[1][0].norm(dim=-1).numpy(), rtol=1e-5)
    np.testing.assert_allclose(cap.stages[1].token_norms[-1], hidden[2][0].norm(dim=-1).numpy(), rtol=1e-5)


@pytest.mark.parametrize("version", [1, 2])
def test_relative_bias_maps_are_indexed_by_key_offset(swin, swinv2, version):
    loaded = swin if version == 1 else swinv2
    info = loaded.position
    assert not info.tables and len(info.biases) == 4
    assert info.biases[0].name == "stage 0, block 0"
    bias = info.biases[0].bias
    assert bias.shape == (2, 7, 7)
    layer = _layers(loaded)[0]
    if version == 1:
        table = layer.attention.relative_position_bias.relative_position_bias_table.detach().numpy()
    else:
        a = layer.attention.self
        with torch.no_grad():
            raw = a.continuous_position_bias_mlp(a.relative_coords_table).view(-1, a.num_attention_heads)
        table = (16 * torch.sigmoid(raw)).numpy()
    w = 4
    # key one row below and two columns left of the query: query - key offset (-1, +2)
    dy, dx = 1, -2
    assert bias[1, dy + w - 1, dx + w - 1] == pytest.approx(table[(-dy + w - 1) * (2 * w - 1) + (-dx + w - 1), 1])


def test_record_layout(swin):
    cap = capture(swin, random_image(7))
    assert cap.is_hierarchical and cap.readout == "pooled" and cap.attention_stack is None
    assert [s.grid for s in cap.stages] == [(16, 16), (8, 8)]
    assert [s.blocks for s in cap.stages] == [(0, 1), (2, 3)]
    assert cap.block_label(3) == "stage 1, block 1"
    assert cap.token_at(1, 70.0, 5.0) == 0 * 8 + 7  # clipped to the last column
    assert cap.carry_query(cap.token_at(0, 33, 17), 0, 1) == 2 * 8 + 4
    with pytest.raises(ValueError, match="no dense"):
        _ = cap.attentions
