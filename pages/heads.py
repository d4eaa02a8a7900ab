"""Heads: every head of a layer over the image; click a patch to make it the query."""

import numpy as np
import streamlit as st

from pages import common
from vitviz import figures
from vitviz.analysis import maps

cur = common.require_current()
cap, ss = cur.cap, st.session_state
p = cap.num_prefix_tokens

st.header("Attention heads")
common.take_click("head_map", lambda data: ss.update(query=int(data[0])))
common.take_click("head_grid", lambda data: ss.update(head=int(data[0])))
common.clamp_state(cap)
c1, c2, c3 = st.columns([2, 2, 3])
with c1:
    st.slider("Layer", 0, cap.num_layers - 1, **common.keep("layer"))
with c2:
    st.radio("Direction", common.DIRECTIONS, **common.keep("direction"), horizontal=True)
with c3:
    tokens = list(range(p)) + ([ss.query] if ss.query >= p else [])
    st.selectbox(
        "Query token (or click a patch)", tokens, index=tokens.index(ss.query), format_func=cap.token_label,
        key=f"query_pick_{ss.query}", on_change=lambda: ss.update(query=ss[f"query_pick_{ss.query}"]),
    )  # fmt: skip

layer, query = ss.layer, ss.query
looking = ss.direction == common.DIRECTIONS[0]
attn = cap.attentions[layer]  # (H, T, T)
if looking:
    head_maps = maps.query_map(attn, query=query, num_prefix_tokens=p, grid=cap.grid)
    what = f"where {cap.token_label(query)} looks"
else:
    head_maps = maps.key_map(attn, key=query, num_prefix_tokens=p, grid=cap.grid)
    what = f"who looks at {cap.token_label(query)}"

st.plotly_chart(
    figures.small_multiples_figure(
        head_maps,
        [f"head {h}" for h in range(cap.num_heads)],
        colorbar_title=f"attention (raw, {cap.attention_precision})",
        cols=6,
        image=cap.image,
    ),
    key="head_grid",
    on_select="rerun",
    selection_mode="points",
)
st.caption("All heads share one colour scale; click a head to show it large.")
st.radio(
    "Head shown large",
    list(range(cap.num_heads)),
    **common.keep("head"),
    horizontal=True,
    format_func=lambda h: f"head {h}",
)

big, side = st.columns([3, 2])
head = ss.head
marked = None if query < p else divmod(query - p, cap.grid[1])
with big:
    fig = figures.map_figure(
        cap.image, head_maps[head], patch_size=cap.patch_size, num_prefix_tokens=p,
        title=f"Layer {layer}, head {head}: {what}", colorbar_title=f"attention (raw, {cap.attention_precision})", marked=marked,
    )  # fmt: skip
    st.plotly_chart(fig, key="head_map", on_select="rerun", selection_mode="points")
with side:
    if looking:
        prefix = maps.prefix_attention(attn[head], query=query, num_prefix_tokens=p)
        total = float(maps.patch_attention_total(attn[head], query=query, num_prefix_tokens=p))
        st.plotly_chart(figures.prefix_attention_figure(prefix, cap.prefix_kinds, patch_total=total), key="prefix")
        st.caption(
            "Raw attention weights of this query: its row sums to 1 over all tokens, including those not on the image."
        )
    else:
        to_key = maps.prefix_attention_to(attn[head], key=query, num_prefix_tokens=p)
        st.plotly_chart(
            figures.prefix_attention_figure(to_key, cap.prefix_kinds, title=f"Attention the prefix tokens pay to {cap.token_label(query)} (raw)"),
            key="prefix",
        )  # fmt: skip
    common.downloads(
        f"layer{layer}_head{head}_token{query}",
        "heads",
        map=head_maps[head],
        all_heads=head_maps,
        attention=np.asarray(attn[head], np.float32),
    )
