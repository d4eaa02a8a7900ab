"""The Compare page offers AttnLRP's CP-LRP variant (lxt's ViT recipe) beside the paper's rules, the default
(issue 32.19: the variant was reachable only from Python)."""

from __future__ import annotations

import json

from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest


def _tiles(at: AppTest) -> list[str]:
    figs = [json.loads(el.proto.spec) for el in charts(at)]
    fig = next(f for f in figs if "Every method's map" in f["layout"]["title"]["text"])
    return [a["text"].split(" [")[0] for a in fig["layout"]["annotations"]]


def test_compare_offers_cp_lrp_and_defaults_to_the_papers_rules():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("pages/compare.py").run()
    no_trouble(at)
    choice = at.radio(key="compare_attnlrp")
    assert choice.value == "attnlrp" and "default" in choice.format_func("attnlrp")
    assert "attnlrp" in _tiles(at) and "attnlrp_cp" not in _tiles(at)
    choice.set_value("attnlrp_cp").run()
    no_trouble(at)
    tiles = _tiles(at)
    assert "attnlrp_cp" in tiles and "attnlrp" not in tiles
