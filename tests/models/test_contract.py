"""The adapter contract: every family through the same checks, and a model whose parts sit under names no
adapter knows (a DINOv2 whose layer scales are renamed gamma_1 / gamma_2, as EVA names them).

Direct logit attribution there must be exact or refused with a message, never silently wrong.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from conftest import TINY, random_image

from vitviz import causal as C
from vitviz.capture.forward import input_size_for, preprocess

pytestmark = pytest.mark.usefixtures("one_thread")

LABELS = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}


ZOO_KEYS = ("cct", "dat", "hybrid")  # T2T-ViT is built by its converter (tests/zoo/test_t2t.py)


def _save_zoo(key: str, folder):
    from transformers import ViTImageProcessor

    from vitviz.zoo.cct import CctConfig, CctForImageClassification
    from vitviz.zoo.dat import DatConfig, DatForImageClassification
    from vitviz.zoo.hybrid import HybridViTConfig, HybridViTForImageClassification

    torch.manual_seed(0)
    if key == "cct":
        config = CctConfig(image_size=32, embedding_dim=32, num_layers=2, num_heads=4, mlp_ratio=2, **LABELS)
        model = CctForImageClassification(config)
    elif key == "hybrid":  # a ResNet of (1, 1) units (stride 8, 4 x 4 cells at 32 px) under 2 ViT blocks
        config = HybridViTConfig(
            image_size=32,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            resnet_depths=(1, 1),
            resnet_width=8,
            num_groups=4,
            **LABELS,
        )
        model = HybridViTForImageClassification(config)
    else:
        config = DatConfig(
            image_size=32,
            patch_size=2,
            dim_stem=8,
            dims=[8, 16, 32, 64],
            depths=[2, 2, 2, 2],
            heads=[1, 2, 2, 4],
            window_sizes=[4, 4, 2, 2],
            groups=[-1, -1, 1, 2],
            stage_spec=[["L", "S"], ["L", "S"], ["L", "D"], ["L", "D"]],
            offset_kernel_sizes=[3, 3, 3, 3],
            **LABELS,
        )
        model = DatForImageClassification(config)
    model.eval().save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def every_family(tmp_path_factory):
    """Every registered model type's tiny model (tests/tiny.py), loaded on first use."""
    from tiny import TINY as BUILDERS

    from vitviz.models.load import load_model

    root = tmp_path_factory.mktemp("contract")
    loaded: dict = {}

    def get(model_type: str):
        if model_type not in loaded:
            folder = BUILDERS[model_type](root / model_type.replace("-", "_"))
            loaded[model_type] = load_model(str(folder), device="cpu")
        return loaded[model_type]

    return get


def _model_types() -> list[str]:
    from vitviz.models.families import supported_model_types

    return sorted(supported_model_types())


def test_every_registered_family_has_a_tiny_model():
    """A family added to the registry without a tiny model in tests/tiny.py fails here (nothing escapes the
    contract below)."""
    from tiny import TINY as BUILDERS

    missing = sorted(set(_model_types()) - set(BUILDERS))
    assert not missing, f"add a tiny model to tests/tiny.py for: {missing}"


@pytest.mark.parametrize("key", _model_types())
def test_every_family_keeps_the_contract(every_family, key):
    from vitviz.capture.run import get_run
    from vitviz.models.families.base import BlockParts
    from vitviz.models.hooks import installed_points, installed_sites
    from vitviz.models.points import block_name

    loaded = every_family(key)
    fam = loaded.family
    sites = installed_sites(loaded.model)
    points = installed_points(loaded.model)
    assert "embed.out" in points and len(points.prefixes) == len(sites)
    for site in sites:
        for part in ("in", "attn.pattern", "out"):
            assert block_name(points, site.index, part) in points
        parts = fam.block_parts(site)
        assert isinstance(parts, BlockParts)
        if not parts.unknown:  # a block the adapter fully declares has both parts, and its two norms
            assert isinstance(parts.projection, torch.nn.Linear) and isinstance(parts.mlp, torch.nn.Module)
            assert all(isinstance(n, torch.nn.Module) for n in parts.norms), (key, parts.norms)
        if parts.mlp is not None:
            assert block_name(points, site.index, "mlp.out") in points

    img = random_image(1, size=(70, 60))
    run = get_run(loaded, img)
    for site, g in zip(sites, run.geometries, strict=True):
        for part in ("in", "out"):
            assert run.has(block_name(points, site.index, part)), (key, site.index, part)
        z = block_name(points, site.index, "attn.z")
        if run.has(z):
            assert run.activation(z).shape[-1] % g.num_heads == 0
    if not fam.hierarchical:  # one residual stream: block i's output is block i + 1's input (a pooling head aside)
        kinds = {s.index: g.kind for s, g in zip(sites, run.geometries, strict=True)}
        for a, b in itertools.pairwise(s for s in sites if kinds[s.index] == "global"):
            torch.testing.assert_close(
                run.activation(block_name(points, a.index, "out")),
                run.activation(block_name(points, b.index, "in")),
                rtol=0,
                atol=0,
            )
    if loaded.has_classifier:  # exact, or refused with a message
        try:
            att = C.direct_logit_attribution(loaded, img)
        except C.NotDefined as exc:
            assert len(str(exc)) > 20
        else:
            assert att.total == pytest.approx(att.logit, rel=1e-4, abs=1e-5)


_PARTS = ("in", "attn.q", "attn.k", "attn.v", "attn.pattern", "attn.z", "attn.out", "resid_mid", "mlp.out", "out")


@pytest.mark.parametrize("key", _model_types())
def test_every_op_at_every_point_of_the_first_block(every_family, key):
    """Every point of the first block takes every edit op (one batched forward: copy i gets op i) or refuses with its
    reason. Identity edits (scale by 1, add 0, the identity function, a patch from the run itself) reproduce the
    clean run's last block output; zero, replace and mean change it."""
    from vitviz.capture.run import get_run
    from vitviz.models.hooks import installed_points
    from vitviz.models.points import Edit

    loaded = every_family(key)
    run = get_run(loaded, random_image(2, size=(70, 60)))
    points = installed_points(loaded.model)
    first, last = run.sites[0].index, run.name(run.sites[-1].index, "out")
    clean = run.activation(last).reshape(1, -1)
    edited = 0
    for part in _PARTS:
        name = run.name(first, part)
        if name not in points:
            continue
        if not points.by_name[name].editable:
            with pytest.raises(ValueError, match=r"recorded, not edited: .{30,}"):
                run.edited([Edit(name, "zero")], reuse_prefix=False)
            continue
        width = run.activation(name).shape[-1]
        edits = [
            Edit(name, "scale", 1.0, rows=(0,)),
            Edit(name, "add", 0.0, rows=(1,)),
            Edit(name, "fn", lambda t: t, rows=(2,)),
            Edit(name, "patch", run, rows=(3,)),
            Edit(name, "zero", rows=(4,)),
            Edit(name, "replace", torch.linspace(-1, 1, width), rows=(5,)),
            Edit(name, "mean", rows=(6,)),
        ]
        got = run.edited(edits, batch=7, reuse_prefix=False, record=[last])
        out = got.records[last].reshape(7, -1)
        scale = float(clean.abs().max()) + 1e-6
        for i in range(4):
            assert float((out[i] - clean[0]).abs().max()) <= 1e-4 * scale, (key, part, edits[i].op)
        for i in range(4, 7):
            assert float((out[i] - clean[0]).abs().max()) > 1e-7 * scale, (key, part, edits[i].op)
        edited += 1
    assert edited >= 2  # at least the block's input and output


# --- a DINOv2 whose layer scales sit under EVA's names -------------------------------------------------------


def _gamma_layer_class():
    from transformers.models.dinov2.modeling_dinov2 import Dinov2Layer

    class GammaLayer(Dinov2Layer):
        """A DINOv2 layer with EVA's names for its layer scales: ``gamma_1``, ``gamma_2`` (Parameters)."""

        def __init__(self, config, g1: torch.Tensor, g2: torch.Tensor):
            super().__init__(config)
            del self.layer_scale1, self.layer_scale2
            self.gamma_1 = torch.nn.Parameter(g1.clone())
            self.gamma_2 = torch.nn.Parameter(g2.clone())

        def forward(self, hidden_states, attention_mask=None, **kwargs):
            h, _ = self.attention(self.norm1(hidden_states), attention_mask=attention_mask, **kwargs)
            x = hidden_states + self.gamma_1 * h
            return x + self.gamma_2 * self.mlp(self.norm2(x))

    return GammaLayer


@pytest.fixture(scope="module")
def dinov2_pair(tmp_path_factory):
    """(a DINOv2 classifier with random layer scales, the same weights with the scales renamed gamma_1/gamma_2)."""
    from transformers import Dinov2Config, Dinov2ForImageClassification, ViTImageProcessor

    from vitviz.models.hooks import install
    from vitviz.models.load import load_model

    folder = tmp_path_factory.mktemp("contract") / "dinov2"
    torch.manual_seed(0)
    config = Dinov2Config(**{**TINY, "patch_size": 4}, **LABELS)
    model = Dinov2ForImageClassification(config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lambda1"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    plain = load_model(str(folder), device="cpu")

    renamed = Dinov2ForImageClassification.from_pretrained(folder, attn_implementation="eager").eval()
    gamma_cls = _gamma_layer_class()
    layers = renamed.dinov2.encoder.layer
    for i, layer in enumerate(layers):
        new = gamma_cls(renamed.config, layer.layer_scale1.lambda1.data, layer.layer_scale2.lambda1.data)
        missing, unexpected = new.load_state_dict(layer.state_dict(), strict=False)
        assert set(missing) == {"gamma_1", "gamma_2"} and all("layer_scale" in k for k in unexpected)
        layers[i] = new
    renamed.requires_grad_(False)
    gamma = dataclasses.replace(plain, model=renamed, name="dinov2-gamma")
    install(renamed, gamma.family)
    C.head_projections(gamma)  # the projections from the points install() put on it
    return plain, gamma


def _head_part_by_hand(loaded, img, c: int, layer: int, head: int, scale: torch.Tensor) -> float:
    """A head's attribution from test-local hooks: ``w_c . (gamma * (u - mean u) / sigma)``, u its scaled output."""
    model = loaded.model
    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    layers = model.dinov2.encoder.layer
    got: dict[str, torch.Tensor] = {}
    h1 = layers[layer].attention.o_proj.register_forward_pre_hook(lambda m, a: got.__setitem__("z", a[0].clone()))
    h2 = model.dinov2.layernorm.register_forward_pre_hook(lambda m, a: got.__setitem__("x", a[0].clone()))
    try:
        with torch.no_grad():
            model(pixel_values=pixels)
    finally:
        h1.remove()
        h2.remove()
    d = loaded.config.hidden_size // loaded.config.num_attention_heads
    cols = slice(head * d, (head + 1) * d)
    w_o = layers[layer].attention.o_proj.weight[:, cols].double()
    u = scale.double() * (got["z"][0, :, cols].double() @ w_o.T)  # (T, D)
    norm = model.dinov2.layernorm
    x = got["x"][0].double()
    sigma = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)
    n = norm.weight.double() * (u - u.mean(-1, keepdim=True)) / sigma
    w = model.classifier.weight[c].double()
    dim = loaded.config.hidden_size
    return float(w[:dim] @ n[0] + w[dim:] @ n[1:].mean(0))


def test_renamed_layer_scales_give_the_same_logits(dinov2_pair):
    plain, gamma = dinov2_pair
    img = random_image(2)
    pixels, _ = preprocess(plain, [img], input_size_for(plain, None, img.size))
    with torch.no_grad():
        torch.testing.assert_close(gamma.model(pixel_values=pixels).logits, plain.model(pixel_values=pixels).logits)


def test_attribution_with_unknown_layer_scale_names_is_exact_or_refused(dinov2_pair):
    """Fails on the code before the adapters declared their parts: there the renamed scales were not found, the
    heads' parts came out unscaled and the MLP part, computed as the remainder, made the sum check pass."""
    plain, gamma = dinov2_pair
    img = random_image(3)
    layer, head, c = 1, 2, 0
    scale = gamma.model.dinov2.encoder.layer[layer].gamma_1.data
    ref = _head_part_by_hand(gamma, img, c, layer, head, scale)
    assert _head_part_by_hand(plain, img, c, layer, head, scale) == pytest.approx(ref, abs=1e-9)
    exact = C.direct_logit_attribution(plain, img, target=c)
    assert exact.heads[layer, head] == pytest.approx(ref, abs=1e-6)  # the declared model: exact
    try:
        att = C.direct_logit_attribution(gamma, img, target=c)
    except C.NotDefined as exc:
        assert "layer_scale1.lambda1" in str(exc) and "GammaLayer" in str(exc)
        assert C.causal_notes(gamma)["attribution"]
    else:
        assert att.heads[layer, head] == pytest.approx(ref, abs=1e-6)
        np.testing.assert_allclose(att.heads, exact.heads, atol=1e-6)


def test_the_sum_check_fails_when_a_part_is_missing(dinov2_pair, monkeypatch):
    """With an adapter that wrongly claims the renamed blocks have no layer scale, the parts no longer add up:
    the MLP part is the MLP's own output, not the remainder, so the check refuses instead of passing."""
    from vitviz.models.families.base import BlockParts

    _, gamma = dinov2_pair
    fam = gamma.family

    def wrong(site):
        return BlockParts(projection=site.block.attention.o_proj, mlp=site.block.mlp)

    monkeypatch.setattr(fam, "block_parts", wrong)
    with pytest.raises(C.NotDefined, match="add up to"):
        C.direct_logit_attribution(gamma, random_image(4))


@pytest.mark.parametrize("key", _model_types())
def test_gradcam_read_from_the_run_is_gradcam_from_its_own_forward(every_family, key):
    """Grad-CAM reads the image's Run (one backward through its graph) on every family, and gives what a forward
    of its own gives; the method then runs no forward at all."""
    from vitviz.capture.run import get_run
    from vitviz.methods import explain
    from vitviz.methods import gradcam as G

    loaded = every_family(key)
    img = random_image(2, size=(70, 60))
    run = get_run(loaded, img)
    assert run.has_graph
    if not run.scores.numel():
        pytest.skip(f"{key}: a backbone without scores (Grad-CAM needs a target)")
    top = int(run.scores.argmax())

    def score(out):
        return run.score_of(out)[0, top]

    got = G.gradcam_of_run(run, score)
    pixels, _ = preprocess(loaded, [img], run.input_size)
    ref = G.gradcam_map(loaded, pixels, run.input_size, score)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    try:  # the method's own forward would fail here: it reads the run
        G.run_forward, saved = None, G.run_forward
        m = explain(loaded, img, "gradcam")
    finally:
        G.run_forward = saved
    assert m.values.shape == m.grid
