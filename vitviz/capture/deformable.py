"""Deformable attention (DAT) as it ran: each deformable block's sampled key points and attention over them.

A deformable block does not attend to grid tokens: each group of heads samples the
block input at ``Hk x Wk`` points, a reference grid moved by learned offsets, and
every query attends over those samples. The record keeps the block's attention
spread onto the stage grid (:mod:`vitviz.models.families.dat`); this module gives the
native form, which the record does not hold (the points differ per image):

* :func:`deformable_samples` runs the model once on an image through vitviz's hooks
  (the probabilities the block computed and the positions it sampled at) and returns
  one :class:`DeformableSamples` per deformable block;
* :func:`query_points` picks one head and one query: the sampled points, their
  weights (a softmax over the samples: they sum to 1) and the reference points, in
  pixels of the model input. :func:`vitviz.figures.deformable.deformable_figure` draws them.

Pixel placement. A sampled position ``p`` (normalised, ``grid_sample`` with
``align_corners=True``) reads the stage map at feature pixel ``f = (p + 1) / 2 * (n - 1)``
along an axis of n tokens; feature pixel f is the centre of token f, at image pixel
``(f + 0.5) * size / n``. Reference points sit at ``(i + 0.5) / n * 2 - 1``, so the
point a zero offset samples is a little inside the centre of token i (the authors'
mixed conventions): it is drawn where it is read, not at the cell centre. Points
may leave the map; they read zeros there (in part or in whole) and are drawn where
they are, outside the image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vitviz.capture.forward import BlockRecorder, input_size_for, preprocess, run_forward
from vitviz.models.families.base import Call
from vitviz.models.load import LoadedModel
from vitviz.record import POOLED, QueryPoints
from vitviz.zoo.dat_blocks import reference_points

__all__ = ["DeformableSamples", "QueryPoints", "to_pixels", "deformable_samples", "query_points"]


def to_pixels(pos: np.ndarray, grid: tuple[int, int], input_size: tuple[int, int]) -> np.ndarray:
    """Normalised ``(..., 2)`` (y, x) positions on a ``grid`` map -> ``(..., 2)`` (x, y) pixels of the model input."""
    (n_h, n_w), (h, w) = grid, input_size
    fy = (pos[..., 0] + 1) / 2 * (n_h - 1)
    fx = (pos[..., 1] + 1) / 2 * (n_w - 1)
    return np.stack([(fx + 0.5) * w / n_w, (fy + 0.5) * h / n_h], axis=-1)


@dataclass(frozen=True, eq=False)
class DeformableSamples:
    """One deformable block of one image.

    ``block``: the block's index in the capture (forward order); ``grid``: its stage map;
    ``positions`` / ``references``: ``(groups, Ns, 2)`` (x, y) pixels of the model input;
    ``attention``: ``(heads, N, Ns)`` float32 probabilities, row = query token of the
    stage map (row-major), column = sample; head h uses group ``h // (heads // groups)``.
    ``normalised``: the positions as the block used them, ``(groups, Ns, 2)`` (y, x).
    """

    block: int
    stage: int
    grid: tuple[int, int]
    input_size: tuple[int, int]
    positions: np.ndarray
    references: np.ndarray
    attention: np.ndarray
    normalised: np.ndarray

    @property
    def num_heads(self) -> int:
        return int(self.attention.shape[0])

    @property
    def groups(self) -> int:
        return int(self.positions.shape[0])

    def group_of(self, head: int) -> int:
        return head // (self.num_heads // self.groups)


class _Sampler(BlockRecorder):
    """Keeps, for each deformable block, the probabilities over its samples and the positions it sampled at."""

    def __init__(self, loaded: LoadedModel, call: Call) -> None:
        super().__init__(loaded, call)
        self.native: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def on_attention(self, site, module, args, kwargs, output) -> None:
        positions = args[1] if len(args) > 1 else kwargs.get("positions")
        if positions is not None:
            self.native[site.index] = (output.detach(), positions.detach())
        super().on_attention(site, module, args, kwargs, output)

    def block(self, site, g, raw, module, args, kwargs, output) -> None:
        pass


def deformable_samples(
    loaded: LoadedModel, image: Image.Image, size: int | tuple[int, int] | None = None
) -> list[DeformableSamples]:
    """Run ``image`` through a DAT model once and return its deformable blocks' samples, in forward order.

    The same input as :func:`vitviz.capture.forward.capture` at the same ``size`` (DAT runs
    at its configured size only), so block indices and query tokens match the capture's.
    """
    hw = input_size_for(loaded, size)
    pixels, _ = preprocess(loaded, [image], hw)
    rec = _Sampler(loaded, Call(loaded.config, hw, 1))
    with torch.inference_mode():
        run_forward(loaded, pixels, rec)
    out = []
    for index in sorted(rec.native):
        attn, pos = rec.native[index]
        g = rec.geometries[index]
        groups = int(pos.shape[0])  # batch of one: (groups, Hk, Wk, 2)
        hk, wk = int(pos.shape[1]), int(pos.shape[2])
        ref = reference_points(hk, wk, groups, pos.dtype, pos.device)
        norm = pos.reshape(groups, hk * wk, 2).float().cpu().numpy()
        out.append(
            DeformableSamples(
                block=index,
                stage=g.stage,
                grid=g.grid,
                input_size=hw,
                positions=to_pixels(norm, g.grid, hw),
                references=to_pixels(ref.reshape(groups, hk * wk, 2).float().cpu().numpy(), g.grid, hw),
                attention=attn.float().cpu().numpy(),
                normalised=norm,
            )
        )
    return out


def _on_map(norm: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Share of each point's 4 bilinear corners (align_corners=True) that lie on the map, weighted."""
    share = np.ones(norm.shape[0])
    for axis, n in ((0, grid[0]), (1, grid[1])):
        p = (norm[:, axis].astype(np.float64) + 1) / 2 * (n - 1)
        lo = np.floor(p)
        frac = p - lo
        share *= np.where((lo >= 0) & (lo <= n - 1), 1 - frac, 0.0) + np.where(
            (lo + 1 >= 0) & (lo + 1 <= n - 1), frac, 0.0
        )
    return share


def query_points(samples: DeformableSamples, head: int, token: int) -> QueryPoints:
    """Head ``head``'s attention from query ``token`` over its sampled points.

    ``token``: a row-major index on the stage map, or ``POOLED`` (-1), the pooled query
    DAT's readout uses (the mean of every query's row; it has no place, ``query`` None).
    """
    n_h, n_w = samples.grid
    if token != POOLED and not 0 <= token < n_h * n_w:
        raise ValueError(f"query {token} is not a token of the {n_h} x {n_w} map")
    if not 0 <= head < samples.num_heads:
        raise ValueError(f"head {head} does not exist (the block has {samples.num_heads})")
    g = samples.group_of(head)
    h, w = samples.input_size
    if token == POOLED:
        query, weights = None, samples.attention[head].mean(axis=0)
    else:
        row, col = divmod(token, n_w)
        query, weights = ((col + 0.5) * w / n_w, (row + 0.5) * h / n_h), samples.attention[head, token]
    return QueryPoints(
        head=head,
        token=token,
        query=query,
        points=samples.positions[g],
        weights=weights,
        references=samples.references[g],
        on_map=_on_map(samples.normalised[g], samples.grid),
    )
