"""The results file: schema, metadata, readable by pandas / pyarrow.dataset (/ DuckDB where installed), and
``read_results`` refusing what is not a vitviz results file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from conftest import FRACTIONS, scored_stand_in

from vitviz.evaluate.results import (
    META_KEY,
    SCHEMA,
    SCHEMA_VERSION,
    ResultsError,
    image_seed,
    make_rows,
    read_results,
    rows_to_table,
    run_metadata,
    write_results,
)


def _rows(image_id: str, k: int, box: bool = True) -> list[dict]:
    distance = np.array([[10.0 + k, 20.0], [30.0, np.nan]])  # the second block has one head: NaN -> null
    return make_rows(
        image_id=image_id,
        path=f"/data/{image_id}",
        label="two" if k % 2 == 0 else "one",
        image_wh=(200, 100),
        box=(1.0, 2.0, 30.0, 40.0) if box else None,
        scored={
            "attention": scored_stand_in(0.2 + k / 10, 0.8, peak=True if box else None),
            "random": scored_stand_in(0.5, 0.5 + k / 10, peak=False if box else None),
        },
        model="demo",
        input_hw=(96, 96),
        seed=7,
        seed_of_image=image_seed(7, image_id),
        head_distance=distance,
        head_entropy=distance / 10,
    )


@pytest.fixture()
def results_file(tmp_path: Path) -> Path:
    rows = _rows("a.png", 0) + _rows("b.png", 1) + _rows("c.png", 2, box=False)
    meta = run_metadata(
        model="demo",
        methods=["attention", "random"],
        seed=7,
        size=None,
        data="x.csv",
        engine="local",
        points=21,
        images=3,
        skipped=[{"where": "x.csv:9", "reason": "bad"}],
    )
    return write_results(rows_to_table(rows), tmp_path / "r.parquet", meta)


def test_pandas_reads_a_tidy_table(results_file: Path) -> None:
    import pandas as pd

    df = pd.read_parquet(results_file)
    assert list(df.columns) == SCHEMA.names
    assert len(df) == 6 and list(df["method"]) == ["attention", "random"] * 3
    means = df.groupby("method")["deletion_area"].mean()
    assert means["attention"] == pytest.approx(0.3) and means["random"] == pytest.approx(0.5)
    assert df["correct"].tolist() == [True, True, False, False, True, True]
    assert df["peak_in_box"].isna().sum() == 2  # the image without a box
    assert len(df["deletion_curve"].iloc[0]) == 21
    first = df.drop_duplicates("image_id")["head_distance"].iloc[1]
    assert list(first[0]) == [11.0, 20.0]
    assert first[1][1] is None or np.isnan(first[1][1])


def test_pyarrow_dataset_and_metadata(results_file: Path) -> None:
    table = pads.dataset(results_file, format="parquet").to_table(filter=pads.field("method") == "random")
    assert table.num_rows == 3
    meta = json.loads(pq.read_schema(results_file).metadata[META_KEY])
    assert meta["format"] == "vitviz evaluation results" and meta["schema_version"] == SCHEMA_VERSION
    assert meta["methods"] == ["attention", "random"] and meta["skipped"][0]["where"] == "x.csv:9"
    assert pq.read_schema(results_file).field("deletion_area").metadata[b"description"].startswith(b"area")


def test_duckdb_reads_it_where_installed(results_file: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    got = duckdb.sql(
        f"SELECT method, avg(deletion_area) AS d FROM '{results_file}' GROUP BY method ORDER BY method"
    ).fetchall()
    assert [m for m, _ in got] == ["attention", "random"]
    kv = duckdb.sql(f"SELECT value FROM parquet_kv_metadata('{results_file}') WHERE key = 'vitviz'").fetchall()
    assert json.loads(kv[0][0])["schema_version"] == SCHEMA_VERSION


def test_read_results_helpers(results_file: Path) -> None:
    res = read_results(results_file)
    assert res.methods == ("attention", "random") and res.num_images == 3
    summary = {s.method: s for s in res.summary()}
    a = summary["attention"]
    assert a.n == 3 and a.deletion_mean == pytest.approx(0.3)
    assert a.deletion_se == pytest.approx(np.std([0.2, 0.3, 0.4], ddof=1) / np.sqrt(3))
    assert a.peak_in_box_rate == 1.0 and a.n_boxes == 2 and summary["random"].peak_in_box_rate == 0.0
    fr, dele, ins = res.mean_curves()["random"]
    assert fr == pytest.approx(FRACTIONS) and dele == pytest.approx(np.full(21, 0.5))
    assert ins == pytest.approx(np.full(21, 0.6))
    heads = res.head_stats("distance")
    assert heads.shape == (3, 2, 2) and heads[:, 0, 0] == pytest.approx([10, 11, 12]) and np.isnan(heads[0, 1, 1])
    assert res.head_stats("entropy")[2, 0, 0] == pytest.approx(1.2)
    assert res.images().num_rows == 3
    assert read_results(results_file.read_bytes()).num_images == 3  # an upload (bytes) reads the same
    assert read_results(io.BytesIO(results_file.read_bytes())).num_images == 3


def test_image_seed_is_stable_and_differs_per_image() -> None:
    assert image_seed(7, "a.png") == image_seed(7, "a.png")
    assert len({image_seed(7, f"{k}.png") for k in range(50)}) == 50
    assert image_seed(7, "a.png") != image_seed(8, "a.png")
    assert 0 <= image_seed(0, "x") < 2**32


def test_read_results_refuses_what_is_not_results(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), foreign)
    with pytest.raises(ResultsError, match=r"Parquet file but not vitviz evaluation results.*columns: a, b"):
        read_results(foreign)
    text = tmp_path / "notes.parquet"
    text.write_text("hello, I am a CSV\n1,2\n")
    with pytest.raises(ResultsError, match="is not a Parquet file"):
        read_results(text)
    with pytest.raises(ResultsError, match="not a Parquet file"):
        read_results(b"")
    with pytest.raises(ResultsError, match="does not exist"):
        read_results(tmp_path / "missing.parquet")
    with pytest.raises(ResultsError, match="is a folder"):
        read_results(tmp_path)


def test_read_results_refuses_newer_versions_and_missing_columns(tmp_path: Path, results_file: Path) -> None:
    table = pq.read_table(results_file)
    meta = json.loads(table.schema.metadata[META_KEY])
    newer = tmp_path / "newer.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps({**meta, "schema_version": 99})}), newer)
    with pytest.raises(ResultsError, match=r"schema version 99.*update vitviz"):
        read_results(newer)
    partial = tmp_path / "partial.parquet"
    pq.write_table(table.drop_columns(["head_entropy"]), partial)
    with pytest.raises(ResultsError, match=r"lacks the column.*head_entropy"):
        read_results(partial)
    odd = tmp_path / "odd.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: b"not json"}), odd)
    with pytest.raises(ResultsError, match="not a results header"):
        read_results(odd)


@pytest.mark.parametrize(
    "change",
    [
        {"skipped": "[" * 100_000 + "]" * 100_000},  # RecursionError in json.loads
        {"skipped": "[" * 500 + "]" * 500},  # parses, but no results header nests like that
        {"skipped": "5"},  # the Data set page counts the skipped inputs: len(5)
        {"methods": '"attention"'},
        {"labels": '[["a"]]'},
    ],
    ids=["deep", "nested", "skipped-number", "methods-text", "labels-nested"],
)
def test_a_header_of_the_wrong_shape_is_not_a_results_file(tmp_path: Path, results_file: Path, change) -> None:
    """Issue 33.12: deeply nested 'vitviz' metadata showed "Something went wrong (RecursionError)"."""
    table = pq.read_table(results_file)
    meta = json.loads(table.schema.metadata[META_KEY])
    ((key, raw),) = change.items()
    text = json.dumps({k: v for k, v in meta.items() if k != key})[:-1] + f', "{key}": {raw}}}'  # the field last
    odd = tmp_path / "odd.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: text.encode()}), odd)
    with pytest.raises(ResultsError, match="not a results header"):
        read_results(odd)


def test_write_is_atomic_and_leaves_no_temporary_file(tmp_path: Path, results_file: Path) -> None:
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]
    empty = write_results(SCHEMA.empty_table(), tmp_path / "empty.parquet", run_metadata(methods=[]))
    res = read_results(empty)
    assert res.num_images == 0 and res.summary() == [] and res.head_stats().shape == (0, 0, 0)


def _bomb(results_file: Path, tmp_path: Path, rows: int, **columns) -> Path:
    """The fixture's table, its first row repeated ``rows`` times, with ``columns`` replaced; same metadata."""
    table = pq.read_table(results_file)
    table = table.take(pa.array(np.zeros(rows, dtype=np.int64)))
    for name, array in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, array)
    out = tmp_path / "bomb.parquet"
    pq.write_table(table, out, compression="zstd")
    return out


def test_a_repeated_long_text_is_refused_before_it_is_expanded(results_file: Path, tmp_path: Path) -> None:
    """Issue 23.1: 2,000 rows sharing one 50 KB path: a file of a few KB that decodes to 100 MB."""
    from vitviz.evaluate.results import ResultsLimits

    indices = pa.array(np.zeros(2000, dtype=np.int32))
    path = pa.DictionaryArray.from_arrays(indices, pa.array(["x" * 50_000]))
    bomb = _bomb(results_file, tmp_path, 2000, path=path)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ResultsError, match=r"more than 20 MB of memory once decoded.*'path' repeats long texts"):
        read_results(bomb.read_bytes(), ResultsLimits(max_bytes=20 * 2**20))
    assert read_results(bomb, ResultsLimits(max_bytes=200 * 2**20)).table.column("path")[0].as_py() == "x" * 50_000


def test_long_lists_and_too_many_rows_are_refused_from_the_footer(
    results_file: Path, tmp_path: Path, monkeypatch
) -> None:
    from vitviz.evaluate.results import ResultsLimits

    values = pa.array(np.zeros(3_000_000))  # 24 MB of zeros in one row's list: a few KB compressed
    fractions = pa.ListArray.from_arrays(pa.array([0, 3_000_000, 3_000_000], type=pa.int32()), values)
    bomb = _bomb(results_file, tmp_path, 2, fractions=fractions)
    assert bomb.stat().st_size < 200_000
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("decoded before the footer check"))
    with pytest.raises(ResultsError, match=r"more than 8 MB.*column 'fractions' alone holds 3,000,001 values"):
        read_results(bomb, ResultsLimits(max_bytes=8 * 2**20))
    with pytest.raises(ResultsError, match=r"has 6 rows; vitviz reads at most 5"):
        read_results(results_file, ResultsLimits(max_rows=5))
    with pytest.raises(ResultsError, match=r"has 27 columns; vitviz reads at most 20"):
        read_results(results_file, ResultsLimits(max_columns=20))


def test_versus_random_pairs_images_by_hand(results_file: Path) -> None:
    res = read_results(results_file)
    # insertion: attention 0.8 on every image, random 0.5, 0.6, 0.7 -> differences 0.3, 0.2, 0.1
    (ins,) = res.versus("random", "insertion")
    assert (ins.method, ins.baseline, ins.area, ins.n) == ("attention", "random", "insertion", 3)
    assert ins.difference_mean == pytest.approx(0.2)
    assert ins.difference_se == pytest.approx(np.std([0.3, 0.2, 0.1], ddof=1) / np.sqrt(3))
    assert (ins.better_share, ins.tie_share, ins.worse_share) == (1.0, 0.0, 0.0)
    assert ins.sign_p == pytest.approx(0.25)  # 3 better, 0 worse: 2 * 0.5 ** 3
    # deletion: attention 0.2, 0.3, 0.4 against random 0.5: lower is better, on every image
    (dele,) = res.versus("random", "deletion")
    assert dele.difference_mean == pytest.approx(-0.2) and dele.better_share == 1.0
    # a tolerance of 0.15 makes the 0.1 difference a tie, 0.25 all three
    (tol,) = res.versus("random", "insertion", tolerance=0.15)
    assert (tol.better_share, tol.tie_share) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    (tol,) = res.versus("random", "insertion", tolerance=0.35)
    assert tol.tie_share == 1.0 and tol.sign_p == 1.0
    assert res.versus("gradcam") == []
    with pytest.raises(ValueError, match="insertion"):
        res.versus("random", "area")
    with pytest.raises(ValueError, match="tolerance"):
        res.versus("random", tolerance=-1)


def test_versus_counts_ties_and_leaves_unpaired_images_out(tmp_path: Path) -> None:
    rows = _rows("a.png", 0) + _rows("b.png", 3) + _rows("c.png", 5) + _rows("d.png", 4)
    rows = [r for r in rows if not (r["image_id"] == "c.png" and r["method"] == "attention")]
    # insertion: random 0.5 (a), 0.8 (b), 0.9 (d); attention 0.8 on all: better, tie, worse; c has random only
    meta = run_metadata(model="demo", methods=["attention", "random"], seed=7, images=4)
    res = read_results(write_results(rows_to_table(rows), tmp_path / "t.parquet", meta))
    (v,) = res.versus()
    assert v.n == 3 and (v.better_share, v.tie_share, v.worse_share) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert v.difference_mean == pytest.approx((0.3 + 0.0 - 0.1) / 3) and v.sign_p == 1.0


@pytest.mark.parametrize(("better", "worse"), [(0, 0), (5, 0), (0, 5), (66, 31), (10, 10), (1, 9)])
def test_sign_test_against_the_binomial_by_hand_and_scipy(better: int, worse: int) -> None:
    from math import comb

    from vitviz.evaluate.results import sign_test

    n, k = better + worse, min(better, worse)
    by_hand = 1.0 if n == 0 else min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n)
    assert sign_test(better, worse) == pytest.approx(by_hand)
    if (better, worse) == (5, 0):
        assert sign_test(5, 0) == pytest.approx(2 / 32)
    stats = pytest.importorskip("scipy.stats")
    if n:
        assert sign_test(better, worse) == pytest.approx(stats.binomtest(better, n, 0.5).pvalue)


def test_versus_columns_name_units_and_hold_versus_numbers(results_file: Path) -> None:
    from vitviz.evaluate.results import versus_columns
    from vitviz.tables import csv_bytes

    res = read_results(results_file)
    rows = res.versus("random", "insertion") + res.versus("random", "deletion")
    cols = versus_columns(rows)
    assert list(cols) == [
        "method",
        "baseline",
        "area",
        "better means",
        "images",
        "mean area difference, method - baseline (probability)",
        "standard error of the difference (probability)",
        "better (% of images)",
        "tie (% of images)",
        "worse (% of images)",
        "tie tolerance (probability)",
        "sign test p (two-sided)",
    ]
    assert list(cols["area"]) == ["insertion", "deletion"]
    assert list(cols["better means"]) == ["higher than the baseline", "lower than the baseline"]
    # by hand (test_versus_random_pairs_images_by_hand): insertion +0.2, deletion -0.2, 3 of 3 better, p = 0.25
    assert cols["mean area difference, method - baseline (probability)"] == pytest.approx([0.2, -0.2])
    assert cols["better (% of images)"] == pytest.approx([100.0, 100.0])
    assert cols["tie (% of images)"] == pytest.approx([0.0, 0.0])
    assert cols["sign test p (two-sided)"] == pytest.approx([0.25, 0.25])
    assert list(cols["images"]) == [3, 3] and cols["tie tolerance (probability)"] == pytest.approx([0.001] * 2)
    text = csv_bytes(cols).decode().splitlines()
    assert len(text) == 3 and text[1].startswith("attention,random,insertion,higher than the baseline,3,0.2,")
    empty = versus_columns([])
    assert list(empty) == list(cols) and all(len(v) == 0 for v in empty.values())
