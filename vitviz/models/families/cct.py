"""CCT (``cct``, :mod:`vitviz.zoo.cct`): one grid of global attention, no CLS, read out by sequence pooling.

Token layout: the tokenizer's feature map (convolutions and max-pools, total stride
``(stride * 2) ** n_conv_layers`` px) flattened row-major; P = 0, no prefix tokens. The
learnable position table has one row per token of the native grid (``image_size``) and no
CLS slot; at another input size the model resizes it bilinearly, the position view shows the
native table.

Maps:

* Block l, head h: the post-softmax attention ``A[l, h] = softmax(q k^T * head_dim ** -0.5)``
  (``(N, N)``) exactly as the block multiplied it with the values (``CctAttention`` returns it).
  Blocks are ``global`` attention over the one grid, as in a plain ViT.
* **The global map (there is no CLS token) is the sequence-pooling weights**: ``w =
  softmax_t(attention_pool(norm(x_L))_t)`` over the N final tokens, one map (the pooling has no
  heads). It is recorded as a block of kind ``pool`` with one head, native ``(1, N)``: the tensor
  ``CctSequencePool`` multiplied with the tokens. The prediction reads it (``readout = "head"``),
  so rollout and relevance start from its row: the pooling weights' combination of the final
  tokens' rows, ``w^T R``.
* The logit lens and direct logit attribution are not offered: the block renormalises its
  residual stream between attention and MLP (``norm1``), and the readout weights depend on the
  tokens, so neither is the sum of per-block terms the definitions assume.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from vitviz.models.families.base import BlockLayout, Call, Family
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, PositionTable
from vitviz.zoo.cct import CctAttention, CctBlock, CctSequencePool, token_grid, total_stride

__all__ = ["Cct", "FAMILIES"]

_POOL = "pool"


class Cct(Family):
    """Compact Convolutional Transformer: convolutional tokenizer, global blocks, sequence pooling."""

    name = "CCT"
    # qkv is one Linear (q, k, v in that order); the block's MLP is not a module (linear1, GELU, linear2 in the
    # block's forward), so no MLP point and no attribution.
    layout = BlockLayout(
        projection=("self_attn.proj",), q=("self_attn.qkv#0/3",), k=("self_attn.qkv#1/3",), v=("self_attn.qkv#2/3",)
    )
    model_types = ("cct",)

    def patch_size(self, config) -> int:
        return total_stride(config)

    def readout(self, config) -> Literal["head"]:
        return "head"

    def grid(self, config, hw: tuple[int, int]) -> tuple[int, int]:
        return token_grid(config, hw)

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        gh, gw = self.grid(config, hw)
        n = gh * gw
        return config.num_layers * config.num_heads * n * n + n

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        """The first tokenizer convolution ``(C_out, 3, k, k)`` (64 channels when there are two conv layers)."""
        return model.tokenizer.conv_layers[0][0].weight.detach().float().cpu().numpy()

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        table = model.classifier.positional_emb
        gh, gw = model.classifier.native_grid
        rows = table.detach().float().cpu().numpy().reshape(-1, table.shape[-1])
        if rows.shape[0] != gh * gw:
            raise ValueError(f"{rows.shape[0]} position embeddings do not fill the native {gh} x {gw} grid")
        note = getattr(model.config, "position_note", "")  # e.g. what conversion did with a `_sine` table
        return PositionInfo(tables=(PositionTable("tokens", rows, (gh, gw)),), note=note)

    def sites(self, model: torch.nn.Module) -> list[Site]:
        """Each ``CctBlock`` with its ``CctAttention``, in forward order, then the sequence pooling."""
        blocks = [m for m in model.modules() if isinstance(m, CctBlock)]
        if len(blocks) != model.config.num_layers:
            raise RuntimeError(f"found {len(blocks)} blocks, the config says {model.config.num_layers}")
        sites = []
        for i, block in enumerate(blocks):
            if not isinstance(block.self_attn, CctAttention):
                raise RuntimeError(f"block {i} has no CctAttention")
            sites.append(Site(index=i, stage=0, attention=block.self_attn, block=block))
        pools = [m for m in model.modules() if isinstance(m, CctSequencePool)]
        if len(pools) != 1:
            raise RuntimeError(f"expected one sequence pooling, found {len(pools)}")
        sites.append(Site(index=len(sites), stage=0, attention=pools[0], block=pools[0], extra=_POOL))
        return sites

    def probs(self, call: Call, site: Site, module, args, kwargs, output) -> torch.Tensor:
        """Blocks: ``(B, H, N, N)``; pooling: the weights ``(B, N, 1)`` (native ``(1, N)`` per image)."""
        return output[1]

    def geometry(self, call: Call, site: Site, module, args, kwargs, output, raw: torch.Tensor) -> Geometry:
        grid = self.grid(call.config, call.input_size)
        n = grid[0] * grid[1]
        tokens = raw.shape[-2] if site.extra == _POOL else raw.shape[-1]
        if tokens != n:
            raise RuntimeError(f"expected {grid[0]} x {grid[1]} tokens, got {tokens}")
        if site.extra == _POOL:
            return Geometry(stage=0, kind="pool", num_heads=1, grid=grid)
        return Geometry(stage=0, kind="global", num_heads=raw.shape[1], grid=grid)

    def tokens(self, call: Call, site: Site, module, args, kwargs, output):
        """A block's input and output tokens; the pooling makes no tokens of its own (None)."""
        if site.extra == _POOL:
            return None
        return args[0], output[0]


FAMILIES: tuple[Family, ...] = (Cct(),)
