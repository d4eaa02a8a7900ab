"""Patch embedding & token norms: what the first layer looks for, and which tokens grow large."""

import streamlit as st

from pages import common, views_model

cur = common.require_current()
cap = cur.cap

st.header("Patch embedding and token norms")
views_model.draw_components(cur, key="components")

s = 0
if len(cap.stages) > 1:
    s = st.radio(
        "Stage",
        range(len(cap.stages)),
        horizontal=True,
        key="norm_stage",
        format_func=lambda i: f"{i + 1} ({cap.stages[i].grid[0]} x {cap.stages[i].grid[1]})",
    )
views_model.draw_token_norms(cur, views_model.NormsSettings(s), key="norms")
