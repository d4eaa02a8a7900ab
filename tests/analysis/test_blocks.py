"""Block primitives on hand-made native arrays: windows with shift and padding, reduced keys, unfolded patches."""

import numpy as np
import pytest
from reference import centres, mean_distance_reference

from vitviz.analysis import blocks
from vitviz.errors import BudgetError
from vitviz.record import POOLED, Geometry


def _window_geometry(grid=(5, 6), w=4, s=2):
    padded = (-(-grid[0] // w) * w, -(-grid[1] // w) * w)
    return Geometry(stage=0, kind="window", num_heads=2, grid=grid, window=w, shift=s, padded=padded)


def _random_rows(rng, shape):
    a = rng.random(shape) ** 2
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def _dense_by_loops(g: Geometry, mat: np.ndarray) -> np.ndarray:
    """Windows undone the slow way: shifted index -> original position, padding dropped."""
    gh, gw = g.grid
    hp, wp = g.padded
    w, s = g.window, g.shift
    out = np.zeros((gh * gw, gh * gw))
    nwc = wp // w
    for win in range(mat.shape[0]):
        wr, wc = divmod(win, nwc)
        for i in range(w * w):
            qr, qc = (wr * w + i // w + s) % hp, (wc * w + i % w + s) % wp
            if qr >= gh or qc >= gw:
                continue
            for j in range(w * w):
                kr, kc = (wr * w + j // w + s) % hp, (wc * w + j % w + s) % wp
                if kr < gh and kc < gw:
                    out[qr * gw + qc, kr * gw + kc] = mat[win, i, j]
    return out


def test_window_layout_undoes_shift_and_padding():
    g = _window_geometry()
    lay = blocks.window_layout(g)
    assert lay.rows.shape == (g.num_windows, 16) and g.num_windows == 4
    # shifted slot (0, 0) of window 0 is original (s, s) = (2, 2)
    assert (lay.rows[0, 0], lay.cols[0, 0]) == (2, 2)
    # every real token appears exactly once, and its slot points back to it
    real = [(r, c) for r, c in zip(lay.rows[lay.valid], lay.cols[lay.valid], strict=True)]
    assert sorted(real) == [(r, c) for r in range(5) for c in range(6)]
    for t in range(30):
        n, i = lay.slot_window[t], lay.slot_index[t]
        assert (lay.rows[n, i], lay.cols[n, i]) == divmod(t, 6)


def test_dense_row_map_and_left_apply_match_the_loops():
    rng = np.random.default_rng(0)
    g = _window_geometry()
    mat = _random_rows(rng, (g.num_windows, 16, 16))
    ref = _dense_by_loops(g, mat)
    np.testing.assert_allclose(blocks.dense(g, mat), ref, atol=1e-7)
    np.testing.assert_allclose(blocks.row_sums(g, mat), ref.sum(1), atol=1e-6)
    r = rng.random(30)
    np.testing.assert_allclose(blocks.left_apply(g, mat, r), r @ ref, rtol=1e-5)
    for q in (0, 7, 29):
        m = blocks.row_map(g, mat, q)
        np.testing.assert_allclose(m.values.ravel(), ref[q], atol=1e-7)
        assert m.padding == pytest.approx(1 - ref[q].sum(), abs=1e-6)  # the rest went to padding
        np.testing.assert_allclose(blocks.column_map(g, mat, q).values.ravel(), ref[:, q], atol=1e-7)
    pooled = blocks.row_map(g, mat, POOLED)
    np.testing.assert_allclose(pooled.values.ravel(), ref.mean(0), atol=1e-7)


def test_window_shift_mask_regions_count_allowed_keys():
    g = _window_geometry(grid=(8, 8), w=4, s=2)
    allowed = blocks.allowed_keys(g)
    assert allowed.shape == (4, 16)
    assert (allowed[0] == 16).all()  # the top-left window mixes no regions
    # bottom-right window: four regions of 2 x 2 tokens each
    assert (allowed[3] == 4).all()


def test_reduced_keys_spread_evenly_and_keep_row_sums():
    rng = np.random.default_rng(1)
    g = Geometry(
        stage=0,
        kind="global",
        num_heads=1,
        grid=(7, 4),
        prefix_kinds=("CLS",),
        key_grid=(4, 2),
        key_rule="strided",
        key_stride=(2, 2),
    )
    mat = _random_rows(rng, (1 + 28, 1 + 8))
    d = blocks.dense(g, mat)
    assert d.shape == (29, 29)
    np.testing.assert_allclose(d.sum(1), 1.0, atol=1e-6)
    # key (row 3, col 0) came from stage row 6 only (7 rows, stride 2), cols 0-1: split over 2 tokens
    key = 1 + 3 * 2 + 0
    for tok in (1 + 6 * 4 + 0, 1 + 6 * 4 + 1):
        np.testing.assert_allclose(d[:, tok], mat[:, key] / 2, atol=1e-7)
    np.testing.assert_allclose(d[:, 0], mat[:, 0])  # CLS column untouched
    r = rng.random(29)
    np.testing.assert_allclose(blocks.left_apply(g, mat, r), r @ d, rtol=1e-5)
    m = blocks.row_map(g, mat, 5)
    assert m.grid == (4, 2)
    np.testing.assert_allclose(m.values.ravel(), mat[5, 1:])
    assert blocks.key_of_token(g, 1 + 6 * 4 + 3) == 1 + 3 * 2 + 1


def test_centre_rule_gives_empty_key_cells_to_the_token_under_their_centre():
    g = Geometry(stage=0, kind="global", num_heads=1, grid=(3, 3), key_grid=(7, 7), key_rule="centre")
    sr, _ = blocks.key_spread(g)
    np.testing.assert_allclose(sr.sum(1), 1.0)  # every key cell lands somewhere
    assert sr[0, 0] == 1.0 and sr[6, 2] == 1.0


def test_unfolded_maps_average_offsets():
    rng = np.random.default_rng(2)
    g = Geometry(stage=0, kind="unfolded", num_heads=2, grid=(3, 4), offsets=4)
    mat = _random_rows(rng, (4, 12, 12))
    np.testing.assert_allclose(blocks.row_map(g, mat, 5).values.ravel(), mat[:, 5].mean(0), rtol=1e-6)
    np.testing.assert_allclose(blocks.dense(g, mat), mat.mean(0), rtol=1e-6)


def test_summaries_of_a_window_block_match_the_definition():
    rng = np.random.default_rng(3)
    g = _window_geometry()
    native = _random_rows(rng, (g.num_windows, 2, 16, 16))
    dist, ent, norm = blocks.block_summaries(g, native, (20, 24))  # 4 px cells
    c = centres(g.grid, (20, 24))
    for h in range(2):
        ref = _dense_by_loops(g, native[:, h])
        assert dist[h] == pytest.approx(mean_distance_reference(ref, c, c), rel=1e-5)
        lay = blocks.window_layout(g)
        rows = native[:, h][lay.slot_window, lay.slot_index]  # native rows of the real tokens
        assert ent[h] == pytest.approx(float(-(rows * np.log(rows)).sum(1).mean()), rel=1e-5)
        allowed = blocks.allowed_keys(g)[lay.slot_window, lay.slot_index]
        assert norm[h] == pytest.approx(float((-(rows * np.log(rows)).sum(1) / np.log(allowed)).mean()), rel=1e-5)


def test_uniform_global_attention_distance_is_the_paper_example():
    g = Geometry(stage=0, kind="global", num_heads=1, grid=(2, 2), prefix_kinds=("CLS",))
    a = np.full((1, 5, 5), 0.2, dtype=np.float32)
    dist, ent, norm = blocks.block_summaries(g, a, (32, 32))
    assert dist[0] == pytest.approx(16 * (0 + 1 + 1 + np.sqrt(2)) / 4, rel=1e-6)
    assert ent[0] == pytest.approx(np.log(5), rel=1e-6)
    assert norm[0] == pytest.approx(1.0, rel=1e-6)


def test_dense_view_refuses_over_budget():
    g = Geometry(stage=0, kind="global", num_heads=1, grid=(64, 64))
    with pytest.raises(BudgetError, match="dense view"):
        blocks.dense(g, np.zeros((4096, 4096), np.float32), budget_bytes=2**20)


def test_trailing_padding_tokens_are_left_out_and_reported():
    rng = np.random.default_rng(4)
    g = Geometry(stage=0, kind="global", num_heads=1, grid=(2, 3), trailing=2)
    mat = _random_rows(rng, (8, 8))
    m = blocks.row_map(g, mat, 1)
    np.testing.assert_allclose(m.values.ravel(), mat[1, :6])
    assert m.padding == pytest.approx(mat[1, 6:].sum())
    pooled = blocks.row_map(g, mat, POOLED)  # the mean over the 6 real queries only
    np.testing.assert_allclose(pooled.values.ravel(), mat[:6, :6].mean(0), rtol=1e-6)
    np.testing.assert_allclose(blocks.dense(g, mat), mat[:6, :6])
    r = rng.random(6)
    np.testing.assert_allclose(blocks.left_apply(g, mat, r), r @ mat[:6, :6], rtol=1e-5)
    native = mat[None]
    dist, ent, norm = blocks.block_summaries(g, native, (16, 24))
    real = mat[:6, :6] / mat[:6, :6].sum(1, keepdims=True)
    c = centres((2, 3), (16, 24))
    assert dist[0] == pytest.approx(mean_distance_reference(real * 1.0, c, c), rel=1e-5)
    rows = mat[:6]  # real queries, every key of their native rows
    assert ent[0] == pytest.approx(float(-(rows * np.log(rows)).sum(1).mean()), rel=1e-5)
    assert norm[0] == pytest.approx(ent[0] / np.log(6), rel=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 30, 1 << 20])  # one row a chunk, chunks across the prefix, one chunk
def test_global_summaries_in_chunks_of_rows_match_the_definition(monkeypatch, chunk):
    rng = np.random.default_rng(8)
    g = Geometry(stage=0, kind="global", num_heads=3, grid=(3, 4), prefix_kinds=("CLS", "REG"), trailing=2)
    native = _random_rows(rng, g.native_shape())  # (3, 16, 16): 2 prefix, 12 grid, 2 padding tokens
    native[1, 5, 3] = 0.0  # a zero weight: 0 log 0 = 0
    monkeypatch.setattr(blocks, "SUMMARY_CHUNK_VALUES", chunk * 3 * 16)  # `chunk` rows a chunk
    dist, ent, norm = blocks.block_summaries(g, native, (12, 16))
    c = centres((3, 4), (12, 16))
    for h in range(3):
        grid = native[h, 2:14, 2:14].astype(np.float64)
        assert dist[h] == pytest.approx(mean_distance_reference(grid / grid.sum(1, keepdims=True), c, c), rel=1e-5)
        rows = native[h, :14].astype(np.float64)  # real queries, every key of their native rows
        terms = np.where(rows > 0, -rows * np.log(np.where(rows > 0, rows, 1.0)), 0.0)
        assert ent[h] == pytest.approx(terms.sum(1).mean(), rel=1e-5)
        assert norm[h] == pytest.approx(ent[h] / np.log(14), rel=1e-6)


def test_a_pooling_head_is_one_row_per_head_and_starts_the_readout():
    from vitviz.analysis.flow import propagate
    from vitviz.record import Stage

    rng = np.random.default_rng(5)
    grid = (2, 2)
    body = Geometry(stage=0, kind="global", num_heads=2, grid=grid)
    pool = Geometry(stage=0, kind="pool", num_heads=2, grid=grid)
    probe = _random_rows(rng, (2, 4))
    m = blocks.row_map(pool, probe[0], 3)  # any query: the probe's row
    np.testing.assert_allclose(m.values.ravel(), probe[0])
    d, e, _ = blocks.block_summaries(pool, probe, (8, 8))
    assert np.isnan(d).all() and e[1] == pytest.approx(float(-(probe[1] * np.log(probe[1])).sum()), rel=1e-5)
    a = _random_rows(rng, (4, 4))
    stage = Stage(0, grid, (), (0, 1), None, None)
    row, stage_index = propagate([body, pool], [stage], {0: a, 1: probe.mean(0)}, lambda g, mat, r: r @ mat)
    np.testing.assert_allclose(row, probe.mean(0) @ a, rtol=1e-6)
    assert stage_index == 0
    with pytest.raises(ValueError, match="probe is not a token"):
        blocks.dense(pool, probe[0])


# --- finer keys (Hiera's query-pooling blocks) ----------------------------------------------------


def _finer_window_geometry():
    """A 4 x 6 stage grid in 2 x 2 windows whose keys are the 8 x 12 grid before it, 4 x 4 keys per window."""
    return Geometry(
        stage=1,
        kind="window",
        num_heads=2,
        grid=(4, 6),
        window=2,
        padded=(4, 6),
        key_grid=(8, 12),
        key_rule="finer",
        key_stride=(2, 2),
    )


def _finer_by_loops(g: Geometry, mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the ``(N, Nk)`` rows of every stage query over the key grid, the ``(N, N)`` dense view) the slow way."""
    (gh, gw), (kh, kw) = g.grid, g.keys
    w, wk = g.window, g.key_window
    rows = np.zeros((gh * gw, kh * kw))
    for win in range(mat.shape[0]):
        wr, wc = divmod(win, gw // w)
        for i in range(w * w):
            q = (wr * w + i // w) * gw + wc * w + i % w
            for j in range(wk * wk):
                rows[q, (wr * wk + j // wk) * kw + wc * wk + j % wk] = mat[win, i, j]
    dense = np.zeros((gh * gw, gh * gw))
    for k in range(kh * kw):
        kr, kc = divmod(k, kw)
        dense[:, (kr // 2) * gw + kc // 2] += rows[:, k]
    return rows, dense


def test_windows_with_finer_keys_match_the_loops():
    rng = np.random.default_rng(5)
    g = _finer_window_geometry()
    assert g.native_shape() == (6, 2, 4, 16)
    mat = _random_rows(rng, (6, 4, 16))
    rows, ref = _finer_by_loops(g, mat)
    np.testing.assert_allclose(blocks.dense(g, mat), ref, atol=1e-6)
    np.testing.assert_allclose(blocks.row_sums(g, mat), 1.0, atol=1e-6)
    r = rng.random(24)
    np.testing.assert_allclose(blocks.left_apply(g, mat, r), r @ ref, rtol=1e-5)
    for q in (0, 9, 23):
        m = blocks.row_map(g, mat, q)
        assert m.grid == (8, 12) and m.padding == 0.0
        np.testing.assert_allclose(m.values.ravel(), rows[q], atol=1e-7)
        col = blocks.column_map(g, mat, q)
        assert col.grid == (4, 6)
        np.testing.assert_allclose(col.values.ravel(), ref[:, q], atol=1e-6)
    np.testing.assert_allclose(blocks.row_map(g, mat, POOLED).values.ravel(), rows.mean(0), atol=1e-7)
    assert (blocks.allowed_keys(g) == 16).all() and blocks.allowed_keys(g).shape == (6, 4)
    assert blocks.window_edges(g) == ([2], [2, 4])
    assert blocks.window_edges(g, (8, 12)) == ([4], [4, 8])  # the same edges on the key grid


def test_summaries_of_a_window_block_with_finer_keys_match_the_definition():
    rng = np.random.default_rng(6)
    g = _finer_window_geometry()
    native = _random_rows(rng, (6, 2, 4, 16))
    dist, ent, norm = blocks.block_summaries(g, native, (16, 24))  # 4 px stage cells, 2 px key cells
    qc, kc = centres(g.grid, (16, 24)), centres(g.keys, (16, 24))
    for h in range(2):
        rows, _ = _finer_by_loops(g, native[:, h])
        assert dist[h] == pytest.approx(mean_distance_reference(rows, qc, kc), rel=1e-5)
        flat = native[:, h].reshape(-1, 16)  # every query's native row over its 16 keys
        assert ent[h] == pytest.approx(float(-(flat * np.log(flat)).sum(1).mean()), rel=1e-5)
        assert norm[h] == pytest.approx(ent[h] / np.log(16), rel=1e-5)


def test_global_finer_keys_fall_on_the_token_holding_them():
    rng = np.random.default_rng(7)
    g = Geometry(stage=2, kind="global", num_heads=1, grid=(3, 2), key_grid=(6, 4), key_rule="finer", key_stride=(2, 2))
    mat = _random_rows(rng, (6, 24))
    d = blocks.dense(g, mat)
    for t in range(6):
        r, c = divmod(t, 2)
        inside = [(2 * r + a) * 4 + 2 * c + b for a in (0, 1) for b in (0, 1)]
        np.testing.assert_allclose(d[:, t], mat[:, inside].sum(1), atol=1e-6)
        assert list(blocks.keys_in_token(g, t)) == inside
        np.testing.assert_allclose(blocks.column_map(g, mat, t).values.ravel(), d[:, t], atol=1e-6)
    np.testing.assert_allclose(d.sum(1), 1.0, atol=1e-6)
    r = rng.random(6)
    np.testing.assert_allclose(blocks.left_apply(g, mat, r), r @ d, rtol=1e-5)
    m = blocks.row_map(g, mat, 4)
    assert m.grid == (6, 4)
    np.testing.assert_allclose(m.values.ravel(), mat[4])
    with pytest.raises(ValueError, match="several finer keys"):
        blocks.key_of_token(g, 3)
    with pytest.raises(ValueError, match="lie on"):
        Geometry(stage=2, kind="global", num_heads=1, grid=(3, 2), key_grid=(5, 4), key_rule="finer", key_stride=(2, 2))


def test_a_map_on_finer_cells_sums_into_the_coarser_grid():
    values = np.arange(24, dtype=np.float32).reshape(4, 6)
    got = blocks.summed_to(values, (2, 3))
    assert got[0, 0] == 0 + 1 + 6 + 7 and got[1, 2] == 16 + 17 + 22 + 23
    assert got.sum() == values.sum()
    np.testing.assert_array_equal(blocks.summed_to(values, (4, 6)), values)
    with pytest.raises(ValueError, match="whole multiple"):
        blocks.summed_to(values, (3, 3))
