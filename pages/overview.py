"""Image & predictions: the patch grid, the token sequence, and the CLS-token top-k."""

import streamlit as st

from pages import common
from vitviz import figures

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("How the ViT reads the image")
if cap.is_hierarchical:
    grids = "; ".join(
        f"stage {s.index + 1}: {s.grid[0]} x {s.grid[1]} tokens{' + CLS' if s.num_prefix else ''}, "
        f"{len(s.blocks)} blocks of {cap.blocks[s.blocks[0]].num_heads} heads ({cap.blocks[s.blocks[0]].kind} attention)"
        for s in cap.stages
    )
    st.caption(
        f"**{cap.model_name}** ({cap.family}), input {cap.input_size[1]} x {cap.input_size[0]} px, "
        f"attention stored as {cap.attention_precision}. {grids}."
    )
else:
    st.caption(
        f"**{cap.model_name}** ({cap.family}): {cap.num_layers} layers x {cap.num_heads} heads, "
        f"input {cap.input_size[1]} x {cap.input_size[0]} px, {cap.num_tokens} tokens, attention stored as {cap.attention_precision}."
    )
if cur.model.family.fixed_size(cur.model.config) is not None:
    st.caption(f"{cap.family} runs only at its configured input size, so every image is resized to it.")
left, right = st.columns([3, 2])
with left:
    fig = figures.image_figure(cap.image, patch_size=cap.patch_size, num_prefix_tokens=cap.num_prefix_tokens)
    common.chart(fig, key="patch_grid")
with right:
    ranked = common.classes(cur)
    if ranked is not None:
        common.chart(figures.predictions_figure(ranked.ranked[:5], how=ranked.legend), key="predictions")
        names = {p.index: f"{p.label} ({p.probability:.1%})" for p in ranked.ranked}
        if ss.class_index not in names:
            ss.class_index = ranked.ranked[0].index
        st.selectbox(
            "Label for the label-specific views"
            if ranked.labels
            else "Class for the class-specific views (any class; most probable first)",
            list(names),
            format_func=names.get,
            **common.keep("class_index"),
        )
        st.checkbox(
            "Keep this class for the next images",
            **common.keep("class_pinned"),
            help="Unticked, a new image explains its own most probable class.",
        )
    elif cur.model.zero_shot:
        st.info("Type labels in the sidebar to see how the image scores against them.")
    elif cur.model.text_note:
        st.warning(cur.model.text_note)
    else:
        st.info(
            f"{cap.model_name} is a backbone without a classifier: no predictions, and no class-specific relevance."
        )
common.chart(figures.token_sequence_figure(cap.token_kinds, cap.grid), key="sequence")
st.caption(
    "As in the ViT paper, the image is cut into patches, each flattened and linearly projected, "
    "and the sequence starts with the prefix tokens (CLS, and DeiT's DIST or DINOv2's registers)."
    + (
        " Hierarchical models start from this first-stage grid and merge tokens between stages."
        if cap.is_hierarchical
        else ""
    )
)
