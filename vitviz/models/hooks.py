"""The one hook registry: installed once per model, switched on per call through one ``ContextVar``.

The way ``transformers`` records its own outputs: when a model is loaded (:func:`install`),
every place vitviz reads or edits gets a forward hook, and every hook does nothing unless
a call in the *current context* has set a :class:`CallState` (:func:`active`). That state
holds the call's attention recorder (a capture, a Run: it receives each attention site's
probabilities and each block's end) and its named points' records and edits
(:mod:`vitviz.models.points`). Threads that share one cached model therefore never see
each other's tensors or edits, nothing is registered or removed while other threads run
the model (PyTorch iterates a module's hook dict during its forward), and a forward that
fails leaves nothing behind: the state belongs to the failed call and is reset in
``finally``.

A family adapter names the attention sites (:class:`Site`: the module whose forward output
holds the probabilities, and the block module whose forward finishes the block) and
declares where each block's parts sit (``BlockLayout``), which gives the named points.
Attention probabilities of the families that compute attention through ``transformers``'
attention functions are a point of vitviz's own attention function
(:mod:`vitviz.models.attention`), so they can be edited before the values are mixed; the
others' are the output of a module the layout names (an attention dropout), or are
recorded only.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vitviz.errors import CaptureError
from vitviz.models.attention import use_vitviz_attention
from vitviz.models.points import FUNCTION, Edit, Point, Points, PointState

__all__ = [
    "Site",
    "Recorder",
    "CallState",
    "Registry",
    "install",
    "installed_sites",
    "installed_points",
    "model_lock",
    "active",
    "recording",
    "current",
    "visit_pattern",
    "scratch_for",
]


@dataclass(frozen=True, eq=False)
class Site:
    """One attention block: ``attention`` yields the probabilities, ``block`` ends the block.

    ``attention`` and ``block`` may be the same module (Swin's layer returns both).
    ``stage`` is the adapter's stage index; ``extra`` holds what the adapter needs
    to read the block's geometry (e.g. the block's own sub-modules).
    """

    index: int
    stage: int
    attention: torch.nn.Module
    block: torch.nn.Module
    extra: Any = None


class Recorder(Protocol):
    def on_attention(self, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None: ...

    def on_block(self, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None: ...

    # Optional: ``scratch(shape, dtype, device)``, a buffer the attention function may write a block's probabilities
    # into, or None. A recorder lends one only if it keeps nothing of them past the block's end (see scratch_for).


@dataclass(frozen=True)
class CallState:
    """What one call asks of the hooks: an attention recorder, and its points' records and edits (either None)."""

    recorder: Recorder | None = None
    points: PointState | None = None


@dataclass(frozen=True, eq=False)
class Registry:
    """What :func:`install` put on one model: its attention sites and its named points."""

    sites: tuple[Site, ...]
    points: Points


_CALL: ContextVar[CallState | None] = ContextVar("vitviz_call", default=None)
_INSTALL_LOCK = threading.Lock()
# Kept beside the models, not on them: a model stays picklable and deep-copyable (a copy has no hooks).
_REGISTRY: weakref.WeakKeyDictionary[torch.nn.Module, Registry] = weakref.WeakKeyDictionary()
_LOCKS: weakref.WeakKeyDictionary[torch.nn.Module, threading.Lock] = weakref.WeakKeyDictionary()
# The module that calls vitviz's attention function -> its pattern point names (see vitviz.models.attention).
_PATTERN_CALLERS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[str, ...]] = weakref.WeakKeyDictionary()


def current() -> CallState | None:
    """This context's call state (None outside a vitviz call)."""
    return _CALL.get()


# --- the hooks --------------------------------------------------------------------------------------


def _attention_hook(site: Site):
    def hook(module, args, kwargs, output):
        state = _CALL.get()
        if state is not None and state.recorder is not None:
            state.recorder.on_attention(site, module, args, kwargs, output)

    return hook


def _block_hook(site: Site):
    def hook(module, args, kwargs, output):
        state = _CALL.get()
        if state is not None and state.recorder is not None:
            state.recorder.on_block(site, module, args, kwargs, output)

    return hook


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    x = args[0] if args else kwargs.get("hidden_states")
    return x if isinstance(x, torch.Tensor) else None


def _input_hook(names: tuple[str, ...], keep_input_of: int | None):
    def hook(module, args, kwargs):
        state = _CALL.get()
        pts = state.points if state is not None else None
        if pts is None:
            return None
        x = _first_tensor(args, kwargs)
        if x is None:
            return None
        out = pts.visit(names, x) if pts.touches(names) else None
        if keep_input_of is not None:  # resid_mid of this block reads the block's (edited) input
            pts.inputs[keep_input_of] = x if out is None else out
        if out is None:
            return None
        if args:
            return (out, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": out}

    return hook


def _sliced(point: Point, x: torch.Tensor) -> tuple[torch.Tensor, slice | None]:
    if point.columns is None:
        return x, None
    i, n = point.columns
    width = x.shape[-1]
    if width % n:
        raise CaptureError(f"{point.name}: width {width} does not split into {n} equal parts")
    cols = slice(i * width // n, (i + 1) * width // n)
    return x[..., cols], cols


def _output_hook(points: tuple[Point, ...]):
    """Points on one module's output; several may be slices of it (a fused qkv: q, k, v)."""
    groups: dict[tuple[int, int] | None, tuple[Point, ...]] = {}
    for p in points:
        groups[p.columns] = (*groups.get(p.columns, ()), p)

    def hook(module, args, kwargs, output):
        state = _CALL.get()
        pts = state.points if state is not None else None
        if pts is None:
            return None
        first = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(first, torch.Tensor):
            return None
        new = first
        changed = False
        for group in groups.values():
            names = tuple(p.name for p in group)
            if not pts.touches(names):
                continue
            part, cols = _sliced(group[0], new)
            got = pts.visit(names, part)
            if got is None:
                continue
            changed = True
            if cols is None:
                new = got
            else:  # the edited slice back into a new tensor (the module's output is not written in place)
                new = torch.cat([new[..., : cols.start], got, new[..., cols.stop :]], dim=-1)
        if not changed:
            return None
        return (new, *output[1:]) if isinstance(output, (tuple, list)) else new

    return hook


def _mid_hook(names: tuple[str, ...], site: int):
    """``resid_mid``: the block input plus the branch's update; an edit of it changes the update by its difference."""

    def hook(module, args, kwargs, output):
        state = _CALL.get()
        pts = state.points if state is not None else None
        if pts is None or not pts.touches(names):
            return None
        update = output[0] if isinstance(output, (tuple, list)) else output
        x_in = pts.inputs.get(site)
        if not isinstance(update, torch.Tensor) or x_in is None or x_in.shape != update.shape:
            raise CaptureError(
                f"{names[0]}: the block's input was not seen or does not match its attention update in shape"
            )
        mid = x_in + update
        got = pts.visit(names, mid)
        if got is None:
            return None
        new = got - x_in
        return (new, *output[1:]) if isinstance(output, (tuple, list)) else new

    return hook


def _pattern_hook(point: Point, site: Site):
    """A record-only pattern: the family reads the probabilities from the module's call (``family.probs``)."""
    names = (point.name,)

    def hook(module, args, kwargs, output):
        state = _CALL.get()
        pts = state.points if state is not None else None
        if pts is None or pts.probs is None or not pts.touches(names):
            return None
        p = pts.probs(site, module, args, kwargs, output)
        if p is not None:
            pts.visit(names, p)
        return None

    return hook


def visit_pattern(module: torch.nn.Module, probs: torch.Tensor) -> torch.Tensor:
    """Called by vitviz's attention function with the probabilities ``(B, H, Tq, Tk)`` it computed: the call's
    edits applied and records taken; the tensor the forward goes on with."""
    state = _CALL.get()
    pts = state.points if state is not None else None
    if pts is None:
        return probs
    names = _PATTERN_CALLERS.get(module)
    if not names or not pts.touches(names):
        return probs
    got = pts.visit(names, probs)
    return probs if got is None else got


def scratch_for(
    module: torch.nn.Module, shape: torch.Size, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Called by vitviz's attention function: a buffer to compute this block's probabilities in, lent by the call's
    recorder, or None. Never while gradients are on (the graph keeps the probabilities) or while the call records
    or edits this block's pattern (a record would hold them)."""
    state = _CALL.get()
    if state is None or state.recorder is None or torch.is_grad_enabled():
        return None
    names = _PATTERN_CALLERS.get(module)
    if state.points is not None and names and state.points.touches(names):
        return None
    lend = getattr(state.recorder, "scratch", None)
    return None if lend is None else lend(shape, dtype, device)


# --- installation ------------------------------------------------------------------------------------


def _declare(family, sites: list[Site]) -> tuple[list[Point], tuple[str, ...], dict[int, Any]]:
    """Every point the family's layout gives, each block's name prefix, and each block's parts."""
    prefixes: list[str] = []
    within: dict[int, int] = {}
    points: list[Point] = []
    parts_of: dict[int, Any] = {}
    for site in sites:
        j = within.get(site.stage, 0)
        within[site.stage] = j + 1
        prefix = f"stages.{site.stage}.blocks.{j}" if family.hierarchical else f"blocks.{site.index}"
        prefixes.append(prefix)
        parts = family.block_parts(site)
        parts_of[site.index] = parts
        if site.index == 0:
            points.append(Point("embed.out", site.block, "input", None, "in"))
        points.append(Point(f"{prefix}.in", site.block, "input", site.index, "in"))
        for kind in ("q", "k", "v"):
            found = getattr(parts, kind)
            if found is not None:
                points.append(Point(f"{prefix}.attn.{kind}", found[0], "output", site.index, kind, columns=found[1]))
        config = parts.caller.__dict__.get("config") if parts.pattern == FUNCTION else None
        if parts.pattern == FUNCTION and hasattr(config, "_attn_implementation"):
            points.append(Point(f"{prefix}.attn.pattern", parts.caller, "output", site.index, "pattern"))
        elif isinstance(parts.pattern, torch.nn.Module):
            points.append(Point(f"{prefix}.attn.pattern", parts.pattern, "output", site.index, "pattern"))
        else:
            why = (
                f"the {family.name} adapter names no place where this block's probabilities can be changed before "
                "they are used (a hook sees them only after the forward has used them)"
            )
            points.append(
                Point(
                    f"{prefix}.attn.pattern", site.attention, "output", site.index, "pattern", editable=False, why=why
                )
            )
        proj = _callable_module(site, parts.projection)
        if proj is not None:
            points.append(Point(f"{prefix}.attn.z", proj, "input", site.index, "z"))
            points.append(Point(f"{prefix}.attn.out", proj, "output", site.index, "attn_out"))
        if parts.branch is not None and not family.hierarchical:
            points.append(Point(f"{prefix}.resid_mid", parts.branch, "output", site.index, "mid"))
        if parts.mlp is not None:
            points.append(Point(f"{prefix}.mlp.out", parts.mlp, "output", site.index, "mlp"))
        points.append(Point(f"{prefix}.out", site.block, "output", site.index, "out"))
    return points, tuple(prefixes), parts_of


def _callable_module(site: Site, proj: torch.nn.Module | None) -> torch.nn.Module | None:
    """``proj`` unless the forward never calls it as a module (``nn.MultiheadAttention`` reads ``out_proj.weight``)."""
    if proj is None:
        return None
    for m in (site.attention, *site.block.modules()):
        if isinstance(m, torch.nn.MultiheadAttention) and m.out_proj is proj:
            return None
    return proj


def install(model: torch.nn.Module, family) -> Registry:
    """Register, once per model, the hooks of every attention site and named point ``family`` declares.

    Idle unless a call in the current context sets a state (:func:`active`). Call it at load time, before other
    threads run the model; later calls return the installed registry. Within one module, the points' hooks
    run before the recorder's, so a recorder sees what the forward went on with (edits included).
    """
    with _INSTALL_LOCK:
        found = _REGISTRY.get(model)
        if found is not None:
            return found
        sites = family.sites(model)
        declared, prefixes, _ = _declare(family, sites)
        z_modules = [p.module for p in declared if p.kind == "z"]
        if len({id(m) for m in z_modules}) != len(z_modules):
            raise CaptureError(f"the {family.name} adapter names one output projection for two blocks")
        mid_sites = {p.site for p in declared if p.kind == "mid"}
        # Input points, grouped by module (aliases of one place: embed.out and blocks.0.in).
        inputs: dict[int, list[Point]] = {}
        outputs: dict[int, list[Point]] = {}
        modules: dict[int, torch.nn.Module] = {}
        for p in declared:
            modules[id(p.module)] = p.module
            if p.kind == "pattern":
                continue
            if p.kind == "mid":
                continue
            (inputs if p.side == "input" else outputs).setdefault(id(p.module), []).append(p)
        block_of = {id(s.block): s.index for s in sites}
        for key, group in inputs.items():
            keep = block_of.get(key) if block_of.get(key) in mid_sites else None
            modules[key].register_forward_pre_hook(_input_hook(tuple(p.name for p in group), keep), with_kwargs=True)
        for p in declared:
            if p.kind == "mid":
                p.module.register_forward_hook(_mid_hook((p.name,), p.site), with_kwargs=True)
        for p in declared:
            if p.kind != "pattern":
                continue
            if not p.editable:
                p.module.register_forward_hook(_pattern_hook(p, sites[p.site]), with_kwargs=True)
            elif isinstance(p.module, torch.nn.Module) and _is_caller(family, sites[p.site], p.module):
                _PATTERN_CALLERS[p.module] = (*_PATTERN_CALLERS.get(p.module, ()), p.name)
            else:
                outputs.setdefault(id(p.module), []).append(p)
        for key, group in outputs.items():
            modules[key].register_forward_hook(_output_hook(tuple(group)), with_kwargs=True)
        for site in sites:  # the recorder's hooks come last on each module: they see the edited values
            site.attention.register_forward_hook(_attention_hook(site), with_kwargs=True)
            site.block.register_forward_hook(_block_hook(site), with_kwargs=True)
        callers = [p.module for p in declared if p.kind == "pattern" and p.module in _PATTERN_CALLERS]
        if callers:
            use_vitviz_attention(callers, visit_pattern, scratch_for)
        registry = Registry(tuple(sites), Points({p.name: p for p in declared}, prefixes))
        _REGISTRY[model] = registry
        _LOCKS[model] = threading.Lock()
        return registry


def _is_caller(family, site: Site, module: torch.nn.Module) -> bool:
    parts = family.block_parts(site)
    return parts.pattern == FUNCTION and parts.caller is module


def _registry(model: torch.nn.Module) -> Registry:
    found = _REGISTRY.get(model)
    if found is None:
        raise RuntimeError("vitviz's hooks are not installed on this model: load it with load_model()")
    return found


def installed_sites(model: torch.nn.Module) -> list[Site]:
    """The attention sites of a loaded model, in forward order."""
    return list(_registry(model).sites)


def installed_points(model: torch.nn.Module) -> Points:
    """The named points of a loaded model."""
    return _registry(model).points


def model_lock(model: torch.nn.Module) -> threading.Lock:
    """A lock per model, for families whose forward writes to the shared module (Swin v1)."""
    return _LOCKS[model]


# --- switching them on for one call ----------------------------------------------------------------


@contextmanager
def active(
    model_or_loaded,
    *,
    recorder: Recorder | None = None,
    record: Iterable[str] | None = (),
    edits: Iterable[Edit] = (),
    batch: int = 1,
    num_heads: Mapping[str, int] | None = None,
    grad: bool = False,
    call=None,
) -> Iterator[PointState | None]:
    """Make this context's forwards of the model record ``record`` (None: every point), apply ``edits``, and feed
    ``recorder`` (an attention recorder), for the duration of the block.

    ``batch``: the forward runs ``batch`` copies along axis 0 (``Edit.rows`` picks among them).
    ``num_heads``: heads per headed point (needed to select heads of ``q``, ``k``, ``v``, ``z``). ``grad``: keep
    recorded tensors in the autograd graph. ``call`` (a ``families.base.Call``): lets record-only ``attn.pattern``
    points read the family's probabilities. Yields the point state (its ``values`` hold the records when the
    block exits; None when only a recorder is given, which keeps an enclosing block's points). A state set by an enclosing block is kept for what this
    one does not set (a capture inside an edited block records the edited forward).
    """
    model = getattr(model_or_loaded, "model", model_or_loaded)
    outer = _CALL.get()
    pts = outer.points if outer is not None else None
    wants_points = recorder is None or record is None or bool(record) or bool(edits)
    if wants_points:
        points = _registry(model).points
        probs = None
        if call is not None:
            fam = model_or_loaded.family

            def probs(site, module, args, kwargs, output):
                return fam.probs(call, site, module, args, kwargs, output)

        pts = PointState(points, record, list(edits), batch, num_heads, grad, probs)
    rec = recorder if recorder is not None else (outer.recorder if outer is not None else None)
    token = _CALL.set(CallState(rec, pts))
    try:
        yield pts if wants_points else None
    finally:
        _CALL.reset(token)


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Make ``recorder`` receive this context's attention hook calls for the duration of the block (the points'
    records and edits of an enclosing :func:`active` stay)."""
    outer = _CALL.get()
    token = _CALL.set(CallState(recorder, outer.points if outer is not None else None))
    try:
        yield recorder
    finally:
        _CALL.reset(token)
