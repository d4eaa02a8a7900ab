"""Activation patching: put a second image's activations into this image's run, one point at a time; the per-patch lens."""

import numpy as np
import streamlit as st

from pages import common, photo
from vitviz import figures
from vitviz.capture.patching import activation_patching, patch_lens
from vitviz.data.images import read_image
from vitviz.errors import VitvizError
from vitviz.figures.animation import lens_rows, view_stack
from vitviz.figures.patching import patching_grid_figure
from vitviz.text import md_plain, plotly_plain

cur = common.require_current()
cap, ss = cur.cap, st.session_state

st.header("Activation patching")
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
        common.labels_ui(cur.model, key="patching")
ranked = common.classes(cur)
if ranked is None:
    st.info("Patching measures a class score: it needs a classifier, or labels for a zero-shot model.")
    st.stop()

# --- the source image --------------------------------------------------------------------------------
examples = sorted(p.name for p in common.EXAMPLES.iterdir() if p.suffix.lower() in {".jpg", ".png"})
others = [e for e in examples if e != ss.image_name] or examples
c1, c2 = st.columns(2)
pick = c1.selectbox("Source image", others, key="patch_source_pick")
upload = c2.file_uploader(
    "…or upload a source", type=["png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"], key="patch_upload"
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
# class and label indices mean other things once the model or its labels change
common.forget_widgets_unless(
    (cur.key[0], None if ranked.labels is None else ranked.labels.prompts), "patch_target_index", "patch_target_minus"
)
target = common.target_ui(ranked, key="patch_target")
st.caption(f"Source: **{md_plain(source_name)}**; measured: **{md_plain(target.name(cur.model.id2label))}**.")


def get_patching(exact: bool, progress=None):
    """The estimate (instant) or the exact grids for the session's image, the source and the target; cached."""
    labels = common.label_embeddings(cur)

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        source = read_image(source_bytes, max_bytes=common.upload_limit()).image
        return common.in_queue(
            lambda: activation_patching(
                cur.model,
                image,
                source,
                target=target,
                size=cur.key[2],
                exact=exact,
                estimate=not exact,
                progress=progress,
                label_embeddings=labels,
            )
        )

    key = ("patching", *cur.key, source_digest, target, exact, None if labels is None else labels.tobytes())
    return common.results_cache().get_or_compute(key, compute)


def get_patch_lens():
    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        return common.in_queue(lambda: patch_lens(cur.model, image, target=target, size=cur.key[2]))

    return common.results_cache().get_or_compute(("patch_lens", *cur.key, target), compute)


try:
    estimate = get_patching(False)
except (VitvizError, ValueError) as exc:
    st.error(str(exc))
    st.stop()

# --- exact on request ----------------------------------------------------------------------------------
want = ("patching_exact", *cur.key, source_digest, target)
exact = None
if ss.get("patching_wanted") != want:
    st.button("Compute exact patching", type="primary", on_click=lambda: ss.update(patching_wanted=want))
else:
    st.button("Stop", on_click=lambda: ss.update(patching_wanted=None), help="Stops it; nothing partial is kept.")
    bar = st.progress(0.0, text="Patching…")
    try:
        exact = get_patching(
            True, progress=lambda d, t: bar.progress(d / max(t, 1), text=f"{d} of {t} patched positions")
        )
    except (VitvizError, ValueError) as exc:
        st.error(str(exc))
    bar.empty()
shown = exact if exact is not None else estimate
kind = "exact" if exact is not None else "estimate"
m1, m2, m3 = st.columns(3)
m1.metric("Clean score (target)", f"{shown.clean:.4g}")
m2.metric("Source score", f"{shown.source:.4g}")
m3.metric("Work", f"{shown.forward_equivalents:.0f} forward-equivalents")
for why in shown.notes.values():
    st.info(why)

res = shown.residual if exact is not None else shown.residual_estimate
heads = shown.heads if exact is not None else shown.heads_estimate
blocks = [f"block {i}" for i in range(cap.num_blocks)]
left, right = st.columns(2)
if res is not None:
    block = st.slider("Block drawn on the image", 0, res.shape[0] - 1, res.shape[0] - 1, key="patch_block")
    with left:
        cols = [f"{k} {t}" for t, k in enumerate(shown.token_kinds)]
        common.chart(
            patching_grid_figure(
                res,
                clean=shown.clean,
                source=shown.source,
                title=f"Residual patching ({kind}): block x token",
                x_title="token (prefix first)",
                x_labels=cols,
                row_labels=blocks,
                marked_row=block,
            ),
            key="patch_residual_grid",
        )
    with right:
        row = res[block, shown.num_prefix :].reshape(shown.grid) - shown.clean
        span = float(np.nanmax(np.abs(row))) or 1.0
        common.chart(
            figures.map_figure(
                cap.image,
                row,
                title=f"Block {block}: change from patching each patch token ({kind})",
                colorbar_title="patched - clean",
                colorscale=figures.SIMILARITY_SCALE,
                zmin=-span,
                zmax=span,
            ),
            key="patch_row_map",
        )
if heads is not None:
    common.chart(
        patching_grid_figure(
            heads,
            clean=shown.clean,
            source=shown.source,
            title=f"Head patching ({kind}): block x head",
            x_title="head",
            row_labels=blocks,
        ),
        key="patch_heads_grid",
    )
common.downloads(
    f"patching_{kind}",
    "patching",
    **{k: v for k, v in (("residual", res), ("heads", heads)) if v is not None},
)

# --- the per-patch logit lens --------------------------------------------------------------------------
st.subheader("Logit lens per patch")
st.caption(
    "Each patch token's residual (row 0: the embeddings; row l: block l's output) through the model's own final "
    "norm and head, as if the head read that token: the measured score, per patch."
)
try:
    lens = get_patch_lens()
except (VitvizError, ValueError) as exc:
    st.info(str(exc))
else:
    rows = lens_rows(cap)[0]  # row 0 the embeddings, row l after block l - 1 (0-based, as the other pages)
    layer = st.select_slider(
        "Residual stream",
        list(range(lens.shape[0])),
        lens.shape[0] - 1,
        format_func=rows.__getitem__,
        key="patch_lens_layer",
    )
    common.chart(
        figures.map_figure(
            cap.image,
            lens[layer],
            title=f"Per-patch lens, {rows[layer]}: {plotly_plain(target.name(cur.model.id2label))}",
            colorbar_title="score (raw)",
        ),
        key="patch_lens_map",
    )
    photo.photo_panel(
        "patch_lens",
        list(lens),
        [f"Per-patch lens, {row}: {target.name(cur.model.id2label)}" for row in rows],
        index=layer,
        colorbar_title="score (raw)",
        set_name="every layer",
        gif=lambda view: view_stack(cap, "lens", lens=lens),
        gif_views=("lens",),
        gif_key=(target,),
    )
