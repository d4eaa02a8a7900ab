"""The instant head view on the Heads page: the record's maps go to the browser once per image.

Streamlit wiring only; the page itself is :mod:`vitviz.figures.headview`. Layer, head and
query then change in the browser (no rerun). Models without one shared token grid, and
records above the page budget, keep the server-drawn view, with a note saying why.
"""

from __future__ import annotations

import streamlit as st

from ui import cached, common
from vitviz.figures.headview import HeadViewData, HeadViewTooLarge, head_view_data, head_view_html, record_problem
from vitviz.record import POOLED

KEY = "instant_heads"


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


def draw(cur: common.Current) -> bool:
    """Offer and draw the instant view; True when it was drawn (the caller then skips the server view)."""
    cap = cur.cap
    problem = record_problem(cap)
    if problem:
        return False
    on = st.toggle(
        "Instant view (layer, head and query switch in the browser)",
        value=True,
        key=KEY,
        help="The attention maps are sent to the browser once for this image (8 bits per map, relative to its "
        "maximum); turn it off for the server-drawn view with key direction ('who looks at') and the Swin windows.",
    )
    if not on:
        return False
    try:
        data = _data(cur)
    except HeadViewTooLarge as exc:
        st.info(f"Server-drawn view: {exc}.")
        return False
    ss = st.session_state
    query = common.query_at(cap, 0)
    # opens where the session is (a summary cell clicked on Layers chose the layer and head)
    html = head_view_html(
        data,
        height=_height(cap.num_blocks),
        layer=ss.get("layer"),
        head=ss.get("head") or 0,
        query=0 if query == POOLED else query,
    )
    # st.iframe replaces the deprecated components.v1.html (same sandbox: an iframe running the page's script)
    st.iframe(html, height=_height(cap.num_blocks) + 10)
    if data.nbytes > 2e6:
        st.caption(f"This view sent {data.nbytes / 1e6:.1f} MB to the browser once for this image.")
    return True
