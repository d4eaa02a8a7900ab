"""``random``: the floor every method must beat: i.i.d. uniform values on the first stage's grid.

Definition (``docs/definitions.md#faithfulness``, the random baseline): ``numpy.random.default_rng(seed).random((gh, gw))``,
values in [0, 1), float32; the same seed gives the same map. Class-agnostic.
"""

from __future__ import annotations

import numpy as np

from vitviz.methods.base import Inputs, Method

__all__ = ["RandomMap"]


class RandomMap(Method):
    name = "random"
    title = "Random baseline"
    definition = "i.i.d. uniform [0, 1) values from numpy.random.default_rng(seed)"
    class_specific = False

    def describe(self, inputs: Inputs, seed: int) -> str:
        return f"i.i.d. uniform [0, 1) values from numpy.random.default_rng({seed})"

    def compute(self, inputs: Inputs, target, seed: int) -> np.ndarray:
        return np.random.default_rng(seed).random(inputs.grid)
