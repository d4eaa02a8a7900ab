import numpy as np
import pytest
from conftest import random_attention

from vitviz.analysis.maps import (
    fuse_heads,
    key_map,
    patch_attention_total,
    prefix_attention,
    prefix_attention_to,
    query_map,
    to_grid,
)


def test_query_and_key_maps_index_the_right_entries():
    attn = random_attention(0, (2, 3, 2 + 6, 2 + 6))  # P = 2, grid 2 x 3
    m = query_map(attn[1, 2], query=0, num_prefix_tokens=2, grid=(2, 3))
    assert m.shape == (2, 3)
    assert m[1, 0] == pytest.approx(attn[1, 2, 0, 2 + 3])  # row-major: (1, 0) is patch 3
    k = key_map(attn[1, 2], key=4, num_prefix_tokens=2, grid=(2, 3))
    assert k[0, 2] == pytest.approx(attn[1, 2, 2 + 2, 4])
    np.testing.assert_allclose(prefix_attention(attn, query=5, num_prefix_tokens=2), attn[..., 5, :2], rtol=1e-6)


def test_query_map_is_not_square_assuming():
    attn = random_attention(1, (1 + 8, 1 + 8))
    assert query_map(attn, query=0, num_prefix_tokens=1, grid=(2, 4)).shape == (2, 4)
    with pytest.raises(ValueError):
        to_grid(np.zeros(8), (3, 3))


def test_fusion():
    attn = random_attention(2, (4, 5, 5))
    np.testing.assert_allclose(fuse_heads(attn, how="mean"), attn.mean(0), rtol=1e-6)
    np.testing.assert_allclose(fuse_heads(attn, how="max"), attn.max(0), rtol=1e-6)
    np.testing.assert_allclose(fuse_heads(attn, how="min"), attn.min(0), rtol=1e-6)
    with pytest.raises(ValueError):
        fuse_heads(attn, how="median")


def test_prefix_shares_hand_computed():
    # T = 4, P = 2: row 3 = [0.1, 0.2, 0.3, 0.4]; column 2 read by the two prefix tokens = 0.5, 0.25.
    a = np.array(
        [
            [0.25, 0.25, 0.5, 0.0],
            [0.25, 0.25, 0.25, 0.25],
            [0.0, 0.0, 0.5, 0.5],
            [0.1, 0.2, 0.3, 0.4],
        ]
    )
    np.testing.assert_allclose(prefix_attention(a, query=3, num_prefix_tokens=2), [0.1, 0.2], rtol=1e-6)
    assert patch_attention_total(a, query=3, num_prefix_tokens=2) == pytest.approx(0.7)
    np.testing.assert_allclose(prefix_attention_to(a, key=2, num_prefix_tokens=2), [0.5, 0.25])
    r = random_attention(5, (3, 7, 7))  # rows sum to 1: prefix shares + patch total = 1
    np.testing.assert_allclose(
        prefix_attention(r, query=4, num_prefix_tokens=2).sum(-1)
        + patch_attention_total(r, query=4, num_prefix_tokens=2),
        1.0,
        rtol=1e-6,
    )
