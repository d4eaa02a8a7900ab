"""Forward passes with gradients through the same hooks: class-specific relevance.

Which blocks relevance runs through: every attention block of the model, in forward
order, from the first (MM-Explainability's ``interpret(start_layer=0)``), each block's
gradient taken with respect to its own probabilities; hierarchical models through
every stage with the merge rule between them; a pooling head (CCT's sequence pooling,
SigLIP's attention pooling) is the last block. The gradients come from the clean
:class:`~vitviz.capture.run.Run`'s graph (no second forward) where the image has a
Run with its graph; otherwise (a data-set loop, say) from a forward of their own, without
the capture's summaries.

The recorder keeps each block's probabilities as the live tensors the forward
used, so ``torch.autograd.grad`` pairs every gradient with its own block.
Gradients flow to the input only (the shared model's parameters never require
grad and no ``.grad`` is written), so concurrent calls do not interact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitviz.analysis.relevance import Explanation, relevance_abar, relevance_row
from vitviz.capture.forward import (
    DEFAULT_BUDGET_BYTES,
    BlockRecorder,
    build_stages,
    check_budget,
    input_size_for,
    preprocess,
    run_forward,
)
from vitviz.errors import CaptureError
from vitviz.models.families.base import Call, to_native
from vitviz.models.load import LoadedModel
from vitviz.record import Geometry

__all__ = ["GraphRecorder", "ScalarOf", "explain_targets", "explain_run", "explain_classes", "start_block_index"]


class GraphRecorder(BlockRecorder):
    """Keeps every block's probabilities in the autograd graph (the tensors the forward went on with)."""

    def __init__(self, loaded: LoadedModel, call: Call) -> None:
        super().__init__(loaded, call)
        self.raw: dict[int, torch.Tensor] = {}

    def block(self, site, g: Geometry, raw: torch.Tensor, module, args, kwargs, output) -> None:
        self.raw[site.index] = raw


def _native_grad(g: Geometry, grad: torch.Tensor | None, like: np.ndarray) -> np.ndarray:
    """A block's gradient in native form; a block the logit does not depend on has a zero gradient."""
    if grad is None:
        return np.zeros_like(like)
    return to_native(g, grad, 1)[0].float().cpu().numpy()


def start_block_index(geometries: Sequence[Geometry], start_block: int) -> int:
    """The first encoder block relevance runs through: ``start_block`` in ``-n..n-1`` (-1: the last) -> ``0..n-1``.

    A pooling head (SigLIP) is not counted: it always reads out.
    """
    n = sum(g.kind != "pool" for g in geometries)
    if not -n <= int(start_block) < n:
        raise CaptureError(
            f"Relevance from block {start_block}: this model has {n} blocks, numbered 0..{n - 1} "
            "(or -1 for the last block)."
        )
    return int(start_block) % n


ScalarOf = Callable[
    [Any], torch.Tensor
]  # the forward's output -> a scalar: a bound Target (vitviz.capture.targets) or a logit


def explain_targets(
    loaded: LoadedModel,
    image: Image.Image,
    targets: Mapping[int, tuple[str, ScalarOf]],
    *,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    start_block: int = 0,
) -> dict[int, Explanation]:
    """Chefer et al.'s relevance for each target: one forward pass with gradients, one backward pass per target.

    ``targets``: key -> (label, function of the forward's output giving a scalar), e.g.
    a class logit before softmax or a zero-shot model's image-text score for a label.
    ``start_block``: relevance runs through blocks ``start_block..L-1`` only (-1: the
    last block), as MM-Explainability's ``interpret(start_layer=...)``; the blocks
    before it count as identities (``Abar = 0``), so stage merges still carry the row
    to the first stage. 0 (all blocks) is the default.
    """
    note = loaded.family.rollout_note(loaded.config)
    if note:
        raise CaptureError(f"Class-specific relevance is not defined for {loaded.family.name}: {note}")
    hw = input_size_for(loaded, size, image.size)
    check_budget(loaded, hw, batch=1, gradients=True, budget=budget_bytes)
    from vitviz.capture.run import peek_run  # the image's Run, where a view made one: no second forward

    run = peek_run(loaded, image, size=size, budget_bytes=budget_bytes)
    if run is not None and run.has_graph:
        return explain_run(run, targets, start_block=start_block)
    pixels, _ = preprocess(loaded, [image], hw)
    pixels.requires_grad_(True)  # the graph reaches every block although the parameters need no grad
    rec = GraphRecorder(loaded, Call(loaded.config, hw, 1))
    result: dict[int, Explanation] = {}
    with torch.enable_grad():
        out = run_forward(loaded, pixels, rec)
        order = sorted(rec.raw)
        geoms = [rec.geometries[b] for b in order]
        attn = [to_native(geoms[i], rec.raw[b].detach(), 1)[0].float().cpu().numpy() for i, b in enumerate(order)]
        tensors = [rec.raw[b] for b in order]
        explain = _explainer(loaded, geoms, attn, start_block)
        for k, (key, (label, target)) in enumerate(targets.items()):
            grads = torch.autograd.grad(target(out), tensors, retain_graph=k < len(targets) - 1, allow_unused=True)
            result[key] = explain(key, label, grads)
    return result


def _explainer(loaded: LoadedModel, geoms: Sequence[Geometry], attn: Sequence[np.ndarray], start_block: int):
    """``(key, label, gradients per block) -> Explanation`` for one forward's blocks (native attention ``attn``):
    relevance through blocks ``start_block..L-1``, the blocks before it identities (``Abar = 0``)."""
    stages = build_stages(loaded, geoms, {}, 0)
    reads = loaded.family.readout(loaded.config)
    first_block = start_block_index(geoms, start_block)
    if geoms[-1].kind == "pool":
        readout = "pooling head"
    else:
        readout = "CLS" if reads == "cls" and "CLS" in stages[-1].prefix_kinds else "pooled query"
    first = stages[0]

    def explain(key: int, label: str, grads: Sequence) -> Explanation:
        abars = {
            i: relevance_abar(geoms[i], attn[i], _native_grad(geoms[i], gr, attn[i]))
            if i >= first_block
            else np.zeros_like(relevance_abar(geoms[i], attn[i], attn[i]))
            for i, gr in enumerate(grads)
        }
        row = relevance_row(geoms, stages, abars, readout=reads).astype(np.float32)
        row.setflags(write=False)
        return Explanation(int(key), label, row, first.num_prefix, first.grid, readout, first_block)

    return explain


def explain_run(run, targets: Mapping[int, tuple[str, ScalarOf]], *, start_block: int = 0) -> dict[int, Explanation]:
    """:func:`explain_targets` from a :class:`~vitviz.capture.run.Run`'s graph: one backward per target."""
    loaded = run.loaded
    order = [s.index for s in run.sites]
    geoms = list(run.geometries)
    attn = [to_native(geoms[i], run.probs(b), 1)[0].float().cpu().numpy() for i, b in enumerate(order)]
    explain = _explainer(loaded, geoms, attn, start_block)
    return {key: explain(key, label, run.gradients(target, "probs")) for key, (label, target) in targets.items()}


def explain_classes(
    loaded: LoadedModel,
    image: Image.Image,
    classes: Sequence[int],
    *,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    start_block: int = 0,
) -> dict[int, Explanation]:
    """Relevance for class logits (before softmax): :func:`explain_targets` with ``y_c`` as each target."""
    if not loaded.has_classifier:
        raise CaptureError(
            f"'{loaded.name}' is a backbone without a classifier: class-specific relevance needs class logits."
        )
    n_classes = len(loaded.id2label)
    bad = [c for c in classes if not 0 <= int(c) < n_classes]
    if bad:
        raise ValueError(f"class indices {bad} are outside 0..{n_classes - 1}")
    family, model = loaded.family, loaded.model

    def logit(c: int) -> ScalarOf:
        return lambda out: family.logits(model, out)[0, c]

    targets = {int(c): (loaded.id2label[int(c)], logit(int(c))) for c in classes}
    return explain_targets(loaded, image, targets, size=size, budget_bytes=budget_bytes, start_block=start_block)
