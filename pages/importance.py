"""Head importance: what knocking out each head does to the explained class, beside each head's direct share."""

import streamlit as st

from ui import cached, causal_views, common
from vitviz.errors import VitvizError
from vitviz.evaluate.head_estimate import trust_note
from vitviz.text import md_plain

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
notes = cached.get_causal_notes(cap.model_name)
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
score = "image-text score" if ranked.labels else "logit"  # a zero-shot label's score is no logit
st.caption(
    f"Explained: {'label' if ranked.labels else 'class'} **{md_plain(name)}** (pick another on *Image & "
    f"predictions*); effects on its {score}, before softmax."
)

left, right = st.columns(2)
with left:
    # A table this session computed before (another "Replaced by", then back) is shown at once: kept per setting.
    done = ss.setdefault("importance_done", set())
    computed = key in done and cached.has_importance(cur, cached.target_of(cur, cls), ss.knockout_mode, fast)
    if ss.get("importance_wanted") != key and not computed:
        st.button("Compute head importance", type="primary", on_click=lambda: ss.update(importance_wanted=key))
    if ss.get("importance_wanted") == key or computed:
        stop = st.empty()  # the Stop button lives while the importance is computed, and goes with it
        if not computed:
            stop.button(
                "Stop",
                on_click=lambda: ss.update(importance_wanted=None),
                help="Stops the computation; nothing partial is kept.",
            )
        bar = st.progress(0.0, text="Knocking out heads…")
        settings = causal_views.ImportanceSettings(cls, ss.knockout_mode, fast, marked=(ss.layer, ss.head))
        try:
            causal_views.importance(
                cur,
                settings,
                progress=lambda done, total: bar.progress(done / max(total, 1), text=f"{done} of {total} heads"),
            )
        except (VitvizError, ValueError) as exc:
            bar.empty()
            stop.empty()
            st.error(str(exc))
        else:
            bar.empty()
            stop.empty()
            done.add(key)
            if fast:
                exact_key = ("importance", *cur.key, cls, ss.knockout_mode, False)
                st.warning(f"These are estimates. {trust_note(ss.knockout_mode)}")
                st.button(
                    "Compute the exact effects",
                    type="primary",
                    key="importance_exact",
                    on_click=lambda: ss.update(importance_method=EXACT, importance_wanted=exact_key),
                    help="One knock-out per head, in batches; replaces the estimate on this page.",
                )
            causal_views.draw_importance(cur, settings, key="importance")
with right:
    causal_views.draw_attribution(
        cur, causal_views.AttributionSettings(cls, marked=(ss.layer, ss.head)), key="attribution"
    )
