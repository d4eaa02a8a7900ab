"""Image & predictions: the patch grid, the token sequence, and the CLS-token top-k."""

import streamlit as st

from pages import common
from vitviz import figures
from vitviz.capture.run import predictions_from_logits

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("How the ViT reads the image")
st.caption(
    f"**{cap.model_name}** ({cap.family}): {cap.num_layers} layers x {cap.num_heads} heads, "
    f"input {cap.input_size[1]} x {cap.input_size[0]} px, {cap.num_tokens} tokens, attention stored as {cap.attention_precision}."
)
left, right = st.columns([3, 2])
with left:
    fig = figures.image_figure(cap.image, patch_size=cap.patch_size, num_prefix_tokens=cap.num_prefix_tokens)
    st.plotly_chart(fig, key="patch_grid")
with right:
    if cap.predictions:
        st.plotly_chart(figures.predictions_figure(cap.predictions), key="predictions")
        ranked = predictions_from_logits(cap.logits, cur.model.id2label)  # every class, most probable first
        labels = {p.index: f"{p.label} ({p.probability:.1%})" for p in ranked}
        if ss.class_index not in labels:
            ss.class_index = ranked[0].index
        st.selectbox(
            "Class for the class-specific views (any class; most probable first)",
            list(labels),
            format_func=labels.get,
            **common.keep("class_index"),
        )
    else:
        st.info(
            f"{cap.model_name} is a backbone without a classifier: no predictions, and no class-specific relevance."
        )
st.plotly_chart(figures.token_sequence_figure(cap.token_kinds, cap.grid), key="sequence")
st.caption(
    "As in the ViT paper, the image is cut into patches, each flattened and linearly projected, "
    "and the sequence starts with the prefix tokens (CLS, and DeiT's DIST or DINOv2's registers)."
)
