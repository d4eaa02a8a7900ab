"""Issue 32, "The first hour, round 3", in a real browser: what only a browser shows (Chromium + Playwright).

One Streamlit server and one Chromium for the module (tests/browser_tools.py). Run one test at a time while
developing: each costs tens of seconds on a shared 2-core machine.
"""

from __future__ import annotations

import time

import pytest
from browser_tools import CHROMIUM, FLAGS, ROOT, instant_state, require_chromium, settle, streamlit_server

require_chromium()
pytestmark = pytest.mark.browser
OUTPUT = ROOT / "test-output"


@pytest.fixture(scope="module")
def server():
    OUTPUT.mkdir(exist_ok=True)
    with (
        open(OUTPUT / "streamlit-first-hour.log", "w") as log,
        streamlit_server({"HF_HUB_OFFLINE": "1"}, log=log) as (url, _),
    ):
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def _head_view(page):
    """The instant head view's frame (its page decoded and drawn)."""
    instant_state(page, timeout=120)
    return next(f for f in page.frames if f.evaluate("!!document.getElementById('big')"))


def _wait_text(page, text: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while text not in page.get_by_test_id("stMain").inner_text():
        assert time.time() < deadline, f"{text!r} not on the page"
        page.wait_for_timeout(250)


def test_the_instant_views_choice_is_the_sessions_query_block_and_head(server, browser):
    """Item 1: block 2, head 3 and a clicked patch in the instant view; Layers & rollout then names that patch as
    the query, and the Heads page opens again on block 2, head 3, that patch. Switching stays in the browser."""
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        page.goto(f"{server}/heads")
        frame = _head_view(page)
        settle(page)
        # item 10: the frame holds the whole page (it was 610 px for 633 px of content: the last line cut)
        frame_h, content_h = page.evaluate(
            "() => { const f = document.querySelector('iframe.vitviz-head-view');"
            " return [f.clientHeight, f.contentDocument.documentElement.scrollHeight]; }"
        )
        assert frame_h >= content_h, (frame_h, content_h)
        layers = int(frame.evaluate("+document.getElementById('layer').max")) + 1
        heads = frame.locator("#thumbs canvas").count() // layers
        frame.locator("#thumbs canvas").nth(2 * heads + 3).click()
        # the view switched at once, in the browser
        assert {k: frame.evaluate("window.vitvizState")[k] for k in ("layer", "head")} == {"layer": 2, "head": 3}
        box = frame.locator("#big").bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.3)  # a patch: the query
        chosen = frame.evaluate("window.vitvizState")
        assert chosen["query"] > 0
        page.wait_for_timeout(1500)  # the choice goes back to the server (debounced), which reruns the page
        settle(page)
        page.get_by_role("link", name="Layers & rollout").click()
        _wait_text(page, "Query token: patch (")
        page.get_by_role("link", name="Heads").click()
        again = instant_state(page, timeout=120)
        assert {k: again[k] for k in ("layer", "head", "query")} == {"layer": 2, "head": 3, "query": chosen["query"]}
        # the knock-outs are on the page with the instant view, for the block and head chosen there
        _wait_text(page, "Knock out block 2, head 3")
    finally:
        page.close()


# Every set of sidebar navigation links the page showed, recorded from the first paint by a MutationObserver (a
# list drawn for a moment between two polls is caught too).
NAV_WATCH_JS = """
window.__navSeen = [];
const record = () => {
    const links = Array.from(document.querySelectorAll(
        "[data-testid='stSidebarNav'] a, [data-testid='stSidebarNavLink'], [data-testid='stSidebar'] [data-testid^='stPageLink'] a"
    ));
    if (!links.length) return;
    const label = a => {  // the link's words without its icon's (a Material icon is drawn from its name)
        const copy = a.cloneNode(true);
        copy.querySelectorAll("[data-testid='stIconMaterial']").forEach(i => i.remove());
        return copy.innerText.trim();
    };
    const names = Array.from(new Set(links.map(label).filter(Boolean)));
    const last = window.__navSeen[window.__navSeen.length - 1];
    if (!last || last.names.join("|") !== names.join("|")) window.__navSeen.push({names, at: performance.now()});
};
new MutationObserver(record).observe(document, {childList: true, subtree: true, characterData: true});
"""


def test_a_first_visit_after_a_server_start_lists_only_the_apps_pages(browser):
    """Item 11: right after a server start the sidebar listed the app's internal modules as pages for 20-40 s.
    A fresh server, the page opened as soon as it answers; from the first paint until the first page has drawn,
    every navigation list shown holds only the app's own page titles."""
    from browser_tools import wait_for_title

    from ui.navigation import PAGES

    titles = {p.title for p in PAGES}
    OUTPUT.mkdir(exist_ok=True)
    with (
        open(OUTPUT / "streamlit-first-visit.log", "w") as log,
        streamlit_server({"HF_HUB_OFFLINE": "1"}, log=log) as (url, _),
    ):
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        try:
            page.add_init_script(NAV_WATCH_JS)
            page.goto(url, wait_until="commit")
            wait_for_title(page, "Top predictions", timeout=180)  # the first page has drawn
            seen = page.evaluate("window.__navSeen")
        finally:
            page.close()
    assert seen, "no navigation was drawn"
    strays = [s for s in seen if not set(s["names"]) <= titles]
    assert not strays, (strays, seen)
    assert set(seen[-1]["names"]) == titles


# The pages a new user opens, each with the title words of its main map (None: a page whose first figure is its main
# map), for a plain ViT and a Swin; every page is also read for clipped and overlapping texts.
LAYOUT_PAGES = {
    "demo": [
        ("Image & predictions", "Top predictions"),
        ("Layers & rollout", "Rollout of"),
        ("Head importance", "Direct contribution"),
        ("Activation patching", "Residual patching"),
        ("Compare explanations", "Every method"),
        ("Side by side", "A. demo"),
        ("Position embeddings", "Position embedding similarity"),
        ("Patch embedding & norms", "Token norms"),
        ("Features", "at blocks.2.out"),  # the demo SAE's map; its card (the bundled index) below
    ],
    "demo-swin": [
        ("Heads", "head 0: where"),
        ("Layers & rollout", "Rollout of"),
        ("Activation patching", "Head patching"),
        ("Position embeddings", None),
    ],
}


def test_at_1366x768_main_maps_are_in_view_and_no_text_is_clipped_or_overlaps(server, browser):
    """Item 10: at 1366 x 768 the main map of each page lies (at least three quarters of it) in the window before any
    scrolling, and no figure title, axis title, tick label, tile title or button label is cut or drawn over another
    (read from the bounding boxes of the texts Plotly draws)."""
    from browser_tools import choose_model, wait_for_title
    from layout_tools import layout_problems, map_box

    page = browser.new_page(viewport={"width": 1366, "height": 768})
    report = {}
    try:
        page.goto(server)
        wait_for_title(page, "Top predictions", timeout=120)
        settle(page)
        for model, pages in LAYOUT_PAGES.items():
            if model != "demo":
                choose_model(page, model)
                page.wait_for_timeout(2000)  # the model loads, the page reruns
                settle(page)
            for name, words in pages:
                page.get_by_role("link", name=name).click()
                page.wait_for_timeout(500)
                if words:
                    wait_for_title(page, words, timeout=240)
                settle(page)
                page.wait_for_timeout(500)
                problems = layout_problems(page)
                box = map_box(page, words or "")
                shot = f"layout-{model}-{name.split()[0].lower()}.png"
                page.screenshot(path=str(OUTPUT / shot))
                seen = 0.0 if box is None else (768 - box["top"]) / max(box["bottom"] - box["top"], 1)
                if problems or box is None or box["top"] < 0 or seen < 0.75:
                    report[(model, name)] = {"main map": box, "in view": round(min(seen, 1.0), 2), "texts": problems}
    finally:
        page.close()
    assert not report, report


def test_the_data_set_page_at_1366x768_cuts_no_method_name(browser, tmp_path):
    """Item 10 on the Data set page: the box plot's method names were cut. A last local run of six demo images."""
    from browser_tools import wait_for_title
    from layout_tools import layout_problems

    from vitviz.__main__ import main
    from vitviz.data.shapes import write_dataset

    home = tmp_path / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("VITVIZ_HOME", str(home))
    try:
        csv_path = write_dataset(tmp_path / "shapes", n=6, seed=31)
        argv = ["evaluate", "--data", str(csv_path), "--out", str(tmp_path / "results.parquet"), "--size", "48"]
        assert main([*argv, "--methods", "attention,rollout,integrated_gradients,random"]) == 0
    finally:
        mp.undo()
    with (
        open(OUTPUT / "streamlit-dataset.log", "w") as log,
        streamlit_server({"HF_HUB_OFFLINE": "1", "VITVIZ_HOME": str(home)}, log=log) as (url, _),
    ):
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        try:
            page.goto(f"{url}/dataset")
            page.get_by_role("button", name="Open the last local run").click(timeout=120_000)
            wait_for_title(page, "Areas over the images", timeout=120)
            settle(page)
            problems = layout_problems(page)
            page.screenshot(path=str(OUTPUT / "layout-demo-dataset.png"), full_page=True)
        finally:
            page.close()
    assert not problems, problems
