"""T2T-ViT (Yuan et al. 2021, "Tokens-to-Token ViT"), with the names and shapes of yitu-opensource/T2T-ViT.

The model, as the authors' ``models/t2t_vit.py`` computes it (``docs/families.md#t2t-vit``):

1. **Soft split 0**: ``Unfold(7, stride 4, padding 2)`` turns the image into overlapping 7 x 7 patches:
   a 56 x 56 grid of tokens of width ``3 * 7 * 7 = 147`` at 224 px (Unfold orders the features channel,
   kernel row, kernel column).
2. **Tokens-to-token layer 1** on that grid (``tokens_to_token.attention1``), then the tokens are put back
   on their grid and **soft split 1**, ``Unfold(3, 2, 1)``, gives 28 x 28 tokens of width ``64 * 9 = 576``;
   **layer 2** (``attention2``), **soft split 2** -> 14 x 14 tokens, ``project`` to the backbone width.
   A tokens-to-token layer is either

   * a *token transformer* (``T2t_vit_t_*``): one head, ``qkv`` without bias from the input width to
     3 x 64, softmax attention with scale ``(input width) ** -0.5`` (147 ** -0.5, 576 ** -0.5, the
     authors' ``head_dim`` with one head) applied to q before the product, the residual through ``v``
     (the input has another width), then ``x + mlp(norm2(x))``;
   * a *performer* (``T2t_vit_*``): ``kqv`` (with bias) split in the order k, q, v; positive random
     features ``phi(x) = exp(w x - |x|^2 / 2) / sqrt(m)`` with the m = 32 random vectors ``w`` stored in the
     state dict (never redrawn); ``y = phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k_j) + 1e-8)``, residual
     ``v + proj(y)``, then ``x + mlp(norm2(x))`` with the MLP as ``mlp.0``, ``mlp.2``. No attention matrix
     is ever formed.

3. **Backbone**: CLS token at index 0, a sinusoidal ``pos_embed`` (with a CLS slot) kept in the state dict
   (loaded, not recomputed: recomputing it in float32 differs by about 1e-5), ``depth`` pre-norm blocks,
   the prediction is ``head(norm(x)[:, 0])``.

LayerNorm eps is PyTorch's 1e-5 everywhere. The backbone's attention scale is the config field
``qk_scale``; None (the default) means ``head_dim ** -0.5``, what the authors' training and evaluation
script (``main.py``, which builds models with ``pretrained=False``) uses and what their released
accuracies were measured with. Their model constructors switch to ``embed_dim ** -0.5`` under
``pretrained=True`` (their issue #62 asks which is right; unanswered): set ``qk_scale`` to follow that.

The position table is built for one input size, so the model runs at ``image_size`` only, and on square
inputs only (the authors' forward reshapes tokens to ``sqrt(N) x sqrt(N)``); anything else is refused
with a message. Released checkpoints (``CONVERTERS``) are ImageNet-1k at 224 px (T2T-ViT-14 also at 384 px),
mean/std of ImageNet, bicubic resizing.
"""

from __future__ import annotations

import contextlib
import math
from functools import partial

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForImageClassification, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import ImageClassifierOutput

from vitviz.zoo.convert import Converter

__all__ = ["T2TViTConfig", "T2TViTForImageClassification", "CONVERTERS", "soft_split_grids", "sinusoid_table"]

# (kernel, stride, padding) of the three soft splits: fixed by the architecture, not configurable.
SOFT_SPLITS = ((7, 4, 2), (3, 2, 1), (3, 2, 1))


def soft_split_grids(side: int) -> tuple[int, int, int]:
    """Grid sides after each soft split for a square input of ``side`` pixels (56, 28, 14 at 224)."""
    sides = []
    for k, s, p in SOFT_SPLITS:
        side = (side + 2 * p - k) // s + 1
        sides.append(side)
    return tuple(sides)


def sinusoid_table(n_position: int, d_hid: int) -> torch.Tensor:
    """The authors' ``get_sinusoid_encoding``: ``(1, n_position, d_hid)``, computed in float64, then float32."""
    pos = np.arange(n_position, dtype=np.float64)[:, None]
    table = pos / np.power(10000, 2 * (np.arange(d_hid) // 2) / d_hid)
    table[:, 0::2] = np.sin(table[:, 0::2])
    table[:, 1::2] = np.cos(table[:, 1::2])
    return torch.tensor(table, dtype=torch.float32).unsqueeze(0)


class T2TViTConfig(PretrainedConfig):
    """T2T-ViT: ``tokens_type`` ``performer`` (T2T-ViT-N) or ``transformer`` (T2T-ViT_t-N), backbone sizes.

    ``qk_scale``: the backbone's attention scale; None = ``head_dim ** -0.5`` (the authors' training and
    evaluation path; see the module docstring).
    """

    model_type = "t2t"

    image_size: int = 224
    num_channels: int = 3
    tokens_type: str = "performer"
    token_dim: int = 64
    kernel_ratio: float = 0.5
    embed_dim: int = 384
    depth: int = 14
    num_heads: int = 6
    mlp_ratio: float = 3.0
    qkv_bias: bool = False
    qk_scale: float | None = None
    initializer_range: float = 0.02


# --- tokens-to-token layers -------------------------------------------------------------------------


class Mlp(nn.Module):
    """``fc2(gelu(fc1(x)))`` (exact GELU), as timm's Mlp the authors copied."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class TokenAttention(nn.Module):
    """The token transformer's attention: one head, width ``dim`` -> ``in_dim``, residual through v.

    The probabilities pass through ``attn_drop`` (identity in eval mode): its output is the
    tensor multiplied with v, where vitviz reads them.
    """

    def __init__(self, dim: int, in_dim: int, num_heads: int = 1) -> None:
        super().__init__()
        self.num_heads, self.in_dim = num_heads, in_dim
        self.scale = (dim // num_heads) ** -0.5  # the *input* width: 147 ** -0.5, 576 ** -0.5
        self.qkv = nn.Linear(dim, in_dim * 3, bias=False)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(in_dim, in_dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.in_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # scale on q first, as the authors
        attn = self.attn_drop(attn)
        y = self.proj_drop(self.proj((attn @ v).transpose(1, 2).reshape(b, n, self.in_dim)))
        return v.squeeze(1) + y  # the input has another width: the residual goes through v


class TokenTransformer(nn.Module):
    """``x = attn(norm1(x)); x = x + mlp(norm2(x))`` (the authors' ``Token_transformer``, mlp_ratio 1)."""

    def __init__(self, dim: int, in_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = TokenAttention(dim, in_dim)
        self.norm2 = nn.LayerNorm(in_dim)
        self.mlp = Mlp(in_dim, in_dim, in_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class KernelFeatures(nn.Module):
    """A no-op on ``(phi(q), phi(k))`` (no parameters): it shows the performer's random features to hooks.

    The performer never forms an attention matrix; vitviz forms the kernel's implied one from
    these very tensors (:mod:`vitviz.models.families.t2t`).
    """

    def forward(self, qp: torch.Tensor, kp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return qp, kp


class TokenPerformer(nn.Module):
    """The authors' ``Token_performer`` (one head, kernel_ratio 0.5): linear attention by random features."""

    def __init__(self, dim: int, in_dim: int, kernel_ratio: float = 0.5) -> None:
        super().__init__()
        self.emb = in_dim
        self.kqv = nn.Linear(dim, 3 * self.emb)
        self.dp = nn.Dropout(0.0)
        self.proj = nn.Linear(self.emb, self.emb)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(self.emb)
        self.epsilon = 1e-8
        self.mlp = nn.Sequential(nn.Linear(self.emb, self.emb), nn.GELU(), nn.Linear(self.emb, self.emb), nn.Dropout(0))
        self.m = int(self.emb * kernel_ratio)
        # Stored in the state dict and never redrawn: the features are part of the trained model.
        self.w = nn.Parameter(torch.empty(self.m, self.emb), requires_grad=False)
        self.features = KernelFeatures()

    def prm_exp(self, x: torch.Tensor) -> torch.Tensor:
        """``exp(w x - |x|^2 / 2) / sqrt(m)``: ``(B, T, emb)`` -> ``(B, T, m)``."""
        xd = (x * x).sum(dim=-1, keepdim=True).repeat(1, 1, self.m) / 2
        wtx = torch.einsum("bti,mi->btm", x.float(), self.w.float())  # .float(): a no-op in float32, lets bf16 run
        return torch.exp(wtx - xd) / math.sqrt(self.m)

    def single_attn(self, x: torch.Tensor) -> torch.Tensor:
        k, q, v = torch.split(self.kqv(x), self.emb, dim=-1)  # k, q, v: the authors' order
        qp, kp = self.features(self.prm_exp(q), self.prm_exp(k))
        d = torch.einsum("bti,bi->bt", qp, kp.sum(dim=1)).unsqueeze(dim=2)
        kptv = torch.einsum("bin,bim->bnm", v.float(), kp)
        y = torch.einsum("bti,bni->btn", qp, kptv) / (d.repeat(1, 1, self.emb) + self.epsilon)
        return v + self.dp(self.proj(y.to(v.dtype)))  # features are float32 (as the authors'); back to the model's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.single_attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class T2TModule(nn.Module):
    """Soft splits and tokens-to-token layers: image ``(B, C, S, S)`` -> ``(B, (S/16)^2, embed_dim)`` tokens."""

    def __init__(self, config: T2TViTConfig) -> None:
        super().__init__()
        c, t = config.num_channels, config.token_dim
        (k0, s0, p0), (k1, s1, p1), (k2, s2, p2) = SOFT_SPLITS
        self.soft_split0 = nn.Unfold(kernel_size=(k0, k0), stride=(s0, s0), padding=(p0, p0))
        self.soft_split1 = nn.Unfold(kernel_size=(k1, k1), stride=(s1, s1), padding=(p1, p1))
        self.soft_split2 = nn.Unfold(kernel_size=(k2, k2), stride=(s2, s2), padding=(p2, p2))
        if config.tokens_type == "transformer":
            layer = TokenTransformer
        elif config.tokens_type == "performer":
            layer = partial(TokenPerformer, kernel_ratio=config.kernel_ratio)
        else:
            raise ValueError(f"tokens_type must be 'performer' or 'transformer', not {config.tokens_type!r}")
        self.attention1 = layer(c * k0 * k0, t)
        self.attention2 = layer(t * k1 * k1, t)
        self.project = nn.Linear(t * k2 * k2, config.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g0, g1, _ = soft_split_grids(x.shape[-1])
        x = self.soft_split0(x).transpose(1, 2)
        x = self.attention1(x)
        x = x.transpose(1, 2).reshape(x.shape[0], x.shape[2], g0, g0)
        x = self.soft_split1(x).transpose(1, 2)
        x = self.attention2(x)
        x = x.transpose(1, 2).reshape(x.shape[0], x.shape[2], g1, g1)
        x = self.soft_split2(x).transpose(1, 2)
        return self.project(x)


# --- backbone ------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head self-attention ``softmax(q k^T * scale)``; the probabilities pass through ``attn_drop``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, qk_scale: float | None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = self.attn_drop(((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1))
        return self.proj_drop(self.proj((attn @ v).transpose(1, 2).reshape(b, n, c)))


class Block(nn.Module):
    """Pre-norm block ``x + attn(norm1(x))``, ``x + mlp(norm2(x))``."""

    def __init__(self, config: T2TViTConfig) -> None:
        super().__init__()
        d = config.embed_dim
        self.norm1 = nn.LayerNorm(d)
        self.attn = Attention(d, config.num_heads, config.qkv_bias, config.qk_scale)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = Mlp(d, int(d * config.mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class T2TViTPreTrainedModel(PreTrainedModel):
    config_class = T2TViTConfig
    base_model_prefix = "t2t"  # no such attribute: ``base_model`` is the model itself (keys are the authors')
    main_input_name = "pixel_values"
    _supports_sdpa = False  # eager attention only: vitviz reads the probabilities
    _supports_flash_attn = False
    _supports_flex_attn = False

    def _init_weights(self, module: nn.Module) -> None:
        """The authors' init: trunc-normal(0.02) Linear weights, zero biases, unit LayerNorms, fixed tables."""
        if isinstance(module, nn.Linear):
            init.trunc_normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, TokenPerformer):
            w = nn.init.orthogonal_(torch.empty_like(module.w, device="cpu")) * math.sqrt(module.m)
            init.copy_(module.w, w)
        elif isinstance(module, T2TViTForImageClassification):
            init.trunc_normal_(module.cls_token, std=self.config.initializer_range)
            init.copy_(module.pos_embed, sinusoid_table(*module.pos_embed.shape[1:]))


class T2TViTForImageClassification(T2TViTPreTrainedModel):
    """T2T-ViT with its linear head; ``state_dict()`` keys are the authors' (conversion is a straight copy)."""

    def __init__(self, config: T2TViTConfig) -> None:
        super().__init__(config)
        d = config.embed_dim
        self.tokens_to_token = T2TModule(config)
        side = soft_split_grids(config.image_size)[-1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(sinusoid_table(side * side + 1, d), requires_grad=False)
        self.pos_drop = nn.Dropout(0.0)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @property
    def classifier(self) -> nn.Module:
        """The head under the name vitviz (and ``transformers`` image classifiers) look for."""
        return self.head

    def check_input(self, pixel_values: torch.Tensor) -> None:
        """Refuse inputs the position table does not fit: non-square, or another size than ``image_size``."""
        if pixel_values.dim() != 4:
            raise ValueError(f"T2T-ViT expects pixel values (B, C, H, W), got shape {tuple(pixel_values.shape)}")
        h, w = pixel_values.shape[-2:]
        if h != w:
            raise ValueError(
                f"T2T-ViT runs on square inputs only (its tokens are reshaped to a square grid); got {h} x {w}."
            )
        side = soft_split_grids(int(h))[-1]
        if side * side + 1 != self.pos_embed.shape[1]:
            n = self.config.image_size
            raise ValueError(
                f"T2T-ViT runs at its configured input size {n} x {n} only (its position table has "
                f"{self.pos_embed.shape[1] - 1} patch rows); got {h} x {w}."
            )

    def forward(
        self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None, **kwargs
    ) -> ImageClassifierOutput:
        self.check_input(pixel_values)
        x = self.tokens_to_token(pixel_values)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(x + self.pos_embed.to(x.dtype))  # a no-op in float32; the table may stay float32
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.norm(x)[:, 0])
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return ImageClassifierOutput(loss=loss, logits=logits)


def _register() -> None:
    with contextlib.suppress(ValueError):  # already registered (a second call)
        AutoConfig.register(T2TViTConfig.model_type, T2TViTConfig)
    with contextlib.suppress(ValueError):
        AutoModelForImageClassification.register(T2TViTConfig, T2TViTForImageClassification)


_register()


# --- official checkpoints --------------------------------------------------------------------------------

# name -> (tokens_type, embed_dim, depth, num_heads, mlp_ratio, image size): the authors' constructors of
# the checkpoints their README links. ``t2t_vit_14_384`` is our name for their "T2T-ViT-14, 384"
# (``t2t_vit_14(img_size=384)``: a 24 x 24 + 1 position table). Not listed: "T2T-ViT-24, Token Labeling",
# trained with another code base (zihangJiang/TokenLabeling) whose checkpoint layout was not checked here,
# and ``t2t_vit_14_resnext`` / ``t2t_vit_14_wide``, which have no released weights.
_SIZES = {
    "t2t_vit_7": ("performer", 256, 7, 4, 2.0, 224),
    "t2t_vit_10": ("performer", 256, 10, 4, 2.0, 224),
    "t2t_vit_12": ("performer", 256, 12, 4, 2.0, 224),
    "t2t_vit_14": ("performer", 384, 14, 6, 3.0, 224),
    "t2t_vit_19": ("performer", 448, 19, 7, 3.0, 224),
    "t2t_vit_24": ("performer", 512, 24, 8, 3.0, 224),
    "t2t_vit_t_14": ("transformer", 384, 14, 6, 3.0, 224),
    "t2t_vit_t_19": ("transformer", 448, 19, 7, 3.0, 224),
    "t2t_vit_t_24": ("transformer", 512, 24, 8, 3.0, 224),
    "t2t_vit_14_384": ("performer", 384, 14, 6, 3.0, 384),
}


def _config(tokens_type: str, embed_dim: int, depth: int, num_heads: int, mlp_ratio: float, size: int, **kw):
    return T2TViTConfig(
        tokens_type=tokens_type,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=mlp_ratio,
        image_size=size,
        **kw,
    )


CONVERTERS: dict[str, Converter] = {
    name: Converter(
        name=name,
        config=partial(_config, *spec),
        model_class=T2TViTForImageClassification,
        classifier_key="head.weight",
        image_size=(spec[-1], spec[-1]),
        notes={"tokens_type": spec[0], "dataset": "imagenet"},
        shortest_edge=math.floor(spec[-1] / 0.9),  # the authors' timm default_cfg: crop_pct 0.9, bicubic
    )
    for name, spec in _SIZES.items()
}
