"""Every page of the app opens on a tiny DAT folder (window, shifted-window and deformable blocks) without an error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from app_tools import PAGES, charts, no_trouble, open_folder
from test_dat import save_tiny_dat

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dat_dir(tmp_path_factory) -> Path:
    return save_tiny_dat(tmp_path_factory.mktemp("dat-app") / "tiny")


def test_every_page_opens_on_dat(dat_dir):
    at = open_folder(dat_dir)
    no_trouble(at)
    assert at.session_state.model_name == str(dat_dir)
    assert any("stage 3" in c.value for c in at.caption)  # the overview lists the stages
    for page in PAGES[1:]:  # the overview is open
        at.switch_page(page).run()
        no_trouble(at)
    at.switch_page("pages/layers.py").run()
    titles = " ".join(str(json.loads(f.proto.spec)["layout"].get("title", {}).get("text", "")) for f in charts(at))
    assert "Rollout of" in titles and "Relevance for" in titles  # deformable blocks enter through their spread maps


def test_heads_page_draws_a_deformable_blocks_sampled_keys(dat_dir):
    from vitviz.capture.deformable import deformable_samples, query_points
    from vitviz.data.images import read_image
    from vitviz.models.load import load_model
    from vitviz.record import POOLED

    at = open_folder(dat_dir)
    loaded = load_model(str(dat_dir), device="cpu")
    image = read_image(at.session_state.image_bytes).image
    samples = {s.block: s for s in deformable_samples(loaded, image, loaded.default_size)}
    block = min(samples)
    at.session_state.layer = block
    at.switch_page("pages/heads.py").run()
    no_trouble(at)

    def deformable() -> dict:
        figs = [json.loads(f.proto.spec) for f in charts(at)]
        return next(f for f in figs if "sampled keys" in str(f["layout"].get("title", {}).get("text", "")))

    fig = deformable()
    want = query_points(samples[block], at.session_state.head, POOLED).weights  # the pooled query: the default
    marker = next(t for t in fig["data"] if t.get("type") == "scatter" and "marker" in t)
    got = marker["marker"]["color"]
    if isinstance(got, dict):  # plotly's binary form
        import base64

        got = np.frombuffer(base64.b64decode(got["bdata"]), dtype=got["dtype"])
    np.testing.assert_allclose(np.asarray(got, dtype=float), want, rtol=1e-5)
    n_plain = len(fig["data"]) + len(fig["layout"].get("annotations", []))
    at.checkbox(key="deformable_arrows").check().run()
    no_trouble(at)
    fig = deformable()
    assert len(fig["data"]) + len(fig["layout"].get("annotations", [])) > n_plain  # the offsets as arrows
