import numpy as np
import pytest
from conftest import random_attention

from vitviz.analysis.rollout import discard_smallest, rollout, rollout_matrix


def _hand_b(f: np.ndarray) -> np.ndarray:
    b = 0.5 * f + 0.5 * np.eye(len(f))
    return b / b.sum(axis=1)[:, None]


def test_identity_attention_rolls_out_to_identity():
    attn = np.broadcast_to(np.eye(7), (3, 2, 7, 7)).copy()
    np.testing.assert_allclose(rollout_matrix(attn, num_prefix_tokens=1), np.eye(7), atol=1e-7)


def test_two_layers_hand_computed():
    # T = 2, one head per layer: every entry worked out on paper.
    a0 = np.array([[[0.5, 0.5], [0.25, 0.75]]])
    a1 = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    attn = np.stack([a0, a1])
    # B0 = 0.5*A0 + 0.5*I = [[0.75, 0.25], [0.125, 0.875]] (rows already sum to 1); B1 = I.
    expected = np.array([[0.75, 0.25], [0.125, 0.875]])
    np.testing.assert_allclose(rollout_matrix(attn, num_prefix_tokens=1), expected, atol=1e-7)


def test_three_layers_product_order_latest_on_left():
    attn = random_attention(1, (3, 4, 5, 5))
    b = [_hand_b(attn[layer].mean(axis=0)) for layer in range(3)]
    expected = b[2] @ b[1] @ b[0]
    got = rollout_matrix(attn, num_prefix_tokens=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # order matters: the reversed product differs on random matrices
    assert not np.allclose(got, b[0] @ b[1] @ b[2], atol=1e-4)


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_rows_sum_to_one_and_row_equals_matrix(fusion):
    attn = random_attention(2, (4, 3, 9, 9))
    r = rollout_matrix(attn, num_prefix_tokens=2, fusion=fusion, discard_ratio=0.3)
    np.testing.assert_allclose(r.sum(axis=1), 1.0, atol=1e-5)
    for q in (0, 1, 5):
        row = rollout(attn, num_prefix_tokens=2, query=q, fusion=fusion, discard_ratio=0.3)
        np.testing.assert_allclose(row, r[q], atol=1e-6)


def test_layer_range_uses_only_those_layers():
    attn = random_attention(3, (4, 2, 6, 6))
    b = [_hand_b(attn[layer].mean(axis=0)) for layer in range(4)]
    np.testing.assert_allclose(rollout_matrix(attn, num_prefix_tokens=1, start=1, stop=3), b[2] @ b[1], atol=1e-6)
    with pytest.raises(ValueError):
        rollout_matrix(attn, num_prefix_tokens=1, start=3, stop=3)


def test_discard_rule_is_exact_and_spares_prefix_columns():
    f = np.array(
        [
            [0.01, 0.40, 0.30, 0.29],
            [0.02, 0.10, 0.20, 0.68],
            [0.03, 0.50, 0.05, 0.42],
        ]
    )  # T would be 4 with one more row; a 3 x 4 slice is enough for the rule
    out = discard_smallest(f, num_prefix_tokens=1, ratio=0.34)  # floor(0.34 * 9) = 3 of the 9 patch entries
    expected = f.copy()
    expected[2, 2] = expected[1, 1] = expected[1, 2] = 0.0  # 0.05, 0.10, 0.20 are the three smallest
    np.testing.assert_allclose(out, expected.astype(np.float32))
    assert out[:, 0].tolist() == pytest.approx(f[:, 0].tolist())  # prefix column untouched though smallest
    assert f[1, 1] == 0.10  # input not mutated


def test_discard_then_renormalise_matches_hand_computation():
    attn = random_attention(4, (2, 3, 5, 5))
    expected = np.eye(5)
    for layer in range(2):
        f = attn[layer].mean(axis=0)
        flat = f[:, 1:].ravel().copy()
        flat[np.argsort(flat, kind="stable")[: int(0.5 * flat.size)]] = 0
        f2 = f.copy()
        f2[:, 1:] = flat.reshape(5, 4)
        expected = _hand_b(f2) @ expected
    np.testing.assert_allclose(rollout_matrix(attn, num_prefix_tokens=1, discard_ratio=0.5), expected, atol=1e-6)


def test_rejects_bad_ratio_and_does_not_mutate_input():
    attn = random_attention(5, (2, 2, 4, 4)).astype(np.float32)
    before = attn.copy()
    rollout(attn, num_prefix_tokens=1, discard_ratio=0.9)
    np.testing.assert_array_equal(attn, before)
    with pytest.raises(ValueError):
        rollout(attn, num_prefix_tokens=1, discard_ratio=1.0)
