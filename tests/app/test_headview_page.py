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


def _page(at: AppTest) -> dict:
    """What the instant view's component was given: the page, its start (layer, head, query), ..."""
    view = next(e for e in at.main if e.type == "bidi_component" and e.proto.component_name == "vitviz_head_view")
    return json.loads(view.proto.json)[0]


def _start(at: AppTest) -> dict:
    """Where the page opens: the start written into the page, which the component is also given."""
    data = _page(at)
    page = data["page"]
    tag = '<script id="vitviz-data" type="application/json">'
    i = page.index(tag) + len(tag)
    assert json.loads(page[i : page.index("</script>", i)])["start"] == data["start"]
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


def test_a_typed_folder_with_a_hostile_name_runs_no_script_in_the_app(tiny_dirs, tmp_path):
    """Issue 33.4: a local folder named ``m__DATA__<img ...>`` ran script in the app's own origin (the iframe
    may run scripts of the same origin). Typed as a visitor would, its page runs nothing of the name."""
    import shutil

    from browser_tools import CHROMIUM, FLAGS, require_chromium

    require_chromium()
    folder = tmp_path / "m__DATA__<img src=x onerror=window.__pwned=1>"
    shutil.copytree(tiny_dirs["vit"], folder)
    at = _heads()
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    at.text_input(key="model_text").input(str(folder)).run()
    assert not at.exception and at.session_state.model_name == str(folder)
    page_html = _page(at)["page"]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.set_content(page_html)
            page.wait_for_function("document.body.dataset.ready !== undefined", timeout=20_000)
            assert page.evaluate("document.body.dataset.ready") == "1"
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert page.evaluate("document.querySelectorAll('img').length") == 0
            assert folder.name in page.inner_text("#title")  # the name, shown as text
        finally:
            browser.close()
