"""The values at one point for batches of images, from the hook registry (what training and the measures read).

One forward per batch, ``vitviz.models.hooks.active(loaded, record=[point])`` around
``vitviz.capture.forward.forward_output``: no hooks of vitviz.sae's own. The token layout (prefix tokens, patch grid)
comes from the first image's Run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vitviz.sae.model import SAEError

__all__ = ["point_layout", "point_values", "select_tokens"]


def point_layout(loaded, point: str, image, size) -> tuple[tuple[int, int], int, int, int, int]:
    """(input size, tokens at the point, prefix tokens, patch tokens, width) from the image's Run (the registry's
    own forward): the layout every batch must then have."""
    from vitviz.capture.forward import input_size_for
    from vitviz.capture.run import get_run
    from vitviz.sae.run import token_grid

    hw = input_size_for(loaded, size, image.size)
    run = get_run(loaded, image, size=hw, gradients=False)
    if point not in run.points:
        near = [n for n in run.points.names() if n.endswith(".out")][:6]
        raise SAEError(f"'{loaded.name}' has no point {point!r} (some it has: {', '.join(near)})")
    n_prefix, (gh, gw) = token_grid(run, point)
    x = run.activation(point)
    return hw, int(x.shape[1]), n_prefix, gh * gw, int(x.shape[-1])


def point_values(loaded, point: str, images: Sequence, hw: tuple[int, int], *, edits=()) -> tuple[torch.Tensor, Any]:
    """The values at ``point`` ``(B, T, d)`` float32 of a batch of images and the forward's output, from one
    forward with the point recorded by the hook registry (``edits`` applied in the same forward)."""
    from vitviz.capture.forward import forward_output, preprocess
    from vitviz.models.hooks import active

    pixels, _ = preprocess(loaded, list(images), hw)
    with torch.inference_mode(), active(loaded, record=[point], edits=list(edits)) as state:
        out = forward_output(loaded, pixels, hw)
    return state.values[point].float(), out


def select_tokens(x: torch.Tensor, tokens: str, n_prefix: int, n_patch: int) -> torch.Tensor:
    """``(B, T, d)`` -> ``(B * n, d)``: the patch tokens, or every token."""
    if tokens == "patches":
        x = x[:, n_prefix : n_prefix + n_patch]
    return x.reshape(-1, x.shape[-1])
