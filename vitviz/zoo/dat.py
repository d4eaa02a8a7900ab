"""DAT, the Deformable Attention Transformer (Xia et al. 2022, "Vision Transformer with Deformable Attention").

A ``transformers`` model with the parameter names and shapes of the authors' v1 code
(LeapLabTHU/DAT at 81c67ea, ``models/dat.py``, ``models/dat_blocks.py``; the June
2022 code beside the released weights, 7edbb9b, picks the offset kernel per stage,
9 / 7 / 5 / 3, which is what 81c67ea picks at 224 and 384), so an official state dict
loads as it is (``CONVERTERS``). The network:

* a 4 x 4 stride-4 patch convolution and a channel LayerNorm (``patch_proj``);
* 4 stages (``stages``), each a list of blocks whose kinds come from the config's
  ``stage_spec`` (``L`` window, ``S`` shifted window, ``D`` deformable: see
  :mod:`vitviz.zoo.dat_blocks`); a block is ``x = x + attn(norm(x))``, then
  ``x = x + mlp(norm(x))`` (pre-norm, LayerNorm eps 1e-5);
* between stages a 2 x 2 stride-2 convolution without bias and a channel LayerNorm
  (``down_projs``);
* ``cls_norm``, the mean over the last stage's map, ``cls_head``.

Window tables and masks are built for ``image_size`` (the shifted-window mask and the
deformable ``rpe_table`` are sized for its stage maps), so the model runs at that
size only; every stage map must also be a multiple of its window. Other inputs are
refused with a message (the authors' code would fail or, for the mask, silently
misalign windows).

``forward(pixel_values, output_sampling=True)`` also returns, per stage, each
block's sampled positions and reference points (None for window blocks): DAT's own
``(logits, positions, references)``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForImageClassification, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import ImageClassifierOutput

from vitviz.zoo.convert import Converter
from vitviz.zoo.dat_blocks import (
    BlockEnd,
    DAttentionBaseline,
    LayerNormProxy,
    LocalAttention,
    ShiftWindowAttention,
    TransformerMLP,
    shift_for,
)

__all__ = ["DatConfig", "DatForImageClassification", "DatImageClassifierOutput", "CONVERTERS", "size_problem"]


class DatConfig(PretrainedConfig):
    """DAT's hyper-parameters, named as in the authors' yaml configs (``MODEL.DAT``).

    ``stage_spec``: per stage, one letter per block (``L``, ``S``, ``D``);
    ``groups``: offset groups of the deformable blocks per stage; ``use_pes``: the
    deformable blocks' ``rpe_table``; ``offset_range_factor``: the tanh range factor
    (the offsets are ``tanh(o) * factor / Hk``); ``offset_kernel_sizes``: the offset
    network's depth-wise kernel per stage (the authors' 9, 7, 5, 3); ``strides``: its stride.
    The authors' options that no released model uses (``dwc_pes``, ``fixed_pes``,
    ``no_offs``, ``use_dwc_mlps``, ``use_conv_patches``) are not implemented.
    """

    model_type = "dat"

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 4,
        num_channels: int = 3,
        expansion: int = 4,
        dim_stem: int = 96,
        dims: list[int] | None = None,
        depths: list[int] | None = None,
        stage_spec: list[list[str]] | None = None,
        heads: list[int] | None = None,
        window_sizes: list[int] | None = None,
        groups: list[int] | None = None,
        use_pes: list[bool] | None = None,
        strides: list[int] | None = None,
        offset_range_factor: list[float] | None = None,
        offset_kernel_sizes: list[int] | None = None,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        **kwargs,
    ) -> None:
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.expansion = expansion
        self.dim_stem = dim_stem
        self.dims = list(dims or [96, 192, 384, 768])
        self.depths = list(depths or [2, 2, 6, 2])
        self.stage_spec = [list(s) for s in (stage_spec or [["L", "S"], ["L", "S"], ["L", "D"] * 3, ["L", "D"]])]
        self.heads = list(heads or [3, 6, 12, 24])
        self.window_sizes = list(window_sizes or [7, 7, 7, 7])
        self.groups = list(groups or [-1, -1, 3, 6])
        self.use_pes = list(use_pes or [False, False, True, True])
        self.strides = list(strides or [-1, -1, 1, 1])
        self.offset_range_factor = list(offset_range_factor or [-1, -1, 2, 2])
        self.offset_kernel_sizes = list(offset_kernel_sizes or [9, 7, 5, 3])
        self.drop_rate = drop_rate
        self.attn_drop_rate = attn_drop_rate
        super().__init__(**kwargs)

    def stage_maps(self, hw: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """Each stage's map (rows, columns) for input ``hw`` (default: ``image_size``)."""
        h, w = hw or (self.image_size, self.image_size)
        h, w = h // self.patch_size, w // self.patch_size
        maps = []
        for _ in range(4):
            maps.append((h, w))
            h, w = h // 2, w // 2
        return maps


def size_problem(config: DatConfig, hw: tuple[int, int]) -> str:
    """Why DAT cannot run at input ``hw`` ("" when it can)."""
    side = config.image_size
    maps = config.stage_maps(hw)
    bad = [
        f"stage {i + 1}: {m[0]} x {m[1]} tokens, window {w}"
        for i, (m, w) in enumerate(zip(maps, config.window_sizes, strict=True))
        if m[0] % w or m[1] % w
    ]
    if bad:
        return (
            f"DAT cannot run at {hw[1]} x {hw[0]} px: every stage map must be a multiple of its window ("
            + "; ".join(bad)
            + f"). This model was built for {side} x {side} px."
        )
    if tuple(hw) != (side, side):
        return (
            f"DAT cannot run at {hw[1]} x {hw[0]} px: its shifted-window masks and deformable position tables are "
            f"built for {side} x {side} px, the only size it runs at."
        )
    return ""


class TransformerStage(nn.Module):
    """One stage: an optional 1 x 1 projection (``proj``), then its blocks, named as in the authors' code."""

    def __init__(self, config: DatConfig, i: int, fmap: tuple[int, int], dim_in: int) -> None:
        super().__init__()
        dim, heads, spec = config.dims[i], config.heads[i], config.stage_spec[i]
        depth = config.depths[i]
        if len(spec) != depth:
            raise ValueError(f"stage {i + 1}: {len(spec)} block kinds for {depth} blocks")
        self.depths = depth
        self.proj = nn.Conv2d(dim_in, dim, 1, 1, 0) if dim_in != dim else nn.Identity()
        self.layer_norms = nn.ModuleList([LayerNormProxy(dim) for _ in range(2 * depth)])
        self.mlps = nn.ModuleList([TransformerMLP(dim, config.expansion, config.drop_rate) for _ in range(depth)])
        self.attns = nn.ModuleList()
        window, a_drop, p_drop = config.window_sizes[i], config.attn_drop_rate, config.drop_rate
        for kind in spec:
            if kind == "L":
                self.attns.append(LocalAttention(dim, heads, window, a_drop, p_drop))
            elif kind == "S":
                self.attns.append(ShiftWindowAttention(dim, heads, window, a_drop, p_drop, shift_for(window), fmap))
            elif kind == "D":
                self.attns.append(
                    DAttentionBaseline(
                        fmap,
                        heads,
                        dim // heads,
                        config.groups[i],
                        a_drop,
                        p_drop,
                        config.strides[i],
                        config.offset_range_factor[i],
                        config.use_pes[i],
                        config.offset_kernel_sizes[i],
                    )
                )
            else:
                raise ValueError(f"block kind {kind!r} is not one of L, S, D")
        # Parameterless markers (no state-dict keys): a hook on each sees the block's input and output.
        self.block_ends = nn.ModuleList([BlockEnd() for _ in range(depth)])

    def forward(self, x: torch.Tensor):
        x = self.proj(x)
        positions, references = [], []
        for d in range(self.depths):
            x_in = x
            y, pos, ref = self.attns[d](self.layer_norms[2 * d](x))
            x = y + x_in  # drop path is the identity at evaluation
            x = self.mlps[d](self.layer_norms[2 * d + 1](x)) + x
            x = self.block_ends[d](x_in, x)
            positions.append(pos)
            references.append(ref)
        return x, positions, references


@dataclass
class DatImageClassifierOutput(ImageClassifierOutput):
    """``logits`` plus, with ``output_sampling=True``, per stage per block the sampled positions and reference
    points ``(B, groups, Hk, Wk, 2)`` (y, x normalised; None for window blocks), as the authors' forward returns."""

    positions: tuple | None = None
    references: tuple | None = None


class DatPreTrainedModel(PreTrainedModel):
    config_class = DatConfig
    base_model_prefix = "dat"
    main_input_name = "pixel_values"
    _supports_sdpa = False
    _supports_flash_attn = False
    _supports_flex_attn = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Truncated normal (std 0.02) for linear and conv weights and position tables, zero biases (random
        models only: a converted checkpoint brings every weight and buffer)."""
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, LocalAttention):
            nn.init.trunc_normal_(module.relative_position_bias_table, std=0.01)
        elif isinstance(module, DAttentionBaseline) and module.rpe_table is not None:
            nn.init.trunc_normal_(module.rpe_table, std=0.01)


class DatForImageClassification(DatPreTrainedModel):
    """DAT with its classifier; the state-dict keys are the authors' (``patch_proj``, ``stages``, ``down_projs``,
    ``cls_norm``, ``cls_head``)."""

    def __init__(self, config: DatConfig) -> None:
        super().__init__(config)
        p = config.patch_size
        self.patch_proj = nn.Sequential(
            nn.Conv2d(config.num_channels, config.dim_stem, p, p, 0), LayerNormProxy(config.dim_stem)
        )
        maps = config.stage_maps()
        self.stages = nn.ModuleList(
            TransformerStage(config, i, maps[i], config.dim_stem if i == 0 else config.dims[i - 1] * 2)
            for i in range(4)
        )
        self.down_projs = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(config.dims[i], config.dims[i + 1], 2, 2, 0, bias=False), LayerNormProxy(config.dims[i + 1])
            )
            for i in range(3)
        )
        self.cls_norm = LayerNormProxy(config.dims[-1])
        self.cls_head = nn.Linear(config.dims[-1], config.num_labels)
        self.post_init()

    @property
    def classifier(self) -> nn.Linear:
        """``cls_head`` under the name ``load_model`` looks for to know the model classifies (no extra keys)."""
        return self.cls_head

    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        output_sampling: bool = False,
        **kwargs,
    ) -> DatImageClassifierOutput:
        problem = size_problem(self.config, tuple(pixel_values.shape[-2:]))
        if problem:
            raise ValueError(problem)
        x = self.patch_proj(pixel_values)
        positions, references = [], []
        for i in range(4):
            x, pos, ref = self.stages[i](x)
            if i < 3:
                x = self.down_projs[i](x)
            positions.append(tuple(pos))
            references.append(tuple(ref))
        x = self.cls_norm(x).mean(dim=(2, 3))  # adaptive_avg_pool2d(x, 1), flattened
        logits = self.cls_head(x)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits, labels)
        return DatImageClassifierOutput(
            loss=loss,
            logits=logits,
            positions=tuple(positions) if output_sampling else None,
            references=tuple(references) if output_sampling else None,
        )


def _register() -> None:
    with contextlib.suppress(ValueError):  # already registered (a module reload)
        AutoConfig.register("dat", DatConfig)
    with contextlib.suppress(ValueError):
        AutoModelForImageClassification.register(DatConfig, DatForImageClassification)


_register()

_DEEP = ["L", "D"] * 9
_SIZES = {  # the authors' configs/dat_*.yaml (7edbb9b)
    "dat_tiny": dict(
        dim_stem=96,
        dims=[96, 192, 384, 768],
        depths=[2, 2, 6, 2],
        heads=[3, 6, 12, 24],
        groups=[-1, -1, 3, 6],
        stage_spec=[["L", "S"], ["L", "S"], ["L", "D"] * 3, ["L", "D"]],
    ),
    "dat_small": dict(
        dim_stem=96,
        dims=[96, 192, 384, 768],
        depths=[2, 2, 18, 2],
        heads=[3, 6, 12, 24],
        groups=[-1, -1, 3, 6],
        stage_spec=[["L", "S"], ["L", "S"], _DEEP, ["L", "D"]],
    ),
    "dat_base": dict(
        dim_stem=128,
        dims=[128, 256, 512, 1024],
        depths=[2, 2, 18, 2],
        heads=[4, 8, 16, 32],
        groups=[-1, -1, 4, 8],
        stage_spec=[["L", "S"], ["L", "S"], _DEEP, ["L", "D"]],
    ),
}
_SIZES["dat_base_384"] = dict(_SIZES["dat_base"], image_size=384, window_sizes=[12, 12, 12, 12])


def _config_maker(name: str):
    def make(num_labels: int = 1000) -> DatConfig:
        return DatConfig(num_labels=num_labels, **_SIZES[name])

    return make


CONVERTERS: dict[str, Converter] = {
    name: Converter(
        name=name,
        config=_config_maker(name),
        model_class=DatForImageClassification,
        classifier_key="cls_head.weight",
        image_size=(384, 384) if name.endswith("384") else (224, 224),
        # the authors' evaluation (data/build.py, TEST.CROP): Resize(int((256 / 224) * size)), CenterCrop(size)
        shortest_edge=int((256 / 224) * (384 if name.endswith("384") else 224)),
        notes={
            "source": "LeapLabTHU/DAT (released June 2022 with code 7edbb9b; the same network as 81c67ea)",
            "dataset": "imagenet",
        },
    )
    for name in _SIZES
}
