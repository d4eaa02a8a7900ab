"""Issue 23 items 9 and 10: evaluate keeps finished results of other settings, and reads regular files only."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_tools import _cli, _one_line_error
from conftest import random_image

ROOT = Path(__file__).resolve().parents[2]


# -- 9. evaluate never replaces finished results of other settings without --overwrite ---------------


@pytest.fixture(scope="module")
def demo():
    from vitviz.models.load import load_model

    return load_model("demo", device="cpu")


@pytest.mark.parametrize(
    "change",
    [{"methods": ("random", "attention")}, {"size": 56}, {"seed": 4}, {"model": "assets/demo-vit"}],
    ids=["methods", "size", "seed", "model"],
)
def test_evaluate_refuses_to_replace_results_of_other_settings(demo, tmp_path, change, one_thread):
    import pyarrow.parquet as pq

    from vitviz.data.shapes import write_dataset
    from vitviz.evaluate.run import EvaluateError, evaluate_dataset

    data = write_dataset(tmp_path / "shapes", n=2, seed=5)
    out = tmp_path / "r.parquet"
    base = {"methods": ("random",), "size": 48, "seed": 3, "loaded": demo}
    first = evaluate_dataset("demo", data, out, **base)
    assert first.evaluated == 2
    before = out.read_bytes()
    kw = {**base, **change}
    model = kw.pop("model", "demo")
    if model != "demo":  # the same weights under another name (their folder) is another --model
        model = str(ROOT / "vitviz" / model)
        kw.pop("loaded")
    with pytest.raises(EvaluateError, match=r"other settings.*--overwrite"):
        evaluate_dataset(model, data, out, **kw)
    assert out.read_bytes() == before
    again = evaluate_dataset("demo", data, out, **base)  # the same settings: runs as before
    assert again.evaluated == 2
    replaced = evaluate_dataset(model, data, out, overwrite=True, **kw)
    assert replaced.evaluated == 2
    rows = pq.read_table(out).to_pylist()
    assert {r["method"] for r in rows} == set(kw["methods"])


def test_evaluate_cli_refuses_a_foreign_out_file(tmp_path, capsys):
    from vitviz.data.shapes import write_dataset

    data = write_dataset(tmp_path / "shapes", n=1, seed=5)
    out = tmp_path / "notes.parquet"
    out.write_text("my own notes")
    args = ["evaluate", "--data", str(data), "--out", str(out), "--methods", "random", "--size", "48"]
    line = _one_line_error(_cli(capsys, *args), 1)
    assert "not vitviz results" in line and out.read_text() == "my own notes"
    assert _cli(capsys, *args, "--overwrite").returncode == 0


# -- 10. evaluate --data opens regular files only, size checked first ---------------------------------


@pytest.fixture
def alarm():
    """Fail instead of hanging: a blocked open or an endless read raises after 60 s."""
    import signal

    def stop(signum, frame):
        raise TimeoutError("blocked: evaluate read something it should not have")

    before = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


def test_evaluate_folder_reads_regular_files_only(demo, tmp_path, alarm, one_thread):
    import os

    from vitviz.evaluate.run import evaluate_dataset

    data = tmp_path / "data"
    data.mkdir()
    random_image(1, (48, 48)).save(data / "a.png")
    os.mkfifo(data / "fifo.png")
    (data / "zero.png").symlink_to("/dev/zero")
    with open(data / "huge.png", "wb") as fh:  # sparse: 201 MB on paper, nothing on disk
        fh.truncate(201 * 2**20)
    (data / "link.png").symlink_to(data / "a.png")  # a link to a regular file is read
    report = evaluate_dataset("demo", data, tmp_path / "r.parquet", methods=("random",), size=48, loaded=demo)
    assert report.evaluated == 2
    why = {Path(s.where).name: s.reason for s in report.skipped}
    assert set(why) == {"fifo.png", "zero.png", "huge.png"}
    assert "FIFO" in why["fifo.png"] and "device" in why["zero.png"] and "201 MB" in why["huge.png"]


def test_evaluate_csv_rows_naming_a_fifo_or_a_device_are_skipped(tmp_path, alarm):
    import os

    from vitviz.evaluate.data import read_csv

    os.mkfifo(tmp_path / "f.png")
    random_image(1, (48, 48)).save(tmp_path / "a.png")
    (tmp_path / "l.csv").write_text("file,label\na.png,x\nf.png,y\n/dev/zero,z\n")
    ds = read_csv(tmp_path / "l.csv")
    assert [i.image_id for i in ds.items] == ["a.png"]
    assert [s.where for s in ds.skipped] == ["l.csv:3", "l.csv:4"]
    assert "FIFO" in ds.skipped[0].reason and "device" in ds.skipped[1].reason


@pytest.mark.parametrize("where", ["read-only", "under a file"])
def test_evaluate_out_that_cannot_be_written_is_a_message(tmp_path, capsys, where):
    import os

    from vitviz.data.shapes import write_dataset

    data = write_dataset(tmp_path / "shapes", n=1, seed=5)
    if where == "under a file":
        out = data / "r.parquet"  # data is labels.csv: a file
    elif os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o555)
        out = tmp_path / "ro" / "r.parquet"
    elif Path("/sys/kernel").is_dir():
        out = Path("/sys/kernel/r.parquet")
    else:
        pytest.skip("no read-only folder available to root here")
    args = ["evaluate", "--data", str(data), "--out", str(out), "--methods", "random", "--size", "48"]
    proc = _cli(capsys, *args)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr
    assert str(out.parent) in _one_line_error(proc, proc.returncode)


# -- issue 33.14: what evaluate echoes to the terminal ------------------------------------------------


def test_control_characters_in_labels_and_csv_cells_never_reach_the_terminal(tmp_path, capsys, one_thread):
    """Escape sequences typed in --labels (or written in a CSV's cells) were echoed raw: ESC [2J clears a screen."""
    from vitviz.data.shapes import write_dataset

    data = write_dataset(tmp_path / "shapes", n=1, seed=5)
    with data.open("a") as fh:  # a row naming a file that is not there: its reason quotes the cell
        fh.write("\x1b[2J\x1b]0;owned\x07gone.png,star,,,,\n")
    labels = "\x1b[2J\x1b[31mstar,\x1b[2J\x1b[31mstar,circle\u202e"  # a repeat: the note names the label
    args = ["evaluate", "--model", "demo-clip", "--data", str(data), "--out", str(tmp_path / "r.parquet")]
    proc = _cli(capsys, *args, "--methods", "random", "--labels", labels)
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in shown  # 1: a row was skipped
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\\x1b[2J\\x1b[31mstar" in shown and "\\x1b]0;owned\\x07gone.png" in shown  # shown, escaped


def test_a_template_with_two_slots_is_refused(tmp_path, capsys):
    """``--template "a {} of a {}"`` filled the first {} and left the second as text, silently."""
    from vitviz.data.shapes import write_dataset
    from vitviz.models.zeroshot import ZeroShotError, parse_labels

    with pytest.raises(ZeroShotError, match=r"needs \{\} exactly once.*it has 2"):
        parse_labels("cat, dog", "a {} of a {}")
    data = write_dataset(tmp_path / "shapes", n=1, seed=5)
    args = ["evaluate", "--model", "demo-clip", "--data", str(data), "--out", str(tmp_path / "r.parquet")]
    line = _one_line_error(_cli(capsys, *args, "--labels", "star,circle", "--template", "a {} of a {}"), 1)
    assert "needs {} exactly once" in line
    assert not (tmp_path / "r.parquet").exists()


def test_a_csv_of_200000_columns_gets_a_short_message(tmp_path, capsys):
    """The message listing a CSV's columns printed 1.5 MB of names on one line."""
    csv = tmp_path / "wide.csv"
    csv.write_text(",".join(f"column_{i}" for i in range(200_000)) + "\n" + ",".join("1" * 200_000) + "\n")
    proc = _cli(capsys, "evaluate", "--data", str(csv), "--out", str(tmp_path / "r.parquet"))
    line = _one_line_error(proc, 1)
    assert "lacks the column file" in line and "column_0" in line
    assert len(proc.stderr) < 2_000


# -- issue 33.9: a CSV of millions of rows -------------------------------------------------------------


def _long_csv(folder: Path, rows: int) -> Path:
    """One real image, then ``rows`` rows naming files that are not there (each one a skipped row)."""
    from vitviz.data.shapes import write_dataset

    csv = write_dataset(folder, n=1, seed=5)
    with csv.open("a") as fh:
        fh.writelines(f"missing-{i}.png,star,,,,\n" for i in range(rows))
    return csv


def test_a_csv_is_read_up_to_max_rows_and_says_so(tmp_path):
    import tracemalloc

    from vitviz.evaluate.data import KEPT_SKIPPED, MAX_ROWS, read_dataset

    csv = _long_csv(tmp_path / "d", 300_000)
    tracemalloc.start()
    try:
        ds = read_dataset(csv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(ds.items) == 1 and ds.skipped.total == MAX_ROWS  # 1 image, MAX_ROWS - 1 bad rows, the note
    assert len(ds.skipped) == KEPT_SKIPPED + 1  # the first ones with their reasons, and the note that the rest
    assert f"the CSV has more than {MAX_ROWS:,} rows: the rest was not read" in ds.skipped[-1].reason
    assert ds.skipped[-1].where == f"labels.csv:{MAX_ROWS + 2}"  # the header, then MAX_ROWS rows read
    assert peak < 64 * 2**20, peak  # streamed: a 2,000,000-row CSV took a run past 3 GB
    small = read_dataset(csv, max_rows=10)
    assert small.skipped.total == 10 and "more than 10 rows" in small.skipped[-1].reason


def test_skipped_rows_are_summarised_in_the_results_file_and_on_the_terminal(tmp_path, capsys, one_thread):
    """300,000 skipped rows wrote a 76 MB results file: every one was in its metadata."""
    import json

    import pyarrow.parquet as pq

    from vitviz.evaluate.data import KEPT_SKIPPED
    from vitviz.evaluate.results import META_KEY, read_results

    csv = _long_csv(tmp_path / "d", 20_000)
    out = tmp_path / "r.parquet"
    args = ["evaluate", "--data", str(csv), "--out", str(out), "--methods", "random", "--size", "48"]
    proc = _cli(capsys, *args, "--max-rows", "5000")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "skipped 5000 of 5001 images" in proc.stderr  # 4,999 rows naming no file, and the rows not read
    assert "more than 5,000 rows: the rest was not read" in proc.stderr
    assert len(proc.stderr) < 10_000
    meta = json.loads(pq.read_schema(out).metadata[META_KEY])
    assert meta["skipped_total"] == 5000 and len(meta["skipped"]) == KEPT_SKIPPED + 1
    assert out.stat().st_size < 200_000
    assert read_results(out).num_images == 1


def test_export_prints_file_names_with_control_characters_escaped(tmp_path, capsys):
    """export's failures quote the file names given: a name holding ESC [2J cleared the terminal."""
    odd = tmp_path / "\x1b[2Jgone.png"  # not there: the failure names it
    proc = _cli(capsys, "export", str(odd), "--model", "demo", "--out", str(tmp_path / "o"))
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "\x1b" not in shown and "\\x1b[2Jgone.png: no such file" in shown


def test_a_folder_listing_stops_at_max_files_in_bounded_memory_and_the_cli_says_so(tmp_path, capsys, one_thread):
    import tracemalloc

    from vitviz.evaluate.data import read_dataset

    data = tmp_path / "many"
    data.mkdir()
    for i in range(5_000):  # empty files: the listing reads names only
        (data / f"{i:05d}.txt").touch()
    tracemalloc.start()
    try:
        ds = read_dataset(data, max_files=500)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ds.skipped.total == 501  # 500 listed (not images), and the note
    assert "4,500 more in" in ds.skipped.noted[0].reason
    assert peak < 2**20, peak  # what the 500 listed hold, not 5,000 names

    out = tmp_path / "r.parquet"
    args = ["evaluate", "--data", str(data), "--out", str(out), "--methods", "random", "--size", "48"]
    proc = _cli(capsys, *args, "--max-files", "50")
    assert "Traceback" not in proc.stderr
    assert "the listing stopped at 50 entries" in proc.stderr and "4,950 more in" in proc.stderr, proc.stderr[-2000:]
    line = _one_line_error(_cli(capsys, *args, "--max-files", "0"), 1)
    assert "--max-files must be at least 1, got 0" in line
