"""AppTest: every page of the app opens on a tiny CCT folder, without an exception or an error message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_tools import PAGES, charts, no_trouble, open_folder
from streamlit.testing.v1 import AppTest
from test_cct import save_tiny_cct

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cct_dir(tmp_path_factory) -> Path:
    return save_tiny_cct(tmp_path_factory.mktemp("cct-app") / "tiny")


def _titles(at: AppTest) -> str:
    figs = [json.loads(el.proto.spec) for el in charts(at)]
    return " ".join(str(f["layout"].get("title", {}).get("text", "")) for f in figs)


def test_every_page_opens_on_a_cct(cct_dir):
    at = open_folder(cct_dir)
    no_trouble(at)
    assert at.session_state.model_name == str(cct_dir)
    assert "8 x 8" in _titles(at)  # the overview: the tokenizer's grid
    for page in PAGES[1:]:  # the overview is open
        at.switch_page(page).run()
        no_trouble(at)
        if page not in ("pages/importance.py", "pages/dataset.py"):  # on request / needs a results file
            assert len(charts(at)) >= 1, page
    at.switch_page("pages/importance.py").run()
    assert any("2 of 3" in c.value for c in at.caption)  # the pooling has no heads to knock out: said once
    buttons = [b for b in at.button if b.label == "Compute head importance"]
    assert buttons  # the two attention blocks' heads are offered
    buttons[0].click().run()
    no_trouble(at)
    assert len(charts(at)) >= 1
    at.switch_page("pages/heads.py").run()
    assert "Pooling head" in _titles(at)  # the last block shown is the sequence pooling, one map
    at.switch_page("pages/layers.py").run()
    titles = _titles(at)
    assert "Rollout of" in titles and "Relevance for" in titles
