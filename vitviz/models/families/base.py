"""What a family adapter answers: where a model's attention is, what it means, how its tokens map to the image.

Adding a family touches its adapter, its tests and the presets, nothing else. An
adapter names the attention sites (``sites``), extracts the probabilities a site
computed (``probs``) and reads, from the block as it ran, how it attended
(``geometry``). Everything else (capture, rollout, maps, summaries) works on the
record those answers produce.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import torch

from vitviz.models.hooks import Site
from vitviz.models.points import FUNCTION
from vitviz.record import Geometry, PositionInfo

__all__ = [
    "Call",
    "Family",
    "ReadoutHead",
    "BlockParts",
    "BlockLayout",
    "FUNCTION",
    "to_native",
    "unrolled_order",
    "reroll_index",
    "centre_parents",
    "declared",
    "ABSENT",
]


@dataclass
class Call:
    """One capture call as the adapter sees it: the config, the input size, the batch, and a scratch pad.

    ``scratch`` is private to the call (hooks of a family may leave notes for later
    hooks of the same forward, e.g. the feature-map size a MobileViT stage saw).
    """

    config: Any
    input_size: tuple[int, int]
    batch: int
    scratch: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ReadoutHead:
    """How class logits are read from the last residual stream, in three steps (logit lens, attribution).

    ``select``: residual ``(B, T, D)`` -> ``(B, R, D)``, a *linear* map of the tokens
    (picking the readout tokens, or averaging them) applied before the final norm;
    ``norm``: the final LayerNorm, applied to each of the R vectors; ``head``: the
    normed ``(B, R, D)`` -> logits ``(B, C)``, an *affine* map. ``head(norm(select(x)))``
    of the model's last residual ``x`` is the model's logits (callers check it).
    """

    select: Callable[[torch.Tensor], torch.Tensor]
    norm: torch.nn.Module
    head: Callable[[torch.Tensor], torch.Tensor]
    description: str

    def __call__(self, residual: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` residual stream -> ``(B, C)`` logits."""
        return self.head(self.norm(self.select(residual)))


@dataclass(frozen=True)
class BlockLayout:
    """Where a block's parts sit: dotted paths under the block module, declared once per family.

    Each field lists alternatives, the first that exists wins (one per variant of the
    family's blocks). A path may end in ``#i/n``: part ``i`` of ``n`` equal slices of that
    module's output along its last axis (a fused ``qkv`` Linear: ``"attn.qkv#0/3"`` is q).

    ``projection``: the attention's output projection, a Linear whose input is the heads side
    by side (head h in columns ``h*d .. (h+1)*d - 1``). ``q``, ``k``, ``v``: the modules whose
    outputs are the queries, keys and values ``(B, T, H * d)``. ``pattern``: where the
    probabilities can be edited: ``FUNCTION`` where the family computes attention through
    ``transformers``' attention functions (vitviz then runs its own, ``vitviz.models.attention``,
    with the probabilities as a point), else modules whose forward output is the probabilities
    the forward goes on with (an attention dropout); none: record only. ``caller``: the module
    that calls the attention function (its ``self``), for ``FUNCTION``. ``branch``: the module
    whose output is the attention update the residual stream receives (after any layer
    scale), in token layout; it gives ``resid_mid``. ``mlp``: the module whose output is the
    MLP update before any layer scale; ``mlp_output``: the MLP's last Linear. ``norms``: the
    norms before the attention and before the MLP. ``layer_scales``: the attention's and the
    MLP's layer scale (a ``(D,)`` tensor or a float; None for the pair: the blocks have none).
    """

    projection: tuple[str, ...] = ()
    q: tuple[str, ...] = ()
    k: tuple[str, ...] = ()
    v: tuple[str, ...] = ()
    pattern: tuple[str, ...] = ()
    caller: tuple[str, ...] = ()
    branch: tuple[str, ...] = ()
    mlp: tuple[str, ...] = ()
    mlp_output: tuple[str, ...] = ()
    norms: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    layer_scales: tuple[str, str] | None = None


@dataclass(frozen=True, eq=False)
class BlockParts:
    """What one attention block has, as its family's :class:`BlockLayout` declares it (never guessed).

    ``projection``: the attention's output projection (a Linear reading the heads side by side), or None.
    ``q``, ``k``, ``v``: ``(module, columns)`` whose output (slice ``columns`` = ``(part, parts)``, or all
    of it) is that tensor, or None. ``pattern``: ``FUNCTION`` (with ``caller``, the module that calls
    vitviz's attention function), a module whose output is the probabilities used, or None (record only).
    ``branch``: the module whose output is the attention update the residual receives. ``mlp``: the module
    whose forward output is the block's MLP update before any layer scale (None: not declared).
    ``attn_scale``, ``mlp_scale``: the per-channel layer scales ``(D,)`` (or a float) applied to the
    attention and MLP updates before the residual adds; None = the block has none. ``norms``: the norms
    applied to the residual stream before the attention and before the MLP. ``unknown``: "" when the
    adapter knows where this block's layer scales and MLP sit (or that it has none); else why it does not
    (direct logit attribution then refuses).
    """

    projection: torch.nn.Linear | None = None
    mlp: torch.nn.Module | None = None
    attn_scale: torch.Tensor | float | None = None
    mlp_scale: torch.Tensor | float | None = None
    norms: tuple[torch.nn.Module | None, torch.nn.Module | None] = (None, None)
    unknown: str = ""
    q: tuple[torch.nn.Module, tuple[int, int] | None] | None = None
    k: tuple[torch.nn.Module, tuple[int, int] | None] | None = None
    v: tuple[torch.nn.Module, tuple[int, int] | None] | None = None
    pattern: torch.nn.Module | str | None = None
    caller: torch.nn.Module | None = None
    branch: torch.nn.Module | None = None
    mlp_linear: torch.nn.Linear | None = None


_ABSENT = object()
ABSENT = _ABSENT  # what ``declared`` gives, with ``default=ABSENT``, for a path that does not exist


def declared(root: torch.nn.Module, path: str, default=None):
    """The object at the dotted ``path`` under ``root`` (an adapter's declaration), or ``default`` when absent."""
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, _ABSENT)
        if obj is _ABSENT or obj is None:
            return default if obj is _ABSENT else None
    return obj


def _first(root: torch.nn.Module, paths: tuple[str, ...], kind: type = torch.nn.Module):
    """The first of ``paths`` under ``root`` that is a ``kind``, with its ``#i/n`` slice; (None, None) if none."""
    for path in paths:
        base, _, part = path.partition("#")
        found = declared(root, base) if base else root
        if isinstance(found, kind):
            columns = None
            if part:
                i, n = (int(v) for v in part.split("/"))
                columns = (i, n)
            return found, columns
    return None, None


def to_native(g: Geometry, raw: torch.Tensor, batch: int) -> torch.Tensor:
    """The site's probabilities (as the model computed them) -> ``(B, *native shape)``.

    Raw layouts: global ``(B, H, Tq, Tk)``; window ``(B * nW, H, w*w, w*w)``; unfolded
    ``(B * A, H, N, N)``; separable ``(B, 1, A, N)``; pool ``(B, H, 1, Tk)`` (any layout
    with the same order): a view. Hiera (``g.unroll`` set): ``(B, H, nW, Tq, Tk)`` in
    its unrolled token order, gathered into the native form's row-major order (a copy;
    the same gather serves the probabilities and their gradients, so the pairs stay
    aligned).
    """
    if g.unroll is not None:
        return _rerolled(g, raw, batch)
    native = raw.reshape(batch, *g.native_shape())
    return native


@lru_cache(maxsize=128)
def unrolled_order(grid: tuple[int, int], strides: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Hiera's token order: ``order[t]`` is the row-major grid index of sequence position t: ``(gh * gw,)`` int64.

    What ``transformers``' ``hiera.modeling_hiera.unroll`` does to a ``(gh, gw)`` grid with
    ``strides`` ``(s_1, ..., s_k)``: for each stride in turn it cuts the current grid into
    cells of ``sy x sx`` and moves the offset inside the cell in front of the coarser
    grid. Position t then reads, most significant first, (offset in the finest cells,
    ..., offset in the coarsest cells, row, column of the coarsest grid), so each
    stride's 2 x 2 children sit ``N / (sy sx)`` positions apart and the ``sy sx``
    leading blocks of the sequence are what a max over them pools. Read-only.
    """
    gh, gw = grid
    idx = np.arange(gh * gw, dtype=np.int64).reshape(1, gh, gw)
    for sy, sx in strides:
        b, h, w = idx.shape
        if h % sy or w % sx:
            raise ValueError(
                f"a {gh} x {gw} grid does not unroll by {strides}: {h} x {w} is not a multiple of {sy, sx}"
            )
        idx = idx.reshape(b, h // sy, sy, w // sx, sx).transpose(0, 2, 4, 1, 3).reshape(b * sy * sx, h // sy, w // sx)
    out = idx.reshape(-1)
    out.setflags(write=False)
    return out


def _key_strides(g: Geometry) -> tuple[tuple[int, int], ...]:
    """The strides a Hiera block's keys are unrolled by: one more than its queries' where it pools them."""
    return (tuple(g.key_stride), *g.unroll) if g.key_rule == "finer" else g.unroll


def _unit_slots(order: np.ndarray, grid: tuple[int, int], side: int, windows: int) -> tuple[np.ndarray, np.ndarray]:
    """(native window of each raw window ``(nW,)``, raw slot of each native window slot ``(nW, side^2)``).

    Raw position t of a sequence in ``order`` is slot ``t // nW`` of window ``t % nW`` (how
    ``HieraMaskUnitAttention`` cuts it); native window n is the n-th ``side x side`` block of
    ``grid`` (row-major), native slot i its i-th cell (row-major). Raises ValueError where a
    raw window is not one such block.
    """
    gh, gw = grid
    if gh % side or gw % side or (gh // side) * (gw // side) != windows or order.size != windows * side * side:
        raise ValueError(f"{windows} windows of {side} x {side} tokens do not tile a {gh} x {gw} grid")
    rows, cols = np.divmod(order, gw)
    native_window = (rows // side) * (gw // side) + cols // side
    native_slot = (rows % side) * side + cols % side
    t = np.arange(order.size)
    raw_window, raw_slot = t % windows, t // windows
    of_raw = np.full(windows, -1)
    of_raw[raw_window] = native_window  # the last write wins: checked below
    if not (of_raw[raw_window] == native_window).all() or not (np.sort(of_raw) == np.arange(windows)).all():
        raise ValueError(f"a raw window of this block mixes tokens of several {side} x {side} blocks of the grid")
    slots = np.empty((windows, side * side), dtype=np.int64)
    slots[native_window, native_slot] = raw_slot
    return of_raw, slots


@lru_cache(maxsize=256)
def reroll_index(g: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each native entry of a Hiera block sits in its raw ``(B, H, nW, Tq, Tk)`` probabilities.

    Returns ``(window, query, key)``: the raw window ``(nW,)`` of each native window (``(1,)`` for
    global attention), and the raw slot of each native query slot ``(Tq_w,)`` and key slot
    ``(Tk_w,)`` (global: every token of the grid, row-major), the same in every window: the slots
    are the unrolled offsets inside a mask unit. Raises ValueError where the block's unrolled order
    does not cut the grid into the windows ``g`` describes, or orders the windows' slots differently.
    """
    if g.unroll is None:
        raise ValueError("only a block with an unrolled token order (Hiera) has a reroll index")
    q_order = unrolled_order(g.grid, g.unroll)
    k_order = unrolled_order(g.keys, _key_strides(g))
    if g.kind == "global":
        if g.num_prefix or g.trailing:
            raise ValueError("Hiera's global attention has no prefix or padding tokens")
        return np.zeros(1, dtype=np.int64), np.argsort(q_order), np.argsort(k_order)
    if g.kind != "window" or g.shift or tuple(g.padded) != tuple(g.grid):
        raise ValueError(f"an unrolled block is global or in windows without shift or padding, not {g.kind}")
    n = g.num_windows
    q_of_raw, q_slots = _unit_slots(q_order, g.grid, g.window, n)
    k_of_raw, k_slots = _unit_slots(k_order, g.keys, g.key_window, n)
    if not (q_of_raw == k_of_raw).all():
        raise ValueError("a raw window's queries and keys lie in different blocks of the grid")
    if not ((q_slots == q_slots[:1]).all() and (k_slots == k_slots[:1]).all()):
        raise ValueError("the windows order their tokens differently")
    return np.argsort(q_of_raw), q_slots[0], k_slots[0]  # the raw window of each native window


@lru_cache(maxsize=256)
def _reroll_tensors(g: Geometry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`reroll_index` as CPU index tensors (cached; never written)."""
    with torch.inference_mode(False):  # made in a capture's inference mode, used in a Run's graph too
        return tuple(torch.from_numpy(a.copy()) for a in reroll_index(g))


def _rerolled(g: Geometry, raw: torch.Tensor, batch: int) -> torch.Tensor:
    """Hiera's ``(B, H, nW, Tq, Tk)`` in unrolled order -> the native form in row-major order.

    Three ``index_select`` calls (windows, query slots, key slots): measured faster on the CPU than
    one gather of the flattened (query, key) pairs or advanced indexing.
    """
    w, q, k = (t.to(raw.device) for t in _reroll_tensors(g))
    x = raw.reshape(batch, g.num_heads, len(w), len(q), len(k))
    out = x.index_select(2, w).index_select(3, q).index_select(4, k)
    if g.kind == "global":
        return out.reshape(batch, *g.native_shape())
    return out.transpose(1, 2)  # (B, nW, H, Tq, Tk)


def centre_parents(prev: tuple[int, int], cur: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Merge rule "a token is inside a cell when its centre is": the cell of ``cur`` holding each ``prev`` row/col."""

    def axis(n: int, k: int) -> np.ndarray:
        return np.minimum(((np.arange(n) + 0.5) * k / n).astype(int), k - 1)

    return axis(prev[0], cur[0]), axis(prev[1], cur[1])


class Family:
    """Base adapter. Subclasses set ``name`` and ``model_types`` and answer the questions below."""

    name = "?"
    model_types: tuple[str, ...] = ()
    hierarchical = False  # several stages or non-global attention
    sampled_keys = False  # some blocks attend over points they sample (DAT's deformable blocks: a view draws them)
    interpolate_kwarg = False  # the forward takes ``interpolate_pos_encoding``

    # --- loading ---------------------------------------------------------------------
    def patch_size(self, config) -> int:
        """Pixels per token of the first stage (the patch-embedding stride)."""
        p = config.patch_size
        return int(p[0] if isinstance(p, (tuple, list)) else p)

    def size_multiple(self, config) -> int:
        """Input sides are snapped to multiples of this."""
        return self.patch_size(config)

    def default_size(self, config, processor_size: tuple[int, int]) -> tuple[int, int]:
        """The input size used when none is asked for: the image processor's, unless the family knows better."""
        return processor_size

    def fixed_size(self, config) -> tuple[int, int] | None:
        """The only input size the model runs at, when it has one (PvT v1)."""
        return None

    def size_problem(self, config, hw: tuple[int, int]) -> str:
        """Why the model cannot run at input size ``hw`` ("" when it can); checked before any forward."""
        return ""

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray | None:
        """The first convolution's weight ``(D, C, k, k)`` float32 (the patch-embedding filters)."""
        return None

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        return PositionInfo(note=f"{self.name} has no position embeddings vitviz can show.")

    def prefix_kinds(self, config) -> tuple[str, ...]:
        """Prefix tokens of the first stage."""
        return ()

    def readout(self, config) -> Literal["cls", "pooled", "head"]:
        """What the prediction reads: the last stage's CLS token, an attention-pooling head, or the grid's mean."""
        return "pooled"

    def block_note(self, config, stage: int, num_stages: int) -> str:
        """What a view of a block of ``stage`` should say about the attention it shows ("": nothing special)."""
        return ""

    def rollout_note(self, config) -> str:
        """Why rollout and relevance are undefined for this family ("" when they are defined)."""
        return ""

    def token_note(self, config) -> str:
        """How the first stage's tokens are made, where they are not the ViT paper's pixel patches ("" otherwise)."""
        return ""

    def feature_map_note(self, config) -> str:
        """Why the model has no CNN feature map under its tokens ("" when it has one: a hybrid ViT's ResNet)."""
        return f"{self.name} has no CNN feature map under its tokens (only a hybrid ViT's ResNet makes one)"

    def forward_with_feature_map(self, model: torch.nn.Module, inputs: dict) -> tuple[Any, torch.Tensor]:
        """The forward's output and the CNN feature map ``(B, C, h', w')`` its tokens are cells of, in the forward's
        graph (families whose :meth:`feature_map_note` is "")."""
        raise NotImplementedError(self.feature_map_note(None))

    # --- capture ---------------------------------------------------------------------
    def sites(self, model: torch.nn.Module) -> list[Site]:
        raise NotImplementedError

    def forward_kwargs(self, config, hw: tuple[int, int]) -> dict:
        return {"interpolate_pos_encoding": True} if self.interpolate_kwarg else {}

    def size_for_image(self, config, hw: tuple[int, int], image_wh: tuple[int, int] | None) -> tuple[int, int]:
        """The input size for one image, given the size chosen for it (SigLIP 2 NaFlex follows the image's aspect)."""
        return hw

    def model_inputs(self, loaded, pixels: torch.Tensor, hw: tuple[int, int]) -> dict:
        """Keyword arguments of the forward for normalised pixels ``(B, 3, h, w)`` (NaFlex patchifies; MAE orders)."""
        return {"pixel_values": pixels, **self.forward_kwargs(loaded.config, hw)}

    def forward(self, model: torch.nn.Module, inputs: dict):
        """Run the image through the model (the image tower of a two-tower model)."""
        return model(**inputs)

    def logits(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        """Class logits ``(B, C)`` of the forward's output, or None for backbones."""
        return getattr(out, "logits", None)

    def image_embedding(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        """The image embedding ``(B, D)`` a zero-shot model compares with label embeddings, or None."""
        return None

    def running(self, model: torch.nn.Module):
        """Context around every forward (Swin v1: restore window and shift, one forward at a time)."""
        return nullcontext()

    def probs(self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any):
        """The attention probabilities the site computed: the very tensor the forward goes on with."""
        return output[1]

    def geometry(
        self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any, raw: torch.Tensor
    ) -> Geometry:
        """How the block attended, read from the block as it ran (``module`` is the site's block module)."""
        raise NotImplementedError

    def tokens(self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any):
        """The block's input and output tokens ``(B, T, C)`` in the stage's order (prefix, then the grid)."""
        out = output[0] if isinstance(output, (tuple, list)) else output
        inp = args[0] if args else kwargs["hidden_states"]
        return inp, out

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray] | None:
        """How the previous stage's grid merges into ``cur``'s (None: no token-to-token path crosses)."""
        return centre_parents(prev.grid, cur.grid)

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        """Attention values one image's capture holds (for the memory budget)."""
        raise NotImplementedError

    # --- what a block has (declared; the engine never guesses a module name) ----------------------
    layout = BlockLayout()  # where each block's parts sit (see BlockLayout); families declare theirs

    def head_projection(self, site: Site) -> torch.nn.Linear | None:
        """The block's attention output projection: a Linear whose input is the heads' outputs side by side.

        Its input ``(..., H * d)`` holds head h in columns ``h*d .. (h+1)*d - 1`` (every
        supported family concatenates heads in head-major order). The first of the layout's
        ``projection`` paths that is a Linear under the block; None where there is none
        (MobileViT V2's projection is a convolution and it has one "head"): knock-outs are then
        not defined.
        """
        return _first(site.block, self.layout.projection, torch.nn.Linear)[0]

    def mlp_output(self, site: Site) -> torch.nn.Linear | None:
        """The last Linear of the block's MLP (the layout's ``mlp_output``), or None."""
        return _first(site.block, self.layout.mlp_output, torch.nn.Linear)[0]

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """The final norm and classifier as a :class:`ReadoutHead`, or None where the adapter defines none."""
        return None

    def block_parts(self, site: Site) -> BlockParts:
        """What block ``site`` has, resolved from the family's :attr:`layout` (see :class:`BlockParts`).

        A declared MLP or layer scale the block lacks, or no MLP declared at all, makes the block
        ``unknown``: direct logit attribution refuses, naming it.
        """
        lay, block = self.layout, site.block
        proj = self.head_projection(site)
        mlp = _first(block, lay.mlp)[0]
        q, k, v = (_first(block, paths, torch.nn.Module) for paths in (lay.q, lay.k, lay.v))
        pattern: torch.nn.Module | str | None = None
        caller = None
        if lay.pattern == (FUNCTION,):
            caller = _first(block, lay.caller)[0] if lay.caller else site.attention
            pattern = FUNCTION if caller is not None else None
        elif lay.pattern:
            pattern = _first(block, lay.pattern)[0]
        missing = []
        if not lay.mlp:
            unknown = f"the {self.name} adapter does not declare where a block's MLP output and layer scales sit"
        elif not all(lay.norms):  # post-norm blocks (Swin V2): the residual stream is not a sum of branch updates
            unknown = f"the {self.name} adapter declares no pre-norms: its blocks normalise after each branch"
        else:
            missing = [p for p, found in (("/".join(lay.projection), proj), ("/".join(lay.mlp), mlp)) if found is None]
            unknown = ""
        scales: list = [None, None]
        if lay.mlp and lay.layer_scales is not None:  # a declared scale may be None or 1.0 (off), but must exist
            scales = [declared(block, p, ABSENT) for p in lay.layer_scales]
            missing += [p for p, found in zip(lay.layer_scales, scales, strict=True) if found is ABSENT]
            scales = [None if found is ABSENT else found for found in scales]
        norms = tuple(_first(block, paths)[0] for paths in lay.norms)
        if lay.mlp and all(lay.norms):
            missing += ["/".join(paths) for paths, n in zip(lay.norms, norms, strict=True) if n is None]
        if missing:
            unknown = (
                f"the {self.name} adapter declares {', '.join(missing)} in each layer, and this "
                f"{type(block).__name__} has no such part, so vitviz cannot tell where its "
                f"{'layer scales' if set(missing) & set(lay.layer_scales or ()) else 'parts'} sit"
            )
        return BlockParts(
            projection=proj,
            mlp=mlp,
            attn_scale=scales[0],
            mlp_scale=scales[1],
            norms=norms,
            unknown=unknown,
            q=q if q[0] is not None else None,
            k=k if k[0] is not None else None,
            v=v if v[0] is not None else None,
            pattern=pattern,
            caller=caller,
            branch=_first(block, lay.branch)[0],
            mlp_linear=self.mlp_output(site),
        )
