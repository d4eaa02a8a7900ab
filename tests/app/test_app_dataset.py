"""AppTest of the Data set page: the last local run opens, its figures show its numbers, Open shows the image."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from vitviz.__main__ import main
from vitviz.data.shapes import write_dataset
from vitviz.evaluate.results import last_run, read_results


@pytest.fixture(scope="module")
def last_results(tmp_path_factory) -> Path:
    """Six demo images evaluated by the command line, which notes the run as the last local one."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("VITVIZ_HOME", str(home))
    csv_path = write_dataset(tmp_path_factory.mktemp("shapes"), n=6, seed=31)
    out = tmp_path_factory.mktemp("run") / "results.parquet"
    argv = ["evaluate", "--data", str(csv_path), "--out", str(out), "--methods", "attention,rollout,random"]
    assert main([*argv, "--size", "48"]) == 0
    assert last_run() == out.resolve()
    yield out
    mp.undo()


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/dataset.py")
    return at.run()


def test_without_results_the_page_asks_for_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VITVIZ_HOME", str(tmp_path))
    at = _page()
    no_trouble(at)
    assert any("Upload a results file" in i.value for i in at.info) and not charts(at)


def test_the_last_local_run_shows_its_areas_distances_and_disagreements(last_results):
    at = _page()
    no_trouble(at)
    at.button[0].click().run()  # "Open the last local run"
    no_trouble(at)
    results = read_results(last_results)
    table = at.dataframe[0].value
    assert list(table["method"]) == [s.method for s in results.summary()]
    shown = [re.sub(r"\\(.)", r"\1", c.value).replace("\u200b", "") for c in at.caption]  # md_plain undone
    assert any("insertion from the image's mean colour" in c for c in shown)  # the run's start
    rollout = next(s for s in results.summary() if s.method == "rollout")
    assert table.set_index("method").loc["rollout", "deletion area"].startswith(f"{rollout.deletion_mean:.3f}")
    figs = {el.proto.id: json.loads(el.proto.spec) for el in charts(at)}
    assert len(figs) == 3  # areas, mean curves, distance vs depth
    areas = next(f for f in figs.values() if "Areas" in f["layout"]["title"]["text"])
    boxes = {(t["name"], t["xaxis"]): t for t in areas["data"]}
    got = boxes[("rollout", "x")]["y"]
    got = np.array(got if isinstance(got, list) else [], dtype=float)
    want = results.method_rows("rollout").column("deletion_area").to_numpy()
    if got.size:  # plotly may serialise the values as binary; the table above already checked the mean
        np.testing.assert_allclose(np.sort(got), np.sort(want))
    assert sum(b.label == "Open" for b in at.button) == 6  # every image, ranked by disagreement


def test_open_shows_that_image_on_compare_explanations(last_results):
    at = _page()
    at.button[0].click().run()
    path = read_results(last_results).images().column("path").to_pylist()
    opens = [b for b in at.button if b.label == "Open"]
    opens[0].click().run()
    no_trouble(at)
    assert at.session_state.image_name in {Path(p).name for p in path}
    assert at.session_state.model_name == "demo"
    assert any("Which map can you trust?" in h.value for h in at.header)


def test_a_zero_shot_run_shows_its_labels_and_opens_with_them(tmp_path, monkeypatch):
    monkeypatch.setenv("VITVIZ_HOME", str(tmp_path / "home"))
    csv_path = write_dataset(tmp_path / "shapes", n=2, seed=5)
    out = tmp_path / "zs.parquet"
    labels = "circle,square,triangle,cross,star"
    argv = [
        "evaluate",
        "--model",
        "demo-clip",
        "--data",
        str(csv_path),
        "--out",
        str(out),
        "--methods",
        "rollout,random",
    ]
    assert main([*argv, "--labels", labels]) == 0
    at = _page()
    at.button[0].click().run()
    no_trouble(at)
    shown = [re.sub(r"\\(.)", r"\1", c.value).replace("\u200b", "") for c in at.caption]  # md_plain undone
    assert any("Zero-shot labels 'circle', 'square'" in c for c in shown)
    assert set(at.dataframe[0].value["method"]) == {"rollout", "random"}
    next(b for b in at.button if b.label == "Open").click().run()
    no_trouble(at)
    assert at.session_state.model_name == "demo-clip"
    assert at.session_state.labels_text.split("\n") == labels.split(",")
    assert any("Which map can you trust?" in h.value for h in at.header)
    assert any("Zero-shot: the label's score" in c.value for c in at.caption)


def test_open_explains_the_class_the_results_explained_for_that_image(last_results):
    at = _page()
    at.button[0].click().run()
    images = read_results(last_results).images()
    explained = dict(zip(images.column("image_id").to_pylist(), images.column("class_index").to_pylist(), strict=True))
    opens = [b for b in at.button if b.label == "Open"]
    image_id = opens[0].key.removeprefix("open_")
    at.session_state["class_index"] = (explained[image_id] + 1) % 5  # an earlier image's class
    opens[0].click().run()
    no_trouble(at)
    assert at.session_state.class_index == explained[image_id]


def test_a_run_with_the_random_baseline_alone_opens(tmp_path, monkeypatch):
    monkeypatch.setenv("VITVIZ_HOME", str(tmp_path / "home"))
    csv_path = write_dataset(tmp_path / "shapes", n=2, seed=7)
    out = tmp_path / "random.parquet"
    argv = ["evaluate", "--data", str(csv_path), "--out", str(out), "--methods", "random", "--size", "48"]
    assert main(argv) == 0
    at = _page()
    at.button[0].click().run()
    no_trouble(at)
    assert list(at.dataframe[0].value["method"]) == ["random"]
    assert any("only the random baseline" in c.value for c in at.caption)


def test_the_disagreement_numbers_say_what_they_are(last_results):
    """Issue 32.12: "where the methods disagree most" listed bare numbers; they are deletion areas and their range."""
    at = _page()
    at.button[0].click().run()
    shown = [re.sub(r"\\(.)", r"\1", c.value) for c in at.caption]
    rows = [c for c in shown if c.startswith("deletion area: ")]
    assert len(rows) == 6 and all("; range " in c and "(largest minus smallest)" in c for c in rows)
    assert any("lower is better" in c and "deletion areas differ most" in c for c in shown)
