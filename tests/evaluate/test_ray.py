"""The Ray engine gives the local engine's rows: 16 demo images, a local 2-CPU Ray, the cheap methods at 48 px."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vitviz.data.shapes import write_dataset
from vitviz.evaluate.results import read_results
from vitviz.evaluate.run import WorkDir, evaluate_dataset
from vitviz.models.load import load_model

# One xdist group: the Ray tests share one cluster. The actors use one thread: so does this.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("one_thread")]
ray = pytest.importorskip("ray")

METHODS = ("attention", "rollout", "random")
SIZE = 48
LISTS = ("fractions", "deletion_curve", "insertion_curve", "head_distance", "head_entropy")


@pytest.fixture(scope="module")
def shapes16(tmp_path_factory) -> Path:
    """16 demo images, plus a truncated image and a box outside its image (both engines must skip them alike)."""
    csv_path = write_dataset(tmp_path_factory.mktemp("shapes16"), n=16, seed=2024)
    first = csv_path.read_text().splitlines()[1].split(",")[0]
    good = (csv_path.parent / first).read_bytes()
    (csv_path.parent / "broken.png").write_bytes(good[: len(good) // 3])
    (csv_path.parent / "copy.png").write_bytes(good)
    with csv_path.open("a") as fh:
        fh.write("broken.png,circle,1,1,20,20\ncopy.png,circle,50,50,100,90\n")
    return csv_path


@pytest.fixture(scope="module")
def local_run(shapes16: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "local.parquet"
    report = evaluate_dataset(
        "demo", shapes16, out, methods=METHODS, size=SIZE, seed=9, loaded=load_model("demo", device="cpu")
    )
    return report, pd.read_parquet(out)


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a["image_id"]) == list(b["image_id"]) and list(a["method"]) == list(b["method"])
    pd.testing.assert_frame_equal(a.drop(columns=list(LISTS)), b.drop(columns=list(LISTS)), rtol=1e-6)
    for c in LISTS:
        for x, y in zip(a[c], b[c], strict=True):
            np.testing.assert_allclose(
                np.array(x.tolist(), dtype=float), np.array(y.tolist(), dtype=float), rtol=1e-6, equal_nan=True
            )


def test_ray_gives_the_local_rows(local_ray, local_run, shapes16: Path, tmp_path: Path) -> None:
    local, want = local_run
    assert local.evaluated == 16 and len(local.skipped) == 2
    out = tmp_path / "ray.parquet"
    report = evaluate_dataset("demo", shapes16, out, methods=METHODS, size=SIZE, seed=9, engine="ray", ray_actors=2)
    assert report.evaluated == 16 and report.new == 16
    assert sorted(map(str, report.skipped)) == sorted(map(str, local.skipped))
    assert_same_rows(pd.read_parquet(out), want)
    assert read_results(out).meta["engine"] == "ray"


def test_a_run_started_locally_finishes_on_ray(local_ray, local_run, shapes16: Path, tmp_path: Path) -> None:
    out = tmp_path / "mixed.parquet"

    def stop(done: int, total: int) -> None:
        if done == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate_dataset(
            "demo",
            shapes16,
            out,
            methods=METHODS,
            size=SIZE,
            seed=9,
            chunk_images=5,
            progress=stop,
            loaded=load_model("demo", device="cpu"),
        )
    assert len(WorkDir(out).done_ids()) == 6
    report = evaluate_dataset("demo", shapes16, out, methods=METHODS, size=SIZE, seed=9, engine="ray")
    assert report.new == 16 - 6 and report.evaluated == 16
    got = pd.read_parquet(out)
    assert not got.duplicated(["image_id", "method"]).any()
    assert_same_rows(got, local_run[1])
