"""The edit grid: every causal analysis as batches of edited forwards of one Run, with one progress and cancel loop.

An analysis (head importance, activation patching, attention-pattern and path patching)
describes its work as :class:`Job` s: each job is one batched forward of the image's
clean :class:`~vitviz.capture.run.Run` with edits (``Edit.rows`` picks the copy each edit
applies to) and points to record. :func:`run_grid` runs them in order through
``Run.edited`` (which replays one-grid ViTs from the clean residual), hands each result
to the analysis, and owns what every analysis needs around that loop:

* ``progress(done, total)`` after each job (``done`` counts cells: copies);
* ``cancel()`` before each job: True stops the grid (``Outcome.stopped == "cancelled"``);
* ``max_work``: a bound on the work, in forward-equivalents times the image's tokens
  (what one request may cost a public server); the grid stops before a job that would
  pass it (``stopped == "capped"``), so a result says what was capped;
* ``slot``: a context manager factory held around each job alone (a server's forward
  queue): other visitors' forwards run between the batches of a long grid.

Work is counted as ``Run.edited`` reports it: passes of the whole model over one image
(a replay from block l of L counts ``(L - l) / L`` per copy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

from vitviz.capture.forward import check_budget
from vitviz.errors import VitvizError
from vitviz.models.points import Edit

__all__ = ["Job", "Outcome", "Progress", "CancelCheck", "run_grid", "chunks", "chunk_size", "MAX_CHUNK"]

Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]
MAX_CHUNK = 64  # copies per batched forward at most


@dataclass(frozen=True)
class Job:
    """One batched edited forward: copy i computes ``cells[i]`` (whatever the analysis keys its results by)."""

    cells: tuple[Any, ...]
    edits: tuple[Edit, ...]
    record: tuple[str, ...] = ()
    reuse_prefix: bool = True
    estimate: float = 0.0  # forward-equivalents it will cost (for ``max_work``); 0: one per copy

    @property
    def batch(self) -> int:
        return len(self.cells)


@dataclass
class Outcome:
    """How far a grid got: cells done of ``total``, the work in forward-equivalents, and why it stopped early
    (``""``: it did not; ``"cancelled"``; ``"capped"``: the next job would have passed ``max_work``)."""

    done: int = 0
    total: int = 0
    work: float = 0.0
    stopped: Literal["", "cancelled", "capped"] = ""
    capped_at: float = 0.0  # the work bound (forward-equivalents x tokens) when capped
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.stopped


def chunks(n: int, size: int) -> list[range]:
    """``range(n)`` cut into consecutive pieces of at most ``size``."""
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def chunk_size(run, chunk: int | None, budget_bytes: int) -> int:
    """Copies per batched forward: ``chunk`` when given (at least 1), else the most (up to 64, halving) whose
    attention fits ``budget_bytes`` (the same check a capture makes)."""
    if chunk is not None:
        if isinstance(chunk, bool) or int(chunk) < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        return int(chunk)
    k = MAX_CHUNK
    while k > 1:
        try:
            check_budget(run.loaded, run.input_size, batch=k, gradients=False, budget=budget_bytes)
            return k
        except VitvizError:
            k //= 2
    return 1


def tokens_of(run) -> int:
    """Tokens of the image's first block (the unit ``max_work`` multiplies forward-equivalents by)."""
    x = run.block_tokens(run.sites[0].index)[0] if run.sites and run.has_block(run.sites[0].index) else None
    return int(x.shape[1]) if x is not None and x.dim() >= 2 else 1


def run_grid(
    run,
    jobs: Sequence[Job],
    on_result: Callable[[Job, Any], None],
    *,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    max_work: float | None = None,
    slot: Callable[[], AbstractContextManager] | None = None,
    work: float = 0.0,
) -> Outcome:
    """Run ``jobs`` on ``run`` in order; ``on_result(job, edited)`` with each :class:`~vitviz.capture.run.Edited`.

    ``work``: forward-equivalents already spent (the clean runs), counted against ``max_work`` too.
    """
    total = sum(j.batch for j in jobs)
    out = Outcome(total=total, work=work)
    tokens = tokens_of(run)
    for job in jobs:
        if cancel is not None and cancel():
            out.stopped = "cancelled"
            return out
        cost = job.estimate or float(job.batch)
        if max_work is not None and (out.work + cost) * tokens > max_work:
            out.stopped = "capped"
            out.capped_at = float(max_work)
            return out
        with slot() if slot is not None else nullcontext():
            got = run.edited(list(job.edits), batch=job.batch, reuse_prefix=job.reuse_prefix, record=job.record)
        on_result(job, got)
        out.work += got.forward_equivalents
        out.done += job.batch
        if progress is not None:
            progress(out.done, total)
    return out


def replay_cost(run, first_block: int, batch: int) -> float:
    """Forward-equivalents of a replay of ``batch`` copies from block ``first_block`` (full forwards if the run
    cannot be replayed)."""
    if not run.replayable:
        return float(batch)
    return batch * (run.num_blocks - first_block) / max(1, run.num_blocks)


def iter_rows(cells: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """``(row, cell)`` of a job's copies."""
    return iter(enumerate(cells))
