"""AppTest of the Features page's attribution: the engine's numbers, the rank correlation by hand, a pick."""

from __future__ import annotations

import json

import numpy as np
import pytest
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest

from vitviz.capture.run import get_run
from vitviz.capture.targets import Target
from vitviz.sae import load_sae
from vitviz.sae.demo import DEMO_SAE_DIR
from vitviz.sae.run import attribution

pytestmark = pytest.mark.usefixtures("one_thread")


def _spearman(a, b) -> float:
    """Spearman's rho by hand: the Pearson correlation of the ranks (ties: their mean rank)."""

    def ranks(x):
        x = np.asarray(x, np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(1, len(x) + 1)
        for v in np.unique(x):  # ties share their mean rank
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / np.sqrt((ra**2).sum() * (rb**2).sum()))


def _decode(z) -> np.ndarray:
    if isinstance(z, dict):
        import base64

        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).astype(float)
    return np.array(z, dtype=float)


def test_the_pages_attribution_is_the_engines(demo_model):
    from ui.common import get_model
    from vitviz.data.images import read_image

    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.switch_page("pages/features.py").run()
    no_trouble(at, "features page")
    loaded = get_model("demo")
    run = get_run(loaded, read_image(at.session_state.image_bytes).image)
    sae = load_sae(DEMO_SAE_DIR, loaded=loaded)
    target = Target.of_class(at.selectbox(key="sae_attr_target_index").value)
    att = attribution(run, sae, target, exact_top=10)
    assert len(att.exact_ids) == 10

    table = next(d.value for d in at.dataframe if "exact (zeroed)" in d.value.columns)
    assert list(table["feature"]) == [int(i) for i in att.exact_ids]
    np.testing.assert_allclose(table["estimate, one backward (gradient x activation)"], att.estimate[att.exact_ids])
    np.testing.assert_allclose(table["exact (zeroed)"], att.exact)
    fig = next(
        json.loads(c.proto.spec)
        for c in charts(at)
        if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("Features' attribution to")
    )
    np.testing.assert_allclose(_decode(fig["data"][1]["x"]), att.exact)
    # the rank correlation stated on the page is the engine's, and Spearman's by hand
    rho = _spearman(att.estimate[att.exact_ids], att.exact)
    assert att.rank_correlation == pytest.approx(rho, abs=1e-12)
    stated = next(c.value for c in at.caption if "Spearman rank correlation" in c.value)
    assert f"**{rho:.3f}**" in stated and "Estimate, one backward" in stated

    # picking a feature of the list makes it the page's feature: its map
    pick = int(att.exact_ids[3])
    at.selectbox(key="sae_attr_pick").select_index(3).run()  # the list's fourth
    no_trouble(at, "pick")
    assert at.session_state.sae_feature == pick
    assert any(
        json.loads(c.proto.spec)["layout"]["title"]["text"] == f"Feature {pick} at blocks.2.out" for c in charts(at)
    )

    # another target, minus another class, is the engine's too
    c = (target.index + 2) % run.scores.numel()
    at.selectbox(key="sae_attr_target_index").set_value(c).run()
    at.selectbox(key="sae_attr_target_minus").set_value(target.index).run()
    no_trouble(at, "other target")
    box, minus = at.selectbox(key="sae_attr_target_index"), at.selectbox(key="sae_attr_target_minus")
    other = attribution(run, sae, Target.of_class(box.value, minus.value), exact_top=10)
    assert other.target.minus is not None and other.target.index != target.index
    table = next(d.value for d in at.dataframe if "exact (zeroed)" in d.value.columns)
    assert list(table["feature"]) == [int(i) for i in other.exact_ids]
    np.testing.assert_allclose(table["exact (zeroed)"], other.exact)


def test_a_zero_shot_models_labels_are_the_target(demo_model):
    """demo-clip has demo's point and width (blocks.2.out, 96): the demo SAE, typed, reads it; the attribution
    explains a typed label's score, as the engine does on the run with the labels' embeddings."""
    from ui.common import get_model
    from vitviz.data.images import read_image
    from vitviz.models.zeroshot import parse_labels

    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    at.text_area(key="labels_demo-clip").input("circle, star, square").run()
    at.switch_page("pages/features.py").run()
    at.text_input(key="sae_path").input(str(DEMO_SAE_DIR)).run()
    no_trouble(at, "demo-clip")
    box = at.selectbox(key="sae_attr_target_index")
    assert box.label == "Label"
    loaded = get_model("demo-clip")
    labels = parse_labels("circle, star, square", loaded.text.template)
    run = get_run(loaded, read_image(at.session_state.image_bytes).image, labels=labels)
    att = attribution(run, load_sae(DEMO_SAE_DIR, loaded=loaded), Target.of_label(labels, box.value), exact_top=10)
    table = next(d.value for d in at.dataframe if "exact (zeroed)" in d.value.columns)
    assert list(table["feature"]) == [int(i) for i in att.exact_ids]
    np.testing.assert_allclose(table["exact (zeroed)"], att.exact, rtol=1e-5, atol=1e-6)
    stated = next(c.value for c in at.caption if "Spearman rank correlation" in c.value)
    assert f"**{_spearman(att.estimate[att.exact_ids], att.exact):.3f}**" in stated


def _attribution_shown(at) -> bool:
    return any(
        json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("Features' attribution to") for c in charts(at)
    )


def test_a_public_server_attributes_when_the_visitor_asks_and_then_follows_the_target(demo_model, monkeypatch):
    from ui import cached, common

    monkeypatch.setenv("VITVIZ_PUBLIC", "1")
    common.serve_settings.clear()
    try:
        cached.results_cache().clear()
        at = AppTest.from_file(APP, default_timeout=240)
        at.run()
        at.switch_page("pages/features.py").run()
        no_trouble(at, "public features page")
        assert not _attribution_shown(at)
        assert not [k for k in cached.results_cache().sizes() if k[0] == "sae_attribution"]  # nothing computed
        assert any("runs when you ask" in c.value for c in at.caption)
        at.button(key="sae_attr_go").click().run()
        no_trouble(at, "asked")
        assert _attribution_shown(at)
        box = at.selectbox(key="sae_attr_target_index")
        box.set_value((box.value + 1) % len(box.options)).run()  # another class of the same image: no second click
        no_trouble(at, "another target")
        assert _attribution_shown(at)
        assert not [b for b in at.button if b.key == "sae_attr_go"]
    finally:
        common.serve_settings.clear()
