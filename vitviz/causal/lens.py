"""The logit lens and the per-patch logit lens: residual streams read out by the model's own final norm and head.

**Logit lens.** The residual stream after block l (row 0: the embeddings, the input of
block 0) passed through the model's own final norm and classification head
(``family.readout_head``: ViT: the CLS token's final LayerNorm and the classifier;
distilled DeiT: both heads as the model combines them, ``(CLS head + distillation
head) / 2``; DINOv2 classifier: CLS + mean-patch head; BEiT: mean of the patches, the
pooler's LayerNorm, the classifier): an (L + 1, C) table of logits whose row L equals the
model's logits (checked when the Run is made). Hierarchical models: only rows whose
residual has the final width and layout are defined (the blocks of the last stage,
Swin); the others are NaN with a note.

**Per-patch logit lens** ``(L + 1, gh, gw)``: the residual at each patch token (row 0 the
embeddings, row l block l's output) through the same head as if every token the head
reads were that patch token (ViT: the CLS slot; DeiT: CLS and DIST; BEiT: the mean of
the patches); ``y`` of a target of that. Applied to the CLS token, row l is the logit
lens's row l.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES, token_layout
from vitviz.capture.run import Run, get_run
from vitviz.capture.targets import Target
from vitviz.causal.notes import NotDefined, causal_notes, clean_run, readout_of, target_values
from vitviz.models.load import LoadedModel
from vitviz.record import frozen

__all__ = ["LogitLens", "logit_lens", "lens_of_run", "patch_lens", "patch_lens_of_run"]


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

    def ranks(self, index: int) -> np.ndarray:
        """``(L + 1,)`` rank of class ``index`` in each row (1 = the top class; ties count against it); NaN where
        undefined."""
        z = self.logits
        out = (z > z[:, [index]]).sum(axis=1).astype(np.float64) + 1
        out[~self.defined] = np.nan
        return out


def lens_of_run(run: Run) -> LogitLens:
    loaded = run.loaded
    readout, problem = readout_of(run)
    if readout is None:
        raise NotDefined(
            problem or causal_notes(loaded)["lens"] or f"The logit lens is not defined for '{loaded.name}'."
        )
    n = run.num_blocks
    rows: list[tuple[int, torch.Tensor]] = []
    last_stage = run.sites[-1].stage
    final = run.block_tokens(run.sites[-1].index)[1]
    if not loaded.family.hierarchical:
        rows.append((0, run.block_tokens(run.sites[0].index)[0]))
    for i, site in enumerate(run.sites):
        out = run.block_tokens(site.index)[1]
        if site.stage == last_stage and out is not None and out.shape[1:] == final.shape[1:]:
            rows.append((i + 1, out))
    table = np.full((n + 1, int(run.scores.shape[0])), np.nan, np.float32)
    with torch.inference_mode():
        got = readout(torch.cat([x for _, x in rows])).float().cpu().numpy()
    for (r, _), row in zip(rows, got, strict=True):
        table[r] = row  # row L: the readout of the last residual, checked equal to the logits in _checked_readout
    defined = np.zeros(n + 1, bool)
    defined[[r for r, _ in rows]] = True
    return LogitLens(frozen(table), frozen(defined), readout.description, causal_notes(loaded)["lens"])


def logit_lens(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> LogitLens:
    """The residual stream after every block through the model's final norm and head: ``(L + 1, C)`` logits."""
    return lens_of_run(clean_run(loaded, image, size, budget_bytes))


def patch_lens_of_run(run: Run, t: Target, *, chunk: int = 64) -> np.ndarray:
    """``(L + 1, gh, gw)`` float32: ``y`` read out from each patch token's residual (module docstring).

    A hierarchical model (Swin: the grid and width change between stages) reads out only the residual of its last
    stage's blocks, as the logit lens does: those rows on the last stage's grid, the others (and the embeddings)
    NaN.
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
                out[r, c : c + v.shape[0]] = target_values(t, scores)
    return frozen(out.reshape(len(run.sites) + 1, *grid))


def patch_lens(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    target: Target | int | None = None,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> np.ndarray:
    """The per-patch logit lens of ``image`` for ``target`` (default: the top-1 class): ``(L + 1, gh, gw)``."""
    run = get_run(loaded, image, size=size, budget_bytes=budget_bytes)
    if run.scores.numel() == 0:
        raise NotDefined(causal_notes(loaded)["lens"] or f"'{loaded.name}' gives no class logits to read out.")
    return patch_lens_of_run(run, run.target(target))
