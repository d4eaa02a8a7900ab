"""MobileViT and MobileViT V2 adapters on tiny random-weight models, against the models' own tensors.

Every reference here is computed by test-local hooks on the models' projections,
unfoldings and transformer layers (removed in ``finally``), never by vitviz's code.
Weights are redrawn large enough that attention is far from uniform (the default
initialisation, std 0.02, gives nearly uniform rows that any layout bug would match).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import centres, mean_distance_reference

from vitviz.analysis import blocks
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, capture_batch, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.errors import BudgetError, CaptureError
from vitviz.models.families import family_for
from vitviz.models.families.mobilevit import MobileViT, MobileViTV2
from vitviz.models.load import LoadedModel, load_model
from vitviz.record import POOLED, Geometry

KEYS = ("mobilevit", "mobilevitv2")
SIZE = 128  # the tiny models' default input: stage grids 8 x 8, 4 x 4, 2 x 2
LABELS = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}
HEADS = 2


def _config(key: str, **overrides):
    from transformers import MobileViTConfig, MobileViTV2Config

    if key == "mobilevit":
        return MobileViTConfig(
            image_size=SIZE,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
            num_attention_heads=HEADS,
            expand_ratio=2.0,
            **LABELS,
            **overrides,
        )
    return MobileViTV2Config(image_size=SIZE, width_multiplier=0.125, n_attn_blocks=[1, 2, 1], **LABELS, **overrides)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights of unit-scale activations, then larger queries and keys so attention is peaked."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(noise / p[0].numel() ** 0.5)
            elif name.endswith("weight"):
                p.copy_(1 + 0.1 * noise)  # batch, group and layer norms
            else:
                p.copy_(0.1 * noise)
            if name.endswith(("attention.query.weight", "attention.key.weight")):
                p.mul_(3.0)
            if name.endswith("qkv_proj.convolution.weight"):
                p[0].mul_(6.0)  # V2's query channel: the context scores' logits


def save_tiny_mobilevit(key: str, folder: Path, *, classifier: bool = True, seed: int = 0, **overrides) -> Path:
    import transformers
    from transformers import MobileViTImageProcessor

    arch = {"mobilevit": "MobileViT", "mobilevitv2": "MobileViTV2"}[key]
    arch += "ForImageClassification" if classifier else "Model"
    model = getattr(transformers, arch)(_config(key, **overrides))
    _randomise(model, seed)
    model.save_pretrained(folder, safe_serialization=True)
    # MobileViT checkpoints ship MobileViT's own processor (shortest edge, centre crop, BGR).
    MobileViTImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}).save_pretrained(
        folder
    )
    return folder


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-mobilevit")
    return {k: save_tiny_mobilevit(k, root / k) for k in KEYS}


@pytest.fixture(scope="module")
def models(folders) -> dict[str, LoadedModel]:
    return {k: load_model(str(d), device="cpu") for k, d in folders.items()}


def _modeling(key: str):
    from transformers.models.mobilevit import modeling_mobilevit
    from transformers.models.mobilevitv2 import modeling_mobilevitv2

    return modeling_mobilevit if key == "mobilevit" else modeling_mobilevitv2


def _layers(loaded: LoadedModel) -> list[torch.nn.Module]:
    m = _modeling(loaded.config.model_type)
    cls = m.MobileViTLayer if loaded.config.model_type == "mobilevit" else m.MobileViTV2Layer
    return [x for x in loaded.model.modules() if isinstance(x, cls)]


@contextmanager
def _hooks(pairs: list[tuple[torch.nn.Module, Callable]]):
    handles = []
    try:
        for module, fn in pairs:
            handles.append(module.register_forward_hook(fn))
        yield
    finally:
        for h in handles:
            h.remove()


def _run(loaded: LoadedModel, image, hw: tuple[int, int], batch: int = 1) -> None:
    pixels, _ = preprocess(loaded, [image] * batch, hw)
    with torch.no_grad():
        loaded.model(pixel_values=pixels)


def _with_multiple(loaded: LoadedModel, m: int) -> LoadedModel:
    """The same model with a family that snaps inputs to multiples of ``m`` (so stages must resize or drop)."""
    base = type(loaded.family)

    class Loose(base):
        def size_multiple(self, config) -> int:
            return m

    return dataclasses.replace(loaded, family=Loose())


def _unfolded_grids(loaded: LoadedModel, image, hw: tuple[int, int]) -> list[tuple[tuple[int, int], bool]]:
    """Per stage, the patch grid each layer's own ``unfolding`` produced, and whether the map had to be resized.

    MobileViT reports its grid in its info dict; V2 returns the patches ``(B, C, A, N)``
    and the map's size, from which ``F.unfold``'s rule gives the grid (checked against N).
    """
    seen: list[tuple[tuple[int, int], bool]] = []
    layers = _layers(loaded)
    v1 = loaded.config.model_type == "mobilevit"

    def wrap(layer):
        original = type(layer).unfolding

        def unfolding(features):
            patches, info = original(layer, features)
            if v1:
                seen.append(((info["num_patches_height"], info["num_patches_width"]), info["interpolate"]))
            else:
                h, w = info
                grid = (h // layer.patch_height, w // layer.patch_width)
                assert patches.shape[-1] == grid[0] * grid[1]
                seen.append((grid, h % layer.patch_height != 0 or w % layer.patch_width != 0))
            return patches, info

        return unfolding

    try:
        for layer in layers:
            layer.unfolding = wrap(layer)  # an instance attribute, removed below
        _run(loaded, image, hw)
    finally:
        for layer in layers:
            layer.__dict__.pop("unfolding", None)
    return seen


def _recomputed(loaded: LoadedModel, image, hw: tuple[int, int]) -> list[np.ndarray]:
    """Each block's attention from its own projections, in forward order.

    MobileViT: ``softmax(q k^T / sqrt(d))`` per offset and head from the ``query`` and
    ``key`` Linear outputs ``(A, N, H * d)`` -> ``(A, H, N, N)``. V2: softmax over the
    patches of channel 0 (the query) of the ``qkv_proj`` output ``(1, 1 + 2C, A, N)`` -> ``(A, N)``.
    """
    m = _modeling(loaded.config.model_type)
    out: list[np.ndarray] = []
    if loaded.config.model_type == "mobilevit":
        attns = [x for x in loaded.model.modules() if isinstance(x, m.MobileViTSelfAttention)]
        grabbed: dict[int, dict[str, torch.Tensor]] = {}
        order: list[int] = []

        def grab(i: int, what: str):
            def hook(mod, args, output):
                if what == "q":
                    order.append(i)
                grabbed.setdefault(i, {})[what] = output.detach()

            return hook

        pairs = [(a.query, grab(i, "q")) for i, a in enumerate(attns)]
        pairs += [(a.key, grab(i, "k")) for i, a in enumerate(attns)]
        with _hooks(pairs):
            _run(loaded, image, hw)
        for i in order:
            q, k = grabbed[i]["q"], grabbed[i]["k"]  # (A, N, C)
            a, n, c = q.shape
            d = c // HEADS
            qh = q.view(a, n, HEADS, d).transpose(1, 2)
            kh = k.view(a, n, HEADS, d).transpose(1, 2)
            out.append(torch.softmax(qh @ kh.transpose(-1, -2) / math.sqrt(d), dim=-1).numpy())
        return out
    attns = [x for x in loaded.model.modules() if isinstance(x, m.MobileViTV2LinearSelfAttention)]

    def hook(mod, args, output):
        out.append(torch.softmax(output.detach()[0, 0], dim=-1).numpy())  # (A, N)

    with _hooks([(a.qkv_proj, hook) for a in attns]):
        _run(loaded, image, hw)
    return out


def _block_tokens(loaded: LoadedModel, image, hw: tuple[int, int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per block, (input, output) per-patch L2 norms over offsets and channels, from the layer's own tensors."""
    m = _modeling(loaded.config.model_type)
    v1 = loaded.config.model_type == "mobilevit"
    cls = m.MobileViTTransformerLayer if v1 else m.MobileViTV2TransformerLayer
    layers = [x for x in loaded.model.modules() if isinstance(x, cls)]
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def norms(x: torch.Tensor) -> np.ndarray:
        x = x.detach().double().numpy()
        # v1: (A, N, C), patches on axis 1; v2: (1, C, A, N), patches last
        return np.sqrt((x**2).sum(axis=(0, 2))) if v1 else np.sqrt((x**2).sum(axis=(0, 1, 2)))

    def hook(mod, args, output):
        seen.append((norms(args[0]), norms(output)))

    with _hooks([(x, hook) for x in layers]):
        _run(loaded, image, hw)
    return seen


def _feature_patch_norms(loaded: LoadedModel, image, hw: tuple[int, int]) -> list[np.ndarray]:
    """Per stage, the L2 norm of each ph x pw x C block of the map entering the unfolding, row-major."""
    seen: list[np.ndarray] = []
    layers = _layers(loaded)

    def hook_for(layer):
        def hook(mod, args, output):
            x = output.detach().double()[0].numpy()  # (C, h, w)
            c, h, w = x.shape
            ph, pw = layer.patch_height, layer.patch_width
            blocks_ = x.reshape(c, h // ph, ph, w // pw, pw)
            seen.append(np.sqrt((blocks_**2).sum(axis=(0, 2, 4))).ravel())

        return hook

    with _hooks([(layer.conv_1x1, hook_for(layer)) for layer in layers]):
        _run(loaded, image, hw)
    return seen


# --- loading and the record's shape ------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_loads_by_folder_with_its_adapter(models, key):
    loaded = models[key]
    fam = loaded.family
    assert isinstance(fam, MobileViTV2 if key == "mobilevitv2" else MobileViT)
    assert family_for(loaded.config) is fam and fam.hierarchical
    assert fam.name == ("MobileViT V2" if key == "mobilevitv2" else "MobileViT")
    assert loaded.model.config._attn_implementation == "eager"
    assert loaded.patch_size == 16  # stride 8 at the first transformer stage x 2 x 2 patches
    assert fam.size_multiple(loaded.config) == 64
    assert loaded.default_size == (SIZE, SIZE)
    assert loaded.id2label == LABELS["id2label"]
    stem = loaded.base_model.conv_stem.convolution.weight
    assert loaded.patch_weights.dtype == np.float32
    np.testing.assert_array_equal(loaded.patch_weights, stem.numpy())
    assert loaded.position.tables == () and loaded.position_embeddings is None
    assert "no position embeddings" in loaded.position_note and "convolutions" in loaded.position_note


@pytest.mark.parametrize("key", KEYS)
def test_backbone_without_classifier_captures(tmp_path, key):
    loaded = load_model(str(save_tiny_mobilevit(key, tmp_path / key, classifier=False)), device="cpu")
    assert not loaded.has_classifier
    cap = capture(loaded, random_image(1))
    assert cap.logits is None and cap.predictions == ()
    assert [s.grid for s in cap.stages] == [(8, 8), (4, 4), (2, 2)]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("size", [None, (128, 192), (192, 64)])
def test_stages_grids_offsets_and_heads(models, key, size):
    loaded = models[key]
    img = random_image(2, size=(90, 70))
    hw = input_size_for(loaded, size)
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    unfolded = _unfolded_grids(loaded, img, hw)
    depths = (2, 4, 3) if key == "mobilevit" else (1, 2, 1)
    assert cap.input_size == hw and cap.readout == "pooled" and cap.is_hierarchical
    assert len(cap.stages) == 3 and [len(s.blocks) for s in cap.stages] == list(depths)
    assert cap.grid == (hw[0] // 16, hw[1] // 16)
    assert not any(resized for _, resized in unfolded)  # sizes snapped to the multiple never resize
    for s, stage in enumerate(cap.stages):
        assert stage.grid == unfolded[s][0]  # the grid the stage's unfolding produced
        assert stage.prefix_kinds == () and stage.parents is None
        n = stage.grid[0] * stage.grid[1]
        assert stage.token_norms.shape == (len(stage.blocks) + 1, n)
        for b in stage.blocks:
            g = cap.blocks[b].geometry
            assert g.stage == s and g.grid == stage.grid and g.offsets == 4
            if key == "mobilevit":
                assert g.kind == "unfolded" and g.num_heads == HEADS
                assert cap.blocks[b].attention.shape == (4, HEADS, n, n)
            else:
                assert g.kind == "separable" and g.num_heads == 1
                assert cap.blocks[b].attention.shape == (4, n)
    held = sum(int(np.prod(b.geometry.native_shape())) for b in cap.blocks)
    assert loaded.family.attention_numel(loaded.config, hw) == held


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("output_stride", [16, 8])
def test_dilated_stages_keep_their_stride(tmp_path, key, output_stride):
    """Segmentation backbones dilate the last stages instead of striding: grids and multiples follow."""
    loaded = load_model(str(save_tiny_mobilevit(key, tmp_path / key, output_stride=output_stride)), device="cpu")
    fam = loaded.family
    assert fam.size_multiple(loaded.config) == 2 * output_stride
    img = random_image(3)
    hw = input_size_for(loaded, (96, 160))
    cap = capture(loaded, img, size=hw)
    unfolded = _unfolded_grids(loaded, img, hw)
    assert [s.grid for s in cap.stages] == [g for g, _ in unfolded] == list(fam.stage_grids(loaded.config, hw))
    assert not any(resized for _, resized in unfolded)


def test_multiple_avoids_resizing_at_the_released_size():
    """Released MobileViTs run at 256 px: with the default config every stage tiles exactly there and at other multiples."""
    from transformers import MobileViTConfig, MobileViTV2Config

    for fam, cfg in ((MobileViT(), MobileViTConfig()), (MobileViTV2(), MobileViTV2Config())):
        m = fam.size_multiple(cfg)
        assert m == 64 and fam.patch_size(cfg) == 16
        for hw in ((256, 256), (320, 192), (448, 64)):
            assert hw[0] % m == 0 and hw[1] % m == 0
            for (gh, gw), stride in zip(fam.stage_grids(cfg, hw), fam.stage_strides(cfg), strict=True):
                assert (gh * 2 * stride, gw * 2 * stride) == hw
        assert fam.stage_grids(cfg, (256, 256)) == ((16, 16), (8, 8), (4, 4))


@pytest.mark.parametrize("key", KEYS)
def test_resizing_unfolding_records_the_grid_it_attended(models, key):
    """Inputs the multiple would never give: MobileViT resizes each map up to whole patches, V2 drops the rest."""
    loaded = _with_multiple(models[key], 8)
    img = random_image(4, size=(100, 70))
    hw = (72, 104)  # maps 9 x 13, 5 x 7, 3 x 4 at the three stages
    cap = capture(loaded, img, size=hw, attention_dtype="float32")
    assert cap.input_size == hw
    unfolded = _unfolded_grids(loaded, img, hw)
    assert all(resized for _, resized in unfolded)
    expected = [(5, 7), (3, 4), (2, 2)] if key == "mobilevit" else [(4, 6), (2, 3), (1, 2)]
    assert [s.grid for s in cap.stages] == [g for g, _ in unfolded] == expected
    for block, ref in zip(cap.blocks, _recomputed(loaded, img, hw), strict=True):
        np.testing.assert_allclose(block.attention, ref, rtol=1e-5, atol=1e-7)
    held = sum(int(np.prod(b.geometry.native_shape())) for b in cap.blocks)
    assert loaded.family.attention_numel(loaded.config, hw) == held


# --- parity with the models' own projections ------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("size", [None, (192, 128)])
def test_attention_and_maps_equal_recomputed_from_projections(models, key, size):
    loaded = models[key]
    img = random_image(5)
    hw = input_size_for(loaded, size)
    cap = capture(loaded, img, size=size, attention_dtype="float32")
    refs = _recomputed(loaded, img, hw)
    assert len(refs) == cap.num_blocks
    for block, ref in zip(cap.blocks, refs, strict=True):
        g = block.geometry
        np.testing.assert_allclose(block.attention, ref, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(ref.sum(-1), 1.0, atol=1e-5)
        if key == "mobilevit":
            n = g.grid[0] * g.grid[1]
            np.testing.assert_allclose(block.fused, ref.mean(axis=1), rtol=1e-5, atol=1e-7)
            for q in sorted({0, n // 2, n - 1}):
                # the map of query patch q: the mean over offsets (and heads, fused) of q's rows
                m = blocks.row_map(g, blocks.select(block), q)
                assert m.grid == g.grid and m.padding == 0.0
                np.testing.assert_allclose(m.values.ravel(), ref[:, :, q].mean(axis=(0, 1)), rtol=1e-5, atol=1e-7)
                for h in range(HEADS):
                    mh = blocks.row_map(g, blocks.select(block, head=h), q)
                    np.testing.assert_allclose(mh.values.ravel(), ref[:, h, q].mean(axis=0), rtol=1e-5, atol=1e-7)
                col = blocks.column_map(g, blocks.select(block), q)
                np.testing.assert_allclose(col.values.ravel(), ref[:, :, :, q].mean(axis=(0, 1)), rtol=1e-5, atol=1e-7)
            pooled = blocks.row_map(g, blocks.select(block), POOLED)
            np.testing.assert_allclose(pooled.values.ravel(), ref.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-7)
        else:
            # no query: the map is the mean over offsets of the context scores, whatever is asked
            for q in (POOLED, 0):
                m = blocks.row_map(g, blocks.select(block), q)
                np.testing.assert_allclose(m.values.ravel(), ref.mean(axis=0), rtol=1e-5, atol=1e-7)
    # the parity is not won by near-uniform rows: at least one block's rows are far from uniform
    assert min(b.entropy_norm.min() for b in cap.blocks if b.geometry.grid[0] * b.geometry.grid[1] > 4) < 0.8


@pytest.mark.parametrize("key", KEYS)
def test_summaries_follow_the_definitions(models, key):
    loaded = models[key]
    img = random_image(6)
    hw = (128, 192)
    cap = capture(loaded, img, size=hw, attention_dtype="float32")
    for block, ref in zip(cap.blocks, _recomputed(loaded, img, hw), strict=True):
        g = block.geometry
        n = g.grid[0] * g.grid[1]
        c = centres(g.grid, hw)  # patch-cell centres laid over the input, pixels
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(ref > 0, ref * np.log(ref), 0.0)
        if key == "mobilevit":
            for h in range(HEADS):
                dist = np.mean([mean_distance_reference(ref[a, h], c, c) for a in range(g.offsets)])
                assert block.distance[h] == pytest.approx(dist, rel=1e-4)
                ent = float(-plogp[:, h].sum(-1).mean())
                assert block.entropy[h] == pytest.approx(ent, rel=1e-4, abs=1e-6)
                assert block.entropy_norm[h] == pytest.approx(ent / np.log(max(n, 2)), rel=1e-4, abs=1e-6)
        else:
            assert block.distance.shape == (1,) and np.isnan(block.distance[0])
            ent = float(-plogp.sum(-1).mean())  # mean over offsets of the context scores' entropy
            assert block.entropy[0] == pytest.approx(ent, rel=1e-4, abs=1e-6)
            if n > 1:
                assert block.entropy_norm[0] == pytest.approx(ent / np.log(n), rel=1e-4, abs=1e-6)


def test_uniform_unfolded_attention_distance_is_the_paper_example():
    """Uniform attention on a 2 x 2 patch grid of 16 px cells: 16 (0 + 1 + 1 + sqrt 2) / 4 px for every offset."""
    g = Geometry(stage=0, kind="unfolded", num_heads=1, grid=(2, 2), offsets=4)
    dist, ent, norm = blocks.block_summaries(g, np.full((4, 1, 4, 4), 0.25, np.float32), (32, 32))
    assert dist[0] == pytest.approx(16 * (0 + 1 + 1 + np.sqrt(2)) / 4, rel=1e-6)
    assert ent[0] == pytest.approx(np.log(4), rel=1e-6) and norm[0] == pytest.approx(1.0, rel=1e-6)


# --- what is not defined, and what is refused ------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_rollout_and_relevance_refuse_with_the_note(models, key):
    loaded = models[key]
    cap = capture(loaded, random_image(7))
    note = loaded.family.rollout_note(loaded.config)
    assert cap.rollout_note == note and "not defined" in note and "convolutions" in note
    with pytest.raises(ValueError, match="not defined"):
        capture_rollout(cap)
    with pytest.raises(CaptureError, match=r"Class-specific relevance is not defined.*no token-to-token attention"):
        explain_classes(loaded, random_image(7), [0])
    if key == "mobilevit":
        dense = blocks.dense(cap.blocks[0].geometry, blocks.select(cap.blocks[0]))
        np.testing.assert_allclose(dense.sum(1), 1.0, atol=1e-3)  # within a block the mean over offsets is a matrix
    else:
        with pytest.raises(ValueError, match="no query"):
            blocks.dense(cap.blocks[0].geometry, blocks.select(cap.blocks[0]))


@pytest.mark.parametrize("key", KEYS)
def test_huge_input_is_refused_before_the_forward(models, key):
    loaded = models[key]
    if key == "mobilevit":
        with pytest.raises(BudgetError, match="budget"):
            capture(loaded, random_image(8), size=2048)  # 128 x 128 patches: 2 x 4 x 2 x N^2 floats at stage 1
    else:
        need = loaded.family.attention_numel(loaded.config, (2048, 2048)) * 4
        assert need == 4 * 4 * (128**2 * 1 + 64**2 * 2 + 32**2 * 1)  # separable attention is linear in N
        with pytest.raises(BudgetError, match="budget"):
            capture(loaded, random_image(8), size=2048, budget_bytes=need - 1)


# --- tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("size", [None, (128, 192)])
def test_token_norms_match_the_models_tensors(models, key, size):
    loaded = models[key]
    img = random_image(9)
    hw = input_size_for(loaded, size)
    cap = capture(loaded, img, size=size)
    per_block = _block_tokens(loaded, img, hw)
    maps = _feature_patch_norms(loaded, img, hw)
    for s, stage in enumerate(cap.stages):
        first = stage.blocks[0]
        np.testing.assert_allclose(stage.token_norms[0], per_block[first][0], rtol=1e-5)
        # the same norms, cut from the feature map itself: patches are in row-major grid order
        np.testing.assert_allclose(stage.token_norms[0], maps[s], rtol=1e-5)
        for row, b in enumerate(stage.blocks, start=1):
            np.testing.assert_allclose(stage.token_norms[row], per_block[b][1], rtol=1e-5)


@pytest.mark.parametrize("key", KEYS)
def test_a_batch_records_each_image_as_alone(models, key):
    """Batch and offsets share the model's leading axis (MobileViT: B * A): images must not mix."""
    loaded = models[key]
    imgs = [random_image(10), random_image(11, size=(30, 50))]
    both = capture_batch(loaded, imgs, size=(128, 192), attention_dtype="float32")
    for img, cap in zip(imgs, both, strict=True):
        alone = capture(loaded, img, size=(128, 192), attention_dtype="float32")
        for a, b in zip(alone.blocks, cap.blocks, strict=True):
            np.testing.assert_allclose(b.attention, a.attention, rtol=1e-4, atol=1e-6)
        for a, b in zip(alone.stages, cap.stages, strict=True):
            np.testing.assert_allclose(b.token_norms, a.token_norms, rtol=1e-4)
        np.testing.assert_allclose(cap.logits, alone.logits, rtol=1e-4, atol=1e-5)
    assert not np.allclose(both[0].blocks[0].attention, both[1].blocks[0].attention)


# --- a gap in shared code, kept visible --------------------------------------------------------


def test_pixels_are_what_mobilevits_processor_gives(models):
    """MobileViT's processor does not normalise and flips the channels: the model expects BGR in [0, 1]."""
    loaded = models["mobilevit"]
    img = random_image(12, size=(SIZE, SIZE))  # already the model size: resizing is the identity
    pixels, _ = preprocess(loaded, [img], (SIZE, SIZE))
    expected = np.asarray(img, np.float32)[..., ::-1].transpose(2, 0, 1) / 255.0  # BGR, [0, 1]
    np.testing.assert_allclose(pixels[0].numpy(), expected, atol=1e-6)
