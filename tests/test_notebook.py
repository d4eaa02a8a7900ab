"""The notebook API: vitviz.run returns the engine's Run, vitviz.show draws every view of it (zero-shot models
included), every input is checked with a message, the head view's payload against the record, and
docs/notebook.ipynb run (issues 31, 32.13-16, 33.8 and 33.13)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitviz
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.gradients import explain_targets
from vitviz.capture.run import Run, clear_runs
from vitviz.capture.targets import Target
from vitviz.data.images import load_image
from vitviz.errors import ImageError, ModelLoadError, VitvizError
from vitviz.figures.headview import pack_rows
from vitviz.models.zeroshot import ZeroShotError, encode_labels, parse_labels, score
from vitviz.notebook import DEFAULT_OPACITY, OPTIONS, VIEWS, HeadView
from vitviz.sae.demo import DEMO_SAE_DIR

ROOT = Path(__file__).resolve().parents[1]
STAR = ROOT / "assets" / "examples" / "demo-star.png"


@pytest.fixture(scope="module")
def demo_run(one_thread):
    return vitviz.run("demo", STAR)


@pytest.fixture(scope="module")
def clip_run(one_thread):
    return vitviz.run("demo-clip", STAR, labels="star, circle, square")


def _payload(view: HeadView) -> dict:
    tag = '<script id="vitviz-data" type="application/json">'  # the page's data, JSON with <, > and & escaped
    start = view.html.index(tag) + len(tag)
    return json.loads(view.html[start : view.html.index("</script>", start)])


def _z(fig) -> np.ndarray:
    return np.array(next(t.z for t in fig.data if t.type == "heatmap"), dtype=float)


# --- the Run (issue 31) ---------------------------------------------------------------------------


def test_run_is_the_engines_run(demo_run):
    assert type(demo_run) is Run
    cap = demo_run.capture
    assert np.allclose(demo_run.scores.numpy(), cap.logits, atol=1e-5)
    out = demo_run.activation(demo_run.name(3, "out"))
    assert out.shape[-1] == demo_run.loaded.config.hidden_size
    assert demo_run.labels is None and demo_run.text_embeddings is None


# --- the views ------------------------------------------------------------------------------------


def test_head_view_carries_the_records_attention(demo_run):
    view = vitviz.show(demo_run)
    assert isinstance(view, HeadView)
    d = _payload(view)
    cap = demo_run.capture
    L, H, T, _ = cap.attentions.shape
    codes = np.frombuffer(zlib.decompress(base64.b64decode(d["maps"])), np.uint8).reshape(L, H, T, T - 1)
    expected, _ = pack_rows(cap.attentions[..., 1:])
    assert np.array_equal(codes, expected)
    share = np.frombuffer(zlib.decompress(base64.b64decode(d["prefix_share"])), "<f4").reshape(L, H, T, 1)
    assert np.allclose(share, cap.attentions[..., :1], atol=1e-6)


def test_static_views_are_the_apps_figures_of_the_same_numbers(demo_run):
    cap = demo_run.capture
    fig = vitviz.show(demo_run, "rollout")
    row, _ = capture_rollout(cap)
    assert np.allclose(_z(fig), row[1:].reshape(cap.grid)) and np.isclose(row.sum(), 1.0, atol=1e-5)
    bars = vitviz.show(demo_run, "predictions").data[0]
    assert list(bars.x)[::-1] == pytest.approx([p.probability for p in cap.predictions])
    assert list(bars.y)[-1] == f"{cap.predictions[0].label} ({cap.predictions[0].index})"
    for view in VIEWS:
        # the bundled demo SAE reads demo's blocks.2; the card's direct effect needs no index
        options = {"features": {"sae": DEMO_SAE_DIR}, "feature-card": {"sae": DEMO_SAE_DIR, "part": "effect"}}
        options = options.get(view, {})
        assert vitviz.show(demo_run, view, **options) is not None


def test_relevance_is_the_engines_for_the_class_asked(demo_run):
    """Against explain_targets run on its own forward (the cache cleared first, so it is not the same graph)."""
    image = load_image(STAR)
    got = {c: _z(vitviz.show(demo_run, "relevance", class_index=c)) for c in (None, 1)}
    clear_runs()
    loaded = demo_run.loaded
    top = int(np.argmax(demo_run.capture.logits))
    for c, k in ((None, top), (1, 1)):
        ref = explain_targets(loaded, image, {k: ("x", lambda out, k=k: loaded.family.logits(loaded.model, out)[0, k])})
        assert np.allclose(got[c], ref[k].patch_map(), atol=1e-5)


def test_zero_shot_runs_score_the_labels_and_draw_every_view(clip_run):
    """Issue 32.13: labels= was a TypeError, predictions said 'backbone', relevance was a bare IndexError."""
    loaded = clip_run.loaded
    labels = parse_labels("star, circle, square", loaded.text.template)
    assert clip_run.labels == labels and clip_run.labels.prompts[0] == "a photo of a star."
    text = encode_labels(loaded.model, loaded.text, labels)
    expected = score(loaded.model, loaded.text, clip_run.capture.image_embedding, text)  # the app's scores
    assert np.allclose(clip_run.scores.numpy(), expected.logits, atol=1e-4)
    bars = vitviz.show(clip_run, "predictions").data[0]
    order = np.argsort(-expected.probabilities)
    assert list(bars.y)[::-1] == [f"{labels.names[i]} ({i})" for i in order]
    assert list(bars.x)[::-1] == pytest.approx(expected.probabilities[order], abs=1e-5)
    for view in VIEWS:
        if view not in ("features", "feature-card"):  # no SAE is bundled for demo-clip
            assert vitviz.show(clip_run, view) is not None


def test_zero_shot_relevance_explains_the_labels_score(clip_run):
    got = _z(vitviz.show(clip_run, "relevance", label="circle"))
    assert np.allclose(_z(vitviz.show(clip_run, "relevance", label=1)), got)
    loaded = clip_run.loaded
    target = Target.of_label(clip_run.labels, "circle").bind(loaded, clip_run.text_embeddings)
    clear_runs()
    ref = explain_targets(loaded, load_image(STAR), {1: ("circle", lambda out: target(out).reshape(-1)[0])})[1]
    assert np.allclose(got, ref.patch_map(), atol=1e-5)
    with pytest.raises(VitvizError, match="not one of this run's labels"):
        vitviz.show(clip_run, "relevance", label="cat")
    with pytest.raises(VitvizError, match="label="):
        vitviz.show(clip_run, "relevance", class_index=0)


def test_a_template_shapes_the_prompts_and_labels_need_a_two_tower_model(one_thread):
    r = vitviz.run("demo-clip", STAR, labels=["star", "circle"], template="{}")
    assert r.labels.prompts == ("star", "circle")
    with pytest.raises(ZeroShotError, match="labels="):
        vitviz.run("demo", STAR, labels="star")
    bare = vitviz.run("demo-clip", STAR)
    for view in ("predictions", "relevance"):
        with pytest.raises(VitvizError, match="labels="):
            vitviz.show(bare, view)


def test_two_label_sets_with_the_same_prompts_keep_their_own_names(one_thread):
    a = vitviz.run("demo-clip", STAR, labels="star, circle")
    b = vitviz.run("demo-clip", STAR, labels="a photo of a star., a photo of a circle.", template="{}")
    assert a.labels.names == ("star", "circle") and b.labels.names[0] == "a photo of a star."
    assert torch.equal(a.scores, b.scores)  # one forward, one set of embeddings


def test_swin_positions_are_its_relative_biases_not_a_message_ending_at_a_colon(one_thread):
    """Issue 32.16: demo-swin's positions message ended at a colon."""
    r = vitviz.run("demo-swin", STAR)
    fig = vitviz.show(r, "positions")
    bias = r.capture.position.biases[0].bias
    z = _z(fig)
    assert np.isclose(np.nanmax(np.abs(z)), np.abs(bias).max(), atol=1e-6)
    with pytest.raises(VitvizError, match="relative bias tables"):
        vitviz.show(r, "positions", block=99)


def test_maps_leave_the_photo_visible_and_take_an_opacity(demo_run):
    """Issue 32.16: maps covered the photo at opacity 1 and opacity= was refused by rollout."""
    heat = next(t for t in vitviz.show(demo_run, "rollout").data if t.type == "heatmap")
    assert heat.opacity == DEFAULT_OPACITY < 1
    heat = next(t for t in vitviz.show(demo_run, "rollout", opacity=0.3).data if t.type == "heatmap")
    assert heat.opacity == 0.3
    heat = next(t for t in vitviz.show(demo_run, "relevance", opacity=0.25).data if t.type == "heatmap")
    assert heat.opacity == 0.25
    view = vitviz.show(demo_run, opacity=0.4)
    assert '"opacity": 0.4' in view.html


# --- messages (issues 32.14, 32.16, 33.13) ----------------------------------------------------------


@pytest.mark.parametrize(
    "view,options,words",
    [
        ("heads-static", {"layer": 9}, "layer=9: demo has 4 blocks"),
        ("heads-static", {"block": 9}, "block=9: demo has 4 blocks"),
        ("heads-static", {"block": 1, "layer": 2}, "name the same thing"),
        ("heads-static", {"layer": 99}, "layer=99"),
        ("heads-static", {"query": 10**9}, "query="),
        ("heads-static", {"layer": "1"}, "whole number"),
        ("rollout", {"fuson": "max"}, "did you mean 'fusion'"),
        ("rollout", {"fusion": "median"}, "'mean', 'max' or 'min'"),
        ("rollout", {"start": 3, "stop": 2}, "stop=2"),
        ("rollout", {"discard": 1.0}, "discard"),
        ("rollout", {"opacity": 2}, "opacity"),
        ("heads", {"height": "1;x"}, "height"),
        ("heads", {"max_bytes": -1}, "max_bytes"),
        ("relevance", {"class_index": 5}, "class_index=5: demo has 5 classes"),
        ("relevance", {"label": "star"}, "zero-shot"),
        ("predictions", {"top": 0}, "top"),
        ("tokens", {"x": 1}, "takes no options"),
        ("attention", {}, "choose one of"),
    ],
)
def test_bad_options_get_one_clear_message(demo_run, view, options, words):
    with pytest.raises(VitvizError, match=words) as info:
        vitviz.show(demo_run, view, **options)
    assert "_rollout" not in str(info.value) and "IndexError" not in type(info.value).__name__
    assert isinstance(info.value, ValueError)  # NotebookError is a ValueError too: older except clauses hold


def test_every_view_lists_its_options():
    assert set(OPTIONS) == set(VIEWS)


def test_a_bare_record_draws_what_it_holds(demo_run):
    assert vitviz.show(demo_run.capture, "rollout") is not None
    with pytest.raises(ValueError, match="needs the model"):
        vitviz.show(demo_run.capture, "relevance")


@pytest.mark.parametrize(
    "size,words",
    [
        (0, "between 1 and 8192"),
        (-96, "between 1 and 8192"),
        (1, "smaller than one patch of 'demo' \\(8 px\\)"),
        ("big", "one side in pixels"),
        (96.0, "one side in pixels"),
        (True, "one side in pixels"),
        ((96,), "one number"),
        ((96, 96, 3), "one number"),
        ((96, 0), "between 1 and 8192"),
    ],
)
def test_sizes_the_command_line_refuses_are_refused_alike(one_thread, size, words):
    """Issue 32.14 / 33.13: size=0, 1, -96 ran at 8 x 8 and size='big' was a TypeError deep inside."""
    with pytest.raises(VitvizError, match=words):
        vitviz.run("demo", STAR, size=size)


def test_arrays_float_and_channels_first_score_like_the_uint8_image(demo_run):
    """Issue 32.14: a float image in 0..1 became black (the prediction changed); channels-first was a TypeError."""
    rgb = np.asarray(Image.open(STAR).convert("RGB"))
    as_uint8 = vitviz.run("demo", rgb)
    for arr in (rgb.astype(np.float32) / 255, rgb.transpose(2, 0, 1)):
        got = vitviz.run("demo", arr)
        assert np.allclose(got.scores.numpy(), as_uint8.scores.numpy(), atol=1e-5)
    assert np.allclose(as_uint8.scores.numpy(), demo_run.scores.numpy(), atol=1e-5)
    for bad, words in (
        (np.full((8, 8, 3), np.nan, np.float32), "NaN"),
        (np.zeros((0, 0, 3), np.uint8), "no pixels"),
        (np.zeros((1, 3, 8, 8), np.float32), "batch"),
    ):
        with pytest.raises(ImageError, match=words):
            vitviz.run("demo", bad)


def test_image_sources_refused_with_a_message(tmp_path):
    """Issue 32.16 (URLs), 33.8 (a device, a huge PIL image)."""
    with pytest.raises(ImageError, match="URL"):
        vitviz.run("demo", "https://example.com/cat.jpg")
    with pytest.raises(ImageError, match="not a regular file"):
        vitviz.run("demo", "/dev/zero")
    with pytest.raises(ImageError, match="pixels"):
        vitviz.run("demo", Image.new("1", (20_000, 20_000)))
    with pytest.raises(ImageError, match="An image is a path"):
        vitviz.run("demo", 42)


def test_a_misspelt_model_name_gets_the_bundled_names():
    """Issue 32.16: "Demo" was looked up on the hub with no hint of the bundled names."""
    with pytest.raises(ModelLoadError, match=r"did you mean 'demo'.*demo, demo-swin, demo-clip"):
        vitviz.run("Demo", STAR)


# --- the head view outside a trusted notebook (issue 32.15) -----------------------------------------


def test_head_view_output_has_a_static_picture_and_a_note_for_frontends_without_scripts(demo_run):
    view = vitviz.show(demo_run)
    bundle = view._repr_mimebundle_()
    assert set(bundle) == {"text/html", "image/png", "text/plain"}
    png = base64.b64decode(bundle["image/png"])
    assert png.startswith(b"\x89PNG") and png == view.png
    page = bundle["text/html"]
    assert "<iframe srcdoc=" in page and "display:none" in page  # shown by the output's own script
    assert f"data:image/png;base64,{bundle['image/png']}" in page  # the picture, in the HTML too
    assert "Trust Notebook" in page and "jupyter trust" in page
    assert ".save(" in bundle["text/plain"] and ".open()" in bundle["text/plain"]


def test_head_view_in_plain_python_says_how_to_see_it_and_opens_in_the_browser(demo_run, monkeypatch, tmp_path):
    """Issue 32.15: in plain Python show(run) printed HeadView(height=640)."""
    view = vitviz.show(demo_run)
    text = repr(view)
    assert "demo" in text and ".save(" in text and ".open()" in text and "height=" not in text
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda url, *a, **k: opened.append(url) or True)
    path = view.open()
    try:
        assert opened == [path.as_uri()] and path.read_text(encoding="utf-8") == view.html
    finally:
        path.unlink()
    assert view.save(tmp_path / "h.html").read_text(encoding="utf-8") == view.html


def test_too_large_record_falls_back_with_a_note_naming_max_bytes(demo_run):
    """Issue 32.16: max_bytes= was undocumented, and the note pointed to 'the server-drawn views'."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = vitviz.show(demo_run, "heads", max_bytes=10_000)
    assert type(fig).__name__ == "Figure"
    notes = " ".join(str(w.message) for w in caught)
    assert "MB" in notes and "max_bytes=" in notes and "server" not in notes
    assert "max_bytes" in vitviz.show.__doc__


def test_loading_prints_no_progress_bars(tmp_path):
    """Issue 32.18: every load printed "Loading weights" bars (and a TqdmWarning in a notebook)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import vitviz; vitviz.run('demo', {str(STAR)!r})"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr + done.stdout and "Tqdm" not in done.stderr


# --- the docs notebook ------------------------------------------------------------------------------


def test_docs_notebook_runs(one_thread, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "docs" / "notebook.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs are not committed"
    assert any("demo-clip" in c.source and "labels=" in c.source for c in nb.cells if c.cell_type == "code")
    # the kernel imports vitviz from this checkout, as after `pip install .`
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "docs")}}
    ).execute()
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    html_outputs = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("<iframe srcdoc=" in o["data"]["text/html"] for o in html_outputs)
    assert any("image/png" in o.get("data", {}) for o in html_outputs)  # the head view's static picture
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    streams = " ".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "Loading weights" not in streams and "TqdmWarning" not in streams
