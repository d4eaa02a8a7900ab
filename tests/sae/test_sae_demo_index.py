"""The bundled index of the demo SAE: it is the bundled SAE's on the demo model, its examples' images travel with
it, and its numbers are what the SAE gives on those images (checked by encoding them again)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from vitviz.data.images import read_image
from vitviz.models.load import load_model
from vitviz.sae import load_sae
from vitviz.sae.demo import DEMO_INDEX, DEMO_INDEX_DATA, DEMO_SAE_DIR
from vitviz.sae.index import build_index, load_index, make_portable
from vitviz.sae.run import features


@pytest.fixture(scope="module")
def demo():
    loaded = load_model("demo", device="cpu")
    return loaded, load_sae(DEMO_SAE_DIR, loaded=loaded)


def test_the_bundled_index_is_the_bundled_saes_and_its_images_are_beside_it(demo):
    loaded, sae = demo
    ix = load_index(DEMO_INDEX, sae, loaded)  # refuses another SAE (digest), point or model
    assert ix.meta["images"] == DEMO_INDEX_DATA["n"] and ix.meta["top_k"] == 16
    assert ix.meta["data"] == "python -m vitviz demo-data --n 200 --seed 4" and not ix.meta["skipped"]
    assert str(DEMO_INDEX.parent) not in str(ix.meta)  # the header names no folder of the machine that made it
    stored = {p for row in ix.table.column("top_path").to_pylist() for p in row}
    assert stored and all(not Path(p).is_absolute() and p.startswith("images/") for p in stored)
    paths = {e.path for i in range(ix.d_sae) for e in ix.feature(i).examples}
    assert all(Path(p).is_file() and Path(p).parent == DEMO_INDEX.parent / "images" for p in paths)
    assert sum(ix.feature(i).frequency > 0 for i in range(ix.d_sae)) > 100  # a useful share of features is indexed


def test_its_top_examples_are_what_the_sae_gives_on_their_images(demo):
    """For the 8 most frequent features and 8 others: each listed example's activation is the feature's value at
    that token, encoded again from the image file, and the strongest is the largest over its image."""
    from vitviz.capture.run import get_run

    loaded, sae = demo
    ix = load_index(DEMO_INDEX, sae, loaded)
    freq = ix.frequencies()
    active = np.flatnonzero(freq > 0)
    picked = list(np.argsort(-freq)[:8]) + list(np.random.default_rng(0).choice(active, 8, replace=False))
    checked = 0
    for i in map(int, picked):
        entry = ix.feature(i)
        for ex in entry.examples[:3]:
            run = get_run(loaded, read_image(Path(ex.path).read_bytes()).image, gradients=False)
            got = float(features(run, sae).values[ex.token, i])  # tokens in the point's order, prefix first
            assert got == pytest.approx(ex.activation, rel=1e-4, abs=1e-5)
            checked += 1
        first = entry.examples[0]
        run = get_run(loaded, read_image(Path(first.path).read_bytes()).image, gradients=False)
        f = features(run, sae)
        patches = f.values[f.n_prefix :, i].numpy()  # the SAE reads patch tokens only
        assert patches.max() == pytest.approx(first.activation, rel=1e-4)
    assert checked >= 16


def test_a_portable_index_moves_with_its_images(demo, tmp_path):
    from vitviz.data.shapes import make_sample

    loaded, sae = demo
    made = tmp_path / "made"
    (made / "pics").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for i in range(3):
        make_sample(500 + i).image.save(made / "pics" / f"s{i}.png")
    make_sample(503).image.save(outside / "far.png")
    listing = tmp_path / "list.csv"
    listing.write_text(f"file\n{made / 'pics' / 's0.png'}\n{made / 'pics' / 's1.png'}\n")
    listing.write_text(listing.read_text() + f"{made / 'pics' / 's2.png'}\n{outside / 'far.png'}\n")
    build_index(sae, loaded, listing, made / "index.parquet", top_k=4)
    before = load_index(made / "index.parquet", sae, loaded)
    make_portable(made / "index.parquet", data="four shapes")
    moved = tmp_path / "moved"
    shutil.move(str(made), moved)
    after = load_index(moved / "index.parquet", sae, loaded)
    assert after.meta["data"] == "four shapes"
    for i in range(sae.d_sae):
        a, b = before.feature(i).examples, after.feature(i).examples
        assert [(x.token, x.activation) for x in a] == [(y.token, y.activation) for y in b]
        for x, y in zip(a, b, strict=True):
            if "elsewhere" in x.path:  # outside the index's folder: kept as it was
                assert y.path == x.path
            else:
                assert Path(y.path) == moved / "pics" / Path(x.path).name and Path(y.path).is_file()


def test_the_command_rebuilds_the_bundled_index(tmp_path):
    """`vitviz sae index-demo --out DIR` writes the same images and, on this CPU, the bundled index's examples."""
    import pyarrow.parquet as pq

    from vitviz.__main__ import main

    assert main(["sae", "index-demo", "--out", str(tmp_path)]) == 0
    bundled, rebuilt = pq.read_table(DEMO_INDEX), pq.read_table(tmp_path / "index.parquet")
    for name in sorted(p.name for p in (DEMO_INDEX.parent / "images").iterdir()):
        assert (tmp_path / "images" / name).read_bytes() == (DEMO_INDEX.parent / "images" / name).read_bytes()
    assert rebuilt.column("top_path").to_pylist() == bundled.column("top_path").to_pylist()
    np.testing.assert_allclose(
        rebuilt.column("frequency").to_numpy(), bundled.column("frequency").to_numpy(), rtol=0, atol=1e-6
    )
    got = [a for row in rebuilt.column("top_activation").to_pylist() for a in row]
    want = [a for row in bundled.column("top_activation").to_pylist() for a in row]
    np.testing.assert_allclose(got, want, rtol=1e-5)
