"""What each causal analysis needs, and why it is not defined where it is not; the clean Run they all read.

Rows of every ``(L, H)`` table are the model's attention sites in forward order.

* ViT, DINO, DeiT (distilled or not), DINOv2 (+ registers) classifiers, BEiT,
  ViT-MSN, data2vec-vision: everything (knock-outs replay from the clean residual).
* Swin, Swin V2: knock-outs, importance (full batched forwards), the estimate; the
  lens for the last stage's blocks; no attribution.
* PvT, PvT v2, CvT: knock-outs, importance, the estimate; no readout head is
  described for them (no lens), no attribution.
* MobileViT: its projection ``attention.output.dense`` reads the heads of every
  offset and patch, so a knock-out applies at all of them ("mean" = over all
  patch-offset positions of the image); importance and the estimate hold; no lens
  or attribution (convolutions fuse the transformer's output with the input).
* MobileViT V2: nothing (one separable "head" per block, a convolution as projection).
* CLIP, SigLIP two-tower models: knock-outs, importance and the estimate of label
  scores; SigLIP's pooling head has no row (``nn.MultiheadAttention`` never calls
  its ``out_proj`` as a module, so no hook can edit its input).
* I-JEPA classifier (mean of all tokens, no CLS): knock-outs, importance (full
  forwards), the estimate; no readout head is described yet (no lens, no attribution).

Every analysis reads the image's clean :class:`~vitviz.capture.run.Run` (one forward,
shared with the Heads, Rollout and Relevance views; ``get_run`` caches it) and edits it by
the named points of :mod:`vitviz.models.points` through :mod:`vitviz.causal.grid`.
Nothing here rewrites the model or runs hooks of its own.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from PIL import Image

from vitviz.capture.run import Run, get_run
from vitviz.capture.targets import NoScores, Target, label_set
from vitviz.errors import CaptureError, VitvizError
from vitviz.models.families.base import ReadoutHead
from vitviz.models.hooks import installed_points, installed_sites
from vitviz.models.load import LoadedModel
from vitviz.models.points import block_name

__all__ = [
    "KnockoutMode",
    "NotDefined",
    "Cancelled",
    "READOUT_RTOL",
    "head_projections",
    "knockable_blocks",
    "causal_notes",
    "clean_run",
    "projections",
    "z_name",
    "readout_of",
    "check_mode",
]

KnockoutMode = Literal["mean", "zero"]
READOUT_RTOL = 1e-4  # the readout head must reproduce the model's logits to this (relative to their scale)


class NotDefined(CaptureError):
    """The analysis is not defined for this model; the message says why."""


class Cancelled(VitvizError):
    """``cancel()`` returned True; ``partial`` holds the result computed so far (``complete=False``)."""

    def __init__(self, message: str, partial) -> None:
        super().__init__(message)
        self.partial = partial


def head_projections(loaded: LoadedModel) -> tuple[torch.nn.Linear | None, ...]:
    """Each block's per-head output projection (None for blocks without one, or whose projection the forward
    never calls as a module), from the named points installed at load (:mod:`vitviz.models.hooks`)."""
    points = installed_points(loaded.model)
    out = []
    for site in installed_sites(loaded.model):
        p = points.by_name.get(block_name(points, site.index, "attn.z"))
        out.append(p.module if p is not None else None)
    return tuple(out)


def knockable_blocks(loaded: LoadedModel) -> tuple[int, ...]:
    """The blocks whose heads can be knocked out one by one (those with a per-head output projection)."""
    return tuple(i for i, p in enumerate(head_projections(loaded)) if p is not None)


def causal_notes(loaded: LoadedModel) -> dict[str, str]:
    """Why each analysis is not (or only partly) defined for ``loaded``: keys ``knockout`` (knock-outs, head
    importance, the fast estimate: not at all), ``knockout_partial`` (defined for some blocks only, e.g. not for
    CCT's sequence pooling), ``lens``, ``attribution``; "" where fully defined. No forward runs."""
    fam, model = loaded.family, loaded.model
    projs = head_projections(loaded)
    notes = {"knockout": "", "knockout_partial": "", "lens": "", "attribution": ""}
    two_tower = loaded.zero_shot or isinstance(getattr(model, "logit_scale", None), torch.Tensor)
    if not loaded.has_classifier and not two_tower:
        why = (
            f"'{loaded.name}' has no classifier and no text tower: knock-out effects, the logit lens and "
            "attribution need class logits (or, for a two-tower model, label scores)."
        )
        return dict.fromkeys(notes, why)
    if not any(p is not None for p in projs):
        notes["knockout"] = (
            f"{fam.name} blocks have no per-head output projection (a Linear reading the heads side by side): "
            "heads cannot be knocked out one by one."
        )
    elif not all(p is not None for p in projs):
        notes["knockout_partial"] = (
            f"Only {sum(p is not None for p in projs)} of {len(projs)} {fam.name} blocks have a per-head output "
            "projection; the others have no rows in the head tables."
        )
    if not loaded.has_classifier:  # zero-shot: knock-outs of label scores; no readout head for them yet
        notes["lens"] = notes["attribution"] = (
            f"The logit lens and attribution of zero-shot label scores are not defined: the {fam.name} adapter "
            "describes no readout head (final norm, image projection, then the label embeddings)."
        )
        return notes
    readout = fam.readout_head(model)
    if readout is None:
        notes["lens"] = (
            f"The {fam.name} adapter defines no readout head (final norm + classifier) an intermediate residual "
            "stream can be passed through."
        )
        notes["attribution"] = notes["lens"]
        return notes
    if fam.hierarchical:
        notes["lens"] = (
            f"{fam.name} changes its token grid and width between stages: only the residual stream of the last "
            "stage's blocks can pass through the final norm and head; earlier rows (and the embeddings) are "
            "left empty."
        )
        notes["attribution"] = (
            f"Direct logit attribution is not defined for {fam.name}: patch merging (or strided re-embedding) "
            "between stages mixes tokens and changes the "
            "width, so the logit does not split into per-head terms of one residual stream."
        )
    elif not all(p is not None for p in projs):
        notes["attribution"] = notes["knockout"]
    else:
        unknown = [(i, fam.block_parts(s).unknown) for i, s in enumerate(installed_sites(model))]
        unknown = [(i, why) for i, why in unknown if why]
        if unknown:
            notes["attribution"] = (
                f"Direct logit attribution of '{loaded.name}' is refused: block {unknown[0][0]}: {unknown[0][1]}."
            )
    return notes


# --- the clean run -------------------------------------------------------------------------------


def _check_scores(loaded: LoadedModel, target: Target | int | None) -> None:
    """:class:`NotDefined` where the model gives neither class logits nor (for a label target) label scores."""
    model = loaded.model
    if label_set(target) is None and not loaded.has_classifier:
        if loaded.zero_shot or isinstance(getattr(model, "logit_scale", None), torch.Tensor):
            raise NotDefined(
                f"'{loaded.name}' is a zero-shot two-tower model: give a label target (Target.of_label) "
                "whose score to explain."
            )
        raise NotDefined(causal_notes(loaded)["knockout"])


def clean_run(
    loaded: LoadedModel,
    image: Image.Image,
    size,
    budget_bytes: int,
    target: Target | int | None = None,
    gradients: bool = True,
) -> Run:
    """The image's clean :class:`~vitviz.capture.run.Run` (cached), with the scores ``target`` reads (a label
    target's labels, else class logits)."""
    _check_scores(loaded, target)
    try:
        run = get_run(
            loaded, image, size=size, labels=label_set(target), budget_bytes=budget_bytes, gradients=gradients
        )
    except NoScores as exc:
        raise NotDefined(str(exc)) from None
    if run.scores.numel() == 0:
        raise NotDefined(f"'{loaded.name}' returned no class logits.")
    return run


def z_name(run: Run, layer: int) -> str:
    """The ``attn.z`` point of block ``layer`` (0-based, forward order)."""
    return run.name(run.sites[layer].index, "attn.z")


def projections(run: Run) -> tuple[torch.nn.Linear | None, ...]:
    """Each block's per-head output projection, or None where the clean run has no ``attn.z`` there (a projection
    the forward never called as a module, e.g. ``nn.MultiheadAttention``'s: no hook can edit its input)."""
    projs = head_projections(run.loaded)
    return tuple(p if p is not None and run.has(z_name(run, i)) else None for i, p in enumerate(projs))


def readout_of(run: Run) -> tuple[ReadoutHead | None, str]:
    """The run's checked readout head and why there is none ("" when there is one); none for label scores."""
    if run.labels is not None:
        return None, causal_notes(run.loaded)["lens"] or "Not defined for label scores."
    return run.readout, run.readout_problem


def check_mode(mode: str) -> None:
    if mode not in ("mean", "zero"):
        raise ValueError(f"knock-out mode must be 'mean' or 'zero', got {mode!r}")


def target_values(t, scores: torch.Tensor) -> np.ndarray:
    """``(k, C)`` scores -> ``(k,)`` float64: the target's value in each row."""
    return t.select(scores.detach().float().cpu().numpy().astype(np.float64))
