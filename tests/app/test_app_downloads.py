"""AppTest of the files the pages offer (issue 22 items 1 and 2): every CSV has a header row naming each column
with its unit and holds every plotted series; downloads start no rerun."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from app_tools import APP, no_trouble
from streamlit.delta_generator import DeltaGenerator
from streamlit.testing.v1 import AppTest


@pytest.fixture
def offered(monkeypatch):
    """Every download button drawn: file name -> (its data callable or bytes, its on_click)."""
    files: dict[str, tuple] = {}
    original = DeltaGenerator.download_button

    def record(self, label, data, file_name=None, mime=None, *args, **kwargs):
        files[file_name] = (data, kwargs.get("on_click", "rerun"))
        return original(self, label, data, file_name, mime, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "download_button", record)
    return files


def _rows(data) -> list[list[str]]:
    data = data() if callable(data) else data
    return list(csv.reader(io.StringIO(data.decode())))


def _app(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["instant_heads"] = False  # the Heads page server-drawn (its instant view draws no figures)
    at.run()
    at.switch_page(page).run()
    no_trouble(at)
    return at


def test_heads_and_layers_csvs_have_headers_and_every_head(offered):
    at = _app("pages/heads.py")
    name = next(n for n in offered if n.endswith(".csv") and n.startswith("block"))
    rows = _rows(offered[name][0])
    assert rows[0][:3] == ["head", "row", "col"] and rows[0][3].startswith("attention weight (raw, ")
    assert len(rows) == 1 + 4 * 12 * 12  # the demo's 4 heads on its 12 x 12 grid: all shown in the grid
    assert {r[0] for r in rows[1:]} == {"0", "1", "2", "3"}
    assert all(on_click == "ignore" for _, on_click in offered.values())  # no rerun: a second click starts too

    offered.clear()
    at.switch_page("pages/layers.py").run()
    no_trouble(at)
    csvs = {n: _rows(d) for n, (d, _) in offered.items() if n.endswith(".csv")}
    assert set(csvs) >= {"rollout.csv", "summaries.csv", "logit_lens.csv"}
    for name, rows in csvs.items():
        assert not any(_number(c) for c in rows[0]), (name, rows[0])  # a header, not data
        assert len({len(r) for r in rows}) == 1, name
    summaries = csvs["summaries.csv"]
    assert summaries[0] == [
        "block",
        "head",
        "mean attention distance (px)",
        "attention entropy (nats)",
        "entropy / log(keys allowed)",
    ]
    assert csvs["logit_lens.csv"][0][0] == "residual stream"
    assert [r[0] for r in csvs["logit_lens.csv"][1:3]] == ["embeddings", "after block 0"]
    assert sum(c.startswith("probability of") for c in csvs["logit_lens.csv"][0]) == 5


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_compare_curves_csv_holds_every_methods_curves(offered):
    at = _app("pages/compare.py")
    next(b for b in at.button if b.label == "Compute the curves").click().run()
    no_trouble(at)
    assert not [b for b in at.button if b.label == "Stop"]  # 22.14: Stop goes once the curves are done
    rows = _rows(offered["faithfulness.csv"][0])
    header = rows[0]
    assert header[0] == "fraction of patches"
    methods = [r["method"] for r in at.dataframe[0].value.to_dict("records")]
    for m in methods:
        assert any(h.startswith(f"{m} deletion (probability of '") for h in header), (m, header)
        assert any(h.startswith(f"{m} insertion (probability of '") for h in header), (m, header)
    values = np.array(rows[1:], dtype=float)
    assert values.shape == (21, 1 + 2 * len(methods))
    assert values[0, 0] == 0 and values[-1, 0] == 1 and (np.diff(values[:, 0]) >= 0).all()
    assert ((values[:, 1:] >= 0) & (values[:, 1:] <= 1)).all()  # probabilities


def test_importance_csv_and_no_stop_once_done(offered):
    at = _app("pages/importance.py")
    next(b for b in at.button if b.label == "Compute head importance").click().run()
    no_trouble(at)
    assert not [b for b in at.button if b.label == "Stop"]  # 22.14
    rows = _rows(offered["head_importance.csv"][0])
    assert rows[0][:2] == ["block", "head"] and rows[0][2].startswith("change of the logit of '")
    assert len(rows) == 1 + 4 * 4  # the demo's 4 blocks x 4 heads


def test_side_by_side_and_patching_csvs_hold_every_plotted_series(offered):
    """Issue 32.3: Side by side wrote ``row,col,a`` (pane B and the difference missing); Activation patching wrote
    ``row,col,residual`` (the head grid missing, and "row, col" were block and token)."""
    at = _app("pages/side_by_side.py")
    at.radio(key="sbs_differs").set_value("images").run()  # the flipped copy: one grid, a difference panel
    no_trouble(at)
    rows = _rows(offered["side_by_side.csv"][0])
    head = rows[0]
    assert head[:2] == ["row", "col"] and len(head) == 5
    assert head[2].startswith("A: ") and head[3].startswith("B: ") and head[4].startswith("A - B")
    assert all("(" in h for h in head[2:])  # each with its unit
    values = np.array([[float(v) for v in r[2:]] for r in rows[1:]])
    np.testing.assert_allclose(values[:, 0] - values[:, 1], values[:, 2], atol=2e-6)

    offered.clear()
    at.switch_page("pages/patching.py").run()
    no_trouble(at)
    name = next(n for n in offered if n.startswith("patching_") and n.endswith(".csv"))
    rows = _rows(offered[name][0])
    head = rows[0]
    assert head[:4] == ["grid", "block", "token or head", "position"], head
    assert any(h.startswith("patched score") for h in head) and any(h.startswith("patched - clean") for h in head)
    grids = {r[0] for r in rows[1:]}
    assert grids == {"residual (block x token)", "heads (block x head)"}
    positions = [r[3] for r in rows[1:] if r[0].startswith("residual")]
    assert positions[:2] == ["CLS", "p0"]  # the demo: CLS, then its patches p0..
    assert sum(r[0].startswith("heads") for r in rows[1:]) == 4 * 4  # the demo's 4 blocks x 4 heads
