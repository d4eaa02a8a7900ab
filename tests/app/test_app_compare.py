"""AppTest of the Compare page's colour scales (issue 22 item 13): the default invents no contrast, each map's
range is shown, the other scales are one click away."""

from __future__ import annotations

import json
import re

import numpy as np
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from vitviz.figures import tile_gap


def _maps_figure(at: AppTest) -> dict:
    figs = [json.loads(el.proto.spec) for el in charts(at)]
    return next(f for f in figs if "attention" in [a["text"].split(" [")[0] for a in f["layout"]["annotations"]])


def _z(trace) -> np.ndarray:
    z = trace["z"]
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z["shape"]).split(",")]).astype(float)
    return np.array(z, dtype=float)


def test_compare_maps_default_to_zero_to_max_and_show_each_range(demo_model):
    from vitviz.methods import explain_many

    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/compare.py").run()
    no_trouble(at)
    assert at.radio(key="compare_scale").value == "fixed [0, max]"
    fig = _maps_figure(at)
    heat = fig["data"][0]
    assert (heat["zmin"], heat["zmax"]) == (0.0, 1.0)

    from vitviz.data.images import load_image

    image = load_image(APP.rsplit("/", 1)[0] + "/assets/examples/demo-star.png")
    cls = at.session_state.class_index
    want = explain_many(demo_model, image, target=cls)
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    z = _z(heat)
    for k, title in enumerate(titles):
        name, lo, hi = re.fullmatch(r"(.+) \[(\S+), (\S+)\]", title).groups()
        values = np.asarray(want[name].values, np.float64)
        assert float(lo) == float(f"{values.min():.3g}") and float(hi) == float(f"{values.max():.3g}"), name
        gh, gw = values.shape
        r, c = divmod(k, 4)  # four tiles a row
        stride = gh + tile_gap(gh)
        tile = z[r * stride : r * stride + gh, c * (gw + 1) : c * (gw + 1) + gw]
        if values.max() > 0:
            np.testing.assert_allclose(tile, values / values.max(), rtol=1e-4, atol=1e-6)

    at.radio(key="compare_scale").set_value("shared").run()
    no_trouble(at)
    heat = _maps_figure(at)["data"][0]
    all_values = np.concatenate([np.ravel(want[n].values) for n in want])
    assert heat["zmin"] == np.float32(all_values.min()) or np.isclose(heat["zmin"], all_values.min(), rtol=1e-5)
    assert np.isclose(heat["zmax"], all_values.max(), rtol=1e-5)


def test_only_maps_whose_click_sets_the_query_promise_it():
    """22.3: rollout takes a click (it sets the query); relevance has no query and promises nothing."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/layers.py").run()
    no_trouble(at)
    by_id = {el.proto.id: el for el in charts(at)}
    by_title = {}
    for el in by_id.values():
        spec = json.loads(el.proto.spec)
        by_title[str(spec["layout"].get("title", {}).get("text", ""))] = (spec, el.proto)
    rollout = next(v for t, v in by_title.items() if t.startswith("Rollout of"))
    relevance = next(v for t, v in by_title.items() if t.startswith("Relevance for"))

    def hover(spec):
        return next(t["hovertemplate"] for t in spec["data"] if t["type"] == "scatter")

    assert "click to make it the query" in hover(rollout[0]) and list(rollout[1].selection_mode)
    assert "click" not in hover(relevance[0])


def test_compare_first_open_leaves_no_progress_bar():
    """22.15: per-method progress while the maps are computed, and nothing of it once they are drawn."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/compare.py").run()
    no_trouble(at)
    assert not at.get("progress")
    assert any("Colour scale" in r.label for r in at.radio)


def test_curves_withdrawn_mid_computation_leave_no_bar(monkeypatch):
    """22.15: a model switch (or Stop) while the curves are forwarded starts a new run; the old run, at its next
    batch, removes its bar and stops instead of drawing "20 of 238 images" on the new model's page."""
    import streamlit as st

    from ui import cached

    calls = []

    def withdrawn_mid_way(cur, target, progress=None, **kw):
        st.session_state.pop("curves_wanted", None)  # what set_model does in the new run
        try:
            progress(20, 238)
        except BaseException as exc:
            calls.append(type(exc).__name__)
            raise
        calls.append("went on")
        raise AssertionError("the withdrawn run went on")

    monkeypatch.setattr(cached, "get_target_curves", withdrawn_mid_way)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/compare.py").run()
    next(b for b in at.button if b.label == "Compute the curves").click().run()
    assert calls == ["StopException"]
    assert not at.get("progress")
    assert not [b for b in at.button if b.label == "Stop"]
