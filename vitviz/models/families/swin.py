"""Swin and Swin V2 (Liu et al. 2021, 2022): shifted-window attention in stages joined by patch merging.

Each block pads its stage grid on the bottom and right to multiples of the window
w, rolls it by ``(-s, -s)`` (s = w // 2 on odd blocks) and attends within each
w x w window, with a relative position bias and, when shifted, a mask between the
regions the roll brought together. vitviz records every block in that native
form (``window``), read from the block as it ran: its window, shift and padding.

Traps handled here (``docs/definitions.md#trap-swin-v1``):

* Swin v1 *writes* ``window_size`` and ``shift_size`` on its shared layers whenever
  a stage grid is no larger than the window, and never writes them back: one small
  input breaks or silently changes every later call. Before every forward each
  block gets back the values it was loaded with, and a model's forwards take turns
  (a lock per model). Inputs whose stage grids would be smaller than the window
  are refused before any forward (the model's bias table no longer fits them).
* Swin V2 fixes window and shift at construction from ``config.image_size`` and pads
  instead; the record follows the block, not the config.
* ``output_attentions`` gives one tensor per stage (or none) in transformers 5.x;
  the hooks see every block.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch

from vitviz.models.families.base import FUNCTION, BlockLayout, Family, ReadoutHead
from vitviz.models.hooks import Site, installed_sites, model_lock
from vitviz.record import Geometry, PositionInfo, PositionTable, RelativeBias

__all__ = ["Swin", "SwinV2", "FAMILIES"]


def _stage_grids(grid: tuple[int, int], stages: int) -> list[tuple[int, int]]:
    """Patch merging halves each side, padding odd ones: ceil(g / 2)."""
    out = [grid]
    for _ in range(stages - 1):
        out.append(((out[-1][0] + 1) // 2, (out[-1][1] + 1) // 2))
    return out


def _bias_map(table: torch.Tensor, w: int) -> np.ndarray:
    """``((2w-1)^2, H)`` table indexed by query - key offset -> ``(H, 2w-1, 2w-1)`` indexed by key - query offset.

    Entry ``[h, dy + w - 1, dx + w - 1]`` is what head h adds to the logit of a key
    that sits ``dy`` rows below and ``dx`` columns right of the query; the centre is
    the query itself.
    """
    grid = table.detach().float().cpu().reshape(2 * w - 1, 2 * w - 1, -1).permute(2, 0, 1)
    return grid.flip(1).flip(2).numpy().copy()


class Swin(Family):
    """Swin (microsoft/swin-*): 4 stages by default, windowed attention, mean-pooled readout."""

    name = "Swin"
    layout = BlockLayout(
        projection=("attention.o_proj",),
        q=("attention.q_proj",),
        k=("attention.k_proj",),
        v=("attention.v_proj",),
        pattern=(FUNCTION,),
        caller=("attention",),
        mlp=("mlp",),
        mlp_output=("mlp.fc2",),
        norms=(("layernorm_before",), ("layernorm_after",)),
    )
    model_types = ("swin",)
    hierarchical = True
    interpolate_kwarg = True
    _layer_attr = "swin"

    def _encoder_stages(self, model: torch.nn.Module):
        return model.base_model.encoder.layers

    def readout(self, config) -> Literal["cls", "pooled"]:
        return "pooled"

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        return model.base_model.embeddings.patch_embeddings.projection.weight.detach().float().cpu().numpy()

    def sites(self, model: torch.nn.Module) -> list[Site]:
        sites = []
        for s, stage in enumerate(self._encoder_stages(model)):
            for layer in stage.blocks:
                extra = {"window": int(layer.window_size), "shift": int(layer.shift_size)}
                sites.append(Site(len(sites), s, self._probs_module(layer), layer, extra))
        return sites

    def _probs_module(self, layer: torch.nn.Module) -> torch.nn.Module:
        return layer  # SwinLayer returns (hidden_states, attention weights)

    @contextmanager
    def running(self, model: torch.nn.Module):
        with model_lock(model):  # one forward at a time: resetting a block's window would race another forward
            for site in installed_sites(model):
                site.block.window_size = site.extra["window"]
                site.block.shift_size = site.extra["shift"]
            yield

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        dims = args[1] if len(args) > 1 else kwargs["input_dimensions"]
        grid = (int(dims[0]), int(dims[1]))
        w, s = int(module.window_size), int(module.shift_size)
        padded = (math.ceil(grid[0] / w) * w, math.ceil(grid[1] / w) * w)
        return Geometry(
            stage=site.stage, kind="window", num_heads=raw.shape[1], grid=grid, window=w, shift=s, padded=padded
        )

    def tokens(self, call, site, module, args, kwargs, output):
        return args[0], output[0]

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray]:
        """Patch merging: each new token is made of its 2 x 2 children (padding children are not on the image)."""
        return np.arange(prev.grid[0]) // 2, np.arange(prev.grid[1]) // 2

    def _windows(self, config, grids: list[tuple[int, int]]) -> list[int]:
        """The window each stage runs with (v1 shrinks it to the grid where the grid is no larger)."""
        w = int(config.window_size)
        return [min(g) if min(g) <= w else w for g in grids]

    def size_problem(self, config, hw: tuple[int, int]) -> str:
        p = self.patch_size(config)
        grids = _stage_grids((hw[0] // p, hw[1] // p), len(config.depths))
        w = int(config.window_size)
        if min(grids[-1]) >= w:
            return ""
        need = (w - 1) * 2 ** (len(grids) - 1) + 1
        return (
            f"{self.name} with {w} x {w} windows cannot run at {hw[1]} x {hw[0]} px: its last stage would be "
            f"{grids[-1][0]} x {grids[-1][1]} tokens, smaller than a window. Choose at least "
            f"{need * p} px per side."
        )

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        p = self.patch_size(config)
        grids = _stage_grids((hw[0] // p, hw[1] // p), len(config.depths))
        total = 0
        for g, w, depth, heads in zip(
            grids, self._windows(config, grids), config.depths, config.num_heads, strict=True
        ):
            windows = math.ceil(g[0] / w) * math.ceil(g[1] / w)
            total += depth * heads * windows * w**4
        return total

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        biases = []
        for site in self.sites(model):
            b = site.block.attention
            w = site.extra["window"]
            biases.append(RelativeBias(f"stage {site.stage}, block {self._within(model, site)}", self._bias(b, w)))
        tables = ()
        pos = getattr(model.base_model.embeddings, "position_embeddings", None)
        if pos is not None:
            p = self.patch_size(model.config)
            g = int(model.config.image_size) // p
            rows = pos.detach().float().cpu().numpy().reshape(-1, pos.shape[-1])
            tables = (PositionTable("patches", rows, (g, g)),)
        return PositionInfo(tables=tables, biases=tuple(biases))

    def _within(self, model: torch.nn.Module, site: Site) -> int:
        return list(self._encoder_stages(model)[site.stage].blocks).index(site.block)

    def _bias(self, attention: torch.nn.Module, w: int) -> np.ndarray:
        return _bias_map(attention.relative_position_bias.relative_position_bias_table, w)

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """``classifier(mean over tokens of layernorm(x))`` of the last stage's tokens (the pooler averages them)."""
        classifier = getattr(model, "classifier", None)
        norm = getattr(model.base_model, "layernorm", None)
        if not isinstance(classifier, torch.nn.Linear) or not isinstance(norm, torch.nn.LayerNorm):
            return None
        return ReadoutHead(
            select=lambda x: x,
            norm=norm,
            head=lambda z: classifier(z.mean(dim=1)),
            description="the final LayerNorm of every last-stage token, their mean, then the classifier",
        )


class SwinV2(Swin):
    """Swin V2 (microsoft/swinv2-*): cosine attention, a continuous position bias from a small MLP."""

    name = "Swin V2"
    layout = BlockLayout(
        projection=("attention.output.dense",),
        q=("attention.self.query",),
        k=("attention.self.key",),
        v=("attention.self.value",),
        pattern=("attention.self.dropout",),
        mlp=("output",),  # Swinv2Output: the MLP's second Linear and dropout (post-norm blocks: no norms declared)
        mlp_output=("output.dense",),
    )
    model_types = ("swinv2",)
    interpolate_kwarg = False

    def _probs_module(self, layer: torch.nn.Module) -> torch.nn.Module:
        return layer.attention.self.dropout  # applied to the probabilities; returns them unchanged in eval

    def probs(self, call, site, module, args, kwargs, output):
        return output

    @contextmanager
    def running(self, model: torch.nn.Module):
        yield  # V2 never writes to its layers during a forward

    def _windows(self, config, grids: list[tuple[int, int]]) -> list[int]:
        p = self.patch_size(config)
        native = _stage_grids((config.image_size // p, config.image_size // p), len(config.depths))
        return [min(min(g), int(config.window_size)) for g in native]

    def size_problem(self, config, hw: tuple[int, int]) -> str:
        return ""  # V2 pads any grid up to its fixed windows

    def _bias(self, attention: torch.nn.Module, w: int) -> np.ndarray:
        """V2's bias table: ``16 * sigmoid(mlp(log-spaced coordinates))``, as its forward computes it."""
        self_attn = attention.self
        with torch.no_grad():
            table = self_attn.continuous_position_bias_mlp(self_attn.relative_coords_table).view(
                -1, self_attn.num_attention_heads
            )
        return _bias_map(16 * torch.sigmoid(table), w)


FAMILIES = (Swin(), SwinV2())
