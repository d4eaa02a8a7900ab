"""AppTest: every page of the app opens on a tiny converted hybrid ViT, and the Overview says what its tokens are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_tools import PAGES, charts, no_trouble, open_folder
from streamlit.testing.v1 import AppTest
from test_hybrid import save_tiny_hybrid

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory) -> Path:
    return save_tiny_hybrid(tmp_path_factory.mktemp("hybrid-app") / "tiny")


def _titles(at: AppTest) -> str:
    figs = [json.loads(el.proto.spec) for el in charts(at)]
    return " ".join(str(f["layout"].get("title", {}).get("text", "")) for f in figs)


def test_every_page_opens_on_a_hybrid(hybrid_dir):
    at = open_folder(hybrid_dir)
    no_trouble(at)
    assert at.session_state.model_name == str(hybrid_dir)
    captions = " ".join(c.value for c in at.caption)
    assert "Hybrid ViT" in captions and "not pixel patches" in captions and "receptive field" in captions
    for page in PAGES[1:]:  # the overview is open
        at.switch_page(page).run()
        no_trouble(at, page)
        # head importance on request, the data set with a results file, the heads in the browser (instant view)
        if page not in ("pages/importance.py", "pages/dataset.py", "pages/heads.py"):
            assert len(charts(at)) >= 1, page
    at.switch_page("pages/positions.py").run()
    assert any("4 x 4 grid (feature-map cells" in c.value for c in at.caption)
    at.switch_page("pages/importance.py").run()
    buttons = [b for b in at.button if b.label == "Compute head importance"]
    assert buttons
    buttons[0].click().run()
    no_trouble(at)
    assert len(charts(at)) >= 1
    at.switch_page("pages/layers.py").run()
    titles = _titles(at)
    assert "Rollout of" in titles and "Relevance for" in titles
    for page in ("pages/patching.py", "pages/side_by_side.py"):  # pages beyond the navigation's main ones
        at.switch_page(page).run()
        no_trouble(at, page)
