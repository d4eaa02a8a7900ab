"""The feature index (``vitviz sae index``): top-k against a brute force, frequency and mean, and refusals."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from vitviz.__main__ import main
from vitviz.capture.run import get_run
from vitviz.data.shapes import make_sample
from vitviz.sae.index import INDEX_SCHEMA, FeatureIndexError, build_index, load_index, sae_digest
from vitviz.sae.model import SAEConfig, SparseAutoencoder, save_sae

POINT = "blocks.2.out"
N_IMAGES = 5
K = 3


def _unit_sae(tokens="patches", point=POINT) -> SparseAutoencoder:
    """Feature i reads coordinate i of the point's value: f_i = ReLU(x_i) (hand-checkable)."""
    sae = SparseAutoencoder(SAEConfig(d_in=96, d_sae=4, activation="relu", k=None, point=point, tokens=tokens))
    with torch.no_grad():
        for i in range(4):
            sae.W_enc[i, i] = 1.0
            sae.W_dec[i, i] = 1.0
    return sae.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("index-data")
    for i in range(N_IMAGES):
        make_sample(100 + i).image.save(folder / f"img{i}.png")
    (folder / "broken.png").write_bytes(b"not a png")
    return folder


@pytest.fixture(scope="module")
def built(demo_model, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("index") / "index.parquet"
    report = build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2)
    return out, report


def _brute(demo_model, data, tokens="patches"):
    """Every image's features, one run per image: (values (N, 4), image ids, token ids) in data set order."""
    vals, ids, toks = [], [], []
    for i in range(N_IMAGES):
        from PIL import Image

        x = get_run(demo_model, Image.open(data / f"img{i}.png").convert("RGB")).activation(POINT)[0]
        t = np.arange(1, 145) if tokens == "patches" else np.arange(x.shape[0])
        vals.append(torch.relu(x[t][:, :4]).numpy())
        ids += [f"img{i}.png"] * len(t)
        toks += list(t)
    return np.concatenate(vals), np.array(ids), np.array(toks)


def test_top_k_frequency_and_mean_match_a_brute_force(demo_model, data, built):
    out, report = built
    assert report.images == N_IMAGES and report.tokens == N_IMAGES * 144
    assert report.skipped_total == 1 and "broken.png" in report.skipped[0][0]
    index = load_index(out, _unit_sae(), demo_model)
    f, ids, toks = _brute(demo_model, data)
    for i in range(4):
        e = index.feature(i)
        col = f[:, i]
        order = np.lexsort((np.arange(len(col)), -col))[:K]  # largest first, ties: the earlier token
        order = order[col[order] > 0]
        assert [x.image_id for x in e.examples] == list(ids[order])
        assert [x.token for x in e.examples] == list(toks[order])
        np.testing.assert_allclose([x.activation for x in e.examples], col[order], rtol=1e-5)
        assert [(x.row, x.col) for x in e.examples] == [divmod(int(t) - 1, 12) for t in toks[order]]
        assert e.frequency == pytest.approx(float((col > 0).mean()))
        assert e.mean_activation == pytest.approx(float(col.mean()), rel=1e-5)
        assert e.histogram.sum() == int((col > 0).sum())
        assert e.examples[0].path.endswith(e.examples[0].image_id)


def test_the_batch_size_does_not_matter_and_every_token_can_be_indexed(demo_model, data, tmp_path, built):
    one = build_index(_unit_sae(), demo_model, data, tmp_path / "one.parquet", top_k=K, batch=1)
    assert one.images == N_IMAGES
    a = pq.read_table(built[0]).drop(["top_path"])
    b = pq.read_table(tmp_path / "one.parquet").drop(["top_path"])
    assert a.select(["top_image_id", "top_token"]).equals(b.select(["top_image_id", "top_token"]))
    every = build_index(_unit_sae("all"), demo_model, data, tmp_path / "all.parquet", top_k=K)
    assert every.tokens == N_IMAGES * 145
    e = load_index(tmp_path / "all.parquet", _unit_sae("all"), demo_model).feature(0)
    f, _, _ = _brute(demo_model, data, "all")
    assert e.frequency == pytest.approx(float((f[:, 0] > 0).mean()))


def test_the_file_reads_as_plain_parquet(built):
    out, _ = built
    table = pq.read_table(out)
    assert table.schema.names == INDEX_SCHEMA.names and table.num_rows == 4
    import json

    meta = json.loads(pq.read_schema(out).metadata[b"vitviz"])
    assert meta["format"] == "vitviz sae index" and meta["point"] == POINT and meta["model"] == "demo"
    assert meta["sae_digest"] == sae_digest(_unit_sae()) and meta["top_k"] == K
    assert meta["skipped_total"] == 1 and len(meta["histogram_edges"]) == 65


def test_an_index_of_another_sae_model_or_point_is_refused(demo_model, built):
    out, _ = built
    other = _unit_sae()
    with torch.no_grad():
        other.W_enc[5, 0] = 0.5
    with pytest.raises(FeatureIndexError, match="another SAE"):
        load_index(out, other, demo_model)
    with pytest.raises(FeatureIndexError, match=r"indexes the point .blocks\.2\.out."):
        load_index(out, _unit_sae(point="blocks.1.out"), demo_model)


def test_the_model_is_recognised_by_its_weights_not_its_name(demo_model, built, tmp_path):
    import copy
    import dataclasses
    import shutil

    from vitviz.models.digest import weights_digest
    from vitviz.sae.index import make_portable

    out, _ = built
    assert pq.read_table(out).schema.metadata  # the header records the weights' digest
    assert json.loads(pq.read_table(out).schema.metadata[b"vitviz"])["model_digest"] == weights_digest(demo_model)
    copied = dataclasses.replace(demo_model, name="/elsewhere/a-copy-of-demo")  # the same weights, another name
    assert load_index(out, _unit_sae(), copied).meta["model"] == "demo"
    retrained = copy.deepcopy(demo_model.model)
    with torch.no_grad():
        next(retrained.parameters()).view(-1)[0] += 1e-3
    same_name = dataclasses.replace(demo_model, model=retrained)  # "demo", other weights
    with pytest.raises(FeatureIndexError, match="built on other weights"):
        load_index(out, _unit_sae(), same_name)
    old = tmp_path / "old.parquet"  # a file written before the digest: the name decides
    shutil.copy(out, old)
    make_portable(old, model_digest=None)
    assert load_index(old, _unit_sae(), same_name).meta["model"] == "demo"
    with pytest.raises(FeatureIndexError, match="the model 'demo', not 'other'"):
        load_index(old, _unit_sae(), dataclasses.replace(demo_model, name="other"))


def test_corrupt_or_foreign_files_are_refused_with_a_message(demo_model, built, tmp_path):
    out, _ = built
    sae = _unit_sae()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 garbage")
    with pytest.raises(FeatureIndexError, match="not a Parquet file"):
        load_index(bad, sae, demo_model)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(out.read_bytes()[: len(out.read_bytes()) // 2])
    with pytest.raises(FeatureIndexError, match="not a Parquet file"):
        load_index(cut, sae, demo_model)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pq.read_table(out).replace_schema_metadata({}), plain)
    with pytest.raises(FeatureIndexError, match="not a vitviz SAE index"):
        load_index(plain, sae, demo_model)
    table = pq.read_table(out)
    hist = table.column("histogram").to_pylist()
    hist[1] = hist[1][:10]
    short = table.set_column(table.schema.get_field_index("histogram"), table.schema.field("histogram"), pa.array(hist))
    pq.write_table(short, tmp_path / "short.parquet")
    with pytest.raises(FeatureIndexError, match="histograms do not have the 64 bins"):
        load_index(tmp_path / "short.parquet", sae, demo_model)
    with pytest.raises(FeatureIndexError, match="does not exist"):
        load_index(tmp_path / "none.parquet", sae, demo_model)
    with pytest.raises(FeatureIndexError, match="is a folder"):
        load_index(tmp_path, sae, demo_model)


def test_the_command(data, tmp_path, capsys):
    folder = save_sae(_unit_sae(), tmp_path / "sae")
    rc = main(
        [
            "sae",
            "index",
            "--sae",
            str(folder),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "i.parquet"),
            "--top-k",
            "2",
            "--limit",
            "3",
        ]
    )
    got = capsys.readouterr()
    assert rc == 0 and "4 features over 2 images" in got.out and "broken.png" in got.err
    assert (tmp_path / "i.parquet").is_file()
    rc = main(
        [
            "sae",
            "index",
            "--sae",
            str(folder),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "r.parquet"),
            "--actors",
            "2",
        ]
    )
    assert rc == 2 and "--address and --actors are for --engine ray" in capsys.readouterr().err
    (tmp_path / "notes.parquet").write_text("mine")
    rc = main(["sae", "index", "--sae", str(folder), "--data", str(data), "--out", str(tmp_path / "notes.parquet")])
    assert rc == 1 and "is not a vitviz SAE index" in capsys.readouterr().err


# --- resuming an interrupted run ---------------------------------------------------------------------------------


def _stop_at(n_done: int):
    """A progress callback that interrupts the run (as Ctrl-C does) once ``n_done`` items are done."""

    def progress(stage, done, total, info):
        if done == n_done:
            raise KeyboardInterrupt

    return progress


def _encoded_places(monkeypatch, fail_on_call: int | None = None) -> list[int]:
    """Record the data-set places each batch encodes (optionally crashing on the ``fail_on_call``-th batch)."""
    import vitviz.sae.index as index_mod

    seen: list[int] = []
    calls: list = []
    real = index_mod.encode_batch

    def spy(sae, loaded, point, pics, places, layout):
        calls.append(places)
        if len(calls) == fail_on_call:
            raise RuntimeError("the disk is full")
        seen.extend(places)
        return real(sae, loaded, point, pics, places, layout)

    monkeypatch.setattr(index_mod, "encode_batch", spy)
    return seen


def _same_file(a, b) -> None:
    import json

    assert pq.read_table(a).equals(pq.read_table(b))
    ma, mb = (json.loads(pq.read_schema(p).metadata[b"vitviz"]) for p in (a, b))
    ma.pop("created"), mb.pop("created")
    assert ma == mb


def test_an_interrupted_run_resumes_to_the_file_an_uninterrupted_one_writes(
    demo_model, data, tmp_path, built, monkeypatch
):
    from vitviz.sae.index import partial_path

    out = tmp_path / "index.parquet"
    with pytest.raises(KeyboardInterrupt):
        build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2, progress=_stop_at(4))
    assert not out.exists() and partial_path(out).is_file()
    with np.load(partial_path(out), allow_pickle=False) as z:  # safe formats only
        assert set(z.files) >= {"header", "extra", "places", "top_val", "top_pos", "hist"}
    seen = _encoded_places(monkeypatch)
    report = build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2)
    assert report.resumed == 4 and min(seen) >= 4  # nothing done is encoded again
    assert report.images == N_IMAGES and report.skipped_total == 1
    assert not partial_path(out).exists()
    _same_file(out, built[0])


def test_a_crash_keeps_the_batches_done_and_resumes(demo_model, data, tmp_path, built, monkeypatch):
    from vitviz.sae.index import partial_path

    out = tmp_path / "index.parquet"
    seen = _encoded_places(monkeypatch, fail_on_call=2)
    with pytest.raises(RuntimeError, match="disk is full"):
        build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2)
    assert seen == [1]  # place 0 is broken.png (skipped); the 2nd batch crashed
    assert partial_path(out).is_file()
    monkeypatch.undo()
    report = build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=1)  # another batch size is fine
    assert report.resumed == 2
    _same_file(out, built[0])


def test_a_checkpoint_of_another_run_or_a_damaged_one_is_refused(demo_model, data, tmp_path, built):
    from vitviz.sae.index import partial_path

    out = tmp_path / "index.parquet"
    with pytest.raises(KeyboardInterrupt):
        build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2, progress=_stop_at(2))
    with pytest.raises(FeatureIndexError, match=r"another run \(top_k: 3 there, 2 now\).*--overwrite"):
        build_index(_unit_sae(), demo_model, data, out, top_k=2, batch=2)
    other = _unit_sae()
    with torch.no_grad():
        other.W_enc[5, 0] = 0.5
    with pytest.raises(FeatureIndexError, match=r"another run \(sae_digest"):
        build_index(other, demo_model, data, out, top_k=K, batch=2)
    with pytest.raises(FeatureIndexError, match=r"another run \(data"):
        build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2, limit=3)
    with pytest.raises(FeatureIndexError, match="the Ray engine does not resume"):
        build_index(_unit_sae(), demo_model, data, out, top_k=K, engine="ray", sae_path="sae")
    assert partial_path(out).is_file()  # refusals leave it as it was
    whole = partial_path(out).read_bytes()
    for damaged in (b"not a checkpoint", whole[: len(whole) // 2], whole[:-30]):
        partial_path(out).write_bytes(damaged)
        with pytest.raises(FeatureIndexError, match=r"cannot be read \(.*\): run with --overwrite .*or delete"):
            build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2)
    report = build_index(_unit_sae(), demo_model, data, out, top_k=K, batch=2, overwrite=True)
    assert report.resumed == 0 and not partial_path(out).exists()
    _same_file(out, built[0])


def test_a_checkpoint_with_wrong_arrays_is_refused_and_the_command_resumes(demo_model, data, tmp_path, capsys):
    from vitviz.sae.index import partial_path

    out = tmp_path / "i.parquet"
    with pytest.raises(KeyboardInterrupt):
        build_index(_unit_sae(), demo_model, data, out, top_k=2, batch=1, limit=3, progress=_stop_at(2))
    with np.load(partial_path(out), allow_pickle=False) as z:
        arrays = {name: z[name] for name in z.files}
    good = partial_path(out).read_bytes()
    with open(partial_path(out), "wb") as fh:
        np.savez(fh, **{**arrays, "top_val": arrays["top_val"][:1]})
    with pytest.raises(FeatureIndexError, match=r"is damaged \(its top_val has the wrong shape"):
        build_index(_unit_sae(), demo_model, data, out, top_k=2, batch=1, limit=3)
    partial_path(out).write_bytes(good)
    folder = save_sae(_unit_sae(), tmp_path / "sae")
    args = ["sae", "index", "--sae", str(folder), "--data", str(data), "--out", str(out), "--top-k", "2"]
    assert main([*args, "--limit", "3"]) == 0
    got = capsys.readouterr()
    assert "resumed: an interrupted run had done the first 2 items" in got.err and "over 2 images" in got.out
    assert not partial_path(out).exists()
