"""AppTest of issue 22 item 14: a page that uses labels lets you edit them; the page and the sidebar stay in step."""

from __future__ import annotations

import json

from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in charts(at)]


def _predicted_labels(at: AppTest) -> set[str]:
    """The labels on the Overview page's predictions chart (y: "label (p %)")."""
    fig = next(f for f in _figures(at) if str(f["layout"].get("title", {}).get("text", "")).startswith("Top"))
    return {y.split(" (")[0] for y in fig["data"][0]["y"]}


def test_labels_edited_on_a_page_are_the_sidebars_and_rank_there():
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    assert not [t for t in at.text_area if t.key == "labels_overview"]  # a classifier: no labels box
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    no_trouble(at, "demo-clip")
    assert at.text_area(key="labels_overview").value == at.text_area(key="labels_demo-clip").value

    at.text_area(key="labels_overview").input("circle, star, square").run()  # edited on the Overview page
    no_trouble(at, "overview edit")
    assert _predicted_labels(at) == {"circle", "star", "square"}
    assert at.text_area(key="labels_demo-clip").value == "circle, star, square"  # the sidebar shows the same
    assert at.session_state.labels_text == "circle, star, square"
    at.text_input(key="template_overview").input("a {} shape.").run()
    assert at.text_input(key="template_demo-clip").value == "a {} shape."
    assert at.session_state.template == "a {} shape."

    at.switch_page("pages/compare.py").run()
    no_trouble(at, "compare")
    assert at.text_area(key="labels_compare").value == "circle, star, square"
    at.text_area(key="labels_compare").input("cross, triangle").run()  # edited on the Compare page
    no_trouble(at, "compare edit")
    index = at.selectbox(key="compare_target_index")
    assert sorted(index.options) == ["cross", "triangle"]
    assert at.text_area(key="labels_demo-clip").value == "cross, triangle"
    explained = next(c.value for c in at.caption if c.value.startswith("Explained:"))
    assert "label" in explained and ("cross" in explained or "triangle" in explained), explained

    at.switch_page("pages/patching.py").run()
    no_trouble(at, "patching")
    assert at.text_area(key="labels_patching").value == "cross, triangle"
    at.text_area(key="labels_patching").input("star, circle, cross").run()
    no_trouble(at, "patching edit")
    index = at.selectbox(key="patch_target_index")
    assert sorted(index.options) == ["circle", "cross", "star"]
    assert at.text_area(key="labels_demo-clip").value == "star, circle, cross"

    at.text_area(key="labels_demo-clip").input("square, star").run()  # and the sidebar's edit reaches the page
    no_trouble(at, "sidebar edit")
    assert at.text_area(key="labels_patching").value == "square, star"
    at.switch_page("pages/overview.py").run()
    assert at.text_area(key="labels_overview").value == "square, star"
    assert _predicted_labels(at) == {"square", "star"}
