"""AppTest of the Features page's feature card (an index over a data set), finding features by a label, and the
operator's list of SAEs and indexes in public mode."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from vitviz.data.shapes import make_sample
from vitviz.sae import load_sae
from vitviz.sae.demo import DEMO_SAE_DIR
from vitviz.sae.model import SAEConfig, SparseAutoencoder, save_sae


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.switch_page("pages/features.py").run()
    return at


def _titles(at: AppTest) -> dict[str, dict]:
    return {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec) for c in charts(at)}


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory):
    """An index of the bundled SAE over six demo images."""
    from vitviz.models.load import load_model
    from vitviz.sae.index import build_index

    root = tmp_path_factory.mktemp("card")
    for i in range(6):
        make_sample(300 + i).image.save(root / f"s{i}.png")
    loaded = load_model("demo")
    build_index(load_sae(DEMO_SAE_DIR, loaded=loaded), loaded, root, root / "index.parquet", top_k=4)
    return root / "index.parquet"


def test_the_card_from_a_typed_index(demo_index, demo_model):
    from vitviz.sae.card import feature_effects, readout_for, top_effects

    at = _page()
    at.radio(key="sae_index_source").set_value("An index file on this machine").run()
    at.text_input(key="sae_index_path").input(str(demo_index)).run()
    no_trouble(at, "card")
    f = at.session_state.sae_feature
    titles = _titles(at)
    assert any(t.startswith(f"Feature {f} over the data set: active on") for t in titles)
    assert any(t.startswith(f"Feature {f}: its") and "strongest tokens" in t for t in titles) or any(
        f"Feature {f} is never active" in i.value for i in at.info
    )
    bars = titles[f"Feature {f}: direct effect, most positive and negative"]["data"][0]
    sae = load_sae(DEMO_SAE_DIR)
    pos, neg = top_effects(
        feature_effects(sae, readout_for(demo_model, "blocks.2.out"), [f])[0],
        [demo_model.id2label[i] for i in range(len(demo_model.id2label))],
    )
    assert list(bars["y"]) == [n for n, _ in pos] + [n for n, _ in reversed(neg)]


def test_an_index_of_another_sae_is_refused_on_the_page(demo_index, tmp_path):
    other = tmp_path / "other.parquet"
    other.write_bytes(b"not parquet")
    at = _page()
    at.radio(key="sae_index_source").set_value("An index file on this machine").run()
    at.text_input(key="sae_index_path").input(str(other)).run()
    assert not at.exception
    assert any("not a Parquet file" in e.value for e in at.error)


@pytest.fixture()
def public(monkeypatch, tmp_path):
    from ui import common

    def setup(**env):
        monkeypatch.setenv("VITVIZ_PUBLIC", "1")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(tmp_path)
        common.serve_settings.clear()

    yield setup
    common.serve_settings.clear()


def test_public_mode_offers_the_bundled_and_the_operators_indexes_only(public, demo_index):
    public(VITVIZ_SAE_INDEXES=str(demo_index))
    at = _page()
    no_trouble(at, "public card")
    assert at.radio(key="sae_index_source").options == ["The bundled demo index", "One of this server's indexes"]
    at.radio(key="sae_index_source").set_value("One of this server's indexes").run()
    no_trouble(at, "listed index")
    assert at.selectbox(key="sae_index_listed").options == ["index.parquet"]  # its name, not the server's folders
    assert not at.text_input  # nothing typed: no SAE folder, no index file
    assert any("over the data set: active on" in t for t in _titles(at))
    assert not any(str(demo_index.parent) in c.value for c in at.caption)


def test_public_mode_without_indexes_says_so_where_the_bundled_one_does_not_apply(public, tmp_path):
    folder = save_sae(load_sae(DEMO_SAE_DIR), tmp_path / "served" / "shapes-sae")  # the same SAE, another place
    public(VITVIZ_SAES=str(folder))
    at = _page()
    no_trouble(at, "public, bundled SAE")
    assert at.radio(key="sae_index_source").options == ["The bundled demo index"]
    at.radio(key="sae_source").set_value("One of this server's SAEs").run()
    no_trouble(at, "public, listed SAE")
    assert any("offers no feature index" in i.value for i in at.info)


def test_finding_features_by_a_label_on_the_demo_clip(tmp_path):
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import encode_labels, parse_labels
    from vitviz.sae.card import features_for_label, readout_for

    sae = SparseAutoencoder(SAEConfig(d_in=96, d_sae=32, k=4, point="blocks.1.out", tokens="patches"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    folder = save_sae(sae.eval(), tmp_path / "clip-sae")
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    at.switch_page("pages/features.py").run()
    at.radio(key="sae_source").set_value("An SAE folder on this machine").run()
    at.text_input(key="sae_path").input(str(folder)).run()
    at.text_input(key="sae_label_search").input("circle").run()
    no_trouble(at, "label search")
    loaded = load_model("demo-clip")
    template = loaded.text.template
    t = encode_labels(loaded.model, loaded.text, parse_labels("circle", template))[0]
    want = features_for_label(load_sae(folder), readout_for(loaded, "blocks.1.out"), t, top=15)
    fig = _titles(at)['Features whose direct effect points toward "circle"']
    assert list(fig["data"][0]["y"]) == [f"feature {i}" for i, _ in want]
    at.selectbox(key="sae_label_pick").set_value(want[0][0]).run()
    no_trouble(at, "picked")
    assert at.session_state.sae_feature == want[0][0]
    assert np.isfinite([c for _, c in want]).all()


def test_public_mode_offers_the_operators_saes(public, tmp_path):
    sae = load_sae(DEMO_SAE_DIR)
    folder = save_sae(sae, tmp_path / "served" / "shapes-sae")
    public(VITVIZ_SAES=str(folder))
    at = _page()
    no_trouble(at, "public saes")
    assert at.radio(key="sae_source").options == ["The bundled demo SAE", "One of this server's SAEs"]
    at.radio(key="sae_source").set_value("One of this server's SAEs").run()
    no_trouble(at, "listed sae")
    assert at.selectbox(key="sae_listed").options == ["shapes-sae"]
    assert not at.text_input


def test_a_listed_sae_or_index_that_fails_names_no_server_folder(public, tmp_path):
    broken = tmp_path / "srv" / "secret-place" / "broken-sae"
    broken.mkdir(parents=True)
    (broken / "cfg.json").write_text("{not json")
    bad_index = tmp_path / "srv" / "secret-place" / "bad.parquet"
    bad_index.write_bytes(b"not parquet")
    public(VITVIZ_SAES=str(broken), VITVIZ_SAE_INDEXES=str(bad_index))
    at = _page()
    assert not at.exception
    at.radio(key="sae_source").set_value("One of this server's SAEs").run()
    assert not at.exception
    messages = [e.value for e in at.error]
    assert messages and all("secret-place" not in m and str(tmp_path) not in m for m in messages), messages
    at.radio(key="sae_source").set_value("The bundled demo SAE").run()
    at.radio(key="sae_index_source").set_value("One of this server's indexes").run()
    messages = [e.value for e in at.error]
    assert messages and all("secret-place" not in m for m in messages), messages


def test_the_bundled_demo_index_is_the_first_choice_and_draws_the_card(demo_model):
    at = _page()
    no_trouble(at, "bundled index")
    assert at.radio(key="sae_index_source").value == "The bundled demo index"
    f = at.session_state.sae_feature
    titles = _titles(at)
    assert any(t.startswith(f"Feature {f} over the data set: active on") for t in titles)
    crops = [t for t in titles if t.startswith(f"Feature {f}: its") and "strongest tokens" in t]
    assert crops or any(f"Feature {f} is never active" in i.value for i in at.info)
    assert any("200 shape images" in c.value for c in at.caption)
    assert not any(c.value.startswith("Left out:") for c in at.caption)  # every example's image was read
