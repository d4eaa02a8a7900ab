"""Image towers of contrastive image-text models: CLIP, SigLIP and SigLIP 2 (NaFlex).

Model types: ``clip`` (``CLIPModel``, both towers; ``CLIPForImageClassification``
shares the type), ``clip_vision_model`` (``CLIPVisionModel``), ``siglip``
(``SiglipModel``; fixed-size SigLIP 2 checkpoints are ``siglip`` too),
``siglip_vision_model``, ``siglip2`` (``Siglip2Model``: always NaFlex in
``transformers``) and ``siglip2_vision_model``. Only the image tower runs: for a
two-tower model ``forward`` calls ``model.vision_model`` and ``image_embedding``
returns what the model compares with text embeddings (the text side is not here).

Token layouts (one stage, every encoder block ``global`` attention):

* **CLIP**: CLS, then the patches; a pre-norm (``pre_layrnorm``) before the
  encoder; absolute position embeddings for CLS + patches (the CLS row is dropped
  from the position table shown). The prediction reads the CLS token
  (``readout = "cls"``); the image embedding is ``visual_projection`` of the
  post-normed CLS state (``CLIPModel.get_image_features``).
* **SigLIP**: the patches only, no CLS; absolute position embeddings for the
  patches. After the encoder and ``post_layernorm``, an attention-pooling head
  (``SiglipMultiheadAttentionPoolingHead``: a learned probe query, one
  ``torch.nn.MultiheadAttention`` over the tokens, a LayerNorm and an MLP) makes the
  image embedding, ``pooler_output`` (``SiglipModel.get_image_features``).
* **SigLIP 2 NaFlex**: the image is resized to an aspect-ratio grid within a patch
  budget, patchified, and padded with zero patches to the budget;
  ``spatial_shapes`` gives the grid, ``pixel_attention_mask`` the real patches.
  The padding patches are ``trailing`` tokens after the grid (masked as keys in
  every block and in the pooling head): left out of every map and reported as a
  padding share. The position table (a square grid) is resized per image.

Maps:

* Encoder block l, head h: the post-softmax attention ``A[l, h]`` (``(T, T)``, rows
  queries, columns keys) exactly as the block multiplied it with the values (eager
  attention). A query's map is its row over the patch keys on the grid.
* **The global map of SigLIP (no CLS token) is the pooling head's own attention,
  per head**: for head h, ``a_h = softmax(q_h k_h^T / sqrt(d))`` over the keys,
  where ``q_h`` is head h's slice of ``W_q probe + b_q`` and ``k_h`` of
  ``W_k x + b_k`` for every final token x (``in_proj_weight`` / ``in_proj_bias``
  of the head's ``nn.MultiheadAttention``; padding keys masked for NaFlex), ``d``
  the head width. It is recorded as a block of kind ``pool`` with native shape
  ``(H, Tk)``; rollout and relevance start from its row (``readout = "head"``).
  ``nn.MultiheadAttention`` returns these weights averaged over heads by default:
  a forward pre-hook installed once (at ``sites()``, i.e. at load) asks the head's
  call for ``need_weights=True, average_attn_weights=False``. That changes only the
  weights the head discards (it uses ``[0]``); torch then returns
  ``weights.view(B, H, 1, Tk)``, a view made *after* the product with the values,
  so the adapter records the view's base, the ``(B * H, 1, Tk)`` tensor the head
  multiplied with the values, and gradients pair with it (in inference mode torch
  keeps no base, and the view's values are the same numbers).
* Classifiers (``*ForImageClassification``) mean-pool the final tokens (CLIP: the
  patches without CLS; SigLIP 2: the real patches): their readout is the pooled
  query and their pooling head, which does not feed the logits, is not recorded.
  (``CLIPForImageClassification`` keeps its CLS token, and rollout and relevance
  start from CLS wherever one exists unless asked for the pooled query.)
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch

from vitviz.models.families.base import FUNCTION, BlockLayout, Call, Family
from vitviz.models.families.vit import recorded_classes
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, PositionTable

__all__ = [
    "ContrastiveTower",
    "Clip",
    "Siglip",
    "Siglip2",
    "FAMILIES",
    "vision_config",
    "vision_tower",
    "pooling_head",
    "naflex_size",
    "patchify",
]

_POOL = "pool"
_ENCODER = "encoder"
_PER_HEAD_ATTR = "_vitviz_per_head_weights"


def vision_config(config) -> Any:
    """The image tower's config: ``config.vision_config`` of a two-tower (or classifier) config, else the config."""
    sub = getattr(config, "vision_config", None)
    return sub if sub is not None else config


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The image tower: ``model.vision_model`` where the model wraps one, else the model itself."""
    tower = getattr(model, "vision_model", None)
    return tower if isinstance(tower, torch.nn.Module) else model


def is_classifier(config) -> bool:
    """A ``*ForImageClassification`` checkpoint (what ``load_model`` loads with a classifier)."""
    return any("ForImageClassification" in a for a in (getattr(config, "architectures", None) or []))


def pooling_head(tower: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.MultiheadAttention] | None:
    """The tower's attention-pooling head and its ``nn.MultiheadAttention``, or None where it has none."""
    found = [
        (parent, child)
        for parent in tower.modules()
        for child in parent.children()
        if isinstance(child, torch.nn.MultiheadAttention)
    ]
    if not found:
        return None
    if len(found) > 1:
        raise RuntimeError(f"expected at most one attention-pooling head, found {len(found)}")
    return found[0]


def _per_head_weights(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: ask ``nn.MultiheadAttention`` for per-head weights (the head discards them either way)."""
    return args, {**kwargs, "need_weights": True, "average_attn_weights": False}


def naflex_size(image_hw: tuple[int, int], patch_size: int, max_num_patches: int, eps: float = 1e-5) -> tuple[int, int]:
    """The SigLIP 2 image processor's resize rule (``get_image_size_for_max_num_patches``), mirrored.

    Binary search over a scale s in ``[eps / 10, 100]`` until the interval is shorter
    than ``eps``: each side becomes ``max(p, ceil(side * s / p) * p)``; the largest s
    whose grid has at most ``max_num_patches`` patches wins. Returns ``(h, w)`` pixels,
    multiples of ``patch_size``.
    """
    height, width = image_hw

    def side(scale: float, size: int) -> int:
        return int(max(patch_size, math.ceil(size * scale / patch_size) * patch_size))

    lo, hi = eps / 10, 100.0
    while (hi - lo) >= eps:
        mid = (lo + hi) / 2
        if (side(mid, height) / patch_size) * (side(mid, width) / patch_size) <= max_num_patches:
            lo = mid
        else:
            hi = mid
    return side(lo, height), side(lo, width)


def patchify(pixels: torch.Tensor, patch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NaFlex inputs from pixels ``(B, C, h, w)``, exactly as the SigLIP 2 image processor builds them.

    ``pixel_values`` ``(B, length, p * p * C)``: patches in row-major grid order, each
    flattened as (row in patch, column in patch, channel), then zero patches up to
    ``length``; ``pixel_attention_mask`` ``(B, length)`` int32, 1 for real patches;
    ``spatial_shapes`` ``(B, 2)`` int64 ``(gh, gw)``. Differentiable in ``pixels``.
    """
    b, c, h, w = pixels.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"a {h} x {w} input is not a whole number of {p} px patches")
    gh, gw = h // p, w // p
    n = gh * gw
    if n > length:
        raise ValueError(f"{gh} x {gw} patches exceed the patch budget of {length}")
    patches = pixels.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1).reshape(b, n, p * p * c)
    values = torch.nn.functional.pad(patches, (0, 0, 0, length - n))
    mask = torch.zeros(b, length, dtype=torch.int32, device=pixels.device)
    mask[:, :n] = 1
    shapes = torch.tensor([[gh, gw]] * b, dtype=torch.int64, device=pixels.device)
    return values, mask, shapes


class ContrastiveTower(Family):
    """Shared answers for the image towers of CLIP and SigLIP (see the module docstring for the maps)."""

    interpolate_kwarg = True  # the fixed-size towers interpolate their position table to other input sizes
    cls_token = False
    # Encoder layers, then SigLIP's pooling head (an nn.MultiheadAttention that never calls out_proj as a module).
    layout = BlockLayout(
        projection=("self_attn.out_proj", "attention.out_proj"),
        q=("self_attn.q_proj",),
        k=("self_attn.k_proj",),
        v=("self_attn.v_proj",),
        pattern=(FUNCTION,),
        caller=("self_attn",),  # absent in SigLIP's pooling head (nn.MultiheadAttention): its pattern is record-only
        branch=("self_attn",),
        mlp=("mlp",),
        mlp_output=("mlp.fc2",),
        norms=(("layer_norm1",), ("layer_norm2",)),
    )

    # --- layout ------------------------------------------------------------------
    def patch_size(self, config) -> int:
        p = vision_config(config).patch_size
        return int(p[0] if isinstance(p, (tuple, list)) else p)

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS",) if self.cls_token else ()

    def has_head(self, config) -> bool:
        """Whether the recorded blocks end with the pooling head (it makes the image embedding)."""
        return bool(getattr(vision_config(config), "vision_use_head", False)) and not is_classifier(config)

    def readout(self, config) -> Literal["cls", "pooled", "head"]:
        if is_classifier(config):
            return "pooled"  # the classifiers mean-pool the final tokens
        if self.has_head(config):
            return "head"
        return "cls" if self.cls_token else "pooled"

    def grid(self, config, hw: tuple[int, int]) -> tuple[int, int]:
        p = self.patch_size(config)
        return hw[0] // p, hw[1] // p

    def sequence_length(self, config, hw: tuple[int, int]) -> int:
        """Tokens the encoder runs on at input size ``hw``, padding included."""
        gh, gw = self.grid(config, hw)
        return len(self.prefix_kinds(config)) + gh * gw

    def native_grid(self, config) -> tuple[int, int]:
        g = int(vision_config(config).image_size) // self.patch_size(config)
        return g, g

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        vc = vision_config(config)
        t = self.sequence_length(config, hw)
        pool = vc.num_attention_heads * t if self.has_head(config) else 0
        return vc.num_hidden_layers * vc.num_attention_heads * t * t + pool

    # --- loading -----------------------------------------------------------------
    def patch_weight(self, model: torch.nn.Module) -> np.ndarray | None:
        return vision_tower(model).embeddings.patch_embedding.weight.detach().float().cpu().numpy()

    def position_note(self, config) -> str:
        return ""

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        config = model.config
        table = vision_tower(model).embeddings.position_embedding.weight
        rows = table.detach().float().cpu().numpy()[len(self.prefix_kinds(config)) :]
        gh, gw = self.native_grid(config)
        if rows.shape[0] != gh * gw:
            raise ValueError(f"{rows.shape[0]} patch position embeddings do not fill the native {gh} x {gw} grid")
        return PositionInfo(tables=(PositionTable("patches", rows, (gh, gw)),), note=self.position_note(config))

    def sites(self, model: torch.nn.Module) -> list[Site]:
        """The tower's encoder layers (each with its attention module), then its pooling head where it reads out.

        Layers are the classes the model declares in ``_can_record_outputs``, found
        inside the image tower only (a two-tower model's text layers are left alone).
        The pooling head gets the per-head pre-hook (once per head module).
        """
        config = model.config
        tower = vision_tower(model)
        layer_cls = recorded_classes(model, "hidden_states")
        attn_cls = recorded_classes(model, "attentions")
        if not layer_cls or not attn_cls:
            raise RuntimeError(f"{type(model).__name__} declares no attention outputs to record")
        layers = [m for m in tower.modules() if isinstance(m, layer_cls)]
        expected = vision_config(config).num_hidden_layers
        if len(layers) != expected:
            raise RuntimeError(f"found {len(layers)} encoder layers in the image tower, the config says {expected}")
        sites = []
        for i, layer in enumerate(layers):
            inner = [m for m in layer.modules() if isinstance(m, attn_cls)]
            if len(inner) != 1:
                raise RuntimeError(f"expected one attention module in {type(layer).__name__}, found {len(inner)}")
            sites.append(Site(index=i, stage=0, attention=inner[0], block=layer, extra=_ENCODER))
        found = pooling_head(tower)
        if self.has_head(config):
            if found is None:
                raise RuntimeError("the config says vision_use_head, but the tower has no attention-pooling head")
            head, mha = found
            if not getattr(mha, _PER_HEAD_ATTR, False):
                mha.register_forward_pre_hook(_per_head_weights, with_kwargs=True)
                object.__setattr__(mha, _PER_HEAD_ATTR, True)
            sites.append(Site(index=len(sites), stage=0, attention=mha, block=head, extra=_POOL))
        return sites

    # --- capture -----------------------------------------------------------------
    def forward(self, model: torch.nn.Module, inputs: dict):
        """Two-tower models run their image tower only; vision-only models and classifiers run whole."""
        if hasattr(model, "text_model") and not hasattr(model, "classifier"):
            return vision_tower(model)(**inputs)
        return model(**inputs)

    def logits(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        """Class logits of a ``*ForImageClassification`` model; None for the contrastive towers (no classifier)."""
        return getattr(out, "logits", None) if hasattr(model, "classifier") else None

    def image_embedding(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        raise NotImplementedError

    def probs(self, call: Call, site: Site, module, args, kwargs, output) -> torch.Tensor | None:
        """Encoder: the eager attention weights. Pooling head: the tensor multiplied with the values.

        ``nn.MultiheadAttention`` (asked for per-head weights) returns
        ``w.view(B, H, 1, Tk)`` of the ``(B * H, 1, Tk)`` tensor ``w`` it multiplied
        with the values; the view's base is ``w`` itself (gradients pair with it).
        Inference mode keeps no base: the view holds the same numbers.
        """
        weights = output[1]
        if site.extra != _POOL or weights is None:
            return weights
        if weights.dim() != 4:
            raise RuntimeError("the pooling head returned head-averaged weights; its per-head pre-hook is missing")
        base = weights._base
        if base is None:
            if weights.requires_grad:
                raise RuntimeError("the pooling head's weights are not a view of the tensor it multiplied with values")
            return weights
        if base.shape != (weights.shape[0] * weights.shape[1], *weights.shape[2:]):
            raise RuntimeError(f"unexpected pooling-head weights {tuple(base.shape)} behind {tuple(weights.shape)}")
        return base

    def geometry(self, call: Call, site: Site, module, args, kwargs, output, raw: torch.Tensor) -> Geometry:
        config = call.config
        kinds = self.prefix_kinds(config)
        grid = self.grid(config, call.input_size)
        real = len(kinds) + grid[0] * grid[1]
        tokens = raw.shape[-1]
        padding = self.sequence_length(config, call.input_size) - real
        if tokens != real + padding:
            raise RuntimeError(
                f"expected {len(kinds)} prefix tokens + {grid[0]} x {grid[1]} patches + {padding} padding tokens, "
                f"got {tokens} tokens"
            )
        if site.extra == _POOL:
            heads = site.attention.num_heads
            return Geometry(stage=0, kind="pool", num_heads=heads, grid=grid, prefix_kinds=kinds, trailing=padding)
        return Geometry(stage=0, kind="global", num_heads=raw.shape[1], grid=grid, prefix_kinds=kinds, trailing=padding)

    def tokens(self, call: Call, site: Site, module, args, kwargs, output) -> tuple[torch.Tensor, torch.Tensor]:
        """Input and output tokens of a block, padding tokens left out.

        The pooling head changes no token: both are the tokens it reads, the final
        tokens after ``post_layernorm`` (SigLIP), so its row of the stage's token norms
        shows the normed tokens the image embedding is pooled from.
        """
        config = call.config
        gh, gw = self.grid(config, call.input_size)
        real = len(self.prefix_kinds(config)) + gh * gw
        inp = args[0] if args else kwargs["hidden_states" if site.extra == _ENCODER else "hidden_state"]
        if site.extra == _POOL:
            return inp[:, :real], inp[:, :real]
        out = output[0] if isinstance(output, (tuple, list)) else output
        return inp[:, :real], out[:, :real]


class Clip(ContrastiveTower):
    """CLIP image tower (``clip``, ``clip_vision_model``): CLS + patches, read out from CLS."""

    name = "CLIP"
    model_types = ("clip", "clip_vision_model")
    cls_token = True
    hierarchical = False  # one grid of global attention: the plain (L, H, T, T) stack holds it

    def image_embedding(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        """``visual_projection(pooler_output)``, exactly ``CLIPModel.get_image_features(...).pooler_output``.

        ``CLIPVisionModelWithProjection`` returns it as ``image_embeds``. A plain
        ``CLIPVisionModel`` has no projection: nothing comparable with text, so None.
        """
        embeds = getattr(out, "image_embeds", None)
        if embeds is not None:
            return embeds
        proj = getattr(model, "visual_projection", None)
        pooled = getattr(out, "pooler_output", None)
        if proj is None or pooled is None:
            return None
        return proj(pooled)


class Siglip(ContrastiveTower):
    """SigLIP image tower (``siglip``, ``siglip_vision_model``): patches only, read out by the pooling head."""

    name = "SigLIP"
    model_types = ("siglip", "siglip_vision_model")

    def image_embedding(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        """The pooling head's output, exactly ``get_image_features(...).pooler_output`` (None without a head)."""
        if hasattr(model, "classifier"):
            return None
        return getattr(out, "pooler_output", None)


class Siglip2(Siglip):
    """SigLIP 2 NaFlex (``siglip2``, ``siglip2_vision_model``): patches on an aspect-ratio grid, padded to the budget.

    The model's own patch budget is ``vision_config.num_patches`` (``transformers``
    documents it as the number of patches an image is resized to fill at most, and it
    is the image processor's default ``max_num_patches``); the default input size is the
    square with that many patches. A size a user asks for sets the budget to its patch
    count: each image then gets the grid the processor would give it within that
    budget, following the image's aspect ratio (the grid may be non-square). Every
    image is padded to at least the model's own budget, as the processor pads.
    """

    name = "SigLIP 2"
    model_types = ("siglip2", "siglip2_vision_model")
    interpolate_kwarg = False
    hierarchical = True  # padding tokens: no dense (L, H, T, T) stack over a fixed T

    def budget(self, config) -> int:
        """``max_num_patches``: the sequence every image is padded to."""
        return int(vision_config(config).num_patches)

    def native_grid(self, config) -> tuple[int, int]:
        g = math.isqrt(self.budget(config))
        return g, g

    def sequence_length(self, config, hw: tuple[int, int]) -> int:
        gh, gw = self.grid(config, hw)
        return max(self.budget(config), gh * gw)

    def default_size(self, config, processor_size: tuple[int, int]) -> tuple[int, int]:
        side = self.native_grid(config)[0] * self.patch_size(config)
        return side, side

    def size_for_image(self, config, hw: tuple[int, int], image_wh: tuple[int, int] | None) -> tuple[int, int]:
        """The processor's grid for this image's aspect within ``hw``'s patch count (``hw``'s aspect without an image)."""
        p = self.patch_size(config)
        budget = max(1, (hw[0] // p) * (hw[1] // p))
        image_hw = (int(image_wh[1]), int(image_wh[0])) if image_wh is not None else hw
        return naflex_size(image_hw, p, budget)

    def model_inputs(self, loaded, pixels: torch.Tensor, hw: tuple[int, int]) -> dict:
        """``pixel_values``, ``pixel_attention_mask``, ``spatial_shapes`` as the processor builds them (see :func:`patchify`)."""
        config = loaded.config
        values, mask, shapes = patchify(pixels, self.patch_size(config), self.sequence_length(config, hw))
        return {"pixel_values": values, "pixel_attention_mask": mask, "spatial_shapes": shapes}

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray | None:
        """The patch projection as ``(D, C, p, p)`` filters: the linear weight's input is (row, column, channel)."""
        config = model.config
        p = self.patch_size(config)
        w = vision_tower(model).embeddings.patch_embedding.weight.detach().float().cpu()  # (D, p * p * C)
        c = w.shape[1] // (p * p)
        return w.reshape(w.shape[0], p, p, c).permute(0, 3, 1, 2).contiguous().numpy()

    def position_note(self, config) -> str:
        g = self.native_grid(config)[0]
        return (
            f"SigLIP 2 NaFlex resizes this {g} x {g} table to each image's patch grid (bilinear, antialiased) "
            "before adding it; the table shown is the native one."
        )


FAMILIES: tuple[Family, ...] = (Clip(), Siglip(), Siglip2())
