"""Maps over the photo at its own resolution, PNG download at that size and a GIF across blocks (Streamlit wiring).

Not a page: the pages that draw maps call :func:`photo_panel` under their map. The
drawing is :mod:`vitviz.figures.overlay` and :mod:`vitviz.figures.animation`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import streamlit as st

from ui import common
from vitviz import figures
from vitviz.capture.forward import seen_part
from vitviz.data.images import read_image
from vitviz.figures import animation, overlay
from vitviz.text import plotly_plain

UPSAMPLING = {"bilinear": "bilinear (smooth)", "nearest": "nearest (one block per token)"}
SCALES = {"shared": "shared by the set", "per_map": "each map its own"}


@st.cache_data(max_entries=8, show_spinner=False)
def _photo(image_digest: str, _data: bytes) -> np.ndarray:
    """The photo, RGB uint8, at most 2048 px on its long side (keyed by the image's digest)."""
    return overlay.fit_photo(read_image(_data, max_bytes=common.upload_limit()).image)


def _seen(data: bytes, cur) -> np.ndarray:
    """The part of the photo a centre-cropping model saw (a converted checkpoint), at most 2048 px long."""
    image = read_image(data, max_bytes=common.upload_limit()).image
    return overlay.fit_photo(seen_part(cur.model, image, cur.cap.input_size))


def camera_config(filename: str) -> dict:
    """``st.plotly_chart`` config: the camera button saves the figure at the photo's size (at most 2048 px long)."""
    wh = st.session_state.get("image_wh")
    return overlay.image_config(wh, filename=filename) if wh else {}


def photo_panel(
    key: str,
    maps: Sequence[np.ndarray],
    titles: Sequence[str],
    *,
    index: int | None,
    colorbar_title: str,
    set_name: str,
    gif: Callable[[str], tuple[list[np.ndarray], list[str]]] | None = None,
    gif_views: Sequence[str] = (),
    gif_key: tuple = (),
    default_scale: str = "shared",
) -> None:
    """``maps[index]`` over the photo at the photo's size, with its controls and downloads.

    ``index`` None: the user picks the map among ``titles``. ``default_scale``: the colour
    scale first offered (``shared`` or ``per_map``).

    ``maps``: the set the colour scale can be shared across (``set_name`` says what it
    is: "the heads of block 3"). ``gif(view)``: the maps and labels of a view across the
    blocks, for the views in ``gif_views``; built on request (a toggle) and kept while the
    view, the image, the drawing settings and ``gif_key`` (what else the view depends on:
    the head, the query) stay the same.
    """
    ss = st.session_state
    if not st.toggle("Over the photo at its own size (PNG, GIF)", key=f"{key}_photo_on"):
        return
    c1, c2, c3, c4 = st.columns(4)
    mode = c1.radio("Upsampling", list(UPSAMPLING), format_func=UPSAMPLING.get, key=f"{key}_photo_mode")
    opacity = c2.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key=f"{key}_photo_opacity")
    threshold = c3.slider("Hide below (of the scale)", 0.0, 1.0, 0.0, 0.05, key=f"{key}_photo_threshold")
    scale = c4.radio(
        f"Colour scale ({set_name})",
        list(SCALES),
        index=list(SCALES).index(default_scale),
        format_func=SCALES.get,
        key=f"{key}_photo_scale",
    )
    if index is None:
        index = st.selectbox("Map", range(len(titles)), format_func=lambda i: titles[i], key=f"{key}_photo_pick")
    photo = _photo(ss.image_digest, ss.image_bytes)
    cur = common.current()
    if cur is not None and cur.model.center_crop is not None:  # the model saw the photo's centre: the maps cover it
        photo = _seen(ss.image_bytes, cur)
    lo, hi = overlay.colour_limits(maps, scale=scale)[index]
    flat = figures.flat_limits(maps[index]) if scale == "per_map" else None
    if flat is not None:  # a flat map on its fixed scale, not stretched (vitviz.figures.flat)
        lo, hi = flat
    composite = overlay.photo_overlay(
        photo, maps[index], limits=(lo, hi), mode=mode, opacity=opacity, threshold=threshold
    )
    h, w = composite.shape[:2]
    fmt = st.radio("Camera button saves", ["png", "svg"], horizontal=True, key=f"{key}_photo_fmt")
    common.chart(
        overlay.photo_overlay_figure(
            composite,
            limits=(lo, hi),
            colorbar_title=colorbar_title,
            title=f"{plotly_plain(titles[index])}, over the photo",
        ),
        key=f"{key}_photo_fig",
        config=overlay.image_config((w, h), filename=key, fmt=fmt),
    )
    st.caption(
        f"The photo at {w} x {h} px (width x height; its own size, at most 2048 on the long side); the map upsampled {mode}; "
        f"colour from {lo:.4g} (bottom) to {hi:.4g} (top), {SCALES[scale]}; cells below {threshold:.0%} of the "
        "scale are not coloured. The camera button saves the figure at that size too."
    )
    st.download_button(
        f"PNG, {w} x {h} px",
        overlay.png_bytes(composite),
        file_name=f"{key}_{w}x{h}.png",
        mime="image/png",
        key=f"{key}_photo_png",
    )
    if gif is None or not gif_views:
        return
    g1, g2 = st.columns([2, 3])
    view = g1.selectbox("GIF across the blocks", list(gif_views), key=f"{key}_gif_view")
    if not g2.toggle("Make the GIF", key=f"{key}_gif_on"):
        return
    wanted = (view, ss.model_name, ss.image_digest, scale, mode, opacity, threshold, gif_key)
    made = ss.get(f"{key}_gif")
    if made is None or made[0] != wanted:  # drawn once per setting, kept while the settings stay
        with st.spinner("Drawing the frames…"):
            frames_maps, labels = gif(view)
            image = read_image(ss.image_bytes, max_bytes=common.upload_limit()).image
            if cur is not None:
                image = seen_part(cur.model, image, cur.cap.input_size)  # the photo itself, or the model's crop
            frames = animation.gif_frames(
                image,
                frames_maps,
                labels,
                scale=scale,
                mode=mode,
                opacity=opacity,
                threshold=threshold,
            )
            made = ss[f"{key}_gif"] = (wanted, animation.gif_bytes(frames), len(frames))
    st.image(made[1], caption=f"{view}: {made[2]} frames, one colour scale {SCALES[scale]}")
    st.download_button(
        f"GIF ({view}, {made[2]} frames)",
        made[1],
        file_name=f"{key}_{view}.gif",
        mime="image/gif",
        key=f"{key}_gif_download",
    )
