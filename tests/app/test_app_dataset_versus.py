"""AppTest of the Data set page's "against random, image by image" tables (issue 22 item 20): the numbers are
``Results.versus``'s and a hand-computed case's, the file's insertion start is shown with what it means, a file
without the random baseline gets the option that adds it, and the CSV has a header row with units."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pytest
from app_tools import APP, no_trouble
from conftest import scored_stand_in
from streamlit.delta_generator import DeltaGenerator
from streamlit.testing.v1 import AppTest

from vitviz.evaluate.results import (
    image_seed,
    make_rows,
    read_results,
    remember_last_run,
    rows_to_table,
    run_metadata,
    write_results,
)

# per image: (attention deletion, attention insertion, random deletion, random insertion)
# insertion: attention beats random on a and b (by 0.3, 0.2) and ties on c (0.0005 < 0.001)
# deletion (lower is better): attention better on a (-0.2), worse on b (+0.1), ties on c (0.0)
AREAS = {"a.png": (0.3, 0.8, 0.5, 0.5), "b.png": (0.6, 0.8, 0.5, 0.6), "c.png": (0.5, 0.8005, 0.5, 0.8)}


def _stand_in(d: float, i: float):
    return scored_stand_in(d, i, class_index=1, label="one")


def _results(path: Path, methods: tuple[str, ...] = ("attention", "random"), **meta) -> Path:
    rows = []
    for image_id, (ad, ai, rd, ri) in AREAS.items():
        scored = {"attention": _stand_in(ad, ai), "random": _stand_in(rd, ri)}
        rows += make_rows(
            image_id=image_id,
            path=str(path.parent / image_id),
            label="one",
            image_wh=(48, 48),
            box=None,
            scored={m: scored[m] for m in methods},
            model="demo",
            input_hw=(48, 48),
            seed=3,
            seed_of_image=image_seed(3, image_id),
            head_distance=np.array([[5.0, 6.0]]),
            head_entropy=np.array([[1.0, 1.5]]),
        )
    info = run_metadata(model="demo", methods=list(methods), seed=3, data="x.csv", images=3, skipped=[], **meta)
    return write_results(rows_to_table(rows), path, info)


@pytest.fixture
def offered(monkeypatch):
    """Every download button drawn: file name -> its data (callable or bytes)."""
    files: dict[str, object] = {}
    original = DeltaGenerator.download_button

    def record(self, label, data, file_name=None, mime=None, *args, **kwargs):
        files[file_name] = data
        return original(self, label, data, file_name, mime, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "download_button", record)
    return files


def _open(path: Path, home: Path, monkeypatch) -> AppTest:
    """The Data set page with ``path`` opened as the last local run."""
    monkeypatch.setenv("VITVIZ_HOME", str(home))
    remember_last_run(path)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/dataset.py").run()
    at.button[0].click().run()  # "Open the last local run"
    no_trouble(at)
    return at


def _plain(at: AppTest) -> list[str]:
    """Captions, info and markdown as shown (md_plain's escapes undone)."""
    texts = [e.value for e in [*at.caption, *at.info, *at.markdown]]
    return [re.sub(r"\\(.)", r"\1", t).replace("\u200b", "") for t in texts]


def _versus_tables(at: AppTest) -> dict[str, object]:
    """The versus tables by area, found by their difference column."""
    out = {}
    for df in at.dataframe:
        table = df.value
        for area in ("insertion", "deletion"):
            if any(c.startswith(f"{area} − random") for c in table.columns):
                out[area] = table.set_index("method")
    return out


def test_the_tables_show_versus_numbers_and_the_hand_computed_case(tmp_path, monkeypatch, offered):
    path = _results(tmp_path / "r.parquet", insertion_start="grey")
    at = _open(path, tmp_path / "home", monkeypatch)
    tables = _versus_tables(at)
    assert set(tables) == {"insertion", "deletion"}
    res = read_results(path)
    for area, table in tables.items():
        (v,) = res.versus("random", area)
        row = table.loc["attention"]
        diff = next(c for c in table.columns if c.startswith(f"{area} − random"))
        assert row[diff] == f"{v.difference_mean:+.3f} ± {v.difference_se:.3f}"
        shares = f"{100 * v.better_share:.0f} / {100 * v.tie_share:.0f} / {100 * v.worse_share:.0f} %"
        assert row["better / tie / worse"] == shares
        assert row["sign test p"] == f"{v.sign_p:.2g}" and row["images"] == 3
        assert "random" not in table.index  # the baseline is not compared with itself
    # by hand: insertion differences 0.3, 0.2, 0.0005 -> 2 better, 1 tie; sign test 2 * 0.5 ** 2
    ins = tables["insertion"].loc["attention"]
    d = np.array([0.3, 0.2, 0.0005])
    assert ins["insertion − random (higher: better)"] == f"+{d.mean():.3f} ± {d.std(ddof=1) / np.sqrt(3):.3f}"
    assert ins["better / tie / worse"] == "67 / 33 / 0 %" and ins["sign test p"] == "0.5"
    # deletion differences -0.2, +0.1, 0.0: one better (lower), one tie, one worse; sign test p = 1
    dele = tables["deletion"].loc["attention"]
    assert dele["deletion − random (lower: better)"].startswith("-0.033 ± ")
    assert dele["better / tie / worse"] == "33 / 33 / 33 %" and dele["sign test p"] == "1"
    shown = _plain(at)
    assert any("Insertion started from grey: every channel at half its range (127.5 / 255)" in t for t in shown)
    assert any("within 0.001" in t and "sign test" in t for t in shown)  # docs/definitions.md#versus-random

    rows = list(csv.reader(io.StringIO((lambda d: d() if callable(d) else d)(offered["versus_random.csv"]).decode())))
    header = rows[0]
    assert header[:4] == ["method", "baseline", "area", "better means"]
    assert "mean area difference, method - baseline (probability)" in header and "better (% of images)" in header
    by_area = {r[2]: dict(zip(header, r, strict=True)) for r in rows[1:]}
    assert set(by_area) == {"insertion", "deletion"} and len(rows) == 3
    assert float(by_area["insertion"]["better (% of images)"]) == pytest.approx(200 / 3, abs=1e-4)
    assert float(by_area["insertion"]["sign test p (two-sided)"]) == 0.5
    assert float(by_area["deletion"]["mean area difference, method - baseline (probability)"]) == pytest.approx(
        -0.1 / 3
    )


def test_a_file_written_before_the_choice_started_from_blur(tmp_path, monkeypatch):
    at = _open(_results(tmp_path / "old.parquet"), tmp_path / "home", monkeypatch)
    assert any("Insertion started from blur (files written before the choice existed)" in t for t in _plain(at))
    assert set(_versus_tables(at)) == {"insertion", "deletion"}


def test_a_file_without_random_says_how_to_get_it(tmp_path, monkeypatch):
    path = _results(tmp_path / "norandom.parquet", methods=("attention",), insertion_start="mean")
    at = _open(path, tmp_path / "home", monkeypatch)
    assert not _versus_tables(at)
    shown = _plain(at)
    assert any("--methods attention,random" in t for t in shown)
    assert any("Insertion started from mean: every pixel the image's mean colour" in t for t in shown)


def _keep(res, path: Path, keep) -> Path:
    """``res`` with only the rows ``keep(method, image_id)`` chooses, written to ``path`` (same metadata)."""
    methods, ids = (res.table.column(c).to_pylist() for c in ("method", "image_id"))
    mask = [bool(keep(m, i)) for m, i in zip(methods, ids, strict=True)]
    return write_results(res.table.filter(mask), path, res.meta)


def test_an_unknown_start_and_images_not_shared_with_random_read_plainly(tmp_path, monkeypatch):
    res = read_results(_results(tmp_path / "odd.parquet", insertion_start="sepia"))
    one = _keep(res, tmp_path / "one.parquet", lambda m, i: m != "random" or i == "a.png")
    at = _open(one, tmp_path / "home", monkeypatch)
    assert any("Insertion started from sepia (not a start this vitviz knows)" in t for t in _plain(at))
    row = _versus_tables(at)["insertion"].loc["attention"]
    assert row["images"] == 1  # a.png only: one difference (0.3), no standard error
    assert row["insertion − random (higher: better)"] == "+0.300"
    assert row["better / tie / worse"] == "100 / 0 / 0 %" and row["sign test p"] == "1"
    # random on c.png only, attention on a.png and b.png: no image to compare
    none = _keep(res, tmp_path / "none.parquet", lambda m, i: (m == "random") == (i == "c.png"))
    at = _open(none, tmp_path / "home2", monkeypatch)
    row = _versus_tables(at)["insertion"].loc["attention"]
    assert row["images"] == 0 and row["insertion − random (higher: better)"] == "no image scored by both"
    assert row["better / tie / worse"] == "" and row["sign test p"] == ""
