"""Sparse results stay sparse: output tiles no kernel call makes are never planned (so never
allocated nor written), a kernel output that is all zero gets no catalog row, and the stored
nnz is the result's. Checked on a real catalog against numpy (absent tiles are zeros)."""
from __future__ import annotations

import numpy as np

import tensordb

T = 4  # tile edge


def _block_sparse(rng, n, tiles):
    a = np.zeros((n, n))
    for i, j in tiles:
        a[i * T:(i + 1) * T, j * T:(j + 1) * T] = rng.uniform(1, 2, (T, T))
    return a


def test_a_block_sparse_product_plans_and_stores_only_its_nonzero_tiles(tmp_path):
    rng = np.random.default_rng(1)
    n = 8 * T
    a = _block_sparse(rng, n, [(0, 1), (3, 3), (3, 5), (6, 2)])
    a[6 * T:7 * T, 2 * T:3 * T] = 0
    a[6 * T, 2 * T] = 5.0        # tile (6, 2) of A: one nonzero, in column 2T ...
    b = rng.uniform(1, 2, (n, 2 * T))
    b[2 * T, :] = 0.0            # ... which meets a zero row of B: C's row tile 6 is all zero
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", a, tile=(T, T))
        con.load("B", b, tile=(T, T))
        sql = "C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 8, j 8, k 2)"
        con.execute(sql)
        ref = a @ b
        np.testing.assert_allclose(con.tensor("C"), ref)
        out = con.last_plan.outputs["C"]
        # Planned output tiles: only the row tiles A has a tile in (absent ones never exist).
        assert sorted(out.tiles) == [(i, k) for i in (0, 3, 6) for k in (0, 1)]
        assert con.last_run.kernel_calls == 4 * 2
        meta = con.store.meta("C")
        stored = sorted(con.store.open("C").entries)
        # Row tile 6 was computed (a kernel call) but is all zero: not stored.
        assert stored == [(i, k) for i in (0, 3) for k in (0, 1)]
        assert meta.tile_count == 4 and meta.nnz == np.count_nonzero(ref)
        assert con.sql("SELECT count(*) FROM C").fetchall()[0][0] == np.count_nonzero(ref)


def test_a_block_sparse_product_with_a_dense_partner_joins_only_the_sparse_tiles(tmp_path):
    """The dense partner is complete and finite, so the tile join reads only A's tiles; the
    calls and the result are those of the present tiles, as numpy computes them."""
    rng = np.random.default_rng(2)
    n = 16 * T
    tiles = [(i, j) for i in range(16) for j in range(16) if rng.random() < 0.05] or [(0, 0)]
    a = _block_sparse(rng, n, tiles)
    b = rng.standard_normal((n, 3 * T))
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a, tile=(T, T))
        con.load("B", b, tile=(2 * T, 3 * T))     # B's own tiles are not the operation's pieces
        for pieces in ("i 16, j 16, k 1", "i 8, j 4, k 3"):
            con.execute(f"C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES {pieces})")
            np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
            per = [int(p.split()[1]) for p in pieces.split(", ")]
            ti, tj = n // per[0], n // per[1]
            cells = {(i * T // ti, j * T // tj) for i, j in tiles}
            assert con.last_run.kernel_calls == len(cells) * per[2]


def test_a_block_sparse_operand_times_a_wide_dense_one_is_planned_on_its_tiles(tmp_path):
    """A 10% block-sparse A times a dense B wider than it is tall: the optimizer plans the
    product on A's stored grid (one call per present tile), though that replicates B's rows
    and moves more bytes than a dense plan, because the calls of absent tiles are never made
    (the compute term of the cost model). The answer is numpy's, and the plan's flops are
    those of the present tiles."""
    rng = np.random.default_rng(3)
    t = 32  # tiles large enough that the calls skipped outweigh their overhead
    n = 16 * t
    tiles = [(i, j) for i in range(16) for j in range(16) if rng.random() < 0.1]
    a = np.zeros((n, n))
    for i, j in tiles:
        a[i * t:(i + 1) * t, j * t:(j + 1) * t] = rng.uniform(1, 2, (t, t))
    b = rng.standard_normal((n, 4 * n))
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", a, tile=(t, t))
        con.load("B", b, tile=(t, 4 * n))
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
        stats = con.last_plan.stats[0]
        assert stats.pieces == {"i": 16, "k": 1, "j": 16}
        assert con.last_run.kernel_calls == len(tiles)
