"""Patch embedding & token norms: what the first layer looks for, and which tokens grow large."""

import numpy as np
import streamlit as st

from pages import common
from vitviz import figures
from vitviz.analysis.embeddings import token_norm_outliers
from vitviz.tables import long_table

cur = common.require_current()
cap = cur.cap

st.header("Patch embedding and token norms")
pcs = common.get_patch_components(cap.model_name)
if pcs is None:
    st.info(f"{cap.family} has no patch-embedding filters vitviz can show.")
else:
    common.chart(figures.patch_components_figure(pcs.components, pcs.explained_variance_ratio), key="components")
    common.downloads(
        "patch_components",
        "components",
        csv={
            **long_table(pcs.components, ("component", "row", "col", "channel"), "filter weight (unit-norm component)"),
            "explained variance of the component (fraction)": np.repeat(
                pcs.explained_variance_ratio, pcs.components[0].size
            ),
        },
        explained_variance_ratio=pcs.explained_variance_ratio,
        components=pcs.components,
    )

s = 0
if len(cap.stages) > 1:
    s = st.radio(
        "Stage",
        range(len(cap.stages)),
        horizontal=True,
        key="norm_stage",
        format_func=lambda i: f"{i + 1} ({cap.stages[i].grid[0]} x {cap.stages[i].grid[1]})",
    )
stage = cap.stages[s]
if stage.token_norms is None:
    st.info(f"{cap.family} gives no token states vitviz can measure at this stage.")
    st.stop()
kinds = stage.prefix_kinds + ("patch",) * (stage.grid[0] * stage.grid[1])
common.chart(figures.token_norms_figure(stage.token_norms, kinds), key="norms")
outliers = token_norm_outliers(stage.token_norms)
layers, tokens = np.nonzero(outliers)
if len(tokens):
    listed = sorted({cap.token_label(int(t), s) for t in tokens})
    st.warning(
        f"High-norm tokens (over 3x the block's median): {', '.join(listed[:12])}{' …' if len(listed) > 12 else ''}."
    )
else:
    st.caption("No token's norm exceeds 3x its block's median.")
norms = long_table(stage.token_norms, ("after layer (0: embeddings)", "token"), "token norm (L2)")
common.downloads(
    "token_norms",
    "norms",
    csv={**norms, "token kind": np.asarray(kinds)[norms["token"]]},
    token_norms=stage.token_norms,
)
