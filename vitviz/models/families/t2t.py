"""T2T-ViT (``t2t``, :mod:`vitviz.zoo.t2t`): two tokens-to-token stages, then a plain ViT backbone.

The record has three stages (at 224 px):

* **stage 1**: tokens-to-token layer 1 on the 56 x 56 grid of the first soft split (no prefix token);
* **stage 2**: layer 2 on the 28 x 28 grid of the second soft split;
* **stage 3**: the backbone blocks on 14 x 14 tokens with CLS at index 0; the prediction reads CLS.

Grids are computed from the input side with the soft splits' (kernel, stride, padding) and checked
against the number of queries each block computed. Each block is ``global`` attention over its own
stage's tokens. What a tokens-to-token layer's map is depends on the layer:

* **token transformer** (``T2T-ViT_t``): the softmax probabilities of its single head, read at the
  output of its ``attn_drop`` (identity in eval mode): the very tensor multiplied with v.
* **performer** (``T2T-ViT``): the module computes no attention matrix. Its output is
  ``y = phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k_j) + 1e-8)``, which equals ``A v`` for the
  **kernel's implied attention** ``A[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_j phi(k_j) + 1e-8)``.
  vitviz forms this ``A`` (one "head") from the random features the module itself computed (read at its
  ``features`` no-op) and shows it. It is the linear operator the layer applied to v, not probabilities
  any softmax produced; rows sum to ``1 - 1e-8 / (D_i + 1e-8)``, 1 to float precision. Because the
  module multiplies v by its factors rather than by ``A``, ``A`` is not on the forward's autograd path:
  its gradient is zero, so class-specific relevance gets no contribution from a performer's T2T stages
  (the relevance rule then passes R through them unchanged).

**Rollout through stages** (``docs/definitions.md#rollout-through-stages``): within a stage
``B = 0.5 F + 0.5 I``, rows renormalised. At a soft split each new token is built from an overlapping
3 x 3 window of old tokens (stride 2, zero padding 1), centred on old token ``(2 r, 2 c)``; vitviz does
*not* follow the window: as for every strided re-embedding, each new token's row of R is the mean of
the rows of the old tokens inside its cell (a token is inside a cell when its centre is), here the
2 x 2 old tokens ``(2 r .. 2 r + 1, 2 c .. 2 c + 1)`` (``merge_parents``, the centre rule). CLS enters
with the backbone and starts with a zero row. The final map is the CLS row, renormalised, on the
56 x 56 grid of stage 1.

The position table (``pos_embed``, sinusoidal, CLS row first) is shown for its 14 x 14 patch rows.
The model runs at its configured ``image_size`` only, on square inputs: every input is resized to it.
There is no patch-embedding convolution (the first soft split is a fixed unfold), so there are no
filters to show.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import nn

from vitviz.models.families.base import BlockLayout, Call, Family, ReadoutHead, centre_parents
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, PositionTable

__all__ = ["T2TViT", "FAMILIES", "implied_attention"]

_STRIDES = (4, 2, 2)  # the soft splits' strides (vitviz.zoo.t2t.SOFT_SPLITS)


def _grids(side: int) -> tuple[int, int, int]:
    from vitviz.zoo.t2t import soft_split_grids

    return soft_split_grids(side)


def implied_attention(qp: torch.Tensor, kp: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The performer's implied attention ``(B, 1, N, N)`` from its random features ``(B, N, m)``.

    ``A[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_j phi(k_j) + eps)``: ``A @ v`` is the
    layer's ``y`` (the same normaliser and epsilon as the module).
    """
    d = torch.einsum("bti,bi->bt", qp, kp.sum(dim=1)).unsqueeze(2)
    return (torch.einsum("bti,bni->btn", qp, kp) / (d + eps)).unsqueeze(1)


class T2TViT(Family):
    """T2T-ViT and T2T-ViT_t (``T2TViTForImageClassification``)."""

    name = "T2T-ViT"
    # qkv is one Linear (q, k, v); the performer's ``kqv`` orders them k, q, v. The backbone's and the token
    # transformers' probabilities pass through ``attn.attn_drop``; the performer has none to edit.
    layout = BlockLayout(
        q=("attn.qkv#0/3", "kqv#1/3"),
        k=("attn.qkv#1/3", "kqv#0/3"),
        v=("attn.qkv#2/3", "kqv#2/3"),
        pattern=("attn.attn_drop",),
    )
    model_types = ("t2t",)
    hierarchical = True

    def block_note(self, config, stage: int, num_stages: int) -> str:
        """The performer's tokens-to-token layers form no attention matrix: their map is the implied one."""
        if getattr(config, "tokens_type", "") == "performer" and stage < num_stages - 1:
            return (
                "A Performer tokens-to-token layer forms no attention matrix: shown is the attention its random-feature "
                "kernel implies, phi(q) . phi(k) / (phi(q) . sum phi(k)), which is what its output uses."
            )
        return ""

    # --- loading ---------------------------------------------------------------------
    def patch_size(self, config) -> int:
        """Pixels per first-stage token: the first soft split's stride (4)."""
        return _STRIDES[0]

    def size_multiple(self, config) -> int:
        return int(np.prod(_STRIDES))

    def fixed_size(self, config) -> tuple[int, int]:
        """``(image_size, image_size)``: the position table is built for one (square) size."""
        return int(config.image_size), int(config.image_size)

    def size_problem(self, config, hw: tuple[int, int]) -> str:
        n = int(config.image_size)
        if hw != (n, n):
            return f"T2T-ViT runs at its configured square input of {n} x {n} px only (asked for {hw[1]} x {hw[0]})."
        return ""

    def position_info(self, model: nn.Module) -> PositionInfo:
        """The patch rows of ``pos_embed`` (its CLS row, the first, dropped) on the native backbone grid."""
        table = model.pos_embed.detach().float().cpu()
        rows = table.reshape(-1, table.shape[-1])[1:].numpy().copy()
        side = _grids(int(model.config.image_size))[-1]
        if rows.shape[0] != side * side:
            raise ValueError(f"{rows.shape[0]} position embeddings do not fill the native {side} x {side} grid")
        return PositionInfo(tables=(PositionTable("backbone tokens", rows, (side, side)),))

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ()  # stage 1 has no CLS: it enters with the backbone

    def readout(self, config) -> Literal["cls", "pooled"]:
        return "cls"

    # --- capture ---------------------------------------------------------------------
    def sites(self, model: nn.Module) -> list[Site]:
        t2t = model.tokens_to_token
        sites: list[Site] = []
        for s, layer in enumerate((t2t.attention1, t2t.attention2)):
            if isinstance(getattr(layer, "features", None), nn.Module):  # performer: its random features
                sites.append(Site(index=s, stage=s, attention=layer.features, block=layer, extra="performer"))
            elif isinstance(getattr(getattr(layer, "attn", None), "attn_drop", None), nn.Dropout):
                sites.append(Site(index=s, stage=s, attention=layer.attn.attn_drop, block=layer, extra="transformer"))
            else:
                raise RuntimeError(f"tokens-to-token layer {s + 1} is neither a token transformer nor a performer")
        for blk in model.blocks:
            sites.append(Site(index=len(sites), stage=2, attention=blk.attn.attn_drop, block=blk))
        return sites

    def probs(self, call: Call, site: Site, module, args, kwargs, output):
        """Dropout output (softmax probabilities), or the performer's implied attention from its features."""
        if site.extra == "performer":
            return implied_attention(*output)
        return output

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        h, w = call.input_size
        if h != w:
            raise RuntimeError(f"T2T-ViT ran on a {h} x {w} input; it takes square inputs only")
        side = _grids(h)[site.stage]
        prefix = ("CLS",) if site.stage == 2 else ()
        t = len(prefix) + side * side
        if raw.dim() != 4 or raw.shape[-1] != t or raw.shape[-2] != t:
            raise RuntimeError(
                f"stage {site.stage}: expected {len(prefix)} prefix + {side} x {side} tokens, got attention "
                f"of shape {tuple(raw.shape)}"
            )
        return Geometry(
            stage=site.stage, kind="global", num_heads=int(raw.shape[1]), grid=(side, side), prefix_kinds=prefix
        )

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray]:
        """The centre rule (see the module docstring): old token (i, j) merges into new cell (i // 2, j // 2)."""
        return centre_parents(prev.grid, cur.grid)

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        g0, g1, g2 = _grids(hw[0])
        return g0**4 + g1**4 + int(config.depth) * int(config.num_heads) * (g2 * g2 + 1) ** 2

    # --- causal analyses ---------------------------------------------------------------
    def head_projection(self, site: Site) -> nn.Linear | None:
        """``attn.proj`` of the backbone and of token transformers; the performer's ``proj`` (its input is A v)."""
        if site.extra == "performer":
            return site.block.proj
        return site.block.attn.proj

    def mlp_output(self, site: Site) -> nn.Linear | None:
        mlp = site.block.mlp
        return mlp[2] if isinstance(mlp, nn.Sequential) else mlp.fc2

    def readout_head(self, model: nn.Module) -> ReadoutHead | None:
        """``head(norm(x)[:, 0])``: the final LayerNorm of the CLS token, then the linear head."""
        if not isinstance(model.head, nn.Linear):
            return None
        return ReadoutHead(
            select=lambda x: x[:, :1],
            norm=model.norm,
            head=lambda z: model.head(z[:, 0]),
            description="the final LayerNorm of the CLS token, then the head",
        )


FAMILIES: tuple[Family, ...] = (T2TViT(),)
