"""Issue 33.5: a session's thread importing pandas while another built a Plotly image figure showed visitors
"Something went wrong (AttributeError)". Plotly reads pandas only if it is already in ``sys.modules``, without the
import lock, so it can meet a half-imported pandas; the app's start path imports it first."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RACE = textwrap.dedent(
    """
    import sys, threading
    import numpy as np
    import ui.common  # what app.py imports before any page runs
    import plotly.graph_objects as go

    print("preloaded:", all(m in sys.modules for m in ("pandas", "PIL.Image", "numpy")))
    errors, stop = [], threading.Event()

    def build():  # another session drawing image figures, as the pages do
        img = np.zeros((32, 32, 3), np.uint8)
        while not stop.is_set():
            try:
                go.Figure(go.Image(z=img)).to_json()
                go.Figure(go.Heatmap(z=np.zeros((4, 4))))
            except Exception as exc:
                errors.append(repr(exc))
                break

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    import pandas  # a session's first st.dataframe (Streamlit imports pandas then)
    import pandas.core.frame
    stop.set()
    for t in threads:
        t.join()
    print("errors:", errors)
    """
)


def test_plotly_figures_built_while_another_thread_imports_pandas_never_fail():
    out = subprocess.run(
        [sys.executable, "-c", RACE], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert "preloaded: True" in out, out
    assert "errors: []" in out, out
