"""The feature card's numbers: direct effects against hand-computed references, the read-outs they go through,
finding features by a label on a tiny random CLIP, and the top examples as crops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitviz.sae import card
from vitviz.sae.model import SAEConfig, SAEError, SparseAutoencoder


def _sae(d_in: int, d_sae: int = 6, point: str = "blocks.1.out", seed: int = 0) -> SparseAutoencoder:
    sae = SparseAutoencoder(SAEConfig(d_in=d_in, d_sae=d_sae, activation="relu", k=None, point=point, tokens="all"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return sae.eval().requires_grad_(False)


def test_direct_effects_by_hand():
    # d = (1, 2, 3): centred (-1, 0, 1); times gamma (2, 1, 0.5): (-2, 0, 0.5)
    w = np.array([[1.0, 0, 0], [0, 0, 2], [1, 1, 1]])
    got = card.direct_effects(np.array([[1.0, 2, 3]]), np.array([2.0, 1, 0.5]), w)
    np.testing.assert_allclose(got, [[-2.0, 1.0, -1.5]])
    # without centring: (2, 2, 1.5)
    np.testing.assert_allclose(card.direct_effects([1.0, 2, 3], [2.0, 1, 0.5], w, centre=False), [[2.0, 3.0, 5.5]])
    # labels: u = (3, 4) against t = (0, 2) and (1, 0): u . t / |t| = 4, 3
    np.testing.assert_allclose(card.label_effects([[3.0, 4]], [[0.0, 2], [1, 0]]), [[4.0, 3.0]])
    np.testing.assert_allclose(card.cosines([[3.0, 4], [0, 0], [-4, 3]], [6.0, 8]), [1.0, 0.0, 0.0])
    pos, neg = card.top_effects(np.array([0.5, -1, 2, 0, -0.2]), list("abcde"), n=3)
    assert pos == [("c", 2.0), ("a", 0.5)] and neg == [("b", -1.0), ("e", -0.2)]


def test_the_classifier_read_out_is_the_final_norm_and_the_head(demo_model):
    r = card.readout_for(demo_model, "blocks.2.out")
    vit = demo_model.model
    assert r.kind == "classes" and r.weight.shape == (len(demo_model.id2label), 96)
    np.testing.assert_allclose(r.weight, vit.classifier.weight.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(r.gamma, vit.vit.layernorm.weight.detach().numpy())
    assert r.names[0] == demo_model.id2label[0]
    sae = _sae(96, point="blocks.2.out")
    eff = card.feature_effects(sae, r, [2])
    d = sae.W_dec[2].double().numpy()
    want = vit.classifier.weight.double().detach().numpy() @ (r.gamma * (d - d.mean()))
    np.testing.assert_allclose(eff[0], want, rtol=1e-6)


def test_points_and_models_without_a_direct_path_are_refused(demo_model):
    with pytest.raises(SAEError, match="residual stream"):
        card.readout_for(demo_model, "blocks.2.attn.z")
    with pytest.raises(SAEError, match="residual stream"):
        card.readout_for(demo_model, "blocks.2.mlp.out")
    r = card.readout_for(demo_model, "blocks.2.out")
    with pytest.raises(SAEError, match="a CLIP- or SigLIP-style model"):
        card.features_for_label(_sae(96), r, np.ones(96))


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    from conftest import save_modern

    from vitviz.models.load import load_model

    return load_model(str(save_modern("clip", tmp_path_factory.mktemp("card") / "clip")), device="cpu")


def test_finding_features_by_a_label_on_a_tiny_clip(tiny_clip):
    from vitviz.models.zeroshot import encode_labels, parse_labels

    r = card.readout_for(tiny_clip, "blocks.1.out")
    m = tiny_clip.model
    assert r.kind == "embedding" and r.weight.shape == (24, 32)
    np.testing.assert_allclose(r.weight, m.visual_projection.weight.detach().numpy())
    sae = _sae(32, d_sae=12)
    t = encode_labels(m, tiny_clip.text, parse_labels("cat, dog"))[0]
    got = card.features_for_label(sae, r, t, top=5)
    # brute force: u_i = P (gamma * (d_i - mean d_i)), ranked by cos(u_i, t)
    gamma = m.vision_model.post_layernorm.weight.detach().double().numpy()
    proj = m.visual_projection.weight.detach().double().numpy()
    cos = []
    for d in sae.W_dec.double().numpy():
        u = proj @ (gamma * (d - d.mean()))
        cos.append(u @ t / (np.linalg.norm(u) * np.linalg.norm(t)))
    want = np.argsort(-np.array(cos))[:5]
    assert [i for i, _ in got] == want.tolist()
    np.testing.assert_allclose([c for _, c in got], np.array(cos)[want], rtol=1e-5)
    # against the labels: u . t_k / |t_k|
    eff = card.label_effects(card.feature_effects(sae, r, [0]), t[None])
    u0 = proj @ (gamma * (sae.W_dec[0].double().numpy() - sae.W_dec[0].double().numpy().mean()))
    np.testing.assert_allclose(eff[0, 0], u0 @ t / np.linalg.norm(t), rtol=1e-6)


def test_a_tiny_siglip_reads_out_through_its_pooling_head(tmp_path):
    from conftest import save_modern

    from vitviz.models.load import load_model

    loaded = load_model(str(save_modern("siglip", tmp_path / "siglip")), device="cpu")
    r = card.readout_for(loaded, "blocks.0.out")
    mha = loaded.model.vision_model.head.attention
    want = (mha.out_proj.weight @ mha.in_proj_weight[64:]).detach().numpy()
    assert r.kind == "embedding" and "pooling head" in r.description
    np.testing.assert_allclose(r.weight, want, rtol=1e-5, atol=1e-6)


def test_the_top_examples_as_crops(demo_model, tmp_path):
    from vitviz.data.shapes import make_sample
    from vitviz.sae.index import build_index, load_index

    for i in range(3):
        make_sample(200 + i).image.save(tmp_path / f"s{i}.png")
    sae = _sae(96, d_sae=5, point="blocks.2.out")
    sae = SparseAutoencoder(sae.cfg.with_(tokens="patches"))
    with torch.no_grad():
        for i in range(5):
            sae.W_enc[i, i] = 1.0
    sae.eval().requires_grad_(False)
    build_index(sae, demo_model, tmp_path, tmp_path / "ix.parquet", top_k=4)
    index = load_index(tmp_path / "ix.parquet", sae, demo_model)
    crops, notes = card.example_crops(sae, demo_model, index, 1)
    entry = index.feature(1)
    assert not notes and len(crops) == len(entry.examples) == 4
    for c, e in zip(crops, entry.examples, strict=True):
        assert c.image.dtype == np.uint8 and c.image.ndim == 3 and c.image.shape[2] == 3
        assert c.activation == e.activation and e.image_id in c.title
    (tmp_path / "s0.png").unlink()
    crops, notes = card.example_crops(sae, demo_model, index, 1)
    gone = sum(e.image_id == "s0.png" for e in entry.examples)
    assert len(crops) == 4 - gone and (notes if gone else True)
