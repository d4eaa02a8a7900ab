"""The instant head view in Chromium: input -> redraw, page payload, and the same under 16 pages at once.

    python -m benchmarks --sections headview

A random-weight ViT-B/16 at 224 px (12 layers x 12 heads, 197 tokens) captures one image;
its maps go into :func:`vitviz.figures.headview.head_view_html`, which Chromium opens.
Each change is a real input event (layer slider, head slider, a click on a patch of the
large map); the time is from the event to the next animation frame after the redraw
(``requestAnimationFrame``, so painting is included). "16 pages" runs 16 tabs of one
Chromium changing at the same time: with the maps in the browser nothing waits on the
server, so this is the p95 a visitor sees under 16 sessions (the server only sends each
page once per image).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import numpy as np

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu"]

# One change in the page: a real event, then wait for the frame after it.
CHANGE_JS = """async ([kind, value]) => {
  const t0 = performance.now();
  if (kind === "click") {
    const big = document.getElementById("big"), r = big.getBoundingClientRect();
    const gw = 14, gh = 14, n = value % (gw * gh);
    big.dispatchEvent(new MouseEvent("click", {clientX: r.left + ((n % gw) + 0.5) * r.width / gw,
                                               clientY: r.top + (Math.floor(n / gw) + 0.5) * r.height / gh}));
  } else {
    const el = document.getElementById(kind); el.value = String(value);
    el.dispatchEvent(new Event("input"));
  }
  await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
  return performance.now() - t0;
}"""


def _html(folder: Path) -> tuple[str, float]:
    from PIL import Image

    from vitviz.capture.forward import capture
    from vitviz.figures.headview import head_view_data, head_view_html
    from vitviz.models.load import load_model

    loaded = load_model(str(folder), device="cpu")
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8))
    cap = capture(loaded, image)
    t = time.perf_counter()
    data = head_view_data(cap.attention_stack, grid=cap.grid, prefix_kinds=cap.prefix_kinds, image=cap.image)
    pack_s = time.perf_counter() - t
    return head_view_html(data), pack_s


async def _changes(page, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    times = []
    for i in range(n):
        kind = ("layer", "head", "click")[i % 3]
        value = int(rng.integers(0, 196 if kind == "click" else 12))
        times.append(await page.evaluate(CHANGE_JS, [kind, value]))
    return times


async def _measure(html: str, sessions: int, n: int) -> list[float]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            pages = [await browser.new_page(viewport={"width": 1366, "height": 768}) for _ in range(sessions)]
            for page in pages:
                await page.set_content(html)
            for page in pages:
                await page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
            results = await asyncio.gather(*(_changes(pg, n, seed) for seed, pg in enumerate(pages)))
        finally:
            await browser.close()
    return [t for r in results for t in r]


def _p95(values: list[float]) -> float:
    return round(float(np.percentile(values, 95)), 1)


def show_vs_app(vit_folder: Path, runs: int = 3) -> dict:
    """``vitviz.run`` + ``vitviz.show`` (the head view page) against what the app does from an upload to its first
    map (capture + the head figures), both from a loaded model, medians of ``runs``."""
    import statistics as stats

    from PIL import Image

    import vitviz
    from vitviz import figures
    from vitviz.analysis.blocks import global_query, head_maps
    from vitviz.capture.forward import capture
    from vitviz.capture.run import clear_runs
    from vitviz.models.load import load_model

    loaded = load_model(str(vit_folder), device="cpu")
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (480, 640, 3), dtype=np.uint8))

    def app() -> None:
        cap = capture(loaded, image)
        block = cap.blocks[-1]
        maps = head_maps(block, global_query(block))
        figures.small_multiples_figure(maps.values, [str(h) for h in range(block.num_heads)], colorbar_title="a")
        figures.map_figure(cap.image, maps.values[0], title="t", colorbar_title="a")

    def notebook() -> None:
        clear_runs()  # vitviz.run returns the engine's cached Run: each timing is a first draw
        vitviz.show(vitviz.run(loaded, image))._repr_mimebundle_()

    times = {}
    for name, fn in (("app", app), ("notebook", notebook)):
        fn()
        samples = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        times[name] = stats.median(samples)
    return {
        "app_upload_to_map_s": round(times["app"], 3),
        "show_first_draw_s": round(times["notebook"], 3),
        "show_over_app": round(times["notebook"] / times["app"], 2),
    }


def head_view_timings(vit_folder: Path, *, changes: int = 60) -> dict:
    """Input -> redraw (ms, median and p95) in one page and in 16 at once; payload MB; packing seconds."""
    html, pack_s = _html(vit_folder)
    one = asyncio.run(_measure(html, 1, changes))
    many = asyncio.run(_measure(html, 16, max(12, changes // 4)))
    return {
        "model": "vit-b16-224",
        "payload_MB": round(len(html.encode()) / 1e6, 2),
        "pack_s": round(pack_s, 3),
        "redraw_ms_median": round(statistics.median(one), 1),
        "redraw_ms_p95": _p95(one),
        "sessions16_redraw_ms_p95": _p95(many),
        **show_vs_app(vit_folder),
    }
