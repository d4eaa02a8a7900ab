"""Layers & rollout: blocks side by side, rollout, class-specific relevance, DINO masks, per-head summaries."""

import numpy as np
import streamlit as st

from pages import common, photo, views
from vitviz import figures
from vitviz.analysis import maps
from vitviz.analysis.blocks import global_query, head_maps, row_map, select
from vitviz.analysis.masks import mass_masks
from vitviz.analysis.stats import SUMMARIES, summary_table
from vitviz.errors import VitvizError
from vitviz.figures.animation import lens_rows, view_stack
from vitviz.tables import long_table

cur = common.require_current()
cap, ss = cur.cap, st.session_state


def _through(k: int, n: int) -> str:
    """Which blocks relevance runs through when it starts at block ``k`` of ``n``."""
    return f"the last block ({k}) only" if k == n - 1 else f"blocks {k}-{n - 1}"


def prompt_words_ui(cur, label: str, prompt: str) -> None:
    """The label's prompt, each token coloured by its relevance for the label's score (text tower, Chefer et al.)."""
    try:
        words = common.get_prompt_relevance(*cur.key, cur.cap.image_embedding, label, prompt)
    except VitvizError as exc:
        st.error(str(exc))
        return
    st.markdown(figures.token_relevance_html(words.tokens, words.relevance), unsafe_allow_html=True)
    pooled = "its end-of-text token" if words.pooled is not None else "its last position (SigLIP pools padding)"
    st.caption(
        f"Prompt words for '{label}': relevance of each token (as the tokenizer cut it) for the label's score, "
        f"Chefer et al.'s rule on the text tower's attention from {pooled}, through all text blocks; "
        "darker = more relevant (hover for the raw value)."
    )


def open_head(data) -> None:
    ss.layer, ss.head = int(data[0]), int(data[1])
    ss.open_heads_page = True


common.take_click("summary_map", open_head)
common.take_click("rollout_map", lambda data: common.click_query(cap, ss.get("_rollout_stage", 0), data))
if ss.pop("open_heads_page", False):
    st.switch_page("pages/heads.py")
common.clamp_state(cap)
if ss.metric not in SUMMARIES:
    ss.metric = "distance"
stage_of_block = [b.stage for b in cap.blocks]

st.header("Blocks, rollout and explanations" if cap.is_hierarchical else "Layers, rollout and explanations")
c1, c2 = st.columns(2)
c1.selectbox("Head fusion", maps.FUSIONS, **common.keep("fusion"))
c2.caption(f"Query token: **{cap.token_label(ss.query, ss.query_stage)}** (pick another on the Heads page).")

# Blocks side by side: one row of tiles per stage (each stage has its own grid)
precision = "float32 mean" if ss.fusion == "mean" else cap.attention_precision
for stage in cap.stages:
    q = common.query_at(cap, stage.index)
    tiles = np.stack(
        [row_map(cap.blocks[b].geometry, select(cap.blocks[b], fusion=ss.fusion), q).values for b in stage.blocks]
    )
    where = f"stage {stage.index + 1} ({stage.grid[0]} x {stage.grid[1]}): " if len(cap.stages) > 1 else ""
    st.subheader(f"{where}where {cap.token_label(q, stage.index)} looks, block by block ({ss.fusion} of heads)")
    common.chart(
        figures.small_multiples_figure(
            tiles, [cap.block_label(b) for b in stage.blocks], colorbar_title=f"attention (raw, {precision})", cols=6
        ),
        key=f"layer_grid_{stage.index}",
    )

# Rollout and relevance
st.subheader("Attention rollout and class-specific relevance")
if cap.rollout_note:
    st.info(cap.rollout_note)
else:
    r1, r2 = st.columns(2)
    r1.slider(
        "Blocks rolled out" if cap.is_hierarchical else "Layers rolled out",
        0,
        cap.num_blocks - 1,
        **common.keep("rollout_range"),
    )
    r2.slider("Discard ratio (smallest entries zeroed per block)", 0.0, 0.95, step=0.05, **common.keep("discard"))
    start, end = ss.rollout_range
    rolled = views.RolloutSettings(
        start, end, query=common.query_at(cap, cap.blocks[end].stage), fusion=ss.fusion, discard=ss.discard
    )
    left, right = st.columns(2)
    with left:
        try:
            roll = views.draw_rollout(cur, rolled, key="rollout", config=photo.camera_config("rollout"))
        except (VitvizError, ValueError) as exc:
            st.error(str(exc))
            st.stop()
        ss._rollout_stage = roll.stage  # the grid the next click on this map lands on
        common.downloads(
            "rollout",
            "rollout",
            csv=long_table(roll.values, ("row", "col"), f"rollout weight (raw, {precision})"),
            rollout=roll.values,
            row=views.rollout_row(cur, rolled)[0],
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
            known = {p.index: p.label for p in ranked.ranked}
            cls = ss.class_index if ss.class_index in known else ranked.ranked[0].index
            n_enc = sum(b.kind != "pool" for b in cap.blocks)
            if not 0 <= ss.relevance_from < n_enc:
                ss.relevance_from = 0
            st.selectbox(
                "Relevance runs through",
                list(range(n_enc)),
                format_func=lambda k: "all blocks (default)" if k == 0 else _through(k, n_enc),
                help="Default: all blocks, as MM-Explainability's start_layer=0. Its CLIP notebook uses the last "
                "block only; earlier blocks then count as identities.",
                **common.keep("relevance_from"),
            )
            explained = views.RelevanceSettings(cls, known[cls], ranked.prompt(cls), ss.relevance_from)
            try:
                exp = views.relevance(cur, explained)
            except VitvizError as exc:
                st.error(str(exc))
            else:
                views.draw_relevance(cur, explained, key="relevance", config=photo.camera_config("relevance"))
                target = "the label's image-text score" if ranked.labels else "the class logit (before softmax)"
                through = "all blocks (the default)" if exp.start_block == 0 else _through(exp.start_block, n_enc)
                st.caption(
                    f"Row of the {exp.readout}, for {target}, through {through}. "
                    "Choose it on the *Image & predictions* page."
                )
                common.downloads(
                    f"relevance_{exp.class_index}",
                    "relevance",
                    csv=long_table(exp.patch_map(), ("row", "col"), f"relevance for '{exp.label}' (raw)"),
                    relevance=exp.patch_map(),
                )
                photo.photo_panel(
                    "relevance",
                    [exp.patch_map()],
                    [f"Relevance for '{exp.label}'"],
                    index=0,
                    colorbar_title="relevance (raw)",
                    set_name="one map",
                )
                if ranked.labels:
                    prompt_words_ui(cur, known[cls], ranked.prompt(cls))
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

# DINO masks on the last block's global map
last = cap.blocks[-1]
gq = global_query(last)
st.subheader(f"DINO attention masks (last block, {cap.token_label(gq, last.stage)})")
st.slider("Kept attention mass (tau)", 0.1, 1.0, step=0.05, **common.keep("tau"))
masks = mass_masks(head_maps(last, gq).values, tau=ss.tau).astype(np.float32)
common.chart(
    figures.small_multiples_figure(
        masks,
        [f"head {h}" for h in range(last.num_heads)],
        colorbar_title="kept (1) / dropped (0)",
        cols=6,
        zmin=0,
        zmax=1,
    ),
    key="masks",
)

# Per-head summaries
st.subheader("Per-head summaries")
st.radio("Metric", list(SUMMARIES), format_func=SUMMARIES.get, **common.keep("metric"), horizontal=True)
values = summary_table(cap.blocks, ss.metric)
labels = [cap.block_label(b) for b in range(cap.num_blocks)]
s1, s2 = st.columns(2)
with s1:
    common.chart(
        figures.layer_head_figure(
            values,
            title=f"{SUMMARIES[ss.metric]}: click a cell to open that head",
            colorbar_title=SUMMARIES[ss.metric],
            marked=(ss.layer, ss.head),
            row_labels=labels,
            stage_of_block=stage_of_block if len(cap.stages) > 1 else None,
        ),
        key="summary_map",
        on_select="rerun",
        selection_mode="points",
    )
    st.caption("Computed from the float32 weights as each block ran; blank cells are heads a block does not have.")
    common.downloads(
        "summaries",
        "summaries",
        csv={
            **long_table(summary_table(cap.blocks, "distance"), ("block", "head"), SUMMARIES["distance"]),
            SUMMARIES["entropy"]: summary_table(cap.blocks, "entropy").reshape(-1),
            SUMMARIES["entropy_norm"]: summary_table(cap.blocks, "entropy_norm").reshape(-1),
        },
        mean_attention_distance=summary_table(cap.blocks, "distance"),
        attention_entropy=summary_table(cap.blocks, "entropy"),
        attention_entropy_normalised=summary_table(cap.blocks, "entropy_norm"),
    )
with s2:
    common.chart(
        figures.distance_depth_figure(
            summary_table(cap.blocks, "distance"),
            image_px=max(cap.input_size),
            stage_of_block=stage_of_block if len(cap.stages) > 1 else None,
        ),
        key="distance_depth",
    )

# Logit lens
st.subheader("Logit lens")
ranked = common.classes(cur)
notes = common.get_causal_notes(cap.model_name)
partial_lens = (  # hierarchical with a readout head: the last stage's rows only
    cur.model.family.hierarchical
    and cur.model.has_classifier
    and cur.model.family.readout_head(cur.model.model) is not None
)
if notes["lens"] and not partial_lens:
    st.info(notes["lens"])
elif ranked is None or ranked.labels is not None:
    st.info("The logit lens reads class logits through the model's own head: it needs a classifier.")
else:
    try:
        with st.spinner("Reading the residual stream through the model's head…"):
            lens = common.get_lens(cur)
    except VitvizError as exc:
        st.error(str(exc))
    else:
        final = lens.logits[-1]
        top = np.argsort(-final)[:5]
        probs = lens.probabilities()[:, top]
        names = [cur.model.id2label.get(int(c), f"class {c}") for c in top]
        rows, ticks = lens_rows(cap)
        fig = figures.lens_figure(
            probs, names, lens.ranks(int(top[0])), target=names[0], row_labels=rows, tick_labels=ticks
        )
        common.chart(fig, key="lens")
        shown = [rows[r] for r in np.flatnonzero(lens.defined)]
        where = (
            ""
            if len(shown) == len(lens.defined)
            else f" Points drawn: {', '.join(shown)}; the other rows are not defined here."
        )
        st.caption(
            f"Each point: the residual stream after that block, through the model's final norm and head "
            f"({lens.readout}); the last is the model's own prediction."
            + where
            + (f" {lens.note}" if lens.note else "")
        )
        common.downloads(
            "logit_lens",
            "lens",
            csv={
                "residual stream": np.asarray(rows),
                **{f"probability of '{n}'": probs[:, k] for k, n in enumerate(names)},
                f"rank of '{names[0]}' (1 = top)": lens.ranks(int(top[0])),
            },
            logit_lens=lens.logits,
        )
