"""AppTest of what a session remembers (issue 22 items 6 and 7): a new image explains its own class unless one
is pinned; state that belongs to a model goes with it."""

from __future__ import annotations

import pytest
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from vitviz.capture.forward import capture
from vitviz.data.images import load_image

EXAMPLES = "assets/examples"


def _app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["instant_heads"] = False  # the Heads page server-drawn (its instant view draws no figures)
    at.run()
    if page:
        at.switch_page(page)
        at.run()
    return at


@pytest.fixture(scope="module")
def top1(demo_model):
    """The demo model's most probable class of an example image, from vitviz directly."""
    from pathlib import Path

    root = Path(APP).parent / EXAMPLES
    return lambda name: capture(demo_model, load_image(root / name)).predictions[0].index


def test_a_new_image_explains_its_own_top_class_unless_one_is_pinned(top1):
    at = _app()
    assert at.session_state.image_name == "demo-star.png"
    other = next(c for c in range(5) if c not in {top1("demo-star.png"), top1("demo-circle.png")})
    at.selectbox(key="_w_class_index").set_value(other).run()
    assert at.session_state.class_index == other
    at.selectbox(key="example_pick").set_value("demo-circle.png").run()
    no_trouble(at)
    assert at.session_state.image_name == "demo-circle.png"
    assert at.session_state.class_index == top1("demo-circle.png")
    assert at.selectbox(key="_w_class_index").value == top1("demo-circle.png")

    at.selectbox(key="_w_class_index").set_value(other).run()
    at.checkbox(key="_w_class_pinned").check().run()
    at.selectbox(key="example_pick").set_value("demo-star.png").run()
    no_trouble(at)
    assert at.session_state.image_name == "demo-star.png"
    assert at.session_state.class_index == other  # pinned: kept


def test_state_of_a_model_goes_back_to_its_default_when_the_model_changes():
    at = _app("pages/layers.py")
    at.slider(key="_w_rollout_range").set_value((1, 2)).run()
    assert tuple(at.session_state.rollout_range) == (1, 2)
    at.switch_page("pages/heads.py").run()
    at.multiselect(key="_w_knockout").select((0, 1)).run()
    assert [tuple(p) for p in at.session_state.knockout] == [(0, 1)]

    at.selectbox(key="model_pick").set_value("demo-swin").run()
    no_trouble(at)
    assert at.session_state.model_name == "demo-swin"
    assert list(at.session_state.knockout) == []
    at.switch_page("pages/layers.py").run()
    no_trouble(at)
    num_blocks = at.session_state.layer + 1  # the last block, after a model change
    assert tuple(at.session_state.rollout_range) == (0, num_blocks - 1)


def _in_collapsed_box(at: AppTest, text: str) -> bool:
    """Whether an error holding ``text`` sits inside a status box or expander of the sidebar."""
    boxes = [*at.sidebar.status, *at.sidebar.expander] if hasattr(at.sidebar, "status") else [*at.sidebar.expander]
    return any(text in e.value for box in boxes for e in box.error)


def test_why_a_model_failed_to_load_is_shown_in_the_open(tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    at = _app()
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    at.text_input(key="model_text").input(str(empty)).run()
    assert not at.exception
    assert at.session_state.model_name == "demo"
    shown = [e.value for e in at.sidebar.error]
    assert any("Still using demo" in e for e in shown), shown
    assert not _in_collapsed_box(at, "Still using demo")


def test_the_demo_models_say_they_classify_synthetic_shapes():
    at = _app()
    notes = " ".join(c.value for c in at.sidebar.caption)
    assert "synthetic shapes" in notes and "photo" in notes
    at.selectbox(key="model_pick").set_value("demo-swin").run()
    assert "demo Swin was trained on synthetic shapes" in " ".join(c.value for c in at.sidebar.caption)
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    assert "synthetic shapes" in " ".join(c.value for c in at.sidebar.caption)  # still demo-swin until another loads


def test_the_swin_logit_lens_says_which_points_it_draws():
    """22.14: the note promised rows the figure did not have; it now lists the points drawn, as the figure has them."""
    import json

    at = _app()
    at.selectbox(key="model_pick").set_value("demo-swin").run()
    at.switch_page("pages/layers.py").run()
    no_trouble(at)
    lens = next(
        json.loads(el.proto.spec)
        for el in charts(at)
        if "Logit lens" in str(json.loads(el.proto.spec)["layout"].get("title", {}).get("text", ""))
    )
    trace = lens["data"][0]
    import numpy as np

    ys = trace["y"]
    if isinstance(ys, dict):
        import base64

        ys = np.frombuffer(base64.b64decode(ys["bdata"]), dtype=ys["dtype"])
    drawn = [int(x) for x, y in zip(range(len(ys)), np.asarray(ys, float), strict=True) if np.isfinite(y)]
    caption = next(c.value for c in at.caption if "Points drawn" in c.value)
    names = [trace["customdata"][i] for i in drawn]  # each row's name, as the hover shows it
    assert names and all(n.startswith("after stage ") for n in names), names
    assert f"Points drawn: {', '.join(names)};" in caption
