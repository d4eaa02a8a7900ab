"""Layers & rollout: layers side by side, rollout, class-specific relevance, DINO masks, per-head summaries."""

import numpy as np
import streamlit as st

from pages import common
from vitviz import figures
from vitviz.analysis import maps
from vitviz.analysis.masks import dino_masks
from vitviz.errors import VitvizError

cur = common.require_current()
cap, ss = cur.cap, st.session_state
p = cap.num_prefix_tokens
METRICS = {"mean attention distance (px)": "distance", "attention entropy (nats)": "entropy"}


def open_head(data) -> None:
    ss.layer, ss.head = int(data[0]), int(data[1])
    ss.open_heads_page = True


common.take_click("summary_map", open_head)
if ss.pop("open_heads_page", False):
    st.switch_page("pages/heads.py")
common.clamp_state(cap)

st.header("Layers, rollout and explanations")
c1, c2 = st.columns(2)
c1.selectbox("Head fusion", maps.FUSIONS, **common.keep("fusion"))
c2.caption(f"Query token: **{cap.token_label(ss.query)}** (pick another on the Heads page).")

# Layers side by side
q = ss.query
rows = maps.fuse_heads(cap.attentions[:, :, q : q + 1, :], how=ss.fusion)  # (L, 1, T): only the query's row
per_layer = maps.query_map(rows, query=0, num_prefix_tokens=p, grid=cap.grid)
st.subheader(f"Where {cap.token_label(ss.query)} looks, layer by layer ({ss.fusion} of heads)")
st.plotly_chart(
    figures.small_multiples_figure(
        per_layer,
        [f"layer {i}" for i in range(cap.num_layers)],
        colorbar_title=f"attention (raw, {cap.attention_precision})",
        cols=6,
    ),
    key="layer_grid",
)

# Rollout and relevance
st.subheader("Attention rollout and class-specific relevance")
r1, r2 = st.columns(2)
r1.slider("Layers rolled out", 0, cap.num_layers - 1, **common.keep("rollout_range"))
r2.slider("Discard ratio (smallest patch entries zeroed per layer)", 0.0, 0.95, step=0.05, **common.keep("discard"))
start, end = ss.rollout_range
row = common.get_rollout(*cur.key, cap, query=ss.query, start=start, stop=end + 1, fusion=ss.fusion, discard=ss.discard)
roll_map = row[p:].reshape(cap.grid)
left, right = st.columns(2)
with left:
    st.plotly_chart(
        figures.map_figure(cap.image, roll_map, patch_size=cap.patch_size, num_prefix_tokens=p,
                           title=f"Rollout of {cap.token_label(ss.query)}, layers {start}-{end}", colorbar_title=f"rollout (raw, {cap.attention_precision})"),
        key="rollout_map",
    )  # fmt: skip
    common.downloads("rollout", "rollout", rollout=roll_map, row=row)
with right:
    if not cur.model.has_classifier:
        st.info("Class-specific relevance needs a classifier; this checkpoint is a backbone.")
    else:
        cls = ss.class_index if ss.class_index in cur.model.id2label else cap.predictions[0].index
        try:
            with st.spinner("Computing gradients for the relevance map…"):
                exp = common.get_relevance(*cur.key, cls, cur.image_bytes)
        except VitvizError as exc:
            st.error(str(exc))
        else:
            st.plotly_chart(
                figures.map_figure(cap.image, exp.patch_map(), patch_size=cap.patch_size, num_prefix_tokens=p,
                                   title=f"Relevance for '{exp.label}' (Chefer et al. 2021)", colorbar_title="relevance (raw)"),
                key="relevance_map",
            )  # fmt: skip
            st.caption("Choose the class on the *Image & predictions* page.")
            common.downloads(f"relevance_{exp.class_index}", "relevance", relevance=exp.patch_map())

# DINO masks
st.subheader("DINO attention masks (last layer, CLS query)")
st.slider("Kept attention mass (tau)", 0.1, 1.0, step=0.05, **common.keep("tau"))
masks = dino_masks(cap.attentions, num_prefix_tokens=p, grid=cap.grid, tau=ss.tau).astype(np.float32)
st.plotly_chart(
    figures.small_multiples_figure(
        masks,
        [f"head {h}" for h in range(cap.num_heads)],
        colorbar_title="kept (1) / dropped (0)",
        cols=6,
        zmin=0,
        zmax=1,
    ),
    key="masks",
)

# Per-head summaries
st.subheader("Per-head summaries")
summ = common.get_summaries(*cur.key, cap)
st.radio("Metric", list(METRICS), **common.keep("metric"), horizontal=True)
values = getattr(summ, METRICS[ss.metric])
s1, s2 = st.columns(2)
with s1:
    st.plotly_chart(
        figures.layer_head_figure(values, title=f"{ss.metric}: click a cell to open that head", colorbar_title=ss.metric, marked=(ss.layer, ss.head)),
        key="summary_map", on_select="rerun", selection_mode="points",
    )  # fmt: skip
    common.downloads("summaries", "summaries", mean_attention_distance=summ.distance, attention_entropy=summ.entropy)
with s2:
    st.plotly_chart(figures.distance_depth_figure(summ.distance, image_px=max(cap.input_size)), key="distance_depth")
