"""Features on a Run, edits with the error term, and attribution, on the bundled demo ViT with a random SAE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitviz.capture.run import get_run
from vitviz.capture.targets import Target
from vitviz.data.shapes import make_sample
from vitviz.models.points import Edit
from vitviz.sae import run as sr
from vitviz.sae.model import SAEConfig, SAEError, SparseAutoencoder

POINT = "blocks.2.out"


def _sae(tokens="all", *, d_in=96, d_sae=64, k=6, seed=0, point=POINT) -> SparseAutoencoder:
    sae = SparseAutoencoder(SAEConfig(d_in=d_in, d_sae=d_sae, k=k, point=point, tokens=tokens))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        sae.b_enc.add_(0.5)
    return sae.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def demo_run(demo_model):
    return get_run(demo_model, make_sample(11).image)


def test_features_are_the_encoder_on_the_runs_value(demo_run):
    sae = _sae()
    feats = sr.features(demo_run, sae)
    x = demo_run.activation(POINT)[0]
    torch.testing.assert_close(feats.values, sae.encode(x))
    assert feats.n_prefix == 1 and feats.grid == (12, 12) and feats.num_tokens == 145
    # the map: token 1 + r * 12 + c is the patch at row r, column c
    m = feats.map(5)
    assert m.shape == (12, 12) and m.dtype == np.float32
    assert m[3, 7] == pytest.approx(float(feats.values[1 + 3 * 12 + 7, 5]))
    ids, vals = feats.top()
    assert ids.shape == vals.shape == (145, 6) and ids.dtype == np.int32
    assert bool((np.diff(vals, axis=1) <= 0).all())  # largest first
    for t in (0, 40):
        want = torch.topk(feats.values[t], 6).values.numpy()
        np.testing.assert_allclose(vals[t], want)
    assert feats.maps([1, 2]).shape == (2, 12, 12)


def test_a_width_or_point_that_does_not_fit(demo_run):
    with pytest.raises(SAEError, match="96 there"):
        sr.features(demo_run, _sae(d_in=64))
    with pytest.raises(SAEError, match=r"blocks.7.out, which 'demo' does not have"):
        sr.features(demo_run, _sae(point="blocks.7.out"))


@pytest.mark.parametrize("reuse_prefix", [True, False])
def test_no_edit_reproduces_the_clean_run_exactly(demo_run, reuse_prefix):
    sae = _sae()
    edit = sr.feature_edit(sae, [])
    got = demo_run.edited([edit], reuse_prefix=reuse_prefix, record=[POINT, "blocks.3.out"])
    assert torch.equal(got.scores[0], demo_run.scores)
    assert torch.equal(got.records[POINT], demo_run.activation(POINT))
    assert torch.equal(got.records["blocks.3.out"], demo_run.activation("blocks.3.out"))
    # ... whereas splicing the reconstruction in (the error term dropped) does change the run
    spliced = demo_run.edited([sr.reconstruction_edit(sae)])
    assert not torch.equal(spliced.scores[0], demo_run.scores)


def test_an_edit_changes_only_the_edited_features_contribution(demo_run):
    sae = _sae(tokens="patches")
    x = demo_run.activation(POINT)[0]
    f = sae.encode(x)
    feature = int(torch.argmax(f[1:].sum(0)))  # a feature active on patches
    got = sr.edited(demo_run, sae, [sr.FeatureEdit(feature, "scale", 3.0)], record=["blocks.3.out"])
    # by hand: x + (f' - f) W_dec, patches only (a patches-only SAE leaves the CLS token alone)
    df = torch.zeros_like(f)
    df[1:, feature] = 2.0 * f[1:, feature]
    want_x = x + df @ sae.W_dec
    torch.testing.assert_close(got.records[POINT][0], want_x)
    manual = demo_run.edited([Edit(POINT, "replace", want_x[None])])
    torch.testing.assert_close(got.scores, manual.scores, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got.scores[0], demo_run.scores)
    # clamp and zero on chosen tokens
    clamp = sr.edited(demo_run, sae, [sr.FeatureEdit(feature, "clamp", 4.0, tokens=(10, 11))])
    x2 = clamp.records[POINT][0]
    delta = (x2 - x) @ sae.W_dec[feature] / sae.W_dec[feature].norm() ** 2
    torch.testing.assert_close(delta[[10, 11]], 4.0 - f[[10, 11], feature], rtol=1e-4, atol=1e-4)
    assert torch.equal(x2[:10], x[:10]) and torch.equal(x2[12:], x[12:])
    zero = sr.edited(demo_run, sae, [sr.FeatureEdit(feature, "zero")])
    torch.testing.assert_close(zero.records[POINT][0][1:], x[1:] - f[1:, feature, None] * sae.W_dec[feature])
    with pytest.raises(SAEError, match="feature 999"):
        sr.edited(demo_run, sae, [sr.FeatureEdit(999, "zero")])


def test_attribution_first_order_and_exact(demo_run):
    sae = _sae(d_sae=48, k=8)
    target = Target.of_class(int(torch.argmax(demo_run.scores)))
    att = sr.attribution(demo_run, sae, target, exact_top=5)
    assert att.estimate.shape == (48,) and att.per_token.shape == (145, 48)
    np.testing.assert_allclose(att.per_token.sum(0), att.estimate, rtol=1e-5, atol=1e-6)
    assert list(att.exact_ids) == list(np.argsort(-np.abs(att.estimate), kind="stable")[:5])
    clean = float(target.select(demo_run.scores))
    for j, i in enumerate(att.exact_ids[:2]):
        # exact: one copy per feature in a batched forward == that feature zeroed alone
        alone = sr.edited(demo_run, sae, [sr.FeatureEdit(int(i), "zero")])
        assert att.exact[j] == pytest.approx(clean - float(target.select(alone.scores[0])), abs=1e-4)
        # first order: scaling the feature by 1 -+ eps changes the target by -+ eps times the estimate (a central
        # difference; the demo is far from linear over a whole feature, so eps is small)
        eps = 1e-3
        down, up = (sr.edited(demo_run, sae, [sr.FeatureEdit(int(i), "scale", 1 + s * eps)]) for s in (-1, 1))
        fd = float(target.select(up.scores[0]) - target.select(down.scores[0])) / (2 * eps)
        assert fd == pytest.approx(att.estimate[i], rel=0.02, abs=1e-3)
    assert -1.0 <= att.rank_correlation <= 1.0


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    from conftest import random_image, save_tiny

    from vitviz.models.load import load_model

    root = tmp_path_factory.mktemp("sae-tiny")
    out = {}
    for key in ("deit", "swin", "mobilevit"):
        loaded = load_model(str(save_tiny(key, root / key)), device="cpu")
        out[key] = get_run(loaded, random_image(0, (64, 64)))
    return out


def test_maps_follow_each_familys_token_layout(tiny_runs):
    deit = tiny_runs["deit"]  # CLS, DIST, then a 4 x 4 grid
    feats = sr.features(deit, _sae(d_in=32, point="blocks.1.out"))
    assert (feats.n_prefix, feats.grid) == (2, (4, 4))
    assert feats.map(0)[1, 2] == pytest.approx(float(feats.values[2 + 1 * 4 + 2, 0]))
    assert sr.scope_tokens(_sae(tokens="patches", d_in=32, point="blocks.1.out"), deit) == tuple(range(2, 18))
    swin = tiny_runs["swin"]  # a later stage: its own, coarser grid
    feats = sr.features(swin, _sae(d_in=32, point="stages.1.blocks.1.out"))
    assert (feats.n_prefix, feats.grid) == (0, (8, 8))
    with pytest.raises(SAEError, match="not one row per token"):
        sr.features(tiny_runs["mobilevit"], _sae(d_in=32, point="stages.2.blocks.0.out"))
