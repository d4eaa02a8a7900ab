"""Position information: the cosine-similarity grid of the ViT paper's Figure 7, or relative position biases."""

import streamlit as st

from ui import common, model_views

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
    g = table.grid
    common.take_click("position_grid", lambda data: ss.update(position=int(data[0]) * g[1] + int(data[1])))
    if not 0 <= ss.position < g[0] * g[1]:
        ss.position = 0
    st.caption(
        f"Cosine similarity between the position embedding of each position and all others, on the model's native "
        f"{g[0]} x {g[1]} grid ({table.name}; rows x columns; prefix tokens excluded). Click a tile to see it large."
    )
    left, right = st.columns([3, 2])
    with left:
        model_views.draw_position_grid(cur, model_views.PositionSettings(t, ss.position), key="position")
    with right:
        st.number_input("Position (row-major index)", 0, g[0] * g[1] - 1, **common.keep("position"))
        model_views.draw_position_tile(
            cur, model_views.PositionSettings(t, ss.position), key="position", files="positions"
        )

if info.biases:
    st.subheader("Relative position bias")
    b = st.selectbox("Block", range(len(info.biases)), format_func=lambda i: info.biases[i].name, key="bias_block")
    model_views.draw_bias(cur, model_views.BiasSettings(b), key="bias")
if info.note:
    st.caption(info.note)
