import numpy as np
import pytest

from vitviz.analysis.masks import dino_masks


def _attn_with_last_cls_row(rows: np.ndarray, prefix: int = 1) -> np.ndarray:
    h, n = rows.shape
    t = prefix + n
    attn = np.zeros((2, h, t, t))
    attn[-1, :, 0, prefix:] = rows
    return attn


def test_hand_computed_mask():
    # Normalised weights (grid order) 0.2, 0.1, 0.4, 0.3. Ascending: 0.1, 0.2, 0.3, 0.4 with
    # cumulative sums 0.1, 0.3, 0.6, 1.0; those above 1 - 0.6 = 0.4 keep 0.3 and 0.4 (mass 0.7).
    rows = np.array([[0.2, 0.1, 0.4, 0.3]]) * 0.5  # unnormalised on purpose
    mask = dino_masks(_attn_with_last_cls_row(rows), num_prefix_tokens=1, grid=(2, 2), tau=0.6)
    np.testing.assert_array_equal(mask[0], [[False, False], [True, True]])


def test_kept_mass_at_least_tau_and_minimal():
    rng = np.random.default_rng(0)
    rows = rng.random((3, 12))
    mask = dino_masks(_attn_with_last_cls_row(rows, prefix=2), num_prefix_tokens=2, grid=(3, 4), tau=0.6)
    for h in range(3):
        w = rows[h] / rows[h].sum()
        kept = mask[h].ravel()
        assert w[kept].sum() >= 0.6 - 1e-12
        assert w[kept].min() >= w[~kept].max()  # keeps the largest patches
        assert w[kept].sum() - w[kept].min() < 0.6 + 1e-12  # dropping the smallest kept one falls short


def test_rejects_bad_tau():
    with pytest.raises(ValueError):
        dino_masks(np.zeros((1, 1, 5, 5)), num_prefix_tokens=1, grid=(2, 2), tau=0.0)
