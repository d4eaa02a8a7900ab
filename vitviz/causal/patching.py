"""Activation patching between two images, and attribution patching (its first-order estimate).

Definitions (docs/definitions.md#activation-patching; Meng et al. 2022, Heimersheim &
Nanda 2024). Two images, the **target** and the **source**, each resized to the same model
input. The measured scalar ``y`` is a :class:`~vitviz.capture.targets.Target` of the
target's scores (default: the logit of the target's top-1 class; a zero-shot label's
score; or a difference of two), always before softmax.

* **Residual patching** ``residual[l, t]``: in the target's run, block l's output at
  token t (prefix tokens first, as ``token_kinds``) is replaced by the source run's
  value there; the rest runs as usual; ``y`` of that run.
* **Head patching** ``heads[l, h]``: head h's output ``z_h`` in block l (its slice of
  the output projection's input, every token) replaced by the source's; ``y``.
* ``clean`` and ``source``: ``y`` of the two unpatched runs. Patching every token of the
  last block gives ``source`` (the readout sees the source's residual); patching a
  run with itself gives ``clean`` everywhere.
* **Attribution patching** (Nanda 2023; Syed et al. 2023): ``clean + grad_target(y) .
  (a_source - a_target)`` at each point, from one forward and one backward on the
  target and one forward on the source (:mod:`vitviz.analysis.first_order`).

Attention-pattern and path patching, head by head, are :mod:`vitviz.causal.paths`; the
per-patch logit lens is :mod:`vitviz.causal.lens`.

Cost (forward-equivalents: passes of the whole model over one image). One-grid models
with a readout head reuse the target's clean run: a patch in block l runs blocks
l + 1 .. L - 1 only (residual; ``T (L - 1) / 2`` in all) or blocks l .. L - 1
(heads; ``H (L + 1) / 2``), every position of a block in batched copies, plus the two
clean runs. Elsewhere (hierarchical models, zero-shot label scores) patches run full
batched forwards; residual patching is not defined for hierarchical models (grids and
widths change between stages). The estimate reads the gradient from the target run's
graph: one backward pass, no forward. The exact grids are jobs of the edit grid
(:mod:`vitviz.causal.grid`): ``progress(done, total)`` after each batch; ``cancel()``
before each: True raises :class:`PatchingCancelled` carrying the partial result (NaN
where not computed); ``max_work`` caps the work and ``slot`` lets other forwards run
between batches.

The source image only lends values: its head outputs and block outputs (and its scores),
from one forward in inference mode that keeps nothing else (no attention, no summaries,
no graph; :func:`~vitviz.capture.run.get_activations`, cached), or from its cached
Run when a page made one. Given the target's clean Run (the page's), the estimate costs
that one light forward and one backward; exact grids after it run no whole forward. The
gradients of a (run, target) are kept (the last few), so the estimate for another source
image of the same target costs its light forward alone.

Built on the :class:`~vitviz.capture.run.Run` (one clean forward per image, cached,
with its autograd graph) and the named points of :mod:`vitviz.models.points`: a head
patch is the edit ``Edit("blocks.{l}.attn.z", "patch", source_run, heads=(h,))``; a
residual patch at (l, t) replaces token t of the residual entering block l + 1 (the
same tensor as ``blocks.{l}.out``) and replays from there, or, where the run cannot be
replayed (zero-shot label scores), is ``Edit("blocks.{l}.out", "patch", source_run,
tokens=(t,))`` in a full batched forward. Nothing is added to or removed from a
shared model.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.analysis.first_order import head_estimate, residual_estimate
from vitviz.cache import BoundedCache
from vitviz.capture.forward import DEFAULT_BUDGET_BYTES, input_size_for, token_layout
from vitviz.capture.run import SOURCE_PARTS, Activations, Run, get_activations, get_run
from vitviz.capture.targets import Target, label_set
from vitviz.causal.grid import CancelCheck, Job, Progress, chunk_size, chunks, replay_cost, run_grid
from vitviz.causal.notes import NotDefined, causal_notes, target_values
from vitviz.errors import VitvizError
from vitviz.models.load import LoadedModel
from vitviz.models.points import Edit
from vitviz.record import frozen

__all__ = [
    "Patching",
    "PatchingCancelled",
    "activation_patching",
]


class PatchingCancelled(VitvizError):
    """``cancel()`` returned True; ``partial`` holds the :class:`Patching` so far (NaN where not computed)."""

    def __init__(self, message: str, partial: Patching) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class Patching:
    """Patching the source image's activations into the target image's run (see the module docstring).

    ``residual`` ``(L, T)``, ``heads`` ``(L, H)`` float32: ``y`` of each patched run (NaN: not computed,
    no such head); ``residual_estimate``, ``heads_estimate``: attribution patching's estimate of the same;
    None where not asked or not defined (``notes`` says why); ``clean``, ``source``: ``y`` unpatched.
    """

    target: Target
    target_name: str
    clean: float
    source: float
    residual: np.ndarray | None = field(repr=False)
    heads: np.ndarray | None = field(repr=False)
    residual_estimate: np.ndarray | None = field(repr=False)
    heads_estimate: np.ndarray | None = field(repr=False)
    token_kinds: tuple[str, ...]
    grid: tuple[int, int]
    num_prefix: int
    num_heads: tuple[int, ...]
    complete: bool
    forward_equivalents: float
    notes: dict[str, str] = field(default_factory=dict)  # grid left out -> why

    def residual_map(self, block: int, estimate: bool = False) -> np.ndarray:
        """Block ``block``'s patch tokens ``(gh, gw)`` of the residual grid (or its estimate)."""
        table = self.residual_estimate if estimate else self.residual
        if table is None:
            raise NotDefined(self.notes.get("residual", "residual patching was not computed"))
        return table[block, self.num_prefix :].reshape(self.grid)


# --- the two clean runs --------------------------------------------------------------------------


def _runs(
    loaded: LoadedModel,
    target_image: Image.Image,
    source_image: Image.Image,
    size,
    budget_bytes: int,
    target: Target | int | None,
    gradients: bool,
    parts: tuple[str, ...] = SOURCE_PARTS,
) -> tuple[Run, Run | Activations]:
    """The target image's clean Run and the source's values, both scoring what ``target`` reads."""
    hw = input_size_for(loaded, size, target_image.size)
    labels = label_set(target)
    clean = get_run(loaded, target_image, size=hw, labels=labels, budget_bytes=budget_bytes, gradients=gradients)
    # The source only lends values at the points patched (head outputs, block outputs): its cached Run if the
    # page made one, else one inference-mode forward that keeps nothing else (no attention, no summaries).
    source = get_activations(loaded, source_image, size=hw, labels=labels, budget_bytes=budget_bytes, parts=parts)
    if source.input_size != clean.input_size:  # a family that follows each image's aspect ratio (SigLIP 2 NaFlex)
        raise NotDefined(
            f"{loaded.family.name} gives the two images different inputs ({clean.input_size[0]}x"
            f"{clean.input_size[1]} and {source.input_size[0]}x{source.input_size[1]} px): their activations "
            "cannot be patched into each other."
        )
    if clean.scores.numel() == 0:
        raise NotDefined(causal_notes(loaded)["knockout"] or f"'{loaded.name}' gives no scores to patch.")
    for site in clean.sites:
        a, b = clean.block_tokens(site.index)[1], source.block_tokens(site.index)[1]
        if a is not None and b is not None and a.shape != b.shape:
            raise NotDefined(
                f"block {site.index} of {loaded.family.name} has {tuple(a.shape[1:])} tokens for the target and "
                f"{tuple(b.shape[1:])} for the source: the grids differ between the two runs, so the source's "
                "activations do not fit the target's run."
            )
    return clean, source


# --- exact patching ------------------------------------------------------------------------------


def z_name(run: Run, layer: int) -> str | None:
    name = run.name(run.sites[layer].index, "attn.z")
    return name if run.has(name) else None


def _head_tasks(clean: Run, source: Run | Activations) -> list[tuple[int, int]]:
    tasks = []
    for layer in range(clean.num_blocks):
        name = z_name(clean, layer)
        if name is None or not source.has(name):
            continue
        a, b = clean.activation(name), source.activation(name)
        if a.shape != b.shape:
            raise NotDefined(
                f"head outputs of block {layer} have shape {tuple(a.shape[1:])} for the target and "
                f"{tuple(b.shape[1:])} for the source: the grids differ between the two runs."
            )
        tasks.extend((layer, h) for h in range(clean.num_heads[layer]))
    return tasks


def _residual_note(clean: Run) -> str:
    loaded = clean.loaded
    if loaded.family.hierarchical:
        return (
            f"Residual patching is not defined for {loaded.family.name}: its token grid and width change between "
            "stages, so there is no one residual stream of (block, token) points to patch."
        )
    if any(clean.block_tokens(s.index)[1] is None for s in clean.sites):
        return f"The {loaded.family.name} adapter gives no block outputs to patch."
    return ""


# --- attribution patching ------------------------------------------------------------------------


GRADS_KEPT = 4  # (run, target) gradient sets kept: another source image for the same target needs no backward
GRADS_MB = 512  # ... and their bytes at most


def _grads_bytes(entry: tuple[weakref.ref, list]) -> int:
    return sum(g.untyped_storage().nbytes() for g in entry[1] if g is not None)


_GRADS: BoundedCache[tuple[weakref.ref, list]] = BoundedCache(
    max_entries=GRADS_KEPT, max_bytes=GRADS_MB * 2**20, size_of=_grads_bytes
)


def _target_gradients(clean: Run, t: Target, names: list[str]) -> tuple[list[torch.Tensor | None], bool]:
    """``d y / d x`` at each point of ``names`` in the target's clean run (one backward, kept for the next source
    image of the same run and target); and whether the backward ran now."""
    key = (id(clean), t, tuple(names))
    ran = []

    def compute() -> tuple[weakref.ref, list]:
        def y(out) -> torch.Tensor:
            return t.select(clean.score_of(out))[0]

        ran.append(True)
        return weakref.ref(clean), [None if g is None else g.detach() for g in clean.gradients(y, names)]

    # A kept entry of another Run that happened to get this one's id (the first was freed) is recomputed.
    _, grads = _GRADS.get_or_compute(key, compute, accept=lambda entry: entry[0]() is clean)
    return grads, bool(ran)


def _estimates(
    clean: Run, source: Run | Activations, t: Target, residual: bool, heads: bool
) -> tuple[np.ndarray | None, np.ndarray | None, str, bool]:
    """Attribution patching from one backward pass through the target run's graph (none where the gradients of
    this run and target are kept); (.., .., why not, whether a backward ran)."""
    if not clean.has_graph:
        return (
            None,
            None,
            (
                "The estimate needs the target run's autograd graph, which was not kept (over the memory budget, "
                f"or {clean.loaded.family.name} has no gradient path through its attention)."
            ),
            False,
        )
    res_names = [clean.name(s.index, "out") for s in clean.sites] if residual else []
    z_names = []
    if heads:
        z_names = [n for n in (z_name(clean, i) for i in range(clean.num_blocks)) if n is not None and source.has(n)]

    grads, computed = _target_gradients(clean, t, [*res_names, *z_names])
    y0 = float(target_values(t, clean.scores[None])[0])
    res_est = head_est = None
    if residual:
        tokens = int(clean.activation(res_names[-1]).shape[1])
        res_est = np.full((clean.num_blocks, tokens), np.nan, np.float32)
        for layer, (name, g) in enumerate(zip(res_names, grads, strict=False)):
            a = clean.activation(name)
            g = torch.zeros_like(a) if g is None else g
            res_est[layer] = y0 + residual_estimate(_np(g)[:1], _np(a)[:1], _np(source.activation(name))[:1])[0]
    if heads:
        head_est = np.full((clean.num_blocks, max(clean.num_heads)), np.nan, np.float32)
        layer_of = {z_name(clean, i): i for i in range(clean.num_blocks)}
        for name, g in zip(z_names, grads[len(res_names) :], strict=True):
            layer = layer_of[name]
            z = clean.activation(name)
            g = torch.zeros_like(z) if g is None else g
            w, h = z.shape[-1], clean.num_heads[layer]
            head_est[layer, :h] = y0 + head_estimate(
                _np(g).reshape(-1, w), _np(z).reshape(-1, w), _np(source.activation(name)).reshape(-1, w), h
            )
    return res_est, head_est, "", computed


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


# --- the public call -----------------------------------------------------------------------------


def activation_patching(
    loaded: LoadedModel,
    target_image: Image.Image,
    source_image: Image.Image,
    *,
    target: Target | int | None = None,
    size: int | tuple[int, int] | None = None,
    residual: bool = True,
    heads: bool = True,
    exact: bool = True,
    estimate: bool = True,
    chunk: int | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    max_work: float | None = None,
    slot: Callable[[], AbstractContextManager] | None = None,
) -> Patching:
    """Patch ``source_image``'s activations into ``target_image``'s run, point by point (module docstring).

    ``target``: what is measured (a :class:`~vitviz.capture.targets.Target` or a class index; default: the
    target image's top-1; a label target of a zero-shot model: its labels' scores). ``residual``, ``heads``: which
    grids; ``exact``: run the patched forwards; ``estimate``: attribution patching (one forward and one backward).
    ``max_work`` bounds the exact grids' work (forward-equivalents x tokens: a public server's bound on one
    request; a capped result says so in ``notes["capped"]`` and is not ``complete``); ``slot`` is held around
    each batch (a server's forward queue: other visitors' forwards run between the batches). Raises
    :class:`NotDefined` when nothing asked is defined for the model, with the reason.
    """
    clean, source = _runs(loaded, target_image, source_image, size, budget_bytes, target, estimate)
    t = clean.target(target)
    names = None if t.is_label else loaded.id2label
    notes: dict[str, str] = {}
    res_note = _residual_note(clean) if residual else ""
    if res_note:
        notes["residual"] = res_note
    tasks = _head_tasks(clean, source) if heads else []
    if heads and not tasks:
        notes["heads"] = causal_notes(loaded)["knockout"] or (
            f"{loaded.family.name} has no per-head output projection the patch can edit."
        )
    do_res = residual and not res_note
    do_heads = heads and bool(tasks)
    if not do_res and not do_heads:
        raise NotDefined(" ".join(notes.values()) or "nothing to patch: ask for the residual or the head grid")
    n = clean.num_blocks
    tokens = int(clean.block_tokens(clean.sites[-1].index)[1].shape[1]) if do_res else 0
    res = np.full((n, tokens), np.nan, np.float32) if do_res and exact else None
    hd = np.full((n, max(clean.num_heads)), np.nan, np.float32) if do_heads and exact else None
    clean_y = float(target_values(t, clean.scores[None])[0])
    source_y = float(target_values(t, source.scores[None])[0])
    work = 2.0
    kinds, grid = token_layout(loaded, clean.input_size) if do_res else ((), (0, 0))
    num_prefix = len(kinds)
    token_kinds = (*kinds, *("patch",) * (grid[0] * grid[1]))

    def result(complete: bool, res_est=None, head_est=None) -> Patching:
        return Patching(
            target=t,
            target_name=t.name(names),
            clean=clean_y,
            source=source_y,
            residual=None if res is None else frozen(res.copy()),
            heads=None if hd is None else frozen(hd.copy()),
            residual_estimate=None if res_est is None else frozen(res_est),
            heads_estimate=None if head_est is None else frozen(head_est),
            token_kinds=token_kinds,
            grid=tuple(int(g) for g in grid),
            num_prefix=num_prefix,
            num_heads=clean.num_heads,
            complete=complete,
            forward_equivalents=round(work, 3),
            notes=dict(notes),
        )

    res_est = head_est = None
    if estimate:
        res_est, head_est, why, backward = _estimates(clean, source, t, do_res, do_heads)
        if why:
            notes["estimate"] = why
        elif backward:
            work += 1.0  # one backward pass through the target run's graph (about one forward)
    if exact:
        size_k = chunk_size(clean, chunk, budget_bytes)
        jobs: list[Job] = []
        if do_res:  # block l's output at token t, from the source: a replay from block l + 1
            for layer in range(n):
                name = clean.name(clean.sites[layer].index, "out")
                for r in chunks(tokens, size_k):
                    edits = tuple(Edit(name, "patch", source, tokens=(tok,), rows=(i,)) for i, tok in enumerate(r))
                    cells = tuple(("residual", layer, tok) for tok in r)
                    jobs.append(Job(cells, edits, estimate=replay_cost(clean, layer + 1, len(r))))
        if do_heads:
            by_layer: dict[int, list[int]] = {}
            for layer, h in tasks:
                by_layer.setdefault(layer, []).append(h)
            for layer, hs in by_layer.items():
                name = z_name(clean, layer)
                for r in chunks(len(hs), size_k):
                    chosen = [hs[i] for i in r]
                    edits = tuple(Edit(name, "patch", source, heads=(h,), rows=(i,)) for i, h in enumerate(chosen))
                    cells = tuple(("heads", layer, h) for h in chosen)
                    jobs.append(Job(cells, edits, estimate=replay_cost(clean, layer, len(chosen))))

        def store(job: Job, got) -> None:
            for (kind, layer, item), y in zip(job.cells, target_values(t, got.scores), strict=True):
                (res if kind == "residual" else hd)[layer, item] = y

        outcome = run_grid(
            clean, jobs, store, progress=progress, cancel=cancel, max_work=max_work, slot=slot, work=work
        )
        work = outcome.work
        if outcome.stopped == "capped":
            notes["capped"] = (
                f"Stopped after {outcome.done} of {outcome.total} patched runs: the next batch would pass this "
                f"server's bound on one request's work ({outcome.capped_at:,.0f} forward-equivalents x tokens)."
            )
            return result(False, res_est, head_est)
        if outcome.stopped == "cancelled":
            raise PatchingCancelled(
                f"activation patching cancelled after {outcome.done} of {outcome.total} patched runs",
                result(False, res_est, head_est),
            )
    return result(True, res_est, head_est)
