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
