"""The work ``benchmarks.zeroshot --siglip-profile`` counts for SigLIP's text tower equals what PyTorch's own FLOP
counter sees in the tower's matrix products (a tiny SigLIP text tower, random weights)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.zeroshot import _text_tower_flops  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("last_only", [True, False])
def test_counted_flops_equal_torch_flop_counter(last_only):
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import SiglipTextConfig, SiglipTextModel

    from vitviz.models.zeroshot import _last_token_features

    cfg = SiglipTextConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=16,
        projection_size=24,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    text = SiglipTextModel(cfg).eval()
    ids = torch.randint(0, 50, (5, 16))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        if last_only:
            _last_token_features(getattr(text, "text_model", text), ids)
        else:
            text(input_ids=ids)
    assert counter.get_total_flops() == _text_tower_flops(cfg, 5, 16, last_only)
