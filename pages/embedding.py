"""Patch embedding & token norms: what the first layer looks for, and which tokens grow large."""

import streamlit as st

from ui import common, model_views

cur = common.require_current()
cap = cur.cap

st.header("Patch embedding and token norms")
model_views.draw_components(cur, key="components")

s = 0
if len(cap.stages) > 1:
    s = st.radio(
        "Stage",
        range(len(cap.stages)),
        horizontal=True,
        key="norm_stage",
        format_func=lambda i: f"{i} ({cap.stages[i].grid[0]} x {cap.stages[i].grid[1]})",
    )
model_views.draw_token_norms(cur, model_views.NormsSettings(s), key="norms")
