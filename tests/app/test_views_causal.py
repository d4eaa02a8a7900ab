"""The views of ui/causal_views.py are functions of their state: each drawn twice with two panes shows each
pane's own numbers, computed here by vitviz outside the app for each image on its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from app_tools import no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest
from test_page_views import _array, _charts, _tiles

from vitviz.capture.targets import Target
from vitviz.causal import activation_patching, direct_logit_attribution, fast_estimate, head_importance, patch_lens
from vitviz.evaluate.faithfulness import Perturbations
from vitviz.methods import explain_many
from vitviz.models.load import load_model

ROOT = str(Path(__file__).resolve().parents[2])
EXAMPLES = Path(ROOT) / "assets" / "examples"
NAMES = ("demo-star.png", "demo-circle.png")  # pane A's image, pane B's; each is the other's patching source

pytestmark = pytest.mark.usefixtures("one_thread")


def _twice_script(root: str, states: tuple, sources: tuple) -> None:
    """Every view of ui/causal_views.py, once per pane state; nothing is put in the session first, so a view
    that read the sidebar's state would raise."""
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    import streamlit as st

    from ui import causal_views as vc
    from ui import common
    from vitviz.capture.targets import Target

    tops = []
    for who, state, source in zip("AB", states, sources, strict=True):
        cur = common.current_of(state)
        top = common.classes(cur).ranked[0].index
        tops.append((top, common.classes(cur).ranked[1].index))
        target = Target.of_class(top)
        # pane A: the top class, its maps over their maxima, insertion from grey; pane B: its top class minus its
        # second, the raw maps on one scale, insertion from the mean colour
        second = common.classes(cur).ranked[1].index
        explained = target if who == "A" else Target.of_class(top, second)
        scale, start = ("fixed [0, max]", "grey") if who == "A" else ("shared", "mean")
        vc.draw_method_maps(cur, vc.MethodMapsSettings(explained, scale), key=f"{who}_method")
        vc.draw_curves(cur, vc.CurvesSettings(explained, start), key=f"{who}_curves")
        vc.draw_importance(cur, vc.ImportanceSettings(top, "zero", marked=(1, 0)), key=f"{who}_imp")
        vc.draw_importance(cur, vc.ImportanceSettings(top, "mean", fast=True), key=f"{who}_est")
        vc.draw_attribution(cur, vc.AttributionSettings(top), key=f"{who}_attr")
        patched = vc.PatchingSettings(target, source)
        vc.draw_patching(cur, patched, key=f"{who}_patch")
        vc.draw_patching(cur, patched, key=f"{who}_exact", exact=True)
        vc.draw_patch_lens(cur, target, key=f"{who}_patch")
    st.session_state.tops = tops


def _states():
    from ui.common import PaneState, digest

    data = [(EXAMPLES / name).read_bytes() for name in NAMES]
    return tuple(PaneState("demo", d, digest(d)) for d in data), (data[1], data[0])


def test_causal_views_drawn_twice_with_two_states_show_each_states_own_numbers():
    states, sources = _states()
    at = AppTest.from_function(_twice_script, args=(ROOT, states, sources), default_timeout=300)
    at.run()
    no_trouble(at)
    charts = _charts(at)
    per_pane = ("method_maps", "curves", "imp_map", "est_map", "attr_map")
    per_pane += ("patch_residual_grid", "patch_row_map", "patch_heads_grid", "exact_residual_grid")
    per_pane += ("exact_row_map", "exact_heads_grid", "patch_lens_map")
    assert sorted(charts) == sorted(f"{w}_{k}" for w in "AB" for k in per_pane)  # no chart replaced another
    metrics = [m.value for m in at.metric]  # clean, source, work: A's estimate, A's exact, B's estimate, B's exact

    loaded = load_model("demo", device="cpu")
    images = [Image.open(EXAMPLES / name).convert("RGB") for name in NAMES]
    drawn = {}
    for i, (who, (top, second)) in enumerate(zip("AB", at.session_state.tops, strict=True)):
        image, source = images[i], images[1 - i]
        target = Target.of_class(top)
        seen = drawn[who] = {}

        explained = target if who == "A" else Target.of_class(top, second)
        maps = explain_many(loaded, image, target=explained)  # each method's map, outside the app
        title, z, _ = charts[f"{who}_method_maps"]
        assert title == f"Every method's map for {explained.name(loaded.id2label)}"
        values = [np.asarray(m.values, np.float64) for m in maps.values()]
        tiles = _tiles(z, len(values), values[0].shape, cols=4)  # Compare's tiles: four a row
        for name, tile, ref in zip(maps, tiles, values, strict=True):
            if who == "B":  # the shared scale: the raw values
                np.testing.assert_allclose(tile, ref, rtol=1e-4, atol=1e-6, err_msg=name)
            elif ref.max() > 0:  # the default scale: each map over its own maximum
                np.testing.assert_allclose(tile, ref / ref.max(), rtol=1e-4, atol=1e-6, err_msg=name)
        seen["maps"] = tiles

        title, _, traces = charts[f"{who}_curves"]
        what = f"probability of '{loaded.id2label[top]}'"
        pert = Perturbations(loaded, image, insertion_start="grey" if who == "A" else "mean")
        results = pert.curves_many(list(maps.values()), target=top)
        if who == "B":  # each curve: the top class's probability minus the second's, on the same perturbed images
            what += f" minus that of '{loaded.id2label[second]}'"
            minus = pert.curves_many(list(maps.values()), target=second)
            pairs = zip(results, minus, strict=True)
            results = [(r.method, r.deletion - m.deletion, r.insertion - m.insertion) for r, m in pairs]
        else:
            results = [(r.method, r.deletion, r.insertion) for r in results]
        assert title.replace("<br>", " ") == f"Deletion and insertion curves: {what} (Petsiuk et al. 2018)"  # may wrap
        assert [t["name"] for t in traces] == [r[0] for r in results for _ in range(2)]
        for k, (_, deletion, insertion) in enumerate(results):
            np.testing.assert_allclose(_array(traces[2 * k]["y"]), deletion, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(_array(traces[2 * k + 1]["y"]), insertion, rtol=1e-5, atol=1e-6)
        seen["curves"] = np.concatenate([_array(t["y"]) for t in traces])

        exact = head_importance(loaded, image, target=top, mode="zero").effects
        estimate = fast_estimate(loaded, image, target=top, mode="mean").effects
        heads = direct_logit_attribution(loaded, image, target=top).heads
        for key, ref in (("imp_map", exact), ("est_map", estimate), ("attr_map", heads)):
            np.testing.assert_allclose(charts[f"{who}_{key}"][1], ref, rtol=1e-4, atol=1e-6, err_msg=key)
            seen[key] = charts[f"{who}_{key}"][1]
        assert charts[f"{who}_imp_map"][0].startswith("Effect of knocking out each head")
        assert charts[f"{who}_est_map"][0].startswith("Fast estimate (first order, not exact)")

        est = activation_patching(loaded, image, source, target=target, exact=False)
        ex = activation_patching(loaded, image, source, target=target, estimate=False)
        for kind, p, res, hd in (
            ("patch", est, est.residual_estimate, est.heads_estimate),
            ("exact", ex, ex.residual, ex.heads),
        ):
            np.testing.assert_allclose(charts[f"{who}_{kind}_residual_grid"][1], res - p.clean, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(charts[f"{who}_{kind}_heads_grid"][1], hd - p.clean, rtol=1e-4, atol=1e-5)
            change = res[:, p.num_prefix :] - p.clean
            block = int(np.argmax(np.abs(change).max(axis=1)))  # the slider's default: the block patches move most
            assert at.slider(key=f"{who}_{kind}_block").value == block
            row = change[block].reshape(p.grid)
            np.testing.assert_allclose(charts[f"{who}_{kind}_row_map"][1], row, rtol=1e-4, atol=1e-5)
            seen[kind] = charts[f"{who}_{kind}_residual_grid"][1]
        assert not np.allclose(ex.residual, est.residual_estimate, atol=1e-4)  # the exact grid is not the estimate
        pane = metrics[6 * i : 6 * i + 6]
        assert pane[0] == pane[3] == f"{est.clean:.4g}" and pane[1] == f"{est.source:.4g}"

        lens = patch_lens(loaded, image, target=target)
        np.testing.assert_allclose(charts[f"{who}_patch_lens_map"][1], lens[-1], rtol=1e-4, atol=1e-5)
        seen["lens"] = charts[f"{who}_patch_lens_map"][1]
    for name, a in drawn["A"].items():  # the two panes differ: neither reused the other's state
        assert not np.allclose(a, drawn["B"][name], rtol=1e-3, atol=1e-6), name
