"""Hiera on tiny random-weight models, checked against the models themselves.

Every reference here is computed without vitviz's code: where an unrolled position
lies on the grid comes from pushing a coordinate tensor through ``transformers``' own
``unroll`` (and the schedules ``HieraEncoder`` keeps for its ``reroll``); attention is
recomputed in row-major grid order from each block's input and its own layer norm and
``qkv`` projection (queries max-pooled over each new cell's 2 x 2 children where the
block pools, keys allowed in the query's mask unit, an aligned block of the grid);
dense and merge matrices are built with this file's loops and ``tests/reference.py``;
gradients come from this file's hooks and ``torch.autograd.grad``.

The ``qkv`` weights and the position table are redrawn with a large spread: the default
initialisation gives nearly uniform attention, under which a wrong token order could pass.
The inputs are not square (16 x 24 first-stage tokens), so rows and columns cannot swap.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import centres, mean_distance_reference, merge_matrix, relevance_reference, rollout_reference

from vitviz import causal as C
from vitviz.analysis.blocks import column_map, row_map, select
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.capture.run import get_run
from vitviz.errors import ModelLoadError
from vitviz.models.families.base import unrolled_order
from vitviz.models.load import load_model
from vitviz.record import POOLED

pytestmark = pytest.mark.usefixtures("one_thread")

LABELS = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}
SIZE = (64, 96)  # 16 x 24 first-stage tokens: 2 x 3 mask units of 8 x 8


def _configs() -> dict:
    from transformers import HieraConfig

    tiny = dict(image_size=[64, 64], embed_dim=8, num_heads=[1, 2, 2, 4], **LABELS)
    return {
        # Mask units in stages 1-2 (and stage 3's first block, lagged), global stage 4, three pooling blocks.
        "pools_every_stage": HieraConfig(depths=[1, 2, 2, 2], **tiny),
        # Two pooling blocks: stage 4 keeps stage 3's grid (and width change), its tokens unrolled to the end.
        "pools_twice": HieraConfig(depths=[1, 2, 2, 2], num_query_pool=2, **tiny),
    }


def _save(folder, key: str, arch: str = "HieraForImageClassification"):
    import transformers
    from transformers import ViTImageProcessor

    torch.manual_seed(0)
    model = getattr(transformers, arch)(_configs()[key])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("attn.qkv.weight"):
                p.normal_(0.0, 0.6)  # peaked attention, far from uniform
            elif name.endswith("position_embeddings"):
                p.normal_(0.0, 1.0)
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module", params=list(_configs()))
def hiera(request, tmp_path_factory):
    return load_model(str(_save(tmp_path_factory.mktemp("hiera"), request.param)), device="cpu")


@pytest.fixture(scope="module")
def hiera4(tmp_path_factory):
    return load_model(str(_save(tmp_path_factory.mktemp("hiera4"), "pools_every_stage")), device="cpu")


# --- the reference: transformers' unroll, recomputed attention ----------------------------------------------------


def _hf_order(grid: tuple[int, int], strides) -> np.ndarray:
    """Row-major index of each position of the unrolled sequence, by ``transformers``' ``unroll`` itself."""
    from transformers.models.hiera.modeling_hiera import unroll

    gh, gw = grid
    coords = torch.arange(gh * gw, dtype=torch.float64).view(1, gh * gw, 1)
    out = unroll(coords, image_shape=(gh, gw), patch_stride=(1, 1), schedule=[list(s) for s in strides])
    return out[0, :, 0].long().numpy()


def _layers(loaded):
    return [layer for stage in loaded.base_model.encoder.stages for layer in stage.layers]


def _plan(loaded, hw):
    """Per layer: (stage, input grid, input strides, query grid, query strides), from the encoder's own schedule.

    ``HieraEncoder.schedule[s]`` holds the strides stage s's output is still unrolled by (what its ``reroll``
    undoes); a pooling block's input is the previous stage's output.
    """
    config = loaded.config
    g0 = (hw[0] // config.patch_stride[0], hw[1] // config.patch_stride[1])
    sched = {s: [tuple(x) for x in loaded.base_model.encoder.schedule[s][0]] for s in range(len(config.depths))}
    out = []
    for s, stage in enumerate(loaded.base_model.encoder.stages):
        k = min(s, config.num_query_pool)  # pooled strides before stage s
        grid = (g0[0] // 2**k, g0[1] // 2**k)
        for j, layer in enumerate(stage.layers):
            if j == 0 and layer.attn.query_stride > 1:
                prev = (grid[0] * 2, grid[1] * 2)
                out.append((s, prev, sched[s - 1], grid, sched[s]))
            else:
                out.append((s, grid, sched[s], grid, sched[s]))
    return out


def _reference(loaded, image, hw, *, keep=False):
    """Per block: its probabilities (H, Nq, Nk) in row-major order on (query grid, key grid), and its plan."""
    grabbed, handles = [], []
    for layer in _layers(loaded):
        handles.append(layer.register_forward_hook(lambda m, a, o: grabbed.append((m, a[0]))))
    try:
        pixels, _ = preprocess(loaded, [image], hw)
        with torch.no_grad():
            out = loaded.model(pixel_values=pixels, output_attentions=True, interpolate_pos_encoding=True)
    finally:
        for h in handles:
            h.remove()
    refs = []
    for (layer, x), (stage, grid_in, s_in, grid_q, s_q) in zip(grabbed, _plan(loaded, hw), strict=True):
        attn = layer.attn
        n = grid_in[0] * grid_in[1]
        x_r = torch.zeros_like(x[0])
        x_r[torch.from_numpy(_hf_order(grid_in, s_in))] = x[0]  # row-major
        with torch.no_grad():
            qkv = attn.qkv(layer.layernorm_before(x_r)).view(n, 3, attn.num_heads, attn.head_dim)
            q, k = qkv[:, 0], qkv[:, 1]
            if grid_q != grid_in:  # max over the 2 x 2 children of each new cell
                q = q.view(grid_q[0], 2, grid_q[1], 2, attn.num_heads, attn.head_dim).amax(dim=(1, 3)).flatten(0, 1)
            logits = torch.einsum("qhd,khd->hqk", q * attn.scale, k)
        qr, qc = np.divmod(np.arange(grid_q[0] * grid_q[1]), grid_q[1])
        kr, kc = np.divmod(np.arange(n), grid_in[1])
        if attn.use_mask_unit_attn:  # a mask unit: an aligned block of side sqrt(keys per window) on the key grid
            side_k = math.isqrt(attn.query_stride * attn.window_size)
            side_q = side_k * grid_q[0] // grid_in[0]
            same = (qr[:, None] // side_q == kr[None, :] // side_k) & (qc[:, None] // side_q == kc[None, :] // side_k)
            logits = logits.masked_fill(torch.from_numpy(~same), float("-inf"))
        probs = torch.softmax(logits, dim=-1).numpy()
        refs.append(dict(probs=probs, stage=stage, grid=grid_q, keys=grid_in, q_strides=s_q, k_strides=s_in))
    return (refs, out) if keep else refs


def _dense(ref, probs_mean: np.ndarray) -> np.ndarray:
    """(Nq, Nk) on the key grid -> (Nq, Nq): a finer key's weight on the stage token holding it."""
    (gh, gw), (kh, kw) = ref["grid"], ref["keys"]
    if (gh, gw) == (kh, kw):
        return probs_mean
    fy, fx = kh // gh, kw // gw
    return probs_mean.reshape(-1, gh, fy, gw, fx).sum(axis=(2, 4)).reshape(-1, gh * gw)


def _merges(refs) -> dict[int, np.ndarray]:
    out = {}
    for prev, cur in itertools.pairwise(refs):
        if cur["stage"] != prev["stage"]:
            f = prev["grid"][0] // cur["grid"][0]
            out[cur["stage"]] = merge_matrix(prev["grid"], cur["grid"], lambda r, c, f=f: (r // f, c // f))
    return out


# --- the token order --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grid", "strides"),
    [
        ((16, 24), [(2, 2)] * 3),
        ((8, 12), [(2, 2)] * 2),
        ((56, 56), [(2, 2)] * 3),
        ((6, 4), [(2, 1), (3, 2)]),
        ((3, 5), []),
    ],
)
def test_unrolled_order_is_transformers_unroll(grid, strides):
    np.testing.assert_array_equal(unrolled_order(grid, tuple(strides)), _hf_order(grid, strides))


def test_unrolled_order_is_undone_by_transformers_reroll(hiera4):
    """At the configured size, ``HieraEncoder.reroll`` of a sequence in vitviz's order gives the grid row-major."""
    enc = hiera4.base_model.encoder
    for s, (strides, size) in enc.schedule.items():
        order = unrolled_order(tuple(size), tuple(tuple(x) for x in strides))
        seq = torch.from_numpy(order.astype(np.float64)).view(1, -1, 1)
        back = enc.reroll(seq, stage_idx=s)  # (1, gh, gw, 1)
        np.testing.assert_array_equal(back[0, :, :, 0].reshape(-1).numpy(), np.arange(size[0] * size[1]))


# --- every block against the recomputation, and the model's own outputs -----------------------------------------


def test_every_query_map_equals_the_recomputation(hiera):
    img = random_image(1, size=(70, 50))
    cap = capture(hiera, img, size=SIZE, attention_dtype="float32")
    refs = _reference(hiera, img, SIZE)
    assert len(cap.blocks) == len(refs)
    for block, ref in zip(cap.blocks, refs, strict=True):
        g = block.geometry
        assert (g.stage, g.grid, g.keys) == (ref["stage"], ref["grid"], ref["keys"])
        assert g.key_rule == ("finer" if g.keys != g.grid else "same")
        for h in range(block.num_heads):
            mat = select(block, head=h)
            for q in range(g.grid[0] * g.grid[1]):
                m = row_map(g, mat, q)
                assert m.grid == g.keys
                np.testing.assert_allclose(m.values.ravel(), ref["probs"][h, q], atol=2e-6)
            d = _dense(ref, ref["probs"][h])
            for t in (0, g.grid[1] + 1, g.grid[0] * g.grid[1] - 1):  # who looks at token t: its keys together
                np.testing.assert_allclose(column_map(g, mat, t).values.ravel(), d[:, t], atol=4e-6)


def test_the_stages_last_attention_outputs_are_the_captured_ones(hiera):
    """``output_attentions`` (the last block of each stage, raw ``(B, H, nW, Tq, Tk)`` in the unrolled order),
    placed with ``transformers``' unroll, equals what vitviz recorded in row-major order."""
    img = random_image(2, size=(60, 60))
    cap = capture(hiera, img, size=SIZE, attention_dtype="float32")
    refs, out = _reference(hiera, img, SIZE, keep=True)
    last = [cap.stages[s].blocks[-1] for s in range(len(cap.stages))]
    assert len(out.attentions) == len(last)
    for b, raw in zip(last, out.attentions, strict=True):
        ref = refs[b]
        raw = raw[0].numpy()  # (H, nW, Tq, Tk)
        nw, tq, tk = raw.shape[1:]
        q_pos = _hf_order(ref["grid"], ref["q_strides"]).reshape(tq, nw).T  # (nW, Tq): row-major query of a slot
        k_pos = _hf_order(ref["keys"], ref["k_strides"]).reshape(tk, nw).T
        block = cap.blocks[b]
        for h in range(block.num_heads):
            mat = select(block, head=h)
            placed = np.zeros((len(ref["probs"][h]), ref["probs"].shape[-1]), np.float32)
            for q in range(placed.shape[0]):
                placed[q] = row_map(block.geometry, mat, q).values.ravel()
            np.testing.assert_allclose(placed[q_pos[:, :, None], k_pos[:, None, :]], raw[h], atol=1e-6)
            np.testing.assert_allclose(placed, ref["probs"][h], atol=2e-6)


def test_record_layout(hiera4):
    cap = capture(hiera4, random_image(3), size=SIZE)
    kinds = [(b.kind, b.geometry.grid, b.geometry.window, b.geometry.keys) for b in cap.blocks]
    assert kinds == [
        ("window", (16, 24), 8, (16, 24)),  # stage 1: 6 mask units of 8 x 8
        ("window", (8, 12), 4, (16, 24)),  # pools: 4 x 4 queries over the unit's 8 x 8 keys
        ("window", (8, 12), 4, (8, 12)),
        ("window", (4, 6), 2, (8, 12)),  # stage 3's first block still in mask units (the lag)
        ("global", (4, 6), 0, (4, 6)),
        ("global", (2, 3), 0, (4, 6)),  # pools, globally
        ("global", (2, 3), 0, (2, 3)),
    ]
    assert [b.attention.shape for b in cap.blocks[:2]] == [(6, 1, 64, 64), (6, 2, 16, 64)]
    assert [s.grid for s in cap.stages] == [(16, 24), (8, 12), (4, 6), (2, 3)]
    assert [s.blocks for s in cap.stages] == [(0,), (1, 2), (3, 4), (5, 6)]
    assert cap.readout == "pooled" and cap.is_hierarchical and cap.patch_size == 4
    assert not cap.rollout_note and cap.block_label(5) == "stage 3, block 0"
    for s in cap.stages[1:]:
        np.testing.assert_array_equal(s.parents[0], np.arange(2 * s.grid[0]) // 2)


def test_inputs_snap_to_whole_mask_units_and_the_budget_counts_every_value(hiera):
    assert input_size_for(hiera, 70) == (64, 64) and input_size_for(hiera, (100, 150)) == (96, 160)
    fam = hiera.family
    assert fam.size_problem(hiera.config, (64, 96)) == "" and "multiples of 32" in fam.size_problem(
        hiera.config, (64, 80)
    )
    for hw in ((64, 64), SIZE, (128, 96)):
        cap = capture(hiera, random_image(4), size=hw)
        assert sum(b.attention.size for b in cap.blocks) == fam.attention_numel(hiera.config, hw)


# --- rollout, relevance, summaries, token norms ------------------------------------------------------------------


def test_rollout_equals_the_dense_definition(hiera):
    img = random_image(5, size=(64, 64))
    cap = capture(hiera, img, size=SIZE, attention_dtype="float32")
    refs = _reference(hiera, img, SIZE)
    dense = [_dense(r, r["probs"].mean(0)) for r in refs]
    last = refs[-1]["grid"]
    readout = np.full(last[0] * last[1], 1 / (last[0] * last[1]))  # Hiera reads the mean of its final tokens
    expected = rollout_reference(dense, [r["stage"] for r in refs], _merges(refs), readout)
    got, stage = capture_rollout(cap)
    assert stage == 0 and got.shape == (16 * 24,)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)


def test_relevance_equals_the_dense_definition(hiera):
    img = random_image(6)
    kept, handles = [], []
    for layer in _layers(hiera):
        handles.append(layer.attn.register_forward_hook(lambda m, a, k, o: kept.append(o[1]), with_kwargs=True))
    try:
        pixels, _ = preprocess(hiera, [img], SIZE)
        pixels.requires_grad_(True)
        with torch.enable_grad():
            out = hiera.model(pixel_values=pixels, output_attentions=True, interpolate_pos_encoding=True)
            grads = torch.autograd.grad(out.logits[0, 1], kept)
    finally:
        for h in handles:
            h.remove()
    refs = _reference(hiera, img, SIZE)
    abar = []
    for ref, a, g in zip(refs, kept, grads, strict=True):
        prod = torch.clamp(a.detach() * g, min=0).mean(1)[0].numpy()  # (nW, Tq, Tk), heads averaged, unrolled
        nw, tq, tk = prod.shape
        q_pos = _hf_order(ref["grid"], ref["q_strides"]).reshape(tq, nw).T
        k_pos = _hf_order(ref["keys"], ref["k_strides"]).reshape(tk, nw).T
        placed = np.zeros((ref["grid"][0] * ref["grid"][1], ref["keys"][0] * ref["keys"][1]))
        placed[q_pos[:, :, None], k_pos[:, None, :]] = prod
        abar.append(_dense(ref, placed))
    last = refs[-1]["grid"]
    readout = np.full(last[0] * last[1], 1 / (last[0] * last[1]))
    expected = relevance_reference(abar, [r["stage"] for r in refs], _merges(refs), readout)
    got = explain_classes(hiera, img, [1], size=SIZE)[1]
    assert got.grid == (16, 24) and got.readout == "pooled query"
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got.relevance, expected, rtol=1e-4, atol=1e-9)


def test_summaries_equal_the_definitions(hiera):
    img = random_image(7)
    cap = capture(hiera, img, size=SIZE, attention_dtype="float32")
    refs = _reference(hiera, img, SIZE)
    for block, ref in zip(cap.blocks, refs, strict=True):
        qc, kc = centres(ref["grid"], SIZE), centres(ref["keys"], SIZE)
        p = ref["probs"]
        allowed = (p[0] > 0).sum(-1)  # keys in the query's unit (all keys for global attention)
        for h in range(block.num_heads):
            assert block.distance[h] == pytest.approx(mean_distance_reference(p[h], qc, kc), rel=1e-4)
            ent = -(np.where(p[h] > 0, p[h] * np.log(np.where(p[h] > 0, p[h], 1)), 0)).sum(1)
            assert block.entropy[h] == pytest.approx(float(ent.mean()), rel=1e-4)
            assert block.entropy_norm[h] == pytest.approx(float((ent / np.log(allowed)).mean()), rel=1e-4)


def test_token_norms_match_the_models_rerolled_hidden_states(hiera4):
    """At the configured size ``reshaped_hidden_states`` are the model's own reroll of each stage's output; row 0
    of a pooled stage is what its first block adds its attention to: the max over 2 x 2 children of the projected,
    normalised tokens of the stage before."""
    img = random_image(8)
    cap = capture(hiera4, img, attention_dtype="float32")
    pixels, _ = preprocess(hiera4, [img], (64, 64))
    with torch.no_grad():
        hidden = hiera4.model(pixel_values=pixels, output_hidden_states=True).reshaped_hidden_states
    np.testing.assert_allclose(cap.stages[0].token_norms[0], hidden[0][0].norm(dim=-1).reshape(-1), rtol=1e-5)
    for s, stage in enumerate(cap.stages):
        np.testing.assert_allclose(stage.token_norms[-1], hidden[s + 1][0].norm(dim=-1).reshape(-1), rtol=1e-5)
        if s:
            first = hiera4.base_model.encoder.stages[s].layers[0]
            with torch.no_grad():
                y = first.proj(first.layernorm_before(hidden[s][0]))  # (gh, gw, C) row-major
                gh, gw, c = y.shape
                pooled = y.view(gh // 2, 2, gw // 2, 2, c).amax(dim=(1, 3))
            np.testing.assert_allclose(stage.token_norms[0], pooled.norm(dim=-1).reshape(-1), rtol=1e-5)


def test_position_table_and_patch_filters(hiera4):
    info = hiera4.position
    assert info.tables[0].grid == (16, 16) and info.tables[0].embeddings.shape == (256, 8)
    table = hiera4.base_model.embeddings.position_embeddings.detach()[0].numpy()
    np.testing.assert_array_equal(info.tables[0].embeddings, table)  # added before the unroll: row-major
    assert hiera4.patch_weights.shape == (8, 3, 7, 7)


# --- the views that read a Run ------------------------------------------------------------------------------------


def test_the_readout_head_lens_and_what_is_refused(hiera4):
    img = random_image(9)
    run = get_run(hiera4, img, size=SIZE)
    assert run.readout is not None, run.readout_problem  # checked against the logits when the run was made
    notes = C.causal_notes(hiera4)
    assert not notes["knockout"] and "not defined for Hiera" in notes["attribution"]
    lens = C.logit_lens(hiera4, img, size=SIZE)
    last = run.capture.stages[-1].blocks  # the last stage's blocks: the width and grid the head reads
    assert list(np.flatnonzero(lens.defined)) == [b + 1 for b in last]
    np.testing.assert_allclose(lens.logits[last[-1] + 1], run.scores.numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(C.NotDefined, match="not defined for Hiera"):
        C.direct_logit_attribution(hiera4, img, size=SIZE)
    knocked = C.knock_out(hiera4, img, [(1, 0)], mode="zero", size=SIZE)  # block 1 pools: its head 0 matters
    assert np.abs(knocked.effect).max() > 1e-4


def test_a_pooled_query_map_and_the_pooled_row_place_on_the_key_grid(hiera4):
    cap = capture(hiera4, random_image(10), size=SIZE, attention_dtype="float32")
    g = cap.blocks[1].geometry
    m = row_map(g, select(cap.blocks[1]), POOLED)
    assert m.grid == (16, 24) and m.values.sum() == pytest.approx(1.0, abs=1e-5)


def test_mae_pretraining_and_a_last_pooling_block_are_refused(tmp_path):
    from transformers import HieraConfig, HieraForImageClassification, HieraForPreTraining, ViTImageProcessor

    proc = ViTImageProcessor(size={"height": 64, "width": 64})
    cfg = HieraConfig(
        image_size=[64, 64],
        embed_dim=8,
        depths=[1, 1],
        num_heads=[1, 2],
        num_query_pool=1,
        masked_unit_size=[2, 2],
        masked_unit_attention=[True, False],
        **LABELS,
    )
    HieraForImageClassification(cfg).save_pretrained(tmp_path / "last")
    proc.save_pretrained(tmp_path / "last")
    with pytest.raises(ModelLoadError, match="last block of this Hiera pools"):
        load_model(str(tmp_path / "last"), device="cpu")
    mae = HieraConfig(
        image_size=[64, 64],
        embed_dim=8,
        depths=[1, 2, 2, 2],
        num_heads=[1, 2, 2, 4],
        decoder_hidden_size=8,
        decoder_depth=1,
        decoder_num_heads=1,
    )
    HieraForPreTraining(mae).save_pretrained(tmp_path / "mae")
    proc.save_pretrained(tmp_path / "mae")
    with pytest.raises(ModelLoadError, match="drops 60 % of its mask units"):
        load_model(str(tmp_path / "mae"), device="cpu")
    wide = HieraConfig(image_size=[64, 64], embed_dim=8, depths=[1, 2, 2, 2], patch_stride=[4, 2], **LABELS)
    HieraForImageClassification(wide).save_pretrained(tmp_path / "wide")
    proc.save_pretrained(tmp_path / "wide")
    with pytest.raises(ModelLoadError, match="square patch_stride"):
        load_model(str(tmp_path / "wide"), device="cpu")


def test_indices_cached_in_inference_mode_serve_a_forward_with_gradients(hiera4):
    """The reroll and token indices are cached at their first use; a capture (inference mode) may come first."""
    from vitviz.models.families import base, hiera

    base._reroll_tensors.cache_clear()
    hiera._raster_positions.cache_clear()
    img = random_image(11)
    capture(hiera4, img, size=(96, 64))
    assert get_run(hiera4, img, size=(96, 64)).has_graph  # its tokens are gathered inside the graph
    got = explain_classes(hiera4, img, [0], size=(96, 64))[0]
    assert got.grid == (24, 16) and np.isfinite(got.relevance).all()


def test_gradcam_reads_the_last_block_input_in_grid_order(hiera):
    """Grad-CAM by hand: the last block's input and its gradient, put in grid order by ``transformers``' unroll
    (with ``pools_twice`` the last stage is still unrolled by one stride), placed by nearest cell."""
    from vitviz.methods import explain

    image, layer = random_image(12, (64, 64)), _layers(hiera)[-1]
    plan = _plan(hiera, (64, 64))[-1]
    seen = {}
    handle = layer.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    peaks = []
    try:
        for cls in range(3):
            pixels, _ = preprocess(hiera, [image], (64, 64))
            pixels.requires_grad_(True)
            with torch.enable_grad():
                logits = hiera.model(pixel_values=pixels, interpolate_pos_encoding=True).logits
                (grad,) = torch.autograd.grad(logits[0, cls], seen["x"])
            x = seen["x"].detach()[0]
            cam = torch.relu(x @ grad[0].mean(dim=0)).numpy()  # unrolled order
            ref = np.zeros_like(cam)
            ref[_hf_order(plan[3], plan[4])] = cam
            ref = ref.reshape(plan[3])
            m = explain(hiera, image, "gradcam", target=cls)
            f = 16 // plan[3][0]
            assert m.source_grid == plan[3] and m.grid == (16, 16)
            np.testing.assert_allclose(m.values, np.kron(ref, np.ones((f, f))), rtol=1e-4, atol=1e-7)
            peaks.append(ref.max())
    finally:
        handle.remove()
    assert max(peaks) > 0
