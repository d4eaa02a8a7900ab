"""Does this head matter? Knock-outs, head importance, the logit lens, direct logit attribution, a fast estimate.

Notation: one image, L attention blocks, H heads per block (a table has as many
columns as the widest block; NaN where a block has fewer heads), C classes, the
class explained ``c`` (default: the clean run's top-1). All logits are before
softmax.

Definitions
-----------
**Head knock-out.** In block l, the output projection ``W_o`` of the attention
(``family.head_projection``) reads the heads' outputs side by side, ``z = [z_1 ..
z_H]`` (``(T, H * d)``, head h in columns ``h*d .. (h+1)*d - 1``). Knocking out head
h replaces its slice ``z_h`` in *every* token position by

* ``"zero"``: zero. Since attention rows sum to 1, ``z_h = A_h (X W_V,h + b_V,h)``
  carries the head's value bias ``b_V,h``, so the zero knock-out removes it with the
  head (the output bias ``b_O`` stays). ViT-Prisma folds ``W_O b_V`` into ``b_O`` by
  default, so its knock-out keeps the value bias: the two conventions differ (up to
  1.15 logits on a sharp tiny model);
* ``"mean"`` (the app's default): that slice's mean over *this image's* tokens in the
  clean run, ``mean_t z_h[t]`` (not a data-set mean; hierarchical models: over every
  position the projection sees for that image, i.e. all windows of a Swin block, all
  offsets of a MobileViT block, padding positions of a padded Swin grid included);

everything else runs as usual (the projection's bias, the rest of the block, the
later blocks). The **effect** on class c is the knocked-out logit of c minus the
clean logit. Several heads at once is one forward pass.

**Head importance** is the effect of knocking out each head alone: an (L, H)
table for class c. Every knocked-out copy of the image of a chunk runs in one
batched forward. For one-grid ViTs a knock-out in block l changes nothing before
block l, so the copies start from the clean run's residual stream at block l
(cached in the clean run) and run only blocks l .. L-1 and the readout: the cost
is ``1 + H (L + 1) / 2`` forward-equivalents (79 for ViT-B/16) against
``1 + L H`` (145) for full passes. Hierarchical models run full (batched)
forwards. A ``progress(done, total)`` callback is called after each chunk; a
``cancel()`` callable is asked before each chunk and, when it returns True, the
call raises :class:`Cancelled`, whose ``partial`` attribute holds the table so far
(``complete=False``, NaN where not computed).

**Logit lens.** The residual stream after block l (row 0: the embeddings, the
input of block 0) passed through the model's own final norm and classification
head (``family.readout_head``: ViT: the CLS token's final LayerNorm and the
classifier; distilled DeiT: both heads as the model combines them, ``(CLS head +
distillation head) / 2``; DINOv2 classifier: CLS + mean-patch head; BEiT: mean of
the patches, the pooler's LayerNorm, the classifier): an (L + 1, C) table of
logits whose row L equals the model's logits (checked on every call). Hierarchical
models: only rows whose residual has the final width and layout are defined (the
blocks of the last stage, Swin); the others are NaN with a note.

**Direct logit attribution** (one-grid ViTs with a linear readout). Freeze the
final LayerNorm's scale ``sigma_r = sqrt(var(v_r) + eps)`` at its clean value for
each vector the head reads (``v = select(x_L)``: CLS; CLS and DIST; every token for
DINOv2's CLS + mean-patch head; the mean patch token for BEiT). The norm is then
affine in the residual stream, and the pre-norm residual stream is a sum:
``x_L = embeddings + sum_l (s1_l * (z_l W_o^T + b_o) + s2_l * mlp_l)`` (``s1``,
``s2``: layer scales where the family has them, else 1). So the logit of c splits
exactly into

* a term per head and block: ``head(norm_frozen(select(s1_l * z_{l,h} W_{o,h}^T)))``
  minus the head's value at zero (the head's slice through the output projection,
  without its bias ``b_O``; ``z_h`` includes the value bias ``b_V,h``, so the head's
  part does too, unlike ViT-Prisma's default, which folds it into ``b_O``);
* a term per MLP: the MLP's own output (point ``blocks.{l}.mlp.out``) times its layer
  scale, without the MLP's output bias;
* the rest: the embeddings, every bias (output projections, MLP outputs, the
  norm's shift, the classifier's bias).

Every part is computed from its own activations, so the sum equalling the logit is
a check that can fail (checked on every call, relative 1e-4): a layer scale, norm or
branch the adapter does not describe makes it fail, and the call refuses
(:class:`NotDefined`) instead of returning wrong parts. The layer scales ``s1``,
``s2`` and the MLP module are what the family adapter declares
(``Family.block_parts``); where it cannot say (a layer whose parts sit under names it
does not know), attribution refuses before computing anything. Not defined for
hierarchical models (patch merging mixes tokens and widths) and for models whose
readout is not an affine function of normalised tokens; the call then raises
:class:`NotDefined` with the reason (``causal_notes`` says so before any forward).

**Zero-shot two-tower models** (CLIP, SigLIP): given the label embeddings ``(K, D)``
(``vitviz.models.zeroshot.encode_labels``), the "logits" are the label scores the
model's forward computes (``logit_scale.exp() * cos(image embedding, label)``, plus
``logit_bias`` for SigLIP), and knock-outs, head importance and the fast estimate
explain them (full batched forwards: no readout head to start from the cached
residual). The logit lens and attribution of label scores are not defined until
the contrastive adapter describes a readout head (post-norm, image projection).

**Fast estimate** (attribution patching): the first-order estimate of every
knock-out effect at once, ``sum_{t, j in head h} dy_c/dz_l[t, j] * (z'_l[t, j] -
z_l[t, j])`` with ``z'`` the knocked-out value (mean or zero), from one forward
and one backward pass (about 3 forward-equivalents).

Families
--------
Rows of every (L, H) table are the model's attention sites in forward order.

* ViT, DINO, DeiT (distilled or not), DINOv2 (+ registers) classifiers, BEiT,
  ViT-MSN, data2vec-vision: everything (cached-residual knock-outs).
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

Mechanics
---------
Nothing here rewrites the model, and nothing here runs its own hooks: every analysis
reads the image's clean :class:`~vitviz.capture.run.Run` (one forward, shared
with the Heads, Rollout and Relevance views; ``get_run`` caches it) and edits it by
the named points of :mod:`vitviz.models.points`. A knock-out of head h in block l
is the edit ``Edit("blocks.{l}.attn.z", "zero" | "mean", heads=(h,))``; head importance
batches copies, each with its own edit (``rows``). Replays from the cached residual
(:meth:`Run.edited`) call the model's own block modules with the arguments the
model passed them in the clean run, then the family's readout head. The points are
installed once per model (at load) and act only inside a call (a ``ContextVar``):
threads that share one cached model never see each other's knock-outs, no hook is
added or removed while other threads run the model, and a call that fails leaves
nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES, check_budget, input_size_for
from vitviz.capture.run import NoScores, Run, Scorer, get_run, scorer_for
from vitviz.errors import CaptureError, VitvizError
from vitviz.models.families.base import ReadoutHead
from vitviz.models.hooks import Site, installed_sites
from vitviz.models.load import LoadedModel
from vitviz.models.points import _ACTIVE, Edit, active, block_name, install_points
from vitviz.record import frozen

__all__ = [
    "KnockoutMode",
    "NotDefined",
    "knockable_blocks",
    "Cancelled",
    "Knockout",
    "HeadImportance",
    "HeadEstimate",
    "LogitLens",
    "Attribution",
    "install_causal_hooks",
    "causal_notes",
    "knock_out",
    "head_importance",
    "fast_estimate",
    "logit_lens",
    "direct_logit_attribution",
    "causal_arrays",
    "capture_knocked_out",
]

KnockoutMode = Literal["mean", "zero"]
Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]

_READOUT_RTOL = 1e-4  # the readout head must reproduce the model's logits to this (relative to their scale)


class NotDefined(CaptureError):
    """The analysis is not defined for this model; the message says why."""


class Cancelled(VitvizError):
    """``cancel()`` returned True; ``partial`` holds the table computed so far (``complete=False``)."""

    def __init__(self, message: str, partial: HeadImportance) -> None:
        super().__init__(message)
        self.partial = partial


# --- results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knockout:
    """One forward with ``heads`` knocked out together. ``logits``, ``clean_logits``: ``(C,)`` float32."""

    heads: tuple[tuple[int, int], ...]
    mode: KnockoutMode
    logits: np.ndarray = field(repr=False)
    clean_logits: np.ndarray = field(repr=False)

    @property
    def effect(self) -> np.ndarray:
        """``(C,)`` knocked-out minus clean logits."""
        return self.logits - self.clean_logits


@dataclass(frozen=True)
class HeadImportance:
    """Knock-out of each head alone.

    ``effects`` ``(L, H)`` float32: knocked-out logit of ``class_index`` minus the clean
    logit (NaN: no such head in that block, no projection, or not computed);
    ``logits`` ``(L, H, C)`` float32: the knocked-out logits; ``clean_logits`` ``(C,)``;
    ``num_heads`` per block; ``forward_equivalents``: the work done, in passes of
    the whole model over one image (the clean run included).
    """

    effects: np.ndarray = field(repr=False)
    logits: np.ndarray = field(repr=False)
    clean_logits: np.ndarray = field(repr=False)
    class_index: int
    mode: KnockoutMode
    num_heads: tuple[int, ...]
    complete: bool
    forward_equivalents: float
    from_cache: bool

    @property
    def top1_changed(self) -> np.ndarray:
        """``(L, H)`` bool: the knock-out changes the top-1 class (False where not computed)."""
        done = ~np.isnan(self.effects)
        top = np.argmax(np.nan_to_num(self.logits, nan=-np.inf), axis=-1)
        return done & (top != int(np.argmax(self.clean_logits)))

    def ranked(self) -> list[tuple[int, int, float]]:
        """``(block, head, effect)`` by |effect|, largest first (computed heads only)."""
        idx = np.argwhere(~np.isnan(self.effects))
        out = [(int(b), int(h), float(self.effects[b, h])) for b, h in idx]
        return sorted(out, key=lambda r: -abs(r[2]))


@dataclass(frozen=True)
class HeadEstimate:
    """Attribution patching: ``effects`` ``(L, H)`` float32 first-order estimates of the knock-out effects."""

    effects: np.ndarray = field(repr=False)
    clean_logits: np.ndarray = field(repr=False)
    class_index: int
    mode: KnockoutMode
    num_heads: tuple[int, ...]


@dataclass(frozen=True)
class LogitLens:
    """``logits`` ``(L + 1, C)`` float32: row 0 the embeddings, row l the residual after block l - 1 (1-based
    block l), read out by the model's own final norm and head; NaN rows are undefined (``defined`` ``(L + 1,)``)."""

    logits: np.ndarray = field(repr=False)
    defined: np.ndarray = field(repr=False)
    readout: str
    note: str

    def probabilities(self) -> np.ndarray:
        """``(L + 1, C)`` softmax of each row (NaN rows stay NaN)."""
        z = self.logits.astype(np.float64)
        out = np.full_like(z, np.nan)
        rows = ~np.isnan(z).any(axis=1)  # rows the lens could not read stay NaN (no all-NaN max)
        e = np.exp(z[rows] - z[rows].max(axis=1, keepdims=True))
        out[rows] = e / e.sum(axis=1, keepdims=True)
        return out

    def ranks(self, class_index: int) -> np.ndarray:
        """``(L + 1,)`` rank of ``class_index`` in each row (1 = the top class; ties count against it); NaN where undefined."""
        z = self.logits
        out = (z > z[:, [class_index]]).sum(axis=1).astype(np.float64) + 1
        out[~self.defined] = np.nan
        return out


@dataclass(frozen=True)
class Attribution:
    """Direct logit attribution of ``logit`` (class ``class_index``): ``heads`` ``(L, H)`` + ``mlps`` ``(L,)`` +
    ``rest`` = ``logit`` (float64 parts; NaN for heads a block does not have). ``norm_scale`` ``(R,)``: the frozen
    LayerNorm scales of the vectors the head reads."""

    class_index: int
    logit: float
    heads: np.ndarray = field(repr=False)
    mlps: np.ndarray = field(repr=False)
    rest: float
    norm_scale: np.ndarray = field(repr=False)
    readout: str

    @property
    def total(self) -> float:
        return float(np.nansum(self.heads) + self.mlps.sum() + self.rest)


# --- hooks: the named points of vitviz.models.points ----------------------------------------------

_PLAN = _ACTIVE  # this context's point state (records and edits); None outside a call


def install_causal_hooks(loaded: LoadedModel) -> tuple[torch.nn.Linear | None, ...]:
    """Install the model's named hook points once (:func:`vitviz.models.points.install_points`) and return each
    block's per-head output projection (None for blocks without one, or whose projection the forward never
    calls as a module). Idle unless a call in the current context sets a state. Safe to call at load time
    (recommended) or lazily (the first causal call does it)."""
    points = install_points(loaded)
    sites = installed_sites(loaded.model)
    out = []
    for site in sites:
        p = points.by_name.get(block_name(points, site.index, "attn.z"))
        out.append(p.module if p is not None else None)
    return tuple(out)


def knockable_blocks(loaded: LoadedModel) -> tuple[int, ...]:
    """The blocks whose heads can be knocked out one by one (those with a per-head output projection)."""
    return tuple(i for i, p in enumerate(install_causal_hooks(loaded)) if p is not None)


# --- what is defined -----------------------------------------------------------------------------


def causal_notes(loaded: LoadedModel) -> dict[str, str]:
    """Why each analysis is not (or only partly) defined for ``loaded``: keys ``knockout`` (knock-outs, head
    importance, the fast estimate: not at all), ``knockout_partial`` (defined for some blocks only, e.g. not for
    CCT's sequence pooling), ``lens``, ``attribution``; "" where fully defined. No forward runs (the
    projection hooks are installed if they are not yet)."""
    fam, model = loaded.family, loaded.model
    projs = install_causal_hooks(loaded)
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
            "between stages mixes tokens and changes the width, so the logit does not split into per-head terms "
            "of one residual stream."
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


@dataclass
class _Clean:
    """What the analyses read of the image's :class:`~vitviz.capture.run.Run`."""

    run: Run
    loaded: LoadedModel
    hw: tuple[int, int]
    logits: torch.Tensor  # (C,) float32
    sites: list[Site]
    projections: tuple[torch.nn.Linear | None, ...]
    num_heads: tuple[int, ...]
    z: dict[int, torch.Tensor]  # projection inputs (1, ..., H * d), detached
    blocks: dict[int, tuple[torch.Tensor, torch.Tensor, tuple, dict]]
    readout: ReadoutHead | None
    readout_problem: str  # why ``readout`` is None although the family has one ("" otherwise)

    @property
    def num_blocks(self) -> int:
        return len(self.sites)

    @property
    def width(self) -> int:
        return max(self.num_heads) if self.num_heads else 0

    @property
    def replayable(self) -> bool:
        """Knock-outs can start from the cached residual: one grid, a readout head, every block recorded."""
        return self.run.replayable

    def z_name(self, layer: int) -> str:
        return self.run.name(self.sites[layer].index, "attn.z")


def _scorer(loaded: LoadedModel, label_embeddings: np.ndarray | None) -> Scorer:
    """Class logits, or (with ``label_embeddings`` ``(K, D)``) a two-tower model's label scores
    (:func:`vitviz.capture.run.scorer_for`); :class:`NotDefined` where the model gives neither."""
    model = loaded.model
    if label_embeddings is None and not loaded.has_classifier:
        if loaded.zero_shot or isinstance(getattr(model, "logit_scale", None), torch.Tensor):
            raise NotDefined(
                f"'{loaded.name}' is a zero-shot two-tower model: give the label embeddings (encode_labels) "
                "whose scores to explain."
            )
        raise NotDefined(causal_notes(loaded)["knockout"])
    try:
        return scorer_for(loaded, label_embeddings)
    except NoScores as exc:
        raise NotDefined(str(exc)) from None


def _clean_run(
    loaded: LoadedModel, image: Image.Image, size, budget_bytes: int, label_embeddings: np.ndarray | None = None
) -> _Clean:
    _scorer(loaded, label_embeddings)
    projs = install_causal_hooks(loaded)
    try:
        run = get_run(loaded, image, size=size, label_embeddings=label_embeddings, budget_bytes=budget_bytes)
    except NoScores as exc:
        raise NotDefined(str(exc)) from None
    if run.scores.numel() == 0:
        raise NotDefined(f"'{loaded.name}' returned no class logits.")
    sites = list(run.sites)
    # A projection the forward never called as a module (nn.MultiheadAttention uses its out_proj's weight
    # directly) cannot be edited by a hook: its block has no knock-outs.
    names = [run.name(s.index, "attn.z") for s in sites]
    projs = tuple(p if p is not None and run.has(n) else None for n, p in zip(names, projs, strict=True))
    z = {s.index: run.activation(n) for s, n in zip(sites, names, strict=True) if run.has(n)}
    blocks = {}
    for s in sites:
        if run.has_block(s.index):
            args, kwargs = run.block_call(s.index)
            blocks[s.index] = (*run.block_tokens(s.index), args, kwargs)
    if label_embeddings is None:
        readout, problem = run.readout, run.readout_problem
    else:
        readout, problem = None, causal_notes(loaded)["lens"] or "Not defined for label scores."
    return _Clean(
        run=run,
        loaded=loaded,
        hw=run.input_size,
        logits=run.scores,
        sites=sites,
        projections=projs,
        num_heads=run.num_heads,
        z=z,
        blocks=blocks,
        readout=readout,
        readout_problem=problem,
    )


def _class_index(clean_logits: torch.Tensor, class_index: int | None) -> int:
    n = int(clean_logits.shape[0])
    if class_index is None:
        return int(torch.argmax(clean_logits))
    if isinstance(class_index, bool) or not isinstance(class_index, (int, np.integer)):
        raise ValueError(f"class index must be an integer, got {class_index!r}")
    if not 0 <= int(class_index) < n:
        raise ValueError(f"class index {class_index} is outside 0..{n - 1}")
    return int(class_index)


def _check_mode(mode: str) -> None:
    if mode not in ("mean", "zero"):
        raise ValueError(f"knock-out mode must be 'mean' or 'zero', got {mode!r}")


# --- knock-outs ----------------------------------------------------------------------------------


def _check_heads(clean: _Clean, heads: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out = []
    for item in heads:
        try:
            layer, head = (int(v) for v in item)
        except (TypeError, ValueError):
            raise ValueError(f"a head is given as (block, head), got {item!r}") from None
        if not 0 <= layer < clean.num_blocks:
            raise ValueError(f"block {layer} is outside 0..{clean.num_blocks - 1}")
        if not 0 <= head < clean.num_heads[layer]:
            raise ValueError(f"head {head} is outside 0..{clean.num_heads[layer] - 1} (block {layer})")
        if clean.projections[layer] is None:
            raise NotDefined(
                f"block {layer} of {clean.loaded.family.name} has no per-head output projection: its heads "
                "cannot be knocked out one by one."
            )
        out.append((layer, head))
    out = tuple(dict.fromkeys(out))
    if not out:
        raise ValueError("no heads given to knock out")
    if len(out) == sum(clean.num_heads):
        raise ValueError(
            f"knocking out all {len(out)} heads leaves no attention in the model at all; knock out fewer heads"
        )
    return out


def _edits(clean: _Clean, sets: Sequence[Sequence[tuple[int, int]]], mode: KnockoutMode) -> list[Edit]:
    """Copy i of a batched call knocks out ``sets[i]``: one edit per (block, copy) at the block's ``attn.z``."""
    edits = []
    for i, heads in enumerate(sets):
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        for layer, hs in by_layer.items():
            edits.append(Edit(clean.z_name(layer), mode, heads=tuple(hs), rows=(i,)))
    return edits


def _knocked_logits(
    clean: _Clean, sets: Sequence[Sequence[tuple[int, int]]], mode: KnockoutMode, from_cache: bool
) -> tuple[torch.Tensor, float]:
    """Logits ``(k, C)`` float32 of k copies of the image, copy i with ``sets[i]`` knocked out; and the work in
    forward-equivalents. "mean" is the clean run's token mean (:meth:`Run.resolve`)."""
    got = clean.run.edited(_edits(clean, sets, mode), batch=len(sets), reuse_prefix=from_cache)
    return got.scores, got.forward_equivalents


def knock_out(
    loaded: LoadedModel,
    image: Image.Image,
    heads: Sequence[tuple[int, int]],
    *,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    from_cache: bool = True,
    label_embeddings: np.ndarray | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Knockout:
    """Knock out ``heads`` (``(block, head)`` pairs, 0-based) together in one forward; logits ``(C,)``.

    ``from_cache``: one-grid models start from the clean residual at the first knocked-out block (same numbers
    as a full forward); False runs the whole model. Raises ValueError for heads out of range, an empty set, or
    every head of the model; :class:`NotDefined` where heads cannot be knocked out. ``label_embeddings``
    ``(K, D)`` (zero-shot two-tower models, from ``encode_labels``): the logits are the label scores.
    """
    _check_mode(mode)
    clean = _clean_run(loaded, image, size, budget_bytes, label_embeddings)
    chosen = _check_heads(clean, heads)
    logits, _ = _knocked_logits(clean, [chosen], mode, from_cache)
    return Knockout(chosen, mode, frozen(logits[0].cpu().numpy()), frozen(clean.logits.cpu().numpy()))


def _chunk_size(clean: _Clean, budget_bytes: int) -> int:
    """Copies per batched forward: what one block's attention and activations of a copy take, within the budget."""
    loaded = clean.loaded
    per_block = loaded.family.attention_numel(loaded.config, clean.hw) / max(1, clean.num_blocks)
    x = clean.blocks[clean.sites[0].index][0] if clean.blocks else None
    acts = 16 * x[0].numel() if x is not None else 0
    per_copy = (3 * per_block + acts) * 4 + 1
    return int(max(1, min(64, budget_bytes // 2 // per_copy)))


def _importance(
    clean: _Clean,
    c: int,
    mode: KnockoutMode,
    from_cache: bool,
    chunk: int | None,
    progress: Progress | None,
    cancel: CancelCheck | None,
    budget_bytes: int,
) -> HeadImportance:
    n_blocks, width = clean.num_blocks, clean.width
    n_classes = int(clean.logits.shape[0])
    logits = np.full((n_blocks, width, n_classes), np.nan, np.float32)
    done_mask = np.zeros((n_blocks, width), bool)
    tasks = [(b, h) for b in range(n_blocks) if clean.projections[b] is not None for h in range(clean.num_heads[b])]
    if not tasks:
        raise NotDefined(causal_notes(clean.loaded)["knockout"])
    size = chunk or _chunk_size(clean, budget_bytes)
    if size < 1:
        raise ValueError(f"chunk must be at least 1, got {size}")
    chunks = []
    for layer in range(n_blocks):  # chunks never mix blocks: copies of a chunk start at the same block
        mine = [t for t in tasks if t[0] == layer]
        chunks += [mine[i : i + size] for i in range(0, len(mine), size)]
    work = 1.0
    clean_np = clean.logits.cpu().numpy()
    replay = from_cache and clean.replayable

    def result(complete: bool) -> HeadImportance:
        eff = np.where(done_mask, logits[..., c] - clean_np[c], np.nan).astype(np.float32)
        lg = np.where(done_mask[..., None], logits, np.nan).astype(np.float32)
        return HeadImportance(
            frozen(eff),
            frozen(lg),
            frozen(clean_np.copy()),
            c,
            mode,
            clean.num_heads,
            complete,
            round(work, 3),
            replay,
        )

    done = 0
    for part in chunks:
        if cancel is not None and cancel():
            raise Cancelled(f"head importance cancelled after {done} of {len(tasks)} knock-outs", result(False))
        out, w = _knocked_logits(clean, [[t] for t in part], mode, from_cache)
        work += w
        arr = out.cpu().numpy()
        for (layer, head), row in zip(part, arr, strict=True):
            logits[layer, head] = row
            done_mask[layer, head] = True
        done += len(part)
        if progress is not None:
            progress(done, len(tasks))
    return result(True)


def head_importance(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    class_index: int | None = None,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    from_cache: bool = True,
    chunk: int | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    label_embeddings: np.ndarray | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> HeadImportance:
    """The effect of knocking out each head alone on ``class_index`` (default: the top-1): an (L, H) table.

    ``chunk``: copies per batched forward (default: as many as ``budget_bytes`` allows, at most 64; chunks
    never mix blocks). ``progress(done, total)`` after each chunk; ``cancel()`` before each: True raises
    :class:`Cancelled` carrying the partial table. ``from_cache=False`` runs full forwards (for checks).
    ``label_embeddings`` ``(K, D)``: explain a zero-shot model's label scores (``class_index`` is then a label).
    """
    _check_mode(mode)
    clean = _clean_run(loaded, image, size, budget_bytes, label_embeddings)
    c = _class_index(clean.logits, class_index)
    return _importance(clean, c, mode, from_cache, chunk, progress, cancel, budget_bytes)


# --- the fast estimate ---------------------------------------------------------------------------


def fast_estimate(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    class_index: int | None = None,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    label_embeddings: np.ndarray | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> HeadEstimate:
    """Attribution patching: every head's knock-out effect to first order, from one forward and one backward.

    ``effects[l, h] = sum_{t, j in head h} dy_c / dz_l[t, j] * (z'_l[t, j] - z_l[t, j])``.
    ``label_embeddings`` as in :func:`head_importance`.
    """
    _check_mode(mode)
    _scorer(loaded, label_embeddings)
    projs = install_causal_hooks(loaded)
    if not any(p is not None for p in projs):
        raise NotDefined(causal_notes(loaded)["knockout"])
    hw = input_size_for(loaded, size, image.size)
    check_budget(loaded, hw, batch=1, gradients=True, budget=budget_bytes)  # the graph must fit
    clean = _clean_run(loaded, image, size, budget_bytes, label_embeddings)
    run = clean.run
    if not run.has_graph:
        raise CaptureError(f"the clean run of '{loaded.name}' kept no autograd graph; the estimate needs one")
    c = _class_index(clean.logits, class_index)
    order = [i for i, p in enumerate(clean.projections) if p is not None]
    names = [clean.z_name(i) for i in order]
    grads = run.gradients(lambda out: run.score_of(out)[0, c], names)
    heads = clean.num_heads
    table = np.full((len(clean.sites), max(heads)), np.nan, np.float32)
    for i, name, g in zip(order, names, grads, strict=True):
        z = run.activation(name)
        flat = z.reshape(-1, z.shape[-1])
        target = flat.mean(dim=0, keepdim=True) if mode == "mean" else torch.zeros_like(flat[:1])
        g = torch.zeros_like(flat) if g is None else g.reshape(-1, z.shape[-1])
        per_col = (g * (target - flat)).sum(dim=0)  # (H * d,)
        table[i, : heads[i]] = per_col.reshape(heads[i], -1).sum(dim=1).float().cpu().numpy()
    return HeadEstimate(frozen(table), frozen(clean.logits.cpu().numpy()), c, mode, heads)


# --- the logit lens ------------------------------------------------------------------------------


def _lens(clean: _Clean) -> LogitLens:
    loaded = clean.loaded
    if clean.readout is None:
        raise NotDefined(
            clean.readout_problem
            or causal_notes(loaded)["lens"]
            or f"The logit lens is not defined for '{loaded.name}'."
        )
    n = clean.num_blocks
    rows: list[tuple[int, torch.Tensor]] = []
    last_stage = clean.sites[-1].stage
    final = clean.blocks[clean.sites[-1].index][1]
    if not loaded.family.hierarchical:
        rows.append((0, clean.blocks[clean.sites[0].index][0]))
    for i, site in enumerate(clean.sites):
        out = clean.blocks[site.index][1]
        if site.stage == last_stage and out is not None and out.shape[1:] == final.shape[1:]:
            rows.append((i + 1, out))
    table = np.full((n + 1, int(clean.logits.shape[0])), np.nan, np.float32)
    with torch.inference_mode():
        got = clean.readout(torch.cat([x for _, x in rows])).float().cpu().numpy()
    for (r, _), row in zip(rows, got, strict=True):
        table[r] = row  # row L: the readout of the last residual, checked equal to the logits in _checked_readout
    defined = np.zeros(n + 1, bool)
    defined[[r for r, _ in rows]] = True
    return LogitLens(frozen(table), frozen(defined), clean.readout.description, causal_notes(loaded)["lens"])


def logit_lens(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> LogitLens:
    """The residual stream after every block through the model's final norm and head: ``(L + 1, C)`` logits."""
    return _lens(_clean_run(loaded, image, size, budget_bytes))


# --- direct logit attribution --------------------------------------------------------------------


def _attribution(clean: _Clean, c: int) -> Attribution:
    loaded, fam = clean.loaded, clean.loaded.family
    notes = causal_notes(loaded)
    if notes["attribution"] or clean.readout is None or not clean.replayable:
        raise NotDefined(
            notes["attribution"]
            or clean.readout_problem
            or f"Direct logit attribution is not defined for '{loaded.name}'."
        )
    parts = [fam.block_parts(site) for site in clean.sites]
    for i, (site, p) in enumerate(zip(clean.sites, parts, strict=True)):
        why = p.unknown
        if not why and (clean.projections[i] is None or not clean.run.has(clean.run.name(site.index, "mlp.out"))):
            why = f"block {i} has no per-head projection or no MLP output point"
        if why:
            raise NotDefined(f"Direct logit attribution of '{loaded.name}' is refused: {why}.")
    readout = clean.readout
    norm = readout.norm
    if not isinstance(norm, torch.nn.LayerNorm):
        raise NotDefined(f"The final norm of '{loaded.name}' is a {type(norm).__name__}, not a LayerNorm.")
    n, width = clean.num_blocks, clean.width
    device, dtype = clean.logits.device, clean.logits.dtype

    def f64(t: torch.Tensor) -> torch.Tensor:  # float64 on the CPU (MPS has no float64)
        return t.detach().to("cpu", torch.float64)

    with torch.inference_mode():
        x_last = clean.blocks[clean.sites[-1].index][1]
        v = readout.select(f64(x_last))  # (1, R, D)
        sigma = torch.sqrt(v.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # frozen, (1, R, 1)
        dim = v.shape[-1]
        ones = torch.ones(dim, dtype=torch.float64)
        gamma = f64(norm.weight) if norm.weight is not None else ones
        beta = f64(norm.bias) if norm.bias is not None else torch.zeros_like(ones)

        def head(u: torch.Tensor) -> torch.Tensor:  # normed vectors (K, R, D) float64 -> logit of c (K,) float64
            return f64(readout.head(u.to(device, dtype))[:, c])

        zero = head(torch.zeros_like(v))

        def part(resid: torch.Tensor) -> torch.Tensor:  # residual components (K, T, D) -> their terms (K,)
            s = readout.select(resid)
            s = s - s.mean(dim=-1, keepdim=True)
            return head(gamma * s / sigma) - zero

        heads = np.full((n, width), np.nan)
        mlps = np.zeros(n)
        rest_resid = f64(clean.blocks[clean.sites[0].index][0]).clone()  # embeddings, then every bias

        def scale(x) -> torch.Tensor:  # a declared layer scale: None (none), a float, or a (D,) tensor
            return ones if x is None else ones * (f64(x) if isinstance(x, torch.Tensor) else float(x))

        for i, site in enumerate(clean.sites):
            proj = clean.projections[i]
            s1, s2 = scale(parts[i].attn_scale), scale(parts[i].mlp_scale)
            z = f64(clean.z[site.index])  # (1, T, H * d), value bias included
            h = clean.num_heads[i]
            w = f64(proj.weight)  # (D, H * d)
            per_head = torch.einsum("thj,ehj->hte", z[0].reshape(z.shape[1], h, -1), w.reshape(dim, h, -1)) * s1
            heads[i, :h] = part(per_head).numpy()
            b_o = f64(proj.bias) * s1 if proj.bias is not None else torch.zeros_like(ones)
            mlp = f64(clean.run.activation(clean.run.name(site.index, "mlp.out"))) * s2  # the MLP's own output
            fc2 = fam.mlp_output(site)
            b_2 = f64(fc2.bias) * s2 if fc2 is not None and fc2.bias is not None else torch.zeros_like(ones)
            mlps[i] = float(part(mlp - b_2)[0])
            rest_resid = rest_resid + b_o + b_2
        rest = float(part(rest_resid)[0] + head(beta.expand_as(v))[0])
    logit = float(clean.logits[c])
    total = float(np.nansum(heads) + mlps.sum() + rest)
    tol = max(1.0, abs(logit))
    if abs(total - logit) > _READOUT_RTOL * tol:
        raise NotDefined(
            f"Direct logit attribution of '{loaded.name}' is refused: its parts (embeddings, heads, MLP outputs, "
            f"biases) add up to {total:.6g}, not the logit {logit:.6g}, so the {fam.name} adapter does not describe "
            "its blocks as they run (a layer scale, norm or residual branch it does not know)."
        )
    return Attribution(
        c, logit, frozen(heads), frozen(mlps), rest, frozen(sigma.reshape(-1).numpy()), readout.description
    )


def direct_logit_attribution(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    class_index: int | None = None,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Attribution:
    """The logit of ``class_index`` (default: top-1) split into heads, MLPs and the rest (see the module docstring).

    Raises :class:`NotDefined` with the reason where it does not apply (hierarchical models, no linear readout).
    """
    notes = causal_notes(loaded)
    if notes["attribution"]:
        raise NotDefined(notes["attribution"])
    clean = _clean_run(loaded, image, size, budget_bytes)
    return _attribution(clean, _class_index(clean.logits, class_index))


# --- everything for an export --------------------------------------------------------------------


def causal_arrays(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    class_index: int | None = None,
    size: int | tuple[int, int] | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    label_embeddings: np.ndarray | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    minus_index: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """One clean run, then every analysis defined for the model, as arrays for ``export --causal``.

    Keys: ``explained_class`` () int64; ``logit_lens`` (L + 1, C) float32; ``head_ablation`` (L, H) float32, the
    *zero* knock-out effect on the explained class; ``head_attribution`` (L, H), ``mlp_attribution`` (L,),
    ``attribution_rest`` () float64. A key whose analysis is not defined is left out, and the second dict says
    why (same key). ``minus_index``: explain ``logit[c] - logit[minus_index]`` instead (effects and parts are
    linear in the logits: each is the class's value minus the other's); ``logit_lens`` keeps every class.
    """
    notes = causal_notes(loaded)
    clean = _clean_run(loaded, image, size, budget_bytes, label_embeddings)
    c = _class_index(clean.logits, class_index)
    m = None if minus_index is None else _class_index(clean.logits, minus_index)
    arrays: dict[str, np.ndarray] = {"explained_class": np.asarray(c, np.int64)}
    why: dict[str, str] = {}
    try:
        arrays["logit_lens"] = _lens(clean).logits
    except NotDefined as exc:
        why["logit_lens"] = str(exc)
    try:
        imp = _importance(clean, c, "zero", True, None, progress, cancel, budget_bytes)
        arrays["head_ablation"] = imp.effects
        if m is not None:
            clean_np = imp.clean_logits
            diff = imp.logits[..., c] - imp.logits[..., m] - (clean_np[c] - clean_np[m])
            arrays["head_ablation"] = diff.astype(np.float32)
    except NotDefined as exc:
        why["head_ablation"] = str(exc)
    if notes["attribution"] or not clean.replayable:
        for key in ("head_attribution", "mlp_attribution", "attribution_rest"):
            why[key] = notes["attribution"] or clean.readout_problem or "Direct logit attribution is not defined."
    else:
        try:
            att = _attribution(clean, c)
        except NotDefined as exc:
            why.update(dict.fromkeys(("head_attribution", "mlp_attribution", "attribution_rest"), str(exc)))
        else:
            heads, mlps, rest = att.heads, att.mlps, att.rest
            if m is not None:
                other = _attribution(clean, m)
                heads, mlps, rest = heads - other.heads, mlps - other.mlps, rest - other.rest
            arrays["head_attribution"] = heads
            arrays["mlp_attribution"] = mlps
            arrays["attribution_rest"] = np.asarray(rest, np.float64)
    return arrays, why


def capture_knocked_out(
    loaded: LoadedModel,
    image: Image.Image,
    heads: Sequence[tuple[int, int]],
    *,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    label_embeddings: np.ndarray | None = None,
    attention_dtype: str = "float16",
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
):
    """The capture of the image with ``heads`` knocked out, and the knock-out's logits against the clean ones.

    One clean run (for the mean values), then :func:`vitviz.capture.forward.capture` with the
    knock-out in place, so every block after the first knocked-out one shows the attention
    the model computes without those heads. Returns ``(Capture, Knockout)``.
    """
    from vitviz.capture.forward import capture

    _check_mode(mode)
    clean = _clean_run(loaded, image, size, budget_bytes, label_embeddings)
    chosen = _check_heads(clean, heads)
    edits = clean.run.resolve(_edits(clean, [chosen], mode))
    with active(loaded, edits=edits, num_heads=clean.run.num_heads_by_point()):
        cap = capture(loaded, image, size=size, attention_dtype=attention_dtype, budget_bytes=budget_bytes)
    if label_embeddings is None:
        logits = np.asarray(cap.logits, np.float32)
    else:  # the label scores of the knocked-out image embedding, as the forward's logits_per_image
        from vitviz.models.zeroshot import score

        logits = score(loaded.model, loaded.text, cap.image_embedding, label_embeddings).logits
    return cap, Knockout(chosen, mode, frozen(np.array(logits)), frozen(clean.logits.cpu().numpy()))
