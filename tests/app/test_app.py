"""AppTest for every page: renders with the demo model, and the main controls change what is shown."""

from __future__ import annotations

import json
from pathlib import Path

import app_tools
import numpy as np
import pytest
from app_tools import APP
from streamlit.testing.v1 import AppTest

import vitviz.capture.forward
import vitviz.capture.run

PAGES = [p for p in app_tools.PAGES if p != "pages/dataset.py"]  # the Data set page: tests/app/test_app_dataset.py


def _app(page: str | None = None, *, instant_heads: bool = False) -> AppTest:
    """The app on ``page``; the Heads page server-drawn unless ``instant_heads`` (its in-browser view is
    tested in tests/app/test_headview_page.py and tests/figures/test_headview.py)."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["instant_heads"] = instant_heads
    at.run()
    if page:
        at.switch_page(page)
        at.run()
    return at


def _choose_model(at: AppTest, text: str) -> None:
    """Pick "other" in the sidebar and type ``text`` as the model, as a user would."""
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    at.text_input(key="model_text").input(text).run()


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in app_tools.charts(at)]


def _decode(z) -> np.ndarray:
    """A Plotly array as serialised: a list, or {dtype, bdata (base64), shape}."""
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")]).astype(float)
    return np.array(z, dtype=float)


def _no_trouble(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_with_the_demo_model(page):
    at = _app(page)
    _no_trouble(at)
    assert len(app_tools.charts(at)) >= 1


def test_overview_shows_patches_sequence_and_predictions():
    at = _app()
    figs = _figures(at)
    titles = " ".join(str(f["layout"].get("title", {}).get("text", "")) for f in figs)
    assert "12 x 12 patches (rows x columns) of 8 px" in titles.replace("<br>", " ")
    assert "Input sequence: 1 prefix token(s) + 144 patches = 145 tokens" in titles
    assert "Top predictions" in titles
    # the class selector drives the class-specific views
    box = at.selectbox(key="_w_class_index")
    other = next(i for i in range(5) if i != box.value)  # the demo model has 5 classes, all in its top 5
    box.set_value(other).run()
    _no_trouble(at)
    assert at.session_state.class_index == other


def _head_grid(at: AppTest) -> list:
    """The z values of the small-multiples figure of all heads (tiles titled "head 0", ...)."""
    grid = [f for f in _figures(at) if [a["text"] for a in f["layout"].get("annotations", [])][:1] == ["head 0"]]
    return grid[0]["data"][0]["z"]


def test_heads_layer_query_and_direction_change_the_maps():
    at = _app("pages/heads.py")
    first = _head_grid(at)
    at.slider(key="_w_layer").set_value(0).run()
    _no_trouble(at)
    assert _head_grid(at) != first
    layer0 = _head_grid(at)
    at.session_state.query = 1 + 5 * 12 + 6  # as a click on patch (5, 6) would set it
    at.run()
    assert _head_grid(at) != layer0
    clicked = _head_grid(at)
    at.radio(key="_w_direction").set_value("who looks at it?").run()
    _no_trouble(at)
    assert _head_grid(at) != clicked
    titles = [f["layout"]["title"]["text"] for f in _figures(at) if "title" in f["layout"]]
    assert any("who looks at patch (5, 6)" in t for t in titles)


def _titled(at: AppTest, words: str) -> dict:
    return next(f for f in _figures(at) if words in str(f["layout"].get("title", {}).get("text", "")))


def test_layers_rollout_controls_change_the_rollout():
    at = _app("pages/layers.py")
    _no_trouble(at)
    base = _titled(at, "Rollout of CLS")["data"][1]["z"]
    at.slider(key="_w_discard").set_value(0.5).run()
    assert _titled(at, "Rollout of CLS")["data"][1]["z"] != base
    at.slider(key="_w_rollout_range").set_value((2, 3)).run()
    assert "blocks 2-3" in _titled(at, "Rollout of CLS")["layout"]["title"]["text"]
    at.selectbox(key="_w_fusion").set_value("max").run()
    _no_trouble(at)
    assert _titled(at, "Relevance for")  # class-specific relevance next to rollout
    at.radio(key="_w_metric").set_value("entropy").run()
    assert "entropy" in _titled(at, "click a cell")["layout"]["title"]["text"]


def test_relevance_start_block_on_the_layers_page():
    from PIL import Image

    from vitviz.capture.gradients import explain_classes
    from vitviz.models.load import load_model

    at = _app("pages/layers.py")
    _no_trouble(at)
    assert any("through all blocks (the default)" in c.value for c in at.caption)
    every = _decode(_titled(at, "Relevance for")["data"][1]["z"])
    at.selectbox(key="_w_relevance_from").set_value(3).run()  # the demo ViT: blocks 0..3
    _no_trouble(at)
    assert any("through the last block (3) only" in c.value for c in at.caption)
    fig = _titled(at, "Relevance for")
    loaded = load_model("demo")
    cls = at.session_state.class_index  # the Overview's class (the image's top-1), named as Target.name does
    assert fig["layout"]["title"]["text"] == f"Relevance for {loaded.id2label[cls]} ({cls}) (Chefer et al. 2021)"
    image = Image.open(Path(APP).parent / "assets" / "examples" / "demo-star.png").convert("RGB")
    ref = explain_classes(loaded, image, [cls], start_block=3)[cls].patch_map()
    got = _decode(fig["data"][1]["z"])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    assert not np.allclose(got, every)


def test_positions_page_click_target_and_tile():
    at = _app("pages/positions.py")
    _no_trouble(at)
    assert "12 x 12 positions" in _titled(at, "Position embedding similarity")["layout"]["title"]["text"]
    at.number_input(key="_w_position").set_value(13).run()
    assert "position (1, 1)" in _titled(at, "Similarity to position")["layout"]["title"]["text"]


def test_bad_model_name_keeps_the_previous_model():
    at = _app()
    _choose_model(at, "not a model!")
    assert any("neither an existing local folder" in e.value for e in at.error)
    assert at.session_state.model_name == "demo"
    assert not at.exception


def test_unsupported_model_folder_gives_a_readable_error(tmp_path):
    import transformers

    cfg = transformers.ResNetConfig(hidden_sizes=[8], depths=[1], embedding_size=8)
    transformers.ResNetModel(cfg).save_pretrained(tmp_path, safe_serialization=True)
    at = _app()
    _choose_model(at, str(tmp_path))
    assert any("'resnet' models are not supported" in e.value for e in at.error)
    assert at.session_state.model_name == "demo" and not at.exception


def test_backbone_without_positions(tiny_dirs):
    at = _app()
    _choose_model(at, str(tiny_dirs["beit"]))
    _no_trouble(at)
    at.switch_page("pages/positions.py").run()
    assert any("relative position bias" in i.value for i in at.info)
    at.switch_page("pages/layers.py").run()
    assert not at.exception


def test_state_persists_across_pages():
    at = _app("pages/heads.py")
    at.slider(key="_w_layer").set_value(1).run()
    at.switch_page("pages/overview.py").run()
    at.switch_page("pages/heads.py").run()
    assert at.slider(key="_w_layer").value == 1


def test_changing_controls_runs_no_forward_pass(monkeypatch):
    calls = []
    real = vitviz.capture.forward.capture_batch
    monkeypatch.setattr(vitviz.capture.forward, "capture_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    real_run = vitviz.capture.run._make_run  # the pages' capture is the image's Run's
    monkeypatch.setattr(vitviz.capture.run, "_make_run", lambda *a, **k: calls.append(1) or real_run(*a, **k))
    at = _app("pages/heads.py")
    before = len(calls)
    at.slider(key="_w_layer").set_value(0).run()
    at.radio(key="_w_head").set_value(2).run()
    at.session_state.query = 20
    at.run()
    at.switch_page("pages/layers.py").run()
    at.slider(key="_w_discard").set_value(0.3).run()
    assert not at.exception
    assert len(calls) == before


def _png_bytes() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGBA", (50, 40), (200, 30, 30, 128)).save(buf, format="PNG")
    return buf.getvalue()


def test_uploads_good_and_bad():
    at = _app()
    before = at.session_state.image_name
    at.file_uploader[0].set_value(("report.jpg", b"%PDF-1.4 definitely not a picture", "image/jpeg")).run()
    assert not at.exception
    assert any("report\\.jpg" in e.value and "not an image" in e.value for e in at.error)  # the name as plain text
    assert at.session_state.image_name == before  # nothing the user had is lost
    at.file_uploader[0].set_value(("red.png", _png_bytes(), "image/png")).run()
    assert not at.exception and not at.error
    assert at.session_state.image_name == "red.png"
    assert any("transparency" in i.value for i in at.info)
    # choosing an example afterwards wins over the file still in the uploader
    at.selectbox(key="example_pick").set_value("coffee.jpg").run()
    assert at.session_state.image_name == "coffee.jpg" and not at.exception


def test_backbone_without_classifier_on_every_page(tiny_dirs):
    at = _app()
    _choose_model(at, str(tiny_dirs["dinov2_registers"]))
    _no_trouble(at)
    assert any("backbone without a classifier" in i.value for i in at.info)
    for page in PAGES[1:]:
        at.switch_page(page).run()
        _no_trouble(at)
    at.switch_page("pages/layers.py").run()
    assert any("needs a classifier" in i.value for i in at.info)


def test_keep_aspect_ratio_sizes_the_input_from_the_image():
    at = _app()
    at.selectbox(key="example_pick").set_value("coffee.jpg").run()  # 600 x 400
    next(c for c in at.checkbox if "aspect ratio" in c.label).check().run()
    assert at.session_state.input_size == (96, 144)  # 96 px high, 1.5 x as wide, whole 8 px patches
    _no_trouble(at)
    assert any("input 144 x 96 px" in c.value for c in at.caption)  # the overview states what the model saw


@pytest.mark.parametrize("key", ["swin", "swinv2", "cvt", "pvt", "pvt_v2", "mobilevit", "mobilevitv2", "hiera"])
def test_every_page_on_a_hierarchical_model(hier_dirs, key):
    at = _app()
    _choose_model(at, str(hier_dirs[key]))
    _no_trouble(at)
    assert at.session_state.model_name == str(hier_dirs[key])
    assert any("stage 1" in c.value for c in at.caption)  # the overview lists the stages
    if key == "hiera":  # the overview says what Hiera's tokens are, not the ViT paper's patches and CLS
        assert any("Hiera's tokens" in c.value and "unrolled" in c.value for c in at.caption)
    for page in PAGES[1:]:
        at.switch_page(page).run()
        _no_trouble(at)
    at.switch_page("pages/layers.py").run()
    titles = " ".join(str(f["layout"].get("title", {}).get("text", "")) for f in _figures(at))
    assert "stage 1 (" in " ".join(h.value for h in at.subheader)  # block-by-block maps, one row per stage
    if key.startswith("mobilevit"):  # rollout is undefined across MobileViT's convolutions: said, not drawn
        assert "Rollout of" not in titles and any("convolution" in i.value for i in at.info)
    else:
        assert "Rollout of" in titles and "Relevance for" in titles


def test_heads_page_stages_windows_and_a_click_at_another_stage(hier_dirs):
    at = _app()
    _choose_model(at, str(hier_dirs["swin"]))
    at.switch_page("pages/heads.py").run()
    _no_trouble(at)
    at.radio(key="_stage_pick").set_value(0).run()  # stage 0: 16 x 16 tokens, windows of 4
    assert at.session_state.layer == 0
    at.select_slider(key="_w_layer").set_value(1).run()  # the shifted block
    big = _titled(at, "Stage 0, block 1, head 0")
    shapes = big["layout"].get("shapes", [])
    # window edges of a shift-2 block sit at tokens 2, 6, 10, 14 (x 4 px): 4 rows + 4 columns, then the query mark
    assert sorted({s["y0"] for s in shapes if s["type"] == "line" and s["x0"] == 0}) == [8, 24, 40, 56]
    # a click on stage 0 (customdata: token, row, col, value, x, y) picks the token at that pixel ...
    at.session_state["head_map"] = {"selection": {"points": [{"customdata": [0, 3, 5, 0.0, 22.0, 14.0]}]}}
    at.run()
    assert (at.session_state.query_stage, at.session_state.query) == (0, 3 * 16 + 5)
    # ... and stage 1 shows the same place: pixel (22, 14) lies in cell (1, 2) of the 8 x 8 grid
    at.radio(key="_stage_pick").set_value(1).run()
    _no_trouble(at)
    assert any("where token (1, 2) looks" in f["layout"].get("title", {}).get("text", "") for f in _figures(at))


def test_heads_page_draws_a_hiera_pooling_blocks_windows_on_its_finer_keys(hier_dirs):
    at = _app()
    _choose_model(at, str(hier_dirs["hiera"]))
    at.switch_page("pages/heads.py").run()
    at.radio(key="_stage_pick").set_value(1).run()  # stage 1: 8 x 8 tokens; block 0 pools over stage 0's 16 x 16
    at.session_state["show_windows"] = True
    at.run()
    _no_trouble(at)
    big = _titled(at, "Stage 1, block 0, head 0")
    z = _decode(big["data"][1]["z"])
    assert z.shape == (16, 16)  # the keys: stage 0's tokens
    shapes = big["layout"].get("shapes", [])
    # one mask-unit edge per axis, between units of 4 x 4 queries = 8 x 8 keys: at key 8 (x 4 px of 64 / 16)
    assert sorted({s["y0"] for s in shapes if s["type"] == "line" and s["x0"] == 0}) == [32]


def test_summaries_mark_stages_and_blank_missing_heads(hier_dirs):
    at = _app()
    _choose_model(at, str(hier_dirs["swin"]))
    at.switch_page("pages/layers.py").run()
    grid = _titled(at, "click a cell")
    z = _decode(grid["data"][0]["z"])
    assert z.shape == (4, 4) and np.isnan(z[:2, 2:]).all() and np.isfinite(z[2:]).all()  # 2 heads, then 4
    assert grid["layout"]["yaxis"]["ticktext"][2] == "stage 1, block 0"


def test_positions_page_shows_relative_bias_for_swin_and_a_sentence_for_cvt(hier_dirs):
    at = _app()
    _choose_model(at, str(hier_dirs["swin"]))
    at.switch_page("pages/positions.py").run()
    _no_trouble(at)
    assert any("Relative position bias" in h.value for h in at.subheader)
    _choose_model(at, str(hier_dirs["cvt"]))
    at.switch_page("pages/positions.py").run()
    assert any("convolutional" in i.value for i in at.info)


@pytest.mark.parametrize("key", ["clip", "siglip", "siglip2", "dinov3"])
def test_every_page_on_the_modern_vits(modern_dirs, key):
    at = _app()
    _choose_model(at, str(modern_dirs[key]))
    _no_trouble(at)
    for page in PAGES[1:]:
        at.switch_page(page).run()
        _no_trouble(at)
    at.switch_page("pages/heads.py").run()
    titles = " ".join(str(f["layout"].get("title", {}).get("text", "")) for f in _figures(at))
    if key == "dinov3":  # registers are prefix tokens: the bar of tokens not on the image names them
        prefix = _titled(at, "Where the query's attention goes")["data"][0]["x"]
        assert list(prefix)[:3] == ["CLS", "REG0", "REG1"]
    if key.startswith("siglip"):  # no CLS: the default query is the pooled one
        assert "pooled query" in titles


def test_zero_shot_labels_change_without_a_new_capture(modern_dirs, monkeypatch):
    calls = []
    real = vitviz.capture.forward.capture_batch
    monkeypatch.setattr(vitviz.capture.forward, "capture_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    real_run = vitviz.capture.run._make_run  # the pages' capture is the image's Run's
    monkeypatch.setattr(vitviz.capture.run, "_make_run", lambda *a, **k: calls.append(1) or real_run(*a, **k))
    at = _app()
    _choose_model(at, str(modern_dirs["clip"]))
    _no_trouble(at)
    box = at.text_area(key=f"labels_{modern_dirs['clip']}")
    box.input("cat, dog, car").run()
    _no_trouble(at)
    preds = _titled(at, "Top predictions (zero-shot: softmax over the labels)")
    assert {y.split(" (")[0] for y in preds["data"][0]["y"]} == {"cat", "dog", "car"}
    before = len(calls)
    at.text_area(key=f"labels_{modern_dirs['clip']}").input("red star\nbird").run()
    _no_trouble(at)
    preds = _titled(at, "Top predictions")
    assert {y.split(" (")[0] for y in preds["data"][0]["y"]} == {"red star", "bird"}
    assert len(calls) == before  # only the text tower ran
    at.switch_page("pages/layers.py").run()
    _no_trouble(at)
    titles = " ".join(str(f["layout"].get("title", {}).get("text", "")) for f in _figures(at))
    assert "Relevance for label 'red star'" in titles or "Relevance for label 'bird'" in titles
    assert any("image-text score" in c.value for c in at.caption)
    words = [m.value for m in at.markdown if "<span" in m.value]  # the prompt's tokens, coloured, escaped
    assert len(words) == 1 and "&lt;bos&gt;" in words[0] and "&lt;eos&gt;" in words[0]
    assert ">star<" in words[0] or ">bird<" in words[0]
    assert any("Prompt words for" in c.value and "end-of-text token" in c.value for c in at.caption)


def test_siglip_scores_are_sigmoids_and_bad_labels_are_a_message(modern_dirs):
    at = _app()
    _choose_model(at, str(modern_dirs["siglip"]))
    assert _titled(at, "each label's own sigmoid")
    at.text_area(key=f"labels_{modern_dirs['siglip']}").input(" , ,").run()
    assert not at.exception
    assert any("at least one label" in e.value for e in at.error)
    assert any("Type labels in the sidebar" in i.value for i in at.info)  # the overview waits for labels
    at.text_area(key=f"labels_{modern_dirs['siglip']}").input("cat").run()
    _no_trouble(at)


def _shown(markdown: str) -> str:
    """What a Markdown element shows: backslash escapes and zero-width spaces (vitviz.text.md_plain) removed."""
    import re

    return re.sub(r"\\(.)", r"\1", markdown).replace("\u200b", "")


def test_labels_the_tokenizer_does_not_know_are_named_and_a_missing_tokenizer_said(modern_dirs, tmp_path):
    import shutil

    at = _app()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    at.text_area(key="labels_demo-clip").input("cat, dog, circle").run()
    _no_trouble(at)
    warned = [_shown(w.value) for w in at.warning if "does not know" in w.value]
    assert len(warned) == 1 and "'cat', 'dog'" in warned[0] and "'circle'" not in warned[0]
    at.text_area(key="labels_demo-clip").input("circle, star").run()
    assert not [w for w in at.warning if "does not know" in w.value]
    folder = tmp_path / "siglip-no-tokenizer"
    shutil.copytree(modern_dirs["siglip"], folder, ignore=shutil.ignore_patterns("*token*"))
    _choose_model(at, str(folder))
    _no_trouble(at)
    assert any("no tokenizer files" in _shown(w.value) and "zero-shot" in _shown(w.value) for w in at.warning)
    assert not any("backbone without" in i.value for i in at.info)
    at.switch_page("pages/layers.py").run()
    _no_trouble(at)
    assert any("no tokenizer files" in _shown(i.value) for i in at.info)
    assert not any("backbone" in i.value for i in at.info)


def test_knock_out_a_head_on_the_heads_page():
    from vitviz.data.shapes import make_sample

    at = _app()
    buf = __import__("io").BytesIO()
    make_sample(2).image.save(buf, format="PNG")
    at.file_uploader[0].set_value(("star.png", buf.getvalue(), "image/png")).run()
    at.switch_page("pages/heads.py").run()
    at.slider(key="_w_layer").set_value(0).run()
    at.radio(key="_w_head").set_value(1).run()
    next(b for b in at.button if b.label.startswith("Knock out block 0, head 1")).click().run()
    _no_trouble(at)
    assert at.session_state.knockout == [(0, 1)]
    before_after = _titled(at, "Top classes before and after")
    assert [t["name"] for t in before_after["data"]] == ["before", "after"]
    assert any("The top class changes to 'square'" in c.value for c in at.caption)  # the measured demo effect
    at.slider(key="_w_layer").set_value(2).run()  # downstream: attention after the knock-out
    _no_trouble(at)
    assert any("Block 2 after the knock-out" in c.value for c in at.caption)


def test_head_importance_page_computes_on_request_and_opens_a_head():
    at = _app("pages/importance.py")
    _no_trouble(at)
    assert not any("click a cell" in str(f["layout"].get("title", {}).get("text", "")) for f in _figures(at))
    next(b for b in at.button if b.label == "Compute head importance").click().run()
    _no_trouble(at)
    table = _titled(at, "Effect of knocking out each head")
    assert _decode(table["data"][0]["z"]).shape == (4, 4)
    assert _titled(at, "Direct contribution of each head")
    at.radio(key="importance_method").set_value("fast estimate (first order)").run()
    next(b for b in at.button if b.label == "Compute head importance").click().run()
    assert _titled(at, "Fast estimate") and not at.exception
    at.session_state["importance_map"] = {"selection": {"points": [{"customdata": [1, 2]}]}}
    at.run()
    assert (at.session_state.layer, at.session_state.head) == (1, 2)


def test_logit_lens_on_the_layers_page():
    at = _app("pages/layers.py")
    _no_trouble(at)
    lens = _titled(at, "Logit lens")
    assert len(lens["data"]) == 6  # five classes and the rank of the top one


def test_compare_explanations_maps_then_curves_on_request(monkeypatch):
    import importlib

    faithfulness = importlib.import_module("vitviz.evaluate.faithfulness")  # the package re-exports a function
    calls = []
    real = faithfulness.Perturbations.curves_many
    monkeypatch.setattr(faithfulness.Perturbations, "curves_many", lambda *a, **k: calls.append(1) or real(*a, **k))
    at = _app("pages/compare.py")
    _no_trouble(at)
    tiles = [f for f in _figures(at) if f["layout"].get("annotations")]
    assert [a["text"].split(" [")[0] for a in tiles[0]["layout"]["annotations"]] == [  # titles: "name [min, max]"
        "attention",
        "rollout",
        "relevance",
        "gradcam",
        "integrated_gradients",
        "attnlrp",
        "random",
    ]
    assert not calls  # curves only on request
    next(b for b in at.button if b.label == "Compute the curves").click().run()
    _no_trouble(at)
    curves = _titled(at, "Deletion and insertion curves")
    assert len(curves["data"]) == 14  # seven methods, two curves each
    table = at.dataframe[0].value
    assert list(table["method"]).count("random") == 1 and len(table) == 7
    assert len(calls) == 1
    at.switch_page("pages/heads.py").run()
    at.switch_page("pages/compare.py").run()  # back again: the curves come from the cache
    assert _titled(at, "Deletion and insertion curves") and len(calls) == 1


def test_compare_explanations_with_zero_shot_labels(modern_dirs):
    import torch
    from PIL import Image

    from vitviz.capture.forward import input_size_for, preprocess
    from vitviz.models.load import load_model

    at = _app()
    _choose_model(at, str(modern_dirs["clip"]))
    at.text_area(key=f"labels_{modern_dirs['clip']}").input("cat, dog, car").run()
    at.switch_page("pages/compare.py").run()
    _no_trouble(at)
    assert any("Zero-shot: the label's score" in c.value for c in at.caption)
    tiles = [f for f in _figures(at) if f["layout"].get("annotations")]
    assert "relevance" in [a["text"].split(" [")[0] for a in tiles[0]["layout"]["annotations"]]
    next(b for b in at.button if b.label == "Compute the curves").click().run()
    _no_trouble(at)
    curves = _titled(at, "Deletion and insertion curves")
    # deletion starts at the explained label's probability (softmax over the three labels, the model's own forward)
    loaded = load_model(str(modern_dirs["clip"]))
    image = Image.open(Path(APP).parent / "assets" / "examples" / "demo-star.png").convert("RGB")
    pixels, _ = preprocess(loaded, [image], input_size_for(loaded, None, image.size))
    tok = loaded.text.tokenizer(
        [f"a photo of a {w}." for w in ("cat", "dog", "car")], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        own = loaded.model(**tok, pixel_values=pixels, interpolate_pos_encoding=True).logits_per_image[0]
    top = float(torch.softmax(own, 0).max())
    deletion = next(d for d in curves["data"] if "deletion" in str(d.get("name", "")).lower() or d.get("y"))
    assert _decode(deletion["y"])[0] == pytest.approx(top, abs=1e-4)


def test_the_heads_query_box_sets_the_query_and_a_stale_box_does_not():
    """The query box of the Heads page sets the query; a box drawn for an older query (the browser's stale copy
    during a rerun, issue 22.4) changes nothing."""
    from vitviz.record import POOLED

    at = _app("pages/heads.py")
    _no_trouble(at)
    at.selectbox(key="query_pick_0_0").set_value(POOLED).run()  # demo: CLS is token 0
    assert at.session_state["query"] == POOLED
    assert "where pooled query looks" in _titled(at, "head 0:")["layout"]["title"]["text"]
    assert at.selectbox(key=f"query_pick_0_{POOLED}").value == POOLED  # a new box at the new query
    assert at.session_state["_query_drawn"] == (0, POOLED)
    script = AppTest.from_function(_stale_callback, default_timeout=30)
    script.run()
    assert not script.exception, [e.value for e in script.exception]
    assert script.session_state["log"] == [1, 5]


def _stale_callback():
    import streamlit as st

    from ui.common import pick_query

    ss = st.session_state
    ss.update(query=1, query_stage=0, _query_drawn=(0, 1), query_pick_0_0=0, query_pick_0_1=5)
    pick_query(0, 0, "query_pick_0_0")  # the box drawn for the old query: ignored
    first = ss.query
    pick_query(0, 1, "query_pick_0_1")  # the box the page drew last: taken
    ss.log = [first, ss.query]
