"""Wide uploads against a real server in public mode (Chromium, ``streamlit run``): an input over ``max_tokens`` is
never run (the sidebar says so, naming the setting, and falls back to a square input, as it does for the memory
budget), and the server's memory stays bounded however many wide images arrive.

AppTest would run the page scripts in this test's own process: it cannot show that the server process's memory
stays bounded (nor that Streamlit's own upload path holds nothing), so this test drives a served app and reads the
server's resident memory from /proc.

The server's caches are shrunk (run cache 256 MB, capture cache 128 MB, memory budget 1,536 MB) so the bound derived
from them is close: the server may grow by at most twice the memory budget (one capture's attention, transient),
twice the run cache (the Runs and the light sources kept), the capture cache and the results cache.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from browser_tools import CHROMIUM, FLAGS, require_chromium, settle, streamlit_server

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.load import Sampler  # noqa: E402

ENV = {
    "VITVIZ_PUBLIC": "1",
    "HF_HUB_OFFLINE": "1",
    "VITVIZ_RUN_CACHE_MB": "256",
    "VITVIZ_CAPTURE_CACHE_MB": "128",
    # 1,536 MB: a 1360 x 192 px input's attention (1.0 GiB) passes the sidebar's budget check, so the token bound is
    # what stops it (under 1 GiB the sidebar's budget warning would fall back to 192 x 192 px first)
    "VITVIZ_MEMORY_BUDGET_MB": "1536",
}
MIB = 2**20
RESULTS_CACHE_MB = 256  # ui.cached.results_cache
# What the wide uploads may add at their peak: they run at 192 x 192 px only, so at most the run cache (256 MB) and
# the capture cache (128 MB) fill, plus the decoded images and allocator noise; one forward at their own 1360 x 192 px
# would hold 1.0 GiB of attention alone (measured: +190 MiB after three)
REFUSED_GROWTH_MB = 512


def _png(width: int, height: int, seed: int) -> bytes:
    from vitviz.data.shapes import make_sample

    buf = io.BytesIO()
    make_sample(seed).image.resize((width, height)).save(buf, format="PNG")
    return buf.getvalue()


def _rss(sampler: Sampler) -> float:
    return sampler.sample() / MIB


def _settled_rss(sampler: Sampler, seconds: float = 3.0) -> float:
    """The server's resident memory once what is still running for the last upload has finished: the lowest of
    samples over ``seconds`` (a sample taken while a view still computes caught that view's transient arrays, and
    six such samples swung by 1.3 GB between two uploads)."""
    import time

    low, end = _rss(sampler), time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
        low = min(low, _rss(sampler))
    return low


def _upload(page, path: Path) -> None:
    bar = page.get_by_test_id("stSidebar")
    bar.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(path))
    bar.get_by_text(f"Showing {path.name}").wait_for(timeout=120_000)
    settle(page)


def _tallest_with_aspect_kept(page) -> None:
    """The sidebar's tallest input height, the image's aspect ratio kept (the box ticked until it stays ticked:
    its default follows the input size, so the height's rerun can redraw it unticked)."""
    bar = page.get_by_test_id("stSidebar")
    height = bar.get_by_test_id("stSlider").filter(has_text="Height")
    height.get_by_role("slider").press("End")
    height.get_by_test_id("stSliderThumbValue").filter(has_text=re.compile("^192$")).wait_for(timeout=60_000)
    keep = bar.get_by_test_id("stCheckbox").filter(has_text="Keep the image's aspect ratio")
    for _ in range(5):
        page.wait_for_timeout(1000)
        settle(page)
        if keep.locator("input").is_checked():
            return
        keep.locator("label").click()
    raise AssertionError("the 'Keep the image's aspect ratio' box did not stay ticked")


def _alerts(page) -> str:
    """The errors and warnings shown (the sidebar's fallback is a warning, a page's refusal an error)."""
    return " ".join(
        page.locator('[data-testid="stAlertContentError"], [data-testid="stAlertContentWarning"]').all_text_contents()
    )


def test_wide_uploads_fall_back_under_max_tokens_and_do_not_accumulate(tmp_path):
    require_chromium()
    from playwright.sync_api import sync_playwright

    # 1360 x 192 px at the tallest height (192 px, patches of 8): 24 x 170 patches, 4,081 tokens > 2,048
    refused = [tmp_path / f"wide-{k}-1360x192.png" for k in range(3)]
    # 680 x 192 px: 24 x 85 patches, 2,041 tokens, the widest accepted: each one analysed (9 uploads in all: the
    # limit is 10 a minute)
    accepted = [tmp_path / f"widest-{k}-680x192.png" for k in range(6)]
    for k, p in enumerate(refused):
        p.write_bytes(_png(1360, 192, 300 + k))
    for k, p in enumerate(accepted):
        p.write_bytes(_png(680, 192, 400 + k))

    log = open(tmp_path / "streamlit.log", "w")  # noqa: SIM115 (closed below, after the server)
    try:
        with streamlit_server(env=ENV, log=log, timeout=180) as (url, proc), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1100, "height": 800})
                page.goto(url)
                page.get_by_text("Top predictions").first.wait_for(timeout=180_000)
                _tallest_with_aspect_kept(page)
                with Sampler(proc.pid, every=0.25) as sampler:
                    start = _rss(sampler)
                    after_refused = []
                    for path in refused:
                        _upload(page, path)
                        shown = _alerts(page)
                        page.get_by_text("tokens per image").first.wait_for(timeout=60_000)
                        shown = _alerts(page)
                        assert "at most 2,048 tokens per image (its max_tokens setting)" in shown, shown
                        assert "1360 x 192 px is 4,081 tokens (24 x 170 patches)" in shown, shown
                        assert "Until then the views use 192 x 192 px" in shown, shown
                        page.get_by_text("Top predictions").first.wait_for(timeout=120_000)  # at 192 x 192 px
                        settle(page)
                        after_refused.append(_rss(sampler))
                    wide_peak = sampler.peak_rss / MIB
                    after_accepted = []
                    for path in accepted:
                        _upload(page, path)
                        page.get_by_text("Top predictions").first.wait_for(timeout=120_000)
                        settle(page)
                        for _ in range(40):  # the sidebar's rerun for the new image may still be on its way
                            if "tokens per image" not in _alerts(page):
                                break
                            page.wait_for_timeout(500)
                        assert "tokens per image" not in _alerts(page), _alerts(page)
                        box = page.get_by_test_id("stSidebar").get_by_test_id("stCheckbox")
                        assert box.filter(has_text="Keep the image's aspect ratio").locator("input").is_checked()
                        after_accepted.append(_settled_rss(sampler))
                    peak = sampler.peak_rss / MIB
                body = page.locator("body").text_content() or ""
                assert "Traceback" not in body
                assert page.locator('[data-testid="stException"]').count() == 0
            finally:
                browser.close()
    finally:
        log.close()
    server_log = (tmp_path / "streamlit.log").read_text(errors="replace")
    assert "Traceback" not in server_log, server_log[-3000:]

    caches = 2 * 256 + 128 + RESULTS_CACHE_MB  # the Runs and light sources kept, the captures, the results
    bound = start + 2 * 1536 + caches
    print(
        f"\nserver RSS (MiB): start {start:.0f}; after each wide upload {[round(v) for v in after_refused]} "
        f"(peak {wide_peak:.0f}); "
        f"after each accepted 680 x 192 upload {[round(v) for v in after_accepted]}; peak {peak:.0f}; "
        f"bound {bound:.0f}"
    )
    assert wide_peak - start <= REFUSED_GROWTH_MB, (start, wide_peak, after_refused)
    assert peak <= bound, (peak, bound)
    # six analysed wide images do not pile up: what the sixth leaves is within the caches of what the first left
    assert after_accepted[-1] - after_accepted[0] <= caches, after_accepted
