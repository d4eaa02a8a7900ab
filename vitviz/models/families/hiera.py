"""Hiera (Ryali et al. 2023, "Hiera: A Hierarchical Vision Transformer without the Bells-and-Whistles"; the image
encoder of SAM 2), as ``transformers`` 5.24 builds it (``hiera``: ``HieraModel``, ``HieraForImageClassification``).

**Tokens.** A convolution (``patch_size`` 7, ``patch_stride`` 4, ``patch_padding`` 3 in the
released models: overlapping 7 x 7 px receptive fields) gives one token per 4 x 4 px cell
of the input, row-major; an absolute position table on the configured grid
(``image_size / patch_stride``, resized bicubically for other inputs) is added; there is
no CLS token. Then Hiera *unrolls* the sequence (``modeling_hiera.unroll``): for each
stride of its schedule (``[query_stride] * (stages - 1)``, (2, 2) each) it cuts the grid
into 2 x 2 cells and moves the offset inside the cell in front of the coarser grid.
After the three unrolls of a 4-stage model, position t of the sequence reads (offset in
the 2 x 2 cells, offset in the 4 x 4 cells, offset in the 8 x 8 cells, row and column of
the 8 x 8 cells), and the model keeps its tokens in that order to the end.

**Attention** (``HieraMaskUnitAttention``, every block; eager only). In a *mask-unit*
block the sequence is cut into windows of consecutive unrolled positions: each is one
mask unit, a u x u block of the stage grid (8 x 8 tokens = 32 x 32 px in stage 1, 4 x 4
tokens in stage 2 of the released models), and a query attends to the keys of its unit
only: vitviz records windows with no shift and no padding (``window``). Where
``masked_unit_attention`` is off (stages 3 and 4 of the released models) the block
attends globally (``global``); the first block after a mask-unit stage still attends in
mask units ("lag by 1 layer" in ``HieraStage``).

**Query pooling.** The first block of stages 2 .. ``num_query_pool`` + 1 pools: its queries
are the maximum over the 2 x 2 children of each new cell (the leading quarter-blocks of
the unrolled sequence) of the projected queries, and its residual is the maximum over
the same children of ``proj(layernorm_before(x))`` at the new width; its keys and values
are the previous stage's tokens. vitviz puts that block in the new stage (its queries
and its output live on the new grid) with its keys on the previous stage's grid, twice
as fine (key rule ``finer``), globally or in windows whose keys are the previous stage's
unit. Each new token is made of the 2 x 2 tokens inside its cell: stages merge by the
rule every hierarchical family follows (a new token's row of rollout is the mean of its
children's rows). The dense view of a pooling block puts each key's weight on the new
token whose cell holds the key, so rollout and relevance see where a pooled query looks
to the new cell, not to the key inside it; its query maps show every key.

Everything the record holds is in row-major grid order: the probabilities are gathered
out of the unrolled order (``base.to_native``, with ``Geometry.unroll``: the strides still
unrolled) and so are the tokens (:meth:`Hiera.tokens`), from the model's own schedule
(``HieraModel.unroll_schedule``) and the blocks as they ran; the tests check the order
against ``transformers``' ``unroll`` and ``reroll``. A stage that starts with a pooling
block has, as its row 0 of token norms, the pooled residual its first block adds its
attention to. The named points (``stages.{s}.blocks.{j}.in``, ``.out``, ``.attn.z``, ...)
are the model's own tensors, in its unrolled order: an edit that selects ``tokens``
selects unrolled positions (``base.unrolled_order`` says where each lies).

The classifier reads the mean of the last stage's tokens, then the pooler's LayerNorm
(``readout`` ``pooled``; the mean comes before the norm). ``HieraForPreTraining`` (MAE)
drops 60 % of the mask units at random on every forward and is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import numpy as np
import torch

from vitviz.errors import CaptureError
from vitviz.models.families.base import BlockLayout, BlockParts, Call, Family, ReadoutHead, reroll_index, unrolled_order
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, PositionTable

__all__ = ["Hiera", "FAMILIES", "TOKEN_NOTE"]

Strides = tuple[tuple[int, int], ...]

TOKEN_NOTE = (
    "Hiera's tokens: one per {p} x {p} px cell (a convolution with a {k} x {k} px kernel, so neighbouring tokens "
    "overlap), no CLS token. The model keeps them unrolled (the offsets inside 2 x 2 cells first), which vitviz undoes "
    "so that every map lands on the image. Stages 1-2 attend within mask units ({u} x {u} tokens of stage 1), later "
    "stages globally; the first block of each later stage max-pools 2 x 2 tokens into one (its queries and its "
    "residual) and attends to the previous stage's tokens."
)


@dataclass(frozen=True)
class _Layer:
    """What vitviz reads about one ``HieraLayer`` beside its modules: the strides its input is unrolled by, the
    query stride it pools by (None: it does not pool), and how many first-stage tokens per axis one of its input
    tokens covers (the strides pooled before it)."""

    strides: Strides  # of its input tokens (and keys)
    pools: tuple[int, int] | None
    scale: tuple[int, int]

    @property
    def out_strides(self) -> Strides:
        """Strides of its queries and output: one fewer where it pools."""
        return self.strides[1:] if self.pools else self.strides


def _pair(v) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _square(config, name: str) -> int:
    a, b = _pair(getattr(config, name))
    if a != b:
        raise ValueError(f"vitviz draws Hiera with square {name} only, got {a} x {b}")
    return a


def _grid_at(config, hw: tuple[int, int]) -> tuple[int, int]:
    """The first stage's grid at input ``hw``: ``hw // patch_stride``, the size Hiera's unroll assumes."""
    sy, sx = _pair(config.patch_stride)
    return hw[0] // sy, hw[1] // sx


@lru_cache(maxsize=128)
def _raster_positions(grid: tuple[int, int], strides: Strides) -> torch.Tensor:
    """``(gh * gw,)`` the unrolled position of each grid token, row-major (a CPU tensor, cached; never written)."""
    with torch.inference_mode(False):  # made in a capture's inference mode, used in a Run's graph too
        return torch.from_numpy(np.argsort(unrolled_order(grid, strides)))


class Hiera(Family):
    """Hiera (facebook/hiera-*-hf): mask units, then global attention; 2 x 2 query pooling between stages."""

    name = "Hiera"
    model_types = ("hiera",)
    hierarchical = True
    interpolate_kwarg = True
    # q, k, v are thirds of one Linear (its columns: [3, heads, head_dim]); the probabilities pass through no module
    # (record-only pattern). The points hold the model's own unrolled token order.
    layout = BlockLayout(
        projection=("attn.proj",),
        q=("attn.qkv#0/3",),
        k=("attn.qkv#1/3",),
        v=("attn.qkv#2/3",),
        mlp=("mlp",),
        mlp_output=("mlp.fc2",),
        norms=(("layernorm_before",), ("layernorm_after",)),
    )

    # --- loading ---------------------------------------------------------------------------------
    def patch_size(self, config) -> int:
        """Pixels per first-stage token: the patch convolution's stride (``patch_size`` is its kernel)."""
        return _square(config, "patch_stride")

    def size_multiple(self, config) -> int:
        """Pixels per mask unit of stage 1 and per cell of the last stage's grid, whichever is larger (32 px for
        the released models): every unroll, window and pooling then divides the grid."""
        q = _square(config, "query_stride")
        unit = _square(config, "masked_unit_size")
        return self.patch_size(config) * math.lcm(unit, q ** (len(config.depths) - 1))

    def size_problem(self, config, hw: tuple[int, int]) -> str:
        m = self.size_multiple(config)
        if hw[0] % m or hw[1] % m:
            return f"Hiera needs input sides that are multiples of {m} px; {hw[1]} x {hw[0]} px is not."
        return ""

    def readout(self, config) -> Literal["cls", "pooled"]:
        return "pooled"

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        return model.base_model.embeddings.patch_embeddings.projection.weight.detach().float().cpu().numpy()

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        """The absolute table on the configured grid (``image_size / patch_stride``), row-major: it is added before
        the unrolling."""
        config = model.config
        grid = _grid_at(config, _pair(config.image_size))
        table = model.base_model.embeddings.position_embeddings.detach().float().cpu()
        rows = table.reshape(-1, table.shape[-1]).numpy().copy()
        if rows.shape[0] != grid[0] * grid[1]:
            raise ValueError(f"{rows.shape[0]} position embeddings do not fill the {grid[0]} x {grid[1]} grid")
        return PositionInfo(tables=(PositionTable("patches", rows, grid),))

    def token_note(self, config) -> str:
        return TOKEN_NOTE.format(
            p=self.patch_size(config), k=_square(config, "patch_size"), u=_square(config, "masked_unit_size")
        )

    # --- capture ---------------------------------------------------------------------------------
    def sites(self, model: torch.nn.Module) -> list[Site]:
        """One site per ``HieraLayer``: its attention module returns the probabilities (``output_attentions``)."""
        base = model.base_model
        if getattr(base.embeddings, "is_mae", False):
            raise ValueError(
                "Hiera's MAE pre-training model (HieraForPreTraining) drops 60 % of its mask units at random on "
                "every forward; load a classifier (e.g. facebook/hiera-base-224-in1k-hf) or the encoder (HieraModel)"
            )
        for name in ("patch_stride", "query_stride", "masked_unit_size"):
            _square(model.config, name)
        strides: Strides = tuple(_pair(s) for s in base.unroll_schedule)  # the model's own schedule
        unit, kept = _square(model.config, "masked_unit_size"), math.prod(s[0] for s in strides)
        if any(model.config.masked_unit_attention) and unit != kept:
            # The windows are runs of consecutive unrolled positions: aligned blocks only when the unrolling keeps a
            # whole mask unit together; else transformers attends among scattered tokens.
            raise ValueError(
                f"its mask units ({unit} x {unit} tokens) are not the blocks its unrolling keeps together "
                f"({kept} x {kept}): vitviz draws mask units that are blocks of the grid"
            )
        scale = (1, 1)
        sites: list[Site] = []
        for s, stage in enumerate(base.encoder.stages):
            for layer in stage.layers:
                q = int(layer.attn.query_stride)
                pools = None
                if q > 1:
                    if not strides or math.prod(strides[0]) != q or int(layer.query_stride) != q:
                        raise ValueError(
                            f"stage {s} pools its queries by {q} where the tokens are unrolled by {strides}"
                        )
                    pools = strides[0]
                info = _Layer(strides, pools, scale)
                sites.append(Site(len(sites), s, layer.attn, layer, info))
                strides = info.out_strides
                if pools:
                    scale = (scale[0] * pools[0], scale[1] * pools[1])
        if sites and sites[-1].extra.pools:
            # Grad-CAM reads the last block's input tokens, which a pooling block does not keep on its own grid.
            raise ValueError("the last block of this Hiera pools its queries; vitviz needs a block after it")
        return sites

    def forward_kwargs(self, config, hw: tuple[int, int]) -> dict:
        # The attention module returns its probabilities only when asked: the very tensor it multiplies the values by.
        return {"interpolate_pos_encoding": True, "output_attentions": True}

    def probs(self, call: Call, site: Site, module, args, kwargs, output):
        return output[1]  # (B, H, nW, Tq, Tk) in the unrolled order

    def _input_grid(self, call: Call, site: Site) -> tuple[int, int]:
        """The grid of the block's input tokens: the first stage's, divided by every stride pooled before it."""
        gh, gw = _grid_at(call.config, call.input_size)
        sy, sx = site.extra.scale
        return gh // sy, gw // sx

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        info: _Layer = site.extra
        x = args[0] if args else kwargs["hidden_states"]
        grid_in = self._input_grid(call, site)
        if x.shape[1] != grid_in[0] * grid_in[1] or raw.dim() != 5:
            raise CaptureError(
                f"Hiera block {site.index}: {x.shape[1]} tokens and probabilities of shape {tuple(raw.shape)} do not "
                f"fit its {grid_in[0]} x {grid_in[1]} grid; the Hiera adapter is wrong for this model"
            )
        tq = int(raw.shape[3])  # queries per window
        grid = self._output_grid(call, site)
        finer = {"key_grid": grid_in, "key_rule": "finer", "key_stride": info.pools} if info.pools else {}
        common = dict(stage=site.stage, num_heads=int(raw.shape[1]), grid=grid, unroll=info.out_strides, **finer)
        if module.attn.use_mask_unit_attn:  # windows of consecutive unrolled positions: the mask units
            g = Geometry(kind="window", window=math.isqrt(tq), padded=grid, **common)
            expected = (g.num_windows, g.window**2, g.key_window**2)
        else:
            g = Geometry(kind="global", **common)
            expected = (1, *g.native_shape()[1:])
        try:
            if tuple(raw.shape[2:]) != expected:
                raise ValueError(f"expected {expected[0]} windows of {expected[1]} queries and {expected[2]} keys")
            reroll_index(g)  # the unrolled order cuts the grid into these windows, or the record would be wrong
        except ValueError as exc:
            raise CaptureError(
                f"Hiera block {site.index}: probabilities of shape {tuple(raw.shape)} on a {grid[0]} x {grid[1]} "
                f"grid: {exc}; the Hiera adapter is wrong for this model"
            ) from None
        return g

    def tokens(self, call, site, module, args, kwargs, output):
        """The block's input and output tokens ``(B, N, C)`` in row-major grid order.

        A pooling block's input is the previous stage's grid; what it adds its attention to is the
        pooled residual ``max over 2 x 2 children of proj(layernorm_before(x))`` on the new grid: that
        is returned as its input (the residual entering the new stage).
        """
        info: _Layer = site.extra
        x = args[0] if args else kwargs["hidden_states"]
        out = output[0]
        key = ("hiera_tokens", site.index)  # several recorders ask in one forward: gathered once
        kept = call.scratch.get(key)
        if kept is not None and kept[0] is x and kept[1] is out:
            return kept[2]
        if info.pools:
            x_in = self._pooled_residual(call, site, module, x)
        else:
            x_in = x
        order = _raster_positions(self._output_grid(call, site), info.out_strides).to(out.device)
        got = x_in.index_select(1, order), out.index_select(1, order)
        call.scratch[key] = (x, out, got)
        return got

    def _output_grid(self, call: Call, site: Site) -> tuple[int, int]:
        gh, gw = self._input_grid(call, site)
        p = site.extra.pools or (1, 1)
        return gh // p[0], gw // p[1]

    @staticmethod
    def _pooled_residual(call: Call, site: Site, layer, x: torch.Tensor) -> torch.Tensor:
        """What ``HieraLayer.forward`` adds the attention to, in unrolled order."""
        with torch.no_grad():
            y = layer.proj(layer.layernorm_before(x))
            return y.view(x.shape[0], int(layer.query_stride), -1, y.shape[-1]).max(dim=1).values

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray]:
        """Query pooling: each new token is the maximum over the 2 x 2 tokens inside its cell."""
        fy, fx = prev.grid[0] // cur.grid[0], prev.grid[1] // cur.grid[1]
        if (cur.grid[0] * fy, cur.grid[1] * fx) != prev.grid:
            raise CaptureError(f"Hiera stage grids {prev.grid} -> {cur.grid} do not halve")
        return np.arange(prev.grid[0]) // fy, np.arange(prev.grid[1]) // fx

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        """Attention values of one image: per block, heads x windows x queries x keys of a window, as
        ``HieraEncoder`` and ``HieraMaskUnitAttention`` lay them out (pooling blocks, the mask-unit lag)."""
        gh, gw = _grid_at(config, hw)
        n = gh * gw
        depths = list(config.depths)
        q_area = math.prod(_pair(config.query_stride))
        unit_area = math.prod(_pair(config.masked_unit_size))
        pooling = set(np.cumsum(depths)[: config.num_query_pool].tolist())
        mu = list(config.masked_unit_attention)
        total, layer = 0, 0
        for s, depth in enumerate(depths):
            window = int(unit_area * q_area**-s)
            lagged = mu[s - 1 if s > 0 else 0]
            for i in range(depth):
                q = q_area if layer in pooling else 1
                windows = n // (q * window) if (mu[s] or (lagged and i == 0)) else 1
                keys = n // windows
                total += config.num_heads[s] * windows * (keys // q) * keys
                n //= q
                layer += 1
        return total

    # --- what a block has --------------------------------------------------------------------------
    def block_parts(self, site: Site) -> BlockParts:
        """The layout's parts; the first block of a widening stage is ``unknown`` (no identity path)."""
        parts = super().block_parts(site)
        layer = site.block
        if layer.hidden_size != layer.hidden_size_output:
            return replace(
                parts,
                unknown="the first block of this Hiera stage replaces its residual by a projection of its normalised "
                "input (max-pooled over 2 x 2 tokens where it pools): no identity path carries the stream through it",
            )
        return parts

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """``classifier(layernorm(mean over tokens of x))``: ``HieraPooler`` averages the last stage, then norms."""
        classifier = getattr(model, "classifier", None)
        pooler = getattr(model.base_model, "pooler", None)
        norm = getattr(pooler, "layernorm", None)
        if not isinstance(classifier, torch.nn.Linear) or not isinstance(norm, torch.nn.LayerNorm):
            return None
        return ReadoutHead(
            select=lambda x: x.mean(dim=1, keepdim=True),
            norm=norm,
            head=lambda z: classifier(z[:, 0]),
            description="the mean of the last-stage tokens, the pooler's LayerNorm, then the classifier",
        )


FAMILIES = (Hiera(),)
