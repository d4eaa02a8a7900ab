"""Score a demo model as the app shows it: vitviz's own capture, then rollout of the readout row.

Works for any family vitviz captures: plain ViTs (CLS readout) and hierarchical
models such as Swin (pooled readout, the row on the first stage's grid), since it
goes through :func:`vitviz.capture.forward.capture_batch` and
:func:`vitviz.analysis.rollout.capture_rollout` rather than the model's own
``output_attentions``.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from vitviz.analysis.rollout import capture_rollout
from vitviz.demo.vit import DemoScore, peak_in_box
from vitviz.record import Capture

__all__ = ["rollout_grid", "capture_peak_in_box", "score_capture_rollout"]


def rollout_grid(cap: Capture) -> np.ndarray:
    """The readout's rollout row on the first stage's grid ``(gh, gw)`` (prefix tokens dropped)."""
    row, stage = capture_rollout(cap)
    s = cap.stages[stage]
    return row[s.num_prefix :].reshape(s.grid)


def capture_peak_in_box(cap: Capture, box: tuple[int, int, int, int]) -> bool:
    """Does the rollout peak's cell centre, ``((col + 0.5) W / gw, (row + 0.5) H / gh)``, lie in ``box``?"""
    grid = rollout_grid(cap)
    (h, w), (gh, gw) = cap.input_size, grid.shape
    if h * gw != w * gh:
        raise ValueError(f"cells of {w / gw} x {h / gh} px are not square; peak_in_box needs square cells")
    return peak_in_box(grid, tuple(int(v) for v in box), w / gw)


def score_capture_rollout(
    loaded, images: np.ndarray, labels: np.ndarray, boxes: np.ndarray, *, batch: int = 50
) -> DemoScore:
    """Top-1 accuracy and rollout-peak-in-box rate of a loaded model on uint8 images ``(B, S, S, 3)``."""
    from vitviz.capture.forward import capture_batch

    correct = hits = 0
    for i in range(0, len(images), batch):
        caps = capture_batch(loaded, [Image.fromarray(a) for a in images[i : i + batch]], top_k=1)
        for j, cap in enumerate(caps):
            correct += int(cap.predictions[0].index == int(labels[i + j]))
            hits += capture_peak_in_box(cap, boxes[i + j])
    n = len(images)
    return DemoScore(accuracy=correct / n, peak_in_box=hits / n, n=n)
