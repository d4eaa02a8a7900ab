"""Plain one-grid ViTs: ViT and DINO v1, DeiT (with its distillation token), DINOv2 (with registers), BEiT.

One stage, every block ``global`` attention over prefix tokens + the patch grid.
The attention sites are found the way ``transformers`` finds them for its own
recorders: the classes a model declares in ``_can_record_outputs`` (its layer and
its attention module), in forward order, so no module path is hard-coded.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np
import torch

from vitviz.models.families.base import FUNCTION, BlockLayout, Family, ReadoutHead
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, PositionTable

__all__ = ["PlainViT", "DeiT", "Dinov2", "Dinov2Registers", "Beit", "FAMILIES", "recorded_classes"]


def recorded_classes(model: torch.nn.Module, key: str) -> tuple[type, ...]:
    """The module classes a ``transformers`` model records for ``key`` (``attentions``, ``hidden_states``)."""
    spec = getattr(type(model.base_model), "_can_record_outputs", None) or {}
    entry = spec.get(key)
    entries = entry if isinstance(entry, (list, tuple)) else [entry]
    return tuple(getattr(e, "target_class", e) for e in entries if e is not None)


def paired_sites(model: torch.nn.Module, *, stage: int = 0) -> list[Site]:
    """Each layer module with the attention module inside it, in forward order."""
    layer_cls = recorded_classes(model, "hidden_states")
    attn_cls = recorded_classes(model, "attentions")
    layers = [m for m in model.base_model.modules() if isinstance(m, layer_cls)]
    sites = []
    for i, layer in enumerate(layers):
        inner = [m for m in layer.modules() if isinstance(m, attn_cls)]
        if len(inner) != 1:
            raise RuntimeError(f"expected one attention module in {type(layer).__name__}, found {len(inner)}")
        sites.append(Site(index=i, stage=stage, attention=inner[0], block=layer))
    return sites


class PlainViT(Family):
    """ViT layout (google/vit-*, facebook/dino-*): CLS then patches, one position row per token."""

    name = "ViT"
    model_types = ("vit",)
    interpolate_kwarg = True
    # What a block has, by its path under the layer module (transformers 5 names); see ``BlockLayout``.
    layout = BlockLayout(
        projection=("attention.o_proj",),
        q=("attention.q_proj",),
        k=("attention.k_proj",),
        v=("attention.v_proj",),
        pattern=(FUNCTION,),
        caller=("attention",),
        branch=("attention",),  # ViTAttention's output is added to the residual as it is (dropout: eval)
        mlp=("mlp",),
        mlp_output=("mlp.fc2", "mlp.down_proj"),  # GELU MLP, or SwiGLU (DINOv2, DINOv3)
        norms=(("layernorm_before",), ("layernorm_after",)),
    )

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS",)

    def readout(self, config) -> Literal["cls", "pooled"]:
        return "cls" if self.prefix_kinds(config) else "pooled"

    def position_prefix_rows(self, config) -> int:
        """How many leading rows of the position table belong to prefix tokens."""
        return 1

    def position_note(self, config) -> str:
        return ""

    def position_table(self, model: torch.nn.Module) -> torch.Tensor | None:
        return getattr(model.base_model.embeddings, "position_embeddings", None)

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        config = model.config
        table = self.position_table(model)
        if table is None:
            return PositionInfo(note=self.position_note(config))
        rows = table.detach().float().cpu().numpy().reshape(-1, table.shape[-1])[self.position_prefix_rows(config) :]
        native = int(config.image_size) // self.patch_size(config)
        if rows.shape[0] != native * native:
            raise ValueError(f"{rows.shape[0]} position embeddings do not fill the native {native} x {native} grid")
        return PositionInfo(tables=(PositionTable("patches", rows, (native, native)),))

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        proj = model.base_model.embeddings.patch_embeddings.projection
        return proj.weight.detach().float().cpu().numpy()

    def sites(self, model: torch.nn.Module) -> list[Site]:
        return paired_sites(model)

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        kinds = self.prefix_kinds(call.config)
        p = self.patch_size(call.config)
        grid = (call.input_size[0] // p, call.input_size[1] // p)
        if raw.shape[-1] != len(kinds) + grid[0] * grid[1]:
            raise RuntimeError(
                f"expected {len(kinds)} prefix tokens + {grid[0]} x {grid[1]} patches, got {raw.shape[-1]} tokens"
            )
        return Geometry(stage=0, kind="global", num_heads=raw.shape[1], grid=grid, prefix_kinds=kinds)

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        p = self.patch_size(config)
        t = len(self.prefix_kinds(config)) + (hw[0] // p) * (hw[1] // p)
        return config.num_hidden_layers * config.num_attention_heads * t * t

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """``classifier(layernorm(x)[:, 0])``: the final LayerNorm of the CLS token, then the linear classifier."""
        classifier = getattr(model, "classifier", None)
        norm = getattr(model.base_model, "layernorm", None)
        if not isinstance(classifier, torch.nn.Linear) or not isinstance(norm, torch.nn.LayerNorm):
            return None
        if self.prefix_kinds(model.config)[:1] != ("CLS",):
            return None
        return ReadoutHead(
            select=lambda x: x[:, :1],
            norm=norm,
            head=lambda z: classifier(z[:, 0]),
            description="the final LayerNorm of the CLS token, then the classifier",
        )


class DeiT(PlainViT):
    """DeiT (facebook/deit-*): CLS, distillation token, patches; both prefix tokens have position rows."""

    name = "DeiT"
    model_types = ("deit",)

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS", "DIST")

    def position_prefix_rows(self, config) -> int:
        return 2

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """Distilled DeiT: the mean of the CLS head on the normed CLS token and the distillation head on DIST."""
        cls_head = getattr(model, "cls_classifier", None)
        dist_head = getattr(model, "distillation_classifier", None)
        norm = getattr(model.base_model, "layernorm", None)
        if not isinstance(cls_head, torch.nn.Linear):
            return super().readout_head(model)
        if not isinstance(dist_head, torch.nn.Linear) or not isinstance(norm, torch.nn.LayerNorm):
            return None
        return ReadoutHead(
            select=lambda x: x[:, :2],
            norm=norm,
            head=lambda z: (cls_head(z[:, 0]) + dist_head(z[:, 1])) / 2,
            description="the final LayerNorm of CLS and DIST, then (CLS head + distillation head) / 2",
        )


class Dinov2(PlainViT):
    """DINOv2 (facebook/dinov2-*): interpolates its 37 x 37 position grid to any input by itself."""

    name = "DINOv2"
    model_types = ("dinov2",)
    interpolate_kwarg = False
    layout = replace(
        PlainViT.layout,
        branch=("layer_scale1",),  # the scaled attention update the residual receives
        norms=(("norm1",), ("norm2",)),
        layer_scales=("layer_scale1.lambda1", "layer_scale2.lambda1"),
    )

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """DINOv2 classifier: ``classifier(cat(CLS, mean of the patches))`` of the normed tokens (registers unread)."""
        classifier = getattr(model, "classifier", None)
        norm = getattr(model.base_model, "layernorm", None)
        if not isinstance(classifier, torch.nn.Linear) or not isinstance(norm, torch.nn.LayerNorm):
            return None
        p = len(self.prefix_kinds(model.config))
        return ReadoutHead(
            select=lambda x: torch.cat((x[:, :1], x[:, p:]), dim=1),
            norm=norm,
            head=lambda z: classifier(torch.cat((z[:, 0], z[:, 1:].mean(dim=1)), dim=-1)),
            description="the final LayerNorm of every token, then the classifier on [CLS, mean of the patches]",
        )


class Dinov2Registers(Dinov2):
    """DINOv2 with registers: CLS, k registers (no position rows), patches."""

    name = "DINOv2 with registers"
    model_types = ("dinov2_with_registers",)

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS", *(f"REG{i}" for i in range(config.num_register_tokens)))


class Beit(PlainViT):
    """BEiT: relative position bias by default, so usually no absolute position embeddings."""

    name = "BEiT"
    model_types = ("beit",)
    # Layer scales are Parameters, or the float 1.0 when off; the layer multiplies by them in its own forward, so
    # no module outputs the scaled attention update: no ``resid_mid`` point.
    layout = replace(PlainViT.layout, branch=(), layer_scales=("lambda_1", "lambda_2"))

    def readout(self, config) -> Literal["cls", "pooled"]:
        """BEiT's classifier mean-pools the patch tokens (``use_mean_pooling``, on by default), else reads CLS."""
        return "pooled" if getattr(config, "use_mean_pooling", True) else "cls"

    def position_table(self, model: torch.nn.Module) -> torch.Tensor | None:
        if not getattr(model.config, "use_absolute_position_embeddings", False):
            return None
        return super().position_table(model)

    def position_note(self, config) -> str:
        if getattr(config, "use_absolute_position_embeddings", False):
            return ""
        return "BEiT encodes position with a relative position bias inside attention; it has no absolute position embeddings."

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """Mean pooling (the default): ``classifier(pooler.layernorm(mean of the patch tokens))``; else CLS as ViT."""
        pooler = getattr(model.base_model, "pooler", None)
        norm = getattr(pooler, "layernorm", None)
        classifier = getattr(model, "classifier", None)
        if norm is None:
            return super().readout_head(model)
        if not isinstance(classifier, torch.nn.Linear) or not isinstance(norm, torch.nn.LayerNorm):
            return None
        p = len(self.prefix_kinds(model.config))
        return ReadoutHead(
            select=lambda x: x[:, p:].mean(dim=1, keepdim=True),
            norm=norm,
            head=lambda z: classifier(z[:, 0]),
            description="the mean of the patch tokens, the pooler's LayerNorm, then the classifier",
        )


FAMILIES: tuple[Family, ...] = (PlainViT(), DeiT(), Dinov2(), Dinov2Registers(), Beit())
