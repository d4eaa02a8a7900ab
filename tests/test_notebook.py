"""The notebook API: vitviz.run / vitviz.show, the head view's payload against the record, docs/notebook.ipynb run."""

from __future__ import annotations

import base64
import json
import os
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

import vitviz
from vitviz.analysis.rollout import capture_rollout
from vitviz.figures.headview import pack_rows
from vitviz.notebook import VIEWS, HeadView

ROOT = Path(__file__).resolve().parents[1]
STAR = ROOT / "assets" / "examples" / "demo-star.png"


@pytest.fixture(scope="module")
def demo_run(one_thread):
    return vitviz.run("demo", STAR)


def _payload(view: HeadView) -> dict:
    tag = '<script id="vitviz-data" type="application/json">'  # the page's data, JSON with <, > and & escaped
    start = view.html.index(tag) + len(tag)
    return json.loads(view.html[start : view.html.index("</script>", start)])


def test_head_view_carries_the_records_attention(demo_run):
    view = vitviz.show(demo_run)
    assert isinstance(view, HeadView)
    d = _payload(view)
    cap = demo_run.capture
    L, H, T, _ = cap.attentions.shape
    codes = np.frombuffer(zlib.decompress(base64.b64decode(d["maps"])), np.uint8).reshape(L, H, T, T - 1)
    expected, _ = pack_rows(cap.attentions[..., 1:])
    assert np.array_equal(codes, expected)
    share = np.frombuffer(zlib.decompress(base64.b64decode(d["prefix_share"])), "<f4").reshape(L, H, T, 1)
    assert np.allclose(share, cap.attentions[..., :1], atol=1e-6)
    bundle = view._repr_mimebundle_()
    assert bundle["text/html"].startswith("<iframe srcdoc=") and "JavaScript" in bundle["text/plain"]


def test_static_views_are_the_apps_figures_of_the_same_numbers(demo_run):
    cap = demo_run.capture
    fig = vitviz.show(demo_run, "rollout")
    row, _ = capture_rollout(cap)
    z = np.array(next(t.z for t in fig.data if t.type == "heatmap"), dtype=float)
    assert np.allclose(z, row[1:].reshape(cap.grid)) and np.isclose(row.sum(), 1.0, atol=1e-5)
    rel = vitviz.show(demo_run, "relevance")
    exp = demo_run.relevance()
    assert np.allclose(np.array(next(t.z for t in rel.data if t.type == "heatmap"), float), exp.patch_map())
    bars = vitviz.show(demo_run, "predictions").data[0]
    assert list(bars.x)[::-1] == [p.probability for p in cap.predictions]
    assert list(bars.y)[-1] == f"{cap.predictions[0].label} ({cap.predictions[0].index})"
    for view in VIEWS:
        assert vitviz.show(demo_run, view) is not None


def test_unknown_view_and_bare_record_relevance_get_messages(demo_run):
    with pytest.raises(ValueError, match="choose one of"):
        vitviz.show(demo_run, "attention")
    with pytest.raises(ValueError, match="needs the model"):
        vitviz.show(demo_run.capture, "relevance")


def test_too_large_record_falls_back_to_the_static_figure_with_a_note(demo_run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = vitviz.show(demo_run, "heads", max_bytes=10_000)
    assert type(fig).__name__ == "Figure"
    assert any("MB" in str(w.message) for w in caught)


def test_docs_notebook_runs(one_thread, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "docs" / "notebook.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs are not committed"
    # the kernel imports vitviz from this checkout, as after `pip install .`
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "docs")}}
    ).execute()
    html_outputs = [o for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert any("<iframe srcdoc=" in o["data"]["text/html"] for o in html_outputs)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
