import numpy as np
import pytest

from vitviz.analysis.embeddings import patch_components, position_similarity, token_norm_outliers


def test_position_similarity_is_cosine():
    pos = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [-1.0, 0.0]])
    s = position_similarity(pos)
    np.testing.assert_allclose(np.diag(s), 1.0)
    assert s[0, 1] == pytest.approx(0.0)
    assert s[0, 2] == pytest.approx(1 / np.sqrt(2))
    assert s[0, 3] == pytest.approx(-1.0)
    # a dot product would give 6 here; cosine is scale-free
    assert s[1, 2] == pytest.approx(1 / np.sqrt(2))


def test_patch_components_recover_a_planted_direction():
    rng = np.random.default_rng(0)
    c, p, d = 3, 4, 64
    direction = rng.normal(size=c * p * p)
    direction /= np.linalg.norm(direction)
    coeff = rng.normal(scale=10.0, size=(d, 1))
    weight = (coeff * direction + rng.normal(scale=0.01, size=(d, c * p * p)) + 5.0).reshape(d, c, p, p)
    pcs = patch_components(weight, k=5)
    assert pcs.components.shape == (5, c, p, p)
    first = pcs.components[0].ravel()
    assert abs(first @ direction) == pytest.approx(1.0, abs=1e-3)  # the offset 5.0 is centred away
    assert pcs.explained_variance_ratio[0] > 0.99
    # agrees with the eigenvectors of the covariance matrix
    flat = weight.reshape(d, -1)
    cov = np.cov(flat, rowvar=False)
    vals, vecs = np.linalg.eigh(cov)
    assert abs(vecs[:, -1] @ first) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(pcs.explained_variance_ratio, vals[::-1][:5] / vals.sum(), rtol=1e-6, atol=1e-12)


def test_token_norm_outliers():
    norms = np.array([[1.0, 1.1, 0.9, 10.0], [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(token_norm_outliers(norms), [[False, False, False, True], [False] * 4])


def test_a_zero_position_embedding_has_no_similarity_not_even_to_itself():
    """docs/definitions.md#position-embedding-similarity: a zero row has no direction, so its row and column
    of S are 0, its own cell included; the other rows keep their cosines (1 on the diagonal)."""
    pos = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    s = position_similarity(pos)
    np.testing.assert_array_equal(s[1], 0.0)
    np.testing.assert_array_equal(s[:, 1], 0.0)
    np.testing.assert_allclose(np.diag(s)[[0, 2]], 1.0)
    assert s[0, 2] == pytest.approx(1 / np.sqrt(2))
    np.testing.assert_array_equal(position_similarity(np.zeros((3, 4))), np.zeros((3, 3)))
