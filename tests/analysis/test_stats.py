import math

import numpy as np
import pytest
from conftest import random_attention

from vitviz.analysis.stats import attention_entropy, mean_attention_distance, patch_distances


def test_uniform_attention_distance_closed_form_2x2():
    # Uniform attention on a 2 x 2 grid, p = 16: each query sees distances 0, 16, 16, 16*sqrt(2).
    t = 1 + 4
    attn = np.full((1, 1, t, t), 1.0 / t)
    got = mean_attention_distance(attn, num_prefix_tokens=1, grid=(2, 2), patch_size=16)
    assert got[0, 0] == pytest.approx(16 * (0 + 1 + 1 + math.sqrt(2)) / 4)


def test_uniform_attention_distance_brute_force_rectangular_grid():
    gh, gw, p = 3, 4, 14
    n = gh * gw
    attn = np.full((2, 3, 2 + n, 2 + n), 1.0 / (2 + n))
    expected = np.mean(
        [
            [math.hypot(divmod(q, gw)[0] - divmod(k, gw)[0], divmod(q, gw)[1] - divmod(k, gw)[1]) * p for k in range(n)]
            for q in range(n)
        ]
    )
    np.testing.assert_allclose(
        mean_attention_distance(attn, num_prefix_tokens=2, grid=(gh, gw), patch_size=p), expected, rtol=1e-6
    )


def test_self_attention_has_zero_distance_and_prefix_mass_is_ignored():
    n = 6
    attn = np.zeros((1, 2, 1 + n, 1 + n))
    attn[..., 0] = 0.5  # half of every row goes to CLS
    attn[0, :, 1:, 1:] += 0.5 * np.eye(n)
    attn[0, :, 0, 1:] = 0.5 / n
    got = mean_attention_distance(attn, num_prefix_tokens=1, grid=(2, 3), patch_size=8)
    np.testing.assert_allclose(got, 0.0, atol=1e-12)


def test_patch_distances_row_major():
    d = patch_distances((2, 3), 10)
    assert d[0, 5] == pytest.approx(10 * math.hypot(1, 2))
    assert d[1, 4] == pytest.approx(10)


def test_entropy_uniform_onehot_and_random():
    t = 9
    uniform = np.full((1, 1, t, t), 1.0 / t)
    assert attention_entropy(uniform)[0, 0] == pytest.approx(math.log(t))
    onehot = np.broadcast_to(np.eye(t), (2, 2, t, t))
    np.testing.assert_allclose(attention_entropy(onehot), 0.0, atol=1e-12)
    a = random_attention(3, (2, 3, 5, 5))
    ref = np.array(
        [
            [np.mean([-sum(x * math.log(x) for x in row if x > 0) for row in a[layer, h]]) for h in range(3)]
            for layer in range(2)
        ]
    )
    np.testing.assert_allclose(attention_entropy(a), ref, rtol=1e-6)
