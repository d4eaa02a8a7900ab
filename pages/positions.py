"""Position embeddings: the cosine-similarity grid of the ViT paper's Figure 7."""

import streamlit as st

from pages import common
from vitviz import figures

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("Learned position embeddings")
sim = common.get_position_similarity(cap.model_name)
if sim is None:
    st.info(cap.position_note or f"{cap.model_name} has no absolute position embeddings: this view does not apply.")
    st.stop()
common.take_click("position_grid", lambda data: ss.update(position=int(data[0]) * cap.position_grid[1] + int(data[1])))
g = cap.position_grid
if not 0 <= ss.position < g[0] * g[1]:
    ss.position = 0
st.caption(
    f"Cosine similarity between the position embedding of each patch position and all others, on the model's native "
    f"{g[0]} x {g[1]} grid (prefix tokens excluded). Click a tile to see it large."
)
left, right = st.columns([3, 2])
with left:
    st.plotly_chart(
        figures.position_similarity_figure(sim, g), key="position_grid", on_select="rerun", selection_mode="points"
    )
with right:
    st.number_input("Position (row-major index)", 0, g[0] * g[1] - 1, **common.keep("position"))
    r, c = divmod(ss.position, g[1])
    tile = sim[ss.position].reshape(g)
    st.plotly_chart(
        figures.map_figure(None, tile, patch_size=1, num_prefix_tokens=0, title=f"Similarity to position ({r}, {c})",
                           colorbar_title="cosine similarity (raw)", zmin=-1, zmax=1, colorscale=figures.SIMILARITY_SCALE,
                           marked=(r, c), height=420),
        key="position_tile",
    )  # fmt: skip
    common.downloads("position_similarity", "positions", similarity=sim)
