"""``benchmarks.side_by_side`` drives the Side by side page through today's widget keys and session state
(sbs_model, sbs_view, sbs_point): one round runs without an exception or an error on any page it times, and the
synced click it times does move both panes' query. Timings are printed by the benchmark, never asserted."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_round_of_the_side_by_side_benchmark():
    from benchmarks.side_by_side import side_by_side

    got = side_by_side(runs=1)
    assert got["models"] == ["demo", "demo-swin"]
    for key in ("sbs_rerun_over_one_pane", "sbs_click_over_one_pane_rerun", "sbs_first_over_one_pane"):
        assert math.isfinite(got[key]) and got[key] > 0
    titles = [t.replace("<br>", " ") for t in got["last_titles"]]  # long titles are wrapped
    assert titles[0].startswith("A. demo:") and titles[1].startswith("B. demo-swin:")
    assert "where patch (" in titles[0] and "where token (" in titles[1]  # the click's query in both panes
