"""Does this head matter? Knock-outs and head importance.

Notation: one image, L attention blocks, H heads per block (a table has as many
columns as the widest block; NaN where a block has fewer heads), C classes, the
class explained ``c`` (default: the clean run's top-1). All logits are before
softmax.

**Head knock-out.** In block l, the output projection ``W_o`` of the attention
(the layout's ``projection``) reads the heads' outputs side by side, ``z = [z_1 ..
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
clean logit (on a :class:`~vitviz.capture.targets.Target`: its knocked-out value
minus its clean value, so a difference target's effect is the difference of effects). Several heads at once is one forward pass.

**Head importance** is the effect of knocking out each head alone: an (L, H)
table for class c, computed by the edit grid (:mod:`vitviz.causal.grid`): the
knocked-out copies of a chunk run in one batched forward. For one-grid ViTs a
knock-out in block l changes nothing before block l, so the copies start from the
clean run's residual stream at block l and run only blocks l .. L-1 and the readout:
the cost is ``1 + H (L + 1) / 2`` forward-equivalents (79 for ViT-B/16) against
``1 + L H`` (145) for full passes. Hierarchical models run full (batched) forwards.
``progress(done, total)`` is called after each chunk; ``cancel()`` before each: True
raises :class:`~vitviz.causal.notes.Cancelled`, whose ``partial`` attribute holds the
table so far (``complete=False``, NaN where not computed).

**Zero-shot two-tower models** (CLIP, SigLIP): given a label target
(``Target.of_label(labels, "cat")``), the "logits" are the scores of its labels the
model's forward computes, and knock-outs, head importance and the fast estimate
explain them (full batched forwards: no readout head to replay to).

A knock-out of head h in block l is the edit ``Edit("blocks.{l}.attn.z", "zero" |
"mean", heads=(h,))``; head importance batches copies, each with its own edit
(``rows``). The points are installed once per model (at load) and act only inside a
call (a ``ContextVar``): threads that share one cached model never see each other's
knock-outs, and a call that fails leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES
from vitviz.capture.run import Run
from vitviz.capture.targets import Target
from vitviz.causal.grid import CancelCheck, Job, Progress, chunk_size, replay_cost, run_grid
from vitviz.causal.notes import (
    Cancelled,
    KnockoutMode,
    NotDefined,
    causal_notes,
    check_mode,
    clean_run,
    projections,
    z_name,
)
from vitviz.models.hooks import active
from vitviz.models.load import LoadedModel
from vitviz.models.points import Edit
from vitviz.record import frozen

__all__ = ["Knockout", "HeadImportance", "knock_out", "head_importance", "capture_knocked_out", "knockout_edits"]


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

    ``effects`` ``(L, H)`` float32: the knocked-out value of ``target`` minus the clean one
    (NaN: no such head in that block, no projection, or not computed);
    ``logits`` ``(L, H, C)`` float32: the knocked-out scores (class logits or label scores);
    ``clean_logits`` ``(C,)``; ``class_index``: the target's class or label (``target.index``);
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
    target: Target | None = None

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


def _check_heads(run: Run, heads: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    projs = projections(run)
    out = []
    for item in heads:
        try:
            layer, head = (int(v) for v in item)
        except (TypeError, ValueError):
            raise ValueError(f"a head is given as (block, head), got {item!r}") from None
        if not 0 <= layer < run.num_blocks:
            raise ValueError(f"block {layer} is outside 0..{run.num_blocks - 1}")
        if not 0 <= head < run.num_heads[layer]:
            raise ValueError(f"head {head} is outside 0..{run.num_heads[layer] - 1} (block {layer})")
        if projs[layer] is None:
            raise NotDefined(
                f"block {layer} of {run.loaded.family.name} has no per-head output projection: its heads "
                "cannot be knocked out one by one."
            )
        out.append((layer, head))
    out = tuple(dict.fromkeys(out))
    if not out:
        raise ValueError("no heads given to knock out")
    if len(out) == sum(run.num_heads):
        raise ValueError(
            f"knocking out all {len(out)} heads leaves no attention in the model at all; knock out fewer heads"
        )
    return out


def knockout_edits(run: Run, sets: Sequence[Sequence[tuple[int, int]]], mode: KnockoutMode) -> list[Edit]:
    """Copy i of a batched call knocks out ``sets[i]``: one edit per (block, copy) at the block's ``attn.z``."""
    edits = []
    for i, heads in enumerate(sets):
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        for layer, hs in by_layer.items():
            edits.append(Edit(z_name(run, layer), mode, heads=tuple(hs), rows=(i,)))
    return edits


def knock_out(
    loaded: LoadedModel,
    image: Image.Image,
    heads: Sequence[tuple[int, int]],
    *,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    from_cache: bool = True,
    target: Target | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Knockout:
    """Knock out ``heads`` (``(block, head)`` pairs, 0-based) together in one forward; logits ``(C,)``.

    ``from_cache``: one-grid models start from the clean residual at the first knocked-out block (same numbers
    as a full forward); False runs the whole model. Raises ValueError for heads out of range, an empty set, or
    every head of the model; :class:`NotDefined` where heads cannot be knocked out. ``target``: only its kind
    matters (a label :class:`Target` of a zero-shot two-tower model: the logits are its labels' scores).
    """
    check_mode(mode)
    run = clean_run(loaded, image, size, budget_bytes, target)
    chosen = _check_heads(run, heads)
    got = run.edited(knockout_edits(run, [chosen], mode), reuse_prefix=from_cache)
    return Knockout(chosen, mode, frozen(got.scores[0].cpu().numpy()), frozen(run.scores.cpu().numpy()))


def _importance(
    run: Run,
    t: Target,
    mode: KnockoutMode,
    from_cache: bool,
    chunk: int | None,
    progress: Progress | None,
    cancel: CancelCheck | None,
    budget_bytes: int,
) -> HeadImportance:
    projs = projections(run)
    n_blocks, width = run.num_blocks, max(run.num_heads)
    n_classes = int(run.scores.shape[0])
    logits = np.full((n_blocks, width, n_classes), np.nan, np.float32)
    done_mask = np.zeros((n_blocks, width), bool)
    if not any(p is not None for p in projs):
        raise NotDefined(causal_notes(run.loaded)["knockout"])
    size = chunk_size(run, chunk, budget_bytes)
    jobs = []
    for layer in range(n_blocks):  # chunks never mix blocks: copies of a chunk start at the same block
        if projs[layer] is None:
            continue
        heads = list(range(run.num_heads[layer]))
        for i in range(0, len(heads), size):
            part = [(layer, h) for h in heads[i : i + size]]
            edits = tuple(knockout_edits(run, [[t] for t in part], mode))
            cost = replay_cost(run, layer, len(part)) if from_cache else float(len(part))
            jobs.append(Job(tuple(part), edits, reuse_prefix=from_cache, estimate=cost))
    clean_np = run.scores.cpu().numpy()
    replay = from_cache and run.replayable

    def store(job: Job, got) -> None:
        for (layer, head), row in zip(job.cells, got.scores.cpu().numpy(), strict=True):
            logits[layer, head] = row
            done_mask[layer, head] = True

    outcome = run_grid(run, jobs, store, progress=progress, cancel=cancel, work=1.0)
    eff = np.where(done_mask, t.select(logits) - t.select(clean_np), np.nan).astype(np.float32)
    lg = np.where(done_mask[..., None], logits, np.nan).astype(np.float32)
    result = HeadImportance(
        frozen(eff),
        frozen(lg),
        frozen(clean_np.copy()),
        t.index,
        mode,
        run.num_heads,
        outcome.complete,
        round(outcome.work, 3),
        replay,
        t,
    )
    if outcome.stopped == "cancelled":
        raise Cancelled(f"head importance cancelled after {outcome.done} of {outcome.total} knock-outs", result)
    return result


def head_importance(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    target: Target | int | None = None,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    from_cache: bool = True,
    chunk: int | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> HeadImportance:
    """The effect of knocking out each head alone on ``target`` (a :class:`Target`, a class index, or None: the
    top-1): an (L, H) table.

    ``chunk``: copies per batched forward (default: as many as ``budget_bytes`` allows, at most 64; chunks
    never mix blocks). ``progress(done, total)`` after each chunk; ``cancel()`` before each: True raises
    :class:`Cancelled` carrying the partial table. ``from_cache=False`` runs full forwards (for checks).
    A label target of a zero-shot model explains its labels' scores.
    """
    check_mode(mode)
    run = clean_run(loaded, image, size, budget_bytes, target)
    return _importance(run, run.target(target), mode, from_cache, chunk, progress, cancel, budget_bytes)


def capture_knocked_out(
    loaded: LoadedModel,
    image: Image.Image,
    heads: Sequence[tuple[int, int]],
    *,
    mode: KnockoutMode = "mean",
    size: int | tuple[int, int] | None = None,
    target: Target | None = None,
    attention_dtype: str = "float16",
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
):
    """The capture of the image with ``heads`` knocked out, and the knock-out's logits against the clean ones.

    One clean run (for the mean values), then :func:`vitviz.capture.forward.capture` with the
    knock-out in place, so every block after the first knocked-out one shows the attention
    the model computes without those heads. Returns ``(Capture, Knockout)``; ``target`` as in :func:`knock_out`.
    """
    from vitviz.capture.forward import capture

    check_mode(mode)
    run = clean_run(loaded, image, size, budget_bytes, target)
    chosen = _check_heads(run, heads)
    edits = run.resolve(knockout_edits(run, [chosen], mode))
    with active(loaded, edits=edits, num_heads=run.num_heads_by_point()):
        cap = capture(loaded, image, size=size, attention_dtype=attention_dtype, budget_bytes=budget_bytes)
    if run.labels is None:
        logits = np.asarray(cap.logits, np.float32)
    else:  # the label scores of the knocked-out image embedding, as the forward's logits_per_image
        from vitviz.models.zeroshot import score

        logits = score(loaded.model, loaded.text, cap.image_embedding, run.text_embeddings).logits
    return cap, Knockout(chosen, mode, frozen(np.array(logits)), frozen(run.scores.cpu().numpy()))
