"""Issue 32, "The first hour, round 3": what a new user met in the app, page by page (AppTest).

The real-browser halves (the instant view's choices, clicks on tiles, layout at 1366 x 768) are in
tests/test_browser_first_hour.py.
"""

from __future__ import annotations

import json

from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest


def _app(page: str | None = None, **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    if page:
        at.switch_page(page).run()
    no_trouble(at, page or "")
    return at


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in charts(at)]


def _titles(at: AppTest) -> list[str]:
    return [(f["layout"].get("title") or {}).get("text", "") for f in _figures(at)]


def _component(at: AppTest, name: str):
    return next(e for e in at.main if e.type == "bidi_component" and e.proto.component_name == name)


# --- 1. the instant head view's choices are the session's -------------------------------------------------


def _instant(at: AppTest) -> dict:
    """What the instant view's component was given: its start (layer, head, query)."""
    return json.loads(_component(at, "vitviz_head_view").proto.json)[0]


def test_a_choice_in_the_instant_view_is_the_sessions_layer_head_and_query():
    at = _app("pages/heads.py")
    assert _instant(at)["start"] == {"layer": 3, "head": 0, "query": 0}
    # the browser reports layer 2, head 3 and a patch (token 1 + 5 * 12 + 7: patch (5, 7)) as the view's choice
    at.session_state["instant_view"] = {"choice": {"layer": 2, "head": 3, "query": 1 + 5 * 12 + 7, "id": "1"}}
    at.run()
    no_trouble(at)
    assert (at.session_state.layer, at.session_state.head) == (2, 3)
    assert (at.session_state.query_stage, at.session_state.query) == (0, 1 + 5 * 12 + 7)
    at.switch_page("pages/layers.py").run()
    assert any("Query token: **patch (5, 7)**" in c.value for c in at.caption)
    at.switch_page("pages/heads.py").run()
    assert _instant(at)["start"] == {"layer": 2, "head": 3, "query": 1 + 5 * 12 + 7}


def test_knock_outs_sit_beside_the_instant_view_and_its_toggle_stays_as_set():
    at = _app("pages/heads.py")
    assert at.toggle(key="_w_instant_heads").value is True
    assert any("Knock it out" in h.value for h in at.subheader)
    assert at.multiselect(key="_w_knockout") is not None
    at.toggle(key="_w_instant_heads").set_value(False).run()
    at.switch_page("pages/layers.py").run()
    at.switch_page("pages/heads.py").run()
    no_trouble(at)
    assert at.toggle(key="_w_instant_heads").value is False
    assert charts(at)  # the server-drawn view


# --- 2. "click to show it large" works on every map that says it ------------------------------------------


def _promising(at: AppTest) -> list:
    """The charts whose hover promises "click to show it large"."""
    return [c for c in charts(at) if "click to show it large" in c.proto.spec]


def _click_tile(at: AppTest, key: str, tile: int) -> None:
    at.session_state[key] = {"selection": {"points": [{"customdata": [tile], "click": f"tile-{tile}"}]}}
    at.run()
    no_trouble(at, key)


def test_every_tile_set_that_says_click_to_show_it_large_shows_it_large():
    at = _app("pages/layers.py")
    promising = _promising(at)
    assert {c.key for c in promising} >= {"layer_grid_0", "masks_grid"}
    assert all(c.type == "click_chart" for c in promising), [c.key for c in promising if c.type != "click_chart"]
    _click_tile(at, "layer_grid_0", 2)
    large = next(json.loads(c.proto.spec) for c in charts(at) if c.key == "layer_grid_0_large")
    assert "block 2" in large["layout"]["title"]["text"]
    _click_tile(at, "masks_grid", 1)
    large = next(json.loads(c.proto.spec) for c in charts(at) if c.key == "masks_grid_large")
    assert "head 1" in large["layout"]["title"]["text"]

    at = _app("pages/heads.py", instant_heads=False, knockout=[(0, 1)])
    assert all(c.type == "click_chart" for c in _promising(at)), [c.key for c in _promising(at)]
    assert "knockout_heads" in {c.key for c in _promising(at)}
    _click_tile(at, "knockout_heads", 2)
    assert any(c.key == "knockout_heads_large" for c in charts(at))

    at = _app("pages/compare.py")
    assert "method_maps" in {c.key for c in _promising(at)}
    assert all(c.type == "click_chart" for c in _promising(at))
    _click_tile(at, "method_maps", 0)
    large = next(json.loads(c.proto.spec) for c in charts(at) if c.key == "method_maps_large")
    assert large["layout"]["title"]["text"]


# --- 4. one convention for numbers and names -----------------------------------------------------------------


def _titled(at: AppTest, words: str) -> dict:
    return next(f for f in _figures(at) if words in str((f["layout"].get("title") or {}).get("text", "")))


def test_blocks_heads_patches_and_sizes_are_named_one_way_on_every_page():
    at = _app()  # the overview: the patch grid says rows x columns and width x height
    assert "12 x 12 patches (rows x columns)" in _titles(at)[0] and "(width x height)" in _titles(at)[0]
    sidebar = " ".join(c.value for c in at.sidebar.caption)
    assert "(width x height)" in sidebar and "(rows x columns)" in sidebar
    at.switch_page("pages/embedding.py").run()
    norms = _titled(at, "Token norms")
    hm = norms["data"][0]
    assert [r[0][0] for r in hm["customdata"]] == ["embeddings", *(f"after block {b}" for b in range(4))]
    assert [t[1] for t in hm["customdata"][0][:3]] == ["CLS", "p0", "p1"]
    assert "after layer" not in json.dumps(norms)
    at.switch_page("pages/importance.py").run()
    attribution = _titled(at, "Direct contribution")
    assert attribution["data"][0]["colorbar"]["title"]["text"] == "direct contribution (logits)"
    targets = next(t for t in attribution["data"] if t["type"] == "scatter")
    assert "contribution %{customdata[2]" in targets["hovertemplate"]  # the value in the hover
    at = _app("pages/heads.py", instant_heads=False)
    assert any(b.label == "Knock out block 3, head 0" for b in at.button)
    assert at.slider(key="_w_layer").label == "Block"


def test_registers_count_from_zero_like_every_other_index(tiny_dirs):
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    at.text_input(key="model_text").input(str(tiny_dirs["dinov2_registers"])).run()
    no_trouble(at)
    sequence = next(f for f in _figures(at) if "Input sequence" in str(f["layout"]["title"]["text"]))
    assert list(sequence["data"][0]["text"][:6]) == ["CLS", "REG0", "REG1", "REG2", "REG3", "p0"]
