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
clean runs. Elsewhere (hierarchical models, zero-shot label scores) head patching runs
full batched forwards, and residual patching is not defined (no readout head, or
grids that change between stages). ``progress(done, total)`` is called after each
batch; ``cancel()`` before each: True raises :class:`PatchingCancelled` carrying the
partial result (NaN where not computed).

This module builds on the clean-run and replay machinery of
:mod:`vitviz.capture.causal` (one forward pre-hook per output projection, switched on
per call through a ``ContextVar``): nothing is added to or removed from a shared model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.analysis.patching import head_estimate, residual_estimate
from vitviz.capture.causal import (
    NotDefined,
    _Clean,
    _clean_run,
    _CleanRecorder,
    _Plan,
    _planned,
    _replay,
    causal_notes,
)
from vitviz.capture.run import DEFAULT_BUDGET_BYTES, check_budget, input_size_for, run_forward, token_layout
from vitviz.capture.targets import Target, TargetError, resolve_target
from vitviz.errors import VitvizError
from vitviz.models.families.base import Call
from vitviz.models.load import LoadedModel

__all__ = [
    "Patching",
    "PatchingCancelled",
    "activation_patching",
    "patch_lens",
    "patch_lens_from_clean",
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


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Patching:
    """Patching the source image's activations into the target image's run (see the module docstring).

    ``residual`` ``(L, T)``, ``heads`` ``(L, H)`` float32: ``y`` of each patched run (NaN: not computed,
    no such head, or not defined); ``residual_estimate``, ``heads_estimate``: attribution patching's
    estimate of the same (None when not asked); ``clean``, ``source``: ``y`` unpatched.
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
    notes: dict[str, str] = field(default_factory=dict)  # key left out -> why

    def residual_map(self, block: int, estimate: bool = False) -> np.ndarray:
        """Block ``block``'s patch tokens ``(gh, gw)`` of the residual grid (or its estimate)."""
        table = self.residual_estimate if estimate else self.residual
        if table is None:
            raise NotDefined(self.notes.get("residual", "residual patching was not computed"))
        return table[block, self.num_prefix :].reshape(self.grid)


# --- the two clean runs --------------------------------------------------------------------------


def _clean_pair(
    loaded: LoadedModel,
    target_image: Image.Image,
    source_image: Image.Image,
    size,
    budget_bytes: int,
    label_embeddings: np.ndarray | None,
) -> tuple[_Clean, _Clean]:
    hw = input_size_for(loaded, size, target_image.size)
    clean = _clean_run(loaded, target_image, hw, budget_bytes, label_embeddings)
    source = _clean_run(loaded, source_image, hw, budget_bytes, label_embeddings)
    if source.hw != clean.hw:  # a family that follows each image's aspect ratio (SigLIP 2 NaFlex)
        raise NotDefined(
            f"{loaded.family.name} gives the two images different inputs ({clean.hw[0]}x{clean.hw[1]} and "
            f"{source.hw[0]}x{source.hw[1]} px): their activations cannot be patched into each other."
        )
    for site in clean.sites:
        a, b = clean.blocks.get(site.index), source.blocks.get(site.index)
        if a is None or b is None or a[1] is None or b[1] is None:
            continue
        if a[1].shape != b[1].shape:
            raise NotDefined(
                f"block {site.index} of {loaded.family.name} has {tuple(a[1].shape[1:])} tokens for the target "
                f"and {tuple(b[1].shape[1:])} for the source: the grids differ between the two runs, so the "
                "source's activations do not fit the target's run."
            )
    return clean, source


def _resolve(clean: _Clean, target: Target | int | None, class_index: int | None, labels: bool) -> Target:
    n = int(clean.logits.shape[0])
    t = resolve_target(target, class_index=class_index, predicted=lambda: int(torch.argmax(clean.logits)))
    for i in (t.index, t.minus):
        if i is not None and not 0 <= int(i) < n:
            what = "label" if labels else "class"
            raise TargetError(f"{what} {i} is outside 0..{n - 1} for '{clean.loaded.name}'.")
    return t


def _y(t: Target, scores: torch.Tensor) -> np.ndarray:
    """``(k, C)`` scores -> ``(k,)`` float64 of the target."""
    return t.select(scores.detach().float().cpu().numpy().astype(np.float64))


# --- exact patching ------------------------------------------------------------------------------


class _PatchPlan(_Plan):
    """Per copy i: ``z`` of one block replaced where ``keep[i] == 0`` by the source's ``z`` (token by token)."""

    def __init__(self, copies: int, index: int, keep: torch.Tensor, source_z: torch.Tensor) -> None:
        super().__init__(copies=copies)
        self.index, self.keep, self.source_z = index, keep, source_z  # keep (k, HD); source_z (1, ..., HD)

    def __call__(self, index: int, z: torch.Tensor) -> torch.Tensor | None:
        if index != self.index:
            return None
        k = self.copies
        zz = z.reshape(k, -1, z.shape[-1])
        src = self.source_z.reshape(1, -1, z.shape[-1]).to(z.dtype)
        keep = self.keep[:, None].to(z.dtype)
        return (zz * keep + src * (1 - keep)).reshape(z.shape)


def _chunks(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _chunk_size(clean: _Clean, chunk: int | None, budget_bytes: int) -> int:
    if chunk is not None:
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        return int(chunk)
    k = _MAX_CHUNK
    while k > 1:
        try:
            check_budget(clean.loaded, clean.hw, batch=k, gradients=False, budget=budget_bytes)
            return k
        except VitvizError:
            k //= 2
    return 1


def _head_tasks(clean: _Clean, source: _Clean) -> list[tuple[int, int]]:
    tasks = []
    for layer, site in enumerate(clean.sites):
        if clean.projections[layer] is None or site.index not in clean.z or site.index not in source.z:
            continue
        if clean.z[site.index].shape != source.z[site.index].shape:
            raise NotDefined(
                f"head outputs of block {layer} have shape {tuple(clean.z[site.index].shape[1:])} for the target "
                f"and {tuple(source.z[site.index].shape[1:])} for the source: the grids differ between the runs."
            )
        tasks.extend((layer, h) for h in range(clean.num_heads[layer]))
    return tasks


def _patched_heads(clean: _Clean, source: _Clean, layer: int, heads: list[int]) -> tuple[torch.Tensor, float]:
    """Scores ``(k, C)`` of k copies of the target, copy i with head ``heads[i]`` of block ``layer`` patched."""
    loaded, site = clean.loaded, clean.sites[layer]
    k = len(heads)
    z = clean.z[site.index]
    width = z.shape[-1]
    d = width // clean.num_heads[layer]
    keep = torch.ones(k, width, dtype=z.dtype, device=z.device)
    for i, h in enumerate(heads):
        keep[i, h * d : (h + 1) * d] = 0
    plan = _PatchPlan(k, site.index, keep, source.z[site.index])
    with torch.inference_mode(), _planned(plan):
        if clean.replayable:
            x = clean.blocks[site.index][0]
            scores = _replay(clean, layer, x.expand(k, *x.shape[1:]).contiguous())
            work = k * (clean.num_blocks - layer) / clean.num_blocks
        else:
            pixels = clean.pixels.expand(k, *clean.pixels.shape[1:]).contiguous()
            inputs = loaded.family.model_inputs(loaded, pixels, clean.hw)
            with loaded.family.running(loaded.model):
                out = loaded.family.forward(loaded.model, inputs)
            scores = clean.scorer(out)
            work = float(k)
    return scores.float(), work


def _patched_residual(clean: _Clean, source: _Clean, layer: int, tokens: range) -> tuple[torch.Tensor, float]:
    """Scores ``(k, C)``: copy i has block ``layer``'s output at token ``tokens[i]`` replaced by the source's."""
    site = clean.sites[layer]
    x = clean.blocks[site.index][1]  # (1, T, D)
    src = source.blocks[site.index][1]
    k = len(tokens)
    idx = torch.arange(k, device=x.device)
    tok = torch.as_tensor(list(tokens), device=x.device)
    with torch.inference_mode():
        xs = x.expand(k, *x.shape[1:]).clone()
        xs[idx, tok] = src[0, tok].to(xs.dtype)
        scores = _replay(clean, layer + 1, xs)
    return scores.float(), k * (clean.num_blocks - layer - 1) / clean.num_blocks


def _residual_note(clean: _Clean) -> str:
    if clean.replayable:
        return ""
    loaded = clean.loaded
    if loaded.family.hierarchical:
        return (
            f"Residual patching is not defined for {loaded.family.name}: its token grid and width change between "
            "stages, so there is no one residual stream of (block, token) points to patch."
        )
    return (
        clean.readout_problem
        or causal_notes(loaded)["lens"]
        or f"Residual patching needs a readout head for '{loaded.name}', and its adapter describes none."
    )


# --- attribution patching ------------------------------------------------------------------------


def _estimates(
    clean: _Clean, source: _Clean, t: Target, residual: bool, heads: bool, budget_bytes: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Attribution patching from one forward and one backward on the target (the source's clean run given)."""
    loaded = clean.loaded
    check_budget(loaded, clean.hw, batch=1, gradients=True, budget=budget_bytes)
    pixels = clean.pixels.detach().clone().requires_grad_(True)  # the graph reaches every block
    rec = _CleanRecorder(loaded, Call(loaded.config, clean.hw, 1))
    plan = _Plan(record=True)
    with torch.enable_grad(), _planned(plan):
        out = run_forward(loaded, pixels, rec)
        y = t.select(clean.scorer(out))[0]
        res_sites = [s.index for s in clean.sites if residual and rec.blocks[s.index][1] is not None]
        z_sites = [
            s.index
            for layer, s in enumerate(clean.sites)
            if heads and clean.projections[layer] is not None and s.index in plan.z and s.index in source.z
        ]
        wrt = [rec.blocks[i][1] for i in res_sites] + [plan.z[i] for i in z_sites]
        grads = torch.autograd.grad(y, wrt, allow_unused=True) if wrt else ()
    y0 = float(y.detach())
    res_est = head_est = None
    if residual:
        n, tokens = clean.num_blocks, int(clean.blocks[clean.sites[-1].index][1].shape[1])
        res_est = np.full((n, tokens), np.nan, np.float32)
        for k, i in enumerate(res_sites):
            layer = next(j for j, s in enumerate(clean.sites) if s.index == i)
            a = rec.blocks[i][1].detach()
            g = grads[k] if grads[k] is not None else torch.zeros_like(a)
            if a.shape[1] != tokens:
                continue
            est = residual_estimate(_np(g)[None, 0], _np(a)[None, 0], _np(source.blocks[i][1])[None, 0])
            res_est[layer] = y0 + est[0]
    if heads:
        head_est = np.full((clean.num_blocks, clean.width), np.nan, np.float32)
        for k, i in enumerate(z_sites):
            layer = next(j for j, s in enumerate(clean.sites) if s.index == i)
            z = plan.z[i].detach()
            g = grads[len(res_sites) + k]
            g = torch.zeros_like(z) if g is None else g
            w = z.shape[-1]
            h = clean.num_heads[layer]
            head_est[layer, :h] = y0 + head_estimate(
                _np(g).reshape(-1, w), _np(z).reshape(-1, w), _np(source.z[i]).reshape(-1, w), h
            )
    return res_est, head_est


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
    clean, source = _clean_pair(loaded, target_image, source_image, size, budget_bytes, label_embeddings)
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
    tokens = int(clean.blocks[clean.sites[-1].index][1].shape[1]) if do_res else 0
    res = np.full((n, tokens), np.nan, np.float32) if do_res and exact else None
    hd = np.full((n, clean.width), np.nan, np.float32) if do_heads and exact else None
    clean_y = float(_y(t, clean.logits[None])[0])
    source_y = float(_y(t, source.logits[None])[0])
    work = 2.0
    kinds, grid = token_layout(loaded, clean.hw) if do_res else ((), (0, 0))
    num_prefix = len(kinds)
    token_kinds = (*kinds, *("patch",) * (grid[0] * grid[1]))

    def result(complete: bool, res_est=None, head_est=None) -> Patching:
        return Patching(
            target=t,
            target_name=t.name(names),
            clean=clean_y,
            source=source_y,
            residual=None if res is None else _frozen(res.copy()),
            heads=None if hd is None else _frozen(hd.copy()),
            residual_estimate=None if res_est is None else _frozen(res_est),
            heads_estimate=None if head_est is None else _frozen(head_est),
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
        res_est, head_est = _estimates(clean, source, t, do_res, do_heads, budget_bytes)
        work += 3.0 - 1.0  # one forward and one backward on the target (the source's clean run is shared)
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


def patch_lens_from_clean(clean: _Clean, t: Target, *, chunk: int = 64) -> np.ndarray:
    """``(L + 1, gh, gw)`` float32: ``y`` read out from each patch token's residual (module docstring)."""
    loaded = clean.loaded
    if clean.readout is None or not clean.replayable:
        raise NotDefined(
            clean.readout_problem
            or causal_notes(loaded)["lens"]
            or f"The per-patch logit lens is not defined for '{loaded.name}'."
        )
    kinds, grid = token_layout(loaded, clean.hw)
    p = len(kinds)
    rows = [clean.blocks[clean.sites[0].index][0]] + [clean.blocks[s.index][1] for s in clean.sites]
    out = np.empty((len(rows), grid[0] * grid[1]), np.float32)
    with torch.inference_mode():
        for r, x in enumerate(rows):
            patches = x[0, p:]  # (N, D)
            t_count = x.shape[1]
            for c in range(0, patches.shape[0], chunk):
                v = patches[c : c + chunk]  # (k, D): every token of copy i is patch c + i
                scores = clean.readout(v[:, None, :].expand(v.shape[0], t_count, v.shape[1]))
                out[r, c : c + v.shape[0]] = _y(t, scores)
    return _frozen(out.reshape(len(rows), *grid))


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
    clean = _clean_run(loaded, image, size, budget_bytes)
    return patch_lens_from_clean(clean, _resolve(clean, target, class_index, False))


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
