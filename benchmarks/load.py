"""Load test of the app in public mode: N real browser sessions against one server, at a human pace.

    python -m benchmarks.load --sessions 16 --seconds 120 [--out FILE.json]

What it does:

* starts ``streamlit run app.py`` on 127.0.0.1 (a free port) in public mode (``VITVIZ_PUBLIC=1``,
  ``HF_HUB_OFFLINE=1``, headless, no file watcher) with the bundled ``demo`` model, warms it up with
  one visit, and always stops it (also on Ctrl-C or SIGTERM);
* drives N sessions in ONE Chromium (Playwright, one context per session). Sessions arrive at
  random times spread over the first ``--ramp`` seconds (uniform order statistics, i.e. a Poisson
  process given the count) and wait ``--think`` seconds (uniform) between actions. Each one loads
  the app, opens Heads, uploads its OWN image (a blend of two ``make_sample`` images, chosen so that
  the demo model's predictions of any two differ by at least 0.005) and then, until S seconds
  after the run started (and at least ``--min-changes`` times), changes the layer (slider keys),
  the head (a click on a tile of the head grid) or the query (a click on a cell of the large
  map); ``--uploads`` > 1 uploads further own images at random times before the deadline (at
  most 10 a minute, the server's limit). At the end it opens "Image & predictions" and compares
  the bars with vitviz's own predictions for its image;
* loading the app costs Chromium about 7 CPU seconds a page on a 2-core machine (7.7 MB of
  JavaScript to compile, three figures to draw), ten times what the server spends on it, so at
  most ``--max-loading`` pages load at once (default 2): a session waits at that gate after it
  arrives, the wait is reported, and the load time starts when its navigation starts;
* measures in the page (``performance.now()``, so the load generator's own delays do not count):
  an input event (keydown, mousedown, the file input's change) to the moment the awaited figure
  is in the DOM with new data and its heatmap drawn (a 20 ms in-page poll). The awaited figure is
  named by its exact title (e.g. "Block 2, head 1: where patch (3, 4) looks") and must differ in
  title or data from every figure of that title on the page before the action. Every head map
  drawn is also compared with the map vitviz computes for the session's own image;
* splits each redraw: input -> the rerun request leaving the page (the browser's input handling) |
  the request leaving -> the frame carrying the new figure arriving (the server: queueing in its
  event loop and the script's rerun up to that figure; measured on the browser's network thread
  via the DevTools protocol, so a busy page does not inflate it) | the rest (the browser: decoding,
  React, Plotly drawing, and waiting for a busy main thread). ``request_sent_to_script_finished``
  is the whole rerun. Changes are also split by what else happened meanwhile (uploads waiting for
  a forward pass, pages loading);
* records errors: ``stException`` elements, ``st.error`` alerts (a rate-limit message counts only if
  this script uploaded more than the limit allows), any "Traceback" or "Connection error" text
  (a MutationObserver, so short-lived ones are seen too), uncaught page errors, page crashes,
  timeouts, sessions that never loaded, and tracebacks in the server's log;
* samples every 0.5 s the resident memory of the server's process tree (and its kernel
  high-water mark at the end), and the CPU time of the server's tree, of the load generator
  (this process, Playwright's driver and Chromium) and of the whole machine (``/proc/stat``), so
  that the CPU left to the server, and what other programs took, stand beside every figure.

With ``--patching`` one more session runs exact activation patching at the widest input the limits accept
(:class:`PatchingSession`) while the others browse; the others' changes are split by whether they overlapped its
busy window, and the server's peak memory is set against a bound from its memory settings (:func:`memory_bound`);
``--server-env KEY=VALUE`` shrinks the server's settings (e.g. ``VITVIZ_PATCHING_MAX_WORK``).

For A/B runs: ``--streamlit-option runner.postScriptGC=false`` (any ``streamlit run`` option),
``--viewport 1100x800`` (Chromium's drawing cost grows with the page), and ``--server-cpus 0,1
--client-cpus 2-15`` to give the server two cores of a larger machine and the browsers the rest.

Prints a table and writes JSON (``--out``). Exit status 0 when no error was seen, every
session loaded, and every session saw its own image (every head map and the final bars).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import itertools
import json
import os
import platform
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from browser_tools import BARS_JS, CHROMIUM, FLAGS, IDLE_JS, PLOTS, decode, streamlit_server  # noqa: E402

EXAMPLES = ROOT / "assets" / "examples"
DEFAULT_IMAGE = "demo-star.png"  # what a new session shows before its upload
SERVER_ENV = {"VITVIZ_PUBLIC": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
MAP_TITLE = re.compile(r"^Block (\d+), head (\d+): (.*)$")
TITLE_IN_SPEC = re.compile(rb'"title":\{"text":"((?:[^"\\]|\\.)*)"')
TIMEOUTS = {"load": 90.0, "navigate": 45.0, "upload": 60.0, "change": 30.0}
# What bounds the server's memory (MB; the defaults where the environment does not set them): one patched batch's
# attention (or one capture's), the clean Runs and the light sources kept (each cache bounded by the run cache), the
# app's captures kept, and its results (patching grids, maps) kept.
MEMORY_SETTINGS = {
    "VITVIZ_MEMORY_BUDGET_MB": "2048",
    "VITVIZ_RUN_CACHE_MB": "2048",
    "VITVIZ_CAPTURE_CACHE_MB": "1024",
}
RESULTS_CACHE_MB = 256  # ui.cached.results_cache, fixed
UPLOAD_LIMIT_TEXT = "images in the last minute, the most this server allows"
MAP_TOLERANCE = 2e-3  # attention is stored as float16 (about 3 significant digits)


def _figure_bytes(msg, data: bytes) -> bytes:
    """Where a delta's figure titles are: the frame itself, or for a clickable map (``ui/click_chart.py``, a
    custom component) the figure's JSON, which its data holds as a string (quoted inside the data's JSON)."""
    el = msg.delta.new_element
    if el.WhichOneof("type") == "bidi_component" and el.bidi_component.component_name == "vitviz_click_chart":
        return json.loads(el.bidi_component.json)[0]["spec"].encode()
    return data


# ---------------------------------------------------------------------------------------------
# In the page: input timestamps, a watcher for the awaited figure, and an error observer.
# ---------------------------------------------------------------------------------------------
INIT_JS = """
(() => {
  if (window.__vv) return;
  const PLOTS = "__PLOTS__";
  const vv = window.__vv = {input: 0, sends: [], result: null, watch: null, timer: null,
                            errors: [], seen: {}, queue: {texts: 0, maxAhead: -1, seen: {}}};
  const titleOf = el => { const t = el.layout && el.layout.title; return ((t && (typeof t === "string" ? t : t.text)) || "").replace(/<br>/g, " ").replace(/<[^>]*>/g, ""); };
  const sig = el => titleOf(el) + "|" + JSON.stringify((el.data || []).map(t => [t.z ?? null, t.x ?? null, t.source ?? null]));
  const drawn = el => !(el.data || []).some(t => t.type === "heatmap") || !!el.querySelector(".hm image");
  // Long titles are wrapped with <br> (vitviz.figures' fit_text): compare them as one line.
  const matches = (s, t) => { t = t.replace(/<br>/g, " "); return t.startsWith(s.prefix) && (!s.exact || t === s.prefix); };
  const check = () => {
    const w = vv.watch;
    if (!w) return;
    const s = w.spec;
    if (s.sidebar) {
      const bar = document.querySelector('[data-testid="stSidebar"]');
      if (!bar || !bar.textContent.includes(s.sidebar)) return;
    }
    for (const el of document.querySelectorAll(PLOTS)) {
      const t = titleOf(el);
      if (!matches(s, t) || !drawn(el) || w.before.has(sig(el))) continue;
      const heat = (el.data || []).find(tr => tr.type === "heatmap");
      vv.result = {t: performance.now(), input: vv.input, sends: vv.sends.slice(), armed: w.armed, title: t,
                   z: heat ? heat.z : null};
      vv.watch = null; clearInterval(vv.timer); vv.timer = null;
      return;
    }
  };
  vv.arm = spec => {
    if (vv.timer) clearInterval(vv.timer);
    vv.input = 0; vv.sends = []; vv.result = null;
    const before = new Set();
    for (const el of document.querySelectorAll(PLOTS)) if (matches(spec, titleOf(el))) before.add(sig(el));
    vv.watch = {spec, before, armed: performance.now()};
    vv.timer = setInterval(check, 20);
  };
  const onInput = () => { if (vv.watch && !vv.input) vv.input = performance.now(); };
  for (const type of ["keydown", "mousedown", "change"]) addEventListener(type, onInput, true);
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (vv.watch && vv.input) vv.sends.push(performance.now());
    return send.call(this, data);
  };
  const ERR = '[data-testid="stException"], [data-testid="stAlertContentError"]';
  const INFO = '[data-testid="stAlertContentInfo"]';
  const note = (kind, text) => {
    text = (text || "").trim().slice(0, 1500);
    const key = kind + "|" + text;
    if (vv.seen[key]) return;
    vv.seen[key] = 1;
    vv.errors.push({kind, text, at_ms: performance.now()});
  };
  const queueNote = text => {
    if (!text.includes("one analysis at a time") || vv.queue.seen[text]) return;
    vv.queue.seen[text] = 1; vv.queue.texts += 1;
    const m = text.match(/(\\d+) visitors are ahead/);
    vv.queue.maxAhead = Math.max(vv.queue.maxAhead, m ? +m[1] : 0);
  };
  const kindOf = e => e.matches('[data-testid="stException"]') ? "exception" : "error";
  const scan = node => {
    if (node && node.nodeType === 3) node = node.parentElement;
    if (!node || node.nodeType !== 1) return;
    const up = node.closest(ERR);
    if (up) note(kindOf(up), up.textContent);
    for (const e of node.querySelectorAll(ERR)) note(kindOf(e), e.textContent);
    const info = node.closest(INFO);
    if (info) queueNote(info.textContent);
    for (const e of node.querySelectorAll(INFO)) queueNote(e.textContent);
    const text = node.textContent || "";
    if (text.includes("Traceback")) note("traceback", text);
    if (text.includes("Connection error")) note("connection", text);
  };
  new MutationObserver(ms => {
    for (const m of ms) {
      if (m.type === "characterData") scan(m.target);
      else for (const n of m.addedNodes) scan(n);
    }
  }).observe(document, {childList: true, subtree: true, characterData: true});
  vv.arm({prefix: "Top predictions"});  // the first page: timed from the navigation's start
})();
""".replace("__PLOTS__", PLOTS)

# Where to click: the page coordinates of point ``index`` of the figure's click targets (its scatter
# trace with customdata), after scrolling the figure into view; with that point's customdata.
POINT_JS = """([which, index]) => {
  const titleOf = el => { const t = el.layout && el.layout.title; return ((t && (typeof t === "string" ? t : t.text)) || "").replace(/<br>/g, " ").replace(/<[^>]*>/g, ""); };
  const els = Array.from(document.querySelectorAll("__PLOTS__"));
  const el = which === "grid"
    ? els.find(e => ((e.layout && e.layout.annotations) || []).some(a => a.text === "head 0"))
    : els.find(e => /^Block \\d+, head \\d+: /.test(titleOf(e)));
  if (!el || !el._fullLayout) return null;
  const trace = (el._fullData || []).find(t => t.type === "scatter" && t.customdata);
  if (!trace || index >= trace.x.length) return null;
  el.scrollIntoView({block: "center"});
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, box = el.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.l2p(trace.x[index]), y: box.top + ya._offset + ya.l2p(trace.y[index]),
          data: Array.from(trace.customdata[index]), count: trace.x.length};
}""".replace("__PLOTS__", PLOTS)
MAP_TITLE_JS = """() => Array.from(document.querySelectorAll("__PLOTS__"))
  .map(el => { const t = el.layout && el.layout.title; return ((t && (typeof t === "string" ? t : t.text)) || "").replace(/<br>/g, " ").replace(/<[^>]*>/g, ""); })
  .find(t => /^Block \\d+, head \\d+: /.test(t)) || null""".replace("__PLOTS__", PLOTS)


# ---------------------------------------------------------------------------------------------
# Images and what the demo model says about them
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    default: dict[str, float]  # predictions of the image a new session shows


@dataclass(frozen=True)
class Expected:
    """One generated image: its PNG bytes, its "Top predictions" bars, and its capture (for the maps)."""

    data: bytes
    bars: dict[str, float]  # {"circle (0)": probability, ...}
    cap: object

    def head_map(self, title: str) -> np.ndarray | None:
        """The map a Heads figure titled ``title`` must show for this image (None: a title it cannot tell)."""
        from vitviz.analysis.blocks import head_maps

        m = MAP_TITLE.match(title)
        q = re.fullmatch(r"where (CLS|patch \((\d+), (\d+)\)) looks", m[3]) if m else None
        if q is None:
            return None
        stage = self.cap.stages[0]
        token = (
            stage.prefix_kinds.index("CLS")
            if q[1] == "CLS"
            else stage.num_prefix + int(q[2]) * stage.grid[1] + int(q[3])
        )
        return head_maps(self.cap.blocks[int(m[1])], token).values[int(m[2])]


def distinct_images(count: int, *, gap: float = 0.005, seed: int = 0) -> tuple[list[Expected], Shape]:
    """``count`` PNGs with what vitviz itself computes for them (``capture(load_model("demo"), ...)``).

    Each image blends two ``make_sample`` images (different shapes, muted clutter), so the demo
    model is unsure and its probabilities vary; an image is kept only if its bars differ by at
    least ``gap`` (50 times the check's tolerance) from those of every image kept before and of
    the default image, so that a session showing another session's image (or none) cannot pass.
    """
    from PIL import Image

    from vitviz.capture.forward import capture
    from vitviz.data.images import read_image
    from vitviz.data.shapes import make_sample
    from vitviz.models.load import load_model

    model = load_model("demo", device="cpu")

    def expect(data: bytes) -> Expected:
        cap = capture(model, read_image(data).image)  # decoded as the app decodes an upload
        return Expected(data, {f"{p.label} ({p.index})": float(p.probability) for p in cap.predictions}, cap)

    default = expect((EXAMPLES / DEFAULT_IMAGE).read_bytes())
    shape = Shape(default.cap.num_blocks, default.cap.blocks[0].num_heads, default.bars)
    rng = random.Random(seed)
    kept: list[Expected] = []
    for attempt in range(50 * count + 50):
        a, b = (make_sample(100_000 + 2 * attempt + k + seed * 7919) for k in (0, 1))
        buf = io.BytesIO()
        Image.blend(a.image, b.image, rng.uniform(0.42, 0.58)).save(buf, format="PNG")
        candidate = expect(buf.getvalue())
        if all(_distance(candidate.bars, other.bars) >= gap for other in [default, *kept]):
            kept.append(candidate)
            if len(kept) == count:
                return kept, shape
    raise RuntimeError(f"could not find {count} images whose predictions differ by {gap}")


def _distance(a: dict[str, float], b: dict[str, float]) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def _matches(seen: dict[str, float], expected: dict[str, float], tol: float = 1e-4) -> bool:
    return bool(seen) and set(seen) == set(expected) and _distance(seen, expected) <= tol


# ---------------------------------------------------------------------------------------------
# Processes: memory of the server's tree, CPU of the server, of the load generator, of the machine
# ---------------------------------------------------------------------------------------------
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, CPU ticks user + system, resident pages) for every process now."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                text = fh.read().decode(errors="replace")
        except OSError:
            continue
        rest = text[text.rfind(")") + 2 :].split()
        table[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[21]))
    return table


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = values
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def _descendants(table: dict[int, tuple[int, int, int]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, []))
    return out


class Sampler:
    """A thread reading /proc every ``every`` seconds: the server tree's RSS, and CPU ticks per tree.

    A process belongs to the tree it was first seen in ("server": the server and its children;
    "load": this process and its other descendants, i.e. Playwright's driver and Chromium); the
    load generator's CPU is also split into this Python process, the driver (node) and Chromium.
    CPU of a process that ended between two samples is lost for at most one interval.
    """

    def __init__(self, server_pid: int, every: float = 0.5) -> None:
        self.server_pid, self.me, self.every = server_pid, os.getpid(), every
        self.owner: dict[int, str] = {}
        self.ticks: dict[int, int] = {}
        self.peak_rss = 0
        self.series: list[tuple[float, float]] = []  # (s since start, server RSS MiB)
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_point = -1e9
        while not self._stop.wait(self.every):
            rss = self.sample()
            now = time.monotonic() - self.t0
            if now - last_point >= 2.0:
                self.series.append((round(now, 1), round(rss / 2**20, 1)))
                last_point = now

    def sample(self) -> int:
        table = _proc_table()
        server = _descendants(table, self.server_pid)
        load = _descendants(table, self.me) - server
        with self._lock:
            for pid in server | load:
                if pid not in self.owner:
                    self.owner[pid] = "server" if pid in server else self._part(pid)
                self.ticks[pid] = max(self.ticks.get(pid, 0), table[pid][1])
        rss = sum(table[p][2] for p in server) * PAGE
        self.peak_rss = max(self.peak_rss, rss)
        return rss

    def _part(self, pid: int) -> str:
        if pid == self.me:
            return "load:python"
        try:
            with open(f"/proc/{pid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            name = ""
        return "load:driver" if name.startswith("node") else "load:chromium"

    def cpu(self) -> dict[str, float]:
        """Cumulative CPU seconds per tree (and per part of the load generator) and of the machine."""
        with self._lock:
            out = {"server": 0.0, "load": 0.0, "load:python": 0.0, "load:driver": 0.0, "load:chromium": 0.0}
            for pid, ticks in self.ticks.items():
                owner = self.owner[pid]
                out[owner] += ticks / CLK
                if owner != "server":
                    out["load"] += ticks / CLK
        busy, total = _machine_ticks()
        out["machine_busy"], out["machine_total"] = busy / CLK, total / CLK
        return out

    def server_hwm(self) -> int | None:
        """The kernel's high-water mark of the server process's RSS (bytes), while it runs."""
        try:
            with open(f"/proc/{self.server_pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None


# ---------------------------------------------------------------------------------------------
# One browser session
# ---------------------------------------------------------------------------------------------
class StepFailed(Exception):
    pass


@dataclass
class Step:
    """One measured wait: the page loading, a navigation, an upload, or a change on Heads."""

    kind: str  # load | navigate | upload | layer | head | patch
    at_s: float  # since the run started
    title: str  # the figure awaited
    total_s: float | None = None  # input event -> figure drawn (page clock); None: never
    to_send_s: float | None = None  # input event -> the rerun request sent (page clock)
    server_s: float | None = None  # request sent -> frame with the figure received (network clock)
    rerun_s: float | None = None  # request sent -> script_finished received (network clock)
    own_map: bool | None = None  # the map drawn is this session's image's (None: not a head map)
    map_diff: float | None = None  # largest difference from the expected map
    uploads_elsewhere: int = 0  # other sessions waiting for an upload's first map when this began
    loading_elsewhere: int = 0  # other sessions loading the app (in the browser: ~7 CPU s each) when this began
    sent_from: int = 0  # index into the session's sent-frame log when the action began
    sends: list[float] = field(default_factory=list)  # page clock, s after the input: each frame sent
    ok: bool = False

    @property
    def browser_s(self) -> float | None:
        if self.total_s is None or self.server_s is None or self.to_send_s is None:
            return None
        return max(0.0, self.total_s - self.to_send_s - self.server_s)


class Run:
    """State shared by the sessions of one run."""

    def __init__(self, args: argparse.Namespace, url: str, shape: Shape, images: list[list[Expected]]) -> None:
        self.args, self.url, self.shape, self.images = args, url, shape, images
        self.t0 = time.monotonic()
        self.uploading: set[int] = set()  # sessions waiting for an upload's first map
        self.loading: set[int] = set()  # sessions whose page is loading (past the gate, first page not drawn)
        self.gate = asyncio.Semaphore(args.max_loading) if args.max_loading else None
        # With a patching session: each other session's changes so far, and at the patching's end; the others go on
        # until they have made ``min_changes`` more after it (changes before, during and after it, in one run).
        self.changes: dict[int, int] = {}
        self.patching_over: dict[int, int] | None = None if getattr(args, "patching", False) else {}

    def may_stop(self, index: int, changes: int) -> bool:
        """Whether a session past its deadline with ``changes`` made may stop (see ``patching_over``)."""
        if self.patching_over is None:
            return False
        return changes - self.patching_over.get(index, 0) >= self.args.min_changes

    def now(self) -> float:
        return time.monotonic() - self.t0


class Session:
    def __init__(self, run: Run, index: int, files: list[Path], arrive_s: float):
        self.run, self.index, self.files, self.arrive_s = run, index, files, arrive_s
        self.mine: list[Expected] = run.images[index]
        self.rng = random.Random(run.args.seed * 1000 + index)
        self.steps: list[Step] = []
        self.errors: list[dict] = []
        self.warnings: list[str] = []
        self.checks: list[dict] = []
        self.loaded = False
        self.finished = False
        self.uploads = 0
        self.gate_wait_s: float | None = None  # arrival -> its page load began (see --max-loading)
        self.shown = -1  # which of this session's images is on screen (-1: the default image)
        self.queue: dict = {}
        self.sent: list[tuple[float, str]] = []  # (network clock s, BackMsg type)
        self.recv: list[tuple[float, str, tuple[str, ...]]] = []  # (network clock s, ForwardMsg type, titles)
        self._by_hash: dict[str, tuple[str, ...]] = {}
        self.page = None

    # -- frames on the wire (DevTools protocol), decoded with Streamlit's own protobufs ----------
    def _on_sent(self, params: dict) -> None:
        from streamlit.proto.BackMsg_pb2 import BackMsg

        frame = params.get("response", {})
        if frame.get("opcode") != 2:
            return
        with contextlib.suppress(Exception):
            msg = BackMsg.FromString(base64.b64decode(frame["payloadData"]))
            self.sent.append((float(params["timestamp"]), msg.WhichOneof("type") or ""))

    def _on_recv(self, params: dict) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        frame = params.get("response", {})
        if frame.get("opcode") != 2:
            return
        with contextlib.suppress(Exception):
            data = base64.b64decode(frame["payloadData"])
            msg = ForwardMsg.FromString(data)
            kind = msg.WhichOneof("type") or ""
            if kind == "ref_hash":  # a message the browser already holds: the server sends its hash only
                titles = self._by_hash.get(msg.ref_hash, ())
            else:
                found = TITLE_IN_SPEC.findall(_figure_bytes(msg, data)) if kind == "delta" else []
                titles = tuple(t.decode(errors="replace") for t in found)
                if msg.hash and titles:
                    self._by_hash[msg.hash] = titles
            self.recv.append((float(params["timestamp"]), kind, titles))

    def _error(self, kind: str, text: str) -> None:
        self.errors.append({"session": self.index, "at_s": round(self.run.now(), 2), "kind": kind, "text": text[:2000]})

    # -- the session's life --------------------------------------------------------------------
    async def main(self, browser, deadline: float) -> None:
        await asyncio.sleep(max(0.0, self.arrive_s - self.run.now()))
        context = await browser.new_context(viewport=self.run.args.viewport)
        try:
            await context.add_init_script(INIT_JS)
            page = self.page = await context.new_page()
            page.set_default_timeout(60_000)
            page.on("pageerror", lambda exc: self._error("page_error", str(exc)))
            page.on("crash", lambda _: self._error("crash", "the page crashed"))
            page.on("console", lambda m: m.type == "error" and self.warnings.append(m.text[:300]))
            page.on("requestfailed", lambda r: self.warnings.append(f"request failed: {r.url[:200]} ({r.failure})"))
            cdp = await context.new_cdp_session(page)
            cdp.on("Network.webSocketFrameSent", self._on_sent)
            cdp.on("Network.webSocketFrameReceived", self._on_recv)
            await cdp.send("Network.enable")
            await self._life(page, deadline)
            self.finished = True
        except StepFailed as exc:
            self._error("gave_up", str(exc))
        except asyncio.CancelledError:
            self._error("unfinished", "the session was still running when the run's time limit came")
            raise
        except Exception as exc:  # a failure of the driver itself: recorded, the other sessions go on
            self._error("driver", f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                await self._collect_page_errors()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(context.close(), 30)

    async def _life(self, page, deadline: float) -> None:
        arrived = self.run.now()
        async with self.run.gate or contextlib.nullcontext():  # at most --max-loading pages load at once
            self.gate_wait_s = self.run.now() - arrived
            self.run.loading.add(self.index)
            step = Step("load", round(self.run.now(), 2), "Top predictions")
            step.loading_elsewhere = len(self.run.loading - {self.index})
            self.steps.append(step)
            try:
                await page.goto(self.run.url, wait_until="commit", timeout=TIMEOUTS["load"] * 1000)
                res = await self._result(page, TIMEOUTS["load"])
            except Exception as exc:
                msg = f"the app did not draw its first page within {TIMEOUTS['load']:.0f} s ({exc})"
                self._error("never_loaded", msg)
                raise StepFailed("never loaded") from None
            finally:
                self.run.loading.discard(self.index)
        step.total_s, step.title, step.ok = res["t"] / 1000, res["title"], True  # since the navigation started
        self.loaded = True
        await self._settle(page)
        await self._think()
        await self._server_heads(page)
        await self._think()
        await self._upload(page)  # the first map of its own image
        later = sorted(self.rng.uniform(self.run.now(), deadline) for _ in range(self.run.args.uploads - 1))
        failures = changes = 0
        while True:
            await self._think()
            if (
                self.run.now() >= deadline
                and changes >= self.run.args.min_changes
                and self.run.may_stop(self.index, changes)
            ):
                break
            try:
                if later and self.run.now() >= later[0]:
                    later.pop(0)
                    await self._upload(page)
                else:
                    kind = self.rng.choices(("layer", "head", "patch"), weights=self.run.args.actions)[0]
                    await getattr(self, f"_{kind}")(page)
                    changes += 1
                    self.run.changes[self.index] = changes
                failures = 0
            except StepFailed:
                failures += 1
                if failures >= 3:
                    raise StepFailed("three actions in a row got no redraw; the session stops") from None
        await self._check(page)

    async def _think(self) -> None:
        await asyncio.sleep(self.rng.uniform(*self.run.args.think))

    async def _settle(self, page) -> None:
        with contextlib.suppress(Exception):
            await page.wait_for_function(IDLE_JS, timeout=30_000, polling=100)

    async def _result(self, page, timeout: float) -> dict:
        handle = await page.wait_for_function(
            "() => window.__vv && window.__vv.result", timeout=timeout * 1000, polling=100
        )
        return await handle.json_value()

    async def _measure(self, page, kind: str, spec: dict, act, timeout: float, image: int | None = None) -> Step:
        """Arm the in-page watcher for ``spec``, ``act()``, wait for the figure; record the step.

        ``image``: which of this session's images the figure must show (default: the one shown).
        """
        step = Step(kind, round(self.run.now(), 2), spec["prefix"])
        step.uploads_elsewhere = len(self.run.uploading - {self.index})
        step.loading_elsewhere = len(self.run.loading - {self.index})
        step.sent_from = len(self.sent)
        await page.evaluate("s => window.__vv.arm(s)", spec)
        self.steps.append(step)
        try:
            await act()
            res = await self._result(page, timeout)
        except Exception as exc:
            self._error(
                "no_redraw",
                f"{kind}: no figure {spec['prefix']!r} within {timeout:.0f} s ({type(exc).__name__}); "
                f"figures now: {await self._titles(page)}",
            )
            await self._settle(page)
            raise StepFailed(kind) from None
        start = res["input"] or res["armed"]
        step.total_s = (res["t"] - start) / 1000
        step.sends = [round((t - start) / 1000, 4) for t in res["sends"]]
        step.title, step.ok = res["title"], True
        shown = self.shown if image is None else image
        if res.get("z") is not None and shown >= 0:
            want = self.mine[shown].head_map(step.title)
            if want is not None:
                got = decode(res["z"]).astype(np.float64)
                step.map_diff = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
                step.own_map = step.map_diff <= MAP_TOLERANCE
                if not step.own_map:
                    self._error(
                        "wrong_map", f"{kind}: {step.title!r} differs from this session's image by {step.map_diff:.3g}"
                    )
        await self._settle(page)
        return step

    async def _titles(self, page) -> list[str]:
        with contextlib.suppress(Exception):
            return await page.evaluate(
                f"""() => Array.from(document.querySelectorAll("{PLOTS}"))
                    .map(el => (((el.layout || {{}}).title || {{}}).text || "").replace(/<br>/g, " ").replace(/<[^>]*>/g, ""))"""
            )
        return []

    async def _server_heads(self, page) -> None:
        """Open Heads and switch its instant view off: its layer, head and query changes never reach the
        server (``python -m benchmarks.headview`` times them in the browser), so the load comes from the
        server-drawn view. The measured navigation is the switch to it."""
        await page.get_by_role("link", name="Heads").click()
        toggle = page.get_by_test_id("stCheckbox").filter(has_text="Instant view")
        await toggle.wait_for(timeout=TIMEOUTS["navigate"] * 1000)
        await self._measure(page, "navigate", {"prefix": "Block "}, toggle.locator("label").click, TIMEOUTS["navigate"])

    async def _navigate(self, page, link: str, prefix: str) -> None:
        click = page.get_by_role("link", name=link).click
        await self._measure(page, "navigate", {"prefix": prefix}, click, TIMEOUTS["navigate"])

    async def _map_title(self, page) -> tuple[int, int, str]:
        title = await page.evaluate(MAP_TITLE_JS)
        m = MAP_TITLE.match(title or "")
        if not m:
            self._error("no_map", f"the Heads page shows no head map; figures: {await self._titles(page)}")
            raise StepFailed("no head map")
        return int(m[1]), int(m[2]), m[3]

    async def _upload(self, page) -> None:
        k = self.uploads % len(self.files)
        path = self.files[k]
        layer, head, _ = await self._map_title(page)
        title = f"Block {layer}, head {head}: where CLS looks"  # a new image resets the query to CLS
        self.run.uploading.add(self.index)
        try:
            step = await self._measure(
                page,
                "upload",
                {"prefix": title, "exact": True, "sidebar": f"Showing {path.name}"},
                lambda: page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(path)),
                TIMEOUTS["upload"],
                image=k,
            )
        finally:
            self.run.uploading.discard(self.index)
            self.uploads += 1
        self.shown = k if step.ok else self.shown

    async def _layer(self, page) -> None:
        layer, head, what = await self._map_title(page)
        last = self.run.shape.layers - 1
        target = layer + self.rng.choice([d for d in (-1, 1) if 0 <= layer + d <= last])
        slider = page.get_by_test_id("stSlider").filter(has_text="Block").get_by_role("slider")
        key = "ArrowRight" if target > layer else "ArrowLeft"
        await self._measure(
            page,
            "layer",
            {"prefix": f"Block {target}, head {head}: {what}", "exact": True},
            lambda: slider.press(key),
            TIMEOUTS["change"],
        )

    async def _click_point(self, page, which: str, index: int) -> dict:
        point = await page.evaluate(POINT_JS, [which, index])
        if point is None:
            self._error(
                "no_target", f"no click target {index} on the {which} figure; figures: {await self._titles(page)}"
            )
            raise StepFailed("no click target")
        return point

    async def _head(self, page) -> None:
        layer, head, what = await self._map_title(page)
        target = self.rng.choice([h for h in range(self.run.shape.heads) if h != head])
        point = await self._click_point(page, "grid", target)
        await self._measure(
            page,
            "head",
            {"prefix": f"Block {layer}, head {target}: {what}", "exact": True},
            lambda: page.mouse.click(point["x"], point["y"]),
            TIMEOUTS["change"],
        )

    async def _patch(self, page) -> None:
        layer, head, what = await self._map_title(page)
        count = (await self._click_point(page, "map", 0))["count"]
        while True:  # a cell other than the current query
            point = await self._click_point(page, "map", self.rng.randrange(count))
            where = f"where patch ({int(point['data'][1])}, {int(point['data'][2])}) looks"
            if where != what:
                break
        await self._measure(
            page,
            "patch",
            {"prefix": f"Block {layer}, head {head}: {where}", "exact": True},
            lambda: page.mouse.click(point["x"], point["y"]),
            TIMEOUTS["change"],
        )

    async def _check(self, page) -> None:
        """Open "Image & predictions" and compare its bars with those of this session's own image."""
        own = self.mine[self.shown].bars if self.shown >= 0 else self.run.shape.default
        try:
            await self._navigate(page, "Image & predictions", "Top predictions")
        except StepFailed:
            self.checks.append({"ok": False, "seen": None, "note": "the page did not open"})
            return
        deadline = time.monotonic() + 10
        while True:
            raw = await page.evaluate(BARS_JS)
            seen = {str(y): float(x) for x, y in zip(decode(raw["x"]), raw["y"], strict=False)}
            if _matches(seen, own) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        others = [
            i for i, imgs in enumerate(self.run.images) if i != self.index and any(_matches(seen, e.bars) for e in imgs)
        ]
        self.checks.append(
            {
                "ok": self.shown >= 0 and _matches(seen, own),
                "image": self.files[self.shown].name if self.shown >= 0 else DEFAULT_IMAGE,
                "seen": seen,
                "expected": own,
                "matches_other_sessions": others,
            }
        )

    async def _collect_page_errors(self) -> None:
        page = self.page
        if page is None or page.is_closed():
            return
        got = await asyncio.wait_for(
            page.evaluate("() => window.__vv && {errors: window.__vv.errors, queue: window.__vv.queue}"), 10
        )
        if not got:
            return
        q = got["queue"]
        self.queue = {"notes": q["texts"], "max_ahead": q["maxAhead"] if q["maxAhead"] >= 0 else None}
        limit = self.run.args.uploads_per_minute
        for e in got["errors"]:
            expected = UPLOAD_LIMIT_TEXT in e["text"] and limit and self.uploads > limit
            if not expected:
                self._error(e["kind"], e["text"])

    @property
    def correct(self) -> bool:
        """Its predictions checked at the end, and every head map drawn, were its own image's."""
        return (
            bool(self.checks)
            and all(c["ok"] for c in self.checks)
            and not any(st.own_map is False for st in self.steps)
        )

    # -- after the run: split each step with the frames it caused --------------------------------
    def attribute_frames(self) -> None:
        if not self.steps:  # a session that never got to act (its page did not load): nothing to split
            return
        bounds = [st.sent_from for st in self.steps[1:]] + [len(self.sent)]
        for step, stop in zip(self.steps, bounds, strict=True):
            if not step.ok or step.kind == "load":
                continue
            mine = self.sent[step.sent_from : stop]
            j = next((i for i, (_, kind) in enumerate(mine) if kind == "rerun_script"), None)
            if j is None:
                continue
            sent = mine[j][0]
            if j < len(step.sends):  # the page saw the same frames leave, in the same order
                step.to_send_s = step.sends[j]
            fig = next((t for t, _, titles in self.recv if t >= sent and step.title in titles), None)
            fin = next((t for t, kind, _ in self.recv if t >= sent and kind == "script_finished"), None)
            step.server_s = None if fig is None else fig - sent
            step.rerun_s = None if fin is None else fin - sent


# ---------------------------------------------------------------------------------------------
# The patching session: exact activation patching at the widest input the limits accept
# ---------------------------------------------------------------------------------------------
def widest_input(max_tokens: int, budget_bytes: int) -> tuple[int, int]:
    """(height, width) in px of the largest input public mode lets the demo model run with the aspect ratio kept:
    the tallest height the sidebar offers (:func:`~vitviz.capture.forward.offered_heights`, as ``app.py``'s
    ``size_ui``) and the widest width (whole patches) whose tokens stay within ``max_tokens`` and whose attention
    passes the budget check the sidebar makes. An image of exactly that many pixels is kept at that size."""
    from vitviz.capture.forward import check_budget, offered_heights, token_layout
    from vitviz.errors import VitvizError
    from vitviz.models.load import load_model

    model = load_model("demo", device="cpu")
    p = model.patch_size
    height = offered_heights(model)[-1]
    width = p
    while True:
        wider = width + p
        kinds, (gh, gw) = token_layout(model, (height, wider))
        if max_tokens and len(kinds) + gh * gw > max_tokens:
            break
        try:
            check_budget(model, (height, wider), batch=1, gradients=False, budget=budget_bytes)
        except VitvizError:
            break
        width = wider
    return height, width


def patching_cells(height: int, width: int) -> int:
    """Cells of the demo model's exact grids at that input: (block, token) residual cells and (block, head) cells."""
    from vitviz.capture.forward import token_layout
    from vitviz.models.load import load_model

    model = load_model("demo", device="cpu")
    kinds, (gh, gw) = token_layout(model, (height, width))
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    return layers * (len(kinds) + gh * gw) + layers * heads


class PatchingSession(Session):
    """A session that uploads an image of the widest input the limits accept, picks the tallest input size with
    the aspect ratio kept, opens Activation patching and asks for the exact grids once. Its busy window, from the
    upload to the exact grids (or the cap's note) drawn, is what the other sessions' changes are split by."""

    CAP_TEXT = "bound on one request's work"
    DONE_TEXT = "Exact grids, kept"

    def __init__(self, run: Run, index: int, path: Path, arrive_s: float, size: tuple[int, int]):
        self.run, self.index, self.files, self.arrive_s = run, index, [path], arrive_s
        self.mine = []
        self.rng = random.Random(run.args.seed * 1000 + index)
        self.steps, self.errors, self.warnings, self.checks = [], [], [], []
        self.loaded = self.finished = False
        self.uploads, self.gate_wait_s, self.shown, self.queue = 0, None, -1, {}
        self.sent, self.recv, self._by_hash, self.page = [], [], {}, None
        self.size = size
        self.times: dict[str, float] = {}  # s since the run started: upload, estimate_drawn, exact_clicked, exact_drawn
        self.note = ""  # the cap's note, or the exact grids' caption

    def _mark(self, name: str) -> None:
        self.times[name] = round(self.run.now(), 2)

    async def _text(self, page, text: str, timeout: float) -> None:
        await page.get_by_text(text).first.wait_for(timeout=timeout * 1000)

    async def _life(self, page, deadline: float) -> None:
        try:
            await self._load_and_patch(page)
        finally:  # the others now make their changes "after" (also when this session failed)
            self.run.patching_over = dict(self.run.changes)

    async def _load_and_patch(self, page) -> None:
        async with self.run.gate or contextlib.nullcontext():
            self.gate_wait_s = self.run.now()
            try:
                await page.goto(self.run.url, wait_until="commit", timeout=TIMEOUTS["load"] * 1000)
                await self._result(page, TIMEOUTS["load"])
            except Exception as exc:
                self._error("never_loaded", f"the app did not draw its first page ({exc})")
                raise StepFailed("never loaded") from None
        self.loaded = True
        await self._settle(page)
        await self._patch_once(page)

    async def _patch_once(self, page) -> None:
        # Its busy window starts once every other session has made ``patching_after`` changes (or 90 s past the
        # others' deadline, should one of them be stuck)
        want, others = self.run.args.patching_after, self.run.args.sessions
        while self.run.now() < self.run.args.seconds + 90 and (
            len(self.run.changes) < others or min(self.run.changes.values()) < want
        ):
            await asyncio.sleep(0.25)
        path = self.files[0]
        self._mark("upload")
        bar = page.get_by_test_id("stSidebar")
        await bar.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(path))
        self.uploads += 1
        await self._text(bar, f"Showing {path.name}", TIMEOUTS["upload"])
        await self._settle(page)
        height = bar.get_by_test_id("stSlider").filter(has_text="Height")
        await height.get_by_role("slider").press("End")  # the tallest height offered
        thumb = height.get_by_test_id("stSliderThumbValue").filter(has_text=re.compile(f"^{self.size[0]}$"))
        await thumb.wait_for(timeout=TIMEOUTS["change"] * 1000)
        # The box's default follows the input size, so a rerun still on its way (the height's) can redraw it
        # unticked: tick it until it stays ticked.
        keep = bar.get_by_test_id("stCheckbox").filter(has_text="Keep the image's aspect ratio")
        for _ in range(5):
            await asyncio.sleep(1.0)
            await self._settle(page)
            if await keep.locator("input").is_checked():
                break
            await keep.locator("label").click()
        else:
            self._error("patching", "the 'Keep the image's aspect ratio' box did not stay ticked")
            raise StepFailed("patching")
        await page.get_by_role("link", name="Activation patching").click()
        exact = page.get_by_role("button", name="Compute exact patching")
        try:
            await exact.wait_for(timeout=180_000)  # the estimate: one forward and one backward of each image
            self._mark("estimate_drawn")
            await exact.click()
            self._mark("exact_clicked")
            await self._text(page, self.DONE_TEXT, 300)  # the caption over the exact grids: finished or capped
            self._mark("exact_drawn")
            await self._settle(page)
            cap = page.get_by_text(self.CAP_TEXT)
            found = await cap.count()
            self.note = (await cap.first.text_content() or "").strip() if found else self.DONE_TEXT
        except Exception as exc:
            self._error("patching", f"the exact patching grids did not come ({type(exc).__name__}: {exc})")
            raise StepFailed("patching") from None

    @property
    def window(self) -> tuple[float, float] | None:
        """(start, end) s of its busy window: from the wide upload to the exact grids drawn."""
        if "upload" not in self.times:
            return None
        return self.times["upload"], self.times.get("exact_drawn", self.run.now())

    def summary(self, height: int, width: int) -> dict:
        cells = patching_cells(height, width)
        m = re.search(r"Stopped after ([\d,]+) of ([\d,]+) patched runs", self.note)
        t = self.times
        return {
            "input_px": {"height": height, "width": width},
            "cells_expected": cells,
            "note": self.note,
            "capped": self.CAP_TEXT in self.note,
            "cells_done": int(m[1].replace(",", "")) if m else None,
            "cells_total": int(m[2].replace(",", "")) if m else None,
            "times_s": t,
            "estimate_s": round(t["estimate_drawn"] - t["upload"], 2) if "estimate_drawn" in t else None,
            "exact_s": round(t["exact_drawn"] - t["exact_clicked"], 2) if "exact_drawn" in t else None,
            "window_s": list(self.window) if self.window else None,
            "finished": self.finished,
            "errors": self.errors,
        }


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
async def warm_up(browser, url: str, viewport: dict) -> dict:
    """One visit before the measured run (the first script run loads the model and leaves folder mode)."""
    context = await browser.new_context(viewport=viewport)
    t = time.monotonic()
    try:
        page = await context.new_page()
        await page.goto(url)
        await page.wait_for_selector("text=Top predictions", timeout=120_000)
        first = time.monotonic() - t
        await page.get_by_role("link", name="Heads").click()  # the instant view by default, else the server's
        await page.wait_for_selector("text=/Instant view|Head shown large/", timeout=120_000)
        return {"first_page_s": round(first, 2), "heads_s": round(time.monotonic() - t - first, 2)}
    finally:
        with contextlib.suppress(Exception):  # e.g. the browser already gone after a Ctrl-C
            await context.close()


def prepare_images(args: argparse.Namespace, folder: Path) -> tuple[list[list[Path]], list[list[Expected]], Shape]:
    """Each session's images as files ``load-<session>-<k>.png`` in ``folder``, with what vitviz expects of them."""
    n, k = args.sessions, args.uploads
    made, shape = distinct_images(n * k, seed=args.seed)
    images = [made[i * k : (i + 1) * k] for i in range(n)]
    files = [[folder / f"load-{i:02d}-{j}.png" for j in range(k)] for i in range(n)]
    for i, j in itertools.product(range(n), range(k)):
        files[i][j].write_bytes(images[i][j].data)
    return files, images, shape


async def drive(args: argparse.Namespace, url: str, folder: Path, sampler: Sampler, say) -> dict:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            # The server's first run (model load) and this process's images (torch) overlap.
            prepared = asyncio.create_task(asyncio.to_thread(prepare_images, args, folder))
            warm = await warm_up(browser, url, args.viewport)
            files, images, shape = await prepared
            say(f"warm-up {warm}; {args.sessions * args.uploads} distinct images; {args.sessions} sessions ...")
            run = Run(args, url, shape, images)
            rng = random.Random(args.seed)
            arrivals = sorted(rng.uniform(0, args.ramp) for _ in range(args.sessions))
            sessions = [Session(run, i, files[i], arrivals[i]) for i in range(args.sessions)]
            patcher = None
            if args.patching:
                wide = write_wide_image(folder, args.patching_size)
                patcher = PatchingSession(run, args.sessions, wide, args.patching_at, args.patching_size)
            rss0 = sampler.sample()
            cpu0 = sampler.cpu()
            run.t0 = time.monotonic()
            tasks = [asyncio.create_task(s.main(browser, args.seconds)) for s in [*sessions, *filter(None, [patcher])]]
            _, pending = await asyncio.wait(tasks, timeout=args.seconds + args.grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            wall = run.now()
            rss1 = sampler.sample()
            cpu1 = sampler.cpu()
            version = browser.version
        finally:
            with contextlib.suppress(Exception):
                await browser.close()
    for s in sessions:
        s.attribute_frames()
    return {
        "warm_up": warm,
        "sessions": sessions,
        "patcher": patcher,
        "wall_s": wall,
        "cpu": {k: cpu1[k] - cpu0[k] for k in cpu0},
        "rss_start": rss0,
        "rss_end": rss1,
        "chromium": version,
    }


def write_wide_image(folder: Path, size: tuple[int, int]) -> Path:
    """A PNG of exactly ``size`` = (height, width) px (a sample image stretched), so that keeping its aspect ratio at
    that height gives that width."""
    from vitviz.data.shapes import make_sample

    path = folder / f"wide-{size[1]}x{size[0]}.png"
    make_sample(7).image.resize((size[1], size[0])).save(path)
    return path


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def _summary(values: list[float]) -> dict:
    return {"n": len(values), "p50": _pct(values, 50), "p95": _pct(values, 95), "max": _pct(values, 100)}


def _server_log_errors(path: Path) -> list[dict]:
    text = path.read_text(errors="replace") if path.exists() else ""
    out = []
    for m in re.finditer(r"Traceback \(most recent call last\):.*?(?=\n\S|\Z)", text, flags=re.S):
        block = text[max(0, m.start() - 300) : m.end() + 300]
        out.append({"session": None, "at_s": None, "kind": "server_log", "text": block[:2000]})
    return out


def machine_info() -> dict:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        mem = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal")), 0)
    import streamlit

    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_GiB": round(mem / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "streamlit": streamlit.__version__,
        "loadavg_before": os.getloadavg(),
    }


def run_load(
    sessions: int = 16,
    seconds: float = 120,
    *,
    ramp: float | None = None,
    think: tuple[float, float] = (1.5, 4.0),
    uploads: int = 1,
    min_changes: int = 0,
    max_loading: int = 2,
    seed: int = 0,
    grace: float = 150,
    options: Sequence[str] = (),
    server_cpus: set[int] | None = None,
    client_cpus: set[int] | None = None,
    viewport: tuple[int, int] = (1500, 1100),
    log: Path | None = None,
    quiet: bool = False,
    patching: bool = False,
    patching_at: float | None = None,
    patching_after: int = 3,
    actions: tuple[float, float, float] = (0.4, 0.3, 0.3),
    server_env: Mapping[str, str] | None = None,
) -> dict:
    """Run the load test; returns the JSON-ready result (see the module docstring).

    ``options``: ``KEY=VALUE`` Streamlit options for the server, e.g. ``runner.postScriptGC=false``.
    ``server_cpus`` / ``client_cpus`` pin the server / this process, Playwright's driver and Chromium
    to those CPUs (e.g. the server on 2 cores of a larger machine, the browsers on the others).
    ``patching``: one more session runs exact activation patching at the widest input the limits accept
    (:class:`PatchingSession`), arriving ``patching_at`` s after the start (default 0: its page loads with the
    others'); its busy window begins once every other session has made ``patching_after`` changes, and the others
    go on (past ``seconds`` if need be) until they have made ``min_changes`` more after it ended; their changes are
    split by whether they overlapped that window. ``actions``: the weights of a layer, a head and a query
    change. ``server_env``: more
    environment for the server (e.g. ``VITVIZ_PATCHING_MAX_WORK``, ``VITVIZ_MEMORY_BUDGET_MB``).
    """
    from vitviz.serve import load_settings

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"the load test needs Debian's Chromium at {CHROMIUM}")
    env = {**SERVER_ENV, **(server_env or {})}
    settings = load_settings({**os.environ, **env}, folder=ROOT)
    memory = {k: float(env.get(k, os.environ.get(k, d))) for k, d in MEMORY_SETTINGS.items()}
    args = argparse.Namespace(
        sessions=sessions,
        seconds=seconds,
        ramp=ramp if ramp is not None else min(0.3 * seconds, 60),
        think=think,
        uploads=uploads,
        min_changes=min_changes,
        max_loading=max_loading,
        seed=seed,
        grace=grace,
        options=options,
        server_cpus=server_cpus,
        client_cpus=client_cpus,
        viewport={"width": viewport[0], "height": viewport[1]},
        uploads_per_minute=settings.uploads_per_minute,
        patching=patching,
        patching_at=patching_at if patching_at is not None else 0.0,
        patching_after=patching_after,
        actions=actions,
        patching_size=widest_input(settings.max_tokens, int(memory["VITVIZ_MEMORY_BUDGET_MB"] * 2**20))
        if patching
        else None,
        patching_max_work=settings.patching_max_work,
        memory_settings_MB=memory,
    )
    if settings.uploads_per_minute and uploads > settings.uploads_per_minute:
        raise ValueError(
            f"{uploads} uploads per session would pass the server's {settings.uploads_per_minute} per minute"
        )
    flags = [part for opt in options for part in (f"--{opt.split('=', 1)[0]}", opt.split("=", 1)[1])]
    log = log or ROOT / "test-output" / "load-streamlit.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    info = machine_info()
    started = time.monotonic()
    with (
        open(log, "w") as log_file,
        tempfile.TemporaryDirectory(prefix="vitviz-load-") as tmp,
        streamlit_server(env=env, log=log_file, timeout=180, options=flags, cpus=server_cpus) as (url, proc),
        _pinned(client_cpus),
        Sampler(proc.pid) as sampler,
    ):
        say(f"server {url} (pid {proc.pid}); {settings.describe()}")
        out = asyncio.run(drive(args, url, Path(tmp), sampler, say))
        hwm = sampler.server_hwm()
        peak, series = sampler.peak_rss, sampler.series
    info["loadavg_after"] = os.getloadavg()
    result = report(args, out, settings.describe(), info, peak, hwm, series, log)
    result["total_s"] = round(time.monotonic() - started, 1)
    return result


@contextlib.contextmanager
def _pinned(cpus: set[int] | None):
    """This process (and what it starts meanwhile: Playwright's driver, Chromium) on ``cpus``, then as before."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def parse_cpus(text: str) -> set[int]:
    """``"0,1"`` or ``"2-15"`` (as taskset -c) -> a set of CPU numbers."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def report(args, out, settings: str, info: dict, peak: int, hwm: int | None, series, log: Path) -> dict:
    sessions: list[Session] = out["sessions"]
    patcher: PatchingSession | None = out.get("patcher")
    steps = [st for s in sessions for st in s.steps]
    errors = [e for s in [*sessions, *filter(None, [patcher])] for e in s.errors] + _server_log_errors(log)
    changes = [st for st in steps if st.kind in ("layer", "head", "patch") and st.ok]

    def times(sts, attr="total_s"):
        return [getattr(st, attr) for st in sts if getattr(st, attr) is not None]

    per_session = []
    for s in sessions:
        ch = [st for st in s.steps if st.kind in ("layer", "head", "patch") and st.ok]
        load = next((st for st in s.steps if st.kind == "load"), None)
        per_session.append(
            {
                "session": s.index,
                "arrived_s": round(s.arrive_s, 1),
                "loaded": s.loaded,
                "finished": s.finished,
                "gate_wait_s": None if s.gate_wait_s is None else round(s.gate_wait_s, 2),
                "load_s": None if load is None or load.total_s is None else round(load.total_s, 3),
                "upload_to_map_s": [round(st.total_s, 3) for st in s.steps if st.kind == "upload" and st.ok],
                "changes": len(ch),
                "change_p50_s": _pct(times(ch), 50),
                "change_p95_s": _pct(times(ch), 95),
                "navigate_p50_s": _pct(times([st for st in s.steps if st.kind == "navigate" and st.ok]), 50),
                "correct": s.correct,
                "checks": s.checks,
                "maps_checked": sum(st.own_map is not None for st in s.steps),
                "maps_not_own": sum(st.own_map is False for st in s.steps),
                "errors": len(s.errors),
                "queue": s.queue,
                "console_errors": s.warnings[:20],
            }
        )
    cpu, wall, ncpu = out["cpu"], out["wall_s"], os.cpu_count() or 1
    reruns = sum(kind == "rerun_script" for s in sessions for _, kind in s.sent)
    capacity = wall * ncpu
    others = max(0.0, cpu["machine_busy"] - cpu["server"] - cpu["load"])
    result = {
        "sessions": args.sessions,
        "seconds": args.seconds,
        "ramp_s": round(args.ramp, 1),
        "think_s": list(args.think),
        "uploads_per_session": args.uploads,
        "min_changes": args.min_changes,
        "max_loading": args.max_loading,
        "seed": args.seed,
        "viewport": args.viewport,
        "streamlit_options": list(args.options),
        "server_cpus": sorted(args.server_cpus) if args.server_cpus else None,
        "client_cpus": sorted(args.client_cpus) if args.client_cpus else None,
        "server_settings": settings,
        "machine": info,
        "chromium": out["chromium"],
        "warm_up": out["warm_up"],
        "wall_s": round(wall, 1),
        "ok": not errors and all(p["loaded"] for p in per_session) and all(p["correct"] for p in per_session),
        "all_loaded": all(p["loaded"] for p in per_session),
        "all_correct": all(p["correct"] for p in per_session),
        "errors": errors,
        "latency_s": {
            "load": _summary(times([st for st in steps if st.kind == "load"])),
            "upload_to_first_map": _summary(times([st for st in steps if st.kind == "upload"])),
            "change_to_redraw": _summary(times(changes)),
            **{
                f"{k}_to_redraw": _summary(times([st for st in changes if st.kind == k]))
                for k in ("layer", "head", "patch")
            },
            "change_while_uploads_elsewhere": _summary(times([st for st in changes if st.uploads_elsewhere])),
            "change_without_uploads_elsewhere": _summary(times([st for st in changes if not st.uploads_elsewhere])),
            "change_while_pages_load_elsewhere": _summary(times([st for st in changes if st.loading_elsewhere])),
            "change_once_all_pages_loaded": _summary(times([st for st in changes if not st.loading_elsewhere])),
            "navigate": _summary(times([st for st in steps if st.kind == "navigate"])),
            "wait_at_the_load_gate (load generator)": _summary(
                [s.gate_wait_s for s in sessions if s.gate_wait_s is not None]
            ),
        },
        "change_split_s": {  # where a change's time goes
            "input_to_request_sent (browser, incl. slider debounce)": _summary(times(changes, "to_send_s")),
            "request_sent_to_figure_received (server)": _summary(times(changes, "server_s")),
            "request_sent_to_script_finished (server rerun)": _summary(times(changes, "rerun_s")),
            "figure_received_to_drawn (browser)": _summary(times(changes, "browser_s")),
        },
        "upload_split_s": {
            "input_to_request_sent (browser + file upload)": _summary(
                times([st for st in steps if st.kind == "upload"], "to_send_s")
            ),
            "request_sent_to_figure_received (server, incl. queue)": _summary(
                times([st for st in steps if st.kind == "upload"], "server_s")
            ),
        },
        "queue": {
            "sessions_that_saw_the_queue_note": sum(1 for s in sessions if s.queue.get("notes")),
            "max_visitors_ahead": max((s.queue.get("max_ahead") or 0 for s in sessions), default=0),
        },
        "server_memory_MiB": {
            "at_run_start": round(out["rss_start"] / 2**20, 1),
            "at_run_end": round(out["rss_end"] / 2**20, 1),
            "peak_sampled": round(peak / 2**20, 1),
            "peak_kernel_hwm": None if hwm is None else round(hwm / 2**20, 1),
            "series": series,
        },
        "cpu": {
            "wall_s": round(wall, 1),
            "cores": ncpu,
            "server_s": round(cpu["server"], 1),
            "load_generator_s": round(cpu["load"], 1),
            "others_s": round(others, 1),
            "load_generator_split_s": {k.split(":")[1]: round(v, 1) for k, v in cpu.items() if k.startswith("load:")},
            "server_share": round(cpu["server"] / capacity, 3),
            "load_generator_share": round(cpu["load"] / capacity, 3),
            "others_share": round(others / capacity, 3),
            "idle_share": round(max(0.0, 1 - cpu["machine_busy"] / max(cpu["machine_total"], 1e-9)), 3),
            "server_share_of_its_cpus": (
                round(cpu["server"] / (wall * len(args.server_cpus)), 3) if args.server_cpus else None
            ),
            "script_runs_requested": reruns,
            "server_cpu_per_run_ms": round(1000 * cpu["server"] / reruns) if reruns else None,
        },
        "per_session": per_session,
        "steps": [{"session": s.index, **asdict(st), "browser_s": st.browser_s} for s in sessions for st in s.steps],
        "server_log": str(log),
    }
    if patcher is not None:
        result["patching"] = patching_report(args, patcher, changes)
        result["ok"] = result["ok"] and patcher.finished
    bound = memory_bound(args, out["rss_start"])
    result["server_memory_MiB"].update(bound)
    return result


def patching_report(args, patcher: PatchingSession, changes: list[Step]) -> dict:
    """The patching session's times and note, and the other sessions' changes split by whether they overlapped its
    busy window (the same run: the ratio of their p95s is the patching's cost to the others)."""
    out = patcher.summary(*args.patching_size)
    window = patcher.window
    during, without = [], []
    for st in changes:
        if st.total_s is None:
            continue
        overlaps = window is not None and st.at_s < window[1] and st.at_s + st.total_s > window[0]
        (during if overlaps else without).append(st.total_s)
    p_during, p_without = _pct(during, 95), _pct(without, 95)
    out["max_work"] = args.patching_max_work
    out["others_change_to_redraw"] = {
        "during_patching": _summary(during),
        "without_patching": _summary(without),
        "p95_ratio": round(p_during / p_without, 2) if p_during and p_without else None,
        "p50_ratio": round(_pct(during, 50) / _pct(without, 50), 2) if during and without else None,
    }
    return out


def memory_bound(args, rss_start: int) -> dict:
    """The most the server's memory may grow over the run, from its settings: twice the memory budget (a patched
    batch's attention, and the clean Run's autograd graph, each within it), the two caches of Runs (each within the
    run cache), the app's captures and its results, over what it held when the run started (models loaded)."""
    m = args.memory_settings_MB
    parts = {
        "2 x VITVIZ_MEMORY_BUDGET_MB": 2 * m["VITVIZ_MEMORY_BUDGET_MB"],
        "2 x VITVIZ_RUN_CACHE_MB": 2 * m["VITVIZ_RUN_CACHE_MB"],
        "VITVIZ_CAPTURE_CACHE_MB": m["VITVIZ_CAPTURE_CACHE_MB"],
        "results cache": float(RESULTS_CACHE_MB),
    }
    return {
        "bound": round(rss_start / 2**20 + sum(parts.values()), 1),
        "bound_parts_MB": parts,
    }


def print_table(r: dict) -> None:
    m = r["machine"]
    print(
        f"\nvitviz load test: {r['sessions']} sessions for {r['seconds']:g} s (arrivals over {r['ramp_s']:g} s, "
        f"think {r['think_s'][0]:g}-{r['think_s'][1]:g} s), {m['cpus']} CPUs ({m['cpu_model']}), "
        f"load average {m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after"
    )
    opts = f"; Streamlit options {' '.join(r['streamlit_options'])}" if r["streamlit_options"] else ""
    print(f"{r['server_settings']}{opts}\nChromium {r['chromium']}; warm-up {r['warm_up']}\n")
    print(
        "| session | arrived (s) | load (s) | upload -> map (s) | changes | change p50 / p95 (s) | own image (maps, bars) | errors | queue (max ahead) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for p in r["per_session"]:
        up = ", ".join(f"{v:.2f}" for v in p["upload_to_map_s"]) or "-"
        q = p["queue"].get("max_ahead") if p["queue"] else None
        print(
            f"| {p['session']} | {p['arrived_s']} | {p['load_s'] if p['load_s'] is not None else 'never'} | {up} | "
            f"{p['changes']} | {p['change_p50_s']} / {p['change_p95_s']} | {'yes' if p['correct'] else 'NO'} ({p['maps_checked'] - p['maps_not_own']}/{p['maps_checked']}, {sum(c['ok'] for c in p['checks'])}/{len(p['checks'])}) | "
            f"{p['errors']} | {'-' if q is None else q} |"
        )
    print("\n| overall | n | p50 (s) | p95 (s) | max (s) |\n|---|---|---|---|---|")
    for name, s in [*r["latency_s"].items(), *r["change_split_s"].items(), *r["upload_split_s"].items()]:
        print(f"| {name} | {s['n']} | {s['p50']} | {s['p95']} | {s['max']} |")
    mem, cpu = r["server_memory_MiB"], r["cpu"]
    print(
        f"\nServer memory (RSS of its process tree): {mem['at_run_start']} MiB at the start, {mem['at_run_end']} MiB "
        f"at the end, peak {mem['peak_sampled']} MiB sampled (kernel high-water mark {mem['peak_kernel_hwm']} MiB)"
    )
    print(
        f"CPU over {cpu['wall_s']} s x {cpu['cores']} cores: server {cpu['server_share']:.0%} ({cpu['server_s']} s), "
        f"load generator {cpu['load_generator_share']:.0%} ({cpu['load_generator_s']} s: {cpu['load_generator_split_s']}), "
        f"other programs {cpu['others_share']:.0%} ({cpu['others_s']} s), idle {cpu['idle_share']:.0%}; "
        f"{cpu['script_runs_requested']} script runs requested, {cpu['server_cpu_per_run_ms']} ms of server CPU each"
    )
    print(f"Server memory bound (from its settings): {mem['bound']} MiB = at the start + {mem['bound_parts_MB']}")
    if r.get("patching"):
        pt = r["patching"]
        o = pt["others_change_to_redraw"]
        print(
            f"Patching session: input {pt['input_px']['width']} x {pt['input_px']['height']} px, "
            f"{pt['cells_expected']:,} cells; estimate after {pt['estimate_s']} s, exact grids after {pt['exact_s']} s "
            f"(busy window {pt['window_s']} s); note: {pt['note'][:200]!r}"
        )
        print(
            f"Others' changes during patching: n {o['during_patching']['n']}, p50 {o['during_patching']['p50']}, "
            f"p95 {o['during_patching']['p95']} s; without: n {o['without_patching']['n']}, p50 "
            f"{o['without_patching']['p50']}, p95 {o['without_patching']['p95']} s; ratio p95 {o['p95_ratio']}, "
            f"p50 {o['p50_ratio']}"
        )
    q = r["queue"]
    print(
        f"Queue note seen by {q['sessions_that_saw_the_queue_note']} sessions, at most {q['max_visitors_ahead']} visitors ahead"
    )
    print(
        f"\nErrors: {len(r['errors'])}; every session loaded: {r['all_loaded']}; every session saw its own image: "
        f"{r['all_correct']}; total time {r.get('total_s', '?')} s"
    )
    for e in r["errors"][:20]:
        print(f"  session {e['session']} at {e['at_s']} s, {e['kind']}: {e['text'][:300]!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=16, help="browser sessions (default 16)")
    parser.add_argument(
        "--seconds", type=float, default=120, help="how long sessions act, from the run's start (default 120)"
    )
    parser.add_argument(
        "--ramp",
        type=float,
        default=None,
        help="arrivals spread over this many seconds (default 0.3 x seconds, at most 60)",
    )
    parser.add_argument(
        "--think",
        type=float,
        nargs=2,
        default=(1.5, 4.0),
        metavar=("MIN", "MAX"),
        help="seconds between actions (default 1.5 4)",
    )
    parser.add_argument(
        "--uploads", type=int, default=1, help="images each session uploads (default 1; the others at random times)"
    )
    parser.add_argument(
        "--min-changes", type=int, default=0, help="changes each session makes even past the deadline (default 0)"
    )
    parser.add_argument(
        "--max-loading",
        type=int,
        default=2,
        help="pages loading the app at once (default 2; 0: no limit). Loading costs Chromium ~7 CPU s a page here, "
        "ten times the server's share; the wait at this gate is reported, the load time starts after it",
    )
    parser.add_argument(
        "--streamlit-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Streamlit option for the server (repeatable), e.g. runner.postScriptGC=false",
    )
    parser.add_argument("--server-cpus", type=parse_cpus, default=None, metavar="LIST", help="pin the server, e.g. 0,1")
    parser.add_argument(
        "--client-cpus", type=parse_cpus, default=None, metavar="LIST", help="pin the browser side, e.g. 2-15"
    )
    parser.add_argument(
        "--viewport",
        type=lambda t: tuple(int(v) for v in t.lower().split("x")),
        default=(1500, 1100),
        metavar="WxH",
        help="each page's size (default 1500x1100); Chromium's drawing cost grows with it",
    )
    parser.add_argument(
        "--patching",
        action="store_true",
        help="one more session runs exact activation patching at the widest input the limits accept",
    )
    parser.add_argument(
        "--patching-at", type=float, default=None, help="when it arrives, s after the start (default 0)"
    )
    parser.add_argument(
        "--patching-after",
        type=int,
        default=3,
        help="its busy window begins once every other session has made this many changes (default 3)",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the server (repeatable), e.g. VITVIZ_PATCHING_MAX_WORK=40000",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args(argv)

    def stop(signum, frame):  # SIGTERM as Ctrl-C: the server and the browser are stopped on the way out
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        result = run_load(
            args.sessions,
            args.seconds,
            ramp=args.ramp,
            think=tuple(args.think),
            uploads=args.uploads,
            min_changes=args.min_changes,
            max_loading=args.max_loading,
            seed=args.seed,
            options=args.streamlit_option,
            server_cpus=args.server_cpus,
            client_cpus=args.client_cpus,
            viewport=args.viewport,
            patching=args.patching,
            patching_at=args.patching_at,
            patching_after=args.patching_after,
            server_env=dict(kv.split("=", 1) for kv in args.server_env),
        )
    except KeyboardInterrupt:
        print("interrupted: the server and the browser are stopped", file=sys.stderr)
        return 130
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print_table(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
