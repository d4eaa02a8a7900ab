"""AppTest of the Activation patching page: estimate at once, exact on request, the lens slider, a label target."""

from __future__ import annotations

import numpy as np
from app_tools import APP, charts, no_trouble
from streamlit.testing.v1 import AppTest


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.switch_page("pages/patching.py").run()
    return at


def _decode(z) -> np.ndarray:
    """A Plotly array as serialised: a list, or {dtype, bdata (base64), shape}."""
    if isinstance(z, dict):
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")]).astype(float)
    return np.array(z, dtype=float)


def _charts(at: AppTest) -> dict[str, dict]:
    import json

    out = {}
    for c in charts(at):
        fig = json.loads(c.proto.spec)
        out[fig["layout"]["title"]["text"]] = fig
    return out


def test_patching_page_estimate_exact_and_lens():
    at = _page()
    no_trouble(at, "patching page")
    titles = list(_charts(at))
    assert any(t.startswith("Residual patching (estimate)") for t in titles), titles
    assert any(t.startswith("Head patching (estimate)") for t in titles)
    assert any(t.startswith("Per-patch lens, after block 3") for t in titles)  # the demo's last block is block 3
    at.select_slider(key="patch_lens_layer").set_value(0).run()
    assert any(t.startswith("Per-patch lens, embeddings") for t in _charts(at))
    at.button[0].click().run()  # Compute exact patching
    no_trouble(at, "exact")
    charts = _charts(at)
    grid = next(v for k, v in charts.items() if k.startswith("Residual patching (exact)"))
    z = _decode(grid["data"][0]["z"])
    assert z.shape[0] == 4 and np.isfinite(z).all()
    assert any(m.label == "Work" for m in at.metric)
    at.selectbox(key="patch_target_minus").set_value(at.selectbox(key="patch_target_minus").options[1]).run()
    no_trouble(at, "difference target")
    assert "minus" in " ".join(c.value for c in at.caption)


def test_patching_page_with_zero_shot_labels_and_a_hierarchical_model():
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    at.switch_page("pages/patching.py").run()
    no_trouble(at, "demo-clip")
    titles = list(_charts(at))
    assert any(t.startswith("Residual patching (estimate)") for t in titles), titles
    assert at.selectbox(key="patch_target_index").label == "Label"
    said = [i.value for i in [*at.info, *at.warning, *at.caption]]
    assert any("label" in i.value.lower() for i in at.info), said  # no per-patch lens for label scores, said why
    at.selectbox(key="model_pick").set_value("demo-swin").run()
    no_trouble(at, "demo-swin")
    titles = list(_charts(at))
    assert any(t.startswith("Head patching (estimate)") for t in titles), titles
    assert not any(t.startswith("Residual patching") for t in titles)
    assert any("token grid and width change" in i.value for i in at.info)


def test_patching_page_pattern_and_path_grids_equal_the_engine():
    """The two head grids, on request, are the engine's pattern_patching / path_patching of the page's two images."""
    from app_tools import example_image

    from vitviz.causal import path_patching, pattern_patching
    from vitviz.models.load import load_model

    at = _page()
    button = next(b for b in at.button if b.label == "Compute pattern and path patching")
    button.click().run()
    no_trouble(at, "pattern and path")
    charts = _charts(at)
    model = load_model("demo", device="cpu")
    target = example_image(at.session_state["image_name"])
    source = example_image(at.selectbox(key="patch_source_pick").value)
    for title, grid in (
        ("Attention-pattern patching", pattern_patching),
        ("Path patching to the read-out", path_patching),
    ):
        fig = next(v for k, v in charts.items() if k.startswith(title))
        ref = grid(model, target, source)
        np.testing.assert_allclose(_decode(fig["data"][0]["z"]), ref.values - ref.clean, atol=1e-4)
