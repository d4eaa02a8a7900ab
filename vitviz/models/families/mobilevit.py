"""MobileViT (Mehta & Rastegari, ICLR 2022) and MobileViT V2 ("Separable Self-attention for Mobile Vision Transformers", 2022).

Both interleave convolutions with transformers. Each ``MobileViTLayer`` (V2:
``MobileViTV2Layer``) that holds a transformer is one stage: it takes the feature
map ``(B, C, h, w)`` after its convolutions, cuts it into patches of ``ph x pw``
feature-map pixels on a grid ``(gh, gw)`` (row-major), and runs its transformer
layers once per offset inside a patch (``A = ph * pw`` offsets):

* **MobileViT** (kind ``unfolded``): for each offset, multi-head softmax attention
  among the ``N = gh * gw`` patches; native ``(A, H, N, N)``. Where ``h`` or ``w`` is
  not a multiple of the patch, ``unfolding`` first resizes the map bilinearly to
  the next multiple, so ``gh = ceil(h / ph)``.
* **MobileViT V2** (kind ``separable``): per offset one softmax over the patches of a
  one-channel "query" projection (the context scores), no query token and one
  "head"; native ``(A, N)``. Its ``unfolding`` is ``torch.nn.functional.unfold``,
  which drops what does not fill a whole patch: ``gh = floor(h / ph)``.

Maps (``docs/definitions.md#mobilevit``): the map of query patch q is the
mean over offsets of that offset's attention row of q, on the block's patch grid;
V2's map is the mean over offsets of the context scores. Between blocks, patches
are folded back into a feature map and mixed by convolutions, so no token-to-token
path crosses a stage boundary (``merge_parents`` is None) and rollout and
class-specific relevance are undefined (``rollout_note``).

The patch grid a block attended on is derived from the input size through the
exact output-size rule of every convolution that precedes the layer's unfolding
(read from the loaded modules, so ``output_stride`` and kernel choices count),
then the layer's own patch size; it is checked against the number of patches and
offsets of the probabilities the block computed, and the capture fails loudly
when they disagree. This needs no hooks besides the sites'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import import_module

import numpy as np
import torch

from vitviz.errors import CaptureError
from vitviz.models.families.base import BlockLayout, Call, Family
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo

__all__ = ["MobileViT", "MobileViTV2", "FAMILIES", "conv_output_size"]


@dataclass(frozen=True)
class _Conv:
    """Per-axis ``(height, width)`` hyperparameters of one ``nn.Conv2d``."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]


@dataclass(frozen=True)
class _Unfold:
    """What decides a layer's patch grid: the convolutions before its unfolding, and its patch size."""

    convs: tuple[_Conv, ...]
    patch: tuple[int, int]  # (ph, pw) feature-map pixels per patch


def conv_output_size(n: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """PyTorch's output length of a convolution along one axis (zero padding)."""
    return (n + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _pair(v) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


class MobileViT(Family):
    """MobileViT (apple/mobilevit-*): multi-head attention among patches, once per offset inside a patch.

    ``tokens``: a block's input and output ``(B * A, N, C)`` rearranged to ``(B, N, A * C)``
    (patches row-major), so a patch's token norm is the L2 norm over all its offsets
    and channels: the norm of the ``ph x pw x C`` block of the (resized, where the
    unfolding resized) feature map it covers.
    """

    name = "MobileViT"
    # MobileViTOutput adds the residual inside the MLP's last module: no MLP point.
    layout = BlockLayout(
        projection=("attention.output.dense",),
        q=("attention.attention.query",),
        k=("attention.attention.key",),
        v=("attention.attention.value",),
        pattern=("attention.attention.dropout",),
    )
    model_types = ("mobilevit",)
    hierarchical = True
    _modeling = "transformers.models.mobilevit.modeling_mobilevit"
    _layer_class = "MobileViTLayer"  # the stage: convolutions, unfolding, transformer, folding
    _block_class = "MobileViTTransformerLayer"  # one attention block
    _attention_class = "MobileViTSelfAttention"
    _probs_attr = "dropout"  # nn.Dropout on the softmax output; the identity in eval mode

    # --- configuration arithmetic (no model at hand: loading, budget) -------------------
    def unfold_patch(self, config) -> int:
        """Feature-map pixels per patch side (``config.patch_size``; transformers supports square patches only)."""
        return super().patch_size(config)

    def stage_strides(self, config) -> tuple[int, ...]:
        """Input pixels per feature-map pixel at each transformer stage's unfolding.

        Stem, layer 2 and layer 3 downsample by 2 each (8); layers 4 and 5 by 2 more
        unless ``output_stride`` dilates them instead (16: layer 5; 8: both), as in
        ``MobileViTEncoder``.
        """
        out = int(getattr(config, "output_stride", 32))
        s4 = 8 if out == 8 else 16
        s5 = s4 if out in (8, 16) else 2 * s4
        return (8, s4, s5)

    def stage_depths(self, config) -> tuple[int, ...]:
        """Transformer layers per stage: transformers hard-codes 2, 4, 3 in ``MobileViTEncoder``."""
        return (2, 4, 3)

    def grid_side(self, feature: int, patch: int) -> int:
        """Patches along one axis of a feature map: ``unfolding`` resizes up to a multiple of the patch."""
        return math.ceil(feature / patch)

    def patch_size(self, config) -> int:
        """Input pixels per patch of the first transformer stage (its feature stride x the unfold patch)."""
        return self.stage_strides(config)[0] * self.unfold_patch(config)

    def size_multiple(self, config) -> int:
        """Inputs that are multiples of this give every stage a feature map the patches tile exactly.

        Each stride-2 convolution (kernel 3, padding 1) maps n to ceil(n / 2), so a
        stage with stride S sees ``ceil(H / S)`` rows; with H a multiple of
        ``max(S) * p`` every stage's map is a multiple of the patch and no stage
        interpolates (MobileViT) or drops pixels (V2).
        """
        return max(self.stage_strides(config)) * self.unfold_patch(config)

    def stage_grids(self, config, hw: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        """Each stage's patch grid at input size ``hw`` (from the config; capture reads the modules)."""
        p = self.unfold_patch(config)
        return tuple(
            (self.grid_side(math.ceil(hw[0] / s), p), self.grid_side(math.ceil(hw[1] / s), p))
            for s in self.stage_strides(config)
        )

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        """Per stage: layers x offsets x heads x N^2 (every block's ``(A, H, N, N)``)."""
        a = self.unfold_patch(config) ** 2
        return sum(
            depth * a * config.num_attention_heads * (gh * gw) ** 2
            for depth, (gh, gw) in zip(self.stage_depths(config), self.stage_grids(config, hw), strict=True)
        )

    # --- what the model is --------------------------------------------------------------
    def rollout_note(self, config) -> str:
        return (
            f"{self.name} folds its patches back into a feature map and mixes them with convolutions between "
            "attention blocks, and each block attends separately for every pixel offset inside a patch: no "
            "token-to-token attention path connects its blocks, so attention rollout and class-specific relevance "
            "are not defined for it."
        )

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        return PositionInfo(
            note=f"{self.name} encodes position through its convolutions (the local convolutions before each "
            "transformer and the fusion after it); it has no position embeddings."
        )

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        """The conv stem's weight ``(D, 3, 3, 3)``: the first filters the image meets."""
        return model.base_model.conv_stem.convolution.weight.detach().float().cpu().numpy()

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray] | None:
        return None  # no token-to-token path crosses MobileViT's convolutions

    # --- capture ------------------------------------------------------------------------
    def _classes(self) -> tuple[type, type, type]:
        mod = import_module(self._modeling)
        return tuple(getattr(mod, n) for n in (self._layer_class, self._block_class, self._attention_class))

    def sites(self, model: torch.nn.Module) -> list[Site]:
        """One site per transformer layer, in forward order; stage = its layer among those with transformers."""
        layer_cls, block_cls, attn_cls = self._classes()
        base = model.base_model
        layers = [m for m in base.modules() if isinstance(m, layer_cls)]
        inside_transformers = {id(m) for layer in layers for m in layer.transformer.modules()}
        sites: list[Site] = []
        stage = 0
        for layer in layers:
            blocks = [m for m in layer.transformer.modules() if isinstance(m, block_cls)]
            if not blocks:
                continue
            unfold = _Unfold(_path_convs(base, layer.transformer, inside_transformers), _layer_patch(layer))
            for block in blocks:
                attn = [m for m in block.modules() if isinstance(m, attn_cls)]
                if len(attn) != 1:
                    raise RuntimeError(
                        f"expected one {self._attention_class} in {type(block).__name__}, found {len(attn)}"
                    )
                probs = getattr(attn[0], self._probs_attr)
                if not isinstance(probs, torch.nn.Dropout):
                    # Only a dropout's output is the probabilities themselves (eval mode).
                    raise RuntimeError(f"{self._attention_class}.{self._probs_attr} is not a dropout layer")
                sites.append(Site(index=len(sites), stage=stage, attention=probs, block=block, extra=unfold))
            stage += 1
        return sites

    def probs(self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output) -> torch.Tensor:
        """The dropout's output: the probabilities the forward multiplies the values with."""
        return output

    def _grid(self, unfold: _Unfold, hw: tuple[int, int]) -> tuple[int, int]:
        sides = []
        for axis in (0, 1):
            n = hw[axis]
            for c in unfold.convs:
                n = conv_output_size(n, c.kernel[axis], c.stride[axis], c.padding[axis], c.dilation[axis])
            sides.append(self.grid_side(n, unfold.patch[axis]))
        return sides[0], sides[1]

    def _check(self, site: Site, grid: tuple[int, int], patches: int, offsets: int, expected_offsets: int) -> None:
        if grid[0] * grid[1] != patches or offsets != expected_offsets:
            raise CaptureError(
                f"block {site.index} of the {self.name} model attended over {patches} patches x {offsets} offsets, "
                f"but its input size gives a {grid[0]} x {grid[1]} grid x {expected_offsets} offsets: "
                "the adapter does not match this model"
            )

    def geometry(
        self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output, raw: torch.Tensor
    ) -> Geometry:
        """``raw`` is ``(B * A, H, N, N)``."""
        unfold: _Unfold = site.extra
        grid = self._grid(unfold, call.input_size)
        a = unfold.patch[0] * unfold.patch[1]
        self._check(site, grid, raw.shape[-1], raw.shape[0] // call.batch, a)
        return Geometry(stage=site.stage, kind="unfolded", num_heads=raw.shape[1], grid=grid, offsets=a)

    def tokens(
        self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Input and output ``(B * A, N, C)`` -> ``(B, N, A * C)``: one row per patch, offsets x channels."""
        inp = args[0] if args else kwargs["hidden_states"]

        def per_patch(x: torch.Tensor) -> torch.Tensor:
            b = call.batch
            return x.reshape(b, -1, *x.shape[1:]).permute(0, 2, 1, 3).reshape(b, x.shape[1], -1)

        return per_patch(inp), per_patch(output)


class MobileViTV2(MobileViT):
    """MobileViT V2 (apple/mobilevitv2-*): separable attention, one context-score vector per offset.

    The context scores are the softmax over the N patches of channel 0 of the ``qkv_proj``
    1 x 1 convolution; the hooked ``attn_dropout`` returns them unchanged in eval mode.
    ``tokens``: a block's input and output ``(B, C, A, N)`` rearranged to ``(B, N, A * C)``,
    so a patch's token norm is the L2 norm over all its offsets and channels.
    Mean attention distance is ``nan`` (there is no query to measure from).
    """

    name = "MobileViT V2"
    # A 1 x 1 convolution projects its one separable "head", and q, k, v come from one convolution.
    layout = BlockLayout(pattern=("attention.attn_dropout",))
    model_types = ("mobilevitv2",)
    _modeling = "transformers.models.mobilevitv2.modeling_mobilevitv2"
    _layer_class = "MobileViTV2Layer"
    _block_class = "MobileViTV2TransformerLayer"
    _attention_class = "MobileViTV2LinearSelfAttention"
    _probs_attr = "attn_dropout"

    def stage_depths(self, config) -> tuple[int, ...]:
        return tuple(int(n) for n in config.n_attn_blocks)

    def grid_side(self, feature: int, patch: int) -> int:
        """``F.unfold`` with stride = kernel keeps whole patches only; the rest of the map is not attended."""
        return feature // patch

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        """Per stage: layers x offsets x N (every block's ``(A, N)`` context scores)."""
        a = self.unfold_patch(config) ** 2
        return sum(
            depth * a * gh * gw
            for depth, (gh, gw) in zip(self.stage_depths(config), self.stage_grids(config, hw), strict=True)
        )

    def rollout_note(self, config) -> str:
        return (
            super().rollout_note(config)
            + " Its separable attention has no query either: a block has no token-to-token matrix to roll out."
        )

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        return PositionInfo(
            note=f"{self.name} encodes position through its convolutions (the depthwise convolution before each "
            "transformer); it has no position embeddings."
        )

    def geometry(
        self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output, raw: torch.Tensor
    ) -> Geometry:
        """``raw`` is ``(B, 1, A, N)``."""
        unfold: _Unfold = site.extra
        grid = self._grid(unfold, call.input_size)
        a = unfold.patch[0] * unfold.patch[1]
        self._check(site, grid, raw.shape[-1], raw.shape[-2], a)
        return Geometry(stage=site.stage, kind="separable", num_heads=1, grid=grid, offsets=a)

    def tokens(
        self, call: Call, site: Site, module: torch.nn.Module, args: tuple, kwargs: dict, output
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Input and output ``(B, C, A, N)`` -> ``(B, N, A * C)``: one row per patch, offsets x channels."""
        inp = args[0] if args else kwargs["hidden_states"]

        def per_patch(x: torch.Tensor) -> torch.Tensor:
            return x.permute(0, 3, 2, 1).reshape(x.shape[0], x.shape[3], -1)

        return per_patch(inp), per_patch(output)


def _layer_patch(layer: torch.nn.Module) -> tuple[int, int]:
    return int(layer.patch_height), int(layer.patch_width)


def _path_convs(base: torch.nn.Module, transformer: torch.nn.Module, skip: set[int]) -> tuple[_Conv, ...]:
    """Every convolution the feature map passes before ``transformer``'s unfolding, in forward order.

    ``transformers`` registers MobileViT's modules in forward order, and apart from
    the skip connections (identity, same size) the path is sequential. Convolutions
    inside transformers (V2's 1 x 1 projections) act on unfolded patches and are left
    out. Stride-1 convolutions keep the size (odd kernels, "same" padding), so in
    practice only the strided ones count, but the rule is applied to all.
    """
    convs = []
    for m in base.modules():
        if m is transformer:
            return tuple(convs)
        if isinstance(m, torch.nn.Conv2d) and id(m) not in skip:
            if m.padding_mode != "zeros" or isinstance(m.padding, str):
                raise RuntimeError(f"unexpected convolution padding {m.padding!r} ({m.padding_mode})")
            convs.append(_Conv(_pair(m.kernel_size), _pair(m.stride), _pair(m.padding), _pair(m.dilation)))
    raise RuntimeError("the transformer is not inside the model")


FAMILIES: tuple[Family, ...] = (MobileViT(), MobileViTV2())
