"""Side by side: the rules that keep two panes in step (vitviz.compare) and the page (AppTest)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from app_tools import APP, charts, no_trouble
from conftest import random_image
from streamlit.testing.v1 import AppTest

from vitviz.analysis.blocks import head_maps
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture
from vitviz.compare import depth_match, difference, pane_map, point_of, token_of
from vitviz.models.load import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_depth_match_by_relative_depth():
    assert [depth_match(b, 12, 6) for b in (0, 5, 6, 11)] == [0, 2, 3, 5]  # round(b * 5 / 11)
    assert depth_match(3, 4, 4) == 3 and depth_match(7, 1, 4) == 0 and depth_match(2, 4, 1) == 0


def test_difference_only_on_one_grid():
    a, b = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    assert np.array_equal(difference(a, b), a - 1)
    assert difference(a, np.ones((3, 2))) is None


@pytest.fixture(scope="module")
def deit_dino(tiny_dirs):
    image = random_image(3, (40, 48))
    return [capture(load_model(str(tiny_dirs[k]), device="cpu"), image) for k in ("deit", "dino")]


def test_a_point_is_the_same_place_on_any_grid(deit_dino):
    deit, _ = deit_dino
    demo = capture(load_model("demo", device="cpu"), random_image(1, (50, 60)))
    swin = capture(load_model("demo-swin", device="cpu"), random_image(1, (50, 60)))
    gh, gw = demo.grid
    r, c = 7, 2
    point = point_of(demo, 0, demo.num_prefix_tokens + r * gw + c)
    assert point == pytest.approx(((c + 0.5) / gw, (r + 0.5) / gh))
    for stage in range(len(swin.stages)):
        sh, sw = swin.stages[stage].grid
        token = token_of(swin, stage, point)
        row, col = divmod(token - swin.stages[stage].num_prefix, sw)
        assert (row, col) == (int(point[1] * sh), int(point[0] * sw))  # the cell holding that point, by hand
    assert token_of(deit, 0, None) == 0  # no click: CLS
    assert point_of(deit, 0, 1) is None  # DIST is not on the image


def test_pane_maps_are_the_records_own_maps(deit_dino):
    for cap in deit_dino:
        point = (0.6, 0.3)
        token = token_of(cap, 0, point)
        maps = head_maps(cap.blocks[1], token).values
        head = pane_map(cap, "head", block=1, head=1, point=point)
        assert np.allclose(head.values, maps[1]) and "patch (" in head.title
        assert np.allclose(pane_map(cap, "mean", block=1, point=point).values, maps.mean(axis=0), atol=1e-6)
        roll = pane_map(cap, "rollout", block=0)
        row, _ = capture_rollout(cap)
        assert np.allclose(roll.values, row[cap.num_prefix_tokens :].reshape(cap.grid))
    with pytest.raises(ValueError, match="unknown view"):
        pane_map(deit_dino[0], "gradcam", block=0)


def _z(at: AppTest, title: str) -> np.ndarray:
    """The heatmap of the chart whose title starts with ``title``."""
    for el in charts(at):
        spec = json.loads(el.proto.spec)
        if spec.get("layout", {}).get("title", {}).get("text", "").startswith(title):
            return _decode(next(t["z"] for t in spec["data"] if t["type"] == "heatmap"))
    raise AssertionError(f"no chart titled {title!r}")


def _decode(z) -> np.ndarray:
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")]).astype(float)
    return np.array(z, dtype=float)


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("pages/side_by_side.py").run()
    no_trouble(at)
    return at


def _titles(at: AppTest) -> list[str]:
    """The charts' titles as text (a pane's title wraps to its width: its line breaks read as spaces)."""
    return [json.loads(el.proto.spec)["layout"]["title"]["text"].replace("<br>", " ") for el in charts(at)]


def test_two_models_step_together_and_get_no_difference_on_different_grids():
    at = _page()
    at.selectbox(key="sbs_model").set_value("demo-swin").run()
    no_trouble(at)
    titles = _titles(at)
    assert titles[0].startswith("A. demo:") and titles[1].startswith("B. demo-swin:")
    assert any("No difference panel" in c.value for c in at.caption)
    at.session_state["sbs_point"] = (0.3, 0.6)  # what a click on either map stores
    at.run()
    no_trouble(at)
    a, b = _titles(at)[:2]
    assert "where patch (7, 3) looks" in a  # 12 x 12: row int(0.6 * 12), col int(0.3 * 12)
    assert "where token (" in b


def test_an_image_and_its_flipped_copy_get_a_difference_panel():
    at = _page()
    at.radio(key="sbs_differs").set_value("images").run()
    at.radio(key="sbs_view").set_value("rollout").run()
    no_trouble(at)
    a, b, d = _z(at, "A."), _z(at, "B."), _z(at, "A minus B")
    assert np.allclose(d, a - b, atol=1e-6)
    assert not np.allclose(a, b)


def test_two_labels_on_demo_clip():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    at.text_area(key="labels_demo-clip").input("circle, star, square").run()
    at.switch_page("pages/side_by_side.py").run()
    at.radio(key="sbs_differs").set_value("labels").run()
    at.radio(key="sbs_view").set_value("relevance").run()
    at.selectbox(key="sbs_label_a").set_value(0).run()
    at.selectbox(key="sbs_label_b").set_value(1).run()
    no_trouble(at)
    a, b = _titles(at)[:2]
    assert "relevance for label 'circle'" in a and "relevance for label 'star'" in b
    assert np.allclose(_z(at, "A minus B"), _z(at, "A.") - _z(at, "B."), atol=1e-6)


def test_relevance_explains_the_sessions_target_in_both_panes_of_one_model():
    """Two images, one model, or two models with the same classes: both panes explain the session's class minus its
    "…minus" (not each pane's top-1), against a reference written by hand; a model with other classes (zero-shot
    labels) in pane B explains its own top-1."""
    from PIL import Image
    from target_reference import relevance_by_hand

    from vitviz.capture.forward import preprocess
    from vitviz.models.load import load_model

    demo = load_model("demo")
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    a = at.session_state.class_index
    names = demo.id2label
    b, c = [i for i in range(len(names)) if i != a][:2]
    at.selectbox(key="_w_class_index").set_value(b).run()  # pinned: not the image's top-1
    at.selectbox(key="_w_class_minus").set_value(c).run()
    at.switch_page("pages/side_by_side.py").run()
    at.radio(key="sbs_differs").set_value("images").run()
    at.radio(key="sbs_view").set_value("relevance").run()
    no_trouble(at)
    want = f"relevance for {names[b]} ({b}) minus {names[c]} ({c})"
    ta, tb = _titles(at)[:2]
    assert want in ta and want in tb, (ta, tb)
    image = Image.open(io.BytesIO(at.session_state.image_bytes)).convert("RGB")
    pixels = preprocess(demo, [image], (96, 96))[0]
    np.testing.assert_allclose(
        _z(at, "A."), relevance_by_hand(demo.model, pixels, b, c, (12, 12)), rtol=1e-4, atol=1e-6
    )
    at.radio(key="sbs_differs").set_value("models").run()
    at.selectbox(key="sbs_model").set_value("demo-swin").run()  # another model, the same five classes in order
    no_trouble(at)
    ta, tb = _titles(at)[:2]
    assert want in ta and want in tb, (ta, tb)
    at.selectbox(key="sbs_model").set_value("demo-clip").run()  # zero-shot: its labels are not the classes
    no_trouble(at)
    ta, tb = _titles(at)[:2]
    assert want in ta and " minus " not in tb  # its own top-1


def test_pane_b_of_a_model_with_other_classes_has_a_target_box_of_its_own():
    """demo in pane A, demo-clip (labels, not classes) in pane B: pane B's box starts from its top-1 label, a label
    minus another chosen there is what pane B explains (hand reference), pane A keeps the session's class, and the
    choice is forgotten when pane B's model changes."""
    from PIL import Image
    from target_reference import clip_relevance_by_hand

    from vitviz.capture.forward import preprocess

    at = _page()
    at.radio(key="sbs_view").set_value("relevance").run()
    at.selectbox(key="sbs_model").set_value("demo-clip").run()
    no_trouble(at)
    box = at.selectbox(key="sbs_b_target_index")
    names = ("circle", "square", "triangle", "cross", "star")  # demo-clip's suggested labels
    top = box.value
    assert at.selectbox(key="sbs_b_target_minus").value is None
    assert f"relevance for label '{names[top]}'" in _titles(at)[1]
    c, d = [i for i in range(len(names)) if i != top][:2]
    box.set_value(c).run()
    at.selectbox(key="sbs_b_target_minus").set_value(d).run()
    no_trouble(at)
    ta, tb = _titles(at)[:2]
    assert f"relevance for label '{names[c]}' minus label '{names[d]}'" in tb, tb
    assert f"({at.session_state.class_index})" in ta  # pane A: the session's class, untouched
    clip = load_model("demo-clip", device="cpu")
    image = Image.open(io.BytesIO(at.session_state.image_bytes)).convert("RGB")
    pixels = preprocess(clip, [image], (96, 96))[0]
    prompts = [f"a photo of a {x}." for x in names]
    np.testing.assert_allclose(
        _z(at, "B."), clip_relevance_by_hand(clip, pixels, prompts, c, d, (12, 12)), rtol=1e-4, atol=1e-6
    )
    at.selectbox(key="sbs_model").set_value("demo-swin").run()  # the same classes as pane A: no box of its own
    assert not [b for b in at.selectbox if b.key == "sbs_b_target_index"]
    at.selectbox(key="sbs_model").set_value("demo-clip").run()
    no_trouble(at)
    assert at.selectbox(key="sbs_b_target_index").value == top  # forgotten: from its top-1 again
    assert at.selectbox(key="sbs_b_target_minus").value is None


# -- issue 33: pane B's image and model cost what the sidebar's do -------------------------------------------------


def _images_page(image: bytes | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    if image is not None:  # the session's image, as an upload leaves it
        from ui.common import digest

        at.session_state["image_bytes"], at.session_state["image_name"] = image, "big.png"
        at.session_state["image_digest"], at.session_state["image_wh"] = digest(image), (300, 200)
    at.run()
    at.switch_page("pages/side_by_side.py").run()
    at.radio(key="sbs_differs").set_value("images").run()
    return at


def test_the_flipped_copy_is_made_once_per_image_inside_the_decode_budget(monkeypatch):
    """Issue 33.3: the flipped copy was decoded, mirrored and encoded outside the decode budget on every rerun (two
    sessions with a 6300 x 6300 PNG took the server from 0.4 to 3.0 GB)."""
    from PIL import Image, ImageOps

    from ui import common
    from vitviz.data import images

    common.flipped_cache.clear()
    held = []
    real = ImageOps.mirror
    monkeypatch.setattr(ImageOps, "mirror", lambda img: held.append(images.DECODE_BUDGET.used) or real(img))
    buf = io.BytesIO()
    random_image(3, (300, 200)).save(buf, format="PNG")
    at = _images_page(buf.getvalue())
    no_trouble(at)
    for _ in range(2):  # reruns (a slider moved) and a second visitor with the same image
        at.run()
    other = _images_page(buf.getvalue())
    no_trouble(other)
    assert len(held) == 1, held  # once for the server, not once per rerun or session
    assert held[0] >= images.decode_cost((300, 200), "RGB") + 300 * 200 * images.MIRROR_BYTES_PER_PIXEL
    a, b = _z(other, "A."), _z(other, "B.")  # pane B shows the mirror image: its own forward of it
    assert a.shape == b.shape and not np.allclose(a, b)
    flipped = Image.open(io.BytesIO(common.flipped_image(buf.getvalue(), common.digest(buf.getvalue()))[0]))
    assert np.array_equal(np.asarray(flipped), np.asarray(Image.open(buf).convert("RGB"))[:, ::-1])
