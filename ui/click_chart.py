"""A clickable Plotly chart whose element keeps its identity across reruns: the last click always wins.

``st.plotly_chart``'s element id includes the figure: after a click the page draws a new figure, so
the chart gets a new id, and a second click made during the first click's rerun lands on the old
chart, whose id the server no longer knows (the click was dropped; the map ended on the FIRST
click). This chart is a Streamlit Custom Component v2 keyed by the user key alone
(``key_as_main_identity=True``): the browser keeps one element mounted, redraws it with
``Plotly.react`` when the figure changes, and every click sets its state to the clicked point's
``customdata`` with an id of its own (two clicks on one cell both count). Plotly hovers at most once
per 50 ms and hovers the old position again after a redraw, so a click right after a redraw can be
reported with the point hovered before the mouse moved; the script then takes the click's own hover
(``gd._hoverdata``, a private field of plotly.js 4.1.1) when it lies nearer to the click.

The state reads like ``st.plotly_chart``'s selection, ``st.session_state[key]["selection"]["points"]``,
so ``common.clicked_point`` / ``common.take_click`` read either chart. plotly.js is the installed
``plotly`` package's own ``plotly.min.js``, served by Streamlit's component file route and loaded
once per page (the browser caches it); the figure goes to the browser as JSON, no theme applied.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import plotly
import streamlit as st
from streamlit.components.v1 import declare_component

PLOTLY_DIR = Path(plotly.__file__).parent / "package_data"
PLOTLY_JS = "plotly.min.js"

# Streamlit's own defaults for st.plotly_chart with a point selection (no logo, no cloud button,
# no box or lasso select), then the caller's config on top.
DEFAULT_CONFIG = {
    "displaylogo": False,
    "showSendToCloud": False,
    "modeBarButtonsToRemove": ["lasso2d", "select2d", "sendChartToCloud"],
    "responsive": True,
}

_JS = r"""
let plotlyLoad = null;
let clicks = 0;

function loadPlotly(url) {
  if (!plotlyLoad) {
    plotlyLoad = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => { plotlyLoad = null; reject(new Error("plotly.js did not load from " + url)); };
      document.head.appendChild(script);
    });
  }
  return plotlyLoad;
}

function plain(value) {  // typed arrays and arrays of them as plain JSON arrays
  if (ArrayBuffer.isView(value) || Array.isArray(value)) return Array.from(value, plain);
  return value;
}

function send(gd, points) {  // the clicked point's customdata and an id of its own
  const point = points.find((p) => p.customdata !== undefined);
  if (!point) return;
  clicks += 1;
  gd.vitvizSetState("selection", {
    points: [{ customdata: plain(point.customdata), click: Date.now() + "-" + clicks }],
  });
}

function nearestTo(gd, points, cx, cy) {  // cx, cy: where the click was, in the graph's pixels
  // Plotly's "closest" hover floors a point's distance at 1 - 3 / (marker radius) inside its marker, so every marker
  // covering the cursor ties and the last one wins: where markers overlap (a head grid drawn narrower than its
  // tiles' 55 px click targets) a click on a tile reported its neighbour. The trace's point whose centre is nearest
  // the click is the one clicked.
  const p = points.find((q) => q.customdata !== undefined);
  if (!p || !Number.isFinite(cx) || !Number.isFinite(cy)) return points;
  const t = (gd._fullData || [])[p.curveNumber];
  const xa = p.xaxis, ya = p.yaxis;
  if (!t || t.type !== "scatter" || !t.customdata || !t.x || !t.y || !xa || !ya) return points;
  let best = -1, bestD = Infinity;
  for (let k = 0; k < t.x.length; k++) {
    const dx = xa._offset + xa.c2p(t.x[k]) - cx, dy = ya._offset + ya.c2p(t.y[k]) - cy;
    const d = dx * dx + dy * dy;
    if (d < bestD) { bestD = d; best = k; }
  }
  if (best < 0 || best === p.pointNumber || t.customdata[best] === undefined) return points;
  return [{ customdata: t.customdata[best] }];
}

// Streamlit's charts have a full-screen button in their toolbar; this one has it in Plotly's modebar.
const FULL_SCREEN = {
  name: "vitviz-full-screen",
  title: "Full screen (again, or Esc, to leave)",
  icon: { width: 1000, height: 1000, path: "M0 0h400v100H100v300H0zM600 0h400v400H900V100H600zM0 600h100v300h300v100H0zM900 600h100v400H600V900h300z" },
  click: (gd) => {
    if (document.fullscreenElement) document.exitFullscreen();
    else if (gd.requestFullscreen) gd.requestFullscreen().catch(() => {});
  },
};

function sized(gd, layout) {  // full screen: the whole screen's height; else the figure's own
  const full = document.fullscreenElement === gd;
  return { ...layout, height: full ? window.innerHeight : layout.height };
}

function withFullScreen(config) {
  return { ...config, modeBarButtonsToAdd: [...(config.modeBarButtonsToAdd || []), FULL_SCREEN] };
}

export default function (component) {
  const { parentElement, setStateValue } = component;
  const data = component.data[0];
  let gd = parentElement.querySelector(".vitviz-click-chart");
  if (!gd) {
    gd = document.createElement("div");
    gd.className = "vitviz-click-chart";
    gd.style.width = "100%";
    parentElement.appendChild(gd);
  }
  const spec = JSON.parse(data.spec);
  gd.dataset.spec = data.digest;
  gd.vitvizSetState = setStateValue;  // the latest call's (one listener serves every call)
  loadPlotly(data.plotly).then((Plotly) => {
    if (gd.dataset.spec !== data.digest) return;  // a newer figure came while plotly.js loaded
    gd.vitvizLayout = spec.layout || {};
    Plotly.react(gd, spec.data || [], sized(gd, gd.vitvizLayout), withFullScreen(data.config)).then(() => {
      if (gd.dataset.listening) return;
      gd.dataset.listening = "1";
      gd.addEventListener("fullscreenchange", () => {
        Plotly.relayout(gd, { height: sized(gd, gd.vitvizLayout).height, autosize: true });
      });
      gd.on("plotly_click", (event) => {
        // Plotly computes hover at most once per 50 ms (HOVERMINTIME), and a redraw hovers the last
        // position again: a click just after a redraw reports the point hovered before the mouse moved
        // (its xPixel, yPixel say where). Then the click's own hover comes within 50 ms: take the points
        // hovered nearer to where the click was.
        const box = gd.getBoundingClientRect();
        const native = (event && event.event) || {};
        const away = (x, y) => {
          const d = Math.hypot(x - (native.clientX - box.left), y - (native.clientY - box.top));
          return Number.isFinite(d) ? d : Infinity;
        };
        const cx = native.clientX - box.left, cy = native.clientY - box.top;
        const first = { points: (event && event.points) || [], away: away(event.xPixel, event.yPixel) };
        if (first.away <= 2) return send(gd, nearestTo(gd, first.points, cx, cy));
        setTimeout(() => {
          const later = { points: gd._hoverdata || [], away: away(gd._hoverPointerX, gd._hoverPointerY) };
          send(gd, nearestTo(gd, (later.points.length && later.away < first.away ? later : first).points, cx, cy));
        }, 60);
      });
    });
  }).catch((err) => { gd.textContent = "The chart could not be drawn: " + (err && err.message); });
  // Called when the element leaves the page (or right away when a newer figure overtook this call:
  // then the graph is still on the page and stays).
  return () => { if (window.Plotly && !gd.isConnected) window.Plotly.purge(gd); };
}
"""

_CSS = ".vitviz-click-chart { width: 100%; } .vitviz-click-chart:fullscreen { background: white; }"

_click_chart = st.components.v2.component("vitviz_click_chart", js=_JS, css=_CSS, isolate_styles=False)


def _plotly_url() -> str:
    """Where the browser gets ``plotly.min.js``: Streamlit's route for a v1 component's folder."""
    served = declare_component("plotly_js", path=str(PLOTLY_DIR))
    base = st.get_option("server.baseUrlPath").strip("/")
    return f"{'/' + base if base else ''}/component/{served.name}/{PLOTLY_JS}"


def _ignore() -> None:
    """A click only sets the state; the page reads it (``common.take_click``)."""


def clickable_chart(fig, *, key: str, config: dict | None = None):
    """Draw ``fig`` (a ``go.Figure``) as a chart whose clicks set ``st.session_state[key]``.

    The state after a click: ``{"selection": {"points": [{"customdata": [...], "click": "<id>"}]}}``,
    the clicked point's customdata and an id that differs for every click. ``config``: Plotly's
    config, over ``DEFAULT_CONFIG``.
    """
    spec = fig.to_json()
    data = {
        "spec": spec,
        "digest": hashlib.blake2b(spec.encode(), digest_size=8).hexdigest(),
        "config": {**DEFAULT_CONFIG, **(config or {})},
        "plotly": _plotly_url(),
    }
    # A list, not the dict itself: Streamlit looks through a dict's values for data frames, which imports
    # pandas in this script's thread; meanwhile another session's plotly (which uses pandas only if it is
    # in sys.modules) met a half-imported pandas (AttributeError, seen in the load test).
    return _click_chart(key=key, data=[data], on_selection_change=_ignore)
