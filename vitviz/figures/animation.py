"""A view stepping through the blocks, as a GIF over the photo (Pillow): one frame per block, each labelled.

Views (:func:`view_stack`, one map per frame, each on its own block's grid):

* ``head``: head ``h`` of every block, where the query looks (the global query by
  default: CLS, or the pooled query where there is none); blocks with fewer heads
  are left out;
* ``mean``: the mean over heads of every block (the same query);
* ``rollout``: rollout from the first block up to block ``b`` (what the model reads
  at block ``b``'s stage), for ``b = 0 .. B - 1``, on the first stage's grid;
* ``lens``: the per-patch logit lens, ``(L + 1, gh, gw)`` as given (row 0 the
  embeddings); computed elsewhere (it needs the model), passed in.

Frames (:func:`gif_frames`) are :func:`~vitviz.figures.overlay.photo_overlay` of each map
over the photo at :func:`~vitviz.figures.overlay.export_size` (``max_side``), on one colour
scale shared by every frame (default, so that frames compare) or each on its own, with
a black band of :data:`BAND` pixels above the picture holding the frame's label in
white. :func:`gif_bytes` writes them as a looping GIF (each frame quantised to 256
colours by Pillow).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitviz.analysis.blocks import global_query, head_maps, row_map, select
from vitviz.analysis.rollout import capture_rollout
from vitviz.figures.overlay import Scale, Upsampling, colour_limits, fit_photo, photo_overlay
from vitviz.record import Capture

__all__ = ["VIEWS", "View", "BAND", "lens_rows", "view_stack", "gif_frames", "gif_bytes"]

View = Literal["head", "mean", "rollout", "lens"]
VIEWS: tuple[str, ...] = ("head", "mean", "rollout", "lens")
BAND = 20  # pixels of the label band above each frame


def view_stack(
    cap: Capture,
    view: View,
    *,
    head: int = 0,
    query: int | None = None,
    lens: np.ndarray | None = None,
) -> tuple[list[np.ndarray], list[str]]:
    """The maps of one view, one per frame, and their labels (module docstring).

    ``query``: a token of the first stage for ``head`` and ``mean`` (None: each block's
    global query; blocks of a later stage always use their global query). ``lens``:
    ``(L + 1, gh, gw)`` for ``view="lens"``. Raises ``ValueError`` for a view this
    capture cannot give (rollout where it is undefined, lens without its array, a head
    no block has).
    """
    maps, labels = [], []
    if view in ("head", "mean"):
        for b, block in enumerate(cap.blocks):
            q = query if (query is not None and block.stage == 0) else global_query(block)
            if view == "head":
                if head >= block.num_heads:
                    continue
                maps.append(head_maps(block, q).values[head])
                labels.append(f"{cap.block_label(b)}, head {head}")
            else:
                maps.append(row_map(block.geometry, select(block, fusion="mean"), q).values)
                labels.append(f"{cap.block_label(b)}, mean of {block.num_heads} heads")
        if not maps:
            raise ValueError(f"no block has a head {head}")
    elif view == "rollout":
        if cap.rollout_note:
            raise ValueError(cap.rollout_note)
        for b in range(cap.num_blocks):
            row, s = capture_rollout(cap, stop=b + 1)
            stage = cap.stages[s]
            maps.append(row[stage.num_prefix :].reshape(stage.grid))
            labels.append(f"rollout of blocks 0-{b}" if b else "rollout of block 0")
    elif view == "lens":
        if lens is None:
            raise ValueError("the per-patch lens is not available for this model")
        maps = list(np.asarray(lens))
        if len(maps) != cap.num_blocks + 1:
            raise ValueError(f"the lens has {len(maps)} rows; this model has {cap.num_blocks} blocks (+1 embeddings)")
        labels = [f"lens: {row}" for row in lens_rows(cap)[0]]
    else:
        raise ValueError(f"unknown view {view!r}; choose one of {', '.join(VIEWS)}")
    return maps, labels


def lens_rows(cap: Capture) -> tuple[list[str], list[str]]:
    """The logit lens's rows named as the rest of the app names blocks, and their short forms for an axis.

    Row 0 is the embeddings, row l the residual stream after block l - 1 (blocks 0-based, as the Block slider
    and :meth:`Capture.block_label`: "after block 3", "after stage 1, block 1"); short: "emb", "3", "s1.1".
    """
    rows, ticks = ["embeddings"], ["emb"]
    for b, block in enumerate(cap.blocks):
        rows.append(f"after {cap.block_label(b)}")
        if block.kind == "pool":
            ticks.append("pool")
        elif len(cap.stages) == 1:
            ticks.append(str(b))
        else:
            ticks.append(f"s{block.stage}.{cap.stages[block.stage].blocks.index(b)}")
    return rows, ticks


def _label_band(width: int, text: str) -> np.ndarray:
    band = Image.new("RGB", (width, BAND), (0, 0, 0))
    ImageDraw.Draw(band).text((4, 4), text, fill=(255, 255, 255), font=ImageFont.load_default())
    return np.asarray(band)


def gif_frames(
    photo: Image.Image,
    maps: Sequence[np.ndarray],
    labels: Sequence[str],
    *,
    scale: Scale = "shared",
    mode: Upsampling = "bilinear",
    opacity: float = 0.6,
    threshold: float = 0.0,
    max_side: int = 512,
) -> list[np.ndarray]:
    """RGB uint8 frames ``(BAND + h, w, 3)``: the label band over :func:`photo_overlay` of each map."""
    if len(maps) != len(labels) or not maps:
        raise ValueError(f"need one label per map and at least one map, got {len(maps)} maps, {len(labels)} labels")
    base = fit_photo(photo, max_side)
    limits = colour_limits(maps, scale=scale)
    return [
        np.concatenate(
            [
                _label_band(base.shape[1], text),
                photo_overlay(base, m, limits=lim, mode=mode, opacity=opacity, threshold=threshold),
            ]
        )
        for m, text, lim in zip(maps, labels, limits, strict=True)
    ]


def gif_bytes(frames: Sequence[np.ndarray], *, duration_ms: int = 700) -> bytes:
    """A looping GIF of RGB uint8 frames, ``duration_ms`` per frame."""
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8), "RGB") for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=duration_ms, loop=0)
    return buf.getvalue()
