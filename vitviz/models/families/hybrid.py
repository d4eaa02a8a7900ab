"""Hybrid ViT (``hybrid_vit``, :mod:`vitviz.zoo.hybrid`): the ViT paper's R50+ViT, tokens from a ResNet's map.

One grid, one stage, every block ``global`` attention over CLS + the grid, as a plain ViT; the
blocks are ``transformers``' ViT layers, so block parts, knock-outs, the logit lens and
attribution are declared as for ViT. What differs is where the tokens come from:

* **Token layout**: CLS, then the cells of the ResNet's feature map in row-major order (each
  embedded by the 1 x 1 patch projection), not pixel patches. For vitviz a token's "patch" is
  its stride cell: ``patch_size`` is the total stride (16 for R50+ViT-B/16, 32 for R26+ViT-S/32)
  and inputs are snapped to multiples of it (the map is then exact). Maps are drawn on those
  cells, though a cell's embedding sees a whole receptive field (363 px for R50's stages 1-3):
  :meth:`HybridViT.token_note` says so wherever the sequence is shown.
* **Position table**: the learned table on the feature grid (CLS row dropped), on the native grid
  of ``image_size``; at other sizes the model resizes it bilinearly with aligned corners.
* **Filters**: the ResNet's root convolution ``(width, 3, 7, 7)``, weight-standardised as the
  forward applies it (the first convolution of the network); without a ResNet, the patch projection.
* **Readout**: the CLS token after the final LayerNorm; with a ``pre_logits`` layer (the
  ImageNet-21k checkpoints) the head is ``classifier(tanh(pre_logits(z)))``: the logit lens goes
  through it, and direct logit attribution is refused (the head is not affine in the tokens).
* **Grad-CAM on the last CNN stage** (``gradcam`` with ``layer="cnn"``): :meth:`feature_map`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from vitviz.models.families.base import BlockParts, Family, ReadoutHead
from vitviz.models.families.vit import PlainViT
from vitviz.record import Geometry, PositionInfo, PositionTable
from vitviz.zoo.hybrid import cnn_stride, receptive_field, standardised_weight, token_grid, total_stride

__all__ = ["HybridViT", "FAMILIES"]


class HybridViT(PlainViT):
    """R50+ViT-B/16, R26+ViT-S/32 and the other hybrids of the ViT paper (and its JAX ViTs with ``pre_logits``)."""

    name = "Hybrid ViT"
    model_types = ("hybrid_vit",)
    interpolate_kwarg = False  # the model resizes its position table itself

    def patch_size(self, config) -> int:
        """Input pixels per token: the ResNet's stride times the embedding's patch."""
        return total_stride(config)

    def grid(self, config, hw: tuple[int, int]) -> tuple[int, int]:
        return token_grid(config, hw)

    def token_note(self, config) -> str:
        """How the first stage's tokens are made, for the Overview's token sequence and the model's notes."""
        s = total_stride(config)
        if not config.has_resnet:
            return (
                f"No CNN: the tokens are pixel patches, as in the ViT paper: the image is cut into {s} x {s} px "
                "patches, each flattened and linearly projected, with CLS in front (the JAX code's layout, kept "
                "for its representation layer)."
            )
        depths = config.resnet_depths
        stages = f"{len(depths)} stage{'s' if len(depths) != 1 else ''} ({', '.join(map(str, depths))} units)"
        where = f"the ResNet's root and {stages} make" if depths else "the ResNet's root alone makes"
        p = config.patch_size
        embed = (
            "a 1 x 1 projection embeds each of its cells as a token"
            if p == 1
            else f"a {p} x {p} projection embeds each {p} x {p} block of its cells as a token (stride {s} px)"
        )
        rf = receptive_field(config)
        return (
            f"Hybrid ViT: the tokens are not pixel patches but cells of a CNN feature map: {where} a map at stride "
            f"{cnn_stride(config)} px, and {embed}, with CLS in front. Each token is drawn on the {s} x {s} px cell "
            f"it strides over, but its embedding depends on a {rf} x {rf} px receptive field around it: attention, "
            "rollout and relevance maps place each CNN cell on its stride cell, not on everything it saw."
        )

    def position_table(self, model: torch.nn.Module) -> torch.Tensor | None:
        return model.base_model.embeddings.position_embeddings

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        """The table's grid rows (CLS row dropped) on the native grid of ``image_size``."""
        config = model.config
        table = self.position_table(model)
        gh, gw = model.base_model.embeddings.native_grid
        rows = table.detach().float().cpu().numpy().reshape(-1, table.shape[-1])[1:]
        if rows.shape[0] != gh * gw:
            raise ValueError(f"{rows.shape[0]} position embeddings do not fill the native {gh} x {gw} grid")
        what = "feature-map cells" if config.has_resnet else "patches"
        note = getattr(config, "position_note", "") or (
            f"One learned row per {what[:-1]} of the {gh} x {gw} grid the model was trained at "
            f"({config.image_size} px); at other sizes the model resizes the grid bilinearly (corners aligned), "
            "as the paper's code does for fine-tuning at another resolution."
        )
        return PositionInfo(tables=(PositionTable(what, rows, (gh, gw)),), note=note)

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        """The first convolution as the forward applies it: the ResNet's standardised root ``(width, 3, 7, 7)``, or
        the patch projection ``(D, 3, p, p)`` without a ResNet."""
        emb = model.base_model.embeddings
        if emb.backbone is None:
            return emb.projection.weight.detach().float().cpu().numpy()
        conv = emb.backbone.embedder.convolution
        return standardised_weight(conv.weight.detach().float(), conv.eps).cpu().numpy()

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        """One global grid: CLS + the token grid the ResNet's arithmetic gives (checked against the block's keys)."""
        grid = token_grid(call.config, call.input_size)
        if raw.shape[-1] != 1 + grid[0] * grid[1]:
            raise RuntimeError(f"expected CLS + {grid[0]} x {grid[1]} feature-map cells, got {raw.shape[-1]} tokens")
        return Geometry(stage=0, kind="global", num_heads=raw.shape[1], grid=grid, prefix_kinds=("CLS",))

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        gh, gw = token_grid(config, hw)
        t = 1 + gh * gw
        return config.num_hidden_layers * config.num_attention_heads * t * t

    def block_parts(self, site) -> BlockParts:
        """ViT's parts; with a ``pre_logits`` layer every block is marked so that direct logit attribution
        refuses (its parts would not add up: the head is not affine), while knock-outs and the lens still apply."""
        parts = super().block_parts(site)
        if getattr(site, "extra", None) == "pre_logits" and not parts.unknown:
            return BlockParts(
                projection=parts.projection,
                mlp=parts.mlp,
                attn_scale=parts.attn_scale,
                mlp_scale=parts.mlp_scale,
                norms=parts.norms,
                unknown=(
                    "the model reads its CLS token through a tanh representation layer (pre_logits) before the "
                    "classifier, so the logit is not an affine function of the normalised residual stream and "
                    "does not split into per-block terms"
                ),
            )
        return parts

    def sites(self, model: torch.nn.Module):
        """ViT's sites; marked ``pre_logits`` when the model has that layer (see :meth:`block_parts`)."""
        sites = super().sites(model)
        if getattr(model.config, "representation_size", None) is None:
            return sites
        return [replace(s, extra="pre_logits") for s in sites]

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """``classifier(layernorm(x)[:, 0])``, through ``tanh(pre_logits(.))`` where the model has that layer."""
        classifier = getattr(model, "classifier", None)
        base = model.base_model
        norm = getattr(base, "layernorm", None)
        if not isinstance(classifier, torch.nn.Linear) or not isinstance(norm, torch.nn.LayerNorm):
            return None
        if base.pre_logits is None:
            return ReadoutHead(
                select=lambda x: x[:, :1],
                norm=norm,
                head=lambda z: classifier(z[:, 0]),
                description="the final LayerNorm of the CLS token, then the classifier",
            )
        return ReadoutHead(
            select=lambda x: x[:, :1],
            norm=norm,
            head=lambda z: classifier(torch.tanh(base.pre_logits(z[:, 0]))),
            description="the final LayerNorm of the CLS token, tanh(pre_logits), then the classifier",
        )

    # --- the CNN's feature map (Grad-CAM on the last CNN stage) --------------------------------------
    def feature_map_note(self, config) -> str:
        """Why the model has no CNN feature map under its tokens ("" when it has one)."""
        if config.has_resnet:
            return ""
        return f"this {self.name} has no ResNet: its tokens are pixel patches, with no CNN stage under them"

    def forward_with_feature_map(self, model: torch.nn.Module, inputs: dict):
        """The forward's output and the ResNet's last map ``(B, C, h', w')`` (in the forward's graph)."""
        out = model(**inputs, output_feature_map=True)
        return out, out.feature_map


FAMILIES: tuple[Family, ...] = (HybridViT(),)
