"""AppTest of the Features page: the bundled demo SAE, a patch's features, a feature's map, an edit; public mode."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from vitviz.capture.run import get_run
from vitviz.sae import load_sae
from vitviz.sae.demo import DEMO_SAE_DIR
from vitviz.sae.run import FeatureEdit, edited, features


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.switch_page("pages/features.py").run()
    return at


def _decode(z) -> np.ndarray:
    """A Plotly array as serialised: a list, or {dtype, bdata (base64), shape}."""
    if isinstance(z, dict):
        import base64

        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).astype(float)
    return np.array(z, dtype=float)


def _titles(at: AppTest) -> dict[str, dict]:
    out = {}
    for c in charts(at):
        fig = json.loads(c.proto.spec)
        out[fig["layout"]["title"]["text"]] = fig
    return out


def _engine(at: AppTest):
    """What the engine gives for the page's image (the app's default example) with the bundled SAE."""
    from ui.common import get_model
    from vitviz.data.images import read_image

    image = read_image(at.session_state.image_bytes).image
    loaded = get_model("demo")
    run = get_run(loaded, image)
    sae = load_sae(DEMO_SAE_DIR, loaded=loaded)
    return run, sae, features(run, sae)


def test_the_features_page_with_the_bundled_sae(demo_model):
    at = _page()
    no_trouble(at, "features page")
    assert at.radio(key="sae_source").value.startswith("The bundled demo SAE")
    feature = at.session_state.sae_feature
    titles = _titles(at)
    assert f"Feature {feature} at blocks.2.out" in titles
    assert any(t.startswith(f"Feature {feature}: active on") for t in titles)
    assert any(t.startswith(f"Feature {feature} zeroed") for t in titles)
    # the listed features of the picked patch are the engine's
    run, sae, feats = _engine(at)
    token = at.session_state.sae_token
    table = at.dataframe[0].value
    want = feats.token_top(token, 10)
    assert list(table["feature"]) == [i for i, _ in want]
    # the edit's bars are the engine's edited run
    at.radio(key="sae_op").set_value("scale").run()
    no_trouble(at, "scale")
    bars = _titles(at)[f"Feature {feature} scaled by 2"]["data"]
    got = edited(run, sae, [FeatureEdit(feature, "scale", 2.0)]).scores[0].double().softmax(-1).numpy()
    clean = run.scores.double().softmax(-1).numpy()
    order = np.argsort(-clean)
    np.testing.assert_allclose(_decode(bars[0]["x"]), clean[order], atol=1e-6)
    np.testing.assert_allclose(_decode(bars[1]["x"]), got[order], atol=1e-6)
    assert not np.allclose(got, clean)


def test_a_click_picks_the_patch_and_a_number_the_feature(demo_model):
    at = _page()
    at.session_state["sae_map"] = {"selection": {"points": [{"customdata": [1 + 3 * 12 + 4, 3, 4, 0.0, 36.0, 28.0]}]}}
    at.run()
    no_trouble(at, "click")
    assert at.session_state.sae_token == 1 + 3 * 12 + 4
    assert any("row 3, column 4" in c.value for c in at.caption)
    at.number_input(key="sae_feature").set_value(5).run()
    no_trouble(at, "feature 5")
    assert "Feature 5 at blocks.2.out" in _titles(at)


def test_a_typed_folder_that_is_not_an_sae(tmp_path):
    at = _page()
    at.radio(key="sae_source").set_value("An SAE folder on this machine").run()
    at.text_input(key="sae_path").input(str(tmp_path)).run()
    assert not at.exception
    assert any("holds no SAE" in e.value for e in at.error)


@pytest.fixture()
def public(monkeypatch, tmp_path):
    from ui import common

    monkeypatch.setenv("VITVIZ_PUBLIC", "1")
    monkeypatch.chdir(tmp_path)
    common.serve_settings.clear()
    yield
    common.serve_settings.clear()


def test_public_mode_offers_the_bundled_sae_only(public):
    at = _page()
    no_trouble(at, "public")
    assert at.radio(key="sae_source").options == ["The bundled demo SAE"]
    assert not at.text_input  # no typed folder
    assert torch.is_tensor(load_sae(DEMO_SAE_DIR).W_enc)


def test_another_model_is_offered_typed_folders_and_refuses_the_demo_sae(tiny_dirs):
    from app_tools import open_folder

    at = open_folder(tiny_dirs["vit"])
    at.switch_page("pages/features.py").run()
    no_trouble(at, "tiny vit")
    assert at.radio(key="sae_source").options == ["An SAE folder on this machine"]
    at.text_input(key="sae_path").input(str(DEMO_SAE_DIR)).run()
    assert not at.exception
    assert any("blocks.2.out, which" in e.value and "does not have" in e.value for e in at.error)
