"""Position information: the cosine-similarity grid of the ViT paper's Figure 7, or relative position biases."""

import numpy as np
import streamlit as st

from pages import common
from vitviz import figures
from vitviz.tables import long_table

cur = common.require_current()
cap, ss = cur.cap, st.session_state
info = cur.model.position

st.header("Position information")
if not info.tables and not info.biases:
    st.info(info.note or f"{cap.model_name} has no position embeddings vitviz can show.")
    st.stop()

if info.tables:
    st.subheader("Learned absolute position embeddings")
    t = 0
    if len(info.tables) > 1:
        t = st.radio(
            "Table",
            range(len(info.tables)),
            format_func=lambda i: info.tables[i].name,
            horizontal=True,
            key="position_table",
        )
    table = info.tables[t]
    sim = common.get_position_similarity(cap.model_name, t)
    g = table.grid
    common.take_click("position_grid", lambda data: ss.update(position=int(data[0]) * g[1] + int(data[1])))
    if not 0 <= ss.position < g[0] * g[1]:
        ss.position = 0
    st.caption(
        f"Cosine similarity between the position embedding of each position and all others, on the model's native "
        f"{g[0]} x {g[1]} grid ({table.name}; prefix tokens excluded). Click a tile to see it large."
    )
    left, right = st.columns([3, 2])
    with left:
        common.chart(
            figures.position_similarity_figure(sim, g), key="position_grid", on_select="rerun", selection_mode="points"
        )
    with right:
        st.number_input("Position (row-major index)", 0, g[0] * g[1] - 1, **common.keep("position"))
        r, c = divmod(ss.position, g[1])
        tile = sim[ss.position].reshape(g)
        common.chart(
            figures.map_figure(
                None,
                tile,
                patch_size=1,
                title=f"Similarity to position ({r}, {c})",
                colorbar_title="cosine similarity (raw)",
                zmin=-1,
                zmax=1,
                colorscale=figures.rgb_scale(figures.SIMILARITY_SCALE),
                marked=(r, c),
                height=420,
            ),
            key="position_tile",
        )
        common.downloads(
            "position_similarity",
            "positions",
            csv=long_table(sim, ("position (row-major)", "other position (row-major)"), "cosine similarity"),
            similarity=sim,
        )

if info.biases:
    st.subheader("Relative position bias")
    b = st.selectbox("Block", range(len(info.biases)), format_func=lambda i: info.biases[i].name, key="bias_block")
    bias = info.biases[b].bias
    w = (bias.shape[-1] + 1) // 2
    lim = float(np.abs(bias).max()) or 1.0
    common.chart(
        figures.small_multiples_figure(
            bias,
            [f"head {h}" for h in range(bias.shape[0])],
            colorbar_title="bias added to the logit (raw)",
            cols=6,
            zmin=-lim,
            zmax=lim,
            colorscale=figures.rgb_scale(figures.SIMILARITY_SCALE),
        ),
        key="bias_grid",
    )
    st.caption(
        f"Each tile is {2 * w - 1} x {2 * w - 1}: the centre is the query itself, and the cell (dy, dx) from the "
        f"centre is what the head adds to the attention logit of a key dy rows below and dx columns right of the "
        f"query, inside a {w} x {w} window."
    )
    offsets = long_table(bias, ("head", "dy", "dx"), "bias added to the attention logit (raw)")
    offsets["dy"], offsets["dx"] = offsets["dy"] - (w - 1), offsets["dx"] - (w - 1)
    common.downloads(f"relative_bias_{b}", "bias", csv=offsets, bias=bias)
if info.note:
    st.caption(info.note)
