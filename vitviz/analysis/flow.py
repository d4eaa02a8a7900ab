"""A readout row carried back through blocks and stage merges (rollout and relevance share it).

Rollout and relevance are products of one factor per block, ``R = F_L ... F_1``,
with a merge matrix ``M`` between stages: where patch merging (Swin) or a strided
patch embedding (PvT, CvT) maps stage s to s + 1, each new token's row of R is the
mean of the rows of the stage-s tokens inside its cell, so ``R`` always maps the
current stage's tokens onto the first stage's. A prefix token that enters at a
later stage (CvT's and PvT v1's CLS) starts with a zero row. The maps need one row
of R only, ``u R``: computed from the left, ``u F_L``, then ``(u F_L) F_{L-1}``, ...,
each a vector-matrix product on the block's native form, which gives the numbers
of the dense product at a fraction of its cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vitviz.record import POOLED, Geometry, Stage

__all__ = ["readout_vector", "merge_left", "propagate"]

Step = Callable[[Geometry, np.ndarray, np.ndarray], np.ndarray]


def readout_vector(stage: Stage, query: int | None, readout: str = "cls") -> np.ndarray:
    """``u`` over the stage's tokens: ``query`` one-hot or pooled; for ``query`` None, what the model reads.

    The model's readout: CLS one-hot where it reads its CLS token (``readout`` "cls" and
    a CLS present), else the pooled query (the mean over the grid tokens), as for models
    that mean-pool even though they have a CLS token (BEiT, CLIP's classifier).
    """
    u = np.zeros(stage.num_tokens, dtype=np.float64)
    if query is None:
        query = stage.prefix_kinds.index("CLS") if readout == "cls" and "CLS" in stage.prefix_kinds else POOLED
    if query == POOLED:
        u[stage.num_prefix :] = 1.0 / (stage.num_tokens - stage.num_prefix)
    else:
        u[query] = 1.0
    return u


def merge_left(r: np.ndarray, prev: Stage, stage: Stage) -> np.ndarray:
    """``r @ M``: a row over ``stage``'s tokens -> the same row over ``prev``'s tokens.

    ``M[new, old] = 1 / |cell(new)|`` for the old tokens inside the new token's cell;
    prefix tokens present in both stages carry over, one that enters has a zero row.
    """
    if stage.parents is None:
        raise ValueError(f"no token-to-token path crosses into stage {stage.index}")
    pr, pc = stage.parents
    gh, gw = stage.grid
    grid = r[stage.num_prefix :].reshape(gh, gw)
    count_r = np.bincount(pr, minlength=gh).astype(np.float64)
    count_c = np.bincount(pc, minlength=gw).astype(np.float64)
    old = grid[pr][:, pc] / (count_r[pr][:, None] * count_c[pc][None, :])
    prefix = np.array(
        [r[stage.prefix_kinds.index(k)] if k in stage.prefix_kinds else 0.0 for k in prev.prefix_kinds],
        dtype=np.float64,
    )
    return np.concatenate([prefix, old.ravel()])


def propagate(
    geometries: Sequence[Geometry],
    stages: Sequence[Stage],
    mats: Mapping[int, np.ndarray],
    step: Step,
    *,
    query: int | None = None,
    start: int = 0,
    stop: int | None = None,
    readout: str = "cls",
) -> tuple[np.ndarray, int]:
    """``u F_{stop-1} ... F_start`` with merges; returns the row and the stage it lives on (that of ``start``).

    ``mats[b]``: block b's native matrix (heads already fused) that ``step`` reads;
    ``query``: a token of the stage of block ``stop - 1`` (None: CLS if present, else
    the pooled query; ``readout`` "pooled" reads the pooled query even where there is a
    CLS). A pooling head (kind ``pool``) ending the range is the readout:
    its probe's row over the stage's tokens starts the product (``query`` is ignored).
    """
    n = len(geometries)
    stop = n if stop is None else stop
    if not 0 <= start < stop <= n:
        raise ValueError(f"block range [{start}, {stop}) is empty or outside 0..{n}")
    last = geometries[stop - 1]
    if last.kind == "pool":  # the pooling head's probe reads out: its row (the probe itself carries no image)
        if stop - 1 == start:
            raise ValueError("a range holding only the pooling head has no token to carry its row back to")
        row = np.asarray(mats[stop - 1], dtype=np.float64)
        r = row[: stages[last.stage].num_tokens].copy()  # trailing padding keys dropped
        stop -= 1
    else:
        r = readout_vector(stages[last.stage], query, readout)
    for b in range(stop - 1, start - 1, -1):
        g = geometries[b]
        if b < stop - 1 and geometries[b + 1].stage != g.stage:
            r = merge_left(r, stages[g.stage], stages[geometries[b + 1].stage])
        r = np.asarray(step(g, mats[b], r), dtype=np.float64)
    return r, geometries[start].stage
