"""Layers & rollout: blocks side by side, rollout, class-specific relevance, DINO masks, per-head summaries."""

import streamlit as st

from ui import attention_views, common, model_views, photo, target_boxes
from vitviz.analysis import maps
from vitviz.analysis.blocks import global_query
from vitviz.analysis.stats import SUMMARIES
from vitviz.capture.targets import targets_arrays
from vitviz.errors import VitvizError
from vitviz.figures.animation import view_stack
from vitviz.tables import long_table

cur = common.require_current()
cap, ss = cur.cap, st.session_state


def open_head(data) -> None:
    ss.layer, ss.head = int(data[0]), int(data[1])
    ss.open_heads_page = True


common.take_click("summaries_map", open_head)
common.take_click("rollout_map", lambda data: common.click_query(cap, ss.get("_rollout_stage", 0), data))
if ss.pop("open_heads_page", False):
    st.switch_page("pages/heads.py")
common.clamp_state(cap)
if ss.metric not in SUMMARIES:
    ss.metric = "distance"

st.header("Blocks, rollout and explanations")
# rollout and relevance first (at 1366 x 768 the rollout map is in view as the page opens), the blocks after
c1, c2, c3 = st.columns(3)
c1.selectbox("Head fusion", maps.FUSIONS, **common.keep("fusion"))
precision = "float32 mean" if ss.fusion == "mean" else cap.attention_precision
st.caption(f"Query token: **{cap.token_label(ss.query, ss.query_stage)}** (pick another on the Heads page).")

# Rollout and relevance
if cap.rollout_note:
    st.info(cap.rollout_note)
else:
    c2.slider("Blocks rolled out", 0, cap.num_blocks - 1, **common.keep("rollout_range"))
    c3.slider("Discard ratio (smallest entries zeroed per block)", 0.0, 0.95, step=0.05, **common.keep("discard"))
    start, end = ss.rollout_range
    rolled = attention_views.RolloutSettings(
        start, end, query=common.query_at(cap, cap.blocks[end].stage), fusion=ss.fusion, discard=ss.discard
    )
    left, right = st.columns(2)
    with left:
        try:
            roll = attention_views.draw_rollout(
                cur, rolled, key="rollout", config=photo.camera_config("rollout"), height=400
            )
        except (VitvizError, ValueError) as exc:
            st.error(str(exc))
            st.stop()
        ss._rollout_stage = roll.stage  # the grid the next click on this map lands on
        common.downloads(
            "rollout",
            "rollout",
            csv=long_table(roll.values, ("row", "col"), f"rollout weight (raw, {precision})"),
            rollout=roll.values,
            row=attention_views.rollout_row(cur, rolled)[0],
        )
    with right:
        ranked = common.classes(cur)
        if ranked is None:
            st.info(
                "Label-specific relevance needs labels: type them in the sidebar."
                if cur.model.zero_shot
                else cur.model.text_note
                or "Class-specific relevance needs a classifier; this checkpoint is a backbone."
            )
        else:
            cls = target_boxes.session_target(ranked).index
            b1, b2 = st.columns(2)
            start = model_views.relevance_from_ui(cur, b1)
            minus = target_boxes.minus_ui(cur, ranked, cls, b2)
            target = ranked.target(cls, minus)
            name = target.name(cur.model.id2label)
            explained = attention_views.RelevanceSettings(target, start)
            try:
                exp = attention_views.relevance(cur, explained)
            except VitvizError as exc:
                st.error(str(exc))
            else:
                attention_views.draw_relevance(
                    cur, explained, key="relevance", config=photo.camera_config("relevance"), height=400
                )
                through = model_views.through(exp.start_block, model_views.image_blocks(cur))
                st.caption(
                    f"Explained: {model_views.explained(target, name)}. Chefer et al.'s rule, the {exp.readout} "
                    f"row of R, through {through}. The {'label' if ranked.labels else 'class'} is chosen on the "
                    "*Image & predictions* page; the minus here or there (one choice)."
                )
                common.downloads(
                    f"relevance_{target.index}" + ("" if minus is None else f"_minus_{minus}"),
                    "relevance",
                    csv=long_table(exp.patch_map(), ("row", "col"), f"relevance for {name} (raw)"),
                    relevance=exp.patch_map(),
                    **targets_arrays(target, cur.model.id2label),
                )
                photo.photo_panel(
                    "relevance",
                    [exp.patch_map()],
                    [f"Relevance for {name}"],
                    index=0,
                    colorbar_title="relevance (raw)",
                    set_name="one map",
                )
                if ranked.labels:  # the prompt words run through the text blocks chosen on the Overview
                    model_views.draw_prompt_words(cur, target, model_views.text_relevance_from(cur))
    photo.photo_panel(
        "rollout",
        [roll.values],
        [f"Rollout of {cap.token_label(rolled.query, cap.blocks[end].stage)}, blocks {start}-{end}"],
        index=0,
        colorbar_title=f"rollout (raw, {precision})",
        set_name="one map",
        gif=lambda view: view_stack(cap, view),
        gif_views=("rollout", "mean"),
    )

# Blocks side by side: one row of tiles per stage (each stage has its own grid)
for stage in cap.stages:
    attention_views.draw_blocks(
        cur, attention_views.BlocksSettings(stage.index, common.query_at(cap, stage.index), ss.fusion), key="layer_grid"
    )

# DINO masks on the last block's global map
last = cap.blocks[-1]
gq = global_query(last)
st.subheader(f"DINO attention masks (last block, {cap.token_label(gq, last.stage)})")
st.slider("Kept attention mass (tau)", 0.1, 1.0, step=0.05, **common.keep("tau"))
attention_views.draw_masks(cur, attention_views.MasksSettings(ss.tau), key="masks")

# Per-head summaries
st.subheader("Per-head summaries")
st.radio("Metric", list(SUMMARIES), format_func=SUMMARIES.get, **common.keep("metric"), horizontal=True)
attention_views.draw_summaries(
    cur, attention_views.SummarySettings(ss.metric, marked=(ss.layer, ss.head)), key="summaries"
)

# Logit lens
st.subheader("Logit lens")
attention_views.draw_lens(cur, attention_views.LensSettings(), key="lens")
