"""DAT (Xia et al. 2022, :mod:`vitviz.zoo.dat`): window, shifted-window and deformable attention in 4 stages.

Every block's probabilities are read from the module its attention hands them to
(``attn_drop``, identity in eval), so the record holds what the block computed:

* ``L`` and ``S`` blocks are recorded as Swin-like windows (``window``): the stage
  map cut into w x w windows, row-major; ``S`` blocks roll the map by ``(-s, -s)``
  first with ``s = ceil(w / 2)`` (4 for windows of 7) and mask pairs from different
  regions with -100. DAT refuses maps that are not multiples of the window, so there
  is never padding.
* ``D`` blocks attend from every query of the stage map to ``Hk x Wk`` keys sampled
  at deformed points (per group of ``heads // groups`` heads). For the maps and for
  rollout, each sampled key's weight is **spread bilinearly onto the stage grid**:
  the 4 grid cells around its point get the weight times the bilinear weights that
  ``grid_sample`` (``align_corners=True``) used to read the key's features there
  (:func:`spread_bilinear`). The block is recorded as ``global`` attention over the
  stage grid. A corner outside the map is a cell ``grid_sample`` read as zero: its
  share of the weight is on no cell and is dropped, so a row sums to 1 minus that
  mass (the query map shows less than 1; rollout renormalises each row after adding
  the identity, which hands the dropped mass back in proportion). Head h's key n is
  placed at its own group's point (group ``h // (heads // groups)``), as the paper
  draws it, although ``proj_k`` / ``proj_v`` are 1 x 1 convolutions that mix the
  channels sampled by every group at index n.

Per-head summaries of a ``D`` block (mean attention distance, entropy) are those of the
spread rows on the stage grid, like any global block: distance between cell centres
with the row renormalised, entropy over the grid cells (not over the samples).

The sampled points themselves (where each query looked) are not in the record: they
differ per image and the record's geometry is per batch. :mod:`vitviz.figures.deformable`
reads them through the same hooks (the positions travel with the probabilities to
``attn_drop``) and draws them; the model's forward also returns them on request
(``output_sampling=True``).

Relevance (Chefer et al.) needs the gradient of the logit with respect to each block's
attention; the spread map of a ``D`` block is derived from the probabilities, not used
by the forward, so its gradient is zero and a ``D`` block adds nothing to the relevance
(window blocks do). Readout: the mean of the final map's tokens after ``cls_norm``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from vitviz.models.families.base import Call, Family, ReadoutHead
from vitviz.models.families.swin import _bias_map
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, RelativeBias

__all__ = ["Dat", "FAMILIES", "spread_bilinear", "bilinear_corners"]


def bilinear_corners(pos: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid cells and weights ``grid_sample`` (bilinear, ``align_corners=True``, zeros) reads at ``pos``.

    ``pos``: ``(..., 2)`` in (y, x) normalised coordinates. Returns ``index (..., 4)``
    (flat cell ``row * W + col``, -1 for a corner outside the map) and ``weight (..., 4)``
    (0 for such a corner): pixel ``p = (c + 1) / 2 * (n - 1)``, corners ``floor(p)`` and
    ``floor(p) + 1`` per axis with weights ``1 - frac`` and ``frac``.
    """
    h, w = grid
    py = (pos[..., 0].double() + 1) / 2 * (h - 1)
    px = (pos[..., 1].double() + 1) / 2 * (w - 1)
    y0, x0 = torch.floor(py), torch.floor(px)
    fy, fx = py - y0, px - x0
    idx, wts = [], []
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            yy, xx = y0 + dy, x0 + dx
            inside = (yy >= 0) & (yy <= h - 1) & (xx >= 0) & (xx <= w - 1)
            idx.append(torch.where(inside, yy * w + xx, torch.full_like(yy, -1)).long())
            wts.append(torch.where(inside, wy * wx, torch.zeros_like(wy)))
    return torch.stack(idx, -1), torch.stack(wts, -1)


def spread_bilinear(attn: torch.Tensor, pos: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Attention over sampled keys -> attention over the stage grid.

    ``attn``: ``(B, heads, Nq, Ns)`` probabilities; ``pos``: ``(B, groups, Ns, 2)`` (y, x)
    normalised sample points, head h using group ``h // (heads // groups)``. Returns
    ``(B, heads, Nq, H * W)``: each key's weight spread onto the 4 cells around its
    point with :func:`bilinear_corners`' weights; weight on corners outside the map is
    dropped (rows then sum to less than 1).
    """
    b, heads, _, ns = attn.shape
    groups = pos.shape[1]
    idx, wts = bilinear_corners(pos, grid)  # (B, G, Ns, 4)
    spread = torch.zeros(b, groups, ns, grid[0] * grid[1] + 1, dtype=torch.float64, device=attn.device)
    spread.scatter_add_(3, torch.where(idx < 0, grid[0] * grid[1], idx), wts)  # the extra column takes outside
    spread = spread[..., :-1].to(attn.dtype)  # (B, G, Ns, N)
    per_head = spread.repeat_interleave(heads // groups, dim=1)  # (B, heads, Ns, N)
    return attn @ per_head


class Dat(Family):
    """DAT (``model_type`` ``dat``): see the module docstring."""

    name = "DAT"
    sampled_keys = True  # deformable blocks: the Heads page draws the points each query's keys come from
    model_types = ("dat",)
    hierarchical = True

    def patch_size(self, config) -> int:
        return int(config.patch_size)

    def size_multiple(self, config) -> int:
        return int(config.patch_size) * 8 * max(int(w) for w in config.window_sizes)

    def fixed_size(self, config) -> tuple[int, int]:
        """``(image_size, image_size)``: the shift masks and deformable position tables fit that size only."""
        return int(config.image_size), int(config.image_size)

    def size_problem(self, config, hw: tuple[int, int]) -> str:
        from vitviz.zoo.dat import size_problem

        return size_problem(config, hw)

    def readout(self, config) -> Literal["pooled"]:
        return "pooled"

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        return model.patch_proj[0].weight.detach().float().cpu().numpy()

    def sites(self, model: torch.nn.Module) -> list[Site]:
        sites = []
        for s, stage in enumerate(model.stages):
            for d, (attn, kind) in enumerate(zip(stage.attns, model.config.stage_spec[s], strict=True)):
                extra = {"attn": attn, "kind": kind, "within": d}
                sites.append(Site(len(sites), s, attn.attn_drop, stage.block_ends[d], extra))
        return sites

    def probs(self, call: Call, site: Site, module, args, kwargs, output):
        """Window blocks: the probabilities as computed ``(B * nW, heads, w*w, w*w)``. Deformable blocks: the
        probabilities ``(B * heads, N, Ns)`` spread onto the stage grid, ``(B, heads, N, N)``."""
        if site.extra["kind"] != "D":
            return output
        attn_mod = site.extra["attn"]
        pos = args[1] if len(args) > 1 else kwargs["positions"]
        grid = (attn_mod.q_h, attn_mod.q_w)
        b = call.batch
        native = output.reshape(b, attn_mod.n_heads, output.shape[1], output.shape[2])
        return spread_bilinear(native, pos.reshape(b, attn_mod.n_groups, -1, 2), grid)

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        grid = (int(output.shape[2]), int(output.shape[3]))
        attn = site.extra["attn"]
        if site.extra["kind"] == "D":
            if raw.shape[-1] != grid[0] * grid[1]:
                raise RuntimeError(f"deformable block spread onto {raw.shape[-1]} cells, the map has {grid}")
            return Geometry(stage=site.stage, kind="global", num_heads=int(raw.shape[1]), grid=grid)
        w = int(attn.window_size[0])
        shift = int(getattr(attn, "shift_size", 0))
        return Geometry(
            stage=site.stage, kind="window", num_heads=int(raw.shape[1]), grid=grid, window=w, shift=shift, padded=grid
        )

    def tokens(self, call, site, module, args, kwargs, output):
        """The block's input (the marker's first argument) and output, ``(B, C, H, W)`` -> ``(B, H * W, C)``."""
        x_in = args[0] if args else kwargs["x_in"]
        return x_in.flatten(2).transpose(1, 2), output.flatten(2).transpose(1, 2)

    def merge_parents(self, prev: Geometry, cur: Geometry) -> tuple[np.ndarray, np.ndarray]:
        """The 2 x 2 stride-2 convolution between stages: each new token is made of its 2 x 2 children."""
        return np.arange(prev.grid[0]) // 2, np.arange(prev.grid[1]) // 2

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        """Window blocks: heads x N x w^2; deformable blocks: heads x N x N (the spread) + heads x N x Ns."""
        total = 0
        for s, (gh, gw) in enumerate(config.stage_maps(hw)):
            n, w, heads = gh * gw, int(config.window_sizes[s]), int(config.heads[s])
            for kind in config.stage_spec[s]:
                total += heads * n * (2 * n if kind == "D" else w * w)
        return total

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        """The window blocks' relative bias tables. The deformable blocks' ``rpe_table`` is read at continuous
        displacements of sampled points (not at whole-token offsets), so it is not shown as a table."""
        biases = []
        for site in self.sites(model):
            attn = site.extra["attn"]
            if site.extra["kind"] != "D":
                w = int(attn.window_size[0])
                name = f"stage {site.stage}, block {site.extra['within']}"
                biases.append(RelativeBias(name, _bias_map(attn.relative_position_bias_table, w)))
        note = "DAT has no absolute position embeddings: window blocks use relative bias tables."
        return PositionInfo(biases=tuple(biases), note=note)

    def head_projection(self, site: Site) -> torch.nn.Linear | None:
        """None: DAT's blocks are not one module vitviz can knock heads out of and attribute through (the
        deformable blocks project with 1 x 1 convolutions, and the stage loop, not a block module, adds the
        residuals), so knock-outs and direct logit attribution are not defined."""
        return None

    def mlp_output(self, site: Site) -> torch.nn.Linear | None:
        return None

    def readout_head(self, model: torch.nn.Module) -> ReadoutHead | None:
        """``cls_head(mean over tokens of cls_norm(x))`` of the last stage's tokens."""
        head = model.cls_head
        return ReadoutHead(
            select=lambda x: x,
            norm=model.cls_norm.norm,
            head=lambda z: head(z.mean(dim=1)),
            description="cls_norm (a LayerNorm) of every last-stage token, their mean, then cls_head",
        )


FAMILIES = (Dat(),)
