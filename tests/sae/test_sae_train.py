"""Training: reproducible, resumable without recomputing, bounded; the measures against a brute-force reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitviz.capture.run import get_run
from vitviz.data.shapes import write_dataset
from vitviz.evaluate.data import load_item, read_dataset
from vitviz.sae import train as tr
from vitviz.sae.load import load_sae
from vitviz.sae.measure import measure
from vitviz.sae.model import SAEConfig, SAEError, SparseAutoencoder
from vitviz.sae.run import reconstruction_edit

POINT = "blocks.1.out"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("sae-data"), n=24, seed=5)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
        shard_mb=0.2,  # several shards from 20 images
        checkpoint_every=5,
        dead_tokens=512,
        image_batch=8,
    )
    base.update(kw)
    return tr.TrainSettings(**base)


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "sae_weights.safetensors"))


def test_same_seed_same_weights_and_the_folder_it_writes(tmp_path, data, demo_model, one_thread):
    a = tr.train(_settings(data), tmp_path / "a", loaded=demo_model)
    tr.train(_settings(data), tmp_path / "b", loaded=demo_model, measure=False)
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c = tr.train(_settings(data, seed=1), tmp_path / "c", loaded=demo_model, measure=False)
    assert not torch.equal(_weights(tmp_path / "c")["W_enc"], wa["W_enc"])
    assert c.sae.cfg.d_sae == 2 * 96 and a.training["images"] == 20 and a.training["held_out_images"] == 4
    # a SAELens folder with vitviz's keys, metrics beside it, and no work folder left
    sae = load_sae(tmp_path / "a", loaded=demo_model)
    assert sae.cfg.point == POINT and sae.cfg.tokens == "patches" and sae.cfg.k == 4 and sae.cfg.model == "demo"
    assert sae.cfg.training["steps"] == 12 and sae.cfg.training["seed"] == 0
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["images"] == 4 and metrics["tokens"] == 4 * 144 and metrics["l0"] <= 4
    assert not (tmp_path / "a" / tr.WORK_DIR).exists()
    with pytest.raises(SAEError, match="already holds a trained SAE"):
        tr.train(_settings(data), tmp_path / "a", loaded=demo_model)


def test_an_interrupted_run_resumes_to_the_same_weights_without_recomputing(
    tmp_path, data, demo_model, one_thread, monkeypatch
):
    whole = tr.train(_settings(data), tmp_path / "whole", loaded=demo_model, measure=False)
    with pytest.raises(KeyboardInterrupt):
        tr.train(_settings(data), tmp_path / "cut", loaded=demo_model, measure=False, stop_after=7)
    work = tmp_path / "cut" / tr.WORK_DIR
    ckpt = torch.load(work / tr.CHECKPOINT, weights_only=True)
    assert int(ckpt["step"]) == 7 and ckpt["rng"].dtype == torch.uint8
    shards = sorted(work.glob("shard_*.npy"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    calls = []
    real = tr.point_values
    monkeypatch.setattr(tr, "point_values", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = tr.train(_settings(data), tmp_path / "cut", loaded=demo_model, measure=False, keep_work=True)
    assert calls == []  # the activations were not collected again
    assert [p.stat().st_mtime_ns for p in shards] == stamps
    for k, v in _weights(tmp_path / "whole").items():
        assert torch.equal(v, _weights(tmp_path / "cut")[k]), k
    assert resumed.training["steps"] == whole.training["steps"]


def test_an_interrupted_collection_keeps_what_it_collected(tmp_path, data, demo_model):
    items = read_dataset(data).items[:12]
    settings = {"case": "collect"}

    def stop_after_first_batch(stage, done, total, numbers):
        if stage == "collect" and done >= 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tr.collect(
            demo_model, POINT, items, tmp_path / "w", settings=settings, image_batch=8, progress=stop_after_first_batch
        )
    man = tr.Manifest.read(tmp_path / "w")
    assert len(man.done_ids()) == 8 and not man.done
    man = tr.collect(demo_model, POINT, items, tmp_path / "w", settings=settings, image_batch=8)
    assert man.done and man.done_ids() == {it.image_id for it in items}
    got = np.concatenate([np.load(tmp_path / "w" / n) for n in sorted(man.shards)])
    # the same tokens as the images' own runs, image by image in data-set order: patch tokens of blocks.1.out
    want = np.concatenate([get_run(demo_model, load_item(it)).activation(POINT)[0, 1:].numpy() for it in items])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(SAEError, match="other settings"):
        tr.collect(demo_model, POINT, items, tmp_path / "w", settings={"case": "other"})


def test_the_disk_bound_refuses_before_any_forward(tmp_path, data, demo_model, monkeypatch):
    calls = []
    monkeypatch.setattr(tr, "point_values", lambda *a, **k: calls.append(1) or None)
    monkeypatch.setattr(tr, "point_layout", lambda *a, **k: ((96, 96), 145, 1, 144, 96))
    items = read_dataset(data).items
    with pytest.raises(SAEError, match="over --max-disk-mb"):
        tr.collect(demo_model, POINT, items, tmp_path / "w", settings={}, max_disk_mb=0.001)
    assert calls == []


def test_folding_the_scale_into_the_weights():
    sae = SparseAutoencoder(SAEConfig(d_in=5, d_sae=7, k=2))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_()
    x = torch.randn(9, 5)
    folded = tr._fold(sae, 2.5)
    torch.testing.assert_close(folded.encode(x), sae.encode(2.5 * x))
    torch.testing.assert_close(folded(x), sae(2.5 * x) / 2.5)


def test_width_and_split():
    assert tr.parse_width("16x", 96) == 1536 and tr.parse_width("300", 96) == 300
    with pytest.raises(SAEError, match="--width"):
        tr.parse_width("wide", 96)
    train_items, held = tr.split_items(list(range(20)), 5, seed=0)
    assert len(held) == 5 and sorted(train_items + held) == list(range(20))
    assert tr.split_items(list(range(20)), 5, seed=0) == (train_items, held)


def test_measures_against_a_brute_force_reference(data, demo_model):
    sae = SparseAutoencoder(SAEConfig(d_in=96, d_sae=64, k=5, point=POINT, tokens="patches"))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    sae.eval().requires_grad_(False)
    items = read_dataset(data).items[:5]
    m = measure(sae, demo_model, items, batch=2)
    xs, hats, kls, agree, acts = [], [], [], [], []
    for it in items:
        run = get_run(demo_model, load_item(it))
        x = run.activation(POINT)[0, 1:].double()
        f = sae.encode(x.float())
        xs.append(x)
        hats.append(sae.decode(f).double())
        acts.append(f > 0)
        spliced = run.edited([reconstruction_edit(sae, scope=tuple(range(1, 145)))]).scores[0].double()
        p, q = torch.softmax(run.scores.double(), -1), torch.softmax(spliced, -1)
        kls.append(float((p * (p.log() - q.log())).sum()))
        agree.append(int(run.scores.argmax()) == int(spliced.argmax()))
    x, x_hat, on = torch.cat(xs), torch.cat(hats), torch.cat(acts)
    ev = 1 - float(((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())
    assert m.tokens == 5 * 144 and m.scope == "patches"
    assert m.explained_variance == pytest.approx(ev, abs=1e-5)
    assert m.l0 == pytest.approx(float(on.sum(1).float().mean()))
    assert m.dead_fraction == pytest.approx(float((on.sum(0) == 0).float().mean()))
    assert m.dense_fraction == pytest.approx(float((on.float().mean(0) > 0.1).float().mean()))
    assert m.splice_mean_kl == pytest.approx(np.mean(kls), rel=1e-3, abs=1e-7)
    assert m.splice_top1_agreement == pytest.approx(np.mean(agree))


def test_the_command_line(tmp_path, data, capsys):
    from vitviz.__main__ import main

    out = tmp_path / "cli"
    args = ["sae", "train", "--point", POINT, "--data", str(data), "--out", str(out), "--width", "64", "--k", "4"]
    rc = main([*args, "--steps", "3", "--batch-tokens", "256", "--held-out", "3"])
    assert rc == 0, capsys.readouterr().err
    assert (out / "cfg.json").is_file() and (out / "metrics.json").is_file()
    rc = main(["sae", "measure", "--sae", str(out), "--data", str(data), "--limit", "3"])
    assert rc == 0 and '"explained_variance"' in capsys.readouterr().out
    rc = main(["sae", "measure", "--sae", str(tmp_path / "none"), "--data", str(data)])
    assert rc == 1 and "does not exist" in capsys.readouterr().err


def test_a_full_disk_is_a_message_and_the_rerun_goes_on(tmp_path, data, demo_model, monkeypatch):
    import errno

    items = read_dataset(data).items[:12]
    real = np.save
    calls = []

    def full(path, arr):
        calls.append(path)
        if len(calls) == 2:  # the second shard finds the disk full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, arr)

    monkeypatch.setattr(np, "save", full)
    with pytest.raises(SAEError, match=r"No space left on device.*1 shards written before are kept"):
        tr.collect(demo_model, POINT, items, tmp_path / "w", settings={}, image_batch=4, shard_mb=0.05)
    assert not list((tmp_path / "w").glob("*.tmp.npy"))
    monkeypatch.setattr(np, "save", real)
    man = tr.collect(demo_model, POINT, items, tmp_path / "w", settings={}, image_batch=4, shard_mb=0.05)
    assert man.done and man.done_ids() == {it.image_id for it in items}
    (tmp_path / "w" / tr.MANIFEST).write_text("{not json")
    with pytest.raises(SAEError, match="cannot be read"):
        tr.collect(demo_model, POINT, items, tmp_path / "w", settings={})
