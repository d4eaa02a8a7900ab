"""What a method explains: a target, not only a class index (in the spirit of pytorch-grad-cam's ``ClassifierOutputTarget``).

Definition (``docs/definitions.md#targets``). A target turns the model's
scores ``s`` ``(B, K)`` (before softmax) into one scalar per image ``(B,)``:

* ``Target.of_class(c)``: the class logit ``s[:, c]``;
* ``Target.of_label(labels, "cat")``: a zero-shot label's score ``s[:, k]``, where ``s`` is
  the model's ``logits_per_image`` for the prompts of ``labels`` and ``k`` the label's
  index (the label's text is kept for display);
* either with ``minus=``: the difference ``s[:, a] - s[:, b]`` ("cat rather than dog").

A target is linear in the scores (``weights(K) @ s``), so anything linear in the
output (a gradient, a knock-out effect, a direct logit attribution, a patched logit)
of a difference target is the difference of the two single targets' values.
:meth:`Target.bind` gives the differentiable function ``forward output -> (B,)`` a
method calls: class logits through the family's ``logits``, label scores as the
forward computes them (``logit_scale.exp() * cos(image embedding, prompt) (+ logit_bias)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vitviz.errors import CaptureError, VitvizError
from vitviz.models.zeroshot import Labels

Scorer = Callable[[Any], torch.Tensor]  # the forward's output -> scores (B, K): class logits or label scores

__all__ = [
    "Target",
    "TargetError",
    "BoundTarget",
    "NoScores",
    "Scorer",
    "scorer_for",
    "label_set",
    "label_scorer",
    "resolve_target",
    "targets_arrays",
]


class TargetError(VitvizError, ValueError):
    """A target that does not fit the model (class out of range, unknown label, labels on a classifier...)."""


@dataclass(frozen=True)
class Target:
    """A class (``labels`` None) or a zero-shot label (``labels``: the label names, in scoring order), minus another.

    ``index``: the class, or the label's position in ``labels``; ``minus``: the index
    subtracted (None: no difference).
    """

    index: int
    minus: int | None = None
    labels: tuple[str, ...] | None = None
    prompts: tuple[str, ...] | None = None  # zero-shot: the prompt of each label (default: the labels themselves)

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, (int, np.integer)):
            raise TargetError(f"a target's index must be an integer, got {self.index!r}")
        if self.minus is not None and int(self.minus) == int(self.index):
            raise TargetError(f"a difference needs two different classes or labels, got {self.index} twice")
        if self.labels is not None:
            n = len(self.labels)
            for i in (self.index, self.minus):
                if i is not None and not 0 <= int(i) < n:
                    raise TargetError(f"label index {i} is outside 0..{n - 1}")
            if self.prompts is not None and len(self.prompts) != n:
                raise TargetError(f"{len(self.prompts)} prompts for {n} labels")

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def of_class(cls, index: int, minus: int | None = None) -> Target:
        """The logit of class ``index`` (minus the logit of class ``minus``)."""
        return cls(int(index), None if minus is None else int(minus))

    @classmethod
    def of_label(cls, labels: Any, label: str | int, minus: str | int | None = None) -> Target:
        """A zero-shot label's score; ``labels``: a :class:`vitviz.models.zeroshot.Labels` or the names in order."""
        names = tuple(getattr(labels, "names", labels))
        prompts = tuple(getattr(labels, "prompts", names))

        def find(x: str | int) -> int:
            if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                return int(x)
            if x not in names:
                raise TargetError(f"label {x!r} is not one of the labels given ({', '.join(names)})")
            return names.index(x)

        return cls(find(label), None if minus is None else find(minus), names, prompts)

    # --- what it is ----------------------------------------------------------------------------

    @property
    def is_label(self) -> bool:
        return self.labels is not None

    @property
    def is_difference(self) -> bool:
        return self.minus is not None

    def _name_of(self, i: int, id2label: dict[int, str] | None) -> str:
        if self.labels is not None:
            return self.labels[i]
        if id2label and i in id2label:
            return f"{id2label[i]} ({i})"
        return f"class {i}"

    def name(self, id2label: dict[int, str] | None = None) -> str:
        """For display: ``"cat (3)"``, ``"cat (3) minus dog (5)"``, ``"label 'a cat'"``..."""
        a = self._name_of(self.index, id2label)
        if self.labels is not None:
            a = f"label '{a}'"
        if self.minus is None:
            return a
        b = self._name_of(self.minus, id2label)
        if self.labels is not None:
            b = f"label '{b}'"
        return f"{a} minus {b}"

    def weights(self, k: int) -> np.ndarray:
        """``(K,)`` float64: the target as a linear functional of the scores (+1 at ``index``, -1 at ``minus``)."""
        w = np.zeros(k)
        w[self.index] = 1.0
        if self.minus is not None:
            w[self.minus] -= 1.0
        return w

    def select(self, scores: torch.Tensor | np.ndarray):
        """Scores ``(..., K)`` -> the target ``(...)`` (torch: differentiable; numpy: float64)."""
        if isinstance(scores, np.ndarray):
            s = scores.astype(np.float64)
            out = s[..., self.index]
            return out - s[..., self.minus] if self.minus is not None else out
        out = scores[..., self.index]
        return out - scores[..., self.minus] if self.minus is not None else out

    def check(self, loaded) -> None:
        """Raise :class:`TargetError` unless the target fits ``loaded`` (classes in range, labels on a two-tower)."""
        if self.labels is None:
            if not loaded.has_classifier:
                extra = " Give a zero-shot label instead (--label)." if getattr(loaded, "zero_shot", False) else ""
                raise TargetError(f"'{loaded.name}' has no classifier: a class target needs class logits.{extra}")
            n = len(loaded.id2label)
            for i in (self.index, self.minus):
                if i is not None and not 0 <= int(i) < n:
                    raise TargetError(f"class {i} is outside 0..{n - 1} for '{loaded.name}'.")
        elif not getattr(loaded, "zero_shot", False):
            raise TargetError(
                f"'{loaded.name}' has no text tower: a zero-shot label target needs a CLIP- or SigLIP-style model."
            )

    def bind(self, loaded, text_embeddings: np.ndarray | None = None) -> BoundTarget:
        """The differentiable function of the forward's output ``(B,)``: class logits through the family's
        ``logits``, label scores through :func:`scorer_for` (the prompts' embeddings cached
        per model; ``text_embeddings`` ``(K, D)``: embeddings encoded already, e.g. by a test)."""
        self.check(loaded)
        if text_embeddings is not None:
            return BoundTarget(self, label_scorer(loaded, text_embeddings))
        return BoundTarget(self, scorer_for(loaded, label_set(self)))


class NoScores(CaptureError):
    """The model gives no scores to explain (a backbone, or labels asked of a model without a text tower)."""


def scorer_for(loaded, labels: Labels | None = None) -> Scorer:
    """The one scorer of a forward's output: class logits (``labels`` None: the family's ``logits``), or a two-tower
    model's scores ``(B, K)`` of ``labels``' prompts as its forward's ``logits_per_image`` computes them
    (``logit_scale.exp() * cos(image embedding, prompt) (+ logit_bias)``; the prompts' text embeddings come from
    :func:`vitviz.models.zeroshot.text_embeddings`, encoded once per model and prompt)."""
    fam, model = loaded.family, loaded.model
    if labels is None:
        return lambda out: fam.logits(model, out)
    if not labels.prompts:
        raise ValueError("label scores need at least one label")
    scale = getattr(model, "logit_scale", None)
    if not isinstance(scale, torch.Tensor) or getattr(loaded, "text", None) is None:
        raise NoScores(f"'{loaded.name}' has no text tower: only a two-tower model scores labels.")
    from vitviz.models.zeroshot import text_embeddings

    return label_scorer(loaded, text_embeddings(loaded, labels.prompts))


def label_set(target) -> Labels | None:
    """The labels whose scores a :class:`Target` reads (None: class logits, or no target)."""
    if target is None or getattr(target, "labels", None) is None:
        return None
    return Labels(target.labels, target.prompts or target.labels, "{}")


def label_scorer(loaded, text_embeddings: np.ndarray) -> Scorer:
    """Forward output -> label scores ``(B, K)`` against prompt embeddings ``(K, D)``, as the two-tower model's
    ``logits_per_image`` computes them (:func:`vitviz.models.zeroshot.label_scores`)."""
    from vitviz.models.zeroshot import label_scores

    fam, model = loaded.family, loaded.model
    text = torch.as_tensor(np.asarray(text_embeddings, np.float32))

    def scores(out) -> torch.Tensor:
        img = fam.image_embedding(model, out)
        if img is None:
            raise NoScores(f"'{loaded.name}' gives no image embedding to score labels with.")
        return label_scores(model, img, text)

    return scores


@dataclass(frozen=True)
class BoundTarget:
    """A target bound to a model: ``scores(out)`` ``(B, K)`` and ``__call__(out)`` ``(B,)``, both differentiable."""

    target: Target
    scores: Callable[[Any], torch.Tensor]

    def __call__(self, out) -> torch.Tensor:
        return self.target.select(self.scores(out))


def resolve_target(target: Target | int | None, *, predicted: Callable[[], int | None] | None = None) -> Target | None:
    """A :class:`Target` from what a caller gave: a target, a class index (shorthand for ``Target.of_class``), or
    None (the predicted class, asked from ``predicted``; None when there is no classifier)."""
    if isinstance(target, Target):
        return target
    if target is None:
        c = predicted() if predicted is not None else None
        return None if c is None else Target.of_class(c)
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)):
        raise TargetError(f"a target is a Target or a class index, got {target!r}")
    return Target.of_class(int(target))


def targets_arrays(target: Target, id2label: dict[int, str] | None = None) -> dict[str, np.ndarray]:
    """How export records a target: ``target_kind`` ("class" / "label"), ``target_index``, ``target_minus``
    (-1: none), ``target_name`` (for display); label targets also ``target_label`` / ``target_minus_label``."""
    arrays = {
        "target_kind": np.array("label" if target.is_label else "class"),
        "target_index": np.array(target.index, np.int64),
        "target_minus": np.array(-1 if target.minus is None else target.minus, np.int64),
        "target_name": np.array(target.name(id2label)),
    }
    if target.labels is not None:
        arrays["target_label"] = np.array(target.labels[target.index])
        if target.minus is not None:
            arrays["target_minus_label"] = np.array(target.labels[target.minus])
    return arrays
