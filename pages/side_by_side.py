"""Side by side: one view of two models, two images or two labels; clicks, block and head kept in step.

Pane A is the sidebar's model and image. One choice says what differs in pane B (the rest is
shared). The rules that keep the panes in step are :mod:`vitviz.compare`'s. Each pane is drawn by the
view the Heads and Layers pages draw (:mod:`ui.attention_views`), called once per pane with that pane's state.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import streamlit as st

from ui import attention_views, common, feature_views, target_boxes
from vitviz import figures
from vitviz.compare import depth_match, difference, token_of
from vitviz.data.images import read_image
from vitviz.errors import VitvizError
from vitviz.tables import long_table
from vitviz.text import md_plain, plotly_plain

cur = common.require_current()
ss = st.session_state
st.header("Side by side")
st.caption(
    "Pane A: the sidebar's model and image; pane B differs in one thing. A click on either image sets the query at "
    "the same point in both panes; blocks are matched by relative depth, heads by index."
)

DIFFERS = ["models", "images", "labels"] if cur.model.zero_shot else ["models", "images"]
# the controls in two rows: at 1366 x 768 both panes are in view as the page opens
row1 = st.columns([2, 3, 3])
differs = row1[0].radio("What differs", DIFFERS, horizontal=True, key="sbs_differs")
VIEWS = {
    "head": "one head",
    "mean": "mean of the heads",
    "rollout": "rollout",
    "relevance": "relevance",
    "feature": "SAE feature",
}


def _model_of_pane_b() -> str | None:
    """Pane B's model. Each new choice is asked for as the sidebar's are (``common.request_model``: the server's
    policy, and one model change of the visitor's limit), once: reruns that still show a refused choice do not ask
    again (a rate-limited one is asked again, counted only once allowed). A refused choice keeps the model pane B
    had; None (the reason shown) when it had none yet."""
    options = common.model_options()
    other = next((m for m in options if m != ss.model_name), ss.model_name)
    what = st.selectbox("Model of pane B", options, index=options.index(other), key="sbs_model")
    if what in (ss.model_name, ss.get("sbs_model_ok")):  # no new model to load
        return what
    refusal = ss.get("sbs_model_refusal")
    if ss.get("sbs_model_asked") != what or (refusal and refusal[1]):
        ss.sbs_model_asked = what
        if common.request_model(what, refusal_key="sbs_model_refusal") is not None:
            ss.sbs_model_ok = what
            return what
    elif refusal:
        st.error(refusal[0])
    return ss.get("sbs_model_ok")


def _judge_upload(up) -> str | None:
    """Why pane B's upload is refused (None when it is not), judged once per file: it counts as one of the visitor's
    uploads, as the sidebar's do, and is checked as they are."""
    seen = ss.get("sbs_upload_seen")
    if seen is None or seen[0] != up.file_id:
        try:
            common.session_limits().uploads.acquire()  # public mode: the sidebar's limit, shared
            read_image(up.getvalue(), max_bytes=common.upload_limit())
            seen = (up.file_id, None)
        except VitvizError as exc:
            seen = (up.file_id, f"{md_plain(up.name)}: {exc}")
        ss.sbs_upload_seen = seen
    return seen[1]


def _pane_b() -> tuple[common.Current, str] | None:
    """Pane B's model and capture, and what names it; None (with a message) when it cannot be shown."""
    state, what = common.state_from_session(), ""
    if differs == "models":
        what = _model_of_pane_b()
        if what is None:
            return None
        state = state.with_model(what)  # at its own input size, with its own labels
    elif differs == "images":
        source = st.radio("Image of pane B", ["flipped copy", "an example", "upload"], horizontal=True, key="sbs_src")
        if source == "flipped copy":  # made once per image for the whole server, inside the decode budget
            try:
                flipped, flipped_digest = common.flipped_image(ss.image_bytes, ss.image_digest)
            except VitvizError as exc:
                st.error(f"Pane B: {exc}")
                return None
            state, what = replace(state, image_bytes=flipped, image_digest=flipped_digest), "flipped"
        elif source == "an example":
            examples = sorted(p.name for p in common.EXAMPLES.iterdir() if p.suffix.lower() in {".jpg", ".png"})
            pick = st.selectbox("Example", examples, key="sbs_example")
            state, what = state.with_image((common.EXAMPLES / pick).read_bytes()), pick
        else:
            up = st.file_uploader("Image of pane B", type=["png", "jpg", "jpeg", "webp"], key="sbs_upload")
            if up is None:
                st.info("Upload an image for pane B.")
                return None
            refused = _judge_upload(up)
            if refused:
                st.error(f"Pane B: {refused}")
                return None
            state, what = state.with_image(up.getvalue()), up.name
    cur_b = common.current_of(state, name="Pane B")
    return None if cur_b is None else (cur_b, what)


with row1[1]:
    pane = _pane_b()
if pane is None:
    st.stop()
cur_b, what_b = pane
cap_a, cap_b = cur.cap, cur_b.cap


def _click(cap):
    h, w = cap.input_size
    return lambda data: ss.update(sbs_point=(float(data[4]) / w, float(data[5]) / h))


# a click is the point both panes use: read before they are computed, so the run it starts shows it
common.take_click("sbs_a_map", _click(cap_a))
common.take_click("sbs_b_map", _click(cap_b))

c1, c2, c3 = st.columns([4, 3, 1])
view = c1.radio("View", list(VIEWS), format_func=VIEWS.get, horizontal=True, key="sbs_view")
block_a = c2.slider("Block (pane A)", 0, cap_a.num_blocks - 1, cap_a.num_blocks - 1, key="sbs_block")
block_b = depth_match(block_a, cap_a.num_blocks, cap_b.num_blocks)
head = c3.number_input("Head", 0, max(cap_a.num_heads, cap_b.num_heads) - 1, 0, key="sbs_head")
scale = row1[2].radio(
    "Colour scale",
    ["shared [0, max of both]", "each map [0, its max]", "each map [its min, its max]"],
    horizontal=True,
    key="sbs_scale",
    help="Shared: the same colour means the same number in both panes (default; it invents no contrast). "
    "Per map: each pane stretched to its own range, which hides that one map may be much flatter.",
)


def _feature_choice():
    """The SAE (one for both panes) and the feature the "SAE feature" view draws; None (the reason shown)."""
    s1, s2 = st.columns([3, 1])
    with s1:
        sae = feature_views.choose_sae(cur, prefix="sbs_sae", others=(cur_b.model,), check=False)
    if sae is None:
        return None
    if "sbs_feature" not in ss or not 0 <= ss.sbs_feature < sae.d_sae:
        ss.sbs_feature = _strongest(sae)
    feature = s2.number_input("Feature", 0, sae.d_sae - 1, key="sbs_feature")
    return sae, int(feature)


def _strongest(sae) -> int:
    """The feature strongest on a patch of pane A's image (else of pane B's; 0 where the SAE fits neither)."""
    for cur_x in (cur, cur_b):
        try:
            feats = feature_views.features_of(cur_x, sae)
        except VitvizError:
            continue
        gh, gw = feats.grid
        return int(feats.values[feats.n_prefix : feats.n_prefix + gh * gw].max(dim=0).values.argmax())
    return 0


def _target(cur_x: common.Current, label_key: str | None, session: bool):
    """The target a pane explains (``Target``): the chosen zero-shot label (``label_key``); else the session's
    target (``session``: pane A, and pane B where its classes are pane A's, so both explain the same thing); else
    a target box of the pane's own (pane B of a model whose class indices mean other things)."""
    ranked = common.classes(cur_x)
    if ranked is None:
        return None
    if label_key is not None and ranked.labels is not None:
        names = list(ranked.labels.names)
        default = ranked.ranked[0].index if label_key == "sbs_label_a" else ranked.ranked[min(1, len(names) - 1)].index
        pick = st.selectbox(
            "Label of pane A" if label_key == "sbs_label_a" else "Label of pane B",
            range(len(names)),
            index=default,
            format_func=lambda i: names[i],
            key=label_key,
        )
        return ranked.target(pick)
    if session:
        return target_boxes.session_target(ranked)
    return _own_target(cur_x, ranked)


def _own_target(cur_x: common.Current, ranked: common.Classes):
    """Pane B of a model whose classes are not pane A's: a target box of its own (class or label, minus another),
    starting from its top-1; what was chosen is forgotten with pane B's model, image or labels (indices mean other
    things then)."""
    owner = (cur_x.key, None if ranked.labels is None else ranked.labels.prompts)
    target_boxes.forget_widgets_unless(owner, "sbs_b_target_index", "sbs_b_target_minus")
    what = "label" if ranked.labels is not None else "class"
    st.markdown(f"**Target of pane B** (its model has other classes; starts from its top-1 {what})")
    return target_boxes.target_ui(ranked, key="sbs_b_target")


def _settings(cur_x: common.Current, block: int, target):
    """What a pane's view shows: the same view, block by depth, head by index, query at the clicked point."""
    cap, point = cur_x.cap, ss.get("sbs_point")
    if view == "feature":
        return attention_views.FeatureSettings(*chosen)
    if view == "relevance":
        if target is None:
            raise ValueError("relevance needs a classifier or zero-shot labels")
        return attention_views.RelevanceSettings(target)
    if view == "rollout":  # through every block, of the clicked token (else of what the model reads)
        return attention_views.RolloutSettings(
            query=None if point is None else token_of(cap, cap.blocks[-1].stage, point)
        )
    b = cap.blocks[block]
    one = min(max(int(head), 0), b.num_heads - 1) if view == "head" else None
    return attention_views.HeadSettings(block, token_of(cap, b.stage, point), head=one)


MAP_OF = {
    "head": attention_views.head_map,
    "mean": attention_views.head_map,
    "rollout": attention_views.rollout_map,
    "relevance": attention_views.relevance_map,
    "feature": attention_views.feature_map,
}
DRAW = {
    "head": attention_views.draw_head_map,
    "mean": attention_views.draw_head_map,
    "rollout": attention_views.draw_rollout,
    "relevance": attention_views.draw_relevance,
    "feature": attention_views.draw_feature,
}

labels_differ = differs == "labels"
explains = view == "relevance" or labels_differ
# Pane B explains the session's target too where class indices mean the same thing: the same model (another image),
# or another classifier with the same classes in the same order; else its own top-1.
same_classes = differs == "images" or (
    not cur.model.zero_shot and not cur_b.model.zero_shot and cur_b.model.id2label == cur.model.id2label
)
target_a = _target(cur, "sbs_label_a" if labels_differ else None, True) if explains else None
target_b = _target(cur_b, "sbs_label_b" if labels_differ else None, same_classes) if explains else None
if labels_differ and view != "relevance":
    st.info("Labels change only class-specific views: choose relevance to compare two labels.")
elif view == "relevance" and not labels_differ:
    st.caption(
        'Relevance explains the session\'s target (the class, and the "…minus" of Image & predictions) in pane A'
        + (" and in pane B." if same_classes else "; pane B, a model with other classes, the target chosen above.")
    )

chosen = _feature_choice() if view == "feature" else None
if view == "feature" and chosen is None:
    st.stop()
if view == "feature":
    st.caption(
        "The same SAE and feature in both panes: the feature's activation on each patch at the SAE's point (prefix "
        "tokens left out), read from each pane's clean run. A pane whose model lacks the SAE's point or width says "
        "why instead of drawing. Colour: the scale chosen above (by default shared, [0, the larger maximum of the "
        "two]: the same colour is the same activation in both panes)."
        + (
            " A model of the same point and width is drawn too, though the SAE may have been trained on the other: "
            "read its pane with care."
            if differs == "models"
            else ""
        )
    )

try:
    with st.spinner("Computing both panes…"):
        shown = [_settings(cur, block_a, target_a), _settings(cur_b, block_b, target_b)]
except (VitvizError, ValueError) as exc:
    st.error(str(exc))
    st.stop()
maps, why_not = [], []
for cur_x, settings in zip((cur, cur_b), shown, strict=True):
    try:
        with st.spinner("Computing both panes…"):
            maps.append(MAP_OF[view](cur_x, settings).values)
        why_not.append(None)
    except (VitvizError, ValueError) as exc:
        if view != "feature":  # the other views: both panes or neither
            st.error(str(exc))
            st.stop()
        maps.append(None)
        why_not.append(str(exc))
drawn_values = [m for m in maps if m is not None]
if not drawn_values:
    st.error(f"Neither pane can draw feature {chosen[1]}: " + "; ".join(why_not))
    st.stop()

if scale.startswith("shared"):
    top = float(max(np.nanmax(m) for m in drawn_values))
    limits = [(0.0, top), (0.0, top)]
elif scale.startswith("each map [0"):
    limits = [(0.0, float(np.nanmax(m))) if m is not None else (0.0, 0.0) for m in maps]
else:
    limits = [(float(np.nanmin(m)), float(np.nanmax(m))) if m is not None else (0.0, 0.0) for m in maps]

drawn_maps = []
panes = zip(st.columns(2), (cur, cur_b), shown, limits, ("A", "B"), why_not, strict=True)
for col, cur_x, settings, (lo, hi), who, why in panes:
    with col:  # the same view function, called once per pane with that pane's state
        if why is not None:
            st.warning(f"Pane {who} ({md_plain(cur_x.cap.model_name)}) draws no feature map: {why}")
            drawn_maps.append(None)
            continue
        drawn = DRAW[view](
            cur_x,
            settings,
            key=f"sbs_{who.lower()}",
            title_prefix=f"{who}. {plotly_plain(cur_x.cap.model_name)}: ",
            zmin=lo,
            zmax=hi,
            opacity=1.0,
            height=350,
        )
        st.caption(f"Range of this map: {np.nanmin(drawn.values):.4g} .. {np.nanmax(drawn.values):.4g}")
        drawn_maps.append(drawn)
if differs == "models":
    st.caption(
        f"Pane B: {md_plain(what_b)}, {cap_b.block_label(block_b)} (the same relative depth as "
        f"{cap_a.block_label(block_a)})."
    )
if any(m is None for m in maps):
    st.caption("No difference panel and no files: one pane has no map.")
    st.stop()
map_a, map_b = maps

diff = difference(map_a, map_b)
# the files name each pane's map and its unit (its colour bar), as drawn
names = [f"{who}: {plotly_plain(m.title)} ({m.colorbar_title})" for who, m in zip("AB", drawn_maps, strict=True)]
if diff is None:
    st.caption(
        f"No difference panel: the maps lie on different grids ({map_a.shape[0]} x {map_a.shape[1]} and "
        f"{map_b.shape[0]} x {map_b.shape[1]}, rows x columns)."
    )
    a_rows, b_rows = long_table(map_a, ("row", "col"), "value"), long_table(map_b, ("row", "col"), "value")
    common.downloads(
        "side_by_side",
        "sbs",
        csv={
            "pane": ["A"] * map_a.size + ["B"] * map_b.size,
            "map (unit)": [names[0]] * map_a.size + [names[1]] * map_b.size,
            "row": np.concatenate([a_rows["row"], b_rows["row"]]),
            "col": np.concatenate([a_rows["col"], b_rows["col"]]),
            "value": np.concatenate([a_rows["value"], b_rows["value"]]),
        },
        a=map_a,
        b=map_b,
    )
else:
    bound = float(np.nanmax(np.abs(diff))) or 1.0
    common.chart(
        figures.map_figure(
            None,
            diff,
            title="A minus B (same grid)",
            colorbar_title="A - B",
            zmin=-bound,
            zmax=bound,
            colorscale="RdBu_r",
            height=360,
        ),
        key="sbs_diff",
    )
    st.caption("Red: larger in A; blue: larger in B; symmetric scale around 0.")
    table = long_table(map_a, ("row", "col"), names[0])
    common.downloads(
        "side_by_side",
        "sbs",
        csv={**table, names[1]: map_b.reshape(-1), "A - B (the difference panel, A's unit)": diff.reshape(-1)},
        a=map_a,
        b=map_b,
        difference=diff,
    )
