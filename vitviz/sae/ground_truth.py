"""Ground truth on the synthetic shapes: does one feature track "this patch lies on a shape of class c"?

For held-out shape images (:func:`vitviz.data.shapes.make_sample`, whose mask says which pixels are the shape's),
each patch of the model's grid is labelled from the mask:

* **positive** for the image's class: at least half of the patch's pixels belong to the shape itself;
* **negative** (for every class): no pixel of the patch belongs to the shape, whatever the image's class;
* left out: patches partly covered (some shape pixels, fewer than half).

For each class and each feature, the AUROC of the feature's activation separating that class's positives from
all negatives (the probability that a random positive patch outranks a random negative one, ties counted
half); the best single feature per class is reported (saev's probe evaluation, a feature per concept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vitviz.sae.model import SAEError, SparseAutoencoder

__all__ = ["POSITIVE", "NEGATIVE", "PARTIAL", "patch_labels", "auroc", "sparse_auroc", "ShapeScore", "shape_auroc"]

POSITIVE, NEGATIVE, PARTIAL = 1, 0, -1


def patch_labels(mask: np.ndarray, patch: int) -> np.ndarray:
    """``(gh, gw)`` int8 of a ``(H, W)`` bool mask cut into ``patch``-pixel squares: :data:`POSITIVE` (at least
    half the patch's pixels on the shape), :data:`NEGATIVE` (none), :data:`PARTIAL` (some)."""
    h, w = mask.shape
    if h % patch or w % patch:
        raise ValueError(f"a {h} x {w} mask does not split into {patch}-pixel patches")
    share = mask.reshape(h // patch, patch, w // patch, patch).mean(axis=(1, 3))
    out = np.full(share.shape, PARTIAL, np.int8)
    out[share >= 0.5] = POSITIVE
    out[share == 0] = NEGATIVE
    return out


def auroc(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUROC of each column: ``P(pos > neg) + P(pos == neg) / 2`` over all pairs, ``pos`` ``(P, F)``, ``neg``
    ``(N, F)`` -> ``(F,)`` float64 (the Mann-Whitney statistic; NaN without positives or negatives)."""
    pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
    if pos.ndim == 1:
        pos, neg = pos[:, None], neg[:, None]
    n_pos, n_neg = pos.shape[0], neg.shape[0]
    if n_pos == 0 or n_neg == 0:
        return np.full(pos.shape[1], np.nan)
    out = np.empty(pos.shape[1])
    for j in range(pos.shape[1]):
        s = np.sort(neg[:, j])
        below = np.searchsorted(s, pos[:, j], side="left")  # negatives strictly below each positive
        tied = np.searchsorted(s, pos[:, j], side="right") - below
        out[j] = (below.sum() + 0.5 * tied.sum()) / (n_pos * n_neg)
    return out


@dataclass
class _Sparse:
    """A ``(n, d)`` matrix of mostly zeros, kept as its nonzero entries' column ids and values."""

    n: int
    cols: np.ndarray
    vals: np.ndarray

    @classmethod
    def of(cls, dense_parts: Sequence[np.ndarray], d: int) -> _Sparse:
        cols, vals, n = [], [], 0
        for a in dense_parts:
            r, c = np.nonzero(a)
            cols.append(c)
            vals.append(a[r, c])
            n += a.shape[0]
        if not cols:
            return cls(0, np.zeros(0, np.int64), np.zeros(0))
        return cls(n, np.concatenate(cols), np.concatenate(vals).astype(np.float64))

    def columns(self, d: int) -> list[np.ndarray]:
        """The nonzero values of each of the ``d`` columns."""
        order = np.argsort(self.cols, kind="stable")
        bounds = np.searchsorted(self.cols[order], np.arange(d + 1))
        v = self.vals[order]
        return [v[bounds[j] : bounds[j + 1]] for j in range(d)]


def sparse_auroc(pos: _Sparse, neg: _Sparse, d: int) -> np.ndarray:
    """:func:`auroc` of every column of two mostly-zero matrices, from their nonzero entries (the zeros of each
    column counted, never listed): ``(d,)``."""
    if pos.n == 0 or neg.n == 0:
        return np.full(d, np.nan)
    out = np.empty(d)
    pcols, ncols = pos.columns(d), neg.columns(d)
    for j in range(d):
        p, s = pcols[j], np.sort(ncols[j])
        n_zero, p_zero = neg.n - len(s), pos.n - len(p)
        below = np.searchsorted(s, p, side="left")
        tied = np.searchsorted(s, p, side="right") - below
        below = below + np.where(p > 0, n_zero, 0)  # the column's zeros lie below a positive value
        tied = tied + np.where(p == 0, n_zero, 0)
        # the positives' zeros: above the column's negative values, tied with its zeros
        zero_part = p_zero * (np.searchsorted(s, 0.0, side="left") + 0.5 * n_zero)
        out[j] = (below.sum() + 0.5 * tied.sum() + zero_part) / (pos.n * neg.n)
    return out


@dataclass(frozen=True)
class ShapeScore:
    """The best feature for one class: its ``feature`` id and ``auroc``; ``positives`` and ``negatives`` counted;
    ``runner_up`` the second best feature's AUROC."""

    label: str
    feature: int
    auroc: float
    runner_up: float
    positives: int
    negatives: int


def shape_auroc(
    sae: SparseAutoencoder,
    loaded,
    seeds: Sequence[int],
    *,
    batch: int = 50,
    progress: Callable | None = None,
) -> list[ShapeScore]:
    """The best single feature's AUROC per shape class on the images ``make_sample(seed)`` (module docstring),
    the SAE read at its point on ``loaded`` (a model of the demo's grid: one token per patch of the image)."""
    from vitviz.data.shapes import CLASSES, make_sample
    from vitviz.sae.activations import point_layout, point_values

    point = sae.cfg.point
    if point is None:
        raise SAEError("the SAE does not say which point it reads")
    samples = [make_sample(int(s)) for s in seeds]
    if not samples:
        raise SAEError("no images to score")
    hw, _, n_prefix, n_patch, _ = point_layout(loaded, point, samples[0].image, None)
    side = samples[0].image.size[0]
    g = round(n_patch**0.5)
    if hw != (side, side) or g * g != n_patch or side % g:
        raise SAEError(f"the ground truth needs a square grid of patches over the {side}-pixel image at {point}")
    patch = side // g
    pos: dict[int, list[np.ndarray]] = {c: [] for c in range(len(CLASSES))}
    neg: list[np.ndarray] = []
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        x, _ = point_values(loaded, point, [s.image for s in chunk], hw)
        with torch.no_grad():
            f = sae.encode(x[:, n_prefix : n_prefix + n_patch]).numpy()  # (B, N, F)
        for s, fi in zip(chunk, f, strict=True):
            lab = patch_labels(s.mask, patch).reshape(-1)
            pos[s.label].append(fi[lab == POSITIVE])
            neg.append(fi[lab == NEGATIVE])
        if progress:
            progress("ground truth", min(start + batch, len(samples)), len(samples), {})
    negatives = _Sparse.of(neg, sae.d_sae)
    out = []
    for c, name in enumerate(CLASSES):
        p = _Sparse.of(pos[c], sae.d_sae)
        scores = sparse_auroc(p, negatives, sae.d_sae)
        order = np.argsort(-np.nan_to_num(scores, nan=-1.0), kind="stable")
        out.append(
            ShapeScore(
                label=name,
                feature=int(order[0]),
                auroc=float(scores[order[0]]),
                runner_up=float(scores[order[1]]) if len(order) > 1 else float("nan"),
                positives=p.n,
                negatives=negatives.n,
            )
        )
    return out
