"""Power-law balancing: a sparse matrix's split row label is cut into row slabs of equal
nonzeros (optimizer/balance.py), the lowering follows the cuts and EXPLAIN shows each piece's
nonzeros; SpMM written into the output's buffer in row slabs, and a box over several stored CSR
row tiles. Every answer against scipy; the pieces' nonzeros against the matrix itself."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.optimizer.balance import nnz_cuts, piece_nnz
from tensordb.physical.plan import Load


def skewed(n: int, hubs: int, hub_degree: int, degree: int, seed: int = 0) -> sp.csr_array:
    """Rows 0..hubs-1 hold ``hub_degree`` entries each, the others ``degree``: even row cuts
    put most of the entries in the first piece."""
    rng = np.random.default_rng(seed)
    deg = np.r_[np.full(hubs, hub_degree), np.full(n - hubs, degree)]
    rows = np.repeat(np.arange(n), deg)
    cols = rng.integers(0, n, rows.size)
    m = sp.csr_array(sp.coo_array((rng.standard_normal(rows.size), (rows, cols)), shape=(n, n)))
    m.sum_duplicates()
    return m


def load_boxes(con, name: str) -> list[tuple[int, int]]:
    """The row ranges of the boxes of ``name`` that the last plan's Loads read."""
    return sorted({(t.starts[0], t.stops[0]) for t in con.last_plan.tasks
                   if isinstance(t, Load) and t.tensor == name})


@pytest.mark.parametrize("workers", [2, 3])
def test_a_skewed_matrix_split_by_rows_gets_slabs_of_equal_nonzeros(workers):
    S = skewed(3000, 40, 500, 4)
    X = np.random.default_rng(1).standard_normal((3000, 5))
    with tensordb.connect(workers=workers) as con:
        con.load("G", S)
        con.load("X", X)
        sql = f"Y[i,k] = SUM(G[i,j] * X[j,k]) WITH (PIECES i {workers})"
        plan = json.loads(con.explain(sql, format="json"))
        (node,) = plan["nodes"]
        bal = node["balance"]
        assert bal["label"] == "i" and bal["tensor"] == "G"
        # what EXPLAIN says each piece holds is what the matrix holds in its rows
        bounds = bal["bounds"]
        assert bal["nnz"] == [int(S.indptr[b] - S.indptr[a]) for a, b in zip(bounds, bounds[1:])]
        even = np.linspace(0, 3000, workers + 1).round().astype(int)
        assert max(bal["even_nnz"]) > 1.5 * S.nnz / workers   # even cuts: far off
        assert max(bal["nnz"]) <= 1.1 * S.nnz / workers       # the cuts: within 10%
        assert bounds[0] == 0 and bounds[-1] == 3000 and list(even) != bounds
        con.execute(sql)
        np.testing.assert_allclose(con.tensor("Y"), S @ X, rtol=1e-12, atol=1e-12)
        # the tasks read the slabs EXPLAIN showed; each holds its share of the nonzeros
        boxes = load_boxes(con, "G")
        assert [a for a, _ in boxes] + [boxes[-1][1]] == bounds
        nnz = [int(S.indptr[b] - S.indptr[a]) for a, b in boxes]
        assert max(nnz) <= 1.1 * min(nnz) + 500   # one hub row is the granularity
        # placement sees the calls' nonzeros: the workers' flops are balanced too
        flops = plan["total"]["imbalance"]
        assert flops < 1.15
        text = con.explain(sql)
        assert "balance: Y: i cut by G's nonzeros, pieces of" in text


def test_even_cuts_are_kept_where_they_are_balanced_or_on_stored_tiles():
    rng = np.random.default_rng(2)
    even = sp.random_array((2000, 2000), density=0.01, random_state=3, format="csr")
    X = rng.standard_normal((2000, 3))
    with tensordb.connect(workers=2) as con:
        con.load("E", even)
        con.load("X", X)
        sql = "Y[i,k] = SUM(E[i,j] * X[j,k]) WITH (PIECES i 2)"
        assert "balance" not in json.loads(con.explain(sql, format="json"))["nodes"][0]
        con.execute(sql)
        np.testing.assert_allclose(con.tensor("Y"), even @ X, rtol=1e-12, atol=1e-12)
        # skewed, but stored as two row tiles that the two pieces are: read as stored
        S = skewed(2000, 20, 400, 3)
        con.load("S", S, tile=(1000, 2000))
        sql = "Z[i,k] = SUM(S[i,j] * X[j,k]) WITH (PIECES i 2)"
        assert "balance" not in json.loads(con.explain(sql, format="json"))["nodes"][0]
        con.execute(sql)
        np.testing.assert_allclose(con.tensor("Z"), S @ X, rtol=1e-12, atol=1e-12)


def test_a_later_operation_takes_the_cuts_of_the_result_it_reads():
    S = skewed(1500, 15, 300, 3, seed=4)
    x = np.random.default_rng(5).standard_normal(1500)
    with tensordb.connect(workers=2) as con:
        con.load("G", S)
        con.load("x", x)
        sql = ("y[i] = SUM(G[i,j] * x[j]) WITH (PIECES i 2); "
               "z[i] = 2 * y[i] + 1 WITH (PIECES i 2)")
        con.execute(sql)
        np.testing.assert_allclose(con.tensor("z"), 2 * (S @ x) + 1, rtol=1e-12, atol=1e-12)
        cuts = con.last_plan.outputs
        assert cuts["z"].grid == cuts["y"].grid != ((0, 750, 1500),)
        # the stored result keeps the uneven grid; reading it back is exact
        assert con.describe("y")["dimensions"][0]["bounds"] == cuts["y"].grid[0]
        con.execute("w[i] = SUM(G[i,j] * y[j])")
        np.testing.assert_allclose(con.tensor("w"), S @ (S @ x), rtol=1e-10, atol=1e-10)


def test_nnz_cuts_on_random_profiles():
    rng = np.random.default_rng(6)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        counts = rng.integers(0, 4, n) * (rng.random(n) < 0.5) + \
            (rng.random(n) < 0.05) * rng.integers(0, 200, n)
        profile = np.r_[0, np.cumsum(counts)]
        for pieces in range(1, 6):
            b = nnz_cuts(profile, pieces)
            assert b[0] == 0 and b[-1] == n and len(b) == min(pieces, max(n, 1)) + 1
            assert all(x < y for x, y in zip(b, b[1:])) or n == 0
            got = piece_nnz(profile, b)
            assert sum(got) == profile[-1]
            if profile[-1]:  # each piece within one row's entries of its share
                assert max(got) <= profile[-1] / len(got) + counts.max()


@pytest.mark.parametrize("workers", [1, 2])
def test_spmm_across_stored_row_tiles_into_the_output_buffer(tmp_path, workers):
    """A matrix stored as five CSR row tiles (one of them absent), pieces that cross tile
    bounds; the product written in row slabs into the output file: the stored result, its nnz
    and its checksums (CHECK) are those of scipy's product."""
    rng = np.random.default_rng(7)
    S = sp.random_array((3000, 2500), density=0.004, random_state=8, format="csr",
                        dtype=np.float32)
    S = sp.csr_array(S.multiply(np.r_[np.ones(1200), np.zeros(600), np.ones(1200)][:, None]))
    X = rng.standard_normal((2500, 300)).astype(np.float32)   # 1.2 KB rows: many slabs
    with tensordb.connect(tmp_path / "db", workers=workers) as con:
        con.load("G", S, tile=(600, 2500))
        assert con.describe("G")["tile_count"] == 4   # rows 1200-1800 are empty: no tile
        con.load("X", X)
        for pieces in (1, 3, 4):
            con.execute(f"Y[i,k] = SUM(G[i,j] * X[j,k]) WITH (PIECES i {pieces})")
            want = S @ X
            np.testing.assert_allclose(con.tensor("Y"), want, rtol=1e-5, atol=1e-5)
            assert con.describe("Y")["nnz"] == np.count_nonzero(want)
            con.execute("CHECK TENSOR Y")
        con.load("H", S, tile=(600, 1250))   # boxes of one tile column, several row tiles
        con.execute("Z[i,k] = SUM(H[i,j] * X[j,k]) WITH (PIECES i 3, j 2)")
        np.testing.assert_allclose(con.tensor("Z"), S @ X, rtol=1e-5, atol=1e-5)
        v = X[:, 0].copy()
        con.load("v", v)
        con.execute("w[i] = SUM(G[i,j] * v[j]) WITH (PIECES i 3)")
        np.testing.assert_allclose(con.tensor("w"), S @ v, rtol=1e-5, atol=1e-5)


def test_cuts_that_would_pass_a_workers_budget_are_not_made():
    S = skewed(3000, 40, 500, 4)
    X = np.random.default_rng(9).standard_normal((3000, 5))
    sql = "Y[i,k] = SUM(G[i,j] * X[j,k]) WITH (PIECES i 2)"
    with tensordb.connect(workers=2) as con:
        con.load("G", S)
        con.load("X", X)
        node = json.loads(con.explain(sql, format="json"))["nodes"][0]
        assert "balance" in node
        call = node["memory"]["total"]
    # a budget the even call fits and the widest slab (about twice as wide) would not
    with tensordb.connect(workers=2, memory_limit=int(2 * 1.3 * call)) as con:
        con.load("G", S)
        con.load("X", X)
        node = json.loads(con.explain(sql, format="json"))["nodes"][0]
        assert "balance" not in node and node["memory"]["total"] <= 1.3 * call
        con.execute(sql)
        np.testing.assert_allclose(con.tensor("Y"), S @ X, rtol=1e-12, atol=1e-12)


def test_a_cached_plan_is_recut_when_the_matrix_is_replaced_by_another_row_profile():
    """The plan cache keys a plan by its inputs' layouts (grid, formats, present tiles), which
    a replaced matrix of another row profile keeps: the cached plan's cuts of equal nonzeros
    are checked against the new version's profile, and the plan is made again where they
    differ (driver/cache.py); a new version of the same profile still hits."""
    n = 3000
    S = skewed(n, 40, 500, 4)
    flipped = sp.csr_array(S[::-1])            # the hubs now the last rows
    X = np.random.default_rng(10).standard_normal((n, 5))
    sql = "Y[i,k] = SUM(G[i,j] * X[j,k]) WITH (PIECES i 2)"

    def slab_nnz(M, boxes):
        return [int(M.indptr[b] - M.indptr[a]) for a, b in boxes]

    with tensordb.connect(workers=2) as con:
        con.load("G", S)
        con.load("X", X)
        con.execute(sql)
        first = load_boxes(con, "G")
        assert max(slab_nnz(S, first)) <= 1.1 * S.nnz / 2
        con.load("G", flipped, replace=True)
        con.execute(sql)
        np.testing.assert_allclose(con.tensor("Y"), flipped @ X, rtol=1e-12, atol=1e-12)
        second = load_boxes(con, "G")
        assert second != first
        assert max(slab_nnz(flipped, second)) <= 1.1 * flipped.nnz / 2
        assert json.loads(con.explain(sql, format="json"))["nodes"][0]["balance"]["bounds"] \
            == [a for a, _ in second] + [n]
        # the same profile again (new values): the plan is taken from the cache
        hits = con.plan_cache_stats["hits"]
        con.load("G", flipped * 2.0, replace=True)
        con.execute(sql)
        assert con.plan_cache_stats["hits"] == hits + 1
        assert load_boxes(con, "G") == second
        np.testing.assert_allclose(con.tensor("Y"), 2.0 * (flipped @ X), rtol=1e-12, atol=1e-12)
