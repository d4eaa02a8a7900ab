"""The fast head-importance estimate's measured agreement with the exact knock-outs: recomputed, and by scipy."""

import numpy as np
import pytest
import scipy.stats

from vitviz.data.shapes import make_sample
from vitviz.evaluate.head_estimate import MEASURED, agreement, sign_agreement, spearman, trust_note

pytestmark = pytest.mark.usefixtures("one_thread")


def test_spearman_is_scipys_with_ties_and_missing_heads():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = np.round(rng.normal(size=(4, 4)), 1)  # ties
        b = a + rng.normal(scale=0.5, size=(4, 4))
        a[3, 2:] = np.nan  # heads a block does not have
        keep = np.isfinite(a)
        assert spearman(a, b) == pytest.approx(scipy.stats.spearmanr(a[keep], b[keep]).statistic, abs=1e-12)
    assert np.isnan(spearman(np.ones(5), np.arange(5.0)))


def test_sign_agreement_by_hand():
    exact = np.array([0.5, -0.2, 0.005, -1.0, np.nan])
    estimate = np.array([0.1, 0.3, -0.1, -0.2, 1.0])
    assert sign_agreement(exact, estimate) == pytest.approx(2 / 3)  # 0.005 is too small to have a sign
    assert np.isnan(sign_agreement(np.zeros(3), np.ones(3)))


@pytest.mark.parametrize("mode", ["mean", "zero"])
def test_the_stored_numbers_are_what_the_computation_gives(demo_model, mode):
    """MEASURED is data: its first images are recomputed here, the rest by ``python -m vitviz.evaluate.head_estimate``."""
    assert MEASURED["model"] == "demo" and MEASURED["images"] == 100 and MEASURED["data_seed"] == 987654
    for i, stored in enumerate(MEASURED[mode]["rho_first"]):
        got = agreement(demo_model, make_sample(987654 * 1_000_003 + i).image, mode=mode)
        keep = np.isfinite(got.exact)
        assert got.rho == pytest.approx(stored, abs=2e-4)
        assert got.rho == pytest.approx(scipy.stats.spearmanr(got.exact[keep], got.estimate[keep]).statistic)
    lo, hi = MEASURED[mode]["rho_quartiles"]
    assert lo <= MEASURED[mode]["rho_median"] <= hi
    assert f"median {MEASURED[mode]['rho_median']:.2f}" in trust_note(mode) and "Measured on 100" in trust_note(mode)
