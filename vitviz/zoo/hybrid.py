"""The ViT paper's hybrid (Dosovitskiy et al. 2020, section 3.1 "Hybrid Architecture"): tokens from a ResNet's map.

R50+ViT-B/16 takes a ResNet-50 in BiT's style (weight-standardised convolutions, group
norm), drops its stage 4, extends stage 3 to 9 units, and embeds each cell of the
stride-16 feature map with a 1 x 1 patch projection; R26+ViT-S/32 keeps 4 stages of 2
units (stride 32). ``transformers`` 5 dropped its ``vit_hybrid``; this module rebuilds it
on ``transformers``' own BiT backbone (:class:`~transformers.BitModel`, bottleneck units,
TF "SAME" padding) and ViT blocks (:class:`~transformers.models.vit.modeling_vit.ViTLayer`),
computing exactly what the authors' JAX code computes (``vit_jax/models_vit.py``,
``models_resnet.py`` in google-research/vision_transformer):

* **ResNet** (``vit.embeddings.backbone``, a ``BitModel``): root ``conv_root`` 7 x 7 stride 2,
  ``gn_root``, ReLU, 3 x 3 max-pool stride 2 (both "SAME", TF's asymmetric padding); then
  ``len(resnet_depths)`` stages of bottleneck units (1 x 1, 3 x 3 with the stage's stride, 1 x 1;
  group norm after each, ReLU after the first two and after the residual sum; a projection
  ``conv_proj`` + ``gn_proj`` on the first unit). Stage i has ``resnet_width * 2**i`` middle and
  4x as many output channels; the first stage keeps the stride, each later one halves it.
  Two details differ from ``transformers``' BiT and are set here to the JAX code's:
  weight standardisation is ``(w - mean) / (std + 1e-5)`` over each output channel's
  (in, kh, kw) (BiT and timm use ``sqrt(var + 1e-8)``), and group norm's epsilon is flax's
  1e-6 (BiT: 1e-5).
* **Embedding** (``vit.embeddings.projection``): a ``patch_size`` x ``patch_size`` convolution with
  stride ``patch_size`` ("VALID") on the ResNet map (1 x 1 for R50 and R26), then the CLS token
  in front and the learned position table (``position_embeddings``, CLS row first) added.
  Without a ResNet (``resnet_depths=None``) the projection reads pixels: the plain ViT, kept here
  for the JAX checkpoints whose representation layer ``transformers``' ViT has no place for.
* **Blocks**: ``transformers``' ViT layers (pre-norm attention and MLP), with the JAX code's
  LayerNorm epsilon 1e-6 and its tanh-approximate GELU (``flax.linen.gelu``'s default;
  ``hidden_act="gelu_pytorch_tanh"``). Then the final LayerNorm (``encoder_norm``).
* **Readout**: the CLS token; with ``representation_size`` the ``pre_logits`` layer
  (``tanh(W x + b)``, the ImageNet-21k checkpoints'), then the classifier (``head``).

**Tokens** are the cells of the ResNet's feature map (row-major), not pixel patches: a token
strides ``total_stride(config)`` pixels (16 for R50+ViT-B/16) and is drawn on that stride cell,
but it sees a receptive field of ``receptive_field(config)`` pixels (363 for R50's three stages).

**Other input sizes**: the position table's grid part is resized bilinearly with aligned
corners (``F.interpolate(..., align_corners=True)``), which is what ``vit_jax``'s
``load_pretrained`` does to fine-tune at another resolution (``scipy.ndimage.zoom``, order 1);
the CLS row is kept. Inputs should be multiples of the total stride (the map is then exact).

Dropout and stochastic depth are left out (the identity at inference).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageClassification,
    BitConfig,
    BitModel,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.models.bit.modeling_bit import BitGroupNormActivation, WeightStandardizedConv2d
from transformers.models.vit.modeling_vit import ViTAttention, ViTLayer

__all__ = [
    "HybridViTConfig",
    "HybridViTModel",
    "HybridViTForImageClassification",
    "HybridViTModelOutput",
    "HybridViTImageClassifierOutput",
    "JaxStdConv2d",
    "cnn_stride",
    "total_stride",
    "cnn_channels",
    "token_grid",
    "receptive_field",
    "resize_position_grid",
    "standardised_weight",
]


class HybridViTConfig(PretrainedConfig):
    """A hybrid ViT (or, with ``resnet_depths=None``, a plain ViT in the JAX code's layout).

    ``resnet_depths``: units per ResNet stage ((3, 4, 9) for R50+ViT-B/16, (2, 2, 2, 2) for
    R26+ViT-S/32, () for the root alone); ``resnet_width``: the root's channels (the JAX code's
    ``int(64 * width_factor)``; a multiple of 8); ``patch_size``: the embedding convolution's
    kernel and stride on the ResNet map (1 for the R50 and R26 hybrids, 8 for R+ViT-Ti/16; on
    pixels without a ResNet); ``num_groups``: group norm's groups (32, flax's default; tiny test
    models use fewer); ``representation_size``: width of the ``pre_logits`` layer, None without one.
    ``image_size``: the input side the position table was trained at.
    """

    model_type = "hybrid_vit"
    attribute_map: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        image_size: int = 224,
        num_channels: int = 3,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu_pytorch_tanh",
        layer_norm_eps: float = 1e-6,
        qkv_bias: bool = True,
        patch_size: int = 1,
        resnet_depths: list[int] | tuple[int, ...] | None = (3, 4, 9),
        resnet_width: int = 64,
        num_groups: int = 32,
        weight_std_eps: float = 1e-5,
        group_norm_eps: float = 1e-6,
        representation_size: int | None = None,
        initializer_range: float = 0.02,
        position_note: str = "",
        **kwargs,
    ) -> None:
        self.image_size = int(image_size)
        self.num_channels = num_channels
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.layer_norm_eps = layer_norm_eps
        self.qkv_bias = qkv_bias
        self.patch_size = int(patch_size)
        self.resnet_depths = None if resnet_depths is None else [int(d) for d in resnet_depths]
        self.resnet_width = int(resnet_width)
        self.num_groups = int(num_groups)
        self.weight_std_eps = weight_std_eps
        self.group_norm_eps = group_norm_eps
        self.representation_size = None if representation_size is None else int(representation_size)
        self.initializer_range = initializer_range
        self.position_note = position_note  # shown beside the position table (what conversion did with it)
        # The ViT layers read these; the JAX models have no dropout at inference.
        self.attention_probs_dropout_prob = 0.0
        self.hidden_dropout_prob = 0.0
        if self.resnet_depths is not None:
            if self.resnet_width % 8 or self.resnet_width < 8:
                raise ValueError(f"resnet_width must be a positive multiple of 8, got {self.resnet_width}")
            if any(d < 1 for d in self.resnet_depths):
                raise ValueError(f"every ResNet stage needs at least one unit, got {self.resnet_depths}")
            if self.resnet_width % self.num_groups:
                raise ValueError(f"{self.num_groups} groups do not divide the root's {self.resnet_width} channels")
        if self.patch_size < 1:
            raise ValueError(f"patch_size must be at least 1, got {self.patch_size}")
        super().__init__(**kwargs)

    @property
    def has_resnet(self) -> bool:
        return self.resnet_depths is not None


def cnn_stride(config: HybridViTConfig) -> int:
    """Input pixels per cell of the ResNet's map: 4 (root conv and max-pool), halved by every stage after the first."""
    if config.resnet_depths is None:
        return 1
    return 4 * 2 ** max(0, len(config.resnet_depths) - 1)


def total_stride(config: HybridViTConfig) -> int:
    """Input pixels per token along each axis: the ResNet's stride times the embedding's patch (16 for R50+ViT-B/16)."""
    return cnn_stride(config) * config.patch_size


def cnn_channels(config: HybridViTConfig) -> int:
    """Channels of the map the embedding reads: the last stage's ``4 * width * 2**(n - 1)``, the root's, or RGB."""
    if config.resnet_depths is None:
        return config.num_channels
    if not config.resnet_depths:
        return config.resnet_width
    return 4 * config.resnet_width * 2 ** (len(config.resnet_depths) - 1)


def token_grid(config: HybridViTConfig, hw: tuple[int, int]) -> tuple[int, int]:
    """The token grid ``(gh, gw)`` for an input of ``hw`` pixels.

    "SAME" convolutions and pools of stride 2 give ``ceil(n / 2)`` cells, then the "VALID"
    embedding ``floor(n / patch_size)``: exactly ``n / total_stride`` when n is a multiple of it.
    """

    def side(n: int) -> int:
        if config.resnet_depths is not None:
            n = -(-n // 2)  # root conv
            n = -(-n // 2)  # max-pool
            for _ in config.resnet_depths[1:]:
                n = -(-n // 2)
        return n // config.patch_size

    return side(int(hw[0])), side(int(hw[1]))


def receptive_field(config: HybridViTConfig) -> int:
    """Side in pixels of the input window one token's embedding depends on (the ResNet's receptive field and the
    patch): each k x k layer adds ``(k - 1) * jump``, jump being the input pixels between its input's cells."""
    if config.resnet_depths is None:
        return config.patch_size
    rf, jump = 7, 2  # root conv 7 x 7, stride 2
    rf, jump = rf + 2 * jump, jump * 2  # max-pool 3 x 3, stride 2
    for i, depth in enumerate(config.resnet_depths):
        for unit in range(depth):
            rf += 2 * jump  # the unit's 3 x 3 convolution (its 1 x 1 convolutions and projection add nothing)
            if unit == 0 and i > 0:
                jump *= 2  # the stage's stride sits on its first unit's 3 x 3 convolution
    return rf + (config.patch_size - 1) * jump


def standardised_weight(weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The JAX code's weight standardisation: ``(w - mean) / (std + eps)`` per output channel (population std)."""
    mean = weight.mean(dim=(1, 2, 3), keepdim=True)
    std = weight.std(dim=(1, 2, 3), correction=0, keepdim=True)
    return (weight - mean) / (std + eps)


class JaxStdConv2d(WeightStandardizedConv2d):
    """BiT's weight-standardised convolution (its padding kept) with the JAX code's standardisation
    (:func:`standardised_weight`, ``eps`` 1e-5 added to the standard deviation)."""

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        if self.pad is not None:
            hidden_state = self.pad(hidden_state)
        weight = standardised_weight(self.weight, self.eps)
        return F.conv2d(hidden_state, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def bit_config(config: HybridViTConfig) -> BitConfig:
    """The ``transformers`` BiT configuration of the hybrid's ResNet (bottleneck units, TF "SAME" padding)."""
    depths = list(config.resnet_depths or [])
    w = config.resnet_width
    return BitConfig(
        num_channels=config.num_channels,
        embedding_size=w,
        hidden_sizes=[4 * w * 2**i for i in range(len(depths))],
        depths=depths,
        layer_type="bottleneck",
        hidden_act="relu",
        global_padding="SAME",
        num_groups=config.num_groups,
        embedding_dynamic_padding=True,  # the max-pool pads as TF's "SAME" (with 0 after a ReLU: the same maximum)
        output_stride=4 * 2 ** max(1, len(depths)),  # above the stride any stage reaches: no dilation
        width_factor=1,
    )


def _jax_resnet(config: HybridViTConfig) -> BitModel:
    """BiT's ResNet with the JAX code's weight standardisation and group-norm epsilon (see the module docstring)."""
    model = BitModel(bit_config(config))
    for module in model.modules():
        if isinstance(module, WeightStandardizedConv2d):
            # Only the forward differs (no new state): swap the class, keeping the module, its padding and names.
            module.__class__ = JaxStdConv2d
            module.eps = config.weight_std_eps
        elif isinstance(module, BitGroupNormActivation):
            module.eps = config.group_norm_eps
    return model


def resize_position_grid(table: torch.Tensor, old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """``(1, 1 + gh * gw, D)`` (CLS row first) on grid ``old`` -> the same on ``new``: the grid part resized
    bilinearly with aligned corners (``vit_jax``'s ``scipy.ndimage.zoom(order=1)``), the CLS row kept."""
    if tuple(old) == tuple(new):
        return table
    cls, grid = table[:, :1], table[:, 1:]
    d = grid.shape[-1]
    grid = grid.reshape(1, old[0], old[1], d).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(new), mode="bilinear", align_corners=True)
    return torch.cat((cls, grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], d)), dim=1)


class HybridViTEmbeddings(nn.Module):
    """ResNet (or none), the patch projection, CLS in front, the position table added.

    Returns ``(tokens (B, 1 + N, D), feature map (B, C, h', w') or None)``: the map the projection read.
    """

    def __init__(self, config: HybridViTConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.backbone = _jax_resnet(config) if config.has_resnet else None
        p = config.patch_size
        self.projection = nn.Conv2d(cnn_channels(config), d, kernel_size=p, stride=p)
        self.native_grid = token_grid(config, (config.image_size, config.image_size))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.position_embeddings = nn.Parameter(torch.zeros(1, 1 + self.native_grid[0] * self.native_grid[1], d))

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        feature_map = None
        x = pixel_values
        if self.backbone is not None:
            x = feature_map = self.backbone(pixel_values=x).last_hidden_state
        x = self.projection(x)
        grid = (x.shape[2], x.shape[3])
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        return x + resize_position_grid(self.position_embeddings, self.native_grid, grid).to(x.dtype), feature_map


@dataclass
class HybridViTModelOutput(BaseModelOutputWithPooling):
    """``last_hidden_state`` (after the final LayerNorm), ``pooler_output`` (the CLS token, through ``pre_logits``
    where the model has one), and with ``output_feature_map=True`` the ResNet's map ``(B, C, h', w')``."""

    feature_map: torch.Tensor | None = None


@dataclass
class HybridViTImageClassifierOutput(ImageClassifierOutput):
    """``logits`` and, with ``output_feature_map=True``, the ResNet's map ``(B, C, h', w')`` (in the graph)."""

    feature_map: torch.Tensor | None = None


class HybridViTPreTrainedModel(PreTrainedModel):
    config_class = HybridViTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _no_split_modules: ClassVar[list[str]] = ["HybridViTEmbeddings", "ViTLayer"]
    _supports_sdpa = True  # the ViT layers' attention interface; vitviz loads with eager attention
    _supports_flash_attn = False
    _supports_flex_attn = False
    _can_record_outputs: ClassVar[dict] = {"hidden_states": ViTLayer, "attentions": ViTAttention}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Random models only (a conversion brings every weight): trunc-normal Linear and projection weights
        (``initializer_range``), zero biases, unit LayerNorms, trunc-normal CLS and position table."""
        if isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and not isinstance(module, JaxStdConv2d)):
            nn.init.trunc_normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, HybridViTEmbeddings):
            nn.init.trunc_normal_(module.cls_token, std=self.config.initializer_range)
            nn.init.trunc_normal_(module.position_embeddings, std=self.config.initializer_range)


class HybridViTModel(HybridViTPreTrainedModel):
    """Embeddings, ViT layers, the final LayerNorm and (where the model has one) the ``pre_logits`` layer."""

    def __init__(self, config: HybridViTConfig) -> None:
        super().__init__(config)
        self.embeddings = HybridViTEmbeddings(config)
        self.layers = nn.ModuleList([ViTLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        rep = config.representation_size
        self.pre_logits = nn.Linear(config.hidden_size, rep) if rep is not None else None
        self.post_init()

    def pooled(self, sequence_output: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` after the final norm -> what the head reads ``(B, D or representation_size)``."""
        cls = sequence_output[:, 0]
        return torch.tanh(self.pre_logits(cls)) if self.pre_logits is not None else cls

    def forward(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | None = None,
        output_feature_map: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HybridViTModelOutput:
        expected = self.embeddings.projection.weight.dtype
        x, feature_map = self.embeddings(pixel_values.to(expected))
        hidden = [x]
        for layer in self.layers:
            x = layer(x)
            hidden.append(x)
        sequence_output = self.layernorm(x)
        return HybridViTModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=self.pooled(sequence_output),
            hidden_states=tuple(hidden) if output_hidden_states else None,
            feature_map=feature_map if output_feature_map else None,
        )


class HybridViTForImageClassification(HybridViTPreTrainedModel):
    """The hybrid with its classifier (the JAX code's ``head``) on the pooled CLS token."""

    def __init__(self, config: HybridViTConfig) -> None:
        super().__init__(config)
        self.vit = HybridViTModel(config)
        width = config.representation_size or config.hidden_size
        self.classifier = nn.Linear(width, config.num_labels)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_feature_map: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HybridViTImageClassifierOutput:
        out = self.vit(pixel_values, output_hidden_states=output_hidden_states, output_feature_map=output_feature_map)
        logits = self.classifier(out.pooler_output)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return HybridViTImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, feature_map=out.feature_map
        )


def _register() -> None:
    with contextlib.suppress(ValueError):  # already registered (a module reload)
        AutoConfig.register(HybridViTConfig.model_type, HybridViTConfig)
    with contextlib.suppress(ValueError):
        AutoModel.register(HybridViTConfig, HybridViTModel)
    with contextlib.suppress(ValueError):
        AutoModelForImageClassification.register(HybridViTConfig, HybridViTForImageClassification)


_register()
