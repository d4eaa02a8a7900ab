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
    """The site's probabilities (as the model computed them) -> ``(B, *native shape)`` (a view).

    Raw layouts: global ``(B, H, Tq, Tk)``; window ``(B * nW, H, w*w, w*w)``; unfolded
    ``(B * A, H, N, N)``; separable ``(B, 1, A, N)``; pool ``(B, H, 1, Tk)`` (any layout
    with the same order).
    """
    native = raw.reshape(batch, *g.native_shape())
    return native


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

    def rollout_note(self, config) -> str:
        """Why rollout and relevance are undefined for this family ("" when they are defined)."""
        return ""

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
