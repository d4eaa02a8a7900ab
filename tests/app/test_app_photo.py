"""AppTest of the photo panel (Heads, Layers): the map over the photo at its own size, its controls, PNG and GIF."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
from app_tools import APP, charts, no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest

from vitviz.figures.overlay import COLORSCALE


def _page(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page(page)
    at.run()
    if page == "pages/heads.py":  # the photo panel is part of the server-drawn view (the instant view is the browser's)
        at.toggle(key="_w_instant_heads").set_value(False).run()
    return at


def _photo_figure(at: AppTest) -> dict:
    figs = [json.loads(el.proto.spec) for el in charts(at)]
    return next(f for f in figs if "over the photo" in str(f["layout"].get("title", {}).get("text", "")))


def _sent_image(fig: dict) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(fig["data"][0]["source"].split(",", 1)[1]))))


def test_heads_photo_panel_draws_at_the_photos_size_with_its_controls():
    at = _page("pages/heads.py")
    no_trouble(at)
    assert not any("over the photo" in el.proto.spec for el in charts(at))  # off until asked
    at.toggle(key="head_photo_on").set_value(True).run()
    no_trouble(at)
    w, h = Image.open(io.BytesIO(at.session_state.image_bytes)).size
    fig = _photo_figure(at)
    assert fig["layout"]["xaxis"]["range"] == [0, w] and fig["layout"]["yaxis"]["range"] == [h, 0]
    downloads = [el.proto.label for el in at.get("download_button")]
    assert f"PNG, {w} x {h} px" in downloads
    # the colour bar: shared by the heads of the block by default (the head grid's own min and max), per head
    bar = fig["data"][1]["marker"]
    assert bar["colorscale"][0][1] == COLORSCALE[0]
    shared = (bar["cmin"], bar["cmax"])
    figs = [json.loads(el.proto.spec) for el in charts(at)]
    grid = next(f for f in figs if f["layout"].get("annotations", [{}])[0].get("text") == "head 0")
    assert shared == (grid["data"][0]["zmin"], grid["data"][0]["zmax"])
    at.radio(key="head_photo_scale").set_value("per_map").run()
    own = _photo_figure(at)["data"][1]["marker"]
    assert (own["cmin"], own["cmax"]) != shared and own["cmin"] >= shared[0] and own["cmax"] <= shared[1]
    # opacity 0 shows the photo itself; the threshold leaves low cells uncoloured
    at.slider(key="head_photo_opacity").set_value(0.0).run()
    bare = _sent_image(_photo_figure(at)).astype(float)
    at.slider(key="head_photo_opacity").set_value(1.0).run()
    full = _sent_image(_photo_figure(at)).astype(float)
    at.slider(key="head_photo_threshold").set_value(1.0).run()
    mostly_photo = _sent_image(_photo_figure(at)).astype(float)
    assert np.abs(mostly_photo - bare).mean() < np.abs(full - bare).mean() / 4
    at.radio(key="head_photo_fmt").set_value("svg").run()
    no_trouble(at)


def test_heads_gif_across_blocks_is_built_on_request():
    at = _page("pages/heads.py")
    at.toggle(key="head_photo_on").set_value(True).run()
    at.selectbox(key="head_gif_view").set_value("mean").run()
    assert not any("GIF (" in el.proto.label for el in at.get("download_button"))
    at.toggle(key="head_gif_on").set_value(True).run()
    no_trouble(at)
    wanted, data, n = at.session_state["head_gif"]
    gif = Image.open(io.BytesIO(data))
    assert wanted[0] == "mean" and gif.n_frames == n == 4  # the demo ViT: 4 blocks
    assert any(el.proto.label == "GIF (mean, 4 frames)" for el in at.get("download_button"))


def test_layers_rollout_over_the_photo():
    at = _page("pages/layers.py")
    at.toggle(key="rollout_photo_on").set_value(True).run()
    no_trouble(at)
    fig = _photo_figure(at)
    assert fig["layout"]["title"]["text"].startswith("Rollout of CLS")
    assert fig["layout"]["xaxis"]["range"][1] == Image.open(io.BytesIO(at.session_state.image_bytes)).size[0]


def test_compare_any_method_over_the_photo_and_relevance_on_layers():
    at = _page("pages/compare.py")
    at.toggle(key="method_photo_on").set_value(True).run()
    no_trouble(at)
    assert at.radio(key="method_photo_scale").value == "per_map"  # raw units differ between methods
    at.selectbox(key="method_photo_pick").set_value(1).run()
    assert _photo_figure(at)["layout"]["title"]["text"].startswith("rollout for")
    at = _page("pages/layers.py")
    at.toggle(key="relevance_photo_on").set_value(True).run()
    no_trouble(at)
    assert any(
        json.loads(el.proto.spec)["layout"].get("title", {}).get("text", "").startswith("Relevance for")
        and "over the photo" in el.proto.spec
        for el in charts(at)
    )


def test_patching_page_gif_of_the_per_patch_lens():
    at = _page("pages/patching.py")
    no_trouble(at)
    at.toggle(key="patch_lens_photo_on").set_value(True).run()
    at.toggle(key="patch_lens_gif_on").set_value(True).run()
    no_trouble(at)
    wanted, data, n = at.session_state["patch_lens_gif"]
    gif = Image.open(io.BytesIO(data))
    assert wanted[0] == "lens" and gif.n_frames == n == 5  # the demo ViT: embeddings + 4 blocks
    assert _photo_figure(at)["layout"]["title"]["text"].startswith("Per-patch lens, after block 3")


def test_camera_button_of_the_main_maps_saves_at_the_photos_size():
    for page, words in (("pages/heads.py", "head 0"), ("pages/layers.py", "Rollout of CLS")):
        at = _page(page)
        w, h = Image.open(io.BytesIO(at.session_state.image_bytes)).size
        chart = next(
            el for el in charts(at) if words in json.loads(el.proto.spec)["layout"].get("title", {}).get("text", "")
        )
        opts = json.loads(chart.proto.config)["toImageButtonOptions"]
        assert (opts["width"], opts["height"]) == (w, h)
