"""The Run: one clean forward per (model, image, size, dtype, labels) that every view reads, and its one scorer.

One forward pass fills, at once:

* ``capture``: the frozen record (:class:`~vitviz.record.Capture`) the Heads,
  Rollout and Stats views read, exactly as :func:`vitviz.capture.forward.capture` gives it;
* every named point (:mod:`vitviz.models.points`): the residual stream at each
  block's input and output, each block's heads' outputs ``z`` (``blocks.{i}.attn.z``,
  ``(1, T, H * d)``), each MLP's output, the attention patterns;
* the scores: class logits, or a zero-shot model's scores of the given labels
  (``logit_scale.exp() * cos(image, prompt) (+ logit_bias)``, the prompts encoded once
  per model: :func:`~vitviz.capture.targets.scorer_for`); :meth:`Run.target` checks a
  :class:`~vitviz.capture.targets.Target` against them and :meth:`Run.bind` gives its
  differentiable value through the same scorer;
* where the memory budget allows, the autograd graph from the input to the scores
  (``has_graph``): gradients (relevance, the fast estimate, attribution patching)
  derive from it with a backward pass and no second forward.

A second forward exists only when something is edited: :meth:`Run.edited` applies
:class:`~vitviz.models.points.Edit` s (``"mean"`` there means this image's token
mean at the point in the clean run) and, for one-grid ViTs with a readout head,
reuses the clean prefix: only blocks from the first edited one on run again, with
the arguments the model passed them in the clean run.

:func:`get_run` keeps the last few runs (a small LRU keyed by model, image bytes,
input size, dtype, labels and budget), so views of one image share one clean forward.
A Run is frozen: nothing in it changes after the forward; it is safe to share between
threads (backward passes through its graph take turns).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitviz.cache import BoundedCache
from vitviz.capture.forward import (
    DEFAULT_BUDGET_BYTES,
    BlockRecorder,
    SummaryRecorder,
    captures_from,
    check_budget,
    forward_output,
    input_size_for,
    preprocess,
    run_forward,
)
from vitviz.capture.targets import (
    BoundTarget,
    NoScores,
    Scorer,
    Target,
    TargetError,
    resolve_target,
    scorer_for,
)
from vitviz.errors import BudgetError, CaptureError
from vitviz.models.families.base import Call, ReadoutHead
from vitviz.models.hooks import Site, active, installed_points, installed_sites
from vitviz.models.load import LoadedModel
from vitviz.models.points import Edit, Points, block_name
from vitviz.models.zeroshot import Labels
from vitviz.record import Capture, Geometry

__all__ = [
    "Run",
    "Activations",
    "get_activations",
    "Edited",
    "get_run",
    "peek_run",
    "clear_runs",
    "READOUT_RTOL",
]

READOUT_RTOL = 1e-4  # a readout head must reproduce the model's logits to this (relative to their scale)


class _RunRecorder(SummaryRecorder):
    """The capture's summaries, plus each block's tokens, call arguments and live probabilities."""

    def __init__(self, loaded: LoadedModel, call: Call, attention_dtype: str, num_sites: int) -> None:
        # The Run keeps every block's live float32 probabilities (``_raw``): summaries are computed from them when
        # a view first reads them, not in the forward (the patching estimate reads none).
        super().__init__(loaded, call, attention_dtype, num_sites, lazy_summaries=True)
        # site -> (input tokens, output tokens, call args, call kwargs, raw output: kept with a graph only, where the
        # graph holds it anyway, for gradients with respect to a block's input read in the family's layout)
        self.blocks: dict[int, tuple[torch.Tensor | None, torch.Tensor | None, tuple, dict, Any]] = {}
        self.raw: dict[int, torch.Tensor] = {}

    def block(self, site: Site, g: Geometry, raw, module, args, kwargs, output) -> None:
        super().block(site, g, raw, module, args, kwargs, output)
        tokens = self.loaded.family.tokens(self.call, site, module, args, kwargs, output)
        inp, out = tokens if tokens is not None else (None, None)
        self.blocks[site.index] = (inp, out, args, kwargs, output if torch.is_grad_enabled() else None)
        self.raw[site.index] = raw


@dataclass(frozen=True)
class Edited:
    """What an edited forward gave: scores ``(k, C)`` float32 of its k copies, the values at the points asked to
    be recorded (``records``: name -> ``(k * n, ...)`` detached, as the edited forward used them), the work in
    forward-equivalents, and whether it started from the clean run's residual (``replayed``)."""

    scores: torch.Tensor
    records: Mapping[str, torch.Tensor]
    forward_equivalents: float
    replayed: bool


def _detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else t


@dataclass(frozen=True, eq=False)
class Run:
    """One clean forward of one image (see the module docstring). Build it with :func:`get_run`."""

    loaded: LoadedModel
    input_size: tuple[int, int]
    pixels: torch.Tensor = field(repr=False)  # (1, 3, h, w)
    capture: Capture = field(repr=False)
    points: Points = field(repr=False)
    sites: tuple[Site, ...] = field(repr=False)
    geometries: tuple[Geometry, ...] = field(repr=False)
    scores: torch.Tensor = field(repr=False)  # (C,) float32, detached: class logits or label scores
    scorer: Scorer = field(repr=False)
    labels: Labels | None = field(repr=False)  # the zero-shot labels scored (names, prompts); None: class logits
    has_graph: bool
    readout: ReadoutHead | None = field(repr=False)
    readout_problem: str  # why ``readout`` is None although the family describes one ("" otherwise)
    _values: Mapping[str, torch.Tensor] = field(repr=False)  # point -> value (in the graph when has_graph)
    _blocks: Mapping[int, tuple] = field(repr=False)  # site -> (input tokens, output tokens, args, kwargs, output)
    _raw: Mapping[int, torch.Tensor] = field(repr=False)  # site -> live probabilities (graph)
    _out: object = field(repr=False)  # the forward's output (graph)
    _graph_scores: torch.Tensor | None = field(repr=False)  # (1, C) in the graph
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    graph_bytes: int = 0  # what the autograd graph saved for the backward (storages not held otherwise)

    @property
    def nbytes(self) -> int:
        """Memory this Run holds: every tensor it keeps (points, probabilities, pixels; storages counted once), what
        its autograd graph saved for the backward, and its capture's arrays."""
        outputs = [o[0] if isinstance(o, (tuple, list)) else o for *_, o in self._blocks.values() if o is not None]
        return (
            _tensor_bytes([*self._values.values(), *self._raw.values(), self.pixels, *outputs])
            + self.graph_bytes
            + int(self.capture.nbytes)
        )

    # --- reading --------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.sites)

    @property
    def num_heads(self) -> tuple[int, ...]:
        return tuple(g.num_heads for g in self.geometries)

    def name(self, site: int, part: str) -> str:
        """The point name of ``part`` (``in``, ``attn.z``, ``mlp.out``, ``out``) of block ``site``."""
        return block_name(self.points, site, part)

    def has(self, name: str) -> bool:
        """Whether the clean run reached point ``name``."""
        p = self.points.by_name.get(name)
        if p is not None and p.kind == "pattern":
            return p.site in self._raw
        return name in self._values

    def activation(self, name: str) -> torch.Tensor:
        """The clean run's value at point ``name`` (detached); ``attn.pattern`` points give the probabilities in
        the family's raw layout."""
        p = self.points.by_name.get(name)
        if p is not None and p.kind == "pattern" and p.site in self._raw:
            return self._raw[p.site].detach()
        if name not in self._values:
            if name in self.points:
                raise CaptureError(f"the clean run of '{self.loaded.name}' never reached the point {name}")
            raise ValueError(f"'{self.loaded.name}' has no hook point {name!r}")
        return self._values[name].detach()

    def block_tokens(self, site: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Block ``site``'s input and output tokens ``(1, T, C)`` in the stage's order (the family's layout)."""
        inp, out, *_ = self._blocks[site]
        return _detached(inp), _detached(out)

    def has_block(self, site: int) -> bool:
        """Whether block ``site``'s tokens and call arguments were recorded."""
        return site in self._blocks

    def block_call(self, site: int) -> tuple[tuple, dict]:
        """The arguments the model called block ``site`` with (for replays)."""
        _, _, args, kwargs, _ = self._blocks[site]
        return args, kwargs

    def block_output(self, site: int) -> Any:
        """What block ``site`` returned, live in the graph (None for a run without its graph)."""
        return self._blocks[site][4]

    @property
    def replayable(self) -> bool:
        """Edited runs can start from the clean residual: one grid, a checked readout head, every block recorded."""
        return (
            not self.loaded.family.hierarchical
            and self.readout is not None
            and len(self._blocks) == len(self.sites)
            and all(self._blocks[s.index][0] is not None for s in self.sites)
        )

    # --- gradients ------------------------------------------------------------------------------
    def gradients(
        self, target: Callable[[object], torch.Tensor], of: Sequence[torch.Tensor | str] | str
    ) -> list[torch.Tensor | None]:
        """``d target(out) / d x`` for each ``x`` of ``of`` (point names, or ``"probs"``: each block's live
        probabilities in site order), by one backward pass through the clean run's graph."""
        if not self.has_graph:
            raise CaptureError("this run was made without its autograd graph (over the memory budget)")
        if of == "probs":
            tensors = [self._raw[s.index] for s in self.sites]
        else:
            tensors = [self._values[t] if isinstance(t, str) else t for t in of]
        with self._lock, torch.enable_grad():
            y = target(self._out)
            return list(torch.autograd.grad(y, tensors, retain_graph=True, allow_unused=True))

    def probs(self, site: int) -> torch.Tensor:
        """Block ``site``'s probabilities in the family's raw layout (detached)."""
        return self._raw[site].detach()

    def score_of(self, out) -> torch.Tensor:
        """Scores ``(B, C)`` of a forward output (``out`` of the clean graph: :attr:`graph_scores`)."""
        return self.scorer(out)

    @property
    def text_embeddings(self) -> np.ndarray | None:
        """``(K, D)`` float32: the scored labels' prompt embeddings (cached per model and prompt); None: class logits."""
        if self.labels is None:
            return None
        from vitviz.models.zeroshot import text_embeddings

        return text_embeddings(self.loaded, self.labels.prompts)

    def target(self, target: Target | int | None = None) -> Target:
        """``target`` checked against this run's scores: a :class:`Target` (a label target must read this run's
        labels), a class index, or None (the top-1 class, or the top label of a label run)."""
        n = int(self.scores.shape[0])
        if n == 0:
            raise NoScores(f"the run of '{self.loaded.name}' has no scores to explain")
        if target is None:
            top = int(torch.argmax(self.scores))
            return Target.of_class(top) if self.labels is None else Target.of_label(self.labels, top)
        t = resolve_target(target)
        if (t.labels is None) != (self.labels is None) or (
            t.labels is not None and (t.labels, t.prompts or t.labels) != (self.labels.names, self.labels.prompts)
        ):
            what = "class logits" if self.labels is None else "the scores of the labels " + ", ".join(self.labels.names)
            raise TargetError(f"the target {t.name()} does not read this run's scores ({what}).")
        for i in (t.index, t.minus):
            if i is not None and not 0 <= int(i) < n:
                what = "label" if t.is_label else "class"
                raise TargetError(f"{what} index {i} is outside 0..{n - 1} for '{self.loaded.name}'.")
        return t

    def bind(self, target: Target | int | None = None) -> BoundTarget:
        """``target`` (checked, see :meth:`target`) as a differentiable function of a forward output ``(B,)``,
        through this run's scorer."""
        return BoundTarget(self.target(target), self.scorer)

    @property
    def graph_scores(self) -> torch.Tensor | None:
        return self._graph_scores

    @property
    def output(self):
        """The forward's output (in the graph when :attr:`has_graph`)."""
        return self._out

    # --- editing --------------------------------------------------------------------------------
    def _site_of(self, name: str) -> int:
        p = self.points.by_name.get(name)
        if p is None:
            raise ValueError(f"'{self.loaded.name}' has no hook point {name!r}")
        return 0 if p.site is None else p.site

    def resolve(self, edits: Sequence[Edit]) -> list[Edit]:
        """``"mean"`` edits become replacements by the clean run's token mean at their point."""
        out = []
        for e in edits:
            if e.op == "mean":
                x = self.activation(e.point)
                mean = x.reshape(-1, x.shape[-1]).mean(dim=0)
                e = Edit(e.point, "replace", mean, e.heads, e.tokens, e.rows)
            out.append(e)
        return out

    def num_heads_by_point(self) -> dict[str, int]:
        """Heads of each headed point whose heads are column blocks (``attn.q``, ``attn.k``, ``attn.v``, ``attn.z``)."""
        return {
            self.name(s.index, f"attn.{part}"): g.num_heads
            for s, g in zip(self.sites, self.geometries, strict=True)
            for part in ("q", "k", "v", "z")
        }

    def _replay_start(self, edits: Sequence[Edit]) -> int:
        """The first block an edited replay must run: the earliest edited block, or the block after it when the
        edit is of that block's output (``blocks.{l}.out``: the replay starts at l + 1 with the edited residual)."""
        start = self.num_blocks
        for e in edits:
            p = self.points.by_name.get(e.point)
            if p is None:
                raise ValueError(f"'{self.loaded.name}' has no hook point {e.point!r}")
            site = 0 if p.site is None else p.site
            position = next(i for i, s in enumerate(self.sites) if s.index == site)
            start = min(start, position + 1 if p.kind == "out" else position)
        return start

    def edited(
        self,
        edits: Sequence[Edit],
        *,
        batch: int = 1,
        reuse_prefix: bool = True,
        record: Sequence[str] = (),
    ) -> Edited:
        """``batch`` copies of the image with ``edits`` applied (``Edit.rows`` picks copies): their scores, and the
        values at the points of ``record`` as the edited forward used them (:class:`Edited`).

        One-grid ViTs with a readout head start from the clean residual (``reuse_prefix``): at the first edited
        block, or after it when the edit is of a block's output; recorded points before that start are the clean
        run's values (the edits cannot change them). Others run the whole (batched) forward.
        """
        edits = self.resolve(list(edits))
        if not edits:
            raise ValueError("no edits given")
        record = list(dict.fromkeys(record))
        heads = self.num_heads_by_point()
        loaded = self.loaded
        call = Call(loaded.config, self.input_size, batch)
        with (
            torch.inference_mode(),
            active(loaded, edits=edits, record=record, batch=batch, num_heads=heads, call=call) as state,
        ):
            if reuse_prefix and self.replayable:
                start = self._replay_start(edits)
                scores = self._replay_from(start, batch, state)
                work = batch * (self.num_blocks - start) / self.num_blocks
                replayed = True
            else:
                pixels = self.pixels.detach().expand(batch, *self.pixels.shape[1:]).contiguous()
                out = forward_output(loaded, pixels, self.input_size)
                scores = self.scorer(out)
                work, replayed = float(batch), False
            if scores is None:  # a backbone: no scores, the records are the result
                scores = torch.zeros(batch, 0)
            records = dict(state.values)
        for name in record:  # points before a replay's start: the clean run's values, one per copy
            if name not in records and self.has(name):
                x = self.activation(name)
                records[name] = x.expand(batch * x.shape[0], *x.shape[1:]) if x.shape[0] == 1 else x
        return Edited(scores.float(), records, work, replayed)

    def _replay_from(self, start: int, batch: int, state) -> torch.Tensor:
        """Scores of ``batch`` copies replayed from block ``start`` (inside the edited call's ``state``)."""
        if start == 0:
            x = self.block_tokens(self.sites[0].index)[0]
        else:
            x = self.block_tokens(self.sites[start - 1].index)[1]
        x = x.expand(batch, *x.shape[1:]).contiguous()
        if start > 0:  # an edit of the previous block's output: applied here, its block does not run again
            out_name = self.name(self.sites[start - 1].index, "out")
            if state.touches((out_name,)):
                got = state.visit((out_name,), x)
                x = x if got is None else got
        return self._replay(start, x)

    def _replay(self, start: int, x: torch.Tensor) -> torch.Tensor:
        """Blocks ``start .. L-1`` on the residual ``x`` ``(k, T, D)`` with the clean run's arguments, then the readout."""
        model = self.loaded.model
        with self.loaded.family.running(model):
            for site in self.sites[start:]:
                args, kwargs = self.block_call(site.index)
                if args:
                    args = (x, *args[1:])
                else:
                    kwargs = {**kwargs, "hidden_states": x}
                out = site.block(*args, **kwargs)
                x = out[0] if isinstance(out, (tuple, list)) else out
        return self.readout(x)


# --- building a run ---------------------------------------------------------------------------------


def _storages(tensors) -> dict[int, int]:
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            out[st.data_ptr()] = st.nbytes()
    return out


def _tensor_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors``, each counted once (views share theirs)."""
    return sum(_storages(tensors).values())


def _graph_storages(roots) -> dict[int, int]:
    """The storages the autograd graph behind ``roots`` saved for its backward, by walking its nodes once.

    (A ``saved_tensors_hooks`` pack hook that returns the tensor would be simpler, but it ties every saved output
    to its own node in a reference cycle, so a dropped Run's GPU memory waited for the garbage collector.)"""
    seen: set[int] = set()
    stack = [r.grad_fn for r in roots if isinstance(r, torch.Tensor) and r.grad_fn is not None]
    out: dict[int, int] = {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    value = getattr(node, name)
                except RuntimeError:  # freed, or not a tensor a Python object can show
                    continue
                for t in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(t, torch.Tensor):
                        st = t.untyped_storage()
                        out[st.data_ptr()] = st.nbytes()
        stack.extend(n for n, _ in node.next_functions)
    return out


def _graph_bytes(roots, kept) -> int:
    """What the graph behind ``roots`` saved that the Run does not hold otherwise (``kept``)."""
    held = _storages(kept)
    return sum(n for ptr, n in _graph_storages(roots).items() if ptr not in held)


def _checked_readout(
    loaded: LoadedModel, last: torch.Tensor | None, logits: torch.Tensor
) -> tuple[ReadoutHead | None, str]:
    """The family's readout head, if it turns the last residual into the model's logits; else (None, why)."""
    readout = loaded.family.readout_head(loaded.model)
    if readout is None or last is None:
        return None, ""
    with torch.inference_mode():
        got = readout(last).float()[0]
    scale = max(1.0, float(logits.abs().max()))
    if got.shape != logits.shape or float((got - logits).abs().max()) > READOUT_RTOL * scale:
        return None, (
            f"The {loaded.family.name} adapter's readout head ({readout.description}) does not reproduce "
            f"'{loaded.name}''s logits from its last residual stream, so the logit lens and attribution are not "
            "defined for this model until the adapter describes its head correctly."
        )
    return readout, ""


def _make_run(
    loaded: LoadedModel,
    image: Image.Image,
    hw: tuple[int, int],
    labels: Labels | None,
    budget_bytes: int,
    gradients: bool,
) -> Run:
    scorer = scorer_for(loaded, labels)
    points = installed_points(loaded.model)
    sites = tuple(installed_sites(loaded.model))
    check_budget(loaded, hw, batch=1, gradients=False, budget=budget_bytes)
    if gradients:
        try:
            check_budget(loaded, hw, batch=1, gradients=True, budget=budget_bytes)
        except BudgetError:
            gradients = False
    if torch.is_inference_mode_enabled():
        gradients = False  # a caller's inference mode: no graph can be kept
    pixels, resized = preprocess(loaded, [image], hw)
    call = Call(loaded.config, hw, 1)
    rec = _RunRecorder(loaded, call, "float16", len(sites))
    if gradients:
        pixels.requires_grad_(True)  # the graph reaches every block although the parameters need no grad
    mode = torch.enable_grad() if gradients else torch.inference_mode()
    # Every point but the patterns: the recorder already holds each block's live probabilities (``_raw``), and a
    # family's ``probs`` may compute them (T2T's performer), so they are not taken twice.
    record = [n for n, p in points.by_name.items() if p.kind != "pattern"]
    with mode, active(loaded, record=record, grad=gradients) as state:
        out = run_forward(loaded, pixels, rec)
        graph_scores = scorer(out)  # None for a backbone (no classifier, no label embeddings)
    cap = captures_from(loaded, rec, out, resized, hw, 5)[0]
    scores = (
        graph_scores[0].detach().float()
        if graph_scores is not None
        else torch.zeros(0)  # a backbone without scores: views that need none still read the run
    )
    last = rec.blocks.get(sites[-1].index, (None, None))[1] if sites else None
    if labels is None and graph_scores is not None:
        readout, problem = _checked_readout(loaded, _detached(last), scores)
    else:
        readout, problem = None, ""
    return Run(
        loaded=loaded,
        input_size=hw,
        pixels=pixels,
        capture=cap,
        points=points,
        sites=sites,
        geometries=tuple(rec.geometries[s.index] for s in sites),
        scores=scores,
        scorer=scorer,
        labels=labels,
        has_graph=gradients,
        readout=readout,
        readout_problem=problem,
        _values=dict(state.values),
        _blocks=dict(rec.blocks),
        _raw=dict(rec.raw),
        _out=out,
        _graph_scores=graph_scores if gradients else None,
        graph_bytes=_graph_bytes([graph_scores], [*state.values.values(), *rec.raw.values(), pixels])
        if gradients
        else 0,
    )


class _TokenRecorder(BlockRecorder):
    """Each block's input and output tokens only: no summaries, no attention kept (a patch's source)."""

    def __init__(self, loaded: LoadedModel, call: Call) -> None:
        super().__init__(loaded, call)
        self.blocks: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}

    def block(self, site: Site, g: Geometry, raw, module, args, kwargs, output) -> None:
        tokens = self.loaded.family.tokens(self.call, site, module, args, kwargs, output)
        self.blocks[site.index] = tokens if tokens is not None else (None, None)


@dataclass(frozen=True, eq=False)
class Activations:
    """One image's values at some named points and its scores, from one forward in inference mode that keeps
    nothing else (no attention, no summaries, no graph): what a patch reads from its source image. Reads like a
    :class:`Run` (``activation``, ``has``, ``block_tokens``, ``scores``); build it with :func:`get_activations`."""

    loaded: LoadedModel
    input_size: tuple[int, int]
    points: Points = field(repr=False)
    sites: tuple[Site, ...] = field(repr=False)
    scores: torch.Tensor = field(repr=False)  # (C,) float32: class logits or label scores (empty: none)
    _values: Mapping[str, torch.Tensor] = field(repr=False)
    _blocks: Mapping[int, tuple] = field(repr=False)  # site -> (input tokens, output tokens)

    @property
    def num_blocks(self) -> int:
        return len(self.sites)

    def name(self, site: int, part: str) -> str:
        return block_name(self.points, site, part)

    def has(self, name: str) -> bool:
        return name in self._values

    def activation(self, name: str) -> torch.Tensor:
        if name not in self._values:
            raise CaptureError(f"the source forward of '{self.loaded.name}' did not keep the point {name}")
        return self._values[name]

    def block_tokens(self, site: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self._blocks.get(site, (None, None))

    @property
    def nbytes(self) -> int:
        """Memory the values and block tokens hold (storages counted once)."""
        return _tensor_bytes([*self._values.values(), *(t for pair in self._blocks.values() for t in pair)])


SOURCE_PARTS = ("attn.z", "out")  # what a patch reads from its source: head outputs and block outputs
PATTERN_PARTS = (*SOURCE_PARTS, "attn.pattern")  # ... and the attention patterns (attention-pattern patching)


def _make_activations(
    loaded: LoadedModel,
    image: Image.Image,
    hw: tuple[int, int],
    labels: Labels | None,
    budget_bytes: int,
    parts: tuple[str, ...],
) -> Activations:
    scorer = scorer_for(loaded, labels)
    points = installed_points(loaded.model)
    sites = tuple(installed_sites(loaded.model))
    check_budget(loaded, hw, batch=1, gradients=False, budget=budget_bytes)
    pixels, _ = preprocess(loaded, [image], hw)
    rec = _TokenRecorder(loaded, Call(loaded.config, hw, 1))
    record = [block_name(points, s.index, part) for s in sites for part in parts]
    record = [n for n in record if n in points]
    with torch.inference_mode(), active(loaded, record=record) as state:
        out = run_forward(loaded, pixels, rec)
        scores = scorer(out)
    return Activations(
        loaded=loaded,
        input_size=hw,
        points=points,
        sites=sites,
        scores=scores[0].float() if scores is not None else torch.zeros(0),
        _values=dict(state.values),
        _blocks=dict(rec.blocks),
    )


def get_activations(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    size: int | tuple[int, int] | None = None,
    labels: Labels | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    parts: tuple[str, ...] = SOURCE_PARTS,
) -> Run | Activations:
    """``image``'s values at each block's ``parts`` (head outputs ``attn.z``, block outputs ``out``), its block
    tokens and scores: the cached :class:`Run` of the image if there is one (no forward), else one forward in
    inference mode that records only those points (:class:`Activations`, cached like runs). The values are the
    same as the Run's (the same forward; recording changes nothing)."""
    hw = input_size_for(loaded, size, image.size)
    key = _key(loaded, image, hw, labels, budget_bytes)
    run = _RUNS.peek(key)
    if run is not None:
        return run
    if set(parts) < set(PATTERN_PARTS):  # a source kept for pattern patching has these too: no second forward
        fuller = _SOURCES.peek((*key, PATTERN_PARTS))
        if fuller is not None:
            return fuller
    return _SOURCES.get_or_compute(
        (*key, parts), lambda: _make_activations(loaded, image, hw, labels, budget_bytes, parts)
    )


def _digest(image: Image.Image) -> str:
    h = hashlib.sha1(f"{image.mode}{image.size}".encode())
    h.update(image.tobytes())
    return h.hexdigest()


CACHE_SIZE = int(os.environ.get("VITVIZ_RUN_CACHE", "4"))  # runs kept at most
# ... and their bytes at most (activations, probabilities, what the graph saved, the capture): a wide upload's Run
# can hold gigabytes, so a count alone does not bound the server's memory. Same bound for the light sources.
CACHE_MB = float(os.environ.get("VITVIZ_RUN_CACHE_MB", "2048"))
_RUNS: BoundedCache[Run] = BoundedCache(
    max_entries=CACHE_SIZE, max_bytes=int(CACHE_MB * 2**20), size_of=lambda run: run.nbytes
)
_SOURCES: BoundedCache[Activations] = BoundedCache(
    max_entries=CACHE_SIZE, max_bytes=int(CACHE_MB * 2**20), size_of=lambda light: light.nbytes
)


def clear_runs(model: torch.nn.Module | None = None) -> None:
    """Forget every cached run (of ``model`` only, when given: a run holds its model and its graph, so a
    server that evicts a model should drop its runs too)."""
    from vitviz.models.zeroshot import forget_text_embeddings

    for cache in (_RUNS, _SOURCES):
        cache.discard(lambda _key, r: model is None or r.loaded.model is model)
    forget_text_embeddings(model)


def _key(loaded: LoadedModel, image: Image.Image, hw, labels: Labels | None, budget_bytes: int) -> tuple:
    # What the scores are: the labels' names (kept for display) and prompts (scored), or class logits; the adapter
    # and the class names are part of what class logits mean, so a copy of the model with another adapter must not
    # share the Run.
    scored = None if labels is None else (tuple(labels.names), tuple(labels.prompts))
    scores = (type(loaded.family).__qualname__, id(loaded.family), tuple(sorted((loaded.id2label or {}).items())))
    return (id(loaded.model), loaded.name, _digest(image), hw, str(loaded.dtype), scored, budget_bytes, scores)


def peek_run(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    size: int | tuple[int, int] | None = None,
    labels: Labels | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Run | None:
    """The cached :class:`Run` of ``image`` if there is one (no forward), else None."""
    key = _key(loaded, image, input_size_for(loaded, size, image.size), labels, budget_bytes)
    return _RUNS.peek(key)


def get_run(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    size: int | tuple[int, int] | None = None,
    labels: Labels | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    gradients: bool = True,
) -> Run:
    """The clean :class:`Run` of ``image`` on ``loaded`` (cached: the last ``CACHE_SIZE`` runs, ``CACHE_MB`` in all;
    a Run larger than that is returned and not kept).

    ``labels``: a zero-shot model's labels, whose scores the Run holds (None: class logits). Keyed by the model,
    the image's pixels, the input size, the model's dtype, the labels (names and prompts) and the budget; ``gradients`` asks for the autograd graph (kept only within ``budget_bytes``; a cached run
    without it is rebuilt when a graph is asked for).
    """
    hw = input_size_for(loaded, size, image.size)
    key = _key(loaded, image, hw, labels, budget_bytes)

    def enough(run: Run) -> bool:  # a cached run without its graph is rebuilt when a graph is asked for and fits
        return run.has_graph or not gradients or not _graph_possible(loaded, hw, budget_bytes)

    return _RUNS.get_or_compute(
        key, lambda: _make_run(loaded, image, hw, labels, budget_bytes, gradients), accept=enough
    )


def _graph_possible(loaded: LoadedModel, hw: tuple[int, int], budget_bytes: int) -> bool:
    if torch.is_inference_mode_enabled():
        return False
    try:
        check_budget(loaded, hw, batch=1, gradients=True, budget=budget_bytes)
    except BudgetError:
        return False
    return True
