"""Features: a sparse autoencoder's features of the image at one point, each patch's strongest, a feature's map and
histogram, the features ranked by their attribution to the explained target (estimate and exact), the feature card
from an index over a data set (top examples, histogram, direct effect), finding features by a label (CLIP, SigLIP),
and the run with a feature clamped, scaled or zeroed."""

import streamlit as st

from ui import common, feature_views
from vitviz.errors import VitvizError

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("Features (sparse autoencoder)")
sae = feature_views.choose_sae(cur)
if sae is None:
    st.stop()
folder = feature_views.sae_location()
sae_key = feature_views.sae_key(folder)
feature_views.draw_metrics(sae, folder)
try:
    with st.spinner("Encoding the image's tokens…"):
        feats = feature_views.features_of(cur, sae)
except VitvizError as exc:
    st.error(str(exc))
    st.stop()

gh, gw = feats.grid
patches = feats.values[feats.n_prefix : feats.n_prefix + gh * gw]
if "sae_token" not in ss or not 0 <= ss.sae_token < feats.num_tokens:
    ss.sae_token = feats.n_prefix + int(patches.max(dim=1).values.argmax())  # the patch with the strongest feature
if "sae_feature" not in ss or not 0 <= ss.sae_feature < sae.d_sae:
    ss.sae_feature = int(patches.max(dim=0).values.argmax())
if cur.model.zero_shot and cur.model.text is not None:
    found = feature_views.draw_label_search(cur, sae)
    if found is not None and found != ss.get("sae_label_shown"):
        ss.sae_feature = ss.sae_label_shown = found


def pick_token(data) -> None:
    ss.sae_token = int(data[0])


common.take_click("sae_map", pick_token)

token = ss.sae_token
if token < feats.n_prefix:
    label, marked = f"prefix token {token}", None
else:
    r, c = divmod(token - feats.n_prefix, gw)
    label, marked = f"the patch at row {r}, column {c}", (r, c)

left, right = st.columns([3, 2])
with right:
    st.subheader("Strongest features here")
    st.caption(f"Token {token}: {label}. Click a patch on the map to pick another.")
    top = feature_views.draw_token_features(feats, token, label)
    if top:
        choice = st.selectbox(
            "Show one of them",
            [i for i, _ in top],
            index=None,
            placeholder="a feature of this patch",
            key=f"sae_pick_{token}",
        )
        if choice is not None:
            ss.sae_feature = int(choice)
    st.number_input("Feature", 0, sae.d_sae - 1, key="sae_feature")
with left:
    feature_views.draw_feature_map(cur, feats, ss.sae_feature, marked, key="sae_map")
feature_views.draw_histogram(feats, ss.sae_feature)

st.subheader("Which features drive the target")
feature_views.draw_attribution(cur, sae, sae_key)

st.subheader("Feature card (over a data set)")
index = feature_views.choose_index(cur, sae, sae_key)
if index is not None:
    feature_views.draw_card(cur, sae, index, ss.sae_feature, sae_key)

st.subheader("Edit the feature")
e1, e2 = st.columns(2)
op = e1.radio("Edit", ("zero", "scale", "clamp"), horizontal=True, key="sae_op")
value = 0.0
if op == "scale":
    value = e2.number_input("Scale by", -10.0, 10.0, 2.0, 0.5, key="sae_scale")
elif op == "clamp":
    peak = float(patches[:, ss.sae_feature].max())
    value = e2.number_input("Clamp to", -100.0, 100.0, round(max(peak, 1.0) * 2, 2), key="sae_clamp")
feature_views.draw_edit(cur, sae, ss.sae_feature, op, value)
