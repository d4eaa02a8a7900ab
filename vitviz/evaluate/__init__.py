"""Evaluation of explanations: how faithful is a map to what the model does (deletion / insertion curves)."""

from vitviz.evaluate.faithfulness import (
    POINTS,
    Faithfulness,
    FaithfulnessError,
    Perturbations,
    evaluate_methods,
    faithfulness,
    peak_in_box,
)

__all__ = [
    "POINTS",
    "Faithfulness",
    "FaithfulnessError",
    "Perturbations",
    "evaluate_methods",
    "faithfulness",
    "peak_in_box",
]
