"""What the real-browser tests and the load test share: Chromium's flags, the app's server, reading Plotly figures.

Debian's Chromium driven by Playwright against ``streamlit run app.py``. The JavaScript
snippets are plain strings so that the sync helpers here (``tests/app/test_browser.py``) and the
async load generator (``benchmarks/load.py``) read the page the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# st.plotly_chart's figures and the clickable maps (ui/click_chart.py: a custom component in the page's DOM)
PLOTS = "[data-testid='stPlotlyChart'] .js-plotly-plot, .stBidiComponent .js-plotly-plot"

# Title and heatmap data of every Plotly figure on the page, read from the DOM.
PLOT_STATE_JS = f"""() => Array.from(document.querySelectorAll("{PLOTS}")).map(el => ({{
    title: (el.layout && el.layout.title && el.layout.title.text) || "",
    z: (el.data || []).filter(t => t.type === "heatmap").map(t => t.z)
}}))"""
# The bars (probabilities, labels) of the "Top predictions" figure; empty lists when it is not drawn.
BARS_JS = f"""() => {{
    const el = Array.from(document.querySelectorAll("{PLOTS}"))
        .find(el => ((el.layout.title || {{}}).text || "").includes("Top predictions"));
    return el ? {{x: el.data[0].x || [], y: el.data[0].y || []}} : {{x: [], y: []}};
}}"""
# True when no script runs for this session (Streamlit's "Running..." status widget is gone).
IDLE_JS = "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"


def require_chromium() -> None:
    """Skip the calling test module without Debian's Chromium; on CI its absence is an error."""
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("CI"):
        raise RuntimeError("CI needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
    import pytest

    pytest.skip("Debian's chromium is not installed (/usr/bin/chromium)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(
    env: Mapping[str, str] | None = None,
    log: IO | int | None = subprocess.DEVNULL,
    timeout: float = 90,
    options: Sequence[str] = (),
    cpus: set[int] | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """``streamlit run app.py`` on 127.0.0.1 (a free port, headless, no file watcher); yields (url, process).

    ``env`` is added to this process's environment; ``options`` are more ``streamlit run`` flags,
    e.g. ``["--runner.postScriptGC", "false"]``; ``cpus`` pins the server (all its threads) to those CPUs. The server runs in its own process group,
    so a Ctrl-C in the terminal reaches only the caller, and it is always stopped (its whole
    group: SIGTERM, then SIGKILL after 15 s), whatever happens in the ``with`` block.
    """
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--server.fileWatcherType",
            "none",
            *options,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {proc.returncode} before answering")
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"streamlit did not answer on {url} within {timeout:.0f} s") from None
                time.sleep(0.5)
        yield url, proc
    finally:
        stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM to the group ``proc`` leads (it was started with ``start_new_session``), SIGKILL after ``grace``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):  # the leader gone, children may remain
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def plot_state(page) -> list:
    """Title and heatmap data of every Plotly figure on the page, read from the DOM."""
    return page.evaluate(PLOT_STATE_JS)


def decode(z) -> np.ndarray:
    """A Plotly array as the browser holds it: a list, or {dtype, bdata (base64), shape}."""
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")])
    return np.array(z, dtype=float)


def wait_for_title(page, words: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for fig in plot_state(page):
            if words in fig["title"]:
                return fig
        page.wait_for_timeout(250)
    raise AssertionError(f"no figure titled with {words!r}; titles: {[f['title'] for f in plot_state(page)]}")


def settle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_function(IDLE_JS, timeout=60_000)
    page.wait_for_timeout(300)


def server_heads(page) -> None:
    """On the Heads page of a plain ViT, switch the instant (in-browser) view off for the server-drawn one."""
    toggle = page.get_by_test_id("stCheckbox").filter(has_text="Instant view")
    toggle.wait_for(timeout=60_000)
    if toggle.locator("input").is_checked():  # st.toggle: role "switch", not "checkbox"
        toggle.locator("label").click()


def open_server_heads(page, server: str, timeout: float = 120) -> None:
    """The Heads page in its server-drawn view, its main map drawn and the page settled."""
    page.goto(f"{server}/heads")
    server_heads(page)
    wait_for_title(page, "head 0: where CLS looks", timeout=timeout)
    settle(page)


def instant_state(page, timeout: float = 60) -> dict:
    """The instant head view's state (layer, head, query) from its frame, once its maps are decoded."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for frame in page.frames:
            try:
                if frame.evaluate("document.body && document.body.dataset.ready === '1'"):
                    return frame.evaluate("window.vitvizState")
            except Exception:  # a frame that is navigating or gone
                pass
        page.wait_for_timeout(200)
    raise AssertionError("the instant head view did not start")


def choose_model(page, option: str) -> None:
    """Pick ``option`` in the sidebar's model list, typing to filter it first: the dropdown draws only the
    options in view, so a long list may not have the one wanted in the DOM yet."""
    page.get_by_test_id("stSelectbox").first.click()
    page.keyboard.type(option.split(" (")[0])
    page.get_by_role("option", name=option).click()


def bars(page) -> list[float]:
    """The probabilities of the "Top predictions" bars (empty when the figure is not drawn)."""
    return [float(v) for v in decode(page.evaluate(BARS_JS)["x"])]
