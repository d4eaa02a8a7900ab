"""Image & predictions: the patch grid, the token sequence, the CLS-token top-k, and what a class's score rests on."""

import streamlit as st

from ui import common, model_views, target_boxes

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("How the ViT reads the image")
model_views.draw_model_summary(cur)
left, right = st.columns([3, 2])
with left:
    model_views.draw_patch_grid(cur, key="patch_grid")
with right:
    if cur.model.zero_shot:
        with st.expander("Labels (zero-shot): edit them here or in the sidebar"):
            target_boxes.labels_ui(cur.model, key="overview")
    ranked = model_views.draw_predictions(cur, key="predictions")
    if ranked is not None:
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
        minus = target_boxes.minus_ui(
            cur,
            ranked,
            ss.class_index,
            label=f"…minus {'label' if ranked.labels else 'class'} (for the relevance below)",
        )
        st.checkbox(
            "Keep this class for the next images",
            **common.keep("class_pinned"),
            help="Unticked, a new image explains its own most probable class.",
        )
    elif cur.model.zero_shot:
        st.info("Type labels in the sidebar (or in the box above) to see how the image scores against them.")
    elif cur.model.text_note:
        st.warning(cur.model.text_note)
    else:
        st.info(
            f"{cap.model_name} is a backbone without a classifier: no predictions, and no class-specific relevance."
        )
model_views.draw_token_sequence(cur, key="sequence")

if ranked is not None:
    target = ranked.target(ss.class_index, minus)
    st.subheader(f"What the {'label' if ranked.labels else 'class'}'s score rests on: relevance")
    ss.setdefault("overview_relevance", True)
    shown = st.toggle(
        "Draw the relevance map",
        help="One backward pass through the image's run (about one forward's time on a ViT-B/16 on CPU); "
        "off, this page runs no gradients.",
        **common.keep("overview_relevance"),
    )
    if cap.rollout_note:
        st.info(cap.rollout_note)
    elif shown:
        b1, b2 = st.columns(2)
        start = model_views.relevance_from_ui(cur, b1, "Image relevance runs through")
        text_start = model_views.text_relevance_from_ui(cur, b2) if ranked.labels else 0
        model_views.draw_target_relevance(
            cur,
            model_views.TargetRelevanceSettings(target, start, text_start),
            key="overview_relevance",
        )
