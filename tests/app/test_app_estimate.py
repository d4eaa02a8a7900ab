"""AppTest of Head importance: the fast estimate says it is one, how far it agrees, and exact is one click away."""

from __future__ import annotations

import json

from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from vitviz.evaluate.head_estimate import MEASURED


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in charts(at)]


def _importance(at: AppTest) -> dict | None:
    return next((f for f in _figures(at) if "click a cell to open" in f["layout"]["title"]["text"]), None)


def test_estimate_is_labelled_with_its_measured_agreement_and_exact_is_one_click():
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/importance.py")
    at.run()
    at.radio(key="importance_method").set_value("fast estimate (first order)").run()
    next(b for b in at.button if b.label == "Compute head importance").click().run()
    no_trouble(at)
    fig = _importance(at)
    heat = fig["data"][0]
    assert "estimate" in fig["layout"]["title"]["text"] and "not exact" in fig["layout"]["title"]["text"]
    assert heat["colorbar"]["title"]["text"] == "estimated change of the logit"
    assert "estimate %{z" in heat["hovertemplate"]
    mode = at.session_state.knockout_mode
    warning = " ".join(w.value for w in at.warning)
    assert "These are estimates" in warning and f"median {MEASURED[mode]['rho_median']:.2f}" in warning
    next(b for b in at.button if b.label == "Compute the exact effects").click().run()
    no_trouble(at)
    assert at.radio(key="importance_method").value == "exact (one knock-out per head)"
    fig = _importance(at)
    assert fig["layout"]["title"]["text"].startswith("Effect of knocking out each head")
    assert "estimate" not in fig["data"][0]["hovertemplate"] and not any("estimates" in w.value for w in at.warning)
