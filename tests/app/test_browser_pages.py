"""What a user sees in a real browser (issue 22): colours, clicks, downloads, layout.

One Streamlit server and one Chromium for the module (see tests/browser_tools.py).
"""

from __future__ import annotations

import io
import time
import urllib.request

import pytest
from browser_tools import (
    CHROMIUM,
    FLAGS,
    PLOTS,
    ROOT,
    open_server_heads,
    plot_state,
    require_chromium,
    settle,
    streamlit_server,
    wait_for_title,
)

from ui.click_chart import PLOTLY_DIR, PLOTLY_JS

require_chromium()
OUTPUT = ROOT / "test-output"

# Page coordinates of the centre of the heatmap cell holding the map's minimum, in the figure titled ``words``.
MIN_CELL_JS = f"""(words) => {{
    const el = Array.from(document.querySelectorAll("{PLOTS}"))
        .find(el => ((el.layout.title || {{}}).text || "").includes(words));
    const hm = el._fullData.find(t => t.type === "heatmap");
    const z = hm._z || hm.z;
    let best = [Infinity, 0, 0];
    z.forEach((row, r) => row.forEach((v, c) => {{ if (v < best[0]) best = [v, r, c]; }}));
    const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, box = el.getBoundingClientRect();
    return {{
        x: box.left + xa._offset + xa.l2p(hm.x0 + best[2] * hm.dx),
        y: box.top + ya._offset + ya.l2p(hm.y0 + best[1] * hm.dy),
        colorscale: hm.colorscale, opacity: hm.opacity,
    }};
}}"""


@pytest.fixture(scope="module")
def server():
    OUTPUT.mkdir(exist_ok=True)
    with (
        open(OUTPUT / "streamlit-pages.log", "w") as log,
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


def _pixel(page, x: float, y: float) -> tuple[int, int, int]:
    from PIL import Image

    png = page.screenshot(clip={"x": x - 1, "y": y - 1, "width": 3, "height": 3})
    return Image.open(io.BytesIO(png)).convert("RGB").getpixel((1, 1))


def test_the_lowest_colour_of_a_map_is_its_own_scale_bottom(server, browser):
    """22.5: Inferno starts at #000004; Streamlit's theme used to repaint it pink, at 65 % over a white page."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        open_server_heads(page, server, timeout=90)
        cell = page.evaluate(MIN_CELL_JS, "head 0: where CLS looks")
        page.mouse.move(5, 5)  # no hover label over the cell
        page.wait_for_timeout(200)
        rgb = _pixel(page, cell["x"], cell["y"])
        assert max(abs(a - b) for a, b in zip(rgb, (0, 0, 4), strict=True)) <= 6, (rgb, cell["colorscale"][:2])
        assert cell["opacity"] == 1
    finally:
        page.close()


def test_two_quick_downloads_both_start(server, browser, tmp_path):
    """22.1: a download used to rerun the page; a second click during that rerun started nothing."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
    got = []
    page.on("download", lambda d: got.append(d))
    try:
        open_server_heads(page, server, timeout=90)
        page.get_by_role("button", name="Download NPZ").first.click()
        page.wait_for_timeout(120)
        page.get_by_role("button", name="Download CSV").first.click()
        deadline = time.time() + 30
        while len(got) < 2:
            assert time.time() < deadline, [d.suggested_filename for d in got]
            page.wait_for_timeout(200)
        assert sorted(d.suggested_filename.rsplit(".", 1)[1] for d in got) == ["csv", "npz"]
        saved = tmp_path / "map.csv"
        next(d for d in got if d.suggested_filename.endswith(".csv")).save_as(saved)
        assert saved.read_text().splitlines()[0].startswith('head,row,col,"attention weight (raw')
    finally:
        page.close()


def _quick_clicks(page, words: str, where: list[tuple[float, float]], gap_ms: int = 120) -> None:
    """Clicks at fractions of the plot area of the figure titled ``words``, ``gap_ms`` apart (a user's double take)."""
    plot = page.locator(PLOTS).filter(has=page.locator(f"text={words}")).first
    plot.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    box = plot.locator(".nsewdrag").first.bounding_box()
    for k, (fx, fy) in enumerate(where):
        if k:
            page.wait_for_timeout(gap_ms)
        page.mouse.click(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)


def test_a_click_on_the_rollout_map_sets_the_query(server, browser):
    """22.3: the rollout map's hover says "click to make it the query": the click does it."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(f"{server}/layers")
        wait_for_title(page, "Rollout of CLS", timeout=90)
        settle(page)
        plot = page.locator(PLOTS).filter(has=page.locator("text=Rollout of CLS")).first
        plot.scroll_into_view_if_needed()
        settle(page)
        _quick_clicks(page, "Rollout of CLS", [(7.5 / 12, 3.5 / 12)])  # cell (3, 7) of the demo's 12 x 12 grid
        wait_for_title(page, "Rollout of patch (3, 7)")
    finally:
        page.close()


def test_quick_clicks_on_the_heads_map_the_last_click_wins(server, browser):
    """22.4: two clicks 120 ms apart end on the patch clicked LAST, for each pair. A click during the previous
    click's rerun used to reach the server with the browser's stale query box (drawn for the old query), which put
    the old query back; and with ``st.plotly_chart`` the second click landed on the chart drawn for the old query,
    whose element id (it includes the figure) the server no longer knew: the map ended on the FIRST click."""
    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    loads = []  # plotly.js comes once for the page's life, not with every rerun
    page.on("request", lambda r: loads.append(r.url) if r.url.endswith("/plotly.min.js") else None)
    try:
        open_server_heads(page, server, timeout=120)
        pairs = [((2, 2), (8, 9)), ((5, 1), (10, 6)), ((1, 11), (7, 7))]
        ends = []
        for first, second in pairs:
            _quick_clicks(page, "head 0: where", [((c + 0.5) / 12, (r + 0.5) / 12) for r, c in (first, second)])
            page.wait_for_timeout(500)
            settle(page)
            page.wait_for_timeout(800)
            settle(page)
            ends.append(next(f["title"] for f in plot_state(page) if "head 0: where" in f["title"]))
        wanted = [f"patch ({r}, {c})" for _, (r, c) in pairs]
        assert all(w in t for w, t in zip(wanted, ends, strict=True)), list(zip(wanted, ends, strict=True))
        assert len(loads) == 1, loads
        # ... and it is the installed plotly package's own file, served by Streamlit (ui/click_chart.py)
        assert urllib.request.urlopen(loads[0], timeout=30).read() == (PLOTLY_DIR / PLOTLY_JS).read_bytes()
    finally:
        page.close()


# The clickable map's graph: its size, its element's width, the camera button's options (ui/click_chart.py).
CLICK_MAP_JS = f"""(words) => {{
    const el = Array.from(document.querySelectorAll("{PLOTS}"))
        .find(el => ((el.layout.title || {{}}).text || "").includes(words));
    const box = el.getBoundingClientRect(), outer = el.closest(".stBidiComponent").getBoundingClientRect();
    return {{width: box.width, height: box.height, outer: outer.width, layoutHeight: el.layout.height,
             png: el._context.toImageButtonOptions}};
}}"""


def test_a_clickable_map_keeps_its_size_hover_text_and_camera_button(server, browser, tmp_path):
    """The custom component draws the figure as st.plotly_chart did: its height, the element's full width, the
    hover label, and the modebar's PNG of the photo's size."""
    from PIL import Image

    page = browser.new_page(viewport={"width": 1500, "height": 1300}, accept_downloads=True)
    try:
        open_server_heads(page, server, timeout=120)
        got = page.evaluate(CLICK_MAP_JS, "head 0: where")
        assert got["height"] == got["layoutHeight"] and abs(got["width"] - got["outer"]) <= 1, got
        plot = page.locator(PLOTS).filter(has=page.locator("text=head 0: where")).first
        box = plot.locator(".nsewdrag").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 7.5 / 12, box["y"] + box["height"] * 3.5 / 12)
        label = plot.locator(".hoverlayer .hovertext").first
        label.wait_for(timeout=10_000)
        assert "click to make it the query" in label.text_content()
        with page.expect_download(timeout=30_000) as download:
            plot.locator(".modebar-btn[data-title^='Download plot']").first.click()
        saved = tmp_path / download.value.suggested_filename
        download.value.save_as(saved)
        png = got["png"]
        assert saved.suffix == ".png" and Image.open(saved).size == (png["width"], png["height"]), png
        # full screen, as Streamlit's own charts offer: the map fills the screen; the button again (or Esc, which a
        # script cannot press for the browser) brings it back
        plot.locator(".modebar-btn[data-title^='Full screen']").first.click()
        page.wait_for_function("() => document.fullscreenElement && document.fullscreenElement.layout", timeout=10_000)
        page.wait_for_function("() => document.fullscreenElement.getBoundingClientRect().height >= 1250")
        full = page.evaluate(CLICK_MAP_JS, "head 0: where")
        assert full["width"] >= 1450 and full["height"] >= 1250 and full["layoutHeight"] >= 1250, full
        plot.locator(".modebar-btn[data-title^='Full screen']").first.click()
        page.wait_for_function("() => !document.fullscreenElement", timeout=10_000)
        page.wait_for_function(
            "([sel, h]) => Array.from(document.querySelectorAll(sel)).some(el => el.getBoundingClientRect().height === h)",
            arg=[PLOTS, got["height"]],
        )
        back = page.evaluate(CLICK_MAP_JS, "head 0: where")
        assert back["height"] == got["height"] and abs(back["width"] - back["outer"]) <= 1, (back, got)
    finally:
        page.close()
