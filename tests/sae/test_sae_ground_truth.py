"""The shapes' ground truth: patch labels from the masks, AUROC against all pairs, and the bundled demo SAE."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitviz.capture.run import get_run
from vitviz.data.shapes import CLASSES, make_sample
from vitviz.sae import ground_truth as gt
from vitviz.sae.model import SAEConfig, SparseAutoencoder


def _pairs(pos: np.ndarray, neg: np.ndarray) -> float:
    return float(np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg]))


def test_patch_labels():
    mask = np.zeros((8, 8), bool)
    mask[0:4, 0:4] = True  # patch (0, 0) fully on
    mask[4, 4] = True  # patch (1, 1): one pixel of 16
    mask[0:2, 4:8] = True  # patch (0, 1): exactly half
    labels = gt.patch_labels(mask, 4)
    assert labels.tolist() == [[gt.POSITIVE, gt.POSITIVE], [gt.NEGATIVE, gt.PARTIAL]]


def test_auroc_against_every_pair_with_ties():
    rng = np.random.default_rng(0)
    pos = rng.integers(-2, 4, (9, 6)).astype(float)
    neg = rng.integers(-2, 4, (13, 6)).astype(float)
    pos[rng.random(pos.shape) < 0.5] = 0
    neg[rng.random(neg.shape) < 0.5] = 0
    want = [_pairs(pos[:, j], neg[:, j]) for j in range(6)]
    np.testing.assert_allclose(gt.auroc(pos, neg), want)
    sparse = gt.sparse_auroc(gt._Sparse.of([pos[:4], pos[4:]], 6), gt._Sparse.of([neg], 6), 6)
    np.testing.assert_allclose(sparse, want)
    assert np.isnan(gt.auroc(pos[:0], neg)).all()


def test_shape_auroc_counts_and_values(demo_model):
    sae = SparseAutoencoder(SAEConfig(d_in=96, d_sae=32, k=4, point="blocks.2.out", tokens="patches"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    sae.eval().requires_grad_(False)
    seeds = list(range(100, 112))
    scores = gt.shape_auroc(sae, demo_model, seeds, batch=5)
    assert [s.label for s in scores] == list(CLASSES)
    # by hand: each image's patches labelled from its mask, features from its own Run
    pos, neg = {c: [] for c in range(5)}, []
    for s in seeds:
        sample = make_sample(s)
        f = sae.encode(get_run(demo_model, sample.image).activation("blocks.2.out")[0, 1:]).numpy()
        lab = gt.patch_labels(sample.mask, 8).ravel()
        pos[sample.label].append(f[lab == gt.POSITIVE])
        neg.append(f[lab == gt.NEGATIVE])
    negatives = np.concatenate(neg)
    for c, score in enumerate(scores):
        if not pos[c]:
            assert score.positives == 0 and np.isnan(score.auroc)
            continue
        p = np.concatenate(pos[c])
        assert (score.positives, score.negatives) == (len(p), len(negatives))
        full = gt.auroc(p, negatives)
        assert score.auroc == pytest.approx(np.nanmax(full), abs=1e-6)
        assert full[score.feature] == pytest.approx(score.auroc, abs=1e-6)


def test_the_bundled_demo_sae(demo_model):
    from vitviz.sae.demo import DEMO_SAE_DIR, DEMO_SETTINGS, GROUND_TRUTH_FILE, read_ground_truth
    from vitviz.sae.load import load_sae

    sae = load_sae(DEMO_SAE_DIR, loaded=demo_model)
    assert sae.cfg.point == DEMO_SETTINGS["point"] and sae.cfg.k == DEMO_SETTINGS["k"]
    assert sae.cfg.tokens == "patches" and sae.cfg.source == "vitviz"
    record = sae.cfg.training
    assert (record["steps"], record["seed"], record["batch_tokens"]) == (
        DEMO_SETTINGS["steps"],
        DEMO_SETTINGS["seed"],
        DEMO_SETTINGS["batch_tokens"],
    )
    size = sum(p.stat().st_size for p in DEMO_SAE_DIR.iterdir())
    assert size < 4 * 2**20  # a few MB at most
    metrics = json.loads((DEMO_SAE_DIR / "metrics.json").read_text())
    assert metrics["images"] == 100 and metrics["scope"] == "patches"
    table = json.loads((DEMO_SAE_DIR / GROUND_TRUTH_FILE).read_text())
    assert table["images"] == 500 and [s.label for s in read_ground_truth()] == list(CLASSES)


@pytest.mark.slow
def test_the_bundled_ground_truth_table_is_what_the_sae_gives(demo_model):
    from vitviz.sae.demo import DEMO_SAE_DIR, ground_truth_seeds, read_ground_truth
    from vitviz.sae.load import load_sae

    scores = gt.shape_auroc(load_sae(DEMO_SAE_DIR), demo_model, ground_truth_seeds())
    for got, want in zip(scores, read_ground_truth(), strict=True):
        assert (got.label, got.feature, got.positives, got.negatives) == (
            want.label,
            want.feature,
            want.positives,
            want.negatives,
        )
        assert got.auroc == pytest.approx(want.auroc, abs=1e-9)
