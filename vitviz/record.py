"""The capture record: one forward pass -> stages -> blocks, each block's attention in its native form.

A plain ViT is the one-stage case: one grid, every block ``global`` attention over
the same tokens. Hierarchical models (Swin, PvT, CvT, MobileViT) have several
stages, each with its own token grid over the input, and blocks whose attention
has another shape. The native forms (one image, no batch axis):

* ``global``: ``(H, Tq, Tk)``, queries = prefix tokens + the stage grid, keys =
  the same prefix tokens + the key grid (the stage grid itself, a coarser grid
  after spatial reduction: PvT, PvT v2, CvT, or the finer grid of the previous
  stage where a block pools its queries: Hiera);
* ``window`` (Swin): ``(nW, H, w*w, w*w)``: the grid is padded on the bottom and
  right to multiples of ``w``, rolled by ``(-shift, -shift)`` and cut into
  ``nW`` windows, row-major over the padded grid; rows and columns are the
  window's tokens in row-major order, in the shifted frame. Hiera's mask units are
  windows with no shift and no padding; where a block pools its queries, its keys
  are the previous stage's tokens, ``key_stride`` times finer per axis (key rule
  ``finer``): ``(nW, H, w*w, (w*f)*(w*f))``, the keys of each window row-major on
  the key grid;
* ``unfolded`` (MobileViT): ``(A, H, N, N)``: attention among the N patches of
  the block's patch grid, once per offset inside a patch (A = ph * pw offsets);
* ``separable`` (MobileViT V2): ``(A, N)``: one context-score vector over the N
  patches per offset; there is no query and one "head";
* ``pool`` (an attention-pooling head: SigLIP, AIMv2): ``(H, Tk)``: the single learned
  probe query's attention over the keys (prefix tokens + the grid) of the last
  stage; the probe is not a token of the sequence. Models that pool this way read
  their prediction from it, so rollout and relevance start from it.

Global attention may carry ``trailing`` tokens after the grid that are not on the
image (SigLIP 2 NaFlex pads every image to a patch budget): they are left out of
every map and reported as a padding share, like Swin's padding.

The native forms list tokens in row-major grid order whatever order the model
keeps them in: Hiera keeps its tokens "unrolled" (``Geometry.unroll``), and the
capture puts them back (``vitviz.models.families.base.to_native``).

Every record field is read-only. Where cells are placed on the image: token
(r, c) of a grid (gh, gw) covers rows ``[r H / gh, (r + 1) H / gh)`` and columns
``[c W / gw, (c + 1) W / gw)`` of the ``H x W`` model input.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = [
    "BlockKind",
    "KeyRule",
    "Geometry",
    "Block",
    "Summaries",
    "Stage",
    "Prediction",
    "PositionTable",
    "RelativeBias",
    "PositionInfo",
    "Capture",
    "QueryPoints",
    "POOLED",
    "frozen",
]

BlockKind = Literal["global", "window", "unfolded", "separable", "pool"]
KeyRule = Literal["same", "strided", "centre", "finer"]
POOLED = -1  # the pooled query (mean of the grid tokens' rows): the global view of models without CLS


def frozen(a: np.ndarray | None) -> np.ndarray | None:
    if a is not None:
        a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Geometry:
    """How one block attended, read from the block as it ran (not from the config).

    ``key_rule`` says how a key cell of a reduced key grid covers the stage tokens:
    ``same`` (keys are the stage grid), ``strided`` (key j came from the block of
    ``stride`` tokens starting at ``j * stride``; the last key takes the rest),
    ``centre`` (a token belongs to the key cell that contains its centre), or
    ``finer`` (the keys are a grid ``key_stride`` times finer than the stage grid,
    the previous stage's tokens: key j lies inside stage token ``j // stride``;
    Hiera's query-pooling blocks, global or in windows).

    ``unroll``: None for every family but Hiera. Hiera lists its tokens in its
    "unrolled" order and its raw probabilities as ``(B, H, nW, Tq, Tk)``; ``unroll``
    is the tuple of (row, col) strides its queries are still unrolled by (possibly
    empty), the keys of a ``finer`` block by ``(key_stride, *unroll)``. The native
    form is always in row-major grid order: ``to_native`` undoes the unrolling.
    """

    stage: int
    kind: BlockKind
    num_heads: int
    grid: tuple[int, int]  # query grid (the stage grid)
    prefix_kinds: tuple[str, ...] = ()  # tokens before the grid, in queries and keys alike
    key_grid: tuple[int, int] | None = None  # global: keys' grid; None = the stage grid
    key_rule: KeyRule = "same"
    key_stride: tuple[int, int] = (1, 1)
    window: int = 0  # window: side w
    shift: int = 0  # window: cyclic shift s (0 for regular windows)
    padded: tuple[int, int] | None = None  # window: grid padded to multiples of w
    offsets: int = 1  # unfolded / separable: A = ph * pw
    trailing: int = 0  # global / pool: tokens after the grid that are not on the image (padding)
    unroll: tuple[tuple[int, int], ...] | None = None  # Hiera: strides its raw token order is unrolled by

    def __post_init__(self) -> None:
        if self.key_rule == "finer":
            fy, fx = self.key_stride
            need = (self.grid[0] * fy, self.grid[1] * fx)
            if self.key_grid != need:
                raise ValueError(
                    f"keys {self.key_stride} times finer than a {self.grid} grid lie on {need}, not {self.key_grid}"
                )
            if self.kind == "window" and (self.shift or self.padded != self.grid or fy != fx):
                raise ValueError("windows with finer keys have no shift, no padding and a square key stride")

    @property
    def num_prefix(self) -> int:
        return len(self.prefix_kinds)

    @property
    def keys(self) -> tuple[int, int]:
        """The grid the keys live on: the key grid of reduced attention, else the stage grid."""
        return self.key_grid or self.grid

    @property
    def num_windows(self) -> int:
        if self.kind != "window":
            return 0
        return (self.padded[0] // self.window) * (self.padded[1] // self.window)

    @property
    def key_window(self) -> int:
        """Side of a window's key block: ``window``, or ``window * key_stride`` where the keys are finer."""
        if self.key_rule == "finer":
            if self.key_stride[0] != self.key_stride[1]:
                raise ValueError(f"windows with finer keys need a square key stride, got {self.key_stride}")
            return self.window * self.key_stride[0]
        return self.window

    def native_shape(self) -> tuple[int, ...]:
        gh, gw = self.grid
        p = self.num_prefix
        if self.kind == "global":
            kh, kw = self.keys
            return (self.num_heads, p + gh * gw + self.trailing, p + kh * kw + self.trailing)
        if self.kind == "pool":
            return (self.num_heads, p + gh * gw + self.trailing)
        if self.kind == "window":
            return (self.num_windows, self.num_heads, self.window**2, self.key_window**2)
        if self.kind == "unfolded":
            return (self.offsets, self.num_heads, gh * gw, gh * gw)
        return (self.offsets, gh * gw)


class Summaries:
    """A block's per-head summaries ``(distance, entropy, entropy_norm)``, each ``(H,)`` float64, read-only.

    Given as arrays, or as a function computing them from the block's float32 weights, called on the first read
    (a run that keeps those weights anyway need not spend the time when no view asks: the estimate of activation
    patching reads none). Either way the values are the same; the first read is thread-safe and the function is
    dropped once it has run.
    """

    __slots__ = ("_compute", "_lock", "_pending", "_values", "num_heads")

    def __init__(
        self,
        values: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        *,
        compute: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
        num_heads: int | None = None,
        pending_bytes: int = 0,
    ) -> None:
        if (values is None) == (compute is None):
            raise ValueError("give the summaries' values or the function that computes them, not both")
        self._values = None if values is None else self._frozen(values)
        self._compute = compute
        self._pending = 0 if values is not None else int(pending_bytes)
        self._lock = threading.Lock()
        self.num_heads = len(values[0]) if values is not None else num_heads

    @property
    def pending_bytes(self) -> int:
        """What the function holds until it runs (the weights it reads), so that caches can count it."""
        return 0 if self._values is not None else self._pending

    @staticmethod
    def _frozen(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        got = tuple(frozen(np.array(v, dtype=np.float64)) for v in values)
        if len(got) != 3:
            raise ValueError(f"a block has 3 summaries (distance, entropy, entropy_norm), got {len(got)}")
        return got  # type: ignore[return-value]

    @property
    def computed(self) -> bool:
        return self._values is not None

    def __getstate__(self) -> dict:  # a copy (pickle, another process) carries the values, not the function
        return {"values": self.get(), "num_heads": self.num_heads}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["values"], num_heads=state["num_heads"])

    def get(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._values is None:
            with self._lock:
                if self._values is None:
                    self._values = self._frozen(self._compute())
                    self._compute, self._pending = None, 0  # releases the weights it read
        return self._values


@dataclass(frozen=True, eq=False)
class Block:
    """One attention block of one image.

    ``attention``: native form (see the module docstring), stored as float16 for
    display. ``fused``: the head mean of the same values, float32, computed before
    storage (rollout reads it). ``distance``, ``entropy``, ``entropy_norm``:
    ``(H,)`` float64 per-head summaries computed from the float32 weights (``nan``
    where undefined, e.g. distance of separable attention), as the block ran or on
    the first read (:class:`Summaries`).
    """

    index: int
    geometry: Geometry
    attention: np.ndarray = field(repr=False)
    fused: np.ndarray = field(repr=False)
    summaries: Summaries = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("attention", "fused"):
            frozen(getattr(self, name))

    @property
    def distance(self) -> np.ndarray:
        return self.summaries.get()[0]

    @property
    def entropy(self) -> np.ndarray:
        return self.summaries.get()[1]

    @property
    def entropy_norm(self) -> np.ndarray:
        return self.summaries.get()[2]

    @property
    def stage(self) -> int:
        return self.geometry.stage

    @property
    def kind(self) -> BlockKind:
        return self.geometry.kind

    @property
    def num_heads(self) -> int:
        return self.geometry.num_heads

    @property
    def nbytes(self) -> int:
        # The summaries' size is known without computing them: 3 float64 values per head (or the one "head").
        n = self.summaries.num_heads or self.num_heads
        return self.attention.nbytes + self.fused.nbytes + 3 * 8 * n + self.summaries.pending_bytes


@dataclass(frozen=True, eq=False)
class Stage:
    """A run of blocks on one token grid.

    ``parents``: for each row (and column) of the previous stage's grid, the row
    (column) of this stage's grid whose cell it merges into (``None`` for the first
    stage, and where no token-to-token path crosses the boundary, as in MobileViT).
    ``token_norms``: ``(len(blocks) + 1, P + N)`` L2 norms of the tokens entering
    the stage (row 0) and after each of its blocks.
    """

    index: int
    grid: tuple[int, int]
    prefix_kinds: tuple[str, ...]
    blocks: tuple[int, ...]
    parents: tuple[np.ndarray, np.ndarray] | None = field(repr=False)
    token_norms: np.ndarray | None = field(repr=False)

    def __post_init__(self) -> None:
        frozen(self.token_norms)
        for a in self.parents or ():
            frozen(a)

    @property
    def num_prefix(self) -> int:
        return len(self.prefix_kinds)

    @property
    def num_tokens(self) -> int:
        return self.num_prefix + self.grid[0] * self.grid[1]


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    probability: float  # softmax over all classes
    logit: float


@dataclass(frozen=True, eq=False)
class PositionTable:
    """Absolute position embeddings of the patch tokens of one stage: ``(G_h * G_w, D)`` on the native grid."""

    name: str
    embeddings: np.ndarray = field(repr=False)
    grid: tuple[int, int]

    def __post_init__(self) -> None:
        frozen(self.embeddings)


@dataclass(frozen=True, eq=False)
class RelativeBias:
    """A relative position bias per head over offsets: ``(H, 2w - 1, 2w - 1)``; centre = offset (0, 0)."""

    name: str
    bias: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        frozen(self.bias)


@dataclass(frozen=True)
class PositionInfo:
    tables: tuple[PositionTable, ...] = ()
    biases: tuple[RelativeBias, ...] = ()
    note: str = ""  # what the model uses instead, when it has neither


@dataclass(frozen=True, eq=False)
class Capture:
    """What one forward pass saw: stages of blocks, predictions, position information. Arrays are read-only.

    ``image``: ``(h, w, 3)`` uint8, the resized input the model saw; ``logits``:
    ``(C,)`` or None for backbones. ``readout``: ``cls`` when the last stage has a
    CLS token the prediction reads, ``head`` when an attention-pooling head (the last
    block, kind ``pool``) makes the image embedding, else ``pooled`` (the mean of the
    final grid tokens). ``rollout_note``: why rollout is undefined, when it is. Plain ViTs
    also keep their attention as one ``(L, H, T, T)`` float16 stack
    (``attention_stack``); their blocks are views into it.
    """

    model_name: str
    family: str
    input_size: tuple[int, int]
    patch_size: int  # pixels per first-stage token (the patch-embedding stride)
    stages: tuple[Stage, ...]
    blocks: tuple[Block, ...]
    image: np.ndarray = field(repr=False)
    logits: np.ndarray | None = field(repr=False)
    predictions: tuple[Prediction, ...]
    readout: Literal["cls", "pooled", "head"]
    position: PositionInfo
    patch_weights: np.ndarray | None = field(repr=False)
    rollout_note: str = ""
    attention_stack: np.ndarray | None = field(default=None, repr=False)
    image_embedding: np.ndarray | None = field(default=None, repr=False)  # (D,) for zero-shot models

    def __post_init__(self) -> None:
        frozen(self.image)
        frozen(self.logits)
        frozen(self.attention_stack)
        frozen(self.image_embedding)

    # --- the shape of the record -------------------------------------------------
    @property
    def is_hierarchical(self) -> bool:
        """Several stages, or blocks that are not global attention over one grid (a pooling head does not count)."""
        return len(self.stages) > 1 or any(b.kind not in ("global", "pool") for b in self.blocks)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_layers(self) -> int:
        """Blocks, in forward order (plain ViTs call them layers)."""
        return len(self.blocks)

    @property
    def num_heads(self) -> int:
        """Heads of the widest block."""
        return max(b.num_heads for b in self.blocks)

    def stage_of(self, block: int) -> Stage:
        return self.stages[self.blocks[block].stage]

    def block_label(self, block: int) -> str:
        b = self.blocks[block]
        if b.kind == "pool":
            return "pooling head"
        if len(self.stages) == 1:
            return f"block {block}"
        within = self.stages[b.stage].blocks.index(block)
        return f"stage {b.stage}, block {within}"  # every index 0-based (docs/conventions.md)

    # --- the first (or only) stage, as plain ViT views know it ----------------------
    @property
    def grid(self) -> tuple[int, int]:
        return self.stages[0].grid

    @property
    def prefix_kinds(self) -> tuple[str, ...]:
        return self.stages[0].prefix_kinds

    @property
    def num_prefix_tokens(self) -> int:
        return self.stages[0].num_prefix

    @property
    def token_kinds(self) -> tuple[str, ...]:
        s = self.stages[0]
        return s.prefix_kinds + ("patch",) * (s.grid[0] * s.grid[1])

    @property
    def num_tokens(self) -> int:
        return self.stages[0].num_tokens

    @property
    def token_norms(self) -> np.ndarray | None:
        return self.stages[0].token_norms

    @property
    def attentions(self) -> np.ndarray:
        """``(L, H, T, T)`` float16 of a plain (one-grid) ViT; hierarchical models have no dense stack."""
        if self.attention_stack is None:
            raise ValueError(
                f"{self.model_name} has no dense (L, H, T, T) stack: its blocks attend in windows, over reduced keys "
                "or with padding tokens; ask a block for its query map instead"
            )
        return self.attention_stack

    @property
    def attention_precision(self) -> str:
        return str(self.blocks[0].attention.dtype)

    @property
    def position_embeddings(self) -> np.ndarray | None:
        return self.position.tables[0].embeddings if self.position.tables else None

    @property
    def position_grid(self) -> tuple[int, int] | None:
        return self.position.tables[0].grid if self.position.tables else None

    @property
    def position_note(self) -> str:
        return self.position.note

    @property
    def nbytes(self) -> int:
        """Bytes this image's arrays hold (position embeddings and patch weights are the model's, shared)."""
        arrays = [self.image, self.logits, self.image_embedding, *(s.token_norms for s in self.stages)]
        return sum(a.nbytes for a in arrays if a is not None) + sum(b.nbytes for b in self.blocks)

    # --- tokens and pixels -------------------------------------------------------
    def token_label(self, index: int, stage: int = 0) -> str:
        """``CLS``, ``DIST``, ``REG0``, ``pooled``, or ``patch (row, col)`` for a position in a stage's sequence."""
        if index == POOLED:
            return "pooled query"
        s = self.stages[stage]
        if index < s.num_prefix:
            return s.prefix_kinds[index]
        row, col = divmod(index - s.num_prefix, s.grid[1])
        return f"patch ({row}, {col})" if len(self.stages) == 1 else f"token ({row}, {col})"

    def token_at(self, stage: int, x: float, y: float) -> int:
        """The stage token whose cell contains pixel ``(x, y)`` of the model input (clipped to the image)."""
        s = self.stages[stage]
        h, w = self.input_size
        row = min(max(int(y * s.grid[0] // h), 0), s.grid[0] - 1)
        col = min(max(int(x * s.grid[1] // w), 0), s.grid[1] - 1)
        return s.num_prefix + row * s.grid[1] + col

    def token_centre(self, stage: int, token: int) -> tuple[float, float] | None:
        """Pixel ``(x, y)`` of a grid token's cell centre; None for prefix tokens and the pooled query."""
        s = self.stages[stage]
        if token < s.num_prefix:
            return None
        row, col = divmod(token - s.num_prefix, s.grid[1])
        h, w = self.input_size
        return (col + 0.5) * w / s.grid[1], (row + 0.5) * h / s.grid[0]

    def carry_query(self, token: int, from_stage: int, to_stage: int) -> int:
        """The same query at another stage: the prefix token of that kind, the cell at that pixel, or pooled."""
        if from_stage == to_stage or token == POOLED:
            return token
        src, dst = self.stages[from_stage], self.stages[to_stage]
        if token < src.num_prefix:
            kind = src.prefix_kinds[token]
            return dst.prefix_kinds.index(kind) if kind in dst.prefix_kinds else self.default_query(to_stage)
        x, y = self.token_centre(from_stage, token)
        return self.token_at(to_stage, x, y)

    def default_query(self, stage: int) -> int:
        """CLS where the stage has one, else the pooled query."""
        return 0 if self.stages[stage].num_prefix else POOLED


@dataclass(frozen=True, eq=False)
class QueryPoints:
    """One head's attention from one query over its sampled points (pixels of the model input).

    ``points``, ``references``: ``(Ns, 2)`` (x, y); ``weights``: ``(Ns,)`` summing to 1;
    ``query``: ``(x, y)`` centre of the query's cell (None for the pooled query); ``on_map``: ``(Ns,)`` the share of
    each point's bilinear footprint on the map (1 inside, 0 wholly outside: reads zeros).
    """

    head: int
    token: int
    query: tuple[float, float] | None
    points: np.ndarray
    weights: np.ndarray
    references: np.ndarray
    on_map: np.ndarray
