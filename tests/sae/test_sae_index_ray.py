"""The Ray engine gives the local engine's feature index: 10 demo images and a broken file, a local 2-CPU Ray."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch

from vitviz.data.shapes import make_sample
from vitviz.sae.index import build_index
from vitviz.sae.model import SAEConfig, SparseAutoencoder, save_sae

# One xdist group: the Ray tests share one cluster. The actors use one thread: so does this.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("one_thread")]
ray = pytest.importorskip("ray")


def test_ray_gives_the_local_index(local_ray, demo_model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(10):
        make_sample(400 + i).image.save(data / f"i{i:02d}.png")
    (data / "broken.png").write_bytes((data / "i00.png").read_bytes()[:100])
    sae = SparseAutoencoder(SAEConfig(d_in=96, d_sae=40, k=4, point="blocks.2.out", tokens="patches"))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    folder = save_sae(sae.eval().requires_grad_(False), tmp_path / "sae")
    local = build_index(sae, demo_model, data, tmp_path / "local.parquet", model_source="demo", top_k=5, batch=3)
    got = build_index(
        sae,
        demo_model,
        data,
        tmp_path / "ray.parquet",
        model_source="demo",
        top_k=5,
        engine="ray",
        sae_path=folder,
        actors=2,
    )
    assert got.images == local.images == 10 and got.tokens == local.tokens
    assert sorted(got.skipped) == sorted(local.skipped) and len(local.skipped) == 1
    a, b = pq.read_table(tmp_path / "local.parquet"), pq.read_table(tmp_path / "ray.parquet")
    for name in ("feature", "top_image_id", "top_token", "top_row", "top_col", "histogram"):
        assert a.column(name).equals(b.column(name)), name
    for name in ("frequency", "mean_activation", "max_activation"):
        assert a.column(name).to_pylist() == pytest.approx(b.column(name).to_pylist(), rel=1e-5), name
    meta = json.loads(pq.read_schema(tmp_path / "ray.parquet").metadata[b"vitviz"])
    assert meta["engine"] == "ray" and meta["images"] == 10
