"""``relevance``: class-specific relevance (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability").

Definition (``docs/definitions.md#class-specific-relevance``): ``y_c`` the target (the class
logit before softmax, a zero-shot label's score, or a difference of two), ``G_l = dy_c / dA_l`` from one backward pass, ``R = I``;
``R = R + mean_h(clamp(G_l * A_l, min=0)) @ R`` for l = 1..L (stage merges as in
rollout); the map is the readout row of ``R`` over the first stage's grid tokens,
raw (:func:`vitviz.capture.gradients.explain_classes`). Undefined for MobileViT.

Option ``from_block`` (default 0, all blocks, = MM-Explainability's ``start_layer=0``):
relevance runs through blocks ``from_block..L-1`` only (-1: the last block, the
default of MM-Explainability's CLIP notebook); earlier blocks count as identities.
"""

from __future__ import annotations

import numpy as np

from vitviz.capture.gradients import explain_run, explain_targets
from vitviz.capture.targets import BoundTarget
from vitviz.methods.base import Inputs, Method

__all__ = ["Relevance"]


class Relevance(Method):
    name = "relevance"
    title = "Relevance (Chefer et al.)"
    definition = "Chefer et al. relevance: R += mean_h(clamp(dy_c/dA * A, 0)) @ R per block, readout row, raw"
    needs_rollout = True

    def __init__(self, from_block: int = 0) -> None:
        self.from_block = int(from_block)

    def describe(self, inputs: Inputs, seed: int) -> str:
        if self.from_block == 0:
            return self.definition
        where = " (counted from the end: -1 is the last)" if self.from_block < 0 else ""
        return f"{self.definition}; from block {self.from_block}{where} on (earlier blocks: identity)"

    def compute(self, inputs: Inputs, target: BoundTarget | None, seed: int) -> np.ndarray:
        def y(out):
            return target(out).reshape(-1)[0]

        t = target.target
        targets = {t.index: (t.name(), y)}
        run = inputs.run  # the image's one forward, with its graph: one backward, no forward of its own
        if run.has_graph:
            exp = explain_run(run, targets, start_block=self.from_block)[t.index]
        else:  # over the memory budget for a graph: a forward with gradients of its own
            exp = explain_targets(inputs.loaded, inputs.image, targets, size=inputs.size, start_block=self.from_block)[
                t.index
            ]
        return exp.patch_map()  # (gh, gw) on the first stage's grid
