"""Side by side's "SAE feature" view: the bundled demo SAE's feature over two images (the engine's maps), and a pane
whose model lacks the SAE's point saying why."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from app_tools import APP, charts, no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest

from vitviz.capture.run import get_run
from vitviz.sae import load_sae
from vitviz.sae.demo import DEMO_SAE_DIR
from vitviz.sae.run import features

pytestmark = pytest.mark.usefixtures("one_thread")


def _decode(z) -> np.ndarray:
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")]).astype(float)
    return np.array(z, dtype=float)


def _heatmaps(at: AppTest) -> dict[str, dict]:
    """Each chart's title and its heatmap trace."""
    out = {}
    for el in charts(at):
        spec = json.loads(el.proto.spec)
        heat = [t for t in spec["data"] if t["type"] == "heatmap"]
        if heat:
            out[spec["layout"]["title"]["text"].replace("<br>", " ")] = heat[0]
    return out


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("pages/side_by_side.py").run()
    at.radio(key="sbs_view").set_value("feature").run()
    return at


def test_both_panes_draw_the_engines_feature_map_on_two_images():
    from ui.common import EXAMPLES, get_model

    at = _page()
    at.radio(key="sbs_differs").set_value("images").run()
    at.radio(key="sbs_src").set_value("an example").run()
    examples = at.selectbox(key="sbs_example").options
    other = next(e for e in examples if (EXAMPLES / e).read_bytes() != at.session_state.image_bytes)
    at.selectbox(key="sbs_example").set_value(other).run()
    no_trouble(at, "feature view")
    assert at.radio(key="sbs_sae_source").value.startswith("The bundled demo SAE")
    loaded = get_model("demo")
    sae = load_sae(DEMO_SAE_DIR, loaded=loaded)
    images = [
        Image.open(io.BytesIO(b)).convert("RGB")
        for b in (at.session_state.image_bytes, (EXAMPLES / other).read_bytes())
    ]
    fa, fb = (features(get_run(loaded, im), sae) for im in images)
    feature = at.session_state.sbs_feature
    gh, gw = fa.grid
    assert feature == int(fa.values[fa.n_prefix : fa.n_prefix + gh * gw].max(dim=0).values.argmax())  # A's strongest
    for f in (feature, (feature + 7) % sae.d_sae):
        at.number_input(key="sbs_feature").set_value(f).run()
        no_trouble(at, f"feature {f}")
        maps = _heatmaps(at)
        a = next(v for t, v in maps.items() if t.startswith("A. demo: feature"))
        b = next(v for t, v in maps.items() if t.startswith("B. demo: feature"))
        np.testing.assert_allclose(_decode(a["z"]).reshape(gh, gw), fa.map(f), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(_decode(b["z"]).reshape(gh, gw), fb.map(f), rtol=1e-6, atol=1e-7)
        top = max(fa.map(f).max(), fb.map(f).max())  # the shared scale (the default): [0, max of both]
        assert a["zmin"] == b["zmin"] == 0 and a["zmax"] == pytest.approx(top) and b["zmax"] == pytest.approx(top)
        diff = next(v for t, v in maps.items() if t.startswith("A minus B"))
        np.testing.assert_allclose(_decode(diff["z"]).reshape(gh, gw), fa.map(f) - fb.map(f), atol=1e-6)


def test_a_pane_whose_model_lacks_the_saes_point_says_why():
    at = _page()
    at.selectbox(key="sbs_model").set_value("demo-swin").run()
    assert not at.exception and not at.error
    why = [w.value for w in at.warning if w.value.startswith("Pane B (") and "draws no feature map" in w.value]
    assert why and "the SAE reads blocks.2.out, which 'demo-swin' does not have" in why[0]
    titles = list(_heatmaps(at))
    assert any(t.startswith("A. demo: feature") for t in titles)
    assert not any(t.startswith("B.") for t in titles)
    assert any("one pane has no map" in c.value for c in at.caption)


def test_a_typed_folder_that_is_not_an_sae_gets_a_message(tmp_path):
    at = _page()
    at.radio(key="sbs_sae_source").set_value("An SAE folder on this machine").run()
    assert not at.exception and not at.error  # nothing typed yet: a hint, no map
    at.text_input(key="sbs_sae_path").input(str(tmp_path)).run()
    assert not at.exception
    assert any("holds no SAE" in e.value for e in at.error)
