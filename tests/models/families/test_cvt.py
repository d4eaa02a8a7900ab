"""CvT: every block's attention, rollout, relevance and summaries against independent recomputations.

The references never use vitviz's reduced-key code: attention is recomputed from
each block's own ``projection_query`` / ``projection_key`` outputs with CvT's
scale (embed_dim ** -0.5), key grids are read from the key convolutions' outputs,
dense matrices are built by loops over the key grid (each key spread evenly over
the stride x stride block of stage tokens it came from, CLS column as it is), and
merges come from ``reference.merge_matrix`` with the centre rule written out here.

Tiny configs: ``depth`` must satisfy depth[s] > s in transformers 5.23 (``[1, 1, 3]``
and ``[2, 2, 2]`` raise IndexError at construction), so the tests use ``[1, 2, 3]``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import centres, mean_distance_reference, merge_matrix, relevance_reference, rollout_reference

from vitviz.analysis.blocks import row_map, select
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.errors import BudgetError, ModelLoadError
from vitviz.models.families.cvt import Cvt, stage_grids
from vitviz.models.hooks import installed_sites
from vitviz.models.load import load_model

TINY_CVT = dict(depth=[1, 2, 3], embed_dim=[8, 16, 24], num_heads=[1, 2, 4])
LABELS = {"id2label": {0: "a", 1: "b", 2: "c"}, "label2id": {"a": 0, "b": 1, "c": 2}}
NON_SQUARE = (48, 80)  # stage grids 12 x 20, 6 x 10, 3 x 5: an odd last grid (key grid 2 x 3)


def _save(folder, *, classifier: bool = True, seed: int = 0, **overrides):
    from transformers import CvtConfig, CvtForImageClassification, CvtModel, ViTImageProcessor

    torch.manual_seed(seed)
    cfg = CvtConfig(**{**TINY_CVT, **(LABELS if classifier else {}), **overrides})
    model = (CvtForImageClassification if classifier else CvtModel)(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random weights far from the 0.02-std init, so attention is peaked, not uniform
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                gain = 4.0 if name.endswith(("projection_query.weight", "projection_key.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * gain / fan_in**0.5)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
        for m in model.modules():  # the key/value convolutions' BatchNorm runs on its (random) running statistics
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def cvt(tmp_path_factory):
    return load_model(str(_save(tmp_path_factory.mktemp("cvt"))), device="cpu")


@pytest.fixture(scope="module")
def cvt_backbone(tmp_path_factory):
    """A backbone with no CLS token anywhere: the readout is the pooled query."""
    folder = _save(tmp_path_factory.mktemp("cvt-backbone"), classifier=False, seed=1, cls_token=[False] * 3)
    return load_model(str(folder), device="cpu")


def _stages(loaded):
    return list(loaded.base_model.encoder.stages)


def _layers(loaded):
    return [(s, layer) for s, stage in enumerate(_stages(loaded)) for layer in stage.layers]


def _reference(loaded, image, size=None, *, keep_graph=False):
    """Per block, from test-local hooks: attention softmax(q k^T * C ** -0.5) ``(H, Tq, Tk)``, grids, probs.

    Returns (list of dicts, logits). ``keep_graph`` runs with gradients to the input
    and keeps each block's probabilities (the dropout output the forward used).
    """
    hw = input_size_for(loaded, size)
    layers = _layers(loaded)
    grabbed: dict[tuple[int, str], torch.Tensor] = {}
    handles = []

    def keep(i, what):
        def hook(module, args, output):
            grabbed[(i, what)] = output if what == "probs" else output.detach()

        return hook

    for i, (_, layer) in enumerate(layers):
        attn = layer.attention.attention
        handles += [
            attn.projection_query.register_forward_hook(keep(i, "q")),
            attn.projection_key.register_forward_hook(keep(i, "k")),
            attn.convolution_projection_key.convolution_projection.register_forward_hook(keep(i, "kconv")),
            layer.register_forward_pre_hook(lambda m, args, i=i: grabbed.__setitem__((i, "hw"), args[1:3])),
        ]
        if keep_graph:
            handles.append(attn.dropout.register_forward_hook(keep(i, "probs")))
    try:
        pixels, _ = preprocess(loaded, [image], hw)
        if keep_graph:
            pixels.requires_grad_(True)
        with torch.set_grad_enabled(keep_graph):
            out = loaded.model(pixel_values=pixels)
    finally:
        for h in handles:
            h.remove()
    blocks = []
    for i, (s, layer) in enumerate(layers):
        attn = layer.attention.attention
        heads, c = attn.num_heads, attn.embed_dim
        q = grabbed[(i, "q")][0].view(-1, heads, c // heads).transpose(0, 1).double()
        k = grabbed[(i, "k")][0].view(-1, heads, c // heads).transpose(0, 1).double()
        scores = q @ k.transpose(-1, -2)
        kconv = grabbed[(i, "kconv")]  # (B, C, kh, kw): the key grid the block really used
        blocks.append(
            dict(
                stage=s,
                attention=torch.softmax(scores * c**-0.5, dim=-1).numpy(),
                head_dim_scaled=torch.softmax(scores * (c // heads) ** -0.5, dim=-1).numpy(),
                grid=tuple(int(v) for v in grabbed[(i, "hw")]),
                keys=tuple(kconv.shape[-2:]),
                prefix=1 if attn.with_cls_token else 0,
                stride=attn.convolution_projection_key.convolution_projection.convolution.stride[0],
                probs=grabbed.get((i, "probs")),
            )
        )
    return blocks, (out.logits if hasattr(out, "logits") else None), hw


def _spread_by_loops(native: np.ndarray, grid, keys, stride: int, prefix: int) -> np.ndarray:
    """Dense ``(Tq, P + N)`` view: key (kr, kc) spread evenly over its stride x stride block; the last key takes the rest."""
    gh, gw = grid
    kh, kw = keys
    out = np.zeros((native.shape[0], prefix + gh * gw))
    out[:, :prefix] = native[:, :prefix]
    for kr in range(kh):
        rows = range(kr * stride, gh if kr == kh - 1 else min((kr + 1) * stride, gh))
        for kc in range(kw):
            cols = range(kc * stride, gw if kc == kw - 1 else min((kc + 1) * stride, gw))
            cells = [(r, c) for r in rows for c in cols]
            assert cells, "every key cell of CvT's stride-2 projection comes from at least one stage token"
            for r, c in cells:
                out[:, prefix + r * gw + c] += native[:, prefix + kr * kw + kc] / len(cells)
    return out


def _merges(blocks) -> dict[int, np.ndarray]:
    """Merge matrices into each later stage: centre rule; a CLS entering there gets a zero row."""
    first = {}
    for b in blocks:
        first.setdefault(b["stage"], b)
    merges = {}
    for s in range(1, len(first)):
        prev, cur = first[s - 1], first[s]
        (ph, pw), (gh, gw) = prev["grid"], cur["grid"]

        def parent(r, c, ph=ph, pw=pw, gh=gh, gw=gw):
            return min(int((r + 0.5) * gh / ph), gh - 1), min(int((c + 0.5) * gw / pw), gw - 1)

        carried = [(0, 0)] if prev["prefix"] and cur["prefix"] else []
        merges[s] = merge_matrix(prev["grid"], cur["grid"], parent, prev["prefix"], cur["prefix"], carried)
    return merges


def _readout(blocks) -> np.ndarray:
    last = blocks[-1]
    n = last["grid"][0] * last["grid"][1]
    if last["prefix"]:
        u = np.zeros(1 + n)
        u[0] = 1.0
        return u
    return np.full(n, 1.0 / n)


# --- 1. loading, grids, keys, readout --------------------------------------------------


def test_loads_by_folder_with_its_sites(cvt):
    assert isinstance(cvt.family, Cvt) and cvt.family.name == "CvT" and cvt.family.hierarchical
    assert cvt.family.model_types == ("cvt",)
    assert cvt.has_classifier and cvt.default_size == (64, 64)
    assert cvt.patch_size == 4  # the first embedding's stride
    sites = installed_sites(cvt.model)
    assert len(sites) == sum(TINY_CVT["depth"])
    assert [s.stage for s in sites] == [0, 1, 1, 2, 2, 2]
    for site, (_, layer) in zip(sites, _layers(cvt), strict=True):
        assert site.block is layer and site.attention is layer.attention.attention.dropout
    conv = _stages(cvt)[0].embedding.convolution_embeddings.projection
    np.testing.assert_array_equal(cvt.patch_weights, conv.weight.numpy())
    assert cvt.patch_weights.shape == (8, 3, 7, 7) and cvt.patch_weights.dtype == np.float32


@pytest.mark.parametrize(
    ("size", "grids", "keys"),
    [
        (None, [(16, 16), (8, 8), (4, 4)], [(8, 8), (4, 4), (2, 2)]),
        (NON_SQUARE, [(12, 20), (6, 10), (3, 5)], [(6, 10), (3, 5), (2, 3)]),
    ],
)
def test_record_has_stage_grids_prefix_and_key_grids(cvt, size, grids, keys):
    img = random_image(1, size=(70, 50))
    cap = capture(cvt, img, size=size, attention_dtype="float32")
    ref, logits, hw = _reference(cvt, img, size)
    assert cap.input_size == hw and cap.image.shape == (*hw, 3)
    assert cap.family == "CvT" and cap.patch_size == 4 and cap.readout == "cls"
    assert [s.grid for s in cap.stages] == grids
    assert [s.prefix_kinds for s in cap.stages] == [(), (), ("CLS",)]
    assert [s.blocks for s in cap.stages] == [(0,), (1, 2), (3, 4, 5)]
    assert cap.stages[0].parents is None
    for b, r in zip(cap.blocks, ref, strict=True):
        g = b.geometry
        assert (g.stage, g.kind, g.grid, g.num_prefix) == (r["stage"], "global", r["grid"], r["prefix"])
        assert g.key_grid == r["keys"] == keys[r["stage"]]  # the key conv's output, as it ran
        assert g.key_rule == "strided" and g.key_stride == (2, 2)
        assert g.num_heads == TINY_CVT["num_heads"][r["stage"]]
        assert b.attention.shape == r["attention"].shape
    np.testing.assert_allclose(cap.logits, logits[0].detach().numpy(), rtol=1e-5, atol=1e-6)
    assert cap.predictions[0].index == int(np.argmax(cap.logits))
    with pytest.raises(ValueError, match="no dense"):
        _ = cap.attentions


def test_sizes_snap_to_whole_stage_grids(cvt):
    """The conv arithmetic agrees with the model; multiples of 16 px give whole grids (72 px does not)."""
    fam, cfg = cvt.family, cvt.config
    assert fam.size_multiple(cfg) == 16
    for side, expected in ((224, [56, 28, 14]), (96, [24, 12, 6]), (72, [18, 9, 5])):
        with torch.no_grad():
            hidden = cvt.model(pixel_values=torch.zeros(1, 3, side, side), output_hidden_states=True).hidden_states
        assert [tuple(h.shape[-2:]) for h in hidden] == stage_grids(cfg, (side, side)) == [(n, n) for n in expected]
        whole = all(n * 4 * 2**s == side for s, n in enumerate(expected))
        assert whole == (side % 16 == 0)
    assert input_size_for(cvt, 72) == (64, 64)
    assert input_size_for(cvt, (100, 230)) == (96, 224)


def test_attention_numel_is_what_a_capture_holds(cvt):
    for size in (None, NON_SQUARE):
        cap = capture(cvt, random_image(2), size=size, attention_dtype="float32")
        assert cvt.family.attention_numel(cvt.config, cap.input_size) == sum(b.attention.size for b in cap.blocks)


# --- 2. parity: attention and query maps ----------------------------------------------


@pytest.mark.parametrize("size", [None, NON_SQUARE])
def test_attention_and_query_maps_equal_recomputed_from_projections(cvt, size):
    img = random_image(3)
    cap = capture(cvt, img, size=size, attention_dtype="float32")
    ref, _, _ = _reference(cvt, img, size)
    rng = np.random.default_rng(0)
    for b, r in zip(cap.blocks, ref, strict=True):
        a = r["attention"]
        np.testing.assert_allclose(b.attention, a, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b.fused, a.mean(0), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b.attention.sum(-1), 1.0, atol=1e-5)
        p = r["prefix"]
        queries = [*range(p), *rng.choice(np.arange(p, a.shape[1]), size=3, replace=False)]
        for h in range(a.shape[0]):
            mat = select(b, head=h)
            for q in queries:
                m = row_map(b.geometry, mat, int(q))
                assert m.grid == r["keys"]
                np.testing.assert_allclose(m.values, a[h, q, p:].reshape(r["keys"]), rtol=1e-4, atol=1e-6)
                np.testing.assert_allclose(m.prefix, a[h, q, :p], rtol=1e-4, atol=1e-6)
        if a.shape[0] > 1:  # CvT scales by embed_dim ** -0.5; head_dim ** -0.5 gives other attention
            assert np.abs(b.attention - r["head_dim_scaled"]).max() > 1e-3
    for s, (_, layer) in enumerate(_layers(cvt)):
        attn = layer.attention.attention
        assert attn.scale == pytest.approx(attn.embed_dim**-0.5), s


# --- 3. rollout ------------------------------------------------------------------------


@pytest.mark.parametrize(("which", "size"), [("cvt", None), ("cvt", NON_SQUARE), ("cvt_backbone", None)])
def test_rollout_equals_dense_reference(request, which, size):
    loaded = request.getfixturevalue(which)
    img = random_image(4)
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    ref, _, _ = _reference(loaded, img, size)
    dense = []
    for r in ref:
        d = _spread_by_loops(r["attention"].mean(0), r["grid"], r["keys"], r["stride"], r["prefix"])
        np.testing.assert_allclose(d.sum(1), 1.0, atol=1e-6)
        dense.append(d)
    merges = _merges(ref)
    if ref[-1]["prefix"]:
        assert not merges[2][0].any()  # the CLS entering the last stage starts with a zero row
    expected = rollout_reference(dense, [r["stage"] for r in ref], merges, _readout(ref))
    row, stage = capture_rollout(cap)
    assert stage == 0 and row.shape == (ref[0]["grid"][0] * ref[0]["grid"][1],)
    np.testing.assert_allclose(row, expected, rtol=1e-4, atol=1e-7)
    assert cap.readout == ("cls" if ref[-1]["prefix"] else "pooled")


# --- 4. relevance ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [None, NON_SQUARE])
def test_relevance_equals_reference_with_own_gradients(cvt, size):
    img = random_image(5)
    classes = [0, 2]
    got = explain_classes(cvt, img, classes, size=size)
    ref, logits, _ = _reference(cvt, img, size, keep_graph=True)
    probs = [r["probs"] for r in ref]
    merges = _merges(ref)
    for k, c in enumerate(classes):
        grads = torch.autograd.grad(logits[0, c], probs, retain_graph=k < len(classes) - 1)
        abar = []
        for r, a, g in zip(ref, probs, grads, strict=True):
            native = (g[0] * a[0]).detach().double().clamp(min=0).mean(0).numpy()
            np.testing.assert_allclose(a[0].detach().numpy(), r["attention"], rtol=1e-4, atol=1e-6)
            abar.append(_spread_by_loops(native, r["grid"], r["keys"], r["stride"], r["prefix"]))
        expected = relevance_reference(abar, [r["stage"] for r in ref], merges, _readout(ref))
        e = got[c]
        assert e.readout == "CLS" and e.grid == ref[0]["grid"] and e.num_prefix_tokens == 0
        assert np.abs(expected).max() > 0
        np.testing.assert_allclose(e.relevance, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


# --- 5. mean attention distance and entropy --------------------------------------------


@pytest.mark.parametrize("size", [None, NON_SQUARE])
def test_distance_and_entropy_per_block_and_head(cvt, size):
    img = random_image(6)
    cap = capture(cvt, img, size=size, attention_dtype="float32")
    ref, _, hw = _reference(cvt, img, size)
    for b, r in zip(cap.blocks, ref, strict=True):
        a, p = r["attention"], r["prefix"]
        qc, kc = centres(r["grid"], hw), centres(r["keys"], hw)
        for h in range(a.shape[0]):
            assert b.distance[h] == pytest.approx(mean_distance_reference(a[h, p:, p:], qc, kc), rel=1e-4)
            ent = -(a[h] * np.log(a[h])).sum(-1)
            assert b.entropy[h] == pytest.approx(ent.mean(), rel=1e-4)
            assert b.entropy_norm[h] == pytest.approx((ent / np.log(a.shape[-1])).mean(), rel=1e-4)
        assert (b.entropy_norm < 0.99).any()  # attention is peaked: the test would notice a wrong row


# --- 6. token norms --------------------------------------------------------------------


def test_token_norms_match_the_model_and_its_hidden_states(cvt):
    img = random_image(7)
    cap = capture(cvt, img)
    pixels, _ = preprocess(cvt, [img], cap.input_size)
    with torch.no_grad():
        hidden = cvt.model(pixel_values=pixels, output_hidden_states=True).hidden_states  # (B, C, H, W) per stage
        cls_out = cvt.base_model(pixel_values=pixels).cls_token_value  # (B, 1, C): the CLS comes separately
        x = pixels
        for s, stage in enumerate(_stages(cvt)):  # the stages by hand: (B, P + N, C), CLS first
            emb = stage.embedding(x)
            bsz, c, gh, gw = emb.shape
            tokens = emb.flatten(2).transpose(1, 2)
            if cvt.config.cls_token[s]:
                tokens = torch.cat([stage.cls_token.expand(bsz, -1, -1), tokens], dim=1)
            rows = [tokens[0].norm(dim=-1)]
            for layer in stage.layers:
                tokens = layer(tokens, gh, gw)
                rows.append(tokens[0].norm(dim=-1))
            norms = cap.stages[s].token_norms
            assert norms.shape == (len(stage.layers) + 1, cap.stages[s].num_tokens)
            np.testing.assert_allclose(norms, torch.stack(rows).numpy(), rtol=1e-5)
            p = cap.stages[s].num_prefix
            grid_tokens = tokens[:, p:]
            x = grid_tokens.transpose(1, 2).reshape(bsz, c, gh, gw)
            np.testing.assert_allclose(x.numpy(), hidden[s].numpy(), rtol=1e-5, atol=1e-6)
            ref = hidden[s][0].flatten(1).norm(dim=0).numpy()  # channels first: norm over C at each (row, col)
            np.testing.assert_allclose(norms[-1, p:], ref, rtol=1e-5)
    assert cap.stages[-1].prefix_kinds == ("CLS",)
    np.testing.assert_allclose(cap.stages[-1].token_norms[-1, 0], cls_out[0, 0].norm().item(), rtol=1e-5)


# --- 7. position sentence, budget, refusals --------------------------------------------


def test_position_sentence_and_no_tables(cvt):
    cap = capture(cvt, random_image(8))
    assert cap.position.tables == () and cap.position.biases == ()
    assert cap.position_embeddings is None and cvt.position_embeddings is None
    note = cvt.position_note
    assert note == cap.position_note
    assert "no position embeddings" in note and "convolutional token embeddings" in note


def test_huge_input_is_refused_before_any_forward(cvt):
    with pytest.raises(BudgetError, match="smaller input size"):
        capture(cvt, random_image(0), size=2048)
    with pytest.raises(BudgetError, match="gradients"):
        explain_classes(cvt, random_image(0), [0], size=1024)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(stride_q=[2, 1, 1]), "query grid"),
        (dict(padding_q=[0, 1, 1]), "query grid"),
        (dict(qkv_projection_method=["avg", "dw_bn", "dw_bn"]), "dw_bn"),
        (dict(cls_token=[False, True, True]), "CLS token of width"),
    ],
)
def test_configs_transformers_cannot_run_are_refused_at_load(tmp_path, overrides, match):
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(_save(tmp_path, **overrides)), device="cpu")
