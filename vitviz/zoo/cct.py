"""CCT, the Compact Convolutional Transformer (Hassani et al. 2021, "Escaping the Big Data Paradigm with Compact
Transformers"), as a ``transformers`` model with the parameter names of the authors' code.

Written from the paper and checked against SHI-Labs/Compact-Transformers (``src/cct.py``,
``src/utils/transformers.py``, ``src/utils/tokenizer.py``): the official state-dict keys are this
model's own ``state_dict()`` keys, so a conversion is a straight copy.

* **Tokenizer** (``tokenizer.conv_layers.i``): per layer a Conv2d without bias (kernel k, stride
  ``max(1, k // 2 - 1)``, padding ``max(1, k // 2)``), ReLU, MaxPool2d(3, 2, 1); 64 channels between
  two layers, ``embedding_dim`` after the last. The feature map is flattened row-major into N = gh * gw
  tokens. There is no CLS token.
* **Position table** ``classifier.positional_emb`` ``(1, N, D)``: one learnable row per token of the
  native grid (``image_size``), no CLS slot. At another input size it is resized bilinearly to the token
  grid (``F.interpolate``, ``align_corners=False``), as the authors' loader resizes it for another
  ``img_size``.
* **Block** (``classifier.blocks.l``), with the authors' unusual norm placement:
  ``x = x + attn(pre_norm(x)); x = norm1(x); x = x + linear2(gelu(linear1(x)))``: the normalised x is
  both the MLP input and its residual, and there is no second norm. Attention: ``qkv`` without bias,
  ``proj`` with bias, scale ``head_dim ** -0.5``, exact GELU, LayerNorm eps 1e-5.
* **Sequence pooling**: after the final ``norm``, ``attention_pool`` (Linear(D, 1)) scores each token,
  ``w = softmax over the tokens`` of the scores, and ``fc(sum_t w_t x_t)`` gives the logits. ``w`` is
  the model's one "CLS-like" map (a single map, not per head); the pooling module returns it as the
  very tensor it multiplies with the tokens.

Dropout and stochastic depth are left out: they are the identity at inference.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForImageClassification, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import ImageClassifierOutput

from vitviz.zoo.convert import Converter

__all__ = ["CctConfig", "CctForImageClassification", "CONVERTERS", "token_grid", "total_stride"]


class CctConfig(PretrainedConfig):
    """A CCT (``cct_<layers>_<k>x<conv layers>_<size>``). ``stride`` / ``padding`` None: the authors' defaults
    ``max(1, k // 2 - 1)`` / ``max(1, k // 2)``."""

    model_type = "cct"
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "embedding_dim",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_heads",
    }

    def __init__(
        self,
        image_size: int = 224,
        num_channels: int = 3,
        embedding_dim: int = 384,
        num_layers: int = 14,
        num_heads: int = 6,
        mlp_ratio: float = 3.0,
        n_conv_layers: int = 2,
        kernel_size: int = 7,
        stride: int | None = None,
        padding: int | None = None,
        pooling_kernel_size: int = 3,
        pooling_stride: int = 2,
        pooling_padding: int = 1,
        in_planes: int = 64,
        layer_norm_eps: float = 1e-5,
        position_note: str = "",
        **kwargs,
    ) -> None:
        self.image_size = int(image_size)
        self.num_channels = num_channels
        self.embedding_dim = embedding_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.mlp_ratio = float(mlp_ratio)
        self.n_conv_layers = n_conv_layers
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else max(1, kernel_size // 2 - 1)
        self.padding = padding if padding is not None else max(1, kernel_size // 2)
        self.pooling_kernel_size = pooling_kernel_size
        self.pooling_stride = pooling_stride
        self.pooling_padding = pooling_padding
        self.in_planes = in_planes
        self.layer_norm_eps = layer_norm_eps
        self.position_note = position_note  # shown beside the position table (what conversion did with it)
        super().__init__(**kwargs)


def token_grid(config: CctConfig, hw: tuple[int, int]) -> tuple[int, int]:
    """The tokenizer's output grid (gh, gw) for an input of ``hw`` pixels (conv and max-pool arithmetic)."""

    def side(n: int) -> int:
        for _ in range(config.n_conv_layers):
            n = (n + 2 * config.padding - config.kernel_size) // config.stride + 1
            n = (n + 2 * config.pooling_padding - config.pooling_kernel_size) // config.pooling_stride + 1
        return n

    return side(int(hw[0])), side(int(hw[1]))


def total_stride(config: CctConfig) -> int:
    """Input pixels per token along each axis: the product of the conv and pooling strides."""
    return (config.stride * config.pooling_stride) ** config.n_conv_layers


class CctTokenizer(nn.Module):
    """``conv_layers.i = Sequential(Conv2d(bias=False), ReLU, MaxPool2d)``; returns tokens ``(B, N, D)`` and the grid."""

    def __init__(self, config: CctConfig) -> None:
        super().__init__()
        widths = [config.num_channels] + [config.in_planes] * (config.n_conv_layers - 1) + [config.embedding_dim]
        k, s, p = config.kernel_size, config.stride, config.padding
        self.conv_layers = nn.Sequential(
            *[
                nn.Sequential(
                    nn.Conv2d(widths[i], widths[i + 1], kernel_size=k, stride=s, padding=p, bias=False),
                    nn.ReLU(),
                    nn.MaxPool2d(config.pooling_kernel_size, config.pooling_stride, config.pooling_padding),
                )
                for i in range(config.n_conv_layers)
            ]
        )

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.conv_layers(pixel_values)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class CctAttention(nn.Module):
    """Multi-head self-attention; returns ``(output, probabilities)``, the probabilities as multiplied with v."""

    def __init__(self, config: CctConfig) -> None:
        super().__init__()
        dim = config.embedding_dim
        self.num_heads = config.num_heads
        self.scale = (dim // config.num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, c = hidden_states.shape
        qkv = self.qkv(hidden_states).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out), attn


class CctBlock(nn.Module):
    """``x = x + attn(pre_norm(x)); x = norm1(x); x = x + linear2(gelu(linear1(x)))`` (the authors' order)."""

    def __init__(self, config: CctConfig) -> None:
        super().__init__()
        dim, eps = config.embedding_dim, config.layer_norm_eps
        self.pre_norm = nn.LayerNorm(dim, eps=eps)
        self.self_attn = CctAttention(config)
        self.linear1 = nn.Linear(dim, int(dim * config.mlp_ratio))
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.linear2 = nn.Linear(int(dim * config.mlp_ratio), dim)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn_out, attn = self.self_attn(self.pre_norm(hidden_states))
        x = self.norm1(hidden_states + attn_out)
        return x + self.linear2(F.gelu(self.linear1(x))), attn


class CctSequencePool(nn.Module):
    """Sequence pooling: ``w = softmax(scores)`` over the tokens, ``pooled = w^T x``; returns ``(pooled, w)``.

    ``scores`` ``(B, N, 1)`` come from ``attention_pool``; ``w`` ``(B, N, 1)`` is the tensor multiplied with
    the tokens (no parameters here: the official key ``classifier.attention_pool`` stays where it was).
    """

    def forward(self, hidden_states: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights = F.softmax(scores, dim=1)
        return torch.matmul(weights.transpose(-1, -2), hidden_states).squeeze(-2), weights


class CctClassifier(nn.Module):
    """The authors' ``TransformerClassifier`` with ``seq_pool=True``: position table, blocks, norm, pooling, fc."""

    def __init__(self, config: CctConfig) -> None:
        super().__init__()
        dim = config.embedding_dim
        gh, gw = token_grid(config, (config.image_size, config.image_size))
        self.native_grid = (gh, gw)
        self.positional_emb = nn.Parameter(torch.zeros(1, gh * gw, dim))
        self.blocks = nn.ModuleList([CctBlock(config) for _ in range(config.num_layers)])
        self.norm = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.attention_pool = nn.Linear(dim, 1)
        self.pooling = CctSequencePool()
        self.fc = nn.Linear(dim, config.num_labels)

    def position_table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The table for a token grid: the native one, or resized bilinearly (``align_corners=False``)."""
        if tuple(grid) == self.native_grid:
            return self.positional_emb
        gh, gw = self.native_grid
        table = self.positional_emb.reshape(1, gh, gw, -1).permute(0, 3, 1, 2)
        table = F.interpolate(table, size=tuple(grid), mode="bilinear", align_corners=False)
        return table.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int], output_attentions: bool, output_hidden: bool):
        x = tokens + self.position_table(grid)
        hidden, attentions = [x], []
        for block in self.blocks:
            x, attn = block(x)
            hidden.append(x)
            attentions.append(attn)
        x = self.norm(x)
        pooled, _ = self.pooling(x, self.attention_pool(x))
        return (
            self.fc(pooled),
            tuple(hidden) if output_hidden else None,
            tuple(attentions) if output_attentions else None,
        )


class CctPreTrainedModel(PreTrainedModel):
    config_class = CctConfig
    base_model_prefix = "cct"  # no submodule has this name: the official keys have no prefix
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _no_split_modules: ClassVar[list[str]] = ["CctBlock"]
    # Attention is always computed explicitly here (the probabilities are what vitviz shows): no SDPA/flash.
    _supports_sdpa = False
    _supports_flash_attn = False
    _supports_flex_attn = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The authors' initialisation: trunc-normal Linear (std 0.02, zero bias), Kaiming-normal convolutions,
        unit LayerNorms, trunc-normal position table (std 0.2)."""
        if isinstance(module, nn.Linear):
            init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Conv2d):
            init.kaiming_normal_(module.weight)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, CctClassifier):
            init.trunc_normal_(module.positional_emb, std=0.2)


class CctForImageClassification(CctPreTrainedModel):
    """Tokenizer, then the classifier (blocks, sequence pooling, ``fc``): ``ImageClassifierOutput``."""

    def __init__(self, config: CctConfig) -> None:
        super().__init__(config)
        self.tokenizer = CctTokenizer(config)
        self.classifier = CctClassifier(config)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ImageClassifierOutput:
        tokens, grid = self.tokenizer(pixel_values)
        logits, hidden, attentions = self.classifier(tokens, grid, bool(output_attentions), bool(output_hidden_states))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels)
        return ImageClassifierOutput(loss=loss, logits=logits, hidden_states=hidden, attentions=attentions)


def _register() -> None:
    AutoConfig.register(CctConfig.model_type, CctConfig, exist_ok=True)
    AutoModelForImageClassification.register(CctConfig, CctForImageClassification, exist_ok=True)


_register()

# --- official checkpoints (SHI-Labs/Compact-Transformers, README and src/cct.py) ---------------------------

_SIZES = {  # cct_<n>: the authors' cct_7 / cct_14 constructors
    7: dict(num_layers=7, num_heads=4, mlp_ratio=2.0, embedding_dim=256),
    14: dict(num_layers=14, num_heads=6, mlp_ratio=3.0, embedding_dim=384),
}
_DATA = {  # the configs/datasets/*.yml of the authors
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    "flowers102": ((0.4353, 0.3773, 0.2872), (0.2966, 0.2455, 0.2698)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
_SINE_NOTE = (
    "The checkpoint's position table is used as stored. The authors' `_sine` constructors drop their "
    "positional_embedding argument (the model gets a learnable table) and their loader then replaces the "
    "checkpoint's table by that freshly initialised one; vitviz keeps the trained table instead."
)


def _converter(name: str, layers: int, kernel: int, convs: int, size: int, data: str) -> Converter:
    sine = "_sine" in name
    notes = {"dataset": data, **({"positional_emb": _SINE_NOTE} if sine else {})}

    def config(num_labels: int = 1000) -> CctConfig:
        return CctConfig(
            image_size=size,
            kernel_size=kernel,
            n_conv_layers=convs,
            num_labels=num_labels,
            position_note=_SINE_NOTE if sine else "",
            **_SIZES[layers],
        )

    mean, std = _DATA[data]
    return Converter(
        name=name,
        config=config,
        model_class=CctForImageClassification,
        classifier_key="classifier.fc.weight",
        image_size=(size, size),
        mean=mean,
        std=std,
        notes=notes,
        # the authors' evaluation (timm's, their configs' crop_pct): 0.9 on ImageNet, 1.0 on CIFAR and Flowers
        shortest_edge=math.floor(size / 0.9) if data == "imagenet" else None,
    )


# No checkpoint was released for cct_7_7x2_224 (only its _sine twin), nor for cct_2/4/6 and the 3x2 variants.
CONVERTERS: dict[str, Converter] = {
    c.name: c
    for c in (
        _converter("cct_7_3x1_32", 7, 3, 1, 32, "cifar10"),
        _converter("cct_7_3x1_32_sine", 7, 3, 1, 32, "cifar10"),
        _converter("cct_7_3x1_32_c100", 7, 3, 1, 32, "cifar100"),
        _converter("cct_7_3x1_32_sine_c100", 7, 3, 1, 32, "cifar100"),
        _converter("cct_7_7x2_224_sine", 7, 7, 2, 224, "flowers102"),
        _converter("cct_14_7x2_224", 14, 7, 2, 224, "imagenet"),
        _converter("cct_14_7x2_384", 14, 7, 2, 384, "imagenet"),
        _converter("cct_14_7x2_384_fl", 14, 7, 2, 384, "flowers102"),
    )
}
