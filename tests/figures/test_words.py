import numpy as np
import pytest

from vitviz.figures.words import token_alphas, token_relevance_html


def test_alphas_are_relevance_over_the_largest():
    np.testing.assert_allclose(token_alphas([0.0, 2.0, 1.0, np.nan, -1.0]), [0.0, 1.0, 0.5, 0.0, 0.0])
    np.testing.assert_array_equal(token_alphas([0.0, 0.0]), [0.0, 0.0])


def test_tokens_are_escaped_text_with_their_colour():
    out = token_relevance_html(["<bos>", "cat", "<script>alert(1)</script>"], [0.5, 1.0, 0.0])
    assert "&lt;bos&gt;" in out and "<script>" not in out and "&lt;script&gt;" in out
    assert "rgba(230, 97, 0, 1.000)" in out and "rgba(230, 97, 0, 0.500)" in out and 'title="0.5"' in out
    assert out.count("<span") == 3
    with pytest.raises(ValueError):
        token_relevance_html(["a"], [1.0, 2.0])
