"""The Heads page's instant view: on by default for a plain ViT, opening where the session is; the server
view for models without one grid. The page's own behaviour in a browser: tests/figures/test_headview.py."""

from __future__ import annotations

import json

from app_tools import APP, charts
from streamlit.testing.v1 import AppTest


def _heads(**state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    at.switch_page("pages/heads.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _start(at: AppTest) -> dict:
    """Where the page opens: the start written into the page, which the component is also given."""
    view = next(e for e in at.main if e.type == "bidi_component" and e.proto.component_name == "vitviz_head_view")
    data = json.loads(view.proto.json)[0]
    page = data["page"]
    i = page.index("Object.assign(") + len('Object.assign({scale: "map", opacity: 1}, ')
    assert json.loads(page[i : page.index(");", i)]) == data["start"]
    return data["start"]


def test_heads_page_sends_the_maps_once_and_opens_on_the_sessions_layer_and_head():
    at = _heads()
    assert at.toggle(key="_w_instant_heads").value is True
    assert not charts(at)  # layer, head and query change in the browser, not on the server
    assert _start(at) == {"layer": 3, "head": 0, "query": 0}  # the demo's last layer, CLS
    at.session_state["layer"], at.session_state["head"] = 1, 2  # as a summary cell on Layers sets them
    at.run()
    assert _start(at) == {"layer": 1, "head": 2, "query": 0}


def test_switching_the_instant_view_off_gives_the_server_drawn_page():
    at = _heads()
    at.toggle(key="_w_instant_heads").set_value(False).run()
    assert not at.exception and charts(at)
