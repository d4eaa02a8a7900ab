"""Head importance: what knocking out each head does to the explained class, beside each head's direct share."""

import numpy as np
import streamlit as st

from pages import common
from vitviz import figures
from vitviz.errors import VitvizError
from vitviz.evaluate.head_estimate import trust_note
from vitviz.tables import long_table
from vitviz.text import md_plain, plotly_plain

cur = common.require_current()
cap, ss = cur.cap, st.session_state
common.clamp_state(cap)


def open_head(data) -> None:
    ss.layer, ss.head = int(data[0]), int(data[1])
    ss.open_heads_page = True


common.take_click("importance_map", open_head)
common.take_click("attribution_map", open_head)
if ss.pop("open_heads_page", False):
    st.switch_page("pages/heads.py")

st.header("Does this head matter?")
notes = common.get_causal_notes(cap.model_name)
ranked = common.classes(cur)
if ranked is None:
    st.info("Head importance changes class scores: it needs a classifier, or labels for a zero-shot model.")
    st.stop()
if notes["knockout"]:
    st.info(notes["knockout"])
    st.stop()
if notes["knockout_partial"]:
    st.caption(notes["knockout_partial"])
cls = ss.class_index if ss.class_index in {p.index for p in ranked.ranked} else ranked.ranked[0].index
name = next(p.label for p in ranked.ranked if p.index == cls)
labels = [cap.block_label(b) for b in range(cap.num_blocks)]
stages = [b.stage for b in cap.blocks] if len(cap.stages) > 1 else None

EXACT, ESTIMATE = "exact (one knock-out per head)", "fast estimate (first order)"
c1, c2 = st.columns(2)
method = c1.radio(
    "Method",
    [EXACT, ESTIMATE],
    horizontal=True,
    key="importance_method",
    help="Exact: every head knocked out alone, in batches. Fast: the logit's gradient times the change a knock-out "
    "makes, for all heads at once from one forward and one backward pass.",
)
c2.radio(
    "Replaced by",
    ["mean", "zero"],
    **common.keep("knockout_mode"),
    horizontal=True,
    help="What a knocked-out head's output z_h (its slice of the output projection's input) becomes, at every "
    "token: mean = its mean over this image's tokens (not a data-set mean); zero = 0, which also removes the "
    "head's value bias (ViT-Prisma folds it into the output bias and keeps it). The output projection's bias stays.",
)
fast = method.startswith("fast")
key = ("importance", *cur.key, cls, ss.knockout_mode, fast)
st.caption(
    f"Explained: **{md_plain(name)}** (pick another on *Image & predictions*); effects on its logit, before softmax."
)

left, right = st.columns(2)
with left:
    if ss.get("importance_wanted") != key:
        run, _ = st.columns([1, 2])
        run.button("Compute head importance", type="primary", on_click=lambda: ss.update(importance_wanted=key))
    if ss.get("importance_wanted") == key:
        stop = st.empty()  # the Stop button lives while the importance is computed, and goes with it
        stop.button(
            "Stop",
            on_click=lambda: ss.update(importance_wanted=None),
            help="Stops the computation; nothing partial is kept.",
        )
        bar = st.progress(0.0, text="Knocking out heads…")
        try:
            result = common.get_importance(
                cur,
                cls,
                ss.knockout_mode,
                fast,
                progress=lambda done, total: bar.progress(done / max(total, 1), text=f"{done} of {total} heads"),
            )
        except (VitvizError, ValueError) as exc:
            bar.empty()
            stop.empty()
            st.error(str(exc))
        else:
            bar.empty()
            stop.empty()
            title = "Fast estimate (first order, not exact)" if fast else "Effect of knocking out each head"
            fig = figures.layer_head_figure(
                result.effects,
                title=f"{title} on '{plotly_plain(name)}': click a cell to open that head",
                colorbar_title="estimated change of the logit" if fast else "change of the logit",
                marked=(ss.layer, ss.head),
                row_labels=labels,
                stage_of_block=stages,
                diverging=True,
            )
            if fast:  # every estimated number says so, the hover included
                fig.update_traces(
                    hovertemplate="%{customdata}, head %{x}<br>estimate %{z:.4g}<extra></extra>",
                    selector=dict(type="heatmap"),
                )
                exact_key = ("importance", *cur.key, cls, ss.knockout_mode, False)
                st.warning(f"These are estimates. {trust_note(ss.knockout_mode)}")
                st.button(
                    "Compute the exact effects",
                    type="primary",
                    key="importance_exact",
                    on_click=lambda: ss.update(importance_method=EXACT, importance_wanted=exact_key),
                    help="One knock-out per head, in batches; replaces the estimate on this page.",
                )
            common.chart(
                fig,
                key="importance_map",
                on_select="rerun",
                selection_mode="points",
            )
            if not fast:
                flips = np.argwhere(result.top1_changed)
                if len(flips):
                    st.warning(
                        "Knocking out any one of these heads changes the top class: "
                        + ", ".join(f"{labels[b]} head {h}" for b, h in flips[:8])
                    )
                else:
                    st.caption("No single head's knock-out changes the top class of this image.")
                st.caption(f"Cost: {result.forward_equivalents:.0f} forward-equivalents of work.")
            else:
                st.caption("First order: it can miss effects that need a large change (compare with the exact table).")
            if fast:
                common.downloads(
                    "head_importance_estimate",
                    "importance",
                    csv=long_table(
                        result.effects, ("block", "head"), f"estimated change of the logit of '{name}' (first order)"
                    ),
                    estimated_effects=result.effects,
                )
            else:
                common.downloads(
                    "head_importance",
                    "importance",
                    csv=long_table(result.effects, ("block", "head"), f"change of the logit of '{name}' (logits)"),
                    effects=result.effects,
                )
with right:
    if notes["attribution"]:
        st.info(f"Direct logit attribution: {notes['attribution']}")
    elif ranked.labels is not None:
        st.info("Direct logit attribution splits class logits; for label scores it is not defined here.")
    else:
        try:
            with st.spinner("Splitting the logit into heads…"):
                attr = common.get_attribution(cur, cls)
        except (VitvizError, ValueError) as exc:
            st.error(str(exc))
        else:
            common.chart(
                figures.layer_head_figure(
                    attr.heads,
                    title=f"Direct contribution of each head to '{plotly_plain(name)}'",
                    colorbar_title="share of the logit",
                    marked=(ss.layer, ss.head),
                    row_labels=labels,
                    stage_of_block=stages,
                    diverging=True,
                ),
                key="attribution_map",
                on_select="rerun",
                selection_mode="points",
            )
            st.caption(
                f"The logit {attr.logit:.3f} = heads {np.nansum(attr.heads):.3f} + MLPs {attr.mlps.sum():.3f} + "
                f"embeddings and biases {attr.rest:.3f}, with the final norm's scale frozen at the image's value."
            )
            heads_table = long_table(attr.heads, ("block", "head"), "direct contribution (logits)")
            common.downloads(
                "head_attribution",
                "attribution",
                csv={
                    "block": np.concatenate([heads_table["block"], np.arange(len(attr.mlps))]),
                    "part": [f"head {h}" for h in heads_table["head"]] + ["MLP"] * len(attr.mlps),
                    f"direct contribution to the logit of '{name}' (logits)": np.concatenate(
                        [heads_table["direct contribution (logits)"], attr.mlps]
                    ),
                },
                heads=attr.heads,
                mlps=attr.mlps,
            )
