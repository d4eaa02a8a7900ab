"""CvT (microsoft/cvt-*, ``model_type`` "cvt"): convolutional token embeddings and projections, reduced keys.

Three stages; each begins with a strided convolutional token embedding (7 x 7
stride 4, then 3 x 3 stride 2 twice in the released configs), so every stage has
its own grid. In each block (``CvtLayer``) the stage tokens pass through
depth-wise convolutional projections before the linear q, k, v projections: the
query projection keeps the grid (stride 1), the key and value projections reduce
it (3 x 3, stride ``stride_kv`` = 2). Attention is ``global`` in vitviz's terms:

* queries: [CLS] + the stage grid (gh, gw), row-major;
* keys: [CLS] + the key grid (kh, kw) = the conv output of the grid, with
  ``kh = (gh + 2 padding_kv - kernel_qkv) // stride_kv + 1``;
* the CLS token (last stage only in the released configs) bypasses the
  convolutions and joins queries and keys as it is;
* ``softmax(q k^T * embed_dim ** -0.5)`` (transformers' ``CvtSelfAttention.scale``
  uses the stage's whole width, not the head width).

The query map of a token is its row on the key grid as it is. For dense views
(rollout, relevance) key (j, i) spreads its weight evenly over the stage tokens of
the ``stride_kv x stride_kv`` block it came from (``key_rule`` "strided"). Between
stages the strided embedding merges tokens by the centre rule; the CLS entering
the last stage starts with a zero row (it carries no image content until it
attends). The classifier reads the last stage's CLS token (``readout`` "cls").

CvT's forward returns no attentions (``ImageClassifierOutputWithNoAttention``):
the probabilities come from a hook on ``CvtSelfAttention.dropout``, the
``nn.Dropout`` applied to ``attention_probs``, whose output is the tensor the
forward multiplies with the values (the same tensor object in eval mode). Its
``hidden_states`` are ``(B, C, H, W)`` per stage without the CLS token (that comes
separately as ``cls_token_value``), so token norms are read from the blocks'
``(B, P + N, C)`` inputs and outputs, never from ``hidden_states``.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from vitviz.models.families.base import BlockLayout, Call, Family, centre_parents
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo

__all__ = ["Cvt", "FAMILIES", "conv_out", "stage_grids", "key_grids"]

POSITION_NOTE = (
    "CvT has no position embeddings: it encodes position through its convolutional token embeddings "
    "and the depth-wise convolutional projections of queries, keys and values in every block."
)


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def conv_out(n: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """Output length of a convolution along one axis (PyTorch's ``Conv2d`` arithmetic)."""
    return (n + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def stage_grids(config, hw: tuple[int, int]) -> list[tuple[int, int]]:
    """Token grid of every stage at input ``hw``: each stage embedding's conv applied to the previous grid."""
    h, w = hw
    grids = []
    for k, s, p in zip(config.patch_sizes, config.patch_stride, config.patch_padding, strict=True):
        h, w = conv_out(h, k, s, p), conv_out(w, k, s, p)
        grids.append((h, w))
    return grids


def key_grids(config, hw: tuple[int, int]) -> list[tuple[int, int]]:
    """Key grid of every stage at input ``hw``: the strided depth-wise key projection applied to the stage grid."""
    out = []
    for s, (gh, gw) in enumerate(stage_grids(config, hw)):
        k, st, p = config.kernel_qkv[s], config.stride_kv[s], config.padding_kv[s]
        out.append((conv_out(gh, k, st, p), conv_out(gw, k, st, p)))
    return out


def _attention_module(layer: torch.nn.Module) -> torch.nn.Module:
    """``CvtLayer.attention.attention``: the ``CvtSelfAttention`` of one block."""
    return layer.attention.attention


def _projection_conv(projection: torch.nn.Module) -> torch.nn.Conv2d | None:
    """The depth-wise conv of a q/k/v projection, or None where transformers built none (``avg``, ``linear``)."""
    conv = getattr(projection, "convolution_projection", None)
    return None if conv is None else conv.convolution


def _check_block(stage: int, layer: torch.nn.Module, stage_module: torch.nn.Module) -> None:
    """Refuse blocks transformers' own forward cannot run, with the reason, before any capture."""
    attn = _attention_module(layer)
    name = f"stage {stage}"
    q_conv = _projection_conv(attn.convolution_projection_query)
    k_conv = _projection_conv(attn.convolution_projection_key)
    if q_conv is None or k_conv is None:
        # transformers builds the conv only for "dw_bn"; any other method fails in the forward (AttributeError).
        raise ValueError(
            f"{name} uses a q/k/v projection method other than 'dw_bn', which transformers' CvT cannot run"
        )
    # The block adds the attention output to its input, so the query projection must keep the grid:
    # stride 1 and "same" padding. Released configs all have stride_q = 1; others fail inside transformers.
    k, p, d = _pair(q_conv.kernel_size), _pair(q_conv.padding), _pair(q_conv.dilation)
    if _pair(q_conv.stride) != (1, 1) or any(2 * p[i] != d[i] * (k[i] - 1) for i in range(2)):
        raise ValueError(
            f"{name} projects queries with stride {_pair(q_conv.stride)} and padding {p} (kernel {k}), which "
            "changes the query grid; transformers' CvtLayer then cannot add the attention output to its input. "
            "vitviz supports CvT configs with stride_q = 1 and padding_q = (kernel_qkv - 1) / 2, as released"
        )
    cls = getattr(stage_module, "cls_token", None)
    if attn.with_cls_token and (cls is None or cls.shape[-1] != attn.embed_dim):
        raise ValueError(
            f"{name} has a CLS token of width {None if cls is None else cls.shape[-1]} but tokens of width "
            f"{attn.embed_dim}; transformers' CvT gives the CLS token the last stage's width only"
        )


def _height_width(args: tuple, kwargs: dict) -> tuple[int, int]:
    """The stage grid a ``CvtLayer`` ran on: its ``height`` and ``width`` arguments."""
    h = args[1] if len(args) > 1 else kwargs["height"]
    w = args[2] if len(args) > 2 else kwargs["width"]
    return int(h), int(w)


class Cvt(Family):
    """CvT: three stages of global attention over strided, convolutionally reduced keys."""

    name = "CvT"
    # CvtOutput adds the residual inside the MLP's last module: no MLP point.
    layout = BlockLayout(
        projection=("attention.output.dense",),
        q=("attention.attention.projection_query",),
        k=("attention.attention.projection_key",),
        v=("attention.attention.projection_value",),
        pattern=("attention.attention.dropout",),
    )
    model_types = ("cvt",)
    hierarchical = True

    # --- loading ---------------------------------------------------------------------
    def patch_size(self, config) -> int:
        """The first stage's embedding stride: pixels per first-stage token (4 in released configs)."""
        return int(config.patch_stride[0])

    def size_multiple(self, config) -> int:
        """The product of the embedding strides (16 in released configs).

        With the released kernels and paddings (``kernel - stride <= 2 padding < kernel``),
        a side of ``m * 16`` gives stage grids of exactly ``4m``, ``2m``, ``m``, so every
        token's cell is a whole stride block of pixels; e.g. 72 px would give
        18, 9, 5, and the last grid would not tile the image (72 / 16 = 4.5).
        """
        return int(np.prod([int(s) for s in config.patch_stride]))

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        """The first stage's embedding conv weight ``(D, C, k, k)`` (7 x 7 in released configs), float32."""
        proj = model.base_model.encoder.stages[0].embedding.convolution_embeddings.projection
        return proj.weight.detach().float().cpu().numpy()

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        return PositionInfo(note=POSITION_NOTE)

    def prefix_kinds(self, config) -> tuple[str, ...]:
        """The first stage's prefix tokens: none in released configs (the CLS token joins in the last stage)."""
        return ("CLS",) if config.cls_token[0] else ()

    def readout(self, config) -> Literal["cls", "pooled"]:
        """``cls``: the classifier reads the last stage's CLS token; without one it mean-pools the grid."""
        return "cls" if config.cls_token[-1] else "pooled"

    def rollout_note(self, config) -> str:
        return ""

    # --- capture ---------------------------------------------------------------------
    def sites(self, model: torch.nn.Module) -> list[Site]:
        """One site per ``CvtLayer`` in forward order; probabilities from ``CvtSelfAttention.dropout``.

        Raises ValueError (a ModelLoadError at load time) for configs transformers' own
        forward cannot run: a query projection that changes the grid (``stride_q`` > 1),
        a projection method other than ``dw_bn``, a CLS token in a narrower stage.
        """
        sites: list[Site] = []
        for s, stage_module in enumerate(model.base_model.encoder.stages):
            for layer in stage_module.layers:
                _check_block(s, layer, stage_module)
                attn = _attention_module(layer)
                sites.append(Site(index=len(sites), stage=s, attention=attn.dropout, block=layer, extra=attn))
        return sites

    def probs(self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any):
        """The dropout's output: ``attention_probs`` ``(B, H, P + N, P + Nk)``, the tensor multiplied with the values."""
        return output

    def geometry(
        self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any, raw: torch.Tensor
    ) -> Geometry:
        """Stage grid from the block's ``height``/``width``, key grid from its key conv, checked against ``raw``."""
        attn = site.extra
        grid = _height_width(args, kwargs)
        kinds = ("CLS",) if attn.with_cls_token else ()
        conv = _projection_conv(attn.convolution_projection_key)
        k, st, p, d = _pair(conv.kernel_size), _pair(conv.stride), _pair(conv.padding), _pair(conv.dilation)
        keys = tuple(conv_out(grid[i], k[i], st[i], p[i], d[i]) for i in range(2))
        n_q, n_k = len(kinds) + grid[0] * grid[1], len(kinds) + keys[0] * keys[1]
        if tuple(raw.shape[-2:]) != (n_q, n_k):
            raise RuntimeError(
                f"expected {len(kinds)} prefix tokens + {grid[0]} x {grid[1]} queries and a {keys[0]} x {keys[1]} "
                f"key grid, got attention of shape {tuple(raw.shape)}"
            )
        if keys == grid and st == (1, 1):
            return Geometry(stage=site.stage, kind="global", num_heads=raw.shape[1], grid=grid, prefix_kinds=kinds)
        return Geometry(
            stage=site.stage,
            kind="global",
            num_heads=raw.shape[1],
            grid=grid,
            prefix_kinds=kinds,
            key_grid=keys,
            key_rule="strided",
            key_stride=st,
        )

    def tokens(self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any):
        """The block's input and output ``(B, P + N, C)``: CLS first, then the grid row-major (as the block sees them)."""
        inp = args[0] if args else kwargs["hidden_state"]
        out = output[0] if isinstance(output, (tuple, list)) else output
        return inp, out

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray]:
        """The strided embedding conv: a previous-stage token merges into the cell that contains its centre."""
        return centre_parents(prev.grid, cur.grid)

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        """``sum over blocks of heads * (P + gh gw) * (P + kh kw)`` at input ``hw``, from the conv arithmetic."""
        total = 0
        for s, ((gh, gw), (kh, kw)) in enumerate(zip(stage_grids(config, hw), key_grids(config, hw), strict=True)):
            p = 1 if config.cls_token[s] else 0
            total += int(config.depth[s]) * int(config.num_heads[s]) * (p + gh * gw) * (p + kh * kw)
        return total


FAMILIES: tuple[Family, ...] = (Cvt(),)
