"""Image & predictions: the patch grid, the token sequence, the CLS-token top-k, and what a class's score rests on."""

import streamlit as st

from pages import common
from vitviz import figures
from vitviz.capture.targets import Target
from vitviz.errors import VitvizError
from vitviz.tables import long_table
from vitviz.text import md_plain, plotly_plain

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
    if cur.model.zero_shot:
        with st.expander("Labels (zero-shot): edit them here or in the sidebar"):
            common.labels_ui(cur.model, key="overview")
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
        what = "label" if ranked.labels else "class"
        common.forget_widgets_unless(
            (cur.key[0], None if ranked.labels is None else ranked.labels.prompts), "overview_minus"
        )
        minus = st.selectbox(
            f"…minus {what} (for the relevance below)",
            [None, *(p.index for p in ranked.ranked if p.index != ss.class_index)],
            format_func=lambda i: "(none)" if i is None else names[i],
            key="overview_minus",
            help=f"Explain the difference of two scores: this {what}'s minus the other's (before softmax), "
            f"'{what} A rather than {what} B'.",
        )
        minus = None if minus == ss.class_index else minus
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


def _through(k: int, n: int, what: str = "blocks") -> str:
    """Which blocks relevance runs through when it starts at block ``k`` of ``n``."""
    if k == 0:
        return f"all {what} (default)"
    return f"the last block ({k}) only" if k == n - 1 else f"{what} {k}-{n - 1}"


def prompt_words(target: Target, start_block: int) -> None:
    """Each explained label's prompt, its tokens coloured by their relevance for that label's score."""
    for i in (target.index, target.minus):
        if i is None:
            continue
        label, prompt = target.labels[i], target.prompts[i]
        try:
            words = common.get_prompt_relevance(*cur.key, cap.image_embedding, label, prompt, start_block=start_block)
        except VitvizError as exc:
            st.error(str(exc))
            return
        st.markdown(figures.token_relevance_html(words.tokens, words.relevance), unsafe_allow_html=True)
        pooled = "its end-of-text token" if words.pooled is not None else "its last position (SigLIP pools padding)"
        st.caption(
            f"Prompt words for '{md_plain(label)}': relevance of each token (as the tokenizer cut it) for the score "
            f"of label '{md_plain(label)}', Chefer et al.'s rule on the text tower's attention from {pooled}, "
            f"through {_through(words.start_block, n_text, 'text blocks')}; darker = more relevant "
            "(hover for the raw value)."
        )


if ranked is not None:
    target = (
        Target.of_label(ranked.labels, ss.class_index, minus)
        if ranked.labels
        else Target.of_class(ss.class_index, minus)
    )
    name = target.name(cur.model.id2label)
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
        n_enc = sum(b.kind != "pool" for b in cap.blocks)
        n_text = common.text_blocks(cur.model) if ranked.labels else 0
        if not 0 <= ss.relevance_from < n_enc:
            ss.relevance_from = 0
        ss.setdefault("text_relevance_from", 0)
        if not 0 <= ss.text_relevance_from < max(n_text, 1):
            ss.text_relevance_from = 0
        b1, b2 = st.columns(2)
        b1.selectbox(
            "Image relevance runs through",
            list(range(n_enc)),
            format_func=lambda k: _through(k, n_enc),
            help="Default: all blocks, as MM-Explainability's start_layer=0. Its CLIP notebook uses the last "
            "block only; earlier blocks then count as identities.",
            **common.keep("relevance_from"),
        )
        if n_text:
            b2.selectbox(
                "Prompt-word relevance runs through",
                list(range(n_text)),
                format_func=lambda k: _through(k, n_text, "text blocks"),
                help="The text tower's blocks, on their own: default all of them (MM-Explainability's "
                "start_layer=0); its CLIP notebook's default is the last block only (start_layer_text=-1).",
                **common.keep("text_relevance_from"),
            )
        try:
            with st.spinner("Computing gradients for the relevance map…"):
                exp = common.get_target_relevance(cur, target, ss.relevance_from)
        except VitvizError as exc:
            st.error(str(exc))
        else:
            rel = exp.patch_map()
            common.chart(
                figures.map_figure(
                    cap.image,
                    rel,
                    title=f"Relevance for {plotly_plain(name)} (Chefer et al. 2021)",
                    colorbar_title="relevance (raw)",
                ),
                key="overview_relevance",
            )
            score = "image-text score" if ranked.labels else "logit (before softmax)"
            what = (
                f"the {score} of **{md_plain(name)}**"
                if target.minus is None
                else f"**{md_plain(name)}**, the difference of the two {score}s"
            )
            st.caption(
                f"Explained: {what}. Chefer et al.'s rule, the {exp.readout} row of R, through "
                f"{_through(exp.start_block, n_enc)}."
            )
            common.downloads(
                "relevance_target",
                "overview_relevance",
                csv=long_table(rel, ("row", "col"), f"relevance for {name} (raw)"),
                relevance=rel,
            )
            if ranked.labels:
                prompt_words(target, ss.text_relevance_from)
