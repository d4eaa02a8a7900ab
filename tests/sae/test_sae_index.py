"""The feature index (``vitviz sae index``): top-k against a brute force, frequency and mean, and refusals."""

from __future__ import annotations

import types

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
    with pytest.raises(FeatureIndexError, match="the model 'demo', not 'other'"):
        load_index(out, _unit_sae(), types.SimpleNamespace(name="other"))
    with pytest.raises(FeatureIndexError, match=r"indexes the point .blocks\.2\.out."):
        load_index(out, _unit_sae(point="blocks.1.out"), demo_model)


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
