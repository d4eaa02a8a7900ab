"""PvT and PvT v2 adapters on tiny random-weight models, checked against the models themselves.

Every reference here is computed without vitviz's code: attention is recomputed
from each block's own query and key projections (test-local forward hooks), key
grids come from the output of the block's reduction path, dense matrices and merge
matrices are built with this file's loops and ``tests/reference.py``, and gradients
come from this file's own hooks and ``torch.autograd.grad``.

The query and key weights are redrawn with a large spread before saving: the
default initialisation (std 0.02) gives nearly uniform attention, under which a
wrong key order or a wrong spread could still pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import centres, mean_distance_reference, merge_matrix, relevance_reference, rollout_reference

from vitviz.analysis.blocks import row_map, select
from vitviz.analysis.embeddings import position_similarity
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, check_budget, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.errors import BudgetError, CaptureError
from vitviz.models.families import family_for, supported_model_types
from vitviz.models.load import load_model
from vitviz.record import POOLED

LABELS = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}
WIDE = dict(hidden_sizes=[16, 32, 32, 48], num_attention_heads=[2, 2, 4, 4], mlp_ratios=[2, 2, 2, 2])


def _configs() -> dict:
    from transformers import PvtConfig, PvtV2Config

    return {
        # Reduction 4 and 2 in the early stages; the last stage carries CLS and must have ratio 1.
        "pvt": (
            "PvtForImageClassification",
            PvtConfig(image_size=64, depths=[1, 2, 1, 2], sequence_reduction_ratios=[4, 2, 1, 1], **WIDE, **LABELS),
        ),
        # Ratio 3 on a 16 x 16 grid: the conv never sees the last row and column (5 x 5 keys).
        "pvt_v2": (
            "PvtV2ForImageClassification",
            PvtV2Config(image_size=64, depths=[1, 2, 1, 1], sr_ratios=[3, 2, 2, 1], **WIDE, **LABELS),
        ),
        # Linear attention, three stages: keys pooled to 7 x 7 from 16 x 16, 8 x 8 and 4 x 4 grids.
        "pvt_v2_linear": (
            "PvtV2ForImageClassification",
            PvtV2Config(
                image_size=64,
                num_encoder_blocks=3,
                depths=[1, 1, 2],
                sr_ratios=[4, 2, 1],
                hidden_sizes=[16, 32, 32],
                patch_sizes=[7, 3, 3],
                strides=[4, 2, 2],
                num_attention_heads=[2, 2, 4],
                mlp_ratios=[2, 2, 2],
                linear_attention=True,
                **LABELS,
            ),
        ),
        "pvt_v2_backbone": (
            "PvtV2Model",
            PvtV2Config(
                image_size=64,
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                patch_sizes=[7, 3],
                strides=[4, 2],
                num_attention_heads=[2, 2],
                mlp_ratios=[2, 2],
            ),
        ),
    }


def _save(key: str, folder: Path) -> Path:
    import transformers
    from transformers import ViTImageProcessor

    arch, config = _configs()[key]
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight")):
                p.normal_(0.0, 0.5)  # peaked attention (see the module docstring)
            elif name.endswith(("position_embeddings", "cls_token")):
                p.normal_(0.0, 1.0)
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


def _load(folder: Path):
    return load_model(str(folder), device="cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pvt_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-pvt")
    return {k: _save(k, root / k) for k in _configs()}


@pytest.fixture(scope="module")
def pvt(pvt_dirs):
    return {k: _load(d) for k, d in pvt_dirs.items()}


# --- what the model itself did, seen through test-local hooks ---------------------------


@dataclass
class Seen:
    """One block as the model ran it."""

    stage: int
    grid: tuple[int, int]  # the block's height / width arguments
    keys: tuple[int, int]  # the reduction path's output grid, else the stage grid
    attention: np.ndarray  # (H, Tq, Tk) softmax(q k^T / sqrt(d)) from the block's projections
    module: torch.nn.Module  # the self-attention module
    probs: torch.Tensor  # the attention-dropout output (live, for gradients)
    tokens_in: torch.Tensor
    tokens_out: torch.Tensor


def _is_attention(m: torch.nn.Module) -> bool:
    return type(m).__name__ in ("PvtEfficientSelfAttention", "PvtV2SelfAttention")


def _is_block(m: torch.nn.Module) -> bool:
    return type(m).__name__ in ("PvtLayer", "PvtV2BlockLayer")


def _observe(loaded, pixels: torch.Tensor, *, grad: bool = False, **forward_kwargs):
    """Run the model with test-local hooks; returns (model output, per-block Seen, patch-embedding outputs)."""
    model = loaded.model
    attns = [m for m in model.modules() if _is_attention(m)]
    blocks = [m for m in model.modules() if _is_block(m)]
    embeds = [m for m in model.modules() if type(m).__name__ in ("PvtPatchEmbeddings", "PvtV2OverlapPatchEmbeddings")]
    assert len(attns) == len(blocks) > 0
    grabbed: dict = {}
    handles = []

    def keep(key):
        return lambda m, a, o: grabbed.__setitem__(key, o)

    try:
        for i, a in enumerate(attns):
            handles.append(a.query.register_forward_hook(keep(("q", i))))
            handles.append(a.key.register_forward_hook(keep(("k", i))))
            drop = a.dropout if hasattr(a, "dropout") else a.attn_drop
            handles.append(drop.register_forward_hook(keep(("p", i))))
            reduction = _reduction(a)
            if reduction is not None:
                handles.append(reduction.register_forward_hook(keep(("r", i))))
        for i, b in enumerate(blocks):
            handles.append(
                b.register_forward_hook(
                    lambda m, a, o, i=i: grabbed.__setitem__(("b", i), (a[0], a[1], a[2], o[0])), with_kwargs=False
                )
            )
        for s, e in enumerate(embeds):
            handles.append(e.register_forward_hook(keep(("e", s))))
        with torch.enable_grad() if grad else torch.no_grad():
            out = model(pixel_values=pixels, **forward_kwargs)
    finally:
        for h in handles:
            h.remove()
    stage_of = _stage_of_blocks(model, blocks)
    seen = []
    for i, a in enumerate(attns):
        x_in, h, w, x_out = grabbed[("b", i)]
        heads, d = a.num_attention_heads, a.attention_head_size
        q = grabbed[("q", i)][0].detach().reshape(-1, heads, d).transpose(0, 1)
        k = grabbed[("k", i)][0].detach().reshape(-1, heads, d).transpose(0, 1)
        ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1).numpy()
        keys = tuple(grabbed[("r", i)].shape[-2:]) if ("r", i) in grabbed else (h, w)
        seen.append(Seen(stage_of[i], (h, w), keys, ref, a, grabbed[("p", i)], x_in.detach(), x_out.detach()))
    return out, seen, [grabbed[("e", s)][0].detach() for s in range(len(embeds))]


def _stage_of_blocks(model, blocks) -> list[int]:
    encoder = model.base_model.encoder
    stages = encoder.block if hasattr(encoder, "block") else [layer.blocks for layer in encoder.layers]
    where = {id(b): s for s, stage in enumerate(stages) for b in stage}
    return [where[id(b)] for b in blocks]


# --- dense matrices and merges, by loops --------------------------------------------------


def _reduction(a: torch.nn.Module) -> torch.nn.Module | None:
    conv = getattr(a, "sequence_reduction", None)  # PvT v1
    return conv if conv is not None else getattr(a, "spatial_reduction", None)  # PvT v2


def _key_tokens_axis(j: int, n: int, k: int, rule: str, r: int) -> list[int]:
    """Stage rows (or columns) over which key row (column) ``j`` of ``k`` spreads its weight."""
    if rule == "same":
        return [j]
    if rule == "strided":
        # Kernel = stride = r, no padding: key j is rows j r .. j r + r - 1. Rows the conv never
        # sees (n not a multiple of r) go to the last key: the record's stated convention.
        return list(range(j * r, n if j == k - 1 else (j + 1) * r))
    # 7 x 7 pool: the tokens whose centres lie in the key cell; a cell holding no centre takes
    # the token whose cell contains the key cell's centre.
    inside = [i for i in range(n) if j * n <= (i + 0.5) * k < (j + 1) * n]
    return inside or [int((j + 0.5) * n / k)]


def _dense(seen: Seen, f: np.ndarray) -> np.ndarray:
    """A block's (Tq, Tk) matrix on its stage's tokens: each key's weight spread evenly over its tokens."""
    gh, gw = seen.grid
    kh, kw = seen.keys
    prefix = f.shape[0] - gh * gw
    a = seen.module
    conv = _reduction(a)
    if getattr(a, "linear_attention", False):
        rule, r = "pool", 0
    elif conv is not None:
        assert conv.kernel_size == conv.stride and conv.padding == (0, 0)
        rule, r = "strided", conv.kernel_size[0]
    else:
        rule, r = "same", 1
    t = prefix + gh * gw
    out = np.zeros((t, t))
    out[:, :prefix] = f[:, :prefix]
    for ki in range(kh):
        rows = _key_tokens_axis(ki, gh, kh, rule, r)
        for kj in range(kw):
            cols = _key_tokens_axis(kj, gw, kw, rule, r)
            share = f[:, prefix + ki * kw + kj] / (len(rows) * len(cols))
            for rr in rows:
                for cc in cols:
                    out[:, prefix + rr * gw + cc] += share
    return out


def _merges(loaded, seen: list[Seen]) -> dict[int, np.ndarray]:
    """Merge matrices into every later stage: v1 by its conv's own blocks, v2 by the centre rule."""
    v1 = loaded.config.model_type == "pvt"
    firsts = {}
    for s in seen:
        firsts.setdefault(s.stage, s)
    merges = {}
    embeds = [m for m in loaded.model.modules() if type(m).__name__ == "PvtPatchEmbeddings"]
    for st in range(1, len(firsts)):
        prev, cur = firsts[st - 1], firsts[st]
        prev_p = prev.attention.shape[1] - prev.grid[0] * prev.grid[1]
        cur_p = cur.attention.shape[1] - cur.grid[0] * cur.grid[1]
        if v1:
            conv = embeds[st].projection
            assert conv.kernel_size == conv.stride and conv.padding == (0, 0)
            sr, sc = conv.stride

            def parent(r, c, sr=sr, sc=sc):
                return r // sr, c // sc
        else:
            (ph, pw), (gh, gw) = prev.grid, cur.grid

            def parent(r, c, ph=ph, pw=pw, gh=gh, gw=gw):
                return int((r + 0.5) * gh / ph), int((c + 0.5) * gw / pw)

        merges[st] = merge_matrix(prev.grid, cur.grid, parent, prev_prefix=prev_p, prefix=cur_p)
    return merges


def _readout(loaded, last: Seen) -> np.ndarray:
    t = last.attention.shape[1]
    n = last.grid[0] * last.grid[1]
    u = np.zeros(t)
    if loaded.config.model_type == "pvt":
        u[0] = 1.0  # CLS, first in PvT v1's last stage
    else:
        u[t - n :] = 1.0 / n
    return u


CASES = [
    ("pvt", None),
    ("pvt_v2", None),
    ("pvt_v2", 96),
    ("pvt_v2", (64, 96)),
    ("pvt_v2_linear", None),
    ("pvt_v2_linear", (96, 64)),
]


def _run(loaded, seed: int, size):
    img = random_image(seed, size=(70, 50))
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded, size))
    out, seen, embeds = _observe(loaded, pixels, output_hidden_states=True)
    return cap, out, seen, embeds


# --- 1. loading and the record --------------------------------------------------------------

EXPECTED = {
    # (key, requested size): (input size, stage grids, prefix kinds per stage, blocks per stage, key grid per block)
    ("pvt", None): (
        (64, 64),
        [(16, 16), (8, 8), (4, 4), (2, 2)],
        [(), (), (), ("CLS",)],
        [(0,), (1, 2), (3,), (4, 5)],
        [(4, 4), (4, 4), (4, 4), None, None, None],
    ),
    ("pvt_v2", None): (
        (64, 64),
        [(16, 16), (8, 8), (4, 4), (2, 2)],
        [()] * 4,
        [(0,), (1, 2), (3,), (4,)],
        [(5, 5), (4, 4), (4, 4), (2, 2), None],
    ),
    ("pvt_v2", 96): (
        (96, 96),
        [(24, 24), (12, 12), (6, 6), (3, 3)],
        [()] * 4,
        [(0,), (1, 2), (3,), (4,)],
        [(8, 8), (6, 6), (6, 6), (3, 3), None],
    ),
    ("pvt_v2", (64, 96)): (
        (64, 96),
        [(16, 24), (8, 12), (4, 6), (2, 3)],
        [()] * 4,
        [(0,), (1, 2), (3,), (4,)],
        [(5, 8), (4, 6), (4, 6), (2, 3), None],
    ),
    ("pvt_v2_linear", None): (
        (64, 64),
        [(16, 16), (8, 8), (4, 4)],
        [()] * 3,
        [(0,), (1,), (2, 3)],
        [(7, 7)] * 4,
    ),
    ("pvt_v2_linear", (96, 64)): (
        (96, 64),
        [(24, 16), (12, 8), (6, 4)],
        [()] * 3,
        [(0,), (1,), (2, 3)],
        [(7, 7)] * 4,
    ),
}


def test_registry_and_loading_by_folder(pvt):
    assert {"pvt", "pvt_v2"} <= set(supported_model_types())
    v1, v2 = pvt["pvt"], pvt["pvt_v2"]
    assert family_for(v1.config).name == "PvT" and family_for(v2.config).name == "PvT v2"
    assert v1.family.hierarchical and v2.family.hierarchical
    assert v1.patch_size == 4 and v2.patch_size == 4
    assert v1.default_size == (64, 64) and v2.default_size == (64, 64)
    assert v1.has_classifier and v2.has_classifier and not pvt["pvt_v2_backbone"].has_classifier
    # First patch-embedding conv: PvT v1 kernel 4 (stride 4), PvT v2 kernel 7 (stride 4, overlapping).
    assert v1.patch_weights.shape == (16, 3, 4, 4) and v1.patch_weights.dtype == np.float32
    assert v2.patch_weights.shape == (16, 3, 7, 7) and v2.patch_weights.dtype == np.float32
    np.testing.assert_array_equal(
        v2.patch_weights, v2.model.pvt_v2.encoder.layers[0].patch_embedding.proj.weight.detach().numpy()
    )
    assert v1.family.size_multiple(v1.config) == 32 and v2.family.size_multiple(v2.config) == 32
    assert v1.family.fixed_size(v1.config) == (64, 64) and v2.family.fixed_size(v2.config) is None
    assert v1.family.rollout_note(v1.config) == "" and v2.family.rollout_note(v2.config) == ""


@pytest.mark.parametrize(("key", "size"), list(EXPECTED))
def test_stage_grids_prefix_kinds_and_key_grids(pvt, key, size):
    loaded = pvt[key]
    hw, grids, kinds, blocks, keys = EXPECTED[(key, size)]
    cap = capture(loaded, random_image(1), size=size)
    assert cap.input_size == hw and cap.image.shape == (*hw, 3)
    assert [s.grid for s in cap.stages] == grids
    assert [s.prefix_kinds for s in cap.stages] == kinds
    assert [s.blocks for s in cap.stages] == blocks
    assert [b.geometry.key_grid for b in cap.blocks] == keys
    assert cap.readout == ("cls" if key == "pvt" else "pooled")
    assert cap.patch_size == 4 and cap.is_hierarchical and cap.family == loaded.family.name
    linear = key == "pvt_v2_linear"
    for b in cap.blocks:
        g = b.geometry
        assert g.kind == "global" and g.grid == cap.stages[g.stage].grid
        assert g.key_rule == ("centre" if linear else "strided" if g.key_grid else "same")
        assert b.attention.shape == g.native_shape()
        assert b.attention.dtype == np.float16  # the default storage
        np.testing.assert_allclose(b.attention.sum(-1, dtype=np.float32), 1.0, atol=2e-3)
        np.testing.assert_allclose(b.fused.sum(-1), 1.0, atol=1e-5)
    for s in cap.stages:
        assert s.token_norms.shape == (len(s.blocks) + 1, s.num_tokens)
    for prev, cur in zip(cap.stages, cap.stages[1:], strict=False):
        pr, pc = cur.parents
        np.testing.assert_array_equal(pr, np.arange(prev.grid[0]) // 2)  # stride-2 embeddings, even grids
        np.testing.assert_array_equal(pc, np.arange(prev.grid[1]) // 2)
    with pytest.raises(ValueError, match="no dense"):
        cap.attentions  # noqa: B018


def test_key_grid_follows_the_reduction_strides(pvt):
    cap = capture(pvt["pvt"], random_image(2))
    assert [b.geometry.key_stride for b in cap.blocks[:3]] == [(4, 4), (2, 2), (2, 2)]
    cap = capture(pvt["pvt_v2"], random_image(2))
    assert [b.geometry.key_stride for b in cap.blocks[:4]] == [(3, 3), (2, 2), (2, 2), (2, 2)]


def test_backbone_without_classifier(pvt):
    loaded = pvt["pvt_v2_backbone"]
    cap = capture(loaded, random_image(3), size=96)
    assert cap.logits is None and cap.predictions == ()
    assert [s.grid for s in cap.stages] == [(24, 24), (12, 12)]
    assert [b.geometry.key_grid for b in cap.blocks] == [(12, 12), None]
    with pytest.raises(CaptureError, match="classifier"):
        explain_classes(loaded, random_image(3), [0])


# --- 2. parity with attention recomputed from q and k ---------------------------------------


@pytest.mark.parametrize(("key", "size"), CASES)
def test_attention_and_query_maps_equal_recomputed_from_queries_and_keys(pvt, key, size):
    loaded = pvt[key]
    cap, _, seen, _ = _run(loaded, 10, size)
    assert len(seen) == cap.num_blocks
    for b, s in zip(cap.blocks, seen, strict=True):
        g = b.geometry
        assert g.grid == s.grid and g.keys == s.keys and g.stage == s.stage
        np.testing.assert_allclose(s.probs[0].numpy(), s.attention, rtol=1e-5, atol=1e-7)  # what the model used
        np.testing.assert_allclose(b.attention, s.attention, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b.fused, s.attention.mean(0), rtol=1e-4, atol=1e-6)
        p = g.num_prefix
        n = s.grid[0] * s.grid[1]
        for q in {0, p + n // 2 + s.grid[1] // 3, p + n - 1}:
            for h in range(g.num_heads):
                m = row_map(g, select(b, head=h), q)
                assert m.grid == s.keys
                np.testing.assert_allclose(m.values.ravel(), s.attention[h, q, p:], rtol=1e-4, atol=1e-6)
                np.testing.assert_allclose(m.prefix, s.attention[h, q, :p], rtol=1e-4, atol=1e-6)
            m = row_map(g, select(b), q)
            np.testing.assert_allclose(m.values.ravel(), s.attention[:, q, p:].mean(0), rtol=1e-4, atol=1e-6)
        pooled = row_map(g, select(b), POOLED)
        np.testing.assert_allclose(pooled.values.ravel(), s.attention[:, p:, p:].mean((0, 1)), rtol=1e-4, atol=1e-6)
    # The weights are far from uniform, so the comparisons above can tell keys apart.
    first = seen[0].attention
    assert first.max() > 5.0 / first.shape[-1]


def test_cls_attends_and_is_attended_in_the_last_pvt_stage(pvt):
    cap, _, seen, _ = _run(pvt["pvt"], 11, None)
    for b in cap.stages[-1].blocks:
        g = cap.blocks[b].geometry
        assert g.prefix_kinds == ("CLS",) and g.key_grid is None
        assert cap.blocks[b].attention.shape == (4, 5, 5)
        np.testing.assert_allclose(cap.blocks[b].attention[:, :, 0], seen[b].attention[:, :, 0], rtol=1e-4)


# --- 3. rollout ---------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "size"), CASES)
def test_rollout_equals_dense_reference(pvt, key, size):
    loaded = pvt[key]
    cap, _, seen, _ = _run(loaded, 20, size)
    dense = [_dense(s, s.attention.mean(0)) for s in seen]
    for d in dense:  # the spread keeps every row stochastic
        np.testing.assert_allclose(d.sum(1), 1.0, atol=1e-5)
    ref = rollout_reference(dense, [s.stage for s in seen], _merges(loaded, seen), _readout(loaded, seen[-1]))
    row, stage = capture_rollout(cap)
    assert stage == 0 and row.shape == (seen[0].grid[0] * seen[0].grid[1],)
    np.testing.assert_allclose(row, ref, rtol=1e-4, atol=1e-7)


# --- 4. relevance ---------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "size"), [c for c in CASES if c[1] in (None, 96)])
def test_relevance_equals_reference_with_own_gradients(pvt, key, size):
    loaded = pvt[key]
    img = random_image(30, size=(60, 44))
    classes = [0, 2]
    got = explain_classes(loaded, img, classes, size=size)
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded, size))
    pixels.requires_grad_(True)
    out, seen, _ = _observe(loaded, pixels, grad=True)
    merges = _merges(loaded, seen)
    readout = _readout(loaded, seen[-1])
    for c in classes:
        grads = torch.autograd.grad(out.logits[0, c], [s.probs for s in seen], retain_graph=True, allow_unused=True)
        abar = []
        for s, gr in zip(seen, grads, strict=True):
            a = s.probs.detach()[0].double().numpy()
            gnp = np.zeros_like(a) if gr is None else gr[0].double().numpy()
            abar.append(_dense(s, np.clip(gnp * a, 0.0, None).mean(0)))
        ref = relevance_reference(abar, [s.stage for s in seen], merges, readout)
        e = got[c]
        assert e.readout == ("CLS" if key == "pvt" else "pooled query")
        assert e.grid == seen[0].grid and e.num_prefix_tokens == 0
        assert ref.max() > 0
        np.testing.assert_allclose(e.relevance, ref, rtol=1e-4, atol=1e-7)


# --- 5. mean attention distance and entropy ------------------------------------------------------


@pytest.mark.parametrize(("key", "size"), CASES)
def test_distance_and_entropy_per_block(pvt, key, size):
    cap, _, seen, _ = _run(pvt[key], 40, size)
    for b, s in zip(cap.blocks, seen, strict=True):
        p = s.attention.shape[1] - s.grid[0] * s.grid[1]
        qc, kc = centres(s.grid, cap.input_size), centres(s.keys, cap.input_size)
        for h in range(s.attention.shape[0]):
            a = s.attention[h].astype(np.float64)
            dist = mean_distance_reference(a[p:, p:], qc, kc)
            ent = float(np.mean([-sum(x * math.log(x) for x in row if x > 0) for row in a]))
            assert b.distance[h] == pytest.approx(dist, rel=1e-4)
            assert b.entropy[h] == pytest.approx(ent, rel=1e-4)
            assert b.entropy_norm[h] == pytest.approx(ent / math.log(a.shape[1]), rel=1e-4)


# --- 6. token norms against the model's own hidden states ---------------------------------------


def test_token_norms_pvt_against_hidden_states(pvt):
    loaded = pvt["pvt"]
    cap, out, _, embeds = _run(loaded, 50, None)
    hidden = out.hidden_states  # one (B, N, C) per block, then the final LayerNorm; last stage: CLS first
    assert len(hidden) == cap.num_blocks + 1
    for s in cap.stages:
        np.testing.assert_allclose(s.token_norms[0], embeds[s.index][0].norm(dim=-1).numpy(), rtol=1e-5)
        for j, b in enumerate(s.blocks):
            assert hidden[b].shape[1] == s.num_tokens
            np.testing.assert_allclose(s.token_norms[j + 1], hidden[b][0].norm(dim=-1).numpy(), rtol=1e-5)
    # The classifier reads row 0 of the final states: CLS is first.
    logits = loaded.model.classifier(hidden[-1][:, 0])
    np.testing.assert_allclose(cap.logits, logits[0].detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key", ["pvt_v2", "pvt_v2_linear"])
def test_token_norms_pvt_v2_against_hidden_states(pvt, key):
    loaded = pvt[key]
    cap, out, seen, embeds = _run(loaded, 51, (64, 96))
    hidden = out.hidden_states  # one (B, C, H, W) per stage: the stage LayerNorm of its last block's output
    assert len(hidden) == len(cap.stages)
    layers = loaded.model.pvt_v2.encoder.layers
    for s in cap.stages:
        last = seen[s.blocks[-1]]
        assert hidden[s.index].shape[-2:] == s.grid
        rows = hidden[s.index][0].flatten(1).T  # (H*W, C), row-major over the grid
        np.testing.assert_allclose(rows.numpy(), layers[s.index].layer_norm(last.tokens_out)[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(s.token_norms[0], embeds[s.index][0].norm(dim=-1).numpy(), rtol=1e-5)
        for j, b in enumerate(s.blocks):
            np.testing.assert_allclose(s.token_norms[j + 1], seen[b].tokens_out[0].norm(dim=-1).numpy(), rtol=1e-5)
            if j:
                torch.testing.assert_close(seen[b].tokens_in, seen[s.blocks[j - 1]].tokens_out)
    pooled = hidden[-1][0].flatten(1).mean(1)
    np.testing.assert_allclose(cap.logits, loaded.model.classifier(pooled).detach().numpy(), rtol=1e-5, atol=1e-6)


# --- 7. position information -------------------------------------------------------------------


def test_pvt_position_tables_per_stage(pvt):
    loaded = pvt["pvt"]
    tables = loaded.position.tables
    assert [t.grid for t in tables] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert [t.grid for t in tables] == [s.grid for s in capture(loaded, random_image(4)).stages]
    embeds = [m for m in loaded.model.modules() if type(m).__name__ == "PvtPatchEmbeddings"]
    for s, (t, e) in enumerate(zip(tables, embeds, strict=True)):
        table = e.position_embeddings.detach()[0].numpy()
        expected = table[1:] if s == len(tables) - 1 else table  # the CLS row is the first, last stage only
        assert t.embeddings.shape == (t.grid[0] * t.grid[1], table.shape[-1])
        np.testing.assert_array_equal(t.embeddings, expected)
        sim = position_similarity(t.embeddings)
        assert sim.shape == (t.embeddings.shape[0],) * 2
        np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-6)
    with pytest.raises(ValueError):
        tables[0].embeddings[0, 0] = 1.0
    assert loaded.position_grid == (16, 16) and loaded.position.note == ""


def test_pvt_v2_has_a_sentence_not_a_table(pvt):
    for key in ("pvt_v2", "pvt_v2_linear"):
        info = pvt[key].position
        assert info.tables == () and info.biases == ()
        assert "no position-embedding table" in info.note and "convolution" in info.note
        assert "depth-wise" in info.note and "overlapping patch embeddings" in info.note


# --- 8. sizes and the memory budget ---------------------------------------------------------------


def test_pvt_runs_only_at_its_configured_size(pvt):
    loaded = pvt["pvt"]
    img = random_image(5)
    default = capture(loaded, img, attention_dtype="float32")
    for size in (96, (64, 128), 32):
        assert input_size_for(loaded, size) == (64, 64)
        other = capture(loaded, img, size=size, attention_dtype="float32")
        assert other.input_size == (64, 64)
        for a, b in zip(default.blocks, other.blocks, strict=True):
            np.testing.assert_array_equal(a.attention, b.attention)
    # What the adapter protects against: the model itself fails at another size.
    with pytest.raises(RuntimeError), torch.no_grad():
        loaded.model(pixel_values=torch.zeros(1, 3, 96, 96))


@pytest.mark.parametrize(("key", "size"), CASES)
def test_attention_numel_counts_what_a_capture_holds(pvt, key, size):
    loaded = pvt[key]
    cap = capture(loaded, random_image(6), size=size)
    assert loaded.family.attention_numel(loaded.config, cap.input_size) == sum(b.attention.size for b in cap.blocks)


def test_huge_pvt_v2_input_is_refused_before_the_forward(pvt):
    loaded = pvt["pvt_v2"]
    with pytest.raises(BudgetError, match="smaller input size"):
        check_budget(loaded, (2048, 2048), batch=1, gradients=False, budget=2**20)
    with pytest.raises(BudgetError, match="smaller input size"):
        capture(loaded, random_image(7), size=2048, budget_bytes=2**20)
    with pytest.raises(BudgetError, match="gradients"):
        explain_classes(loaded, random_image(7), [0], size=2048, budget_bytes=2**20)
    check_budget(loaded, (64, 64), batch=1, gradients=True, budget=2**20)  # the default fits
