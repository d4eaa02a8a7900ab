"""The notebook's head view in Chromium: the interactive page where scripts run, the static picture and the note
where they do not (issue 32.15), and the page's hover line and opacity (issue 32.16)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import vitviz
from tests.browser_tools import CHROMIUM, FLAGS, require_chromium

ROOT = Path(__file__).resolve().parents[1]
STAR = ROOT / "assets" / "examples" / "demo-star.png"


@pytest.fixture(scope="module")
def view(one_thread):
    return vitviz.show(vitviz.run("demo", STAR))


@pytest.fixture(scope="module")
def browser():
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def _output_page(browser, view, *, scripts: bool):
    page = browser.new_page(java_script_enabled=scripts, viewport={"width": 1200, "height": 900})
    page.set_content(f"<html><body>{view._repr_mimebundle_()['text/html']}</body></html>")
    return page


def test_where_scripts_run_the_interactive_page_replaces_the_picture(browser, view):
    page = _output_page(browser, view, scripts=True)
    try:
        page.wait_for_function("document.querySelector('iframe').style.display === 'block'", timeout=20_000)
        assert not page.locator(".vitviz-static").is_visible()
        frame = page.frames[1]
        frame.wait_for_function("document.body.dataset.ready !== undefined", timeout=30_000)
        assert frame.evaluate("document.body.dataset.ready") == "1"
    finally:
        page.close()


def test_where_scripts_do_not_run_the_picture_and_the_note_show(browser, view):
    """An untrusted notebook drops the output's script (or never runs it); so does a viewer without scripts."""
    page = _output_page(browser, view, scripts=False)
    try:
        assert page.locator(".vitviz-static img").is_visible()
        assert "Trust Notebook" in page.inner_text(".vitviz-static")
        assert not page.locator("iframe").is_visible()  # not an empty box
        size = page.evaluate("[document.querySelector('.vitviz-static img').naturalWidth]")[0]
        assert size > 100  # the picture decoded
    finally:
        page.close()


def test_untrusted_html_without_script_and_srcdoc_keeps_the_picture(browser, view):
    """What Jupyter's sanitiser keeps of an untrusted output: no script, an iframe without srcdoc or sandbox."""
    html = view._repr_mimebundle_()["text/html"]
    html = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
    html = re.sub(r' (srcdoc|sandbox)="[^"]*"', "", html)
    page = browser.new_page()
    try:
        page.set_content(f"<html><body>{html}</body></html>")
        assert page.locator(".vitviz-static img").is_visible() and not page.locator("iframe").is_visible()
    finally:
        page.close()


@pytest.fixture
def head_page(browser, view):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.set_content(view.html)
    page.wait_for_function("document.body.dataset.ready !== undefined", timeout=20_000)
    assert page.evaluate("document.body.dataset.ready") == "1"
    yield page
    page.close()


def _hover_value(page) -> float:
    text = page.inner_text("#hover")
    return float(re.search(r": ([-0-9.e]+) ", text).group(1))


def test_the_hover_value_follows_a_slider_change_and_a_click(head_page, view):
    """Issue 32.16: the hover line kept the value of the map before a click or a slider change."""
    page = head_page
    box = page.locator("#big").bounding_box()
    gh, gw = view.capture.grid
    x, y = box["x"] + box["width"] * 2.5 / gw, box["y"] + box["height"] * 3.5 / gh  # cell (3, 2)
    n = 3 * gw + 2
    page.mouse.move(x, y)

    def expected() -> float:
        s = page.evaluate("window.vitvizState")
        return page.evaluate(f"window.vitvizValue({s['layer']}, {s['head']}, {s['query']}, {n})")

    assert np.isclose(_hover_value(page), expected(), rtol=1e-2)
    page.evaluate("window.vitvizSet({layer: 0, head: 1})")  # as the sliders do
    assert page.evaluate("window.vitvizState.layer") == 0
    assert np.isclose(_hover_value(page), expected(), rtol=1e-2)
    page.mouse.click(x, y)  # the hovered cell becomes the query: the value under the pointer changes again
    assert page.evaluate("window.vitvizState.query") == 1 + n
    assert np.isclose(_hover_value(page), expected(), rtol=1e-2)


def test_the_photo_shows_under_the_map_and_the_slider_says_so(head_page):
    assert head_page.evaluate("window.vitvizState.opacity") == pytest.approx(0.6)
    assert head_page.input_value("#opacity") == "60"
