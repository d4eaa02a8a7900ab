"""``evaluate_dataset`` with the local engine and ``python -m vitviz evaluate``: rows, resumability, bad inputs.

The demo model at 48 px (a 6 x 6 grid) with the cheap methods keeps every run to seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vitviz.__main__ import main
from vitviz.data.shapes import write_dataset
from vitviz.evaluate import evaluate_methods
from vitviz.evaluate.data import load_item, read_dataset, scale_box
from vitviz.evaluate.results import SCHEMA, image_seed, read_results
from vitviz.evaluate.run import EvaluateError, Evaluator, RunConfig, WorkDir, _settings, evaluate_dataset
from vitviz.methods import MethodError
from vitviz.models.load import load_model

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("attention", "rollout", "random")
SIZE = 48


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu")


@pytest.fixture()
def demo_csv(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "shapes", n=5, seed=424242)


def _run(demo, data, out, **kw):
    kw = {"methods": METHODS, "size": SIZE, "seed": 3, "loaded": demo, **kw}
    return evaluate_dataset("demo", data, out, **kw)


def _rows(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path).sort_values(["image_id", "method"]).reset_index(drop=True)


def test_rows_are_evaluate_methods_numbers(demo, demo_csv: Path) -> None:
    item = read_dataset(demo_csv).items[2]
    rows = Evaluator(RunConfig("demo", METHODS, size=SIZE, seed=3), demo).evaluate_item(item)
    image = load_item(item)
    box = scale_box(item.box, image.size, (SIZE, SIZE))
    ref = evaluate_methods(demo, image, METHODS, box=box, size=SIZE, seed=image_seed(3, item.image_id))
    assert [r["method"] for r in rows] == list(METHODS)
    for r in rows:
        f = ref[r["method"]]
        assert r["deletion_area"] == f.deletion_area and r["insertion_area"] == f.insertion_area
        assert r["deletion_curve"] == pytest.approx(f.deletion) and r["peak_in_box"] == f.peak_in_box
        assert r["class_index"] == f.class_index and r["image_id"] == item.image_id
        assert (r["input_height"], r["input_width"]) == (SIZE, SIZE) and r["box_x1"] == pytest.approx(box[2])
        assert np.array(r["head_distance"]).shape == (4, 4)  # the demo ViT: 4 blocks of 4 heads


def test_interrupted_run_resumes_without_duplicates_or_half_rows(demo, demo_csv: Path, tmp_path: Path) -> None:
    whole = _run(demo, demo_csv, tmp_path / "whole.parquet")
    assert whole.ok and whole.evaluated == whole.new == 5
    assert not WorkDir(tmp_path / "whole.parquet").root.exists()  # removed once everything is in

    out = tmp_path / "resumed.parquet"
    seen: list[tuple[int, int]] = []

    def stop_after_three(done: int, total: int) -> None:
        seen.append((done, total))
        if done == 3:
            raise KeyboardInterrupt  # as Ctrl-C would, right after the third image

    with pytest.raises(KeyboardInterrupt):
        _run(demo, demo_csv, out, chunk_images=2, progress=stop_after_three)
    work = WorkDir(out)
    assert not out.exists()  # no results file until the run is complete
    assert len(work.part_files()) == 2  # a chunk of 2 images, then the third, flushed on the way out
    assert work.done_ids() == {i.image_id for i in read_dataset(demo_csv).items[:3]}
    (work.parts / ".part-x.parquet.1234.tmp").write_bytes(b"PAR1 half a part")  # a write cut short: ignored

    seen.clear()
    again = _run(demo, demo_csv, out, chunk_images=2, progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (3, 5) and seen[-1] == (5, 5)
    assert again.ok and again.evaluated == 5 and again.new == 2
    got, want = _rows(out), _rows(tmp_path / "whole.parquet")
    assert not got.duplicated(["image_id", "method"]).any() and len(got) == 5 * len(METHODS)
    pd.testing.assert_frame_equal(got, want)
    assert list(pd.read_parquet(out)["image_id"].drop_duplicates()) == [
        i.image_id for i in read_dataset(demo_csv).items
    ]


def test_other_settings_do_not_mix_into_an_unfinished_run(demo, demo_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"

    def stop(done: int, total: int) -> None:
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(demo, demo_csv, out, progress=stop)
    with pytest.raises(EvaluateError, match=r"other settings \(seed: 3 then, 4 now\).*delete that folder"):
        _run(demo, demo_csv, out, seed=4)


def test_bad_images_are_skipped_counted_and_retried(demo, tmp_path: Path) -> None:
    csv_path = write_dataset(tmp_path / "d", n=3, seed=77)
    lines = csv_path.read_text().splitlines()
    good = (tmp_path / "d" / lines[1].split(",")[0]).read_bytes()
    (tmp_path / "d" / "broken.png").write_bytes(good[: len(good) // 2])
    (tmp_path / "d" / "copy.png").write_bytes(good)
    lines += ["broken.png,circle,1,1,20,20", "gone.png,circle,1,1,20,20", "copy.png,x,0,0,97,50"]
    csv_path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.parquet"
    report = _run(demo, csv_path, out)
    assert report.evaluated == 3 and len(report.skipped) == 3 and report.listed == 6
    reasons = " | ".join(str(s) for s in report.skipped)
    assert "labels.csv:6: no such file" in reasons  # at listing
    assert "labels.csv:5 (broken.png): The image file is damaged or truncated" in reasons  # at load
    assert "labels.csv:7 (copy.png): the box (0, 0, 97, 50) lies outside the 96 x 96 image" in reasons
    res = read_results(out)
    assert res.num_images == 3 and len(res.meta["skipped"]) == 3 and report.work_kept is not None

    (tmp_path / "d" / "broken.png").write_bytes(good)  # fixed: a rerun evaluates it, and only it
    again = _run(demo, csv_path, out)
    assert again.new == 1 and again.evaluated == 4 and len(again.skipped) == 2


def test_refusals_before_any_image(demo, demo_csv: Path, tmp_path: Path) -> None:
    with pytest.raises(MethodError, match="unknown explanation method 'nope'"):
        _run(demo, demo_csv, tmp_path / "r.parquet", methods=["attention", "nope"])
    with pytest.raises(EvaluateError, match="unknown engine"):
        _run(demo, demo_csv, tmp_path / "r.parquet", engine="spark")
    with pytest.raises(EvaluateError, match=r"--address .* with --engine ray"):
        _run(demo, demo_csv, tmp_path / "r.parquet", address="auto")
    with pytest.raises(EvaluateError, match="is a folder"):
        _run(demo, demo_csv, tmp_path)
    assert not list(tmp_path.glob(".*vitviz-work"))


def test_cli_end_to_end(demo_csv: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli.parquet"
    args = ["evaluate", "--data", str(demo_csv), "--out", str(out), "--methods", "attention,random", "--size", "48"]
    assert main([*args, "--limit", "2"]) == 0
    cap = capsys.readouterr()
    assert "wrote 2 images x 2 methods" in cap.out and "attention" in cap.out and "random" in cap.out
    (vs,) = read_results(out).versus()  # the paired comparison is printed as the file gives it
    line = next(x for x in cap.out.splitlines() if x.startswith("attention") and x.count("%") == 2)
    assert f"{vs.difference_mean:.4f} +- {vs.difference_se:.4f}" in line
    shares = f"{100 * vs.better_share:.0f} / {100 * vs.tie_share:.0f} / {100 * vs.worse_share:.0f} %"
    assert line.endswith(f"{shares}{vs.sign_p:>9.2g}")
    assert "evaluate: 100%" in cap.err and "2/2" in cap.err and "Traceback" not in cap.err
    assert read_results(out).num_images == 2

    (demo_csv.parent / "extra.txt").write_text("not an image")  # a folder with a non-image file
    assert (
        main(
            [
                "evaluate",
                "--data",
                str(demo_csv.parent),
                "--out",
                str(tmp_path / "f.parquet"),
                "--methods",
                "random",
                "--size",
                "48",
            ]
        )
        == 1
    )
    cap = capsys.readouterr()
    assert "skipped 2 of 7 images" in cap.err and "extra.txt: not an image file" in cap.err
    assert "labels.csv: not an image file" in cap.err and "pass the CSV itself as --data" in cap.err
    assert read_results(tmp_path / "f.parquet").num_images == 5


def test_cli_bad_input_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("path,label\nx.png,cat\n")
    proc = subprocess.run(
        [sys.executable, "-m", "vitviz", "evaluate", "--data", str(bad), "--out", str(tmp_path / "r.parquet")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "python -m vitviz: error:" in proc.stderr and "lacks the column file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_results_have_the_schema(demo, demo_csv: Path, tmp_path: Path) -> None:
    _run(demo, demo_csv, tmp_path / "r.parquet", limit=1)
    res = read_results(tmp_path / "r.parquet")
    assert res.table.schema.names == SCHEMA.names
    assert res.meta["methods"] == list(METHODS) and res.meta["seed"] == 3 and res.meta["engine"] == "local"
    assert res.meta["images"] == 1 and res.meta["size"] == SIZE
    assert res.meta["insertion_start"] == "mean"  # the default: docs/evaluate.md#insertion-starts


def test_insertion_start_is_a_setting_recorded_in_the_results(demo, demo_csv: Path, tmp_path: Path) -> None:
    item = read_dataset(demo_csv).items[0]
    image, seed = load_item(item), image_seed(3, item.image_id)
    rows = Evaluator(RunConfig("demo", ("rollout",), size=SIZE, seed=3, insertion_start="noise"), demo).evaluate_item(
        item
    )
    ref = evaluate_methods(demo, image, ["rollout"], size=SIZE, seed=seed, insertion_start="noise")["rollout"]
    assert rows[0]["insertion_area"] == ref.insertion_area and rows[0]["deletion_area"] == ref.deletion_area
    out = tmp_path / "grey.parquet"
    args = ["evaluate", "--data", str(demo_csv), "--out", str(out), "--methods", "random", "--size", "48"]
    assert main([*args, "--limit", "1", "--insertion-start", "grey"]) == 0
    assert read_results(out).meta["insertion_start"] == "grey"
    with pytest.raises(EvaluateError, match="unknown insertion start 'black'"):
        _run(demo, demo_csv, tmp_path / "b.parquet", insertion_start="black")
    # an unfinished run keeps its start: another start does not mix its rows in
    blur = RunConfig("demo", METHODS, size=SIZE, seed=3, insertion_start="blur")
    WorkDir(tmp_path / "u.parquet").open(_settings(blur, read_dataset(demo_csv)))
    with pytest.raises(EvaluateError, match="insertion_start: 'blur' then, 'mean' now"):
        _run(demo, demo_csv, tmp_path / "u.parquet")
    with pytest.raises(SystemExit):
        main([*args, "--insertion-start", "black"])


def test_relevance_from_a_later_block_in_evaluate(demo, demo_csv: Path, tmp_path: Path, capsys) -> None:
    from vitviz.methods import explain

    out = tmp_path / "last.parquet"
    args = ["evaluate", "--data", str(demo_csv), "--out", str(out), "--methods", "relevance", "--size", "48"]
    assert main([*args, "--limit", "1", "--relevance-from-block", "-1"]) == 0
    res = read_results(out)
    assert res.meta["relevance_from_block"] == -1
    item = read_dataset(demo_csv).items[0]
    image = load_item(item)
    row = pd.read_parquet(out).iloc[0]
    ref = evaluate_methods(demo, image, ["relevance"], size=SIZE, box=scale_box(item.box, image.size, (SIZE, SIZE)))
    last = explain(demo, image, "relevance", target=int(row["class_index"]), size=SIZE, from_block=-1)
    every = explain(demo, image, "relevance", target=int(row["class_index"]), size=SIZE)
    assert not np.allclose(last.values, every.values)
    assert row["deletion_area"] != ref["relevance"].deletion_area  # the default (all blocks) scores another map
    capsys.readouterr()
    assert main([*args, "--limit", "1", "--relevance-from-block", "4"]) == 1  # the demo ViT has blocks 0..3
    assert "0..3" in capsys.readouterr().err


def test_zero_shot_labels_are_the_classes(demo_csv: Path, tmp_path: Path, capsys) -> None:
    import torch

    from vitviz.capture.forward import input_size_for, preprocess

    clip = load_model("demo-clip", device="cpu")
    names = ["circle", "square", "triangle", "cross", "star"]
    out = tmp_path / "zs.parquet"
    report = evaluate_dataset(
        "demo-clip", demo_csv, out, labels=",".join(names), methods=("rollout", "random"), loaded=clip, limit=3
    )
    assert report.ok and report.evaluated == 3
    res = read_results(out)
    assert res.meta["labels"] == names and res.meta["template"] == "a photo of a {}."
    rows = _rows(out)
    prompts = [f"a photo of a {n}." for n in names]
    tok = clip.text.tokenizer(prompts, padding=True, return_tensors="pt")
    for item in read_dataset(demo_csv, limit=3).items:
        image = load_item(item)
        pixels, _ = preprocess(clip, [image], input_size_for(clip, None, image.size))
        with torch.no_grad():  # the model's own forward, both towers
            own = clip.model(
                input_ids=tok["input_ids"], attention_mask=tok["attention_mask"], pixel_values=pixels
            ).logits_per_image[0]
        probs = torch.softmax(own.double(), 0).numpy()
        k = int(probs.argmax())
        mine = rows[rows.image_id == item.image_id]
        assert set(mine.class_index) == {k} and set(mine.class_label) == {names[k]}
        for _, r in mine.iterrows():  # deletion and insertion follow that label's probability
            assert r["deletion_curve"][0] == pytest.approx(probs[k], abs=1e-4)
            assert r["insertion_curve"][-1] == pytest.approx(probs[k], abs=1e-4)
        assert set(mine.correct) == {names[k] == item.label}
    # the CLI: unknown words are named, a model without text tower is a message
    args = ["evaluate", "--model", "demo-clip", "--data", str(demo_csv), "--limit", "1", "--methods", "random"]
    assert main([*args, "--out", str(tmp_path / "cat.parquet"), "--labels", "cat,circle"]) == 0
    assert "does not know 'cat'" in capsys.readouterr().err
    assert main([*args[:2], "demo", *args[3:], "--out", str(tmp_path / "d.parquet"), "--labels", "cat"]) == 1
    assert "has no text tower" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "n.parquet")]) == 1
    assert "--labels" in capsys.readouterr().err


def test_run_config_with_labels_survives_the_trip_to_ray_actors() -> None:
    cfg = RunConfig("demo-clip", ("rollout",), labels=("circle", "star"), template="a {}.", relevance_from_block=-1)
    back = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg
    assert back.label_set().prompts == ("a circle.", "a star.")
    assert RunConfig("demo", ("rollout",)).label_set() is None
