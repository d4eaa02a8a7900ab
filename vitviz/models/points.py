"""Named hook points: one registry per model, each point able to record or edit, active only inside a call.

The names are the same in every family that has the part (TransformerLens' idea, on
the user's own ``transformers`` model; the family adapter says where each part is):

* ``embed.out``: the residual stream entering the first block (the embeddings as
  the first block receives them); the same tensor as ``blocks.0.in``;
* ``blocks.{i}.in``: block i's input (its residual stream), ``(B, T, D)`` for a
  one-grid ViT, prefix tokens first;
* ``blocks.{i}.attn.pattern``: the attention probabilities the block computed, in
  the family's raw layout (``(B, H, Tq, Tk)`` for global attention); record only
  (the forward has used them by the time a hook sees them);
* ``blocks.{i}.attn.z``: the input of the attention's output projection,
  ``(B, T, H * d)``: head h is columns ``h*d .. (h+1)*d - 1``. It includes the value
  bias (``z_h = A_h (X W_V,h + b_V,h)``), so zeroing it removes head h's value bias
  with the head; the projection's own bias ``b_O`` stays;
* ``blocks.{i}.mlp.out``: the MLP's update before any layer scale (where the
  adapter declares the MLP module);
* ``blocks.{i}.out``: block i's output (the residual stream after it).

Hierarchical families prefix the stage and count blocks within it:
``stages.{s}.blocks.{j}.out``. :func:`block_name` maps a site index to its prefix.

An edit is data, :class:`Edit` ``(point, op, value, heads, tokens, rows)``:
``replace`` (by ``value``), ``zero``, ``mean`` (the mean over this image's positions
of the value arriving at the point, per head column) or ``patch`` (the value another
run had at the same point: ``value`` is that run, or its tensor). ``heads`` selects
head column blocks (``attn.z`` only), ``tokens`` indices along the token axis
(axis 1), ``rows`` which copies of a batched call (a call of ``batch`` copies splits
axis 0 into ``batch`` equal parts); None selects everything.

Mechanics, as ``vitviz.models.hooks``: the hooks are installed once per model
(:func:`install_points`, at load) and do nothing unless the *current context* has
set a call state (:func:`active`, a ``ContextVar``). Threads sharing one cached
model never see each other's edits or records; nothing is registered or removed
while other threads run the model; a failing forward leaves nothing behind (the
state belongs to the failed call and is reset in ``finally``). Values are recorded
after the point's edits (what the rest of the forward used), detached unless the
call keeps the graph (``grad=True``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from vitviz.errors import CaptureError
from vitviz.models.hooks import Site, installed_sites

__all__ = [
    "Edit",
    "EditOp",
    "Point",
    "Points",
    "PointState",
    "install_points",
    "installed_points",
    "block_name",
    "active",
]

EditOp = Literal["replace", "zero", "mean", "patch"]
_OPS = ("replace", "zero", "mean", "patch")


@dataclass(frozen=True)
class Edit:
    """One edit at one named point. See the module docstring for the operations and selections."""

    point: str
    op: EditOp
    value: Any = field(default=None, repr=False)
    heads: tuple[int, ...] | None = None
    tokens: tuple[int, ...] | None = None
    rows: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"an edit's op is one of {', '.join(_OPS)}, got {self.op!r}")
        if self.op in ("replace", "patch") and self.value is None:
            raise ValueError(f"a {self.op!r} edit of {self.point} needs a value")
        for name in ("heads", "tokens", "rows"):
            sel = getattr(self, name)
            if sel is not None:
                object.__setattr__(self, name, tuple(int(i) for i in sel))


@dataclass(frozen=True, eq=False)
class Point:
    """A named place in the forward: the input (``side="input"``) or output of ``module``."""

    name: str
    module: torch.nn.Module
    side: Literal["input", "output"]
    site: int | None  # the attention site (block) it belongs to; None for ``embed.out``
    kind: str  # "in", "pattern", "z", "mlp", "out"

    @property
    def editable(self) -> bool:
        return self.kind != "pattern"


@dataclass(frozen=True, eq=False)
class Points:
    """The points installed on one model: ``by_name``, and each block's name prefix (``prefixes[site]``)."""

    by_name: Mapping[str, Point]
    prefixes: tuple[str, ...]

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)


class PointState:
    """One call's records and edits (private to the call's context)."""

    def __init__(
        self,
        points: Points,
        record: Iterable[str] | None,
        edits: Iterable[Edit],
        batch: int,
        num_heads: Mapping[str, int] | None,
        grad: bool,
        probs=None,
    ) -> None:
        self.points = points
        self.record_all = record is None
        self.record = set() if record is None else set(record)
        self.edits: dict[str, list[Edit]] = {}
        for e in edits:
            self.edits.setdefault(e.point, []).append(e)
        for name in (*self.record, *self.edits):
            if name not in points:
                raise ValueError(_unknown(points, name))
        for name in self.edits:
            if not points.by_name[name].editable:
                raise ValueError(f"{name} can be recorded, not edited (the forward has used it when a hook sees it)")
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.batch = batch
        self.num_heads = dict(num_heads or {})
        self.grad = grad
        self.probs = probs  # site, module, args, kwargs, output -> the probabilities (attn.pattern)
        self.values: dict[str, torch.Tensor] = {}

    def wants(self, name: str) -> bool:
        return self.record_all or name in self.record

    def visit(self, names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor | None:
        """Apply the edits of ``names`` (aliases of one place) to ``x``, record it; the new tensor or None."""
        out = None
        for name in names:
            edits = self.edits.get(name)
            if edits:
                out = _apply(x if out is None else out, edits, self.batch, self._heads(name, edits), name)
        y = x if out is None else out
        kept = y if self.grad else y.detach()
        for name in names:
            if self.wants(name):
                self.values[name] = kept
        return out

    def _heads(self, name: str, edits: list[Edit]) -> int | None:
        if not any(e.heads is not None for e in edits):
            return None
        if self.points.by_name[name].kind != "z":
            raise ValueError(f"heads can be selected at an attn.z point only, not at {name}")
        h = self.num_heads.get(name)
        if h is None:
            raise ValueError(f"selecting heads at {name} needs its number of heads (pass num_heads, or use a Run)")
        return h


def _unknown(points: Points, name: str) -> str:
    stem = name.rsplit(".", 1)[0]
    near = [n for n in points.by_name if n.startswith(stem)][:6] or list(points.by_name)[:6]
    return f"this model has no hook point {name!r}; some it has: {', '.join(near)}"


def _mask(n: int, sel: tuple[int, ...] | None, what: str, device) -> torch.Tensor | None:
    if sel is None:
        return None
    bad = [i for i in sel if not -n <= i < n]
    if bad:
        raise ValueError(f"{what} {bad} outside 0..{n - 1}")
    m = torch.zeros(n, dtype=torch.bool, device=device)
    m[list(sel)] = True
    return m


def _source(value: Any, name: str) -> torch.Tensor:
    """The tensor a patch reads: ``value`` itself, or what the run ``value`` had at ``name``."""
    if isinstance(value, torch.Tensor):
        return value
    getter = getattr(value, "activation", None)
    if getter is None:
        raise ValueError(f"a patch of {name} takes another Run or its tensor at that point, got {type(value).__name__}")
    return getter(name)


def _apply(x: torch.Tensor, edits: list[Edit], k: int, heads: int | None, name: str) -> torch.Tensor:
    """``x`` (k copies along axis 0) with ``edits`` applied in order; a new tensor (autograd flows through)."""
    if x.shape[0] % k:
        raise CaptureError(f"{name}: {x.shape[0]} rows do not split into {k} copies")
    xv = x.reshape(k, x.shape[0] // k, *x.shape[1:])  # (k, n, T, ..., C)
    out = xv
    c = x.shape[-1]
    for e in edits:
        shape = [1] * xv.dim()
        mask = torch.ones(shape, dtype=torch.bool, device=x.device)
        for axis, sel, what in ((0, e.rows, "rows"), (2, e.tokens, "tokens")):
            if sel is None:
                continue
            if axis >= xv.dim() - 1:
                raise ValueError(f"{name} has no token axis to select from (shape {tuple(x.shape)})")
            m = _mask(xv.shape[axis], sel, what, x.device)
            mask = mask & m.reshape([-1 if a == axis else 1 for a in range(xv.dim())])
        if e.heads is not None:
            if c % heads:
                raise CaptureError(f"{name}: width {c} does not split into {heads} heads")
            hm = _mask(heads, e.heads, "heads", x.device)
            mask = mask & hm.repeat_interleave(c // heads).reshape([1] * (xv.dim() - 1) + [-1])
        if e.op == "zero":
            fill = torch.zeros((), dtype=x.dtype, device=x.device)
        elif e.op == "mean":  # per copy: the mean over every position of this image at this point
            fill = out.reshape(k, -1, c).mean(dim=1).reshape([k] + [1] * (xv.dim() - 2) + [c])
        else:
            v = e.value if e.op == "replace" else _source(e.value, name)
            v = torch.as_tensor(v).to(device=x.device, dtype=x.dtype)
            if e.op == "patch" and tuple(v.shape[-(xv.dim() - 1) :]) != tuple(xv.shape[1:]):
                raise CaptureError(
                    f"cannot patch {name}: the source run has shape {tuple(v.shape)} there, this run "
                    f"{tuple(x.shape)} (different input sizes or grids)"
                )
            try:
                fill = torch.broadcast_to(v, xv.shape[1:])[None]
            except RuntimeError:
                raise ValueError(
                    f"a replacement of shape {tuple(v.shape)} does not fit {name} (per copy {tuple(xv.shape[1:])})"
                ) from None
        out = torch.where(mask, fill, out)
    return out.reshape(x.shape)


# --- installation ---------------------------------------------------------------------------------

_ACTIVE: ContextVar[PointState | None] = ContextVar("vitviz_points", default=None)
_INSTALL_LOCK = threading.Lock()
_POINTS: weakref.WeakKeyDictionary[torch.nn.Module, Points] = weakref.WeakKeyDictionary()  # beside the model


def _input_hook(names: tuple[str, ...]):
    def hook(module, args, kwargs):
        state = _ACTIVE.get()
        if state is None:
            return None
        if args:
            if not isinstance(args[0], torch.Tensor):
                return None
            out = state.visit(names, args[0])
            return None if out is None else ((out, *args[1:]), kwargs)
        x = kwargs.get("hidden_states")
        if not isinstance(x, torch.Tensor):
            return None
        out = state.visit(names, x)
        return None if out is None else (args, {**kwargs, "hidden_states": out})

    return hook


def _output_hook(names: tuple[str, ...]):
    def hook(module, args, kwargs, output):
        state = _ACTIVE.get()
        if state is None:
            return None
        first = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(first, torch.Tensor):
            return None
        out = state.visit(names, first)
        if out is None:
            return None
        return (out, *output[1:]) if isinstance(output, (tuple, list)) else out

    return hook


def _pattern_hook(name: str, site: Site):
    def hook(module, args, kwargs, output):
        state = _ACTIVE.get()
        if state is None or state.probs is None or not state.wants(name):
            return None
        p = state.probs(site, module, args, kwargs, output)
        if p is not None:
            state.values[name] = p if state.grad else p.detach()
        return None

    return hook


def _callable_module(site: Site, proj: torch.nn.Module | None) -> torch.nn.Module | None:
    """``proj`` unless the forward never calls it as a module (``nn.MultiheadAttention`` reads ``out_proj.weight``)."""
    if proj is None:
        return None
    for m in (site.attention, *site.block.modules()):
        if isinstance(m, torch.nn.MultiheadAttention) and m.out_proj is proj:
            return None
    return proj


def block_name(points: Points, site: int, part: str) -> str:
    """The name of ``part`` (``in``, ``attn.z``, ...) of the block at attention site ``site``."""
    return f"{points.prefixes[site]}.{part}"


def _declare(family, model: torch.nn.Module, sites: list[Site]) -> tuple[list[Point], tuple[str, ...]]:
    hierarchical = family.hierarchical
    prefixes: list[str] = []
    within: dict[int, int] = {}
    points: list[Point] = []
    for site in sites:
        j = within.get(site.stage, 0)
        within[site.stage] = j + 1
        prefix = f"stages.{site.stage}.blocks.{j}" if hierarchical else f"blocks.{site.index}"
        prefixes.append(prefix)
        parts = family.block_parts(site)
        if site.index == 0:
            points.append(Point("embed.out", site.block, "input", None, "in"))
        points.append(Point(f"{prefix}.in", site.block, "input", site.index, "in"))
        points.append(Point(f"{prefix}.attn.pattern", site.attention, "output", site.index, "pattern"))
        proj = _callable_module(site, parts.projection)
        if proj is not None:
            points.append(Point(f"{prefix}.attn.z", proj, "input", site.index, "z"))
        if parts.mlp is not None:
            points.append(Point(f"{prefix}.mlp.out", parts.mlp, "output", site.index, "mlp"))
        points.append(Point(f"{prefix}.out", site.block, "output", site.index, "out"))
    return points, tuple(prefixes)


def install_points(loaded) -> Points:
    """Register, once per model, the hooks of every named point the family declares; later calls return them.

    Idle unless a call in the current context sets a state (:func:`active`). Call it at load time (before
    other threads run the model); the attention sites (``vitviz.models.hooks``) must be installed first.
    """
    model = loaded.model
    found = _POINTS.get(model)
    if found is not None:
        return found
    with _INSTALL_LOCK:
        found = _POINTS.get(model)
        if found is not None:
            return found
        sites = installed_sites(model)
        declared, prefixes = _declare(loaded.family, model, sites)
        z_modules = [p.module for p in declared if p.kind == "z"]
        if len({id(m) for m in z_modules}) != len(z_modules):
            raise CaptureError(f"the {loaded.family.name} adapter names one output projection for two blocks")
        places: dict[tuple[int, str, str], list[Point]] = {}
        for p in declared:
            key = (id(p.module), p.side, "pattern" if p.kind == "pattern" else "value")
            places.setdefault(key, []).append(p)
        for group in places.values():
            p = group[0]
            names = tuple(q.name for q in group)
            if p.kind == "pattern":
                p.module.register_forward_hook(_pattern_hook(p.name, sites[p.site]), with_kwargs=True)
            elif p.side == "input":
                p.module.register_forward_pre_hook(_input_hook(names), with_kwargs=True)
            else:
                p.module.register_forward_hook(_output_hook(names), with_kwargs=True)
        points = Points({p.name: p for p in declared}, prefixes)
        _POINTS[model] = points
        return points


def installed_points(model: torch.nn.Module) -> Points:
    points = _POINTS.get(model)
    if points is None:
        raise RuntimeError("vitviz's hook points are not installed on this model: load it with load_model()")
    return points


@contextmanager
def active(
    loaded,
    *,
    record: Iterable[str] | None = (),
    edits: Iterable[Edit] = (),
    batch: int = 1,
    num_heads: Mapping[str, int] | None = None,
    grad: bool = False,
    call=None,
) -> Iterator[PointState]:
    """Make this context's forwards of ``loaded`` record ``record`` (None: every point) and apply ``edits``.

    ``batch``: the forward runs ``batch`` copies along axis 0 (``Edit.rows`` picks among them).
    ``num_heads``: heads per ``attn.z`` point (needed to select heads). ``grad``: keep recorded tensors in
    the autograd graph. ``call`` (a ``families.base.Call``): lets ``attn.pattern`` points read the family's
    probabilities. The state's ``values`` hold the records when the block exits.
    """
    points = install_points(loaded)
    probs = None
    if call is not None:
        fam = loaded.family

        def probs(site, module, args, kwargs, output):
            return fam.probs(call, site, module, args, kwargs, output)

    state = PointState(points, record, list(edits), batch, num_heads, grad, probs)
    token = _ACTIVE.set(state)
    try:
        yield state
    finally:
        _ACTIVE.reset(token)
