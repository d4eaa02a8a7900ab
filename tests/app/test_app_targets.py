"""AppTest of issue 20 item 3 (app side) and issue 21 item 4 (text side): the explained target on the Overview and
Compare pages (a class or label, or the difference of two), and the prompt words' own start block."""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from app_tools import APP, charts, no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest
from target_reference import clip_relevance_by_hand, relevance_by_hand

from vitviz.figures import tile_gap

STAR = Path(APP).parent / "assets" / "examples" / "demo-star.png"


def _figures(at: AppTest) -> dict[str, dict]:
    figs = [json.loads(c.proto.spec) for c in charts(at)]
    return {str(f["layout"].get("title", {}).get("text", "")): f for f in figs}


def _titled(at: AppTest, start: str) -> tuple[str, dict]:
    return next((t, f) for t, f in _figures(at).items() if t.startswith(start))


def _z(trace) -> np.ndarray:
    z = trace["z"] if "z" in trace else trace["y"]
    if isinstance(z, dict):
        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        shape = [int(n) for n in str(z.get("shape", arr.size)).split(",")]
        return arr.reshape(shape).astype(float)
    return np.array(z, dtype=float)


@pytest.fixture(scope="module")
def star_pixels(demo_model):
    from vitviz.capture.forward import preprocess

    image = Image.open(STAR).convert("RGB")
    return preprocess(demo_model, [image], (96, 96))[0]


def _app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    if page:
        at.switch_page(page).run()
    return at


CLIP_NAMES = ("circle", "square", "triangle", "cross", "star")  # demo-clip's suggested labels, in scoring order


def _demo_clip_pair(page: str) -> tuple[AppTest, int, int]:
    """demo-clip's ``page`` with the suggested labels: the app, its label A (the session's) and a label B != A."""
    at = _app()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    at.switch_page(page).run()
    no_trouble(at, f"demo-clip {page}")
    a = at.session_state.class_index
    return at, a, next(i for i in range(len(CLIP_NAMES)) if i != a)


def _clip_star_pixels():
    """demo-clip and the star example's pixels at 96 px."""
    from vitviz.capture.forward import preprocess
    from vitviz.models.load import load_model

    clip = load_model("demo-clip", device="cpu")
    return clip, preprocess(clip, [Image.open(STAR).convert("RGB")], (96, 96))[0]


def test_overview_explains_a_class_minus_another(demo_model, star_pixels):
    at = _app()
    no_trouble(at, "overview")
    a = at.session_state.class_index
    title, fig = _titled(at, "Relevance for")
    assert title.startswith(f"Relevance for {demo_model.id2label[a]} ({a})") and "minus" not in title
    single = _z(fig["data"][1])
    np.testing.assert_allclose(
        single, relevance_by_hand(demo_model.model, star_pixels, a, None, (12, 12)), rtol=1e-4, atol=1e-6
    )

    box = at.selectbox(key="_w_class_minus")
    assert box.value is None
    b = next(i for i in range(len(demo_model.id2label)) if i != a)
    box.set_value(b).run()
    no_trouble(at, "minus")
    title, fig = _titled(at, "Relevance for")
    assert f"{demo_model.id2label[a]} ({a}) minus {demo_model.id2label[b]} ({b})" in title
    got = _z(fig["data"][1])
    np.testing.assert_allclose(
        got, relevance_by_hand(demo_model.model, star_pixels, a, b, (12, 12)), rtol=1e-4, atol=1e-6
    )
    assert np.abs(got - single).max() > 1e-3  # the box changes what is drawn
    assert any(c.value.startswith("Explained:") and "difference" in c.value for c in at.caption)

    at.selectbox(key="_w_relevance_from").set_value(3).run()  # through the last block only
    got = _z(_titled(at, "Relevance for")[1]["data"][1])
    np.testing.assert_allclose(
        got, relevance_by_hand(demo_model.model, star_pixels, a, b, (12, 12), start=3), rtol=1e-4, atol=1e-6
    )
    at.toggle(key="_w_overview_relevance").set_value(False).run()  # off: no gradients on this page
    no_trouble(at, "off")
    assert not [t for t in _figures(at) if t.startswith("Relevance for")]


def _heatmap(fig: dict) -> np.ndarray:
    return _z(next(t for t in fig["data"] if t["type"] == "heatmap"))


def test_layers_explains_the_overviews_class_minus_another(demo_model, star_pixels):
    """One minus for the session: chosen on the Overview, Layers' relevance explains ``logit[a] - logit[b]`` too, and
    its own "…minus" box shows and changes that same value."""
    at = _app()
    a = at.session_state.class_index
    n = len(demo_model.id2label)
    b, c = [i for i in range(n) if i != a][:2]
    at.selectbox(key="_w_class_minus").set_value(b).run()
    at.switch_page("pages/layers.py").run()
    no_trouble(at, "layers")
    assert at.selectbox(key="_w_class_minus").value == b  # the Overview's choice, shown on Layers
    name = f"{demo_model.id2label[a]} ({a}) minus {demo_model.id2label[b]} ({b})"
    title, fig = _titled(at, "Relevance for")
    assert name in title
    got = _heatmap(fig)
    want = relevance_by_hand(demo_model.model, star_pixels, a, b, (12, 12))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    single = relevance_by_hand(demo_model.model, star_pixels, a, None, (12, 12))
    assert np.abs(got - single).max() > 1e-3  # not the class alone
    shown = [x.value.replace("\\", "") for x in at.caption]  # markdown escapes dropped
    assert any(f"**{name}**, the difference of the two logits (before softmax)" in x for x in shown)

    at.selectbox(key="_w_class_minus").set_value(c).run()  # changed on Layers...
    no_trouble(at, "layers, another minus")
    got = _heatmap(_titled(at, "Relevance for")[1])
    np.testing.assert_allclose(
        got, relevance_by_hand(demo_model.model, star_pixels, a, c, (12, 12)), rtol=1e-4, atol=1e-6
    )
    at.switch_page("pages/overview.py").run()  # ...is the Overview's too
    no_trouble(at, "overview")
    assert at.selectbox(key="_w_class_minus").value == c
    assert f"minus {demo_model.id2label[c]} ({c})" in _titled(at, "Relevance for")[0]

    at.selectbox(key="_w_class_minus").set_value(None).run()  # none: the class alone, on both pages
    at.switch_page("pages/layers.py").run()
    no_trouble(at, "layers, no minus")
    assert at.selectbox(key="_w_class_minus").value is None
    title, fig = _titled(at, "Relevance for")
    assert "minus" not in title
    np.testing.assert_allclose(_heatmap(fig), single, rtol=1e-4, atol=1e-6)


def test_layers_downloads_name_the_target(demo_model, star_pixels, monkeypatch):
    from streamlit.delta_generator import DeltaGenerator

    files: dict[str, object] = {}
    original = DeltaGenerator.download_button

    def record(self, label, data, file_name=None, *args, **kwargs):
        files[file_name] = data
        return original(self, label, data, file_name, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "download_button", record)
    at = _app()
    a = at.session_state.class_index
    b = next(i for i in range(len(demo_model.id2label)) if i != a)
    at.selectbox(key="_w_class_minus").set_value(b).run()
    at.switch_page("pages/layers.py").run()
    no_trouble(at, "layers")
    name = f"{demo_model.id2label[a]} ({a}) minus {demo_model.id2label[b]} ({b})"
    with np.load(io.BytesIO(files[f"relevance_{a}_minus_{b}.npz"]())) as z:
        assert str(z["target_name"]) == name and int(z["target_index"]) == a and int(z["target_minus"]) == b
        want = relevance_by_hand(demo_model.model, star_pixels, a, b, (12, 12))
        np.testing.assert_allclose(z["relevance"], want, rtol=1e-4, atol=1e-6)
    header = files[f"relevance_{a}_minus_{b}.csv"]().decode().splitlines()[0]
    assert header == f"row,col,relevance for {name} (raw)"


def test_layers_explains_a_label_minus_another_on_demo_clip():
    at, a, b = _demo_clip_pair("pages/layers.py")
    names = CLIP_NAMES
    box = at.selectbox(key="_w_class_minus")
    assert box.value is None
    box.set_value(b).run()
    no_trouble(at, "label minus label")
    title, fig = _titled(at, "Relevance for")
    assert f"label '{names[a]}' minus label '{names[b]}'" in title
    clip, pixels = _clip_star_pixels()
    prompts = [f"a photo of a {x}." for x in names]
    got = _heatmap(fig)
    np.testing.assert_allclose(got, clip_relevance_by_hand(clip, pixels, prompts, a, b, (12, 12)), rtol=1e-4, atol=1e-6)
    assert np.abs(got - clip_relevance_by_hand(clip, pixels, prompts, a, None, (12, 12))).max() > 1e-4
    assert any("difference of the two image-text scores" in x.value for x in at.caption)
    at.switch_page("pages/overview.py").run()
    assert at.selectbox(key="_w_class_minus").value == b  # the same value on the Overview
    at.text_area(key="labels_demo-clip").input("star, circle, square").run()  # new labels: the minus goes
    no_trouble(at, "new labels")
    assert at.session_state.class_minus is None and at.selectbox(key="_w_class_minus").value is None


def _tile(fig: dict, k: int, grid: tuple[int, int]) -> np.ndarray:
    z = _z(fig["data"][0])
    gh, gw = grid
    r, c = divmod(k, 4)  # Compare's tiles: four a row
    stride = gh + tile_gap(gh)
    return z[r * stride : r * stride + gh, c * (gw + 1) : c * (gw + 1) + gw]


@pytest.mark.parametrize("page, key", [("compare", "compare_target"), ("patching", "patch_target")])
def test_compare_and_patching_start_from_the_overviews_class_minus_another(demo_model, page, key):
    """The Compare and Activation patching pages' target boxes start from the session's target, "…minus" included,
    and follow it when it changes on another page; the page's own choice stays the page's."""
    at = _app()
    a = at.session_state.class_index
    b, c = [i for i in range(len(demo_model.id2label)) if i != a][:2]
    at.switch_page(f"pages/{page}.py").run()
    assert at.selectbox(key=f"{key}_minus").value is None  # no minus chosen: none here either
    at.switch_page("pages/overview.py").run()
    at.selectbox(key="_w_class_minus").set_value(b).run()
    at.switch_page(f"pages/{page}.py").run()
    no_trouble(at, page)
    assert at.selectbox(key=f"{key}_index").value == a
    assert at.selectbox(key=f"{key}_minus").value == b  # the Overview's minus
    name = f"{demo_model.id2label[a]} ({a}) minus {demo_model.id2label[b]} ({b})"
    said = [*_figures(at), *(m.value.replace("\\", "") for m in at.caption)]  # titles; captions, unescaped
    assert any(name in t for t in said)  # what the page measures or explains is named
    at.selectbox(key=f"{key}_minus").set_value(c).run()  # the page's own choice...
    assert at.selectbox(key=f"{key}_minus").value == c and at.session_state.class_minus == b  # ...is its own


def test_compare_explains_a_difference_and_scores_it(demo_model, star_pixels):
    from vitviz.evaluate.faithfulness import Perturbations
    from vitviz.methods import explain

    at = _app("pages/compare.py")
    no_trouble(at, "compare")
    a = at.session_state.class_index
    assert at.selectbox(key="compare_target_index").value == a  # starts from the session's class
    b = next(i for i in range(len(demo_model.id2label)) if i != a)
    at.selectbox(key="compare_target_minus").set_value(b).run()
    no_trouble(at, "minus")
    name = f"{demo_model.id2label[a]} ({a}) minus {demo_model.id2label[b]} ({b})"
    title, fig = _titled(at, "Every method's map for")
    assert name in title
    tiles = [t["text"].split(" [")[0] for t in fig["layout"]["annotations"]]
    want = relevance_by_hand(demo_model.model, star_pixels, a, b, (12, 12))
    np.testing.assert_allclose(_tile(fig, tiles.index("relevance"), (12, 12)), want / want.max(), rtol=1e-4, atol=1e-6)
    image = Image.open(STAR).convert("RGB")
    ig = explain(demo_model, image, "integrated_gradients", target=a).values.astype(np.float64)
    ig -= explain(demo_model, image, "integrated_gradients", target=b).values  # IG is linear in the target
    np.testing.assert_allclose(
        _tile(fig, tiles.index("integrated_gradients"), (12, 12)), ig / ig.max(), rtol=1e-3, atol=1e-5
    )
    assert any("do not explain the difference" in c.value and "rollout" in c.value for c in at.caption)

    next(btn for btn in at.button if btn.label == "Compute the curves").click().run()
    no_trouble(at, "curves")
    title, curves = _titled(at, "Deletion and insertion curves")
    assert f"probability of '{demo_model.id2label[a]}' minus that of '{demo_model.id2label[b]}'" in title
    deletion = _z(next(d for d in curves["data"] if d["name"] == "relevance"))
    with torch.no_grad():  # the first point: the model's own softmax of the unperturbed image
        p = torch.softmax(demo_model.model(pixel_values=star_pixels).logits[0].double(), 0)
    assert deletion[0] == pytest.approx(float(p[a] - p[b]), abs=1e-6)
    relevance_map = explain(demo_model, image, "relevance", target=_target(a, b))
    pert = Perturbations(demo_model, image, insertion_start="mean")
    ref_a, ref_b = pert.curves(relevance_map, target=a), pert.curves(relevance_map, target=b)
    np.testing.assert_allclose(deletion, ref_a.deletion - ref_b.deletion, atol=1e-6)
    insertion = _z([d for d in curves["data"] if d["name"] == "relevance"][1])
    np.testing.assert_allclose(insertion, ref_a.insertion - ref_b.insertion, atol=1e-6)


def _target(a: int, b: int):
    from vitviz.capture.targets import Target

    return Target.of_class(a, minus=b)


def _words(at: AppTest) -> list[tuple[str, float]]:
    """The coloured prompt tokens drawn on the page: (token, raw value from its tooltip)."""
    md = next(m.value for m in at.markdown if "<span title=" in m.value)
    return [(html.unescape(t), float(v)) for v, t in re.findall(r'<span title="([^"]+)"[^>]*>([^<]*)</span>', md)]


def test_prompt_words_have_their_own_start_block():
    from vitviz.models.load import load_model
    from vitviz.models.prompt_relevance import prompt_relevance
    from vitviz.models.zeroshot import Labels

    at = _app()
    at.selectbox(key="_w_class_minus").set_value(1 if at.session_state.class_index != 1 else 2).run()
    assert at.selectbox(key="_w_class_minus").value is not None
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    no_trouble(at, "demo-clip")
    assert at.selectbox(key="_w_class_minus").value is None  # a class of the previous model means nothing here
    box = at.selectbox(key="_w_text_relevance_from")
    assert box.value == 0 and "all text blocks" in box.format_func(0)
    top = at.session_state.class_index
    all_blocks = _words(at)

    clip = load_model("demo-clip", device="cpu")
    image = Image.open(STAR).convert("RGB")
    from vitviz.capture.forward import preprocess

    pixels = preprocess(clip, [image], (96, 96))[0]
    with torch.no_grad():
        emb = clip.model.get_image_features(pixel_values=pixels)
    emb = getattr(emb, "pooler_output", emb)[0].numpy()
    names = ("circle", "square", "triangle", "cross", "star")
    one = Labels((names[top],), (f"a photo of a {names[top]}.",), "{}")
    n = len(box.options)
    at.selectbox(key="_w_text_relevance_from").set_value(n - 1).run()  # the last text block only
    no_trouble(at, "last text block")
    last = _words(at)
    for k, shown in ((0, all_blocks), (n - 1, last)):
        want = prompt_relevance(clip.model, clip.text, emb, one, start_block=k)[0]
        assert [t for t, _ in shown] == list(want.tokens)
        np.testing.assert_allclose([v for _, v in shown], [float(f"{v:.4g}") for v in want.relevance], rtol=1e-6)
    assert not np.allclose([v for _, v in all_blocks], [v for _, v in last])
    assert any("the last block" in c.value and "Prompt words" in c.value for c in at.caption)
    assert at.selectbox(key="_w_relevance_from").value == 0  # the image side keeps its own start block
    at.switch_page("pages/layers.py").run()
    no_trouble(at, "layers")
    assert _words(at) == last  # Layers' prompt words run through the text blocks chosen on the Overview


def test_compare_explains_a_label_minus_another_on_demo_clip():
    """Zero-shot: label A's score minus label B's, relevance by hand from CLIP's own vision attentions."""
    at, a, b = _demo_clip_pair("pages/compare.py")
    names = CLIP_NAMES
    at.selectbox(key="compare_target_minus").set_value(b).run()
    no_trouble(at, "label minus label")
    title, fig = _titled(at, "Every method's map for")
    assert f"label '{names[a]}' minus label '{names[b]}'" in title
    tiles = [t["text"].split(" [")[0] for t in fig["layout"]["annotations"]]

    clip, pixels = _clip_star_pixels()
    want = clip_relevance_by_hand(clip, pixels, [f"a photo of a {n}." for n in names], a, b, (12, 12))
    np.testing.assert_allclose(_tile(fig, tiles.index("relevance"), (12, 12)), want / want.max(), rtol=1e-4, atol=1e-6)
