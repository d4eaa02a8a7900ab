"""Compare-page colour scales: what each does to flat, nearly flat and differently sized maps (hand-computed)."""

import numpy as np
import pytest

from vitviz.analysis.scales import SCALES, scale_maps


def _panel():
    rng = np.random.default_rng(0)
    flat = np.full((3, 3), 0.5)
    nearly_flat = 0.5 + 1e-4 * rng.random((3, 3))
    peaked = np.zeros((3, 3))
    peaked[1, 1] = 2.0
    return np.stack([flat, nearly_flat, peaked])


def test_fixed_zero_to_max_keeps_flat_maps_flat():
    s = scale_maps(_panel(), "fixed [0, max]")
    assert (s.zmin, s.zmax) == (0.0, 1.0)
    np.testing.assert_allclose(s.values[0], 1.0)
    assert np.ptp(s.values[1]) < 1e-3  # nearly flat stays nearly flat
    np.testing.assert_allclose(s.values[2], _panel()[2] / 2.0)


def test_per_map_stretches_the_smallest_differences():
    s = scale_maps(_panel(), "per map")
    np.testing.assert_allclose(s.values[0], 0.0)  # constant: no range to stretch
    assert s.values[1].min() == pytest.approx(0) and s.values[1].max() == pytest.approx(1)  # invented contrast


def test_shared_uses_one_range_and_every_map_keeps_its_own_range_listed():
    panel = _panel()
    s = scale_maps(panel, "shared")
    assert (s.zmin, s.zmax) == (0.0, 2.0)
    np.testing.assert_allclose(s.values, panel.astype(np.float32))
    np.testing.assert_allclose(s.ranges, [[0.5, 0.5], [panel[1].min(), panel[1].max()], [0.0, 2.0]])


def test_input_unchanged_and_bad_input_refused():
    panel = _panel()
    before = panel.copy()
    for how in SCALES:
        scale_maps(panel, how)
    np.testing.assert_array_equal(panel, before)
    with pytest.raises(ValueError, match="unknown scale"):
        scale_maps(panel, "log")
    with pytest.raises(ValueError, match="K, gh, gw"):
        scale_maps(panel[0])
