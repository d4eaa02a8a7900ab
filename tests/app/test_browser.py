"""End to end in a real browser: Debian's Chromium driven by Playwright against `streamlit run app.py`."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from browser_tools import (
    BARS_JS,
    CHROMIUM,
    FLAGS,
    PLOTS,
    ROOT,
    bars,
    choose_model,
    decode,
    instant_state,
    open_server_heads,
    plot_state,
    require_chromium,
    server_heads,
    settle,
    streamlit_server,
    wait_for_title,
)

require_chromium()
OUTPUT = ROOT / "test-output"


@pytest.fixture(scope="module")
def server():
    OUTPUT.mkdir(exist_ok=True)
    with open(OUTPUT / "streamlit.log", "w") as log, streamlit_server({"HF_HUB_OFFLINE": "1"}, log=log) as (url, _):
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def test_upload_layer_change_and_patch_click(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.goto(server)
    wait_for_title(page, "Top predictions", timeout=90)
    settle(page)  # a widget swapped in by a still-running script would drop the upload

    photo = ROOT / "assets" / "examples" / "cat-chelsea.jpg"
    page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(photo))
    sidebar = page.get_by_test_id("stSidebar")
    deadline = time.time() + 60
    while "Showing cat-chelsea.jpg" not in sidebar.inner_text():
        assert time.time() < deadline, sidebar.inner_text()
        page.wait_for_timeout(250)
    wait_for_title(page, "12 x 12 patches")

    page.get_by_role("link", name="Heads").click()
    server_heads(page)
    first = wait_for_title(page, "Block 3, head 0: where CLS looks")
    settle(page)

    slider = page.get_by_test_id("stSlider").filter(has_text="Block").get_by_role("slider")
    slider.focus()
    slider.press("Home")  # layer 0
    after_layer = wait_for_title(page, "Block 0, head 0: where CLS looks")
    assert after_layer["z"] != first["z"]
    settle(page)

    plot = page.locator(PLOTS).filter(has=page.locator("text=Block 0, head 0")).first
    box = plot.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)
    clicked = wait_for_title(page, "Block 0, head 0: where patch (")
    assert clicked["z"] != after_layer["z"]
    settle(page)

    tiles = page.locator(PLOTS).filter(has=page.locator("text=head 3")).first  # the demo model's 4 heads in a row
    box = tiles.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.62, box["y"] + box["height"] * 0.5)
    head2 = wait_for_title(page, "Block 0, head 2: where patch (")
    settle(page)

    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(2):  # files are built on click, from the shown map
        try:
            with page.expect_download(timeout=30_000) as download:
                page.get_by_role("button", name="Download NPZ").click()
            break
        except PlaywrightTimeout:  # seen once in ~10 runs: a click that raced a rerun started no download
            if attempt:
                raise
            settle(page)
    saved = tmp_path / "map.npz"
    download.value.save_as(saved)
    with np.load(saved, allow_pickle=False) as z:
        assert z["map"].shape == (12, 12) and z["all_heads"].shape == (4, 12, 12)
        np.testing.assert_allclose(z["map"], decode(head2["z"][0]), rtol=1e-5)  # the very map on screen

    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / "heads-page.png"), full_page=True)
    (OUTPUT / "browser-titles.json").write_text(json.dumps([f["title"] for f in plot_state(page)], indent=1))
    assert not page.locator("[data-testid='stException']").count()
    page.close()


def test_several_sessions_at_once_each_see_their_own_image(server, browser):
    from vitviz.capture.forward import capture
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
            wait_for_title(page, "Top predictions", timeout=90)
            settle(page)
        for page, name in zip(pages, names, strict=True):  # all uploads before any result is read
            page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(ROOT / "assets" / "examples" / name))
        for page, name in zip(pages, names, strict=True):
            sidebar = page.get_by_test_id("stSidebar")
            deadline = time.time() + 60
            while f"Showing {name}" not in sidebar.inner_text() or sorted(bars(page)) != pytest.approx(
                expected[name], abs=1e-4
            ):
                assert time.time() < deadline, (name, bars(page), expected[name])
                page.wait_for_timeout(250)
        assert len({tuple(round(v, 4) for v in expected[n]) for n in names}) == 3  # the images really differ
    finally:
        for ctx in contexts:
            ctx.close()


def test_summary_cell_opens_that_head_and_position_tiles_open_large(server, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(f"{server}/layers")
        wait_for_title(page, "click a cell", timeout=90)
        settle(page)
        plot = page.locator(PLOTS).filter(has=page.locator("text=click a cell")).first
        plot.scroll_into_view_if_needed()
        box = plot.locator(".nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4)  # layer 1, head 2
        state = instant_state(page)  # Heads opens in the instant view, on that layer and head
        assert page.url.endswith("/heads") and (state["layer"], state["head"], state["query"]) == (1, 2, 0)

        page.get_by_role("link", name="Position embeddings").click()
        wait_for_title(page, "Similarity to position (0, 0)")
        settle(page)
        grid = page.locator(PLOTS).filter(has=page.locator("text=Position embedding similarity")).first
        box = grid.locator(".nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 3.5 / 12, box["y"] + box["height"] * 5.5 / 12)
        wait_for_title(page, "Similarity to position (5, 3)")
    finally:
        page.close()


def test_a_hierarchical_model_on_every_page(server, browser, hier_dirs):
    """Swin in a real browser: stage switch, a click on the second stage, every page without an exception."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(server)
        wait_for_title(page, "Top predictions", timeout=90)
        settle(page)
        choose_model(page, "other (hub id or local folder)…")
        box = page.get_by_label("Hub id or local folder")
        box.fill(str(hier_dirs["swin"]))
        box.press("Enter")
        page.wait_for_selector("text=stage 1: 8 x 8 tokens", timeout=90_000)
        page.get_by_role("link", name="Heads").click()
        wait_for_title(page, "Stage 1, block 1, head 0: where pooled query looks")
        settle(page)
        plot = page.locator(PLOTS).filter(has=page.locator("text=Stage 1, block 1, head 0")).first
        box = plot.locator(".nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)  # cell (4, 2) of 8 x 8
        clicked = wait_for_title(page, "Stage 1, block 1, head 0: where token (4, 2) looks")
        assert len(decode(clicked["z"][0])) == 8
        settle(page)
        page.get_by_text("0 (16 x 16)").click()  # stage 0: the same place on the finer grid
        wait_for_title(page, "Stage 0, block 0, head 0: where token (9, 5) looks")  # centre (20, 36) px
        settle(page)
        for link, words in [
            ("Layers & rollout", "Rollout of"),
            ("Position embeddings", ""),
            ("Image & predictions", "Top predictions"),
        ]:
            page.get_by_role("link", name=link).click()
            if words:
                wait_for_title(page, words)
            settle(page)
            assert not page.locator("[data-testid='stException']").count(), link
        page.get_by_role("link", name="Heads").click()
        wait_for_title(page, "head 0: where")
        settle(page)
        OUTPUT.mkdir(exist_ok=True)
        page.screenshot(path=str(OUTPUT / "heads-page-swin.png"), full_page=True)
    finally:
        page.close()


def test_typed_labels_on_the_zero_shot_demo(server, browser):
    """demo-clip with no network: pick it, type labels, and the bars are those labels, the shape's first."""
    from vitviz.demo import bundled

    if "demo-clip" not in bundled():
        pytest.fail("the bundled demo-clip is missing (python -m vitviz train-demo --arch clip)")
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(server)
        wait_for_title(page, "Top predictions", timeout=90)
        settle(page)
        choose_model(page, "demo-clip")
        labels = page.get_by_label("One per line, or separated by commas")
        labels.wait_for(timeout=90_000)
        settle(page)
        labels.fill("star, circle, square")
        labels.press("Control+Enter")  # Streamlit's text area submits on Ctrl+Enter (or on blur)
        deadline = time.time() + 60
        while True:
            bars_now = page.evaluate(BARS_JS)
            names = [str(y).split(" (")[0] for y in bars_now["y"]]
            if sorted(names) == ["circle", "square", "star"]:
                break
            assert time.time() < deadline, names
            page.wait_for_timeout(250)
        assert names[-1] == "star", names  # the example image is demo-star.png; bars are drawn top = last
        assert not page.locator("[data-testid='stException']").count()
    finally:
        page.close()


def test_heads_main_map_is_visible_without_scrolling_at_1366x768(server, browser):
    """Issue 22.16, for the Heads page as it opens (the instant view of a plain ViT): its large map lies wholly
    inside a 1366 x 768 window before any scrolling."""
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        page.goto(f"{server}/heads")
        instant_state(page, timeout=120)
        frame_box = page.locator("iframe").first.bounding_box()
        frame = next(f for f in page.frames if f.evaluate("!!document.getElementById('big')"))
        canvas = frame.evaluate(
            "(() => { const r = document.getElementById('big').getBoundingClientRect();"
            " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; })()"
        )
        top, bottom = frame_box["y"] + canvas["top"], frame_box["y"] + canvas["bottom"]
        left, right = frame_box["x"] + canvas["left"], frame_box["x"] + canvas["right"]
        assert page.evaluate("window.scrollY") == 0
        assert top >= 0 and bottom <= 768 and left >= 0 and right <= 1366, (top, bottom, left, right)
        thumbs = frame.evaluate("document.getElementById('thumbs').getBoundingClientRect().left")
        assert thumbs > canvas["right"]  # the layer x head thumbnails sit beside the large map, not below it
        OUTPUT.mkdir(exist_ok=True)
        page.screenshot(path=str(OUTPUT / "heads-instant-1366x768.png"))
    finally:
        page.close()


def test_server_drawn_heads_map_is_visible_without_scrolling_at_1366x768(server, browser):
    """Issue 22.16 for the server-drawn view (the instant view switched off; hierarchical models always have it):
    the large map's plot area lies inside a 1366 x 768 window before any scrolling, the heads grid beside it."""
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        open_server_heads(page, server, timeout=120)
        page.evaluate("window.scrollTo(0, 0)")
        main = page.locator(PLOTS).filter(has=page.locator("text=head 0: where")).first
        box = main.bounding_box()
        assert page.evaluate("window.scrollY") == 0
        assert box["y"] >= 0 and box["y"] + box["height"] <= 768 and box["x"] + box["width"] <= 1366, box
        grid = page.locator(PLOTS).filter(has=page.locator("text=head 1")).first.bounding_box()
        assert grid["x"] > box["x"] + box["width"] - 1  # every head beside the large map, not above it
        OUTPUT.mkdir(exist_ok=True)
        page.screenshot(path=str(OUTPUT / "heads-server-1366x768.png"))
    finally:
        page.close()


def test_a_click_on_a_small_head_tile_opens_that_head_not_its_neighbour(server, browser):
    """At 1100 x 800 px the server-drawn head grid's tiles are ~19 px apart and their 55 px click targets overlap:
    Plotly's closest-point hover ties every target under the cursor and reported the next tile (head 0 opened head
    1). The click chart now takes the target whose centre is nearest the click."""
    sys_path = str(ROOT)
    import sys

    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    from benchmarks.load import MAP_TITLE_JS, POINT_JS

    page = browser.new_page(viewport={"width": 1100, "height": 800})
    try:
        open_server_heads(page, server)
        for head in (1, 0, 2, 3, 0):
            point = page.evaluate(POINT_JS, ["grid", head])
            page.mouse.click(point["x"], point["y"])
            wait_for_title(page, f"head {head}: where CLS looks")
            settle(page)
            assert page.evaluate(MAP_TITLE_JS).endswith(f"head {head}: where CLS looks"), page.evaluate(MAP_TITLE_JS)
    finally:
        page.close()
