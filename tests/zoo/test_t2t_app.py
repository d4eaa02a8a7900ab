"""Every page of the app opens on a tiny T2T-ViT folder (performer and token-transformer layers) without errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from app_tools import PAGES, no_trouble, open_folder

from vitviz.zoo.t2t import T2TViTConfig, T2TViTForImageClassification

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from transformers import ViTImageProcessor

    root = tmp_path_factory.mktemp("t2t-app")
    out = {}
    for tt in ("performer", "transformer"):
        torch.manual_seed(0)
        labels = {0: "zero", 1: "one", 2: "two"}
        cfg = T2TViTConfig(
            tokens_type=tt,
            image_size=48,
            embed_dim=16,
            depth=2,
            num_heads=2,
            mlp_ratio=2.0,
            token_dim=8,
            id2label=labels,
            label2id={v: k for k, v in labels.items()},
        )
        T2TViTForImageClassification(cfg).save_pretrained(root / tt)
        ViTImageProcessor(size={"height": 48, "width": 48}).save_pretrained(root / tt)
        out[tt] = root / tt
    return out


@pytest.mark.parametrize("tt", ["performer", "transformer"])
def test_every_page_opens_on_t2t(folders, tt):
    at = open_folder(folders[tt])
    no_trouble(at, "home")
    assert at.session_state.model_name == str(folders[tt])  # the tiny T2T-ViT, not the demo model
    for page in PAGES:
        at.switch_page(page).run()
        no_trouble(at, page)
        assert at.session_state.model_name == str(folders[tt])


@pytest.mark.parametrize("tt", ["performer", "transformer"])
def test_the_heads_page_says_when_a_map_is_the_performers_implied_attention(folders, tt):
    at = open_folder(folders[tt])
    at.session_state.layer = 0  # the first tokens-to-token layer
    at.switch_page("pages/heads.py").run()
    no_trouble(at, "heads")
    said = any("random-feature kernel implies" in c.value for c in at.caption)
    assert said == (tt == "performer")
