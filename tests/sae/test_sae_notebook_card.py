"""show(run, "feature-card", ...): the Features page's card figures from the notebook (fast: the demo model, the
bundled SAE, an index of six images)."""

from __future__ import annotations

import numpy as np
import pytest

from vitviz.capture.run import get_run
from vitviz.data.shapes import make_sample
from vitviz.notebook import NotebookError, show
from vitviz.sae import load_sae
from vitviz.sae.card import feature_effects, readout_for, top_effects
from vitviz.sae.demo import DEMO_SAE_DIR
from vitviz.sae.index import build_index, load_index
from vitviz.sae.run import features

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def card_setup(tmp_path_factory):
    from vitviz.models.load import load_model

    root = tmp_path_factory.mktemp("nb-card")
    for i in range(6):
        make_sample(400 + i).image.save(root / f"s{i}.png")
    loaded = load_model("demo", device="cpu")
    sae = load_sae(DEMO_SAE_DIR, loaded=loaded)
    build_index(sae, loaded, root, root / "index.parquet", top_k=4)
    run = get_run(loaded, make_sample(7).image)
    return run, sae, root / "index.parquet"


def test_the_cards_figures_are_the_engines(card_setup):
    run, sae, path = card_setup
    index = load_index(path, sae, run.loaded)
    feats = features(run, sae)
    gh, gw = feats.grid
    strongest = int(feats.values[feats.n_prefix : feats.n_prefix + gh * gw].max(dim=0).values.argmax())
    # the default part is the top examples, of the feature most active on the run's image
    fig = show(run, "feature-card", sae=DEMO_SAE_DIR, index=path)
    e = index.feature(strongest)
    assert fig.layout.title.text == f"Feature {strongest}: its {len(e.examples)} strongest tokens over the data set"
    hist = show(run, "feature-card", sae=sae, index=index, feature=3, part="histogram")
    assert hist.layout.title.text.startswith("Feature 3 over the data set")
    h = np.asarray(index.feature(3).histogram, float)
    used = np.nonzero(h)[0]
    np.testing.assert_allclose(np.asarray(hist.data[0].y, float), h[used[0] : used[-1] + 1])  # the bins in use
    eff = show(run, "feature-card", sae=sae, feature=3, part="effect")  # no index needed
    readout = readout_for(run.loaded, "blocks.2.out")
    pos, neg = top_effects(feature_effects(sae, readout, [3])[0], list(readout.names), n=8)
    np.testing.assert_allclose(np.asarray(eff.data[0].x, float), [v for _, v in pos + list(reversed(neg))])


def test_bad_options_say_what_they_take(card_setup):
    run, sae, path = card_setup
    with pytest.raises(NotebookError, match="part is one of examples, histogram, effect"):
        show(run, "feature-card", sae=sae, index=path, part="hist")
    with pytest.raises(NotebookError, match="needs index="):
        show(run, "feature-card", sae=sae)
    with pytest.raises(NotebookError, match="needs sae="):
        show(run, "feature-card", index=path)
    with pytest.raises(NotebookError, match=r"index is a \.parquet file"):
        show(run, "feature-card", sae=sae, index=3)
    with pytest.raises(NotebookError, match="feature"):
        show(run, "feature-card", sae=sae, index=path, feature=10**6)
    with pytest.raises(NotebookError, match="takes sae, index, feature, part"):
        show(run, "feature-card", sae=sae, opacity=0.5)
