"""End to end in a real browser: Debian's Chromium driven by Playwright against `streamlit run app.py`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
OUTPUT = ROOT / "test-output"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError("CI needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
    pytest.skip("Debian's chromium is not installed", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    log = open(OUTPUT.mkdir(exist_ok=True) or OUTPUT / "streamlit.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.address", "127.0.0.1",
         "--server.port", str(port), "--server.headless", "true", "--server.fileWatcherType", "none"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError("streamlit did not start; see test-output/streamlit.log")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


PLOTS = "[data-testid='stPlotlyChart'] .js-plotly-plot"


def _plot_state(page) -> list:
    """Title and heatmap data of every Plotly figure on the page, read from the DOM."""
    return page.evaluate(
        f"""() => Array.from(document.querySelectorAll("{PLOTS}")).map(el => ({{
            title: (el.layout && el.layout.title && el.layout.title.text) || "",
            z: (el.data || []).filter(t => t.type === "heatmap").map(t => t.z)
        }}))"""
    )


def _decode(z) -> np.ndarray:
    """A Plotly array as the browser holds it: a list, or {dtype, bdata (base64), shape}."""
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")])
    return np.array(z, dtype=float)


def _wait_for_title(page, words: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for fig in _plot_state(page):
            if words in fig["title"]:
                return fig
        page.wait_for_timeout(250)
    raise AssertionError(f"no figure titled with {words!r}; titles: {[f['title'] for f in _plot_state(page)]}")


def _settle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    page.wait_for_timeout(300)


def test_upload_layer_change_and_patch_click(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.goto(server)
    _wait_for_title(page, "Top predictions", timeout=90)
    _settle(page)  # a widget swapped in by a still-running script would drop the upload

    photo = ROOT / "assets" / "examples" / "cat-chelsea.jpg"
    page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(photo))
    sidebar = page.get_by_test_id("stSidebar")
    deadline = time.time() + 60
    while "Showing cat-chelsea.jpg" not in sidebar.inner_text():
        assert time.time() < deadline, sidebar.inner_text()
        page.wait_for_timeout(250)
    _wait_for_title(page, "12 x 12 patches")

    page.get_by_role("link", name="Heads").click()
    first = _wait_for_title(page, "Layer 3, head 0: where CLS looks")
    _settle(page)

    slider = page.get_by_test_id("stSlider").filter(has_text="Layer").get_by_role("slider")
    slider.focus()
    slider.press("Home")  # layer 0
    after_layer = _wait_for_title(page, "Layer 0, head 0: where CLS looks")
    assert after_layer["z"] != first["z"]
    _settle(page)

    plot = page.locator(PLOTS).filter(has=page.locator("text=Layer 0, head 0")).first
    box = plot.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)
    clicked = _wait_for_title(page, "Layer 0, head 0: where patch (")
    assert clicked["z"] != after_layer["z"]
    _settle(page)

    tiles = page.locator(PLOTS).filter(has=page.locator("text=head 3")).first  # the demo model's 4 heads in a row
    box = tiles.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.5)
    head2 = _wait_for_title(page, "Layer 0, head 2: where patch (")
    _settle(page)

    with page.expect_download() as download:  # files are built on click, from the shown map
        page.get_by_role("button", name="Download NPZ").click()
    saved = tmp_path / "map.npz"
    download.value.save_as(saved)
    with np.load(saved, allow_pickle=False) as z:
        assert z["map"].shape == (12, 12) and z["all_heads"].shape == (4, 12, 12)
        np.testing.assert_allclose(z["map"], _decode(head2["z"][0]), rtol=1e-5)  # the very map on screen

    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / "heads-page.png"), full_page=True)
    (OUTPUT / "browser-titles.json").write_text(json.dumps([f["title"] for f in _plot_state(page)], indent=1))
    assert not page.locator("[data-testid='stException']").count()
    page.close()


def _bars(page) -> list[float]:
    return page.evaluate(
        f"""() => Array.from(document.querySelectorAll("{PLOTS}"))
            .filter(el => ((el.layout.title || {{}}).text || "").includes("Top predictions"))
            .map(el => el.data[0].x)[0] || []"""
    )


def test_several_sessions_at_once_each_see_their_own_image(server, browser):
    from vitviz.capture.run import capture
    from vitviz.data.images import load_image
    from vitviz.models.load import load_model

    names = ["coffee.jpg", "rocket.jpg", "astronaut.jpg"]
    demo = load_model("demo", device="cpu")
    expected = {
        n: sorted(p.probability for p in capture(demo, load_image(ROOT / "assets/examples" / n)).predictions)
        for n in names
    }
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in names]
    pages = [ctx.new_page() for ctx in contexts]
    try:
        for page in pages:
            page.goto(server)
        for page in pages:
            _wait_for_title(page, "Top predictions", timeout=90)
            _settle(page)
        for page, name in zip(pages, names, strict=True):  # all uploads before any result is read
            page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(ROOT / "assets" / "examples" / name))
        for page, name in zip(pages, names, strict=True):
            sidebar = page.get_by_test_id("stSidebar")
            deadline = time.time() + 60
            while f"Showing {name}" not in sidebar.inner_text() or sorted(_bars(page)) != pytest.approx(
                expected[name], abs=1e-4
            ):
                assert time.time() < deadline, (name, _bars(page), expected[name])
                page.wait_for_timeout(250)
        assert len({tuple(round(v, 4) for v in expected[n]) for n in names}) == 3  # the images really differ
    finally:
        for ctx in contexts:
            ctx.close()


def test_summary_cell_opens_that_head_and_position_tiles_open_large(server, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(f"{server}/layers")
        _wait_for_title(page, "click a cell", timeout=90)
        _settle(page)
        plot = page.locator(PLOTS).filter(has=page.locator("text=click a cell")).first
        plot.scroll_into_view_if_needed()
        box = plot.locator(".nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4)  # layer 1, head 2
        _wait_for_title(page, "Layer 1, head 2: where CLS looks")
        assert page.url.endswith("/heads")

        page.get_by_role("link", name="Position embeddings").click()
        _wait_for_title(page, "Similarity to position (0, 0)")
        _settle(page)
        grid = page.locator(PLOTS).filter(has=page.locator("text=Position embedding similarity")).first
        box = grid.locator(".nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 3.5 / 12, box["y"] + box["height"] * 5.5 / 12)
        _wait_for_title(page, "Similarity to position (5, 3)")
    finally:
        page.close()


def test_a_hierarchical_model_on_every_page(server, browser, hier_dirs):
    """Swin in a real browser: stage switch, a click on the second stage, every page without an exception."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(server)
        _wait_for_title(page, "Top predictions", timeout=90)
        _settle(page)
        page.get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name="other (hub id or local folder)…").click()
        box = page.get_by_label("Hub id or local folder")
        box.fill(str(hier_dirs["swin"]))
        box.press("Enter")
        page.wait_for_selector("text=stage 2: 8 x 8 tokens", timeout=90_000)
        page.get_by_role("link", name="Heads").click()
        _wait_for_title(page, "Stage 2, block 1, head 0: where pooled query looks")
        _settle(page)
        plot = page.locator(PLOTS).filter(has=page.locator("text=Stage 2, block 1, head 0")).first
        box = plot.locator(".nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)  # cell (4, 2) of 8 x 8
        clicked = _wait_for_title(page, "Stage 2, block 1, head 0: where token (4, 2) looks")
        assert len(_decode(clicked["z"][0])) == 8
        _settle(page)
        page.get_by_text("1 (16 x 16)").click()  # stage 1: the same place on the finer grid
        _wait_for_title(page, "Stage 1, block 0, head 0: where token (9, 5) looks")  # centre (20, 36) px
        _settle(page)
        for link, words in [
            ("Layers & rollout", "Rollout of"),
            ("Position embeddings", ""),
            ("Image & predictions", "Top predictions"),
        ]:
            page.get_by_role("link", name=link).click()
            if words:
                _wait_for_title(page, words)
            _settle(page)
            assert not page.locator("[data-testid='stException']").count(), link
        page.get_by_role("link", name="Heads").click()
        _wait_for_title(page, "head 0: where")
        _settle(page)
        OUTPUT.mkdir(exist_ok=True)
        page.screenshot(path=str(OUTPUT / "heads-page-swin.png"), full_page=True)
    finally:
        page.close()
