"""Compare explanations: every method's map for one class, their deletion and insertion curves, a table of areas."""

import numpy as np
import streamlit as st

from ui import causal_views, common, photo, target_boxes
from vitviz.analysis.scales import SCALES
from vitviz.errors import VitvizError
from vitviz.methods import METHODS, why_unavailable
from vitviz.text import md_plain

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("Which map can you trust?")
if cur.model.zero_shot:
    with st.expander("Labels (zero-shot): edit them here or in the sidebar"):
        target_boxes.labels_ui(cur.model, key="compare")
ranked = common.classes(cur)
if ranked is None:
    st.info(
        "Deletion and insertion follow the probability of a class or label: type labels in the sidebar."
        if cur.model.zero_shot
        else cur.model.text_note or "Deletion and insertion follow the probability of a class: they need a classifier."
    )
    st.stop()
labels = ranked.labels  # zero-shot: every method explains the label's score, and the curves follow its probability
# the boxes start from the session's target (class and "…minus" of Image & predictions) and follow it when it, the
# model or the labels change
start = target_boxes.session_target(ranked)
target_boxes.forget_widgets_unless(
    (cur.key, start, None if labels is None else labels.prompts), "compare_target_index", "compare_target_minus"
)
boxes, scale_box = st.columns([2, 1])  # the target and the colour scale in one row: the maps in view below
with boxes:
    target = target_boxes.target_ui(ranked, key="compare_target", start=start)
how = scale_box.radio(
    "Colour scale",
    SCALES,
    horizontal=True,
    key="compare_scale",
    help="fixed [0, max]: each map over its own maximum, a flat map stays flat (the default: it invents no "
    "contrast); per map: each map stretched from its min to its max (small differences look large); shared: "
    "one raw range for the whole panel.",
)
cls = target.index
name = target.name(cur.model.id2label)
what = "label" if labels else "class"
plain = {p.index: p.label for p in ranked.ranked}
if target.minus is None:
    measured = f"probability of '{plain[target.index]}'"
    st.caption(f"Explained: **{md_plain(name)}**; the curves follow its probability.")
else:
    measured = f"probability of '{plain[target.index]}' minus that of '{plain[target.minus]}'"
    st.caption(
        f"Explained: **{md_plain(name)}**, the difference of the two {what}{'e' if what == 'class' else ''}s' "
        "scores (before softmax): each "
        f"{what}-specific method explains that difference; the curves follow the {md_plain(measured)}."
    )
if labels:
    st.caption(f"Zero-shot: the label's score and its probability ({ranked.legend}) take the place of a class.")
skipped = {m: why_unavailable(cur.model, m, target) for m in METHODS if why_unavailable(cur.model, m, target)}
for method, why in skipped.items():
    st.caption(f"{method}: {why}")
agnostic = [m for m, meth in METHODS.items() if not meth.class_specific and m not in skipped]
st.caption(
    f"{', '.join(agnostic)}: the same map for every {what}"
    + (", so they do not explain the difference (shown for comparison)." if target.minus is not None else ".")
)

attnlrp = "attnlrp"
if "attnlrp" not in skipped:
    attnlrp = st.radio(
        "AttnLRP's rules",
        list(causal_views.ATTNLRP),
        format_func=causal_views.ATTNLRP.get,
        horizontal=True,
        key="compare_attnlrp",
        help="The paper's rules (the default) halve the relevance at attention's products and let the softmax "
        "absorb some; CP-LRP, as the lxt library explains vision transformers, holds the attention weights "
        "constant, so all of A v's relevance goes to the values (attnlrp_cp on the command line).",
    )
maps_bar = st.empty()  # per-method progress on the first open; gone once the maps are drawn


def _method_progress(done: int, total: int, name: str) -> None:
    text = f"Maps: {done} of {total} done" + (f", computing {name}…" if name else ".")
    maps_bar.progress(done / max(total, 1), text=text)


try:
    causal_views.target_maps(cur, target, progress=_method_progress, attnlrp=attnlrp)
except (VitvizError, ValueError) as exc:
    maps_bar.empty()
    st.error(str(exc))
    st.stop()
maps_bar.empty()
maps = causal_views.draw_method_maps(cur, causal_views.MethodMapsSettings(target, how, attnlrp), key="method")
names = list(maps)
photo.photo_panel(
    "method",
    [np.asarray(maps[m].values, np.float64) for m in names],
    [f"{m} for {name}" for m in names],
    index=None,
    colorbar_title="raw value",
    set_name="every method: raw units differ",
    default_scale="per_map",
)
with st.expander("How each map is defined"):
    for m in names:
        st.markdown(f"**{m}**: {maps[m].definition}")

st.subheader("Deletion and insertion")
STARTS = causal_views.STARTS
start = st.radio(
    "Insertion starts from",
    list(STARTS),
    format_func=STARTS.get,
    horizontal=True,
    key="insertion_start",
    help="Blur keeps each region's colour: where colour is the evidence (the demo shapes), insertion from blur is "
    "flat for every method. The default, the mean colour, hides colour and shape.",
)
key = ("curves", *cur.key, target, start, attnlrp)
if ss.get("curves_wanted") != key:
    st.button(
        "Compute the curves",
        type="primary",
        on_click=lambda: ss.update(curves_wanted=key),
        help="21 perturbed images per curve and method, forwarded in batches; kept for this image and class.",
    )
    st.caption(
        "Deletion removes the most important patches first (replaced by the image's mean colour); insertion "
        f"puts them back into {STARTS[start]}. The random map is the floor."
    )
else:
    stop = st.empty()  # the Stop button lives while the curves are computed, and goes with them
    stop.button("Stop", on_click=lambda: ss.update(curves_wanted=None))
    bar = st.progress(0.0, text="Forwarding the perturbed images…")

    def _curves_progress(done: int, total: int) -> None:
        # After a model switch (or Stop) a new run has begun while this one finishes its batch: its bar must
        # not come back on the new model's page, so it goes, and this run stops here.
        if ss.get("curves_wanted") != key:
            bar.empty()
            stop.empty()
            st.stop()
        bar.progress(done / max(total, 1), text=f"{done} of {total} images")

    settings = causal_views.CurvesSettings(target, start, attnlrp)
    try:
        causal_views.curves(cur, settings, progress=_curves_progress)
    except (VitvizError, ValueError) as exc:
        bar.empty()
        stop.empty()
        st.error(str(exc))
    else:
        bar.empty()
        stop.empty()
        causal_views.draw_curves(cur, settings, key="curves")
