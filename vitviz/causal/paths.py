"""Attention-pattern patching and path patching between two images, head by head.

Two images, the **target** and the **source**, at the same model input; ``y`` is a
:class:`~vitviz.capture.targets.Target` of the target's scores (default: the logit of the
target image's top-1 class), before softmax. Both analyses give an ``(L, H)`` grid of
``y`` (NaN where a block has fewer heads or the analysis is not defined for it), with
``y`` of the two unpatched runs beside it.

* **Attention-pattern patching** ``pattern[l, h]``: in the target's run, head h's
  attention probabilities in block l are the source's; its values, and everything else,
  are the target's own, and the change propagates through every later block. It
  separates *where a head looks* from *what it moves* (head patching of ``z`` moves
  both). One edit per cell: ``Edit("blocks.{l}.attn.pattern", "patch", source, heads=(h,))``.
* **Path patching** (Wang et al. 2022) ``path[l, h]``, to the read-out: the target's run
  with head h of block l taking the source's output ``z`` on the direct path only: every
  later block reads the target's own activations, so the final residual stream changes
  by that head's output difference through the output projection (times the block's
  layer scale) and nothing else. With the registry this is "patch the sender, freeze the
  rest": the sender's ``attn.z`` columns are patched from the source, and block l's MLP
  update and every later block's attention and MLP updates (``attn.out``, ``mlp.out``)
  are patched from the target's own clean run.
* **Path patching to receivers** (``receivers=[(m, h', "q" | "k" | "v"), ...]``, every
  receiver in a later block than the sender): first the sender is patched with the rest
  frozen as above, and each receiver's input (its head's slice of ``attn.q``, ``attn.k``
  or ``attn.v``) is recorded from that forward; then the target's clean run is edited
  with only those receiver inputs replaced, and everything after them runs as usual.

Cost, in forward-equivalents (passes of the whole model over one image), for one-grid
ViTs that replay from the clean residual (``Run.edited``): the two clean runs (the
target's Run, often the page's already, and the source's, which records its patterns),
plus ``H (L + 1) / 2`` for the pattern grid (block l's copies run blocks l .. L - 1) and
the same for the path grid to the read-out; receivers add a second replay per sender
block from the first receiver's block. Other families run full batched forwards (``L H``
each). Where a family lacks a point the analysis needs (an editable pattern, ``attn.out``
and ``mlp.out`` in every block), the call refuses with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES
from vitviz.capture.run import PATTERN_PARTS, SOURCE_PARTS, Run
from vitviz.capture.targets import Target
from vitviz.causal.grid import CancelCheck, Job, Outcome, Progress, chunk_size, chunks, replay_cost, run_grid
from vitviz.causal.notes import NotDefined, target_values
from vitviz.errors import VitvizError
from vitviz.models.load import LoadedModel
from vitviz.models.points import Edit
from vitviz.record import frozen

__all__ = ["HeadPatching", "HeadPatchingCancelled", "Receiver", "pattern_patching", "path_patching"]

Receiver = tuple[int, int, Literal["q", "k", "v"]]


@dataclass(frozen=True)
class HeadPatching:
    """One head grid: ``values`` ``(L, H)`` float32, ``y`` with one head patched (NaN: no such head, not
    defined, or not computed). ``clean`` and ``source``: ``y`` of the two unpatched runs. ``kind``: "pattern" or
    "path"; ``receivers``: a path's receivers (empty: the read-out). ``complete`` is False when the grid stopped
    early (cancelled, or capped by a work bound: ``notes["capped"]`` says so)."""

    kind: Literal["pattern", "path"]
    values: np.ndarray = field(repr=False)
    target: Target
    target_name: str
    clean: float
    source: float
    num_heads: tuple[int, ...]
    receivers: tuple[Receiver, ...]
    complete: bool
    forward_equivalents: float
    notes: dict[str, str]


class HeadPatchingCancelled(VitvizError):
    """``cancel()`` returned True; ``partial`` holds the grid so far."""

    def __init__(self, message: str, partial: HeadPatching) -> None:
        super().__init__(message)
        self.partial = partial


def _point(run: Run, layer: int, part: str) -> str:
    return run.name(run.sites[layer].index, part)


def _need(run: Run, names: Sequence[str], what: str) -> None:
    missing = [n for n in names if not run.has(n)]
    if missing:
        raise NotDefined(
            f"{what} is not defined for '{run.loaded.name}': the {run.loaded.family.name} adapter gives no "
            f"{missing[0]} point (the analysis edits or freezes it)."
        )


def _check_receivers(run: Run, receivers: Sequence[Receiver]) -> tuple[Receiver, ...]:
    out = []
    for item in receivers:
        try:
            layer, head, kind = int(item[0]), int(item[1]), str(item[2])
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"a receiver is (block, head, 'q' | 'k' | 'v'), got {item!r}") from None
        if kind not in ("q", "k", "v"):
            raise ValueError(f"a receiver reads 'q', 'k' or 'v', got {kind!r}")
        if not 0 <= layer < run.num_blocks:
            raise ValueError(f"receiver block {layer} is outside 0..{run.num_blocks - 1}")
        if not 0 <= head < run.num_heads[layer]:
            raise ValueError(f"receiver head {head} is outside 0..{run.num_heads[layer] - 1} (block {layer})")
        out.append((layer, head, kind))
    return tuple(dict.fromkeys(out))


def _grid(
    kind: Literal["pattern", "path"],
    run: Run,
    source,
    t: Target,
    names: dict[int, str] | None,
    values: np.ndarray,
    outcome: Outcome,
    receivers: tuple[Receiver, ...],
    notes: dict[str, str],
) -> HeadPatching:
    if outcome.stopped == "capped":
        notes = {
            **notes,
            "capped": (
                f"Stopped after {outcome.done} of {outcome.total} patched heads: the next batch would pass this "
                f"server's bound on one request's work ({outcome.capped_at:,.0f} forward-equivalents x tokens)."
            ),
        }
    return HeadPatching(
        kind=kind,
        values=frozen(values.copy()),
        target=t,
        target_name=t.name(names),
        clean=float(target_values(t, run.scores[None])[0]),
        source=float(target_values(t, source.scores[None])[0]),
        num_heads=run.num_heads,
        receivers=receivers,
        complete=outcome.complete,
        forward_equivalents=round(outcome.work, 3),
        notes=notes,
    )


def _setup(loaded, target_image, source_image, target, size, budget_bytes, parts):
    """The target image's Run, the source's values, the checked target and the class names (None for labels)."""
    from vitviz.causal.patching import _runs

    run, source = _runs(loaded, target_image, source_image, size, budget_bytes, target, False, parts)
    t = run.target(target)
    return run, source, t, None if t.is_label else loaded.id2label


def pattern_patching(
    loaded: LoadedModel,
    target_image: Image.Image,
    source_image: Image.Image,
    *,
    target: Target | int | None = None,
    size: int | tuple[int, int] | None = None,
    chunk: int | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    max_work: float | None = None,
    slot: Callable[[], AbstractContextManager] | None = None,
) -> HeadPatching:
    """``y`` with head h's attention pattern in block l taken from ``source_image``: an ``(L, H)`` grid (module
    docstring). ``max_work`` bounds the work (forward-equivalents x tokens; a capped grid says so), ``slot`` is
    held around each batch (a server's forward queue)."""
    run, source, t, names = _setup(loaded, target_image, source_image, target, size, budget_bytes, PATTERN_PARTS)
    patterns = [_point(run, layer, "attn.pattern") for layer in range(run.num_blocks)]
    editable = [run.points.by_name[n].editable and source.has(n) for n in patterns]
    if not any(editable):
        why = run.points.by_name[patterns[0]].why or "the source run kept no patterns"
        raise NotDefined(f"Attention-pattern patching is not defined for '{loaded.name}': {why}.")
    notes = {}
    if not all(editable):
        notes["pattern"] = (
            f"Only {sum(editable)} of {len(editable)} blocks' patterns can be edited; the others are NaN."
        )
    width = max(run.num_heads)
    values = np.full((run.num_blocks, width), np.nan, np.float32)
    size_k = chunk_size(run, chunk, budget_bytes)
    jobs = []
    for layer, ok in enumerate(editable):
        if not ok:
            continue
        name = patterns[layer]
        for r in chunks(run.num_heads[layer], size_k):
            heads = list(r)
            edits = tuple(Edit(name, "patch", source, heads=(h,), rows=(i,)) for i, h in enumerate(heads))
            cells = tuple((layer, h) for h in heads)
            jobs.append(Job(cells, edits, estimate=replay_cost(run, layer, len(heads))))
    return _finish("pattern", run, source, t, names, values, jobs, (), notes, progress, cancel, max_work, slot)


def _finish(kind, run, source, t, names, values, jobs, receivers, notes, progress, cancel, max_work, slot):
    def store(job: Job, got) -> None:
        ys = target_values(t, got.scores)
        for (layer, head), y in zip(job.cells, ys, strict=True):
            values[layer, head] = y

    outcome = run_grid(run, jobs, store, progress=progress, cancel=cancel, max_work=max_work, slot=slot, work=2.0)
    result = _grid(kind, run, source, t, names, values, outcome, receivers, notes)
    if outcome.stopped == "cancelled":
        raise HeadPatchingCancelled(
            f"{kind} patching cancelled after {outcome.done} of {outcome.total} patched heads", result
        )
    return result


def _freeze(run: Run, first_layer: int) -> list[Edit]:
    """Block ``first_layer``'s MLP update and every later block's attention and MLP updates, from the clean run."""
    out = [Edit(_point(run, first_layer, "mlp.out"), "patch", run)]
    for m in range(first_layer + 1, run.num_blocks):
        out += [Edit(_point(run, m, "attn.out"), "patch", run), Edit(_point(run, m, "mlp.out"), "patch", run)]
    return out


def path_patching(
    loaded: LoadedModel,
    target_image: Image.Image,
    source_image: Image.Image,
    *,
    target: Target | int | None = None,
    receivers: Sequence[Receiver] = (),
    size: int | tuple[int, int] | None = None,
    chunk: int | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    max_work: float | None = None,
    slot: Callable[[], AbstractContextManager] | None = None,
) -> HeadPatching:
    """Path patching from each head to the read-out (``receivers`` empty), or to the given later heads' q, k or v
    inputs: an ``(L, H)`` grid of ``y`` (module docstring). Senders in or after the first receiver's block are NaN."""
    run, source, t, names = _setup(loaded, target_image, source_image, target, size, budget_bytes, SOURCE_PARTS)
    receivers = _check_receivers(run, receivers)
    n = run.num_blocks
    z = [_point(run, layer, "attn.z") for layer in range(n)]
    _need(run, z + [_point(run, m, p) for m in range(n) for p in ("attn.out", "mlp.out")], "Path patching")
    width = max(run.num_heads)
    values = np.full((n, width), np.nan, np.float32)
    size_k = chunk_size(run, chunk, budget_bytes)
    last_sender = min((m for m, _, _ in receivers), default=n) - 1
    notes: dict[str, str] = {}
    if receivers and last_sender < 0:
        raise ValueError("every receiver is in block 0: no earlier block can send to it")
    if receivers:
        notes["receivers"] = (
            "Receivers: "
            + ", ".join(f"block {m} head {h} {k}" for m, h, k in receivers)
            + f"; senders in block {last_sender + 1} or later are NaN."
        )
    jobs = []
    for layer in range(last_sender + 1):
        if not source.has(z[layer]):
            continue
        for r in chunks(run.num_heads[layer], size_k):
            heads = list(r)
            edits = [Edit(z[layer], "patch", source, heads=(h,), rows=(i,)) for i, h in enumerate(heads)]
            edits += _freeze(run, layer)
            cells = tuple((layer, h) for h in heads)
            jobs.append(Job(cells, tuple(edits), estimate=replay_cost(run, layer, len(heads))))
    if not receivers:
        return _finish("path", run, source, t, names, values, jobs, (), notes, progress, cancel, max_work, slot)
    return _to_receivers(run, source, t, names, values, jobs, receivers, notes, progress, cancel, max_work, slot)


def _to_receivers(run, source, t, names, values, jobs, receivers, notes, progress, cancel, max_work, slot):
    """Each sender job: record the receivers' inputs in its frozen forward, then replay the clean run with only those
    receiver inputs replaced; ``y`` of that."""
    points = {(m, k): _point(run, m, f"attn.{k}") for m, _, k in receivers}
    _need(run, list(points.values()), "Path patching to receivers")
    record = tuple(dict.fromkeys(points.values()))
    first_receiver = min(m for m, _, _ in receivers)
    staged = [Job(j.cells, j.edits, record=record, estimate=j.estimate) for j in jobs]
    pending: list[tuple[Job, dict]] = []

    def keep(job: Job, got) -> None:
        pending.append((job, got.records))

    outcome = run_grid(run, staged, keep, progress=progress, cancel=cancel, max_work=max_work, slot=slot, work=2.0)
    second = []
    for job, records in pending:
        edits = []
        for i in range(job.batch):
            for m, h, k in receivers:
                name = points[(m, k)]
                edits.append(Edit(name, "replace", records[name][i : i + 1], heads=(h,), rows=(i,)))
        second.append(Job(job.cells, tuple(edits), estimate=replay_cost(run, first_receiver, job.batch)))

    def store(job: Job, got) -> None:
        for (layer, head), y in zip(job.cells, target_values(t, got.scores), strict=True):
            values[layer, head] = y

    more = run_grid(run, second, store, cancel=cancel, max_work=max_work, slot=slot, work=outcome.work)
    if outcome.stopped and not more.stopped:
        more.stopped = outcome.stopped
        more.capped_at = outcome.capped_at
    more.done, more.total = outcome.done, outcome.total
    result = _grid("path", run, source, t, names, values, more, receivers, notes)
    if more.stopped == "cancelled":
        raise HeadPatchingCancelled(f"path patching cancelled after {more.done} of {more.total} senders", result)
    return result
