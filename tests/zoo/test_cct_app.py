"""AppTest: every page of the app opens on a tiny CCT folder, without an exception or an error message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_cct import save_tiny_cct

torch.set_num_threads(1)

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGES = [
    "pages/heads.py",
    "pages/layers.py",
    "pages/importance.py",
    "pages/compare.py",
    "pages/positions.py",
    "pages/embedding.py",
]


@pytest.fixture(scope="module")
def cct_dir(tmp_path_factory) -> Path:
    return save_tiny_cct(tmp_path_factory.mktemp("cct-app") / "tiny")


def _no_trouble(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _titles(at: AppTest) -> str:
    figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    return " ".join(str(f["layout"].get("title", {}).get("text", "")) for f in figs)


def test_every_page_opens_on_a_cct(cct_dir):
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
    at.text_input(key="model_text").input(str(cct_dir)).run()
    _no_trouble(at)
    assert at.session_state.model_name == str(cct_dir)
    assert "8 x 8" in _titles(at)  # the overview: the tokenizer's grid
    for page in PAGES:
        at.switch_page(page).run()
        _no_trouble(at)
        if page != "pages/importance.py":  # head importance is computed on request (below)
            assert len(at.get("plotly_chart")) >= 1, page
    at.switch_page("pages/importance.py").run()
    assert any("2 of 3" in c.value for c in at.caption)  # the pooling has no heads to knock out: said once
    buttons = [b for b in at.button if b.label == "Compute head importance"]
    assert buttons  # the two attention blocks' heads are offered
    buttons[0].click().run()
    _no_trouble(at)
    assert len(at.get("plotly_chart")) >= 1
    at.switch_page("pages/heads.py").run()
    assert "Pooling head" in _titles(at)  # the last block shown is the sequence pooling, one map
    at.switch_page("pages/layers.py").run()
    titles = _titles(at)
    assert "Rollout of" in titles and "Relevance for" in titles
