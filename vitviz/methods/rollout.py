"""``rollout``: attention rollout (Abnar & Zuidema 2020) of the readout row, on the first stage's grid.

Definition (``docs/definitions.md#attention-rollout`` and ``docs/definitions.md#rollout-through-stages``):
per block, heads fused by their mean, ``B = rownorm(0.5 F + 0.5 I)``, ``R = B_L ... B_1``
with stage merges; the map is the readout row of ``R`` (CLS, the pooling probe, or
the pooled query) over the first stage's grid tokens, renormalised so that the row
over all first-stage tokens sums to 1 (:func:`vitviz.analysis.rollout.capture_rollout`,
no discard). Class-agnostic. Undefined across MobileViT's convolutions.
"""

from __future__ import annotations

import numpy as np

from vitviz.analysis.rollout import capture_rollout
from vitviz.methods.base import Inputs, Method

__all__ = ["Rollout"]


class Rollout(Method):
    name = "rollout"
    title = "Attention rollout"
    definition = "attention rollout (head mean, 0.5 F + 0.5 I, rows renormalised) of the readout row, first-stage grid"
    class_specific = False
    uses_capture = True
    needs_rollout = True

    def compute(self, inputs: Inputs, target, seed: int) -> np.ndarray:
        cap = inputs.capture
        row, stage = capture_rollout(cap)  # (T_1,) over the first stage's tokens
        s = cap.stages[stage]
        return row[s.num_prefix :].reshape(s.grid)
