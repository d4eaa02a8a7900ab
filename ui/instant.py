"""The instant head view on the Heads page: the record's maps go to the browser once per image.

Streamlit wiring only; the page itself is :mod:`vitviz.figures.headview`. Layer, head and
query then change in the browser (no rerun). Models without one shared token grid, and
records above the page budget, keep the server-drawn view, with a note saying why.

The view is a Custom Component v2 (as :mod:`ui.click_chart`) holding the page in an ``iframe``
of its own document (``srcdoc``, same origin): what the user picks there is sent back, debounced
(:data:`REPORT_MS` after the last change), as the component's state ``{"choice": {layer, head,
query, id}}``; :func:`take_choice` makes it the session's layer, head and query, so the other pages
(and this view when the page is opened again) start from it. The element is keyed by
:data:`COMPONENT` alone, so a rerun keeps the page mounted: the maps are decoded once per image, and
a new ``start`` from the server (the session's state changed elsewhere) is applied in place.
"""

from __future__ import annotations

import hashlib

import streamlit as st

from ui import cached, common
from vitviz.figures.headview import HeadViewData, HeadViewTooLarge, head_view_data, head_view_html, record_problem
from vitviz.record import POOLED

KEY = "instant_heads"  # the session's choice: the instant view on (the default) or the server-drawn view
COMPONENT = "instant_view"  # the component's state: the choice the browser sent last
REPORT_MS = 300  # the browser reports a choice this long after the last change (a slider drag sends once)

_JS = r"""
const REPORT_MS = __REPORT_MS__;

function same(a, b) { return JSON.stringify(a) === JSON.stringify(b); }

function report(frame) {  // the view's layer, head and query, once the user stops changing them
  clearTimeout(frame.vitvizTimer);
  frame.vitvizTimer = setTimeout(() => {
    const S = frame.contentWindow && frame.contentWindow.vitvizState;
    if (!S) return;
    const choice = { layer: S.layer, head: S.head, query: S.query };
    if (same(choice, frame.vitvizSent)) return;
    frame.vitvizSent = choice;
    frame.vitvizClicks = (frame.vitvizClicks || 0) + 1;
    frame.vitvizSetState("choice", { ...choice, id: Date.now() + "-" + frame.vitvizClicks });
  }, REPORT_MS);
}

function hook(frame) {  // every change in the page goes through window.vitvizSet: report it after it is drawn
  const w = frame.contentWindow;
  if (!w || !w.vitvizSet || w.vitvizReported) return;
  const own = w.vitvizSet;
  w.vitvizOwnSet = own;
  w.vitvizSet = (changes) => { own(changes); report(frame); };
  w.vitvizReported = true;
}

function fit(frame) {  // the frame as tall as its page: nothing clipped at the bottom
  const doc = frame.contentDocument;
  if (!doc || !doc.body) return;
  const h = Math.ceil(doc.documentElement.scrollHeight);
  if (h > 0 && Math.abs(h - frame.clientHeight) > 2) frame.style.height = h + "px";
}

export default function (component) {
  const { parentElement, setStateValue } = component;
  const data = component.data[0];
  let frame = parentElement.querySelector("iframe.vitviz-head-view");
  if (!frame || frame.dataset.digest !== data.digest) {  // a new image or model: a new page
    if (frame) frame.remove();
    frame = document.createElement("iframe");
    frame.className = "vitviz-head-view";
    frame.title = "Instant head view";
    frame.style.cssText = "width:100%;border:0;display:block;height:" + data.height + "px";
    frame.dataset.digest = data.digest;
    frame.vitvizSerial = data.serial;
    frame.vitvizSent = data.start;
    frame.addEventListener("load", () => {
      hook(frame);
      const doc = frame.contentDocument;
      const sizeUp = () => fit(frame);
      sizeUp();
      if (doc && frame.contentWindow.ResizeObserver) new frame.contentWindow.ResizeObserver(sizeUp).observe(doc.body);
    });
    frame.srcdoc = data.page;
    parentElement.appendChild(frame);
  } else if (data.serial !== frame.vitvizSerial) {  // the session's choice moved on the server: show it
    frame.vitvizSerial = data.serial;
    const w = frame.contentWindow;
    if (!same(data.start, frame.vitvizSent) && w && w.vitvizOwnSet && w.document.body.dataset.ready === "1") {
      frame.vitvizSent = data.start;
      w.vitvizOwnSet(data.start);
    }
  }
  frame.vitvizSetState = setStateValue;  // the latest call's
}
""".replace("__REPORT_MS__", str(REPORT_MS))

_head_view = st.components.v2.component("vitviz_head_view", js=_JS, isolate_styles=False)


def _data(cur: common.Current) -> HeadViewData:
    """The packed maps, cached server-wide with the capture's key (packing ViT-B/16 costs ~0.3 s)."""
    cap = cur.cap

    def compute() -> HeadViewData:
        return head_view_data(
            cap.attention_stack,
            grid=cap.grid,
            prefix_kinds=cap.prefix_kinds,
            image=cap.image,
            title=f"{cap.model_name}: attention heads",
            layer_names=[cap.block_label(b) for b in range(cap.num_blocks)],
        )

    return cached.results_cache().get_or_compute(("head_view", *cur.key), compute)


def _height(layers: int) -> int:
    return max(600, 130 + 34 * layers)


def take_choice(cap) -> None:
    """The choice the browser sent last (``{"choice": {layer, head, query, id}}``), once, as the session's block,
    head and query (a token of the first stage). Call it before anything reads them."""
    ss = st.session_state
    choice = (ss.get(COMPONENT) or {}).get("choice")
    if not isinstance(choice, dict) or ss.get("_instant_seen") == choice.get("id"):
        return
    ss._instant_seen = choice.get("id")
    try:
        layer, head, query = int(choice["layer"]), int(choice["head"]), int(choice["query"])
    except (KeyError, TypeError, ValueError):
        return
    if not (0 <= layer < cap.num_blocks and 0 <= head < cap.blocks[layer].num_heads and 0 <= query < cap.num_tokens):
        return
    ss.layer, ss.head = layer, head
    start = ss.get("_instant_start") or {}
    if query != start.get("query"):  # the view shows CLS for the pooled query: only a query picked there counts
        common.set_query(0, query)


def draw(cur: common.Current) -> bool:
    """Offer and draw the instant view; True when it was drawn (the caller then skips the server view)."""
    cap = cur.cap
    problem = record_problem(cap)
    if problem:
        return False
    ss = st.session_state
    ss.setdefault(KEY, True)
    on = st.toggle(
        "Instant view (block, head and query switch in the browser)",
        help="The attention maps are sent to the browser once for this image (8 bits per map, relative to its "
        "maximum); what you pick there becomes the query, block and head of the other pages. Turn it off for the "
        "server-drawn view with key direction ('who looks at') and the Swin windows.",
        **common.keep(KEY),
    )
    if not on:
        return False
    try:
        data = _data(cur)
    except HeadViewTooLarge as exc:
        st.info(f"Server-drawn view: {exc}.")
        return False
    take_choice(cap)
    query = common.query_at(cap, 0)
    now = {"layer": ss.layer, "head": ss.head or 0, "query": 0 if query == POOLED else query}
    digest = hashlib.blake2b(f"{cur.key}".encode() + data.maps[:4096].encode(), digest_size=8).hexdigest()
    # While the browser shows the session's choice (its last report), the element is sent as drawn before: the same
    # message, which Streamlit sends once and then by reference (the page is megabytes for a ViT-B).
    drawn = ss.get("_instant_drawn")  # (digest, start, serial)
    choice = (ss.get(COMPONENT) or {}).get("choice")
    shows = isinstance(choice, dict) and all(choice.get(k) == v for k, v in now.items())
    if drawn is None or drawn[0] != digest or not (now == drawn[1] or shows):
        drawn = ss._instant_drawn = (digest, now, (drawn[2] + 1) if drawn else 0)
    start = drawn[1]
    ss._instant_start = now
    height = _height(cap.num_blocks)
    # one list, not a dict: Streamlit looks through a dict's values for data frames (ui/click_chart.py says why)
    _head_view(
        key=COMPONENT,
        data=[
            {
                "page": head_view_html(data, height=height, **start),
                "digest": digest,
                "start": start,
                "serial": drawn[2],
                "height": height,
            }
        ],
        on_choice_change=lambda: None,  # the page reads the choice (take_choice) before it draws
    )
    if data.nbytes > 2e6:
        st.caption(f"This view sent {data.nbytes / 1e6:.1f} MB to the browser once for this image.")
    return True
