"""vitviz: upload a photo and see how a Vision Transformer reads it.

Run with ``streamlit run app.py``. This file holds the sidebar (model, image,
input size) shared by every page and the navigation; the pages live in ``pages/``, their library in ``ui/``.
"""

from __future__ import annotations

import streamlit as st

from ui.navigation import leave_folder_mode, navigation

leave_folder_mode()
st.set_page_config(page_title="vitviz", page_icon=":material/visibility:", layout="wide")
# The navigation is drawn before the engine is imported (torch takes seconds on a cold start): a first visit
# sees the app's own pages at once. The page itself runs at the end, after the sidebar.
page = navigation()
# Streamlit's top padding (6rem) less by half: at 1366 x 768 each page's main map is in view as it opens
st.html("<style>[data-testid='stMainBlockContainer'] { padding-top: 3rem; }</style>")

import math  # noqa: E402

from ui import common, target_boxes  # noqa: E402
from vitviz.data.images import read_image  # noqa: E402
from vitviz.errors import VitvizError  # noqa: E402
from vitviz.models.zeroshot import parse_labels, vocabulary_warning  # noqa: E402
from vitviz.presets import DEMO_NOTES  # noqa: E402
from vitviz.text import md_plain  # noqa: E402

common.init_state()
ss = st.session_state

OTHER = "other (hub id or local folder)…"
OTHER_PUBLIC = "other (Hugging Face model id)…"


def _ask(name: str) -> str | None:
    """``common.request_model`` once per choice the user makes: reruns that still show a refused or failed
    choice neither ask again nor count as model changes (a rate-limited one is asked again, uncounted)."""
    if name == ss.model_name:
        ss.model_asked = None
        return None
    if ss.get("model_asked") == name:
        refusal = ss.get("model_refusal")
        if refusal and refusal[1]:  # rate-limited: asking again counts only once it is allowed
            return common.request_model(name)
        if refusal:
            st.error(refusal[0])
        return None
    ss.model_asked = name
    return common.request_model(name)


def model_ui() -> None:
    st.subheader("Model")
    public = common.serve_settings().public
    other = OTHER_PUBLIC if public else OTHER
    presets = common.model_options()
    # public mode with the hub out of reach: a typed id could not be downloaded, so none is asked for
    typing = not public or common.hub_online() or ss.model_name not in presets
    options = [*presets, other] if typing else presets
    index = options.index(ss.model_name) if ss.model_name in presets else len(options) - 1
    choice = st.selectbox(
        "Checkpoint",
        options,
        index=index,
        key="model_pick",
        help="A bundled demo, or a checkpoint of a supported family: plain ViTs (ViT, DeiT, DINO, DINOv2, BEiT), "
        "hierarchical ones (Swin, PvT, CvT, MobileViT) and the modern ones (CLIP, SigLIP, DINOv3, MAE, ...)",
    )
    name = choice
    if choice == other:
        typed = st.text_input(
            "Hugging Face model id" if public else "Hub id or local folder",
            value="" if ss.model_name in presets else ss.model_name,
            key="model_text",
        )
        if not typed.strip():
            st.caption(
                "Type an id like `google/vit-base-patch16-384`"
                + ("." if public else " or a folder written by `save_pretrained`.")
            )
            return
        name = typed.strip()
    if name == ss.model_name:
        ss.model_asked = None
        return
    name = _ask(name)
    if name is None:
        return
    if name != ss.model_name:
        with st.status(f"Loading {name}…", expanded=False) as status:
            try:
                common.get_model(name, progress=lambda msg: status.update(label=msg))
            except VitvizError as exc:
                status.update(label=f"{name} not loaded", state="error")
                failure = f"{exc} Still using {ss.model_name}."
            else:
                failure = None
                status.update(label=f"Loaded {name}", state="complete")
        if failure:  # the reason in the open, not in the collapsed box
            st.error(failure)
            ss.model_refusal = (failure, False)  # not loaded again on reruns
            return
        common.set_model(name)  # its own blocks, classes, labels (its suggestion) and knock-outs


def labels_ui() -> None:
    """Labels for zero-shot models: only the text tower runs when they change."""
    try:
        model = common.get_model(ss.model_name)
    except VitvizError:
        return
    if not model.zero_shot:
        return
    st.subheader("Labels (zero-shot)")
    target_boxes.labels_ui(model, key=ss.model_name, sidebar=True)  # the same session state as the pages' boxes
    try:
        labels = parse_labels(*target_boxes.labels_text(model))
    except VitvizError as exc:
        st.error(f"{exc} The views wait for labels that parse.")
        return
    for note in labels.notes:
        st.caption(md_plain(note))  # notes quote what the visitor typed
    unknown = vocabulary_warning(model.text, labels, ss.model_name)
    if unknown:
        st.warning(md_plain(unknown))
    st.caption(f"{len(labels.names)} labels, e.g. '{md_plain(labels.prompts[0])}'.")


def _examples() -> list[str]:
    return sorted(p.name for p in common.EXAMPLES.iterdir() if p.suffix.lower() in {".jpg", ".png"})


def _example_picked() -> None:
    """A choice in the Example box (a callback: only a change the user makes, before the sidebar is drawn)."""
    pick = ss.get("example_pick")
    if pick in _examples():
        common.set_image((common.EXAMPLES / pick).read_bytes(), pick)
        ss.example_digest = ss.image_digest


def image_ui() -> None:
    st.subheader("Image")
    examples = _examples()
    # The box shows the example shown, or says the image is not one (an upload, an image opened from the Data set
    # page): every example is then a change, so the example it showed before can be picked again.
    is_example = ss.image_name in examples and ss.get("example_digest", ss.image_digest) == ss.image_digest
    other = f"{ss.image_name} (not an example)"
    options = examples if is_example else [other, *examples]
    want = ss.image_name if is_example else other
    if ss.get("example_pick") != want:  # before the box is drawn: it shows the session's image
        ss.example_pick = want
    st.selectbox("Example", options, key="example_pick", on_change=_example_picked)
    upload = st.file_uploader(
        "…or upload your own",
        type=["png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"],
        help=f"PNG, JPEG, WebP, BMP, GIF or TIFF, up to {common.upload_limit() // 2**20} MB.",
    )
    if upload is not None and upload.file_id != ss.get("last_upload"):
        data = upload.getvalue()
        try:
            common.session_limits().uploads.acquire()  # public mode: a polite limit per minute
            intake = read_image(data, max_bytes=common.upload_limit())
        except VitvizError as exc:
            ss.upload_error = f"{md_plain(upload.name)}: {exc} The previous image is still shown."
        else:
            common.set_image(data, upload.name, intake.image.size)
            ss.upload_error = None
            for note in intake.notes:
                st.info(note)
        ss.last_upload = upload.file_id  # each file is judged once
    if upload is not None and ss.get("upload_error"):
        st.error(ss.upload_error)
    st.caption(f"Showing **{md_plain(ss.image_name)}**")


def size_ui() -> None:
    try:
        model = common.get_model(ss.model_name)
    except VitvizError:
        return
    h, w = model.default_size
    p = model.patch_size
    st.subheader("Input resolution")
    st.caption(
        f"The model's own: {w} x {h} px (width x height), patches of {p} px: a {h // p} x {w // p} grid "
        "(rows x columns)."
    )
    from vitviz.capture.forward import offered_heights

    choices = offered_heights(model)
    current = ss.input_size[0] if ss.input_size else h
    side = st.select_slider("Height (px)", choices, value=current if current in choices else h)
    # Bound to the session (not derived from the input size): a fallback to a square input must not untick it
    keep = st.checkbox("Keep the image's aspect ratio", **common.keep("keep_aspect"))
    img_w, img_h = ss.image_wh
    width = max(p, round(side * img_w / img_h / p) * p) if keep else side
    if keep:  # an image too long to keep its shape: say what helps here (the box), not a size already chosen
        from vitviz.capture.forward import DEFAULT_BUDGET_BYTES, check_budget

        note = ""
        try:
            check_budget(model, (side, width), batch=1, gradients=False, budget=DEFAULT_BUDGET_BYTES)
        except VitvizError:
            note = (
                f"Keeping this {img_w} x {img_h} px image's aspect ratio makes the input {width} x {side} px "
                f"(width x height), too large to run. Untick 'Keep the image's aspect ratio': it is then resized to "
                f"{side} x {side} px."
            )
        if not note:
            try:  # a public server's max_tokens: the same fallback, its own words
                common.check_tokens(model, (side, width), (img_w, img_h))
            except VitvizError as exc:
                note = str(exc)
        if note:
            st.warning(f"{note} Until then the views use {side} x {side} px.")
            width = side
    elif abs(math.log((img_w / img_h) / (width / side))) > math.log(1.25):  # stretched by more than a quarter
        st.caption(
            f"This {img_w} x {img_h} px image is stretched to {width} x {side} px (width x height): its aspect ratio "
            "is not kept. Tick the box to keep it."
        )
    size = None if (side, width) == (h, w) else (side, width)
    if size != ss.input_size:
        ss.input_size = size
        ss.query = None  # the model's default: CLS, else the pooled query


with st.sidebar:
    st.title("vitviz")
    try:
        model_ui()
        if ss.model_name in DEMO_NOTES:  # after a change: the note of the model now shown
            st.caption(DEMO_NOTES[ss.model_name])
        labels_ui()
        image_ui()
        size_ui()
    except Exception as exc:  # last line of defence for the sidebar too
        st.error(
            f"Something went wrong in the sidebar ({common.last_resort(exc, 'sidebar')}). Your image and model are kept."
        )

try:
    page.run()
except Exception as exc:  # last line of defence: a readable message, never a traceback
    st.error(
        f"Something went wrong while drawing this page ({common.last_resort(exc, page.title)}). "
        "Try another setting; your image and model are kept."
    )
