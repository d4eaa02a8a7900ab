"""Issue 32, "The first hour, round 3": what a new user met in the app, page by page (AppTest).

The real-browser halves (the instant view's choices, clicks on tiles, layout at 1366 x 768) are in
tests/test_browser_first_hour.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest


def _app(page: str | None = None, **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    if page:
        at.switch_page(page).run()
    no_trouble(at, page or "")
    return at


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in charts(at)]


def _titles(at: AppTest) -> list[str]:
    return [(f["layout"].get("title") or {}).get("text", "") for f in _figures(at)]


def _component(at: AppTest, name: str):
    return next(e for e in at.main if e.type == "bidi_component" and e.proto.component_name == name)


# --- 1. the instant head view's choices are the session's -------------------------------------------------


def _instant(at: AppTest) -> dict:
    """What the instant view's component was given: its start (layer, head, query)."""
    return json.loads(_component(at, "vitviz_head_view").proto.json)[0]


def test_a_choice_in_the_instant_view_is_the_sessions_layer_head_and_query():
    at = _app("pages/heads.py")
    assert _instant(at)["start"] == {"layer": 3, "head": 0, "query": 0}
    # the browser reports layer 2, head 3 and a patch (token 1 + 5 * 12 + 7: patch (5, 7)) as the view's choice
    at.session_state["instant_view"] = {"choice": {"layer": 2, "head": 3, "query": 1 + 5 * 12 + 7, "id": "1"}}
    at.run()
    no_trouble(at)
    assert (at.session_state.layer, at.session_state.head) == (2, 3)
    assert (at.session_state.query_stage, at.session_state.query) == (0, 1 + 5 * 12 + 7)
    at.switch_page("pages/layers.py").run()
    assert any("Query token: **patch (5, 7)**" in c.value for c in at.caption)
    at.switch_page("pages/heads.py").run()
    assert _instant(at)["start"] == {"layer": 2, "head": 3, "query": 1 + 5 * 12 + 7}


def test_knock_outs_sit_beside_the_instant_view_and_its_toggle_stays_as_set():
    at = _app("pages/heads.py")
    assert at.toggle(key="_w_instant_heads").value is True
    assert any("Knock it out" in h.value for h in at.subheader)
    assert at.multiselect(key="_w_knockout") is not None
    at.toggle(key="_w_instant_heads").set_value(False).run()
    at.switch_page("pages/layers.py").run()
    at.switch_page("pages/heads.py").run()
    no_trouble(at)
    assert at.toggle(key="_w_instant_heads").value is False
    assert charts(at)  # the server-drawn view


# --- 2. "click to show it large" works on every map that says it ------------------------------------------


def _promising(at: AppTest) -> list:
    """The charts whose hover promises "click to show it large"."""
    return [c for c in charts(at) if "click to show it large" in c.proto.spec]


def _click_tile(at: AppTest, key: str, tile: int) -> None:
    at.session_state[key] = {"selection": {"points": [{"customdata": [tile], "click": f"tile-{tile}"}]}}
    at.run()
    no_trouble(at, key)


def test_every_tile_set_that_says_click_to_show_it_large_shows_it_large():
    at = _app("pages/layers.py")
    promising = _promising(at)
    assert {c.key for c in promising} >= {"layer_grid_0", "masks_grid"}
    assert all(c.type == "click_chart" for c in promising), [c.key for c in promising if c.type != "click_chart"]
    _click_tile(at, "layer_grid_0", 2)
    large = next(json.loads(c.proto.spec) for c in charts(at) if c.key == "layer_grid_0_large")
    assert "block 2" in large["layout"]["title"]["text"]
    _click_tile(at, "masks_grid", 1)
    large = next(json.loads(c.proto.spec) for c in charts(at) if c.key == "masks_grid_large")
    assert "head 1" in large["layout"]["title"]["text"]

    at = _app("pages/heads.py", instant_heads=False, knockout=[(0, 1)])
    assert all(c.type == "click_chart" for c in _promising(at)), [c.key for c in _promising(at)]
    assert "knockout_heads" in {c.key for c in _promising(at)}
    _click_tile(at, "knockout_heads", 2)
    assert any(c.key == "knockout_heads_large" for c in charts(at))

    at = _app("pages/compare.py")
    assert "method_maps" in {c.key for c in _promising(at)}
    assert all(c.type == "click_chart" for c in _promising(at))
    _click_tile(at, "method_maps", 0)
    large = next(json.loads(c.proto.spec) for c in charts(at) if c.key == "method_maps_large")
    assert large["layout"]["title"]["text"]


# --- 4. one convention for numbers and names -----------------------------------------------------------------


def _titled(at: AppTest, words: str) -> dict:
    return next(f for f in _figures(at) if words in str((f["layout"].get("title") or {}).get("text", "")))


def test_blocks_heads_patches_and_sizes_are_named_one_way_on_every_page():
    at = _app()  # the overview: the patch grid says rows x columns and width x height
    grid = _titles(at)[0].replace("<br>", " ")
    assert "12 x 12 patches (rows x columns)" in grid and "96 x 96 px (width x height)" in grid
    sidebar = " ".join(c.value for c in at.sidebar.caption)
    assert "(width x height)" in sidebar and "(rows x columns)" in sidebar
    at.switch_page("pages/embedding.py").run()
    norms = _titled(at, "Token norms")
    hm = norms["data"][0]
    assert [r[0][0] for r in hm["customdata"]] == ["embeddings", *(f"after block {b}" for b in range(4))]
    assert [t[1] for t in hm["customdata"][0][:3]] == ["CLS", "p0", "p1"]
    assert "after layer" not in json.dumps(norms)
    at.switch_page("pages/importance.py").run()
    attribution = _titled(at, "Direct contribution")
    assert attribution["data"][0]["colorbar"]["title"]["text"] == "direct contribution (logits)"
    targets = next(t for t in attribution["data"] if t["type"] == "scatter")
    assert "contribution %{customdata[2]" in targets["hovertemplate"]  # the value in the hover
    at = _app("pages/heads.py", instant_heads=False)
    assert any(b.label == "Knock out block 3, head 0" for b in at.button)
    assert at.slider(key="_w_layer").label == "Block"


def test_registers_count_from_zero_like_every_other_index(tiny_dirs):
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    at.text_input(key="model_text").input(str(tiny_dirs["dinov2_registers"])).run()
    no_trouble(at)
    sequence = next(f for f in _figures(at) if "Input sequence" in str(f["layout"]["title"]["text"]))
    assert list(sequence["data"][0]["text"][:6]) == ["CLS", "REG0", "REG1", "REG2", "REG3", "p0"]


# --- 5. activation patching -----------------------------------------------------------------------------------


def _spec(at: AppTest, key: str) -> dict:
    return next(json.loads(c.proto.spec) for c in charts(at) if c.key == key)


def _z(fig: dict) -> np.ndarray:
    z = next(d for d in fig["data"] if d["type"] == "heatmap")["z"]
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")]).astype(float)
    return np.array(z, dtype=float)


def test_finished_exact_patching_stays_and_the_block_map_shows_patches_over_the_image():
    at = _app("pages/patching.py")
    # the estimate: the block drawn by default is one where patching a patch changes the score (the last block's
    # patch tokens reach no readout: its row is flat)
    row = _z(_spec(at, "patch_row_map"))
    assert np.nanmax(row) - np.nanmin(row) > 0
    assert at.slider(key="patch_block").value != 3
    heat = next(d for d in _spec(at, "patch_row_map")["data"] if d["type"] == "heatmap")
    assert heat.get("opacity", 1) < 1  # the image shows through: "drawn on the image"
    # the block x token grid's colour scale shows the patches; the CLS column is stated apart
    grid = _spec(at, "patch_residual_grid")
    heat = next(d for d in grid["data"] if d["type"] == "heatmap")
    change = _z(grid)
    assert heat["zmax"] == pytest.approx(np.nanmax(np.abs(change[:, 1:])))
    assert any("CLS column" in c.value for c in at.caption)

    next(b for b in at.button if b.label == "Compute exact patching").click().run()
    no_trouble(at, "exact")
    assert not [b for b in at.button if b.label == "Stop"]  # finished: nothing to stop, nothing to lose
    at.run()
    assert any(t.startswith("Residual patching (exact)") for t in _titles(at))


def test_the_per_patch_lens_of_a_swin_shows_its_last_stage():
    at = _app()
    at.selectbox(key="model_pick").set_value("demo-swin").run()
    at.switch_page("pages/patching.py").run()
    no_trouble(at, "demo-swin")
    lens = _spec(at, "patch_lens_map")
    values = _z(lens)
    assert np.isfinite(values).all() and values.shape == (6, 6)  # demo-swin at 96 px: its last stage is 6 x 6
    assert "after stage 2" in lens["layout"]["title"]["text"]
    options = at.select_slider(key="patch_lens_layer").options
    assert len(options) == 2  # the last stage's two blocks: the rows that are defined


# --- 8. flat maps: said, and drawn one way everywhere ---------------------------------------------------------


def test_a_flat_map_is_said_and_drawn_on_one_fixed_scale_on_every_page():
    """demo-swin on its star: relevance spreads over 0.0017362 .. 0.0017387 (1.4e-3 of its mean) and Grad-CAM is
    zero everywhere. Overview and Layers drew the relevance stretched to a sharp peak; Compare drew it flat."""
    at = _app()
    at.selectbox(key="model_pick").set_value("demo-swin").run()
    no_trouble(at, "demo-swin")
    rel = next(d for d in _spec(at, "overview_relevance")["data"] if d["type"] == "heatmap")
    assert rel["zmin"] == 0 and rel["zmax"] == pytest.approx(np.nanmax(_z(_spec(at, "overview_relevance"))))
    assert any("is flat" in c.value for c in at.caption)
    at.switch_page("pages/layers.py").run()
    no_trouble(at, "layers")
    rel = next(d for d in _spec(at, "relevance_map")["data"] if d["type"] == "heatmap")
    assert rel["zmin"] == 0
    assert any("is flat" in c.value for c in at.caption)
    at.switch_page("pages/compare.py").run()
    no_trouble(at, "compare")
    notes = " ".join(c.value for c in at.caption)
    assert "the gradcam map is zero everywhere" in notes.lower() and "is flat" in notes


# --- 12. wording ----------------------------------------------------------------------------------------------


def test_zero_shot_labels_are_labels_with_scores_not_classes_with_logits():
    at = _app()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    at.switch_page("pages/importance.py").run()
    no_trouble(at, "demo-clip importance")
    explained = next(c.value for c in at.caption if c.value.startswith("Explained"))
    assert "label" in explained and "logit" not in explained and "image-text score" in explained
    next(b for b in at.button if b.label == "Compute head importance").click().run()
    no_trouble(at, "importance computed")
    fig = _spec(at, "importance_map")
    assert (
        "logit" not in json.dumps(fig["data"][0]["colorbar"]) and "score" in fig["data"][0]["colorbar"]["title"]["text"]
    )
    at.session_state["knockout"] = [(0, 0)]
    at.session_state["instant_heads"] = False
    at.switch_page("pages/heads.py").run()
    no_trouble(at, "demo-clip knock-out")
    texts = " ".join(c.value for c in at.caption) + " ".join(_titles(at))
    assert "Top labels before and after" in texts and "Image-text score of" in texts
    assert "Logit of" not in texts and "top class" not in texts


def test_notes_that_say_what_they_mean(tiny_dirs):
    at = _app()
    at.selectbox(key="model_pick").set_value("demo-swin").run()
    at.switch_page("pages/importance.py").run()
    assert not any("Direct logit attribution: Direct logit attribution" in i.value for i in at.info)
    assert any(i.value.startswith("Direct logit attribution is not defined") for i in at.info)
    at.switch_page("pages/layers.py").run()
    rollout = " ".join(c.value for c in at.caption if "windows undone" in c.value)
    assert (
        "Definitions > Rollout through stages" in rollout and "ALGORITHMS" not in rollout
    )  # the docs, not a team file

    # the last block knocked out: no block after it to pick
    at = _app("pages/heads.py", instant_heads=False, knockout=[(3, 0)])
    captions = " ".join(c.value for c in at.caption)
    assert "Block 3 is the model's last block" in captions and "Pick a block after" not in captions
    bars = next(f for f in _figures(at) if "all patches" in json.dumps(f["data"]))
    assert "not on the image" not in bars["layout"]["title"]["text"].split(":")[0]

    # the note Compare shows for a method that does not apply (the tiny DINOv2 with registers is a backbone, so
    # the page itself stops before the notes: asked of the method directly)
    from vitviz.methods import why_unavailable
    from vitviz.models.load import load_model

    why = why_unavailable(load_model(str(tiny_dirs["dinov2_registers"]), device="cpu"), "attnlrp")
    assert "DINOv2 (without registers)" in why and "dinov2_with_registers" in why


# --- 9. results kept ------------------------------------------------------------------------------------------


def test_switching_replaced_by_and_back_keeps_the_exact_table():
    at = _app("pages/importance.py")
    next(b for b in at.button if b.label == "Compute head importance").click().run()
    no_trouble(at, "exact, mean")
    mean_table = _z(_spec(at, "importance_map"))
    at.radio(key="_w_knockout_mode").set_value("zero").run()
    no_trouble(at, "zero")
    assert any(b.label == "Compute head importance" for b in at.button)  # not computed for zero yet
    at.radio(key="_w_knockout_mode").set_value("mean").run()
    no_trouble(at, "back to mean")
    assert not any(b.label == "Compute head importance" for b in at.button)
    np.testing.assert_array_equal(_z(_spec(at, "importance_map")), mean_table)
    # computed for zero too: both stay, whichever is shown
    at.radio(key="_w_knockout_mode").set_value("zero").run()
    next(b for b in at.button if b.label == "Compute head importance").click().run()
    at.radio(key="_w_knockout_mode").set_value("mean").run()
    np.testing.assert_array_equal(_z(_spec(at, "importance_map")), mean_table)


# --- 6. the Example box re-selects the example it shows ------------------------------------------------------


def _png(seed: int) -> bytes:
    import io

    from vitviz.data.shapes import make_sample

    buf = io.BytesIO()
    make_sample(seed).image.save(buf, format="PNG")
    return buf.getvalue()


def _showing(at: AppTest) -> str:
    return next(c.value for c in at.sidebar.caption if c.value.startswith("Showing"))


def test_after_an_upload_the_example_box_picks_the_example_it_showed():
    at = _app()
    assert at.selectbox(key="example_pick").value == "demo-star.png"
    at.file_uploader[0].set_value(("mine.png", _png(3), "image/png")).run()
    no_trouble(at, "upload")
    assert at.session_state.image_name == "mine.png"
    at.run()  # the box now says the image is not an example
    box = at.selectbox(key="example_pick")
    assert box.value != "demo-star.png" and "mine.png" in box.value
    box.set_value("demo-star.png").run()
    no_trouble(at, "example again")
    assert at.session_state.image_name == "demo-star.png" and "demo\\-star\\.png" in _showing(at)
    at.run()
    assert at.session_state.image_name == "demo-star.png"  # the upload still in its box does not come back


def test_an_image_opened_elsewhere_leaves_the_example_box_free_to_pick():
    from ui import common

    at = _app()
    at.session_state["image_bytes"] = _png(5)  # as the Data set page's "Open" sets the session's image
    at.session_state["image_name"] = "square_5_00001.png"
    at.session_state["image_digest"] = common.digest(_png(5))
    at.run()
    no_trouble(at, "opened")
    assert "square\\_5\\_00001\\.png" in _showing(at)
    at.selectbox(key="example_pick").set_value("demo-star.png").run()
    assert at.session_state.image_name == "demo-star.png"


# --- 7. advice that applies -----------------------------------------------------------------------------------


def test_a_very_wide_image_is_told_what_applies():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (1, 16000, 3), dtype=np.uint8)).save(buf, format="PNG")
    at = _app()
    at.file_uploader[0].set_value(("wide.png", buf.getvalue(), "image/png")).run()
    no_trouble(at, "upload")
    # without the box: stretched to the model's square, and said so
    assert any("stretched" in c.value and "16000 x 1 px" in c.value for c in at.sidebar.caption)
    next(c for c in at.checkbox if "aspect ratio" in c.label).check().run()
    no_trouble(at, "keep the aspect ratio")  # no error advising "e.g. 96 px" at 96 px high
    advice = " ".join(w.value for w in at.sidebar.warning)
    assert "Untick" in advice and "e.g. 96 px" not in advice


def test_the_budget_advice_does_not_name_the_size_already_asked_for(demo_model):
    from vitviz.capture.forward import check_budget
    from vitviz.errors import VitvizError

    with pytest.raises(VitvizError) as long:
        check_budget(demo_model, (96, 96 * 16000), batch=1, gradients=False, budget=2**31)
    assert "e.g. 96 px" not in str(long.value) and "closer to" in str(long.value)
    with pytest.raises(VitvizError, match=r"e\.g\. 96 px"):
        check_budget(demo_model, (96 * 400, 96 * 400), batch=1, gradients=False, budget=2**31)
