"""The per-patch logit lens of a hierarchical model (issue 32.5): its last stage's rows, on that stage's grid.

Reference: Swin reads out through a per-token LayerNorm, the mean over tokens and a linear head, so the mean of
the last row of the per-patch lens over the patches is the model's own logit (head(mean LN) = mean head(LN)).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_image

from vitviz.capture.forward import capture
from vitviz.causal import patch_lens
from vitviz.models.load import load_model


def test_a_swins_per_patch_lens_reads_its_last_stage(hier_dirs):
    loaded = load_model(str(hier_dirs["swin"]), device="cpu")
    image = random_image(3, (64, 64))
    cap = capture(loaded, image)
    c = int(np.argmax(cap.logits))
    lens = patch_lens(loaded, image, target=c)
    last = cap.stages[-1]
    assert lens.shape == (cap.num_blocks + 1, *last.grid)
    defined = np.isfinite(lens).reshape(len(lens), -1).all(axis=1)
    in_last = [False] + [cap.blocks[b].stage == last.index for b in range(cap.num_blocks)]
    assert defined.tolist() == in_last  # the embeddings and earlier stages: left empty (NaN)
    assert float(lens[-1].mean()) == pytest.approx(float(cap.logits[c]), rel=1e-4, abs=1e-5)
