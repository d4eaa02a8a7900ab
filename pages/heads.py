"""Heads: every head of a block over the image; click a cell to make it the query (at any stage)."""

import streamlit as st

from ui import attention_views, cached, common, instant, photo
from vitviz.figures.animation import view_stack
from vitviz.record import POOLED

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("Attention heads")
common.clamp_state(cap)
instant_on = instant.draw(cur)  # the in-browser view; its choices become the session's layer, head, query
if not instant_on:  # the server-drawn view
    stage_now = cap.blocks[ss.layer].stage
    common.take_click("head_map", lambda data: common.click_query(cap, stage_now, data))
    common.take_click("head_grid", lambda data: ss.update(head=int(data[0])))

    def _go_to_stage() -> None:
        first = cap.stages[ss["_stage_pick"]].blocks[0]
        ss.update(layer=first, head=min(ss.head, cap.blocks[first].num_heads - 1))

    c1, c2, c3 = st.columns([3, 2, 3])
    with c1:
        if len(cap.stages) > 1:
            st.radio(
                "Stage",
                range(len(cap.stages)),
                index=stage_now,
                horizontal=True,
                key="_stage_pick",
                on_change=_go_to_stage,
                format_func=lambda s: f"{s} ({cap.stages[s].grid[0]} x {cap.stages[s].grid[1]})",
            )
            blocks = list(cap.stages[stage_now].blocks)
            st.select_slider("Block", blocks, format_func=cap.block_label, **common.keep("layer"))
        else:
            st.slider("Block", 0, cap.num_blocks - 1, **common.keep("layer"))
    with c2:
        st.radio("Direction", common.DIRECTIONS, **common.keep("direction"), horizontal=True)

    block = cap.blocks[ss.layer]
    g, stage = block.geometry, cap.stages[block.stage]
    query = common.query_at(cap, block.stage)
    with c3:
        tokens = [*range(stage.num_prefix), POOLED] + ([query] if query >= stage.num_prefix else [])
        st.selectbox(
            "Query token (or click a cell)",
            tokens,
            index=tokens.index(query),
            format_func=lambda t: cap.token_label(t, block.stage),
            key=(pick := common.query_box_key(block.stage, query)),
            on_change=common.pick_query,
            args=(block.stage, query, pick),
        )

    shown = attention_views.HeadSettings(
        block=ss.layer,
        query=query,
        head=ss.head,
        looking=ss.direction == common.DIRECTIONS[0],
        windows=g.kind == "window" and ss.show_windows,
    )
    looking, what = attention_views.head_looks(cur, shown), attention_views.head_what(cur, shown)
    block_note = cur.model.family.block_note(cur.model.config, block.stage, len(cap.stages))
    if block_note:
        st.caption(block_note)
    if g.kind == "separable":
        st.caption(
            "MobileViT V2 attends with one context score per patch and offset (no query): every query sees this map."
        )
    elif looking and ss.direction == common.DIRECTIONS[1]:
        st.caption("The pooled query is a mean of rows and has no column: the map shows where it looks.")

    # The head shown large first, every head beside it: at 1366 x 768 the large map is in view without scrolling
    big, side = st.columns([3, 2])
    head = ss.head
    with side:
        maps = attention_views.draw_head_grid(cur, shown, key="head", cols=4, tile_px=110)
        st.caption(
            f"{cap.block_label(ss.layer)}: maps on the {maps.grid[0]} x {maps.grid[1]} (rows x columns) "
            f"{'key grid' if maps.grid != g.grid else 'token grid'}; all heads share one colour scale; click a head to "
            "show it large."
        )
        st.radio(
            "Head shown large",
            list(range(block.num_heads)),
            **common.keep("head"),
            horizontal=True,
            format_func=lambda h: f"head {h}",
        )
        attention_views.draw_head_side(cur, shown, key="heads")
    with big:
        if g.kind == "window":
            st.checkbox("Show the windows (shifted blocks show shifted windows)", **common.keep("show_windows"))
        attention_views.draw_head_map(cur, shown, key="head", config=photo.camera_config("head_map"), height=420)
        photo.photo_panel(
            "head",
            list(maps.values),
            [f"{cap.block_label(ss.layer).capitalize()}, head {h}: {what}" for h in range(block.num_heads)],
            index=head,
            colorbar_title=f"attention (raw, {cap.attention_precision})",
            set_name=f"the heads of {cap.block_label(ss.layer)}",
            gif=lambda view: view_stack(cap, view, head=head, query=query if block.stage == 0 else None),
            gif_views=("head", "mean") + (() if cap.rollout_note else ("rollout",)),
            gif_key=(head, query, block.stage),
        )
        if cur.model.family.sampled_keys and looking:
            attention_views.draw_deformable(cur, shown, key="deformable")
        if g.kind == "window":
            st.caption(
                f"Window {g.window} x {g.window}, shift {g.shift}, grid {g.grid[0]} x {g.grid[1]} padded to "
                f"{g.padded[0]} x {g.padded[1]}. Keys outside the query's window get no attention."
            )
else:  # the knock-outs below show the heads of the session's block, for its query, after the knock-out
    block = cap.blocks[ss.layer]
    shown = attention_views.HeadSettings(block=ss.layer, query=common.query_at(cap, block.stage), head=ss.head)

# Does this head matter? Knock heads out and see the prediction and the attention downstream
st.subheader("Does this head matter? Knock it out")
notes = cached.get_causal_notes(cap.model_name)
ranked = common.classes(cur)
if notes["knockout"]:
    st.info(notes["knockout"])
elif ranked is None:
    st.info("Knock-outs change class scores: they need a classifier, or labels for a zero-shot model.")
else:
    if notes["knockout_partial"]:
        st.caption(notes["knockout_partial"])
    knockable = cached.get_knockable_blocks(cap.model_name)
    pairs = [(b, h) for b in knockable for h in range(cap.blocks[b].num_heads)]
    ss.knockout = [tuple(p) for p in ss.knockout if tuple(p) in pairs]
    k1, k2, k3 = st.columns([4, 1, 2])
    k1.multiselect(
        "Heads knocked out together",
        pairs,
        format_func=lambda bh: f"{cap.block_label(bh[0])}, head {bh[1]}",
        **common.keep("knockout"),
    )
    k2.radio(
        "Replaced by",
        ["mean", "zero"],
        **common.keep("knockout_mode"),
        help="mean: the head's output averaged over the image's tokens (the default); zero: nothing",
    )
    k3.button(
        f"Knock out {cap.block_label(ss.layer)}, head {ss.head}",
        on_click=lambda: ss.update(knockout=sorted({*map(tuple, ss.knockout), (ss.layer, ss.head)})),
    )
    if ss.knockout:
        heads = tuple(sorted(map(tuple, ss.knockout)))
        attention_views.draw_knockout(
            cur, attention_views.KnockoutSettings(heads, ss.knockout_mode, ss.class_index, shown), key="knockout"
        )
