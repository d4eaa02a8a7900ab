"""Two panes side by side: the same view of two records, kept in step where it means the same (no torch).

What is shared between the panes, and how it is carried from one record to the other:

* **the clicked point**: a point of the image, as fractions ``(fx, fy)`` of the model input's
  width and height; each pane asks its own record for the token whose cell holds that point
  (:meth:`Capture.token_at`), whatever its grid (14 x 14 and a Swin's 8 x 8 alike). Without a
  click, each pane shows its default query (CLS, else the pooled query).
* **the block**: by relative depth, ``round(b * (L_to - 1) / (L_from - 1))`` (Python's round, half to
  even), so layer 11 of 12 is block 5 of 6; equal depths map one to one.
* **the head**: the same index, clamped to the pane's block.

:func:`difference` is defined only where both maps lie on the same grid (a minus b); the
page draws it on a symmetric colour scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from vitviz.analysis.blocks import head_maps
from vitviz.analysis.rollout import capture_rollout
from vitviz.record import POOLED, Capture

__all__ = ["PANE_VIEWS", "PaneMap", "depth_match", "difference", "pane_map", "point_of", "token_of"]

PaneView = Literal["head", "mean", "rollout"]
PANE_VIEWS: tuple[str, ...] = ("head", "mean", "rollout")


@dataclass(frozen=True)
class PaneMap:
    """One pane's map: ``values`` (gh, gw) on ``stage``'s grid, its title, the query's cell (or None)."""

    values: np.ndarray
    title: str
    stage: int
    marked: tuple[int, int] | None


def depth_match(block: int, n_from: int, n_to: int) -> int:
    """The block at the same relative depth: ``round(block * (n_to - 1) / (n_from - 1))`` (0 for one block)."""
    if n_from <= 1 or n_to <= 1:
        return 0
    return round(min(max(block, 0), n_from - 1) * (n_to - 1) / (n_from - 1))  # half to even


def point_of(cap: Capture, stage: int, token: int) -> tuple[float, float] | None:
    """A grid token's cell centre as fractions of the input's width and height; None for prefix tokens."""
    centre = cap.token_centre(stage, token)
    if centre is None:
        return None
    h, w = cap.input_size
    return centre[0] / w, centre[1] / h


def token_of(cap: Capture, stage: int, point: tuple[float, float] | None) -> int:
    """The stage token at a point given as fractions (the default query, CLS or pooled, when ``point`` is None)."""
    if point is None:
        return cap.default_query(stage)
    h, w = cap.input_size
    fx, fy = (min(max(float(v), 0.0), 1.0) for v in point)
    return cap.token_at(stage, min(fx * w, w - 1e-6), min(fy * h, h - 1e-6))


def _marked(cap: Capture, stage: int, token: int, grid: tuple[int, int]) -> tuple[int, int] | None:
    centre = cap.token_centre(stage, token) if token != POOLED else None
    if centre is None:
        return None
    h, w = cap.input_size
    return int(centre[1] * grid[0] // h), int(centre[0] * grid[1] // w)


def pane_map(
    cap: Capture, view: PaneView, *, block: int, head: int = 0, point: tuple[float, float] | None = None
) -> PaneMap:
    """The map a pane shows. ``head``: where the query looks for one head of ``block``; ``mean``: the mean over
    that block's heads; ``rollout``: attention rollout of what the model reads, through every block, on the
    first stage's grid (``point`` does not apply). Raises ``ValueError`` where the view is undefined."""
    if view == "rollout":
        row, s = capture_rollout(cap)
        stage = cap.stages[s]
        return PaneMap(row[stage.num_prefix :].reshape(stage.grid), f"{cap.model_name}: rollout, all blocks", s, None)
    if view not in ("head", "mean"):
        raise ValueError(f"unknown view {view!r}: one of {', '.join(PANE_VIEWS)}")
    b = cap.blocks[block]
    token = token_of(cap, b.stage, point)
    maps = head_maps(b, token)
    h = min(max(head, 0), b.num_heads - 1)
    if view == "head":
        values, what = maps.values[h], f"head {h}"
    else:
        values, what = maps.values.mean(axis=0), f"mean of {b.num_heads} heads"
    who = cap.token_label(token, b.stage)
    title = f"{cap.model_name}: {cap.block_label(block)}, {what}, where {who} looks"
    return PaneMap(values.astype(np.float32), title, b.stage, _marked(cap, b.stage, token, maps.grid))


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``a - b`` where both maps lie on the same grid, else None (no cell-by-cell meaning)."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a - b if a.shape == b.shape else None
