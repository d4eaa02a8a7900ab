"""Named hook points and the edits made at them: data and arithmetic only (the hooks are :mod:`vitviz.models.hooks`).

The names are the same in every family that has the part (TransformerLens' idea, on
the user's own ``transformers`` model; the family adapter's block layout says where each
part is, ``vitviz.models.families.base.BlockLayout``). A point records the value the rest
of the forward used (after the point's edits):

==============================  =====================================  ======================================
vitviz point                    TransformerLens                        value
==============================  =====================================  ======================================
``embed.out``                   ``hook_embed`` + ``hook_pos_embed``    the residual stream entering block 0
``blocks.{i}.in``               ``blocks.{i}.hook_resid_pre``          block i's input ``(B, T, D)``
``blocks.{i}.attn.q``           ``blocks.{i}.attn.hook_q``             the query projection's output
``blocks.{i}.attn.k``           ``blocks.{i}.attn.hook_k``             the key projection's output
``blocks.{i}.attn.v``           ``blocks.{i}.attn.hook_v``             the value projection's output
``blocks.{i}.attn.pattern``     ``blocks.{i}.attn.hook_pattern``       the probabilities (family's raw layout)
``blocks.{i}.attn.z``           ``blocks.{i}.attn.hook_z``             the output projection's input
``blocks.{i}.attn.out``         ``blocks.{i}.hook_attn_out``           the output projection's output
``blocks.{i}.resid_mid``        ``blocks.{i}.hook_resid_mid``          input + the attention update
``blocks.{i}.mlp.out``          ``blocks.{i}.hook_mlp_out``            the MLP's update
``blocks.{i}.out``              ``blocks.{i}.hook_resid_post``         block i's output
==============================  =====================================  ======================================

Shapes and conventions. ``q``, ``k``, ``v`` and ``z`` are ``(B, T, H * d)`` with head h in
columns ``h*d .. (h+1)*d - 1`` (TransformerLens splits the heads into an axis of their own:
``(B, T, H, d)``); where a family computes them in one fused Linear (``qkv``), the point is
that Linear's slice. ``q`` and ``k`` are taken before any rotary embedding (DINOv3 rotates
them afterwards, as TransformerLens' ``hook_q`` precedes ``hook_rot_q``). ``attn.pattern``
is ``(B, H, Tq, Tk)`` for global attention (windows, unfolded patches: the family's raw
layout, ``B`` times the windows along axis 0). ``z`` includes the value bias (``z_h =
A_h (X W_V,h + b_V,h)``), so zeroing it removes head h's value bias with the head; the
projection's own bias ``b_O`` stays. ``attn.out`` and ``mlp.out`` are the branches'
updates before any layer scale (where a family has layer scales, the residual receives
them scaled); TransformerLens models have none. ``resid_mid`` is block i's input plus
its attention update as the residual stream receives it (layer scale included), the
input of the MLP's norm; it exists where the family's block adds the attention branch
to its input in token layout (the one-grid ViTs), and an edit of it changes the
attention update by the edit's difference (exact up to float rounding).

Hierarchical families prefix the stage and count blocks within it:
``stages.{s}.blocks.{j}.out``. :func:`block_name` maps a site index to its prefix.

An edit is data, :class:`Edit` ``(point, op, value, heads, tokens, rows)``:

* ``replace``: by ``value`` (broadcast to the selection);
* ``zero``;
* ``mean``: the mean over this image's positions of the value arriving at the point
  (per column; per head and key for a pattern: every query row becomes the head's mean
  row, so rows still sum to 1);
* ``patch``: the value another run had at the same point (``value`` is that run, or its
  tensor);
* ``add``: plus ``value`` (a steering vector ``(C,)``, or any tensor that broadcasts);
* ``scale``: times ``value`` (a number or a tensor that broadcasts);
* ``fn``: ``value(x)``, a function of the arriving tensor ``x`` (the point's whole value,
  ``(B, ...)``) returning a tensor of the same shape; the selection then picks where its
  result is used.

``heads`` selects heads (column blocks of ``q``, ``k``, ``v``, ``z``; axis 1 of a global
``pattern``), ``tokens`` indices along the token axis (axis 1; the query axis of a
pattern), ``rows`` which copies of a batched call (a call of ``batch`` copies splits axis
0 into ``batch`` equal parts); None selects everything. Several edits at one point apply
in the order given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from vitviz.errors import CaptureError

__all__ = [
    "Edit",
    "EditOp",
    "EDIT_OPS",
    "FUNCTION",
    "Point",
    "Points",
    "PointState",
    "PointKind",
    "block_name",
    "TRANSFORMER_LENS_NAMES",
]

FUNCTION = "function"  # a layout's pattern: the family's attention runs through vitviz's attention function

EditOp = Literal["replace", "zero", "mean", "patch", "add", "scale", "fn"]
EDIT_OPS: tuple[str, ...] = ("replace", "zero", "mean", "patch", "add", "scale", "fn")
PointKind = Literal["in", "q", "k", "v", "pattern", "z", "attn_out", "mid", "mlp", "out"]

# vitviz's block part -> TransformerLens' name of its counterpart (the table in the module docstring)
TRANSFORMER_LENS_NAMES = {
    "in": "hook_resid_pre",
    "attn.q": "attn.hook_q",
    "attn.k": "attn.hook_k",
    "attn.v": "attn.hook_v",
    "attn.pattern": "attn.hook_pattern",
    "attn.z": "attn.hook_z",
    "attn.out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "mlp.out": "hook_mlp_out",
    "out": "hook_resid_post",
}
_HEADED = ("q", "k", "v", "z", "pattern")  # kinds whose edits may select heads


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
        if self.op not in EDIT_OPS:
            raise ValueError(f"an edit's op is one of {', '.join(EDIT_OPS)}, got {self.op!r}")
        if self.op in ("replace", "patch", "add", "scale", "fn") and self.value is None:
            raise ValueError(f"a {self.op!r} edit of {self.point} needs a value")
        if self.op == "fn" and not callable(self.value):
            raise ValueError(f"an 'fn' edit of {self.point} takes a function of the tensor, got {self.value!r}")
        for name in ("heads", "tokens", "rows"):
            sel = getattr(self, name)
            if sel is not None:
                object.__setattr__(self, name, tuple(int(i) for i in sel))


@dataclass(frozen=True, eq=False)
class Point:
    """A named place in the forward: the input (``side="input"``) or output of ``module``.

    ``columns`` ``(part, parts)``: the point is part ``part`` of ``parts`` equal slices of the
    module's last axis (a fused ``qkv`` Linear); None: the whole value. ``editable``: False
    where a hook sees the value only after the forward has used it (``why`` says so).
    """

    name: str
    module: torch.nn.Module
    side: Literal["input", "output"]
    site: int | None  # the attention site (block) it belongs to; None for ``embed.out``
    kind: PointKind
    columns: tuple[int, int] | None = None
    editable: bool = True
    why: str = ""  # why it is record-only ("" when editable)

    @property
    def headed(self) -> bool:
        return self.kind in _HEADED


@dataclass(frozen=True, eq=False)
class Points:
    """The points installed on one model: ``by_name``, and each block's name prefix (``prefixes[site]``)."""

    by_name: Mapping[str, Point]
    prefixes: tuple[str, ...]

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)


def block_name(points: Points, site: int, part: str) -> str:
    """The name of ``part`` (``in``, ``attn.z``, ...) of the block at attention site ``site``."""
    return f"{points.prefixes[site]}.{part}"


class PointState:
    """One call's records and edits (private to the call's context; see :func:`vitviz.models.hooks.active`)."""

    def __init__(
        self,
        points: Points,
        record: Iterable[str] | None,
        edits: Iterable[Edit],
        batch: int,
        num_heads: Mapping[str, int] | None,
        grad: bool,
        probs: Callable | None = None,
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
            p = points.by_name[name]
            if not p.editable:
                raise ValueError(f"{name} can be recorded, not edited: {p.why}")
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.batch = batch
        self.num_heads = dict(num_heads or {})
        self.grad = grad
        self.probs = probs  # site, module, args, kwargs, output -> the probabilities (record-only patterns)
        self.values: dict[str, torch.Tensor] = {}
        self.inputs: dict[int, torch.Tensor] = {}  # block input per site, for ``resid_mid`` (this call only)

    def wants(self, name: str) -> bool:
        return self.record_all or name in self.record

    def touches(self, names: tuple[str, ...]) -> bool:
        """Whether this call records or edits any of ``names``."""
        return any(n in self.edits or self.wants(n) for n in names)

    def visit(self, names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor | None:
        """Apply the edits of ``names`` (aliases of one place) to ``x``, record it; the new tensor or None."""
        out = None
        for name in names:
            edits = self.edits.get(name)
            if edits:
                point = self.points.by_name[name]
                out = apply_edits(x if out is None else out, edits, self.batch, self._heads(point, edits), point)
        y = x if out is None else out
        kept = y if self.grad else y.detach()
        for name in names:
            if self.wants(name):
                self.values[name] = kept
        return out

    def _heads(self, point: Point, edits: list[Edit]) -> int | None:
        if not any(e.heads is not None for e in edits):
            return None
        if not point.headed:
            raise ValueError(
                f"heads can be selected at an attn.q, attn.k, attn.v, attn.z or attn.pattern point, not at {point.name}"
            )
        if point.kind == "pattern":
            return None  # the head axis is the tensor's own
        h = self.num_heads.get(point.name)
        if h is None:
            raise ValueError(
                f"selecting heads at {point.name} needs its number of heads (pass num_heads, or use a Run)"
            )
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


def _fill(e: Edit, x: torch.Tensor, xv: torch.Tensor, out: torch.Tensor, k: int, point: Point) -> torch.Tensor:
    """The new values ``e`` writes, broadcastable to ``xv`` ``(k, n, ...)`` (copies split off axis 0)."""
    name = point.name
    if e.op == "zero":
        return torch.zeros((), dtype=x.dtype, device=x.device)
    if e.op == "mean":  # per copy: the mean over this image's positions (per head and key for a pattern)
        if point.kind == "pattern" and xv.dim() >= 5:
            return out.mean(dim=(1, 3), keepdim=True)  # (k, 1, H, 1, Tk)
        c = x.shape[-1]
        return out.reshape(k, -1, c).mean(dim=1).reshape([k] + [1] * (xv.dim() - 2) + [c])
    if e.op == "fn":
        got = e.value(out.reshape(x.shape))
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(x.shape):
            raise ValueError(
                f"an 'fn' edit of {name} must return a tensor of shape {tuple(x.shape)}, got "
                f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}"
            )
        return got.to(x.dtype).reshape(xv.shape)
    v = _source(e.value, name) if e.op == "patch" else e.value
    v = torch.as_tensor(v).to(device=x.device, dtype=x.dtype)
    if e.op == "patch" and tuple(v.shape[-(xv.dim() - 1) :]) != tuple(xv.shape[1:]):
        raise CaptureError(
            f"cannot patch {name}: the source run has shape {tuple(v.shape)} there, this run "
            f"{tuple(x.shape)} (different input sizes or grids)"
        )
    if e.op in ("replace", "patch"):
        try:
            return torch.broadcast_to(v, xv.shape[1:])[None]
        except RuntimeError:
            raise ValueError(
                f"a replacement of shape {tuple(v.shape)} does not fit {name} (per copy {tuple(xv.shape[1:])})"
            ) from None
    try:
        torch.broadcast_shapes(v.shape, xv.shape[1:])
    except RuntimeError:
        raise ValueError(f"an {e.op!r} value of shape {tuple(v.shape)} does not broadcast to {name}") from None
    return out + v if e.op == "add" else out * v


def apply_edits(x: torch.Tensor, edits: list[Edit], k: int, heads: int | None, point: Point) -> torch.Tensor:
    """``x`` (k copies along axis 0) with ``edits`` applied in order; a new tensor (autograd flows through).

    ``heads``: the number of column blocks of a headed point whose edits select heads (None otherwise).
    """
    name = point.name
    if x.shape[0] % k:
        raise CaptureError(f"{name}: {x.shape[0]} rows do not split into {k} copies")
    xv = x.reshape(k, x.shape[0] // k, *x.shape[1:])  # (k, n, T, ..., C)
    out = xv
    c = x.shape[-1]
    pattern = point.kind == "pattern"
    token_axis = 3 if pattern else 2  # a pattern (k, n, H, Tq, Tk): queries; else (k, n, T, ..., C)
    for e in edits:
        mask = torch.ones([1] * xv.dim(), dtype=torch.bool, device=x.device)
        for axis, sel, what in ((0, e.rows, "rows"), (token_axis, e.tokens, "tokens")):
            if sel is None:
                continue
            if axis >= xv.dim() - 1:
                raise ValueError(f"{name} has no token axis to select from (shape {tuple(x.shape)})")
            m = _mask(xv.shape[axis], sel, what, x.device)
            mask = mask & m.reshape([-1 if a == axis else 1 for a in range(xv.dim())])
        if e.heads is not None:
            if pattern:
                if xv.dim() < 5:
                    raise ValueError(f"{name} has no head axis to select from (shape {tuple(x.shape)})")
                hm = _mask(xv.shape[2], e.heads, "heads", x.device)
                mask = mask & hm.reshape([1, 1, -1] + [1] * (xv.dim() - 3))
            else:
                if c % heads:
                    raise CaptureError(f"{name}: width {c} does not split into {heads} heads")
                hm = _mask(heads, e.heads, "heads", x.device)
                mask = mask & hm.repeat_interleave(c // heads).reshape([1] * (xv.dim() - 1) + [-1])
        out = torch.where(mask, _fill(e, x, xv, out, k, point), out)
    return out.reshape(x.shape)
