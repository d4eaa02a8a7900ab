"""One rule for flat maps (vitviz.figures.flat): which maps are flat, the fixed scale they are drawn on, the note."""

from __future__ import annotations

import numpy as np
import pytest

from vitviz import figures
from vitviz.figures.flat import FLAT_RELATIVE, flat_limits, flat_note, is_flat


def test_which_maps_are_flat():
    # demo-swin's relevance for its star (seen in the app): 576 patches within 0.0017362 .. 0.0017387
    swin = np.linspace(0.0017361692, 0.0017386684, 576).reshape(24, 24)
    assert (swin.max() - swin.min()) / swin.mean() == pytest.approx(1.44e-3, rel=0.01)
    assert is_flat(swin)
    assert is_flat(np.zeros((3, 3))) and is_flat(np.full((2, 2), -4.0))
    assert is_flat(np.array([[1.0, 1.0 + 0.9 * FLAT_RELATIVE]]))
    assert not is_flat(np.array([[1.0, 1.0 + 1.1 * FLAT_RELATIVE]]))
    assert not is_flat(np.array([[-1.0, 1.0]]))  # mean 0, a real range: not flat
    assert not is_flat(np.full((2, 2), np.nan))  # nothing to draw, nothing to call flat
    assert is_flat(np.array([[2.0, np.nan]]))  # NaN cells (heads a block lacks) are left out


def test_a_flat_map_is_drawn_on_a_fixed_scale_and_said_so():
    swin = np.linspace(0.0017361692, 0.0017386684, 576).reshape(24, 24)
    assert flat_limits(swin) == (0.0, pytest.approx(0.0017386684))
    assert flat_limits(np.zeros((2, 2))) == (0.0, 1.0)
    assert flat_limits(np.full((2, 2), -3.0)) == (-3.0, 0.0)
    assert flat_limits(np.array([[0.0, 1.0]])) is None
    note = flat_note(swin, "Relevance")
    assert note.startswith("Relevance is flat") and "0.00173617 .. 0.00173867" in note
    assert "zero everywhere" in flat_note(np.zeros((2, 2)), "Grad-CAM's map")
    assert flat_note(np.array([[0.0, 1.0]])) == ""


def test_figures_draw_flat_maps_on_the_fixed_scale_unless_told_otherwise():
    swin = np.linspace(0.0017361692, 0.0017386684, 16).reshape(4, 4)
    hm = next(t for t in figures.map_figure(None, swin, title="t", colorbar_title="c").data if t.type == "heatmap")
    assert (hm.zmin, hm.zmax) == (0.0, pytest.approx(swin.max()))
    peaked = np.eye(4)
    hm = next(t for t in figures.map_figure(None, peaked, title="t", colorbar_title="c").data if t.type == "heatmap")
    assert hm.zmin is None and hm.zmax is None  # not flat: Plotly's own range, min to max
    fig = figures.map_figure(None, swin, title="t", colorbar_title="c", zmin=1, zmax=2)
    hm = next(t for t in fig.data if t.type == "heatmap")
    assert (hm.zmin, hm.zmax) == (1, 2)  # a caller's scale (a shared one) wins
    tiles = figures.small_multiples_figure(np.zeros((2, 3, 3)), ["a", "b"], colorbar_title="c")
    assert (tiles.data[0].zmin, tiles.data[0].zmax) == (0.0, 1.0)
