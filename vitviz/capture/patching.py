"""Activation patching between two images, attribution patching, and the per-patch logit lens.

Definitions (``ALGORITHMS.md``, "Causal views"; Meng et al. 2022, Heimersheim & Nanda
2024). Two images, the **target** and the **source**, each resized to the same model
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
  target and one forward on the source (:mod:`vitviz.analysis.patching`).
* **Per-patch logit lens** ``(L + 1, gh, gw)``: the residual at each patch token (row 0
  the embeddings, row l block l's output) through the model's own final norm and head
  as if every token the head reads were that patch token (ViT: the CLS slot; DeiT:
  CLS and DIST; BEiT: the mean of the patches); ``y`` of that. Applied to the CLS
  token, row l is the logit lens's row l (:func:`vitviz.capture.causal.logit_lens`).

Cost (forward-equivalents: passes of the whole model over one image). One-grid models
with a readout head reuse the target's clean run: a patch in block l runs blocks
l + 1 .. L - 1 only (residual; ``T (L - 1) / 2`` in all) or blocks l .. L - 1
(heads; ``H (L + 1) / 2``), every position of a block in batched copies, plus the two
clean runs. Elsewhere (hierarchical models, zero-shot label scores) patches run full
batched forwards; residual patching is not defined for hierarchical models (grids and
widths change between stages). The estimate reads the gradient from the target run's
graph: one backward pass, no forward. ``progress(done, total)`` is called after each
batch; ``cancel()`` before each: True raises :class:`PatchingCancelled` carrying the
partial result (NaN where not computed).

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

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.analysis.patching import head_estimate, residual_estimate
from vitviz.capture.causal import NotDefined, causal_notes
from vitviz.capture.forward import DEFAULT_BUDGET_BYTES, check_budget, input_size_for, token_layout
from vitviz.capture.run import Activations, Run, get_activations, get_run
from vitviz.capture.targets import Target, TargetError, resolve_target
from vitviz.errors import VitvizError
from vitviz.models.load import LoadedModel
from vitviz.models.points import Edit
from vitviz.record import frozen

__all__ = [
    "Patching",
    "PatchingCancelled",
    "activation_patching",
    "patch_lens",
    "patch_lens_of_run",
    "patching_arrays",
]

Progress = Callable[[int, int], None]
CancelCheck = Callable[[], bool]
_MAX_CHUNK = 64


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
    label_embeddings: np.ndarray | None,
    gradients: bool,
) -> tuple[Run, Run | Activations]:
    hw = input_size_for(loaded, size, target_image.size)
    clean = get_run(
        loaded, target_image, size=hw, label_embeddings=label_embeddings, budget_bytes=budget_bytes, gradients=gradients
    )
    # The source only lends values at the points patched (head outputs, block outputs): its cached Run if the
    # page made one, else one inference-mode forward that keeps nothing else (no attention, no summaries).
    source = get_activations(
        loaded, source_image, size=hw, label_embeddings=label_embeddings, budget_bytes=budget_bytes
    )
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


def _resolve(run: Run, target: Target | int | None, class_index: int | None, labels: bool) -> Target:
    n = int(run.scores.shape[0])
    t = resolve_target(target, class_index=class_index, predicted=lambda: int(torch.argmax(run.scores)))
    for i in (t.index, t.minus):
        if i is not None and not 0 <= int(i) < n:
            what = "label" if labels else "class"
            raise TargetError(f"{what} {i} is outside 0..{n - 1} for '{run.loaded.name}'.")
    return t


def _y(t: Target, scores: torch.Tensor) -> np.ndarray:
    """``(k, C)`` scores -> ``(k,)`` float64 of the target."""
    return t.select(scores.detach().float().cpu().numpy().astype(np.float64))


# --- exact patching ------------------------------------------------------------------------------


def _chunks(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _chunk_size(run: Run, chunk: int | None, budget_bytes: int) -> int:
    if chunk is not None:
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        return int(chunk)
    k = _MAX_CHUNK
    while k > 1:
        try:
            check_budget(run.loaded, run.input_size, batch=k, gradients=False, budget=budget_bytes)
            return k
        except VitvizError:
            k //= 2
    return 1


def _z_name(run: Run, layer: int) -> str | None:
    name = run.name(run.sites[layer].index, "attn.z")
    return name if run.has(name) else None


def _head_tasks(clean: Run, source: Run | Activations) -> list[tuple[int, int]]:
    tasks = []
    for layer in range(clean.num_blocks):
        name = _z_name(clean, layer)
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


def _patched_heads(clean: Run, source: Run | Activations, layer: int, heads: list[int]) -> tuple[torch.Tensor, float]:
    """Scores ``(k, C)`` of k copies of the target, copy i with head ``heads[i]`` of block ``layer`` patched."""
    name = _z_name(clean, layer)
    edits = [Edit(name, "patch", source, heads=(h,), rows=(i,)) for i, h in enumerate(heads)]
    got = clean.edited(edits, batch=len(heads))
    return got.scores, got.forward_equivalents


def _patched_residual(clean: Run, source: Run | Activations, layer: int, tokens: range) -> tuple[torch.Tensor, float]:
    """Scores ``(k, C)``: copy i has block ``layer``'s output at token ``tokens[i]`` replaced by the source's."""
    site = clean.sites[layer].index
    k = len(tokens)
    if not clean.replayable:  # full forwards: the same patch as an edit of the named point
        name = clean.name(site, "out")
        edits = [Edit(name, "patch", source, tokens=(t,), rows=(i,)) for i, t in enumerate(tokens)]
        got = clean.edited(edits, batch=k, reuse_prefix=False)
        return got.scores, got.forward_equivalents
    x = clean.block_tokens(site)[1]  # (1, T, D): block l's output, the residual entering block l + 1
    src = source.block_tokens(site)[1]
    idx = torch.arange(k, device=x.device)
    tok = torch.as_tensor(list(tokens), device=x.device)
    with torch.inference_mode():
        xs = x.expand(k, *x.shape[1:]).clone()
        xs[idx, tok] = src[0, tok].to(xs.dtype)
        scores = clean._replay(layer + 1, xs)
    return scores.float(), k * (clean.num_blocks - layer - 1) / clean.num_blocks


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


_GRADS: OrderedDict[tuple, tuple[weakref.ref, list]] = OrderedDict()
_GRADS_LOCK = threading.Lock()
GRADS_KEPT = 4  # (run, target) gradient sets kept: another source image for the same target needs no backward


def _target_gradients(clean: Run, t: Target, names: list[str]) -> tuple[list[torch.Tensor | None], bool]:
    """``d y / d x`` at each point of ``names`` in the target's clean run (one backward, kept for the next source
    image of the same run and target); and whether the backward ran now."""
    key = (id(clean), t, tuple(names))
    with _GRADS_LOCK:
        hit = _GRADS.get(key)
        if hit is not None and hit[0]() is clean:
            _GRADS.move_to_end(key)
            return hit[1], False

    def y(out) -> torch.Tensor:
        return t.select(clean.score_of(out))[0]

    grads = [None if g is None else g.detach() for g in clean.gradients(y, names)]
    with _GRADS_LOCK:
        _GRADS[key] = (weakref.ref(clean), grads)
        _GRADS.move_to_end(key)
        while len(_GRADS) > GRADS_KEPT:
            _GRADS.popitem(last=False)
    return grads, True


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
        z_names = [n for n in (_z_name(clean, i) for i in range(clean.num_blocks)) if n is not None and source.has(n)]

    grads, computed = _target_gradients(clean, t, [*res_names, *z_names])
    y0 = float(_y(t, clean.scores[None])[0])
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
        layer_of = {_z_name(clean, i): i for i in range(clean.num_blocks)}
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
    class_index: int | None = None,
    size: int | tuple[int, int] | None = None,
    residual: bool = True,
    heads: bool = True,
    exact: bool = True,
    estimate: bool = True,
    chunk: int | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    label_embeddings: np.ndarray | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Patching:
    """Patch ``source_image``'s activations into ``target_image``'s run, point by point (module docstring).

    ``target``: what is measured (a :class:`~vitviz.capture.targets.Target` or a class index; ``class_index``
    the older spelling; default: the target image's top-1). ``residual``, ``heads``: which grids; ``exact``:
    run the patched forwards; ``estimate``: attribution patching (one forward and one backward).
    ``label_embeddings`` ``(K, D)`` (zero-shot models): the scores are label scores, the target a label
    index. Raises :class:`NotDefined` when nothing asked is defined for the model, with the reason.
    """
    clean, source = _runs(loaded, target_image, source_image, size, budget_bytes, label_embeddings, estimate)
    t = _resolve(clean, target, class_index, label_embeddings is not None)
    names = loaded.id2label if label_embeddings is None else None
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
    clean_y = float(_y(t, clean.scores[None])[0])
    source_y = float(_y(t, source.scores[None])[0])
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
        size_k = _chunk_size(clean, chunk, budget_bytes)
        jobs: list[tuple[str, int, list[int]]] = []
        if do_res:
            jobs += [("residual", layer, list(r)) for layer in range(n) for r in _chunks(tokens, size_k)]
        if do_heads:
            by_layer: dict[int, list[int]] = {}
            for layer, h in tasks:
                by_layer.setdefault(layer, []).append(h)
            for layer, hs in by_layer.items():
                jobs += [("heads", layer, [hs[i] for i in r]) for r in _chunks(len(hs), size_k)]
        total = sum(len(j[2]) for j in jobs)
        done = 0
        for kind, layer, items in jobs:
            if cancel is not None and cancel():
                raise PatchingCancelled(
                    f"activation patching cancelled after {done} of {total} patched runs",
                    result(False, res_est, head_est),
                )
            if kind == "residual":
                scores, w = _patched_residual(clean, source, layer, range(items[0], items[-1] + 1))
                res[layer, items[0] : items[-1] + 1] = _y(t, scores)
            else:
                scores, w = _patched_heads(clean, source, layer, items)
                hd[layer, items] = _y(t, scores)
            work += w
            done += len(items)
            if progress is not None:
                progress(done, total)
    return result(True, res_est, head_est)


# --- the per-patch logit lens --------------------------------------------------------------------


def patch_lens_of_run(run: Run, t: Target, *, chunk: int = 64) -> np.ndarray:
    """``(L + 1, gh, gw)`` float32: ``y`` read out from each patch token's residual (module docstring).

    A hierarchical model (Swin: the grid and width change between stages) reads out only the residual of its last
    stage's blocks, as :func:`vitviz.capture.causal.logit_lens` does: those rows on the last stage's grid, the
    others (and the embeddings) NaN.
    """
    loaded = run.loaded
    hierarchical = loaded.family.hierarchical and run.readout is not None
    if run.readout is None or not (run.replayable or hierarchical):
        raise NotDefined(
            run.readout_problem
            or causal_notes(loaded)["lens"]
            or f"The per-patch logit lens is not defined for '{loaded.name}'."
        )
    rows: list[tuple[int, torch.Tensor]] = []
    if run.replayable:
        kinds, grid = token_layout(loaded, run.input_size)
        p = len(kinds)
        rows.append((0, run.block_tokens(run.sites[0].index)[0]))
        rows += [(i + 1, run.block_tokens(s.index)[1]) for i, s in enumerate(run.sites)]
    else:  # the last stage's blocks: their outputs have the final residual's grid and width
        last = run.capture.stages[-1]
        p, grid = last.num_prefix, last.grid
        final = run.block_tokens(run.sites[-1].index)[1] if run.has_block(run.sites[-1].index) else None
        if final is None or final.shape[1] != p + grid[0] * grid[1]:
            raise NotDefined(f"The per-patch logit lens of '{loaded.name}' found no last-stage tokens on its grid.")
        for i, s in enumerate(run.sites):
            x = run.block_tokens(s.index)[1] if s.stage == run.sites[-1].stage and run.has_block(s.index) else None
            if x is not None and x.shape[1:] == final.shape[1:]:
                rows.append((i + 1, x))
    out = np.full((len(run.sites) + 1, grid[0] * grid[1]), np.nan, np.float32)
    with torch.inference_mode():
        for r, x in rows:
            patches = x[0, p:]  # (N, D)
            t_count = x.shape[1]
            for c in range(0, patches.shape[0], chunk):
                v = patches[c : c + chunk]  # (k, D): every token of copy i is patch c + i
                scores = run.readout(v[:, None, :].expand(v.shape[0], t_count, v.shape[1]))
                out[r, c : c + v.shape[0]] = _y(t, scores)
    return frozen(out.reshape(len(run.sites) + 1, *grid))


def patch_lens(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    target: Target | int | None = None,
    class_index: int | None = None,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> np.ndarray:
    """The per-patch logit lens of ``image`` for ``target`` (default: the top-1 class): ``(L + 1, gh, gw)``."""
    run = get_run(loaded, image, size=size, budget_bytes=budget_bytes)
    if run.scores.numel() == 0:
        raise NotDefined(causal_notes(loaded)["lens"] or f"'{loaded.name}' gives no class logits to read out.")
    return patch_lens_of_run(run, _resolve(run, target, class_index, False))


# --- export --------------------------------------------------------------------------------------


def patching_arrays(p: Patching) -> dict[str, np.ndarray]:
    """The ``patching_*`` keys of ``export --causal --patch-from`` (only the grids that were computed)."""
    arrays = {
        "patching_class": np.asarray(p.target.index, np.int64),
        "patching_clean_logit": np.asarray(p.clean, np.float32),
        "patching_source_logit": np.asarray(p.source, np.float32),
    }
    for key, value in (
        ("patching_residual", p.residual),
        ("patching_heads", p.heads),
        ("patching_residual_estimate", p.residual_estimate),
        ("patching_heads_estimate", p.heads_estimate),
    ):
        if value is not None:
            arrays[key] = value.astype(np.float32)
    return arrays
