"""Brute-force references of the definitions in docs/definitions.md, written without vitviz's code.

Family tests build each block's dense (T x T) matrix themselves (their own loops
over windows, shifts and reduced keys) and the merge matrices from the written
rule, then compare vitviz's numbers with these full matrix products.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def rownorm(m: np.ndarray) -> np.ndarray:
    return m / m.sum(axis=-1, keepdims=True)


def merge_matrix(prev_grid, grid, parent_of, prev_prefix: int = 0, prefix: int = 0, carried=()) -> np.ndarray:
    """``M`` (T_new, T_old): row of new token = mean of the rows of the old tokens inside its cell.

    ``parent_of(r, c) -> (R, C)``: the new cell holding old token (r, c). ``carried``:
    pairs (new prefix index, old prefix index) of prefix tokens present in both stages;
    other new prefix tokens (a CLS entering here) get a zero row.
    """
    gh, gw = grid
    ph, pw = prev_grid
    m = np.zeros((prefix + gh * gw, prev_prefix + ph * pw))
    for r in range(ph):
        for c in range(pw):
            pr, pc = parent_of(r, c)
            m[prefix + pr * gw + pc, prev_prefix + r * pw + c] = 1.0
    for new, old in carried:
        m[new, old] = 1.0
    sums = m.sum(axis=1, keepdims=True)
    return np.divide(m, sums, out=np.zeros_like(m), where=sums > 0)


def rollout_reference(
    dense: Sequence[np.ndarray], stage_of_block: Sequence[int], merges: dict[int, np.ndarray], readout: np.ndarray
) -> np.ndarray:
    """``readout @ R`` with ``R = B_L ... M ... B_1``, ``B = rownorm(0.5 F + 0.5 I)``, renormalised to sum 1.

    ``dense[b]``: block b's head-fused dense matrix over its stage's tokens (rows may
    sum to less than 1 where padding was dropped). ``merges[s]``: the merge matrix
    into stage s. ``readout``: a vector over the last stage's tokens.
    """
    r = np.eye(dense[0].shape[0])
    for b, f in enumerate(dense):
        if b and stage_of_block[b] != stage_of_block[b - 1]:
            r = merges[stage_of_block[b]] @ r
        bmat = rownorm(0.5 * f + 0.5 * np.eye(f.shape[0]))
        r = bmat @ r
    row = readout @ r
    return row / row.sum()


def relevance_reference(
    abar: Sequence[np.ndarray], stage_of_block: Sequence[int], merges: dict[int, np.ndarray], readout: np.ndarray
) -> np.ndarray:
    """``readout @ R`` with ``R = (I + Abar_L) ... M ... (I + Abar_1)``, raw (Chefer et al. through stages)."""
    r = np.eye(abar[0].shape[0])
    for b, a in enumerate(abar):
        if b and stage_of_block[b] != stage_of_block[b - 1]:
            r = merges[stage_of_block[b]] @ r
        r = r + a @ r
    return readout @ r


def mean_distance_reference(rows: np.ndarray, q_centres: np.ndarray, k_centres: np.ndarray) -> float:
    """Mean over queries of sum_k w_qk * |centre(q) - centre(k)| with each row renormalised: rows (Nq, Nk)."""
    d = np.sqrt(((q_centres[:, None, :] - k_centres[None, :, :]) ** 2).sum(-1))
    w = rows / rows.sum(axis=1, keepdims=True)
    return float((w * d).sum(axis=1).mean())


def centres(grid, input_size) -> np.ndarray:
    """(N, 2) pixel (y, x) of cell centres of ``grid`` laid over an input of ``input_size`` (h, w)."""
    gh, gw = grid
    h, w = input_size
    return np.array([((r + 0.5) * h / gh, (c + 0.5) * w / gw) for r in range(gh) for c in range(gw)])
