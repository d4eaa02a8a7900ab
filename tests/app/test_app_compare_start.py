"""AppTest of Compare explanations: the insertion start is a choice, and it is what the curves start from."""

from __future__ import annotations

import io

import numpy as np
from app_tools import APP, no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest

from vitviz.evaluate.faithfulness import Perturbations
from vitviz.methods import explain
from vitviz.models.load import load_model


def _areas(at: AppTest) -> dict[str, float]:
    table = at.dataframe[0].value
    return dict(zip(table["method"], table["insertion area (higher is better)"], strict=True))


def test_insertion_start_choice_changes_the_curves_as_the_engine_does():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("pages/compare.py")
    at.run()
    assert at.radio(key="insertion_start").value == "mean"  # the default: docs/evaluate.md#insertion-starts
    at.radio(key="insertion_start").set_value("grey").run()
    assert any("puts them back into a fixed grey" in c.value for c in at.caption)
    next(b for b in at.button if b.label == "Compute the curves").click().run()
    no_trouble(at)
    grey = _areas(at)
    # the random map's insertion area is the engine's, from the same start (the random map is seeded)
    image = Image.open(io.BytesIO(at.session_state.image_bytes))  # the page's image
    demo = load_model("demo", device="cpu")
    cls = int(np.argmax(Perturbations(demo, image).original_probabilities))
    rnd = explain(demo, image, "random", target=cls)
    want = Perturbations(demo, image, insertion_start="grey").curves(rnd).insertion_area
    assert abs(grey["random"] - want) < 1e-4
    at.radio(key="insertion_start").set_value("blur").run()
    next(b for b in at.button if b.label == "Compute the curves").click().run()
    no_trouble(at)
    assert _areas(at) != grey
