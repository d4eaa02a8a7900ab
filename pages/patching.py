"""Activation patching: put a second image's activations into this image's run, one point at a time; the per-patch lens."""

import streamlit as st

from ui import causal_views, common, photo, target_boxes
from vitviz.data.images import read_image
from vitviz.errors import VitvizError
from vitviz.figures.animation import view_stack
from vitviz.text import md_plain

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("Activation patching")
# what patching is, folded: at 1366 x 768 the grids are in view as the page opens
with st.expander("What the grids show"):
    st.caption(
        "Two images at the same input size: the **target** (the sidebar's image) and a **source**. Residual patching "
        "at (block l, token t): block l's output at token t in the target's run is replaced by the source's value there; "
        "head patching at (l, h): head h's output z (its slice of the output projection's input, every token) is "
        "replaced by the source's. Each cell is the target's score after that one patch (before softmax); the colour is "
        "its change from the clean score. The **estimate** (attribution patching) is the clean score plus the gradient "
        "times the activation difference: instant, first order. The **exact** grid runs one patched forward per cell "
        "(batched; blocks before the patched one are reused)."
    )
if cur.model.zero_shot:
    with st.expander("Labels (zero-shot): edit them here or in the sidebar"):
        target_boxes.labels_ui(cur.model, key="patching")
ranked = common.classes(cur)
if ranked is None:
    st.info("Patching measures a class score: it needs a classifier, or labels for a zero-shot model.")
    st.stop()

# --- the source image --------------------------------------------------------------------------------
examples = sorted(p.name for p in common.EXAMPLES.iterdir() if p.suffix.lower() in {".jpg", ".png"})
others = [e for e in examples if e != ss.image_name] or examples
source_box, target_box = st.columns(2)
c1, c2 = source_box.columns(2)
pick = c1.selectbox("Source image", others, key="patch_source_pick")
upload = c2.file_uploader(
    "…or upload a source",
    type=["png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"],
    key="patch_upload",
    label_visibility="collapsed",
)
source_bytes, source_name = (common.EXAMPLES / pick).read_bytes(), pick
if upload is not None:
    seen = ss.get("patch_upload_seen")
    if seen is None or seen[0] != upload.file_id:  # each file is judged (and counted as an upload) once
        try:
            common.session_limits().uploads.acquire()  # public mode: the same limit as the sidebar's uploads
            read_image(upload.getvalue(), max_bytes=common.upload_limit())
            seen = (upload.file_id, None)
        except VitvizError as exc:
            seen = (upload.file_id, f"{md_plain(upload.name)}: {exc} The example is used as the source.")
        ss.patch_upload_seen = seen
    if seen[1]:
        st.error(seen[1])
    else:
        source_bytes, source_name = upload.getvalue(), upload.name
source_digest = common.digest(source_bytes)
# The boxes start from the session's target (class and "…minus" of Image & predictions; the target image's top-1
# unless pinned) and follow it when it, the model or the labels change (indices then mean other things).
start = target_boxes.session_target(ranked)
target_boxes.forget_widgets_unless(
    (cur.key[0], start, None if ranked.labels is None else ranked.labels.prompts),
    "patch_target_index",
    "patch_target_minus",
)
with target_box:
    target = target_boxes.target_ui(ranked, key="patch_target", start=start)
st.caption(f"Source: **{md_plain(source_name)}**; measured: **{md_plain(target.name(cur.model.id2label))}**.")


settings = causal_views.PatchingSettings(target, source_bytes)
try:
    causal_views.patching(cur, settings, False)
except (VitvizError, ValueError) as exc:
    st.error(str(exc))
    st.stop()

# --- exact on request ----------------------------------------------------------------------------------
want = ("patching_exact", *cur.key, source_digest, target)
exact = False
if ss.get("patching_wanted") != want:
    st.button("Compute exact patching", type="primary", on_click=lambda: ss.update(patching_wanted=want))
else:
    # The Stop button lives while the grids are computed, and goes with them: once they are done nothing is left to
    # stop, and the finished grids stay (a click on Stop then would have thrown them away).
    stop = st.empty()
    stop.button("Stop", on_click=lambda: ss.update(patching_wanted=None), help="Stops it; nothing partial is kept.")
    bar = st.progress(0.0, text="Patching…")

    def _progress(done: int, total: int) -> None:
        if ss.get("patching_wanted") != want:  # Stop (or another image or target) while a batch ran
            bar.empty()
            stop.empty()
            st.stop()
        bar.progress(done / max(total, 1), text=f"{done} of {total} patched positions")

    try:
        causal_views.patching(cur, settings, True, progress=_progress)
        exact = True
    except (VitvizError, ValueError) as exc:
        st.error(str(exc))
    bar.empty()
    stop.empty()
    if exact:
        st.caption("Exact grids, kept for this image, source and target; the estimate is replaced below.")
causal_views.draw_patching(cur, settings, key="patch", exact=exact, files_key="patching")

# --- attention-pattern and path patching, head by head ------------------------------------------------
st.subheader("Where a head looks, and what reaches the read-out")
st.caption(
    "**Attention-pattern patching** at (block l, head h): head h's attention probabilities in block l are the "
    "source's, its values and everything else the target's own; the change runs through every later block. "
    "**Path patching** to the read-out: head h's output z is the source's on the direct path only: every later "
    "block reads the target's own activations (frozen), so only that head's output difference, through the output "
    "projection, reaches the read-out. Each cell is the measured score; the colour its change from the clean score. "
    "Definition: vitviz docs, Definitions > Attention-pattern patching; and Definitions > Path patching."
)
want_paths = ("patching_paths", *cur.key, source_digest, target)
if ss.get("patching_paths_wanted") != want_paths:
    st.button("Compute pattern and path patching", on_click=lambda: ss.update(patching_paths_wanted=want_paths))
else:
    for kind in ("pattern", "path"):
        try:
            with st.spinner("Patching head by head…"):
                causal_views.draw_head_paths(cur, settings, kind, key="patch")
        except (VitvizError, ValueError) as exc:
            st.info(str(exc))

# --- the per-patch logit lens --------------------------------------------------------------------------
st.subheader("Logit lens per patch")
st.caption(
    "Each patch token's residual stream (the embeddings, or after block l) through the model's own final "
    "norm and head, as if the head read that token: the measured score, per patch."
)
drawn = causal_views.draw_patch_lens(cur, target, key="patch")
if drawn is not None:
    lens, layer, rows = drawn
    photo.photo_panel(
        "patch_lens",
        list(lens),
        [f"Per-patch lens, {row}: {target.name(cur.model.id2label)}" for row in rows],
        index=layer,
        colorbar_title="score (raw)",
        set_name="every row",
        gif=lambda view: view_stack(cap, "lens", lens=lens),
        gif_views=("lens",),
        gif_key=(target,),
    )
