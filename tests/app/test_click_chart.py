"""The clickable maps (ui/click_chart.py): one element across reruns, the figure as built, every click counted.

What the browser does with them (quick clicks, the last one wins) is in tests/app/test_browser_pages.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from ui import click_chart


def _heads() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["instant_heads"] = False
    at.run()
    at.switch_page("pages/heads.py").run()
    no_trouble(at)
    return at


def _chart(at: AppTest, key: str):
    return next(c for c in charts(at) if c.key == key)


def _click(at: AppTest, key: str, customdata: list, click: str) -> None:
    at.session_state[key] = {"selection": {"points": [{"customdata": customdata, "click": click}]}}
    at.run()
    no_trouble(at)


def test_a_click_redraws_the_map_in_the_same_element_and_sends_the_figure_as_built():
    at = _heads()
    before = _chart(at, "head_map")
    assert before.type == "click_chart"  # the custom component, not st.plotly_chart
    # customdata of a map cell: token, row, col, value, x, y (the demo: 12 x 12 patches of 8 px)
    _click(at, "head_map", [1 + 3 * 12 + 7, 3, 7, 0.0, 7.5 * 8, 3.5 * 8], "1")
    after = _chart(at, "head_map")
    assert json.loads(after.spec)["layout"]["title"]["text"] == "Block 3, head 0: where patch (3, 7) looks"
    assert after.spec != before.spec and after.id == before.id  # st.plotly_chart's id changes with the figure
    config = json.loads(after.config)
    assert config["doubleClickDelay"] == 60 and config["displaylogo"] is False
    assert config["toImageButtonOptions"]["format"] == "png"  # the modebar's camera button, at the photo's size
    data = json.loads(after.element.proto.json)[0]
    assert data["plotly"] == f"/component/ui.click_chart.plotly_js/{click_chart.PLOTLY_JS}"
    assert (click_chart.PLOTLY_DIR / click_chart.PLOTLY_JS).stat().st_size > 1_000_000  # plotly.js, not a stub


def test_a_second_click_on_the_same_cell_counts():
    """A click is told apart by its click id: after the query box moved on, clicking the cell again brings it back
    (the query used to stay: the same customdata read as the click already applied)."""
    at = _heads()
    cell = [1 + 5 * 12 + 2, 5, 2, 0.0, 2.5 * 8, 5.5 * 8]
    _click(at, "head_map", cell, "1")
    assert at.session_state.query == 1 + 5 * 12 + 2
    at.selectbox(key=f"query_pick_0_{1 + 5 * 12 + 2}").set_value(0).run()  # back to CLS in the box
    assert at.session_state.query == 0
    _click(at, "head_map", cell, "2")
    assert at.session_state.query == 1 + 5 * 12 + 2
    at.run()  # a rerun without a click keeps the query
    assert at.session_state.query == 1 + 5 * 12 + 2


def test_a_click_on_a_head_tile_opens_that_head():
    at = _heads()
    _click(at, "head_grid", [2], "1")
    assert at.session_state.head == 2
    assert "head 2" in json.loads(_chart(at, "head_map").spec)["layout"]["title"]["text"]


NO_PANDAS = """
import sys
from streamlit.testing.v1 import AppTest

at = AppTest.from_string('''
import sys
import plotly.graph_objects as go
import streamlit as st
from ui import click_chart
click_chart.clickable_chart(go.Figure(go.Heatmap(z=[[1, 2]], customdata=[[[0], [1]]])), key="m")
st.session_state["pandas"] = "pandas" in sys.modules
''')
at.run()
assert not at.exception, at.exception
print("pandas imported:", at.session_state["pandas"])
"""


def test_drawing_a_clickable_chart_imports_no_pandas():
    """Streamlit looks through a dict handed to a component for data frames, importing pandas in the script's
    thread; another session's plotly then met a half-imported pandas (an AttributeError in the load test)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", NO_PANDAS],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "pandas imported: False" in out.stdout, out.stdout + out.stderr
