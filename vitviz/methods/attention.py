"""``attention``: the raw attention of the last block, head mean (the map most tools show first).

Definition (``docs/definitions.md#maps`` and ``docs/definitions.md#global-map``, where there is no CLS
token): the last block's global map, ``A[L, :, q, P:]`` averaged over heads, where
``q`` is ``vitviz.analysis.blocks.global_query``: the CLS row where the last stage has
a CLS token, the pooling head's probe row where the model pools with an attention
head (SigLIP, AIMv2), else the pooled query (the mean of the grid tokens' rows: Swin,
PvT v2, I-JEPA, MobileViT). Windowed and reduced-key blocks give the row on their own
grid (``vitviz.analysis.blocks.row_map``), which the base places on the first stage's
grid by nearest cell. The values are the float32 head mean kept before storage, i.e.
``head_maps(block, global_query(block)).values.mean(0)`` without float16 rounding.
Class-agnostic: the class is recorded, not used.
"""

from __future__ import annotations

import numpy as np

from vitviz.analysis.blocks import global_query, row_map, select
from vitviz.methods.base import Inputs, Method

__all__ = ["Attention"]


class Attention(Method):
    name = "attention"
    title = "Attention (last block)"
    definition = "raw attention of the last block from its global query (CLS / pooling probe / pooled query), head mean"
    class_specific = False
    uses_capture = True

    def compute(self, inputs: Inputs, target, seed: int) -> np.ndarray:
        block = inputs.capture.blocks[-1]
        return row_map(block.geometry, select(block), global_query(block)).values  # (gh_L, gw_L) on the key grid
