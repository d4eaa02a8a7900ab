"""Questions about one block's attention, whatever its native form (see ``vitviz.record``).

Every function takes a block's :class:`~vitviz.record.Geometry` and one
native matrix with the head axis already chosen (``select`` does that):

* ``global``: ``(Tq, Tk)``; ``window``: ``(nW, w*w, w*w)``; ``unfolded``: ``(A, N, N)``;
  ``separable``: ``(A, N)``.

Definitions (``docs/definitions.md#hierarchical-models``):

* **Windows** (Swin): the grid is padded on the bottom and right to multiples of w
  and rolled by ``(-s, -s)``. Original position i along an axis sits at shifted
  index ``(i - s) mod n``; the key at shifted index j is original position
  ``(j + s) mod n``. A query's map is its window row with every key moved back to
  its original position, zero outside its window; attention to padding tokens is
  left out of the map and reported as a share.
* **Reduced keys** (PvT, PvT v2, CvT): the query map is the row on the key grid as
  it is. The dense view spreads each key's weight evenly over the stage tokens its
  cell covers (``Geometry.key_rule``), so rows still sum to 1.
* **Finer keys** (Hiera's query-pooling blocks, key rule ``finer``): the keys are the
  previous stage's tokens, ``key_stride`` times finer per axis, globally or in windows
  (mask units, no shift or padding). The query map is the row on the key grid; the
  dense view puts each key's weight on the stage token whose cell holds it (the same
  rule: a finer key cell is covered by exactly one stage token), and "who looks at"
  a stage token sums the columns of the keys inside it.
* **Unfolded patches** (MobileViT): the map of query patch q is the mean over
  offsets of that offset's row of q. **Separable** (MobileViT V2): the mean over
  offsets of the context scores; there is no query.
* The **pooled query** (``POOLED``) is the mean of the rows of all grid tokens
  (padding tokens excluded): the global view of models without a CLS token.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from vitviz.errors import BudgetError
from vitviz.record import POOLED, Block, Geometry

__all__ = [
    "RowMap",
    "select",
    "window_layout",
    "key_assignment",
    "key_spread",
    "key_of_token",
    "keys_in_token",
    "summed_to",
    "token_of_key",
    "row_map",
    "column_map",
    "dense",
    "left_apply",
    "row_sums",
    "cell_centres",
    "block_summaries",
    "allowed_keys",
    "HeadMaps",
    "head_maps",
    "global_query",
    "window_edges",
]

Fusion = Literal["mean", "max", "min"]


@dataclass(frozen=True, eq=False)
class RowMap:
    """A query's attention placed on a grid.

    ``values``: ``(gh, gw)`` float32 on ``grid`` (the key grid for reduced keys, else
    the stage grid), raw weights; ``prefix``: ``(P,)`` weights on the prefix tokens;
    ``padding``: the share that went to padding tokens (not on the image).
    """

    values: np.ndarray
    grid: tuple[int, int]
    prefix: np.ndarray
    padding: float


def select(block: Block, *, head: int | None = None, fusion: Fusion = "mean") -> np.ndarray:
    """The block's native matrix for one head, or fused over heads (mean: float32 from before storage)."""
    a = block.attention
    if block.kind == "separable":
        return np.asarray(block.fused if head is None else a, dtype=np.float32)
    axis = 0 if block.kind in ("global", "pool") else 1
    if head is not None:
        if not 0 <= head < block.num_heads:
            raise ValueError(f"head {head} is outside 0..{block.num_heads - 1}")
        return np.asarray(np.take(a, head, axis=axis), dtype=np.float32)
    if fusion == "mean":
        return np.asarray(block.fused, dtype=np.float32)
    if fusion == "max":
        return a.max(axis=axis).astype(np.float32)
    if fusion == "min":
        return a.min(axis=axis).astype(np.float32)
    raise ValueError(f"unknown head fusion {fusion!r}; choose mean, max or min")


# --- windows -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class WindowLayout:
    """Where each window slot comes from, and where each real token went.

    ``rows``, ``cols``: ``(nW, w*w)`` original grid position of every window slot
    (padding positions included: ``valid`` is False there); ``slot_window``,
    ``slot_index``: ``(gh*gw,)`` window and slot of each real token, row-major.
    ``region``: ``(nW, w*w)`` shift-mask region id of each slot (keys of another
    region are masked for a query).
    """

    rows: np.ndarray
    cols: np.ndarray
    valid: np.ndarray
    slot_window: np.ndarray
    slot_index: np.ndarray
    region: np.ndarray


@lru_cache(maxsize=256)
def window_layout(g: Geometry) -> WindowLayout:
    w, s = g.window, g.shift
    hp, wp = g.padded
    gh, gw = g.grid
    nwr, nwc = hp // w, wp // w
    win = np.arange(nwr * nwc)
    wr, wc = np.divmod(win, nwc)
    i = np.arange(w * w)
    ir, ic = np.divmod(i, w)
    sr = wr[:, None] * w + ir[None, :]  # shifted row of each slot
    sc = wc[:, None] * w + ic[None, :]
    rows, cols = (sr + s) % hp, (sc + s) % wp
    valid = (rows < gh) & (cols < gw)
    # Swin's shift mask: three regions per axis, in shifted coordinates.
    reg_r = (sr >= hp - w).astype(int) + (sr >= hp - s).astype(int) if s else np.zeros_like(sr)
    reg_c = (sc >= wp - w).astype(int) + (sc >= wp - s).astype(int) if s else np.zeros_like(sc)
    tr, tc = np.divmod(np.arange(gh * gw), gw)
    tsr, tsc = (tr - s) % hp, (tc - s) % wp
    slot_window = (tsr // w) * nwc + tsc // w
    slot_index = (tsr % w) * w + tsc % w
    out = WindowLayout(rows, cols, valid, slot_window, slot_index, reg_r * 3 + reg_c)
    for a in (out.rows, out.cols, out.valid, out.slot_window, out.slot_index, out.region):
        a.setflags(write=False)
    return out


def _place_windows(g: Geometry, values: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-slot values ``(nW, w*w)`` -> ``(gh, gw)`` at original positions, plus the sum over padding slots."""
    lay = window_layout(g)
    out = np.zeros(g.grid, dtype=np.float32)
    out[lay.rows[lay.valid], lay.cols[lay.valid]] = values[lay.valid]
    return out, float(values[~lay.valid].sum())


@lru_cache(maxsize=256)
def _key_windows(g: Geometry) -> Geometry:
    """The windows of a windowed block's keys: ``g`` itself, or, for finer keys, the same windows on the key grid."""
    if g.key_rule != "finer":
        return g
    return Geometry(
        stage=g.stage, kind="window", num_heads=g.num_heads, grid=g.keys, window=g.key_window, padded=g.keys
    )


def _merge_finer(g: Geometry, y: np.ndarray) -> np.ndarray:
    """``(..., kh * kw)`` weights on finer keys -> ``(..., gh * gw)`` on the stage tokens holding them (sums kept)."""
    fy, fx = g.key_stride
    gh, gw = g.grid
    return y.reshape(*y.shape[:-1], gh, fy, gw, fx).sum(axis=(-3, -1)).reshape(*y.shape[:-1], gh * gw)


# --- reduced keys --------------------------------------------------------------------


def _axis_assignment(n: int, k: int, rule: str, stride: int) -> np.ndarray:
    i = np.arange(n)
    if rule == "same":
        return i
    if rule == "strided":
        return np.minimum(i // stride, k - 1)
    return np.minimum(((i + 0.5) * k / n).astype(int), k - 1)  # centre rule


@lru_cache(maxsize=256)
def key_assignment(g: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Key row of each stage row, key column of each stage column: ``(gh,)``, ``(gw,)``.

    Not defined for finer keys (a stage row holds ``key_stride`` key rows): see :func:`token_of_key`.
    """
    if g.key_rule == "finer":
        raise ValueError("a stage token holds several finer keys: ask token_of_key for the token of each key")
    (gh, gw), (kh, kw) = g.grid, g.keys
    return (
        _axis_assignment(gh, kh, g.key_rule, g.key_stride[0]),
        _axis_assignment(gw, kw, g.key_rule, g.key_stride[1]),
    )


def _axis_spread(assign: np.ndarray, k: int) -> np.ndarray:
    n = len(assign)
    s = np.zeros((k, n), dtype=np.float32)
    s[assign, np.arange(n)] = 1.0
    for j in np.flatnonzero(s.sum(axis=1) == 0):  # a key cell with no token centre: its centre's token
        s[j, min(int((j + 0.5) * n / k), n - 1)] = 1.0
    return s / s.sum(axis=1, keepdims=True)


@lru_cache(maxsize=256)
def token_of_key(g: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Finer keys: the stage row of each key row ``(kh,)`` and stage column of each key column ``(kw,)``."""
    if g.key_rule != "finer":
        raise ValueError(f"keys with rule {g.key_rule!r} are not finer than the stage grid")
    return np.arange(g.keys[0]) // g.key_stride[0], np.arange(g.keys[1]) // g.key_stride[1]


def _axis_parent(parent: np.ndarray, n: int) -> np.ndarray:
    """``(k, n)``: row j puts key j's whole weight on stage index ``parent[j]``."""
    s = np.zeros((len(parent), n), dtype=np.float32)
    s[np.arange(len(parent)), parent] = 1.0
    return s


@lru_cache(maxsize=256)
def key_spread(g: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Per-axis spread ``(kh, gh)``, ``(kw, gw)``: row j spreads key j's weight evenly over its tokens."""
    if g.key_rule == "finer":  # a finer key cell lies inside one stage token: its whole weight goes there
        pr, pc = token_of_key(g)
        return _axis_parent(pr, g.grid[0]), _axis_parent(pc, g.grid[1])
    ar, ac = key_assignment(g)
    return _axis_spread(ar, g.keys[0]), _axis_spread(ac, g.keys[1])


def keys_in_token(g: Geometry, token: int) -> np.ndarray:
    """Indices in the key sequence of the finer keys inside stage token ``token`` (row-major on the key grid)."""
    p = g.num_prefix
    r, c = divmod(token - p, g.grid[1])
    fy, fx = g.key_stride
    rows, cols = np.meshgrid(np.arange(r * fy, (r + 1) * fy), np.arange(c * fx, (c + 1) * fx), indexing="ij")
    return p + (rows * g.keys[1] + cols).ravel()


def summed_to(values: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """``(kh, kw)`` values on a grid a whole number of times finer than ``grid`` -> ``(gh, gw)``: each cell of
    ``grid`` gets the sum of the finer cells inside it (weights on finer keys, gathered on their stage token)."""
    (kh, kw), (gh, gw) = values.shape, grid
    if kh % gh or kw % gw:
        raise ValueError(f"a {kh} x {kw} map is not a whole multiple of the {gh} x {gw} grid")
    return values.reshape(gh, kh // gh, gw, kw // gw).sum(axis=(1, 3), dtype=np.float32)


def key_of_token(g: Geometry, token: int) -> int:
    """The key (index in the key sequence) whose cell holds stage token ``token``; prefix tokens map to themselves.

    Not defined for finer keys (several keys lie inside the token): see :func:`keys_in_token`.
    """
    p = g.num_prefix
    if token < p or g.kind != "global" or g.key_grid is None:
        return token
    r, c = divmod(token - p, g.grid[1])
    ar, ac = key_assignment(g)
    return p + int(ar[r]) * g.keys[1] + int(ac[c])


def _spread_keys(g: Geometry, rows: np.ndarray) -> np.ndarray:
    """``(..., Nk)`` weights on the key grid -> ``(..., N)`` on the stage grid (sums preserved)."""
    if g.key_grid is None or g.key_rule == "same":
        return rows
    sr, sc = key_spread(g)
    y = rows.reshape(*rows.shape[:-1], *g.keys)
    return np.einsum("...ab,ai,bj->...ij", y, sr, sc).reshape(*rows.shape[:-1], -1)


# --- maps ----------------------------------------------------------------------------


def row_map(g: Geometry, mat: np.ndarray, query: int) -> RowMap:
    """Where ``query`` (an index into the stage's sequence, or ``POOLED``) looks."""
    p = g.num_prefix
    empty = np.zeros(p, dtype=np.float32)
    if g.kind in ("global", "pool"):
        end = p + g.keys[0] * g.keys[1]  # trailing padding tokens follow
        if g.kind == "pool":
            row = mat
        else:
            row = mat[p : p + g.grid[0] * g.grid[1]].mean(axis=0) if query == POOLED else mat[query]
        values = row[p:end].reshape(g.keys).astype(np.float32)
        return RowMap(values, g.keys, row[:p].astype(np.float32), float(row[end:].sum()))
    if g.kind == "window":
        lay, kg = window_layout(g), _key_windows(g)
        if query == POOLED:  # column sums over each window's real queries, then placed
            per_slot = np.einsum("ni,nij->nj", lay.valid.astype(np.float32), mat) / (g.grid[0] * g.grid[1])
        else:
            n, i = lay.slot_window[query - p], lay.slot_index[query - p]
            per_slot = np.zeros((mat.shape[0], mat.shape[-1]), dtype=np.float32)
            per_slot[n] = mat[n, i]
        values, pad = _place_windows(kg, per_slot)  # on the key grid (the stage grid unless the keys are finer)
        return RowMap(values, kg.grid, empty, pad)
    if g.kind == "unfolded":
        row = mat.mean(axis=(0, 1)) if query == POOLED else mat[:, query - p].mean(axis=0)
        return RowMap(row.reshape(g.grid).astype(np.float32), g.grid, empty, 0.0)
    return RowMap(mat.mean(axis=0).reshape(g.grid).astype(np.float32), g.grid, empty, 0.0)


def column_map(g: Geometry, mat: np.ndarray, key: int) -> RowMap:
    """Who looks at stage token ``key``: the weight every grid query pays to it, on the stage grid.

    For reduced keys the column is that of the key cell holding the token. ``prefix``
    holds what each prefix token pays to it. Separable attention has no queries: its
    context scores are returned as they are.
    """
    p = g.num_prefix
    if g.kind == "pool":
        return row_map(g, mat, key)  # one probe query: who looks at a key is the probe alone
    if g.kind == "global":
        end = p + g.grid[0] * g.grid[1]
        if g.key_rule == "finer" and key >= p:  # the keys inside the token, together
            col = mat[:, keys_in_token(g, key)].sum(axis=-1)
        else:
            col = mat[:, key_of_token(g, key)]
        return RowMap(col[p:end].reshape(g.grid).astype(np.float32), g.grid, col[:p].astype(np.float32), 0.0)
    empty = np.zeros(p, dtype=np.float32)
    if g.kind == "window":
        lay = window_layout(g)
        per_slot = np.zeros(mat.shape[:2], dtype=np.float32)
        if g.key_rule == "finer":  # the keys inside the token, together: all in the token's window
            klay = window_layout(_key_windows(g))
            cells = keys_in_token(g, key) - p
            n = lay.slot_window[key - p]
            per_slot[n] = mat[n][:, klay.slot_index[cells]].sum(axis=-1)
        else:
            n, j = lay.slot_window[key - p], lay.slot_index[key - p]
            per_slot[n] = mat[n, :, j]
        values, _ = _place_windows(g, per_slot)
        return RowMap(values, g.grid, empty, 0.0)
    if g.kind == "unfolded":
        return RowMap(mat[:, :, key - p].mean(axis=0).reshape(g.grid).astype(np.float32), g.grid, empty, 0.0)
    return row_map(g, mat, POOLED)


def dense(g: Geometry, mat: np.ndarray, *, budget_bytes: int | None = None) -> np.ndarray:
    """The ``(Tq, Tq)`` matrix over the stage's tokens (prefix + grid), float32.

    Windows are undone and padding keys dropped (rows then sum to 1 minus their
    padding share); reduced keys are spread over the tokens their cells cover;
    unfolded attention is averaged over offsets. Refuses with :class:`BudgetError`
    when the matrix would exceed ``budget_bytes``.
    """
    n = g.grid[0] * g.grid[1]
    t = g.num_prefix + n
    if budget_bytes is not None and t * t * 4 > budget_bytes:
        raise BudgetError(
            f"A dense view of a {g.grid[0]} x {g.grid[1]} grid needs {t * t * 4 / 2**20:.0f} MiB, over the "
            f"{budget_bytes / 2**20:.0f} MiB budget (VITVIZ_MEMORY_BUDGET_MB). Choose a smaller input size."
        )
    if g.kind == "separable":
        raise ValueError("separable attention (MobileViT V2) has no query: it has no token-to-token matrix")
    if g.kind == "pool":
        raise ValueError("a pooling head's probe is not a token of the sequence: it has no token-to-token matrix")
    if g.kind == "global":
        p = g.num_prefix
        mat = _real(g, mat)
        out = np.empty((t, t), dtype=np.float32)
        out[:, :p] = mat[:, :p]
        out[:, p:] = _spread_keys(g, mat[:, p:])
        return out
    if g.kind == "unfolded":
        return mat.mean(axis=0).astype(np.float32)
    lay = window_layout(g)
    out = np.zeros((n, n), dtype=np.float32)
    token_of = np.full(g.padded, -1)
    token_of[: g.grid[0], : g.grid[1]] = np.arange(n).reshape(g.grid)
    slots = token_of[lay.rows, lay.cols]  # (nW, w*w) token index or -1 for padding
    if g.key_rule == "finer":  # each key slot's stage token; several keys add up in one column
        klay = window_layout(_key_windows(g))
        pr, pc = token_of_key(g)
        kslots = pr[klay.rows] * g.grid[1] + pc[klay.cols]  # (nW, (w f)^2): no padding with finer keys
        for win in range(slots.shape[0]):
            np.add.at(out, (slots[win][:, None], kslots[win][None, :]), mat[win])
        return out
    for win in range(slots.shape[0]):
        q = slots[win]
        ok = q >= 0
        out[np.ix_(q[ok], q[ok])] = mat[win][np.ix_(ok, ok)]
    return out


def _real(g: Geometry, mat: np.ndarray) -> np.ndarray:
    """A global block's matrix without its trailing padding tokens (rows and columns)."""
    if not g.trailing:
        return mat
    tq, tk = mat.shape[0] - g.trailing, mat.shape[1] - g.trailing
    return mat[:tq, :tk]


def row_sums(g: Geometry, mat: np.ndarray) -> np.ndarray:
    """Row sums of :func:`dense` without building it: ``(Tq,)``."""
    if g.kind == "global":
        return _real(g, mat).sum(axis=-1, dtype=np.float32)
    if g.kind == "unfolded":
        return mat.mean(axis=0).sum(axis=-1, dtype=np.float32)
    if g.kind == "window":
        lay, klay = window_layout(g), window_layout(_key_windows(g))
        per_slot = np.einsum("nij,nj->ni", mat, klay.valid.astype(np.float32))
        return per_slot[lay.slot_window, lay.slot_index]
    raise ValueError("separable attention (MobileViT V2) has no token-to-token matrix")


def left_apply(g: Geometry, mat: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``r @ dense(g, mat)`` for a row vector ``r`` ``(Tq,)``, without building the dense matrix."""
    p = g.num_prefix
    if g.kind == "global":
        y = r @ _real(g, mat)
        return np.concatenate([y[:p], _spread_keys(g, y[p:])]).astype(np.float32)
    if g.kind == "unfolded":
        return np.einsum("q,aqk->k", r, mat) / mat.shape[0]
    if g.kind == "window":
        lay, klay = window_layout(g), window_layout(_key_windows(g))
        r_slots = np.zeros(mat.shape[:2], dtype=np.float32)
        r_slots[lay.slot_window, lay.slot_index] = r
        y_slots = np.einsum("ni,nij->nj", r_slots, mat)
        y_slots[~klay.valid] = 0.0
        y = y_slots[klay.slot_window, klay.slot_index]  # on the key grid, row-major
        return _merge_finer(g, y) if g.key_rule == "finer" else y
    raise ValueError("separable attention (MobileViT V2) has no token-to-token matrix")


# --- summaries -----------------------------------------------------------------------


def cell_centres(grid: tuple[int, int], input_size: tuple[int, int]) -> np.ndarray:
    """``(gh*gw, 2)`` pixel (y, x) of every cell centre of ``grid`` laid over the input."""
    gh, gw = grid
    h, w = input_size
    r, c = np.divmod(np.arange(gh * gw), gw)
    return np.stack([(r + 0.5) * h / gh, (c + 0.5) * w / gw], axis=1)


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)).astype(np.float32)


@lru_cache(maxsize=64)
def _distance_table(g: Geometry, input_size: tuple[int, int]) -> np.ndarray:
    """Pixel distance from each query cell to each key cell, in the shape of the native grid part."""
    if g.kind == "window":

        def slot_centres(wg: Geometry) -> np.ndarray:  # (nW, w*w, 2) pixel centre of every slot
            lay = window_layout(wg)
            centres = cell_centres(wg.padded, input_size)  # padding slots get a position; their weight is masked out
            centres = centres * np.array([wg.padded[0] / wg.grid[0], wg.padded[1] / wg.grid[1]])  # same pixel pitch
            return centres.reshape(*wg.padded, 2)[lay.rows, lay.cols]

        pos, kpos = slot_centres(g), slot_centres(_key_windows(g))
        table = np.sqrt(((pos[:, :, None, :] - kpos[:, None, :, :]) ** 2).sum(-1)).astype(np.float32)
    else:
        table = _distances(cell_centres(g.grid, input_size), cell_centres(g.keys, input_size))
    return table  # private cache: shared with torch (which wants writable arrays), never handed out


def allowed_keys(g: Geometry) -> np.ndarray:
    """Keys each query may attend (masked keys do not count), in the shape of the native rows' leading axes."""
    if g.kind == "window":
        if g.key_rule == "finer":  # no shift: every key of the window
            return np.full((g.num_windows, g.window**2), g.key_window**2)
        reg = window_layout(g).region
        return (reg[:, :, None] == reg[:, None, :]).sum(-1)  # (nW, w*w)
    if g.kind == "global":
        return np.full(g.native_shape()[1], g.native_shape()[2] - g.trailing)
    n = g.grid[0] * g.grid[1]
    return np.full(n, n)


def block_summaries(g: Geometry, native: np.ndarray, input_size: tuple[int, int]):
    """Per-head mean attention distance (px), entropy (nats) and entropy / log(allowed keys): ``(H,)`` each.

    ``native`` is the block's float32 native array with its head axis (global blocks: a torch tensor too, whose
    summaries are computed on its own device, a GPU's; the same numbers to float rounding). Distance:
    for each grid query, the weights over grid keys (prefix and padding keys left
    out) renormalised, times the pixel distance between the query's and the key's
    cell centres, each on its own grid; mean over the real queries. Entropy: mean
    over queries of ``-sum A log A`` over the native row (all queries for global
    attention, real tokens only for windows), and the same divided by the log of
    the number of keys the query was allowed to attend.
    """
    if g.kind == "global" and not isinstance(native, np.ndarray) and hasattr(native, "device"):
        return _global_summaries(g, native, _distance_table(g, input_size))
    a = np.asarray(native, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        if g.kind == "separable":
            ent = _entropy(a, axis=-1).mean()  # (A,) context vectors, one "head"
            n = g.grid[0] * g.grid[1]
            return np.array([np.nan]), np.array([ent]), np.array([ent / np.log(n) if n > 1 else 0.0])
        if g.kind == "pool":  # one probe query with no place on the image: no distance
            ent = _entropy(a, axis=-1).astype(np.float64)  # (H,)
            allowed = a.shape[-1] - g.trailing
            return np.full(a.shape[0], np.nan), ent, ent / np.log(max(allowed, 2))
        table = _distance_table(g, input_size)
        if g.kind == "global":
            return _global_summaries(g, a, table)
        if g.kind == "unfolded":
            weighted = np.einsum("ahqk,qk->ahq", a, table)
            dist = (weighted / np.maximum(a.sum(-1), np.finfo(np.float32).tiny)).mean(axis=(0, 2))
            ent = _entropy(a, axis=-1).mean(axis=(0, 2))
            n = g.grid[0] * g.grid[1]
            return dist.astype(np.float64), ent.astype(np.float64), (ent / np.log(max(n, 2))).astype(np.float64)
        lay = window_layout(g)  # window: a (nW, H, w*w, w*w), or (nW, H, w*w, (w f)^2) for finer keys
        keys = window_layout(_key_windows(g)).valid.astype(np.float32)
        wk = a * keys[:, None, None, :]
        weighted = np.einsum("nhqk,nqk->nhq", wk, table)
        dist_q = weighted / np.maximum(wk.sum(-1), np.finfo(np.float32).tiny)  # (nW, H, w*w)
        real = lay.valid[:, None, :]
        count = lay.valid.sum()
        dist = np.where(real, dist_q, 0.0).sum(axis=(0, 2)) / count
        ent_q = _entropy(a, axis=-1)  # (nW, H, w*w)
        allowed = allowed_keys(g)
        norm_q = np.where(allowed[:, None, :] > 1, ent_q / np.log(np.maximum(allowed, 2))[:, None, :], 0.0)
        ent = np.where(real, ent_q, 0.0).sum(axis=(0, 2)) / count
        norm = np.where(real, norm_q, 0.0).sum(axis=(0, 2)) / count
        return dist.astype(np.float64), ent.astype(np.float64), norm.astype(np.float64)


SUMMARY_CHUNK_VALUES = 1 << 19  # float32 values per chunk of rows in the global summaries (2 MiB: the fastest here)


def _global_summaries(g: Geometry, a: np.ndarray, table: np.ndarray):
    """:func:`block_summaries` of global attention with torch's threaded kernels (T can be 1370 and more).

    In chunks of query rows of about 2 MiB (``SUMMARY_CHUNK_VALUES``): each row's sums are the same numbers as over the whole block, but the
    temporaries stay small. Whole-block temporaries (three of 90 MB a block for DINOv2 at 518 px) were fresh pages
    from the system each time, and touching them cost more than the arithmetic.
    """
    import torch

    p = g.num_prefix
    real_q, real_k = a.shape[1] - g.trailing, a.shape[2] - g.trailing
    full = a if isinstance(a, torch.Tensor) else torch.from_numpy(a)
    t = full[:, :real_q]  # (H, Tq, Tk): real queries, their whole native rows; shares memory on the CPU
    heads, dev, tiny = t.shape[0], t.device, torch.finfo(torch.float32).tiny
    dist_table = torch.from_numpy(table).to(dev)  # (Tq - p, Tk - p - trailing)
    ent_q = torch.empty(heads, real_q, device=dev)  # -sum_k A log A per query; 0 log 0 = 0 (faster than xlogy)
    weighted = torch.empty(heads, real_q - p, device=dev)  # sum_k w_qk d_qk over grid keys, before renormalising
    mass = torch.empty(heads, real_q - p, device=dev)  # sum_k w_qk over grid keys
    step = max(1, SUMMARY_CHUNK_VALUES // max(1, heads * t.shape[2]))
    for lo in range(0, real_q, step):
        hi = min(real_q, lo + step)
        rows = t[:, lo:hi].float()
        ent_q[:, lo:hi] = -(rows * rows.clamp_min(tiny).log()).sum(-1)
        glo = max(lo, p)
        if glo < hi:  # grid queries in this chunk; distances leave prefix and padding keys out
            w = rows[:, glo - lo :, p:real_k]
            weighted[:, glo - p : hi - p] = (w * dist_table[glo - p : hi - p]).sum(-1)
            mass[:, glo - p : hi - p] = w.sum(-1)
    dist = (weighted / mass.clamp_min(tiny)).mean(-1)
    allowed = g.native_shape()[2] - g.trailing  # padding keys are masked: they do not count
    norm = ent_q.mean(-1) / np.log(allowed) if allowed > 1 else torch.zeros(heads, device=dev)
    return tuple(x.double().cpu().numpy() for x in (dist, ent_q.mean(-1), norm))


def _entropy(a: np.ndarray, *, axis: int) -> np.ndarray:
    logs = np.log(np.where(a > 0, a, 1.0))  # log 1 = 0 makes the 0 log 0 terms vanish
    return -(a * logs).sum(axis=axis, dtype=np.float32)


# --- per-head views ----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HeadMaps:
    """One block's map for one query (or key), every head: ``values`` ``(H, gh, gw)`` on ``grid``.

    ``prefix`` ``(H, P)``: weight on (or from) the prefix tokens; ``padding`` ``(H,)``:
    share that went to padding tokens.
    """

    values: np.ndarray
    grid: tuple[int, int]
    prefix: np.ndarray
    padding: np.ndarray


def head_maps(block: Block, token: int, *, direction: Literal["query", "key"] = "query") -> HeadMaps:
    """:func:`row_map` (where ``token`` looks) or :func:`column_map` (who looks at it) for every head."""
    fn = row_map if direction == "query" else column_map
    maps = [fn(block.geometry, select(block, head=h), token) for h in range(block.num_heads)]
    return HeadMaps(
        np.stack([m.values for m in maps]),
        maps[0].grid,
        np.stack([m.prefix for m in maps]),
        np.array([m.padding for m in maps]),
    )


def global_query(block: Block) -> int:
    """The global view of a block: its CLS token where the stage has one, else the pooled query."""
    if block.kind == "pool":
        return 0  # the probe: its one row
    kinds = block.geometry.prefix_kinds
    return kinds.index("CLS") if "CLS" in kinds else POOLED


def window_edges(g: Geometry, grid: tuple[int, int] | None = None) -> tuple[list[int], list[int]]:
    """Window boundaries of a windowed block on the original grid, in token units: (row edges, col edges).

    Edges sit where the shifted index is a multiple of w: original index ``(k w + s) mod n``,
    kept inside the real grid (0 and the grid's end excluded). ``grid``: count in cells of
    that grid instead (a map on a finer key grid: a whole multiple of the stage grid).
    """
    if g.kind != "window":
        return [], []
    grid = grid or g.grid
    if grid[0] % g.grid[0] or grid[1] % g.grid[1]:
        raise ValueError(f"a {grid[0]} x {grid[1]} grid is not a whole multiple of the stage grid {g.grid}")
    fy, fx = grid[0] // g.grid[0], grid[1] // g.grid[1]

    def axis(n_real: int, n_pad: int, f: int) -> list[int]:
        edges = {(k * g.window + g.shift) % n_pad for k in range(n_pad // g.window)}
        return [e * f for e in sorted((edges - {0}) & set(range(n_real)))]

    return axis(g.grid[0], g.padded[0], fy), axis(g.grid[1], g.padded[1], fx)
