"""Patch embedding & token norms: what the first layer looks for, and which tokens grow large."""

import numpy as np
import streamlit as st

from pages import common
from vitviz import figures
from vitviz.analysis.embeddings import token_norm_outliers

cur = common.require_current()
cap = cur.cap

st.header("Patch embedding and token norms")
pcs = common.get_patch_components(cap.model_name)
st.plotly_chart(figures.patch_components_figure(pcs.components, pcs.explained_variance_ratio), key="components")
common.downloads(
    "patch_components", "components", explained_variance_ratio=pcs.explained_variance_ratio, components=pcs.components
)

st.plotly_chart(figures.token_norms_figure(cap.token_norms, cap.token_kinds), key="norms")
outliers = token_norm_outliers(cap.token_norms)
layers, tokens = np.nonzero(outliers)
if len(tokens):
    listed = sorted({cap.token_label(int(t)) for t in tokens})
    st.warning(
        f"High-norm tokens (over 3x the layer's median): {', '.join(listed[:12])}{' …' if len(listed) > 12 else ''}."
    )
else:
    st.caption("No token's norm exceeds 3x its layer's median.")
common.downloads("token_norms", "norms", token_norms=cap.token_norms)
