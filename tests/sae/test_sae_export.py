"""``export --sae`` and ``vitviz.show(run, "features", sae=...)`` with the bundled demo SAE."""

from __future__ import annotations

import numpy as np
import pytest

from vitviz.capture.run import get_run
from vitviz.data.shapes import make_sample
from vitviz.sae import load_sae
from vitviz.sae.demo import DEMO_SAE_DIR
from vitviz.sae.run import features


@pytest.fixture(scope="module")
def star(tmp_path_factory):
    path = tmp_path_factory.mktemp("sae-export") / "star.png"
    make_sample(2).image.save(path)
    return path


def test_export_writes_the_sae_keys(tmp_path, star, demo_model):
    from vitviz.__main__ import main

    assert main(["export", "--sae", str(DEMO_SAE_DIR), "--features", "3,17", "--out", str(tmp_path), str(star)]) == 0
    feats = features(get_run(demo_model, make_sample(2).image), load_sae(DEMO_SAE_DIR))
    with np.load(tmp_path / "star.npz", allow_pickle=False) as z:
        assert str(z["sae_point"]) == "blocks.2.out"
        ids, vals = feats.top()
        assert z["sae_top_ids"].shape == (145, 16) and z["sae_top_ids"].dtype == np.int32
        assert z["sae_top_values"].dtype == np.float32
        np.testing.assert_array_equal(z["sae_top_ids"], ids)
        np.testing.assert_allclose(z["sae_top_values"], vals, rtol=1e-6, atol=1e-6)
        assert z["sae_feature_ids"].tolist() == [3, 17]
        assert z["sae_feature_maps"].shape == (2, 12, 12) and z["sae_feature_maps"].dtype == np.float32
        np.testing.assert_allclose(z["sae_feature_maps"][1], feats.map(17), rtol=1e-6, atol=1e-6)
        assert len(z["token_kinds"]) == z["sae_top_ids"].shape[0]


def test_export_default_features_and_refusals(tmp_path, star, capsys):
    from vitviz.__main__ import main

    assert main(["export", "--sae", str(DEMO_SAE_DIR), "--out", str(tmp_path / "a"), str(star)]) == 0
    with np.load(tmp_path / "a" / "star.npz", allow_pickle=False) as z:
        assert 1 <= len(z["sae_feature_ids"]) <= 8 and z["sae_feature_maps"].shape[0] == len(z["sae_feature_ids"])
    assert (
        main(["export", "--sae", str(DEMO_SAE_DIR), "--features", "3,x", "--out", str(tmp_path / "b"), str(star)]) == 2
    )
    assert "--features takes feature numbers" in capsys.readouterr().err
    assert (
        main(["export", "--sae", str(DEMO_SAE_DIR), "--features", "9999", "--out", str(tmp_path / "c"), str(star)]) == 2
    )
    assert main(["export", "--features", "3", "--out", str(tmp_path / "d"), str(star)]) == 2
    assert "need --sae" in capsys.readouterr().err


def test_an_sae_of_another_model_is_refused_before_any_image(tmp_path, star, tiny_dirs, capsys):
    from vitviz.__main__ import main

    out = tmp_path / "tiny"
    rc = main(["export", "--model", str(tiny_dirs["vit"]), "--sae", str(DEMO_SAE_DIR), "--out", str(out), str(star)])
    assert rc == 1 and "blocks.2.out" in capsys.readouterr().err
    assert not out.exists()


def test_show_features(demo_model):
    import vitviz
    from vitviz.notebook import NotebookError

    run = vitviz.run("demo", make_sample(2).image)
    fig = vitviz.show(run, "features", sae=str(DEMO_SAE_DIR), feature=403)
    feats = features(run, load_sae(DEMO_SAE_DIR))
    z = np.array(fig.data[1].z, dtype=float)
    np.testing.assert_allclose(z, feats.map(403), rtol=1e-6, atol=1e-6)
    assert "Feature 403" in fig.layout.title.text
    with pytest.raises(NotebookError, match="needs sae="):
        vitviz.show(run, "features")
    with pytest.raises(NotebookError, match="feature"):
        vitviz.show(run, "features", sae=str(DEMO_SAE_DIR), feature=10_000)
