"""Pyramid Vision Transformers: PvT (``pvt``) and PvT v2 (``pvt_v2``), as ``transformers`` 5.23 builds them.

Both are hierarchical: S stages, each a strided (PvT) or overlapping (PvT v2)
patch-embedding convolution followed by blocks of global attention whose keys and
values live on a coarser grid (``docs/definitions.md#reduced-keys``):

* **spatial reduction** by ratio R: a convolution with kernel = stride = R and no
  padding turns the stage grid (gh, gw) into keys on ``(gh // R, gw // R)``; key
  (i, j) came from the R x R block of tokens starting at (i R, j R) (``key_rule``
  ``strided``; where R does not divide the grid, the conv never sees the last rows
  and columns, and the record assigns them to the last key);
* **linear** attention (PvT v2 with ``linear_attention``): ``AdaptiveAvgPool2d(7)``
  pools the grid to 7 x 7 keys whatever the input (``key_rule`` ``centre``: a token
  belongs to the key cell that contains its centre);
* R = 1: keys are the stage tokens themselves.

The query map of a block is a query's row on the key grid as it is; the dense view
(rollout, relevance) spreads each key's weight evenly over the stage tokens of its
cell. Attention probabilities are read from the ``nn.Dropout`` module the model
applies to them (identity in eval mode): its output is the very tensor multiplied
with the values, so gradients reach it. Stage grids and key grids are read from the
block as it ran (its ``height``/``width`` arguments and the probabilities' shape)
and checked against the reduction module.

PvT v1 appends a CLS token in its last stage only (queries and keys, with a
position row of its own) and classifies from it; it has absolute position
embeddings per stage that it cannot resize (``docs/definitions.md#trap-pvt-v1-size``: its
interpolation reshapes the native table to the new grid and fails), so **every
PvT v1 input is resized to the configured ``image_size``** whatever size is asked
for (:meth:`Pvt.fixed_size`). PvT v2 has no CLS token and no position table,
mean-pools its last stage and runs at any size.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import nn

from vitviz.models.families.base import BlockLayout, Call, Family, centre_parents
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, PositionTable

__all__ = ["Pvt", "PvtV2", "FAMILIES"]

_LINEAR_KEYS = 7 * 7  # transformers hard-codes AdaptiveAvgPool2d(7) for PvT v2 linear attention
_V2_POSITION_NOTE = (
    "PvT v2 has no position-embedding table: it encodes position through convolutions, the zero-padded "
    "3 x 3 depth-wise convolution inside every block's feed-forward network and the overlapping patch "
    "embeddings, so there is no table to compare."
)


def _pair(v) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _conv_out(n: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a convolution along one axis (PyTorch's floor rule)."""
    return (n + 2 * padding - kernel) // stride + 1


def _block_hw(args: tuple, kwargs: dict) -> tuple[int, int]:
    """``height``, ``width`` a PvT / PvT v2 layer was called with (its stage grid as it ran)."""
    h = args[1] if len(args) > 1 else kwargs["height"]
    w = args[2] if len(args) > 2 else kwargs["width"]
    return int(h), int(w)


def _reduced_keys(attn: nn.Module, grid: tuple[int, int], linear: bool) -> tuple[tuple[int, int] | None, str, int]:
    """(key grid or None for no reduction, key rule, stride R) of one self-attention module on ``grid``.

    Read from the module's own reduction path, not from the config: the pooling
    size of linear attention, or the reduction convolution's kernel and stride.
    """
    if linear:
        pool = getattr(attn, "pool", None)
        if not isinstance(pool, nn.AdaptiveAvgPool2d):
            raise RuntimeError(f"expected an AdaptiveAvgPool2d in linear attention, found {type(pool).__name__}")
        size = _pair(pool.output_size)
        # The 1 x 1 conv after the pool keeps its grid; anything else would move the key cells.
        conv = attn.spatial_reduction
        if _pair(conv.kernel_size) != (1, 1) or _pair(conv.stride) != (1, 1):
            raise RuntimeError("linear attention's projection after the pool is not a 1 x 1 convolution")
        return size, "centre", 1
    conv = getattr(attn, "spatial_reduction", None)  # PvT v2
    if conv is None:
        conv = getattr(attn, "sequence_reduction", None)  # PvT v1
    if conv is None:
        return None, "same", 1
    k, s, p = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.padding)
    if k != s or p != (0, 0) or k[0] != k[1]:
        # The strided rule (key j = tokens j R .. j R + R - 1) holds only for kernel = stride, no padding.
        raise RuntimeError(f"spatial reduction with kernel {k}, stride {s}, padding {p} is not a plain R x R pooling")
    keys = (_conv_out(grid[0], k[0], s[0], 0), _conv_out(grid[1], k[1], s[1], 0))
    return keys, "strided", k[0]


def _stage_geometry(
    site: Site, args: tuple, kwargs: dict, raw: torch.Tensor, *, linear: bool, cls_allowed: bool
) -> Geometry:
    """Geometry of one PvT / PvT v2 block from its call arguments and its probabilities ``(B, H, Tq, Tk)``."""
    if raw.dim() != 4:
        raise RuntimeError(f"expected attention probabilities (B, H, Tq, Tk), got shape {tuple(raw.shape)}")
    grid = _block_hw(args, kwargs)
    n = grid[0] * grid[1]
    tq, tk = int(raw.shape[-2]), int(raw.shape[-1])
    prefix = tq - n
    if prefix not in ((0, 1) if cls_allowed else (0,)):
        raise RuntimeError(f"{tq} queries do not fit a {grid[0]} x {grid[1]} stage grid")
    kinds = ("CLS",) * prefix
    key_grid, rule, stride = _reduced_keys(site.extra, grid, linear)
    expected = n if key_grid is None else key_grid[0] * key_grid[1]
    if tk != prefix + expected:
        raise RuntimeError(
            f"stage {site.stage} block {site.index}: {tk} keys, expected {prefix} prefix + {expected} "
            f"({'no reduction' if key_grid is None else f'{key_grid[0]} x {key_grid[1]}'})"
        )
    return Geometry(
        stage=site.stage,
        kind="global",
        num_heads=int(raw.shape[1]),
        grid=grid,
        prefix_kinds=kinds,
        key_grid=key_grid,
        key_rule=rule,
        key_stride=(stride, stride),
    )


def _check_dropout(module: nn.Module, where: str) -> nn.Module:
    if not isinstance(module, nn.Dropout):
        raise RuntimeError(f"expected the attention-probability dropout at {where}, found {type(module).__name__}")
    return module


class _Pyramid(Family):
    """What PvT and PvT v2 share: hooks on the probability dropout, reduced keys, stage grids from the block."""

    hierarchical = True

    def _embed_conv(self, config, stage: int) -> tuple[int, int, int]:
        """(kernel, stride, padding) of stage ``stage``'s patch-embedding convolution, from the config."""
        raise NotImplementedError

    def _stage_grids(self, config, hw: tuple[int, int]) -> list[tuple[int, int]]:
        grids, (h, w) = [], hw
        for s in range(config.num_encoder_blocks):
            k, st, p = self._embed_conv(config, s)
            h, w = _conv_out(h, k, st, p), _conv_out(w, k, st, p)
            grids.append((h, w))
        return grids

    def _reduction(self, config, stage: int) -> int:
        raise NotImplementedError

    def patch_size(self, config) -> int:
        """Pixels per first-stage token: the first patch-embedding convolution's stride."""
        return self._embed_conv(config, 0)[1]

    def size_multiple(self, config) -> int:
        """The total stride of the patch embeddings (32 for released models), so that every stage grid is exact."""
        return math.prod(self._embed_conv(config, s)[1] for s in range(config.num_encoder_blocks))

    def rollout_note(self, config) -> str:
        return ""

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray]:
        """The centre rule: a stage-s token merges into the stage-(s + 1) cell that contains its centre.

        PvT v1's embedding conv (kernel = stride = s, no padding) builds new token j
        from old tokens ``j s .. j s + s - 1``: exactly the centre rule wherever s
        divides the grid, as it does at every configured size of the released
        models. PvT v2's overlapping conv (odd kernel k, padding k // 2) is centred on
        old token ``j s``, half an old token before the new cell's centre; as for
        every model, the record places tokens on their cells, not on their
        receptive-field centres.
        """
        return centre_parents(prev.grid, cur.grid)

    def probs(self, call: Call, site: Site, module: nn.Module, args: tuple, kwargs: dict, output):
        """The output of the attention dropout: the softmax probabilities the forward multiplies with the values."""
        return output

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        """Sum over blocks of heads x queries x keys at input ``hw`` (CLS included where there is one)."""
        total = 0
        grids = self._stage_grids(config, hw)
        for s, (gh, gw) in enumerate(grids):
            prefix = self._stage_prefix(config, s)
            if getattr(config, "linear_attention", False):
                keys = _LINEAR_KEYS
            else:
                r = self._reduction(config, s)
                keys = (gh // r) * (gw // r) if r > 1 else gh * gw
            total += config.depths[s] * config.num_attention_heads[s] * (prefix + gh * gw) * (prefix + keys)
        return total

    def _stage_prefix(self, config, stage: int) -> int:
        return 0


class Pvt(_Pyramid):
    """PvT v1 (Wang et al. 2021; ``PvtForImageClassification`` / ``PvtModel``).

    Stage s: a patch-embedding conv (``transformers`` builds it with kernel
    ``config.strides[s]`` and stride ``config.patch_sizes[s]``: the names are
    swapped, equal in released configs), an absolute position table on that stage's
    native grid, then ``depths[s]`` blocks with spatial reduction
    ``sequence_reduction_ratios[s]``. The last stage prepends a CLS token (queries
    and keys; its reduction ratio must be 1) and the classifier reads its final
    state (``readout`` ``cls``). PvT v1 runs only at its configured size: any other
    requested input size is resized to ``(image_size, image_size)``.
    """

    name = "PvT"
    layout = BlockLayout(
        projection=("attention.output.dense",),
        q=("attention.self.query",),
        k=("attention.self.key",),
        v=("attention.self.value",),
        pattern=("attention.self.dropout",),
        mlp=("mlp",),
        mlp_output=("mlp.dense2",),
        norms=(("layer_norm_1",), ("layer_norm_2",)),
    )
    model_types = ("pvt",)

    def _embed_conv(self, config, stage: int) -> tuple[int, int, int]:
        return int(config.strides[stage]), int(config.patch_sizes[stage]), 0

    def _reduction(self, config, stage: int) -> int:
        return int(config.sequence_reduction_ratios[stage])

    def _stage_prefix(self, config, stage: int) -> int:
        return 1 if stage == config.num_encoder_blocks - 1 else 0

    def fixed_size(self, config) -> tuple[int, int]:
        """``(image_size, image_size)``: the position tables cannot be resized (``docs/definitions.md#trap-pvt-v1-size``)."""
        return _pair(config.image_size)

    def readout(self, config) -> Literal["cls", "pooled"]:
        return "cls"

    def sites(self, model: nn.Module) -> list[Site]:
        sites: list[Site] = []
        for s, stage in enumerate(model.base_model.encoder.block):
            for j, layer in enumerate(stage):
                attn = layer.attention.self
                drop = _check_dropout(attn.dropout, f"stage {s} block {j}: attention.self.dropout")
                sites.append(Site(index=len(sites), stage=s, attention=drop, block=layer, extra=attn))
        return sites

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        return _stage_geometry(site, args, kwargs, raw, linear=False, cls_allowed=True)

    def position_info(self, model: nn.Module) -> PositionInfo:
        """One table per stage: its patch rows (CLS row dropped in the last stage) on the stage's native grid.

        The native grid is the stage grid at the configured ``image_size``, from the
        patch-embedding convolutions; a table that does not fill it is refused (such a
        model cannot run at all).
        """
        config = model.config
        h, w = _pair(config.image_size)
        tables = []
        for s, emb in enumerate(model.base_model.encoder.patch_embeddings):
            conv = emb.projection
            (kh, kw), (sh, sw), (ph, pw) = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.padding)
            h, w = _conv_out(h, kh, sh, ph), _conv_out(w, kw, sw, pw)
            table = emb.position_embeddings.detach().float().cpu()
            prefix = 0 if emb.cls_token is None else 1  # the CLS row is the first one (see its forward)
            rows = table.reshape(-1, table.shape[-1])[prefix:].numpy().copy()
            if rows.shape[0] != h * w:
                raise ValueError(
                    f"stage {s} has {rows.shape[0]} position embeddings but a {h} x {w} grid at its "
                    f"configured size {config.image_size}"
                )
            tables.append(PositionTable(f"stage {s}", rows, (h, w)))
        return PositionInfo(tables=tuple(tables))

    def patch_weight(self, model: nn.Module) -> np.ndarray:
        return model.base_model.encoder.patch_embeddings[0].projection.weight.detach().float().cpu().numpy()


class PvtV2(_Pyramid):
    """PvT v2 (Wang et al. 2022; ``PvtV2ForImageClassification`` / ``PvtV2Model``).

    Stage s: an overlapping patch embedding (conv with kernel ``patch_sizes[s]``,
    stride ``strides[s]``, padding ``kernel // 2``: the grid is ``ceil(n / stride)``),
    ``depths[s]`` blocks with spatial reduction ``sr_ratios[s]`` or, with
    ``linear_attention``, keys pooled to 7 x 7, then a LayerNorm. No CLS token: the
    classifier reads the mean of the final grid tokens (``readout`` ``pooled``). No
    position table (position comes from convolutions). Runs at any input size; the
    size is snapped to the total patch stride so every stage grid is exact.
    """

    name = "PvT v2"
    layout = BlockLayout(
        projection=("attention.proj",),
        q=("attention.query",),
        k=("attention.key",),
        v=("attention.value",),
        pattern=("attention.attn_drop",),
        mlp=("mlp",),
        mlp_output=("mlp.dense2",),
        norms=(("layer_norm_1",), ("layer_norm_2",)),
    )
    model_types = ("pvt_v2",)

    def _embed_conv(self, config, stage: int) -> tuple[int, int, int]:
        k = int(config.patch_sizes[stage])
        return k, int(config.strides[stage]), k // 2

    def _reduction(self, config, stage: int) -> int:
        return int(config.sr_ratios[stage])

    def readout(self, config) -> Literal["cls", "pooled"]:
        return "pooled"

    def sites(self, model: nn.Module) -> list[Site]:
        sites: list[Site] = []
        for s, stage in enumerate(model.base_model.encoder.layers):
            for j, layer in enumerate(stage.blocks):
                attn = layer.attention
                drop = _check_dropout(attn.attn_drop, f"stage {s} block {j}: attention.attn_drop")
                sites.append(Site(index=len(sites), stage=s, attention=drop, block=layer, extra=attn))
        return sites

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        return _stage_geometry(site, args, kwargs, raw, linear=bool(site.extra.linear_attention), cls_allowed=False)

    def position_info(self, model: nn.Module) -> PositionInfo:
        return PositionInfo(note=_V2_POSITION_NOTE)

    def patch_weight(self, model: nn.Module) -> np.ndarray:
        return model.base_model.encoder.layers[0].patch_embedding.proj.weight.detach().float().cpu().numpy()


FAMILIES: tuple[Family, ...] = (Pvt(), PvtV2())
