"""``sae train --engine ray``: the collection on Ray writes the local engine's shards byte for byte (a broken file
skipped alike), an interrupted Ray collection resumes to the local engine's, and the trained SAE is the same bit for
bit: 24 demo images and a truncated one, the session's local 2-CPU Ray."""

from __future__ import annotations

import json

import pytest

from vitviz.data.shapes import write_dataset
from vitviz.evaluate.data import read_dataset
from vitviz.sae import train as tr
from vitviz.sae.model import SAEError

# One xdist group: the Ray tests share one cluster. The actors use one thread: so does this.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("one_thread")]
ray = pytest.importorskip("ray")

POINT = "blocks.1.out"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    csv_path = write_dataset(tmp_path_factory.mktemp("sae-ray-data"), n=24, seed=5)
    first = csv_path.read_text().splitlines()[1].split(",")[0]
    good = (csv_path.parent / first).read_bytes()
    (csv_path.parent / "broken.png").write_bytes(good[: len(good) // 3])
    with csv_path.open("a") as fh:
        fh.write("broken.png,circle,1,1,20,20\n")
    return csv_path


def _settings(data, **kw) -> tr.TrainSettings:
    base = dict(
        model="demo",
        point=POINT,
        data=str(data),
        width="2x",
        k=4,
        steps=12,
        batch_tokens=256,
        buffer_tokens=1024,
        held_out=4,
        shard_mb=0.2,  # 3 images a shard: several shards, some cut across batches
        checkpoint_every=5,
        dead_tokens=512,
        image_batch=8,
    )
    base.update(kw)
    return tr.TrainSettings(**base)


def _shards(work) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(work.glob("shard_*.npy"))}


def _manifest(work) -> dict:
    return json.loads((work / tr.MANIFEST).read_text())


def test_ray_collects_the_local_shards_and_trains_the_same_sae(local_ray, tmp_path, data, demo_model):
    local = tr.train(_settings(data), tmp_path / "local", loaded=demo_model, measure=False, keep_work=True)
    got = tr.train(
        _settings(data, engine="ray", actors=2), tmp_path / "ray", loaded=demo_model, measure=False, keep_work=True
    )
    a, b = tmp_path / "local" / tr.WORK_DIR, tmp_path / "ray" / tr.WORK_DIR
    shards = _shards(a)
    assert len(shards) >= 5 and _shards(b) == shards
    assert _manifest(a) == _manifest(b) and len(_manifest(a)["skipped"]) == 1
    assert got.skipped == local.skipped
    for name in ("sae_weights.safetensors", "cfg.json"):  # the weights and the training record, bit for bit
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


def test_an_interrupted_collection_resumes_on_either_engine_to_the_same_shards(local_ray, tmp_path, data, demo_model):
    items = read_dataset(data).items
    settings = {"case": "resume"}

    def stop_after_first_batch(stage, done, total, numbers):
        if stage == "collect" and done >= 8:
            raise KeyboardInterrupt

    def run(folder, engine, **kw):
        more = {"engine": "ray", "actors": 2} if engine == "ray" else {}
        return tr.collect(
            demo_model, POINT, items, tmp_path / folder, settings=settings, image_batch=8, shard_mb=0.2,
            model_source="demo", **more, **kw,
        )  # fmt: skip

    # cut by one engine, finished by the same or the other: the local engine's cut-and-finished shards
    for folder, first, then in (
        ("local", "local", "local"),
        ("ray-local", "ray", "local"),
        ("local-ray", "local", "ray"),
    ):
        with pytest.raises(KeyboardInterrupt):
            run(folder, first, progress=stop_after_first_batch)
        man = tr.Manifest.read(tmp_path / folder)
        assert len(man.done_ids()) == 8 and not man.done
        man = run(folder, then)
        assert man.done and len(man.done_ids()) == len(items) - 1
    for folder in ("ray-local", "local-ray"):
        assert _shards(tmp_path / folder) == _shards(tmp_path / "local"), folder
        assert _manifest(tmp_path / folder) == _manifest(tmp_path / "local"), folder


def test_the_disk_bound_refuses_before_ray_is_asked(tmp_path, data, demo_model, monkeypatch):
    import vitviz.sae.train_ray as train_ray

    calls = []
    monkeypatch.setattr(train_ray, "ray_batches", lambda *a, **k: calls.append(1))
    with pytest.raises(SAEError, match="over --max-disk-mb"):
        tr.train(_settings(data, engine="ray", max_disk_mb=0.001), tmp_path / "w", loaded=demo_model)
    assert calls == []


def test_the_command_line_on_ray_and_its_checks(local_ray, tmp_path, data, capsys):
    from vitviz.__main__ import main
    from vitviz.evaluate.ray_engine import _check_reachable
    from vitviz.evaluate.worker import EvaluateError

    args = ["sae", "train", "--point", POINT, "--data", str(data), "--out", str(tmp_path / "o")]
    rc = main([*args, "--engine", "ray", "--actors", "1", "--steps", "3", "--batch-tokens", "256", "--held-out", "3"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "o" / "sae_weights.safetensors").is_file()
    assert "skipped: labels.csv:26: " in capsys.readouterr().err  # the truncated file, as the local engine says it
    args[-1] = str(tmp_path / "o2")
    assert main([*args, "--actors", "2"]) == 2
    assert "--address and --actors are for --engine ray" in capsys.readouterr().err
    assert main([*args, "--engine", "ray", "--actors", "0"]) == 2
    assert "--actors must be at least 1" in capsys.readouterr().err
    with pytest.raises(SAEError, match="'local' or 'ray'"):
        _settings(data, engine="spark")
    # an address nobody answers at is a message at once (Ray itself retries it for minutes)
    with pytest.raises(EvaluateError, match="could not reach the Ray cluster at '127\\.0\\.0\\.1:1'"):
        _check_reachable("127.0.0.1:1")
    with pytest.raises(EvaluateError, match="is not host:port"):
        _check_reachable("nonsense")


def test_without_ray_the_ray_engine_is_a_message(tmp_path, data, demo_model, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    items = read_dataset(data).items[:3]
    with pytest.raises(SAEError, match=r"needs Ray Data: pip install 'vitviz\[ray\]'"):
        tr.collect(demo_model, POINT, items, tmp_path / "w", settings={}, engine="ray", model_source="demo")
    assert not list((tmp_path / "w").glob("shard_*"))
