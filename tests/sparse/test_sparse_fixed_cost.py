"""A sparse statement sized by its entries (issue 26, the fixed cost of SSSP steps and small
products): a Load of sparse tiles that only sparse kernels read counts its stored bytes
(``exec/budget.load_bytes``), a sparse kernel's calls their flops from the stored entries
(``physical/lower.sparse_scaled``) weighed against BLAS flops where the pool picks the calling
thread and the threads (``exec/pool._work``); so a small graph's shortest-path step runs as a
straight line on the calling thread (exec/fastpath.py), a large one's calls keep the workers, and
the memory budget still bounds a plan that densifies a sparse box. Every answer is checked
against scipy (csgraph's Dijkstra, products) or numpy on the same data."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

import tensordb
from tensordb.exec import pool
from tensordb.exec.budget import _read_sparse, load_bytes, may_cross, upper_bytes
from tensordb.exec.graphcache import GRAPHS
from tensordb.exec.runtime import planned_bytes
from tensordb.physical.plan import Kernel, Load

pytest.importorskip("graphblas")

STEP = "CREATE OR REPLACE TENSOR dist[k] AS MIN(dist[j] + D[j,k])"


@pytest.fixture(autouse=True)
def _empty_cache():
    GRAPHS.clear()
    yield
    GRAPHS.clear()


def _graph(n: int, m: int, seed: int):
    """A random weighted digraph (weights 1-9, repeats summed) and its matrix with 0-weight self
    loops, absent entries +inf once stored (a step keeps the distances it had)."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = i != j
    D = sp.csr_array(sp.coo_array((rng.integers(1, 10, int(keep.sum())).astype(np.float64),
                                   (i[keep], j[keep])), shape=(n, n)))
    D.sum_duplicates()
    c = D.tocoo()
    loops = sp.coo_array((np.r_[c.data, np.zeros(n)], (np.r_[c.row, np.arange(n)],
                                                        np.r_[c.col, np.arange(n)])), shape=(n, n))
    return D, loops


def _sssp(con, D, loops, src: int, fast: bool) -> np.ndarray:
    n = D.shape[0]
    con.engine.executor().fast_path = fast
    con.load("D", loops, fill_value=np.inf, replace=True)
    d0 = np.full(n, np.inf)
    d0[src] = 0.0
    con.load("dist", d0, replace=True)
    prev = d0
    for _ in range(n):
        con.execute(STEP)
        got = con.tensor("dist")
        if np.array_equal(got, prev):
            return got
        prev = got
    raise AssertionError("the steps did not converge")  # pragma: no cover


def test_a_small_shortest_path_step_runs_on_the_calling_thread_and_equals_dijkstra(tmp_path):
    """D is 200 MB dense, past the memory_limit, and 0.1 MB of CSR: counted dense (as it was),
    every step ran under the pool's admission."""
    D, loops = _graph(5000, 6000, 3)
    src = int(np.argmax(np.diff(D.indptr)))
    want = shortest_path(D, method="D", directed=True, indices=src)
    with tensordb.connect(tmp_path / "g.tdb", workers=2, memory_limit=64 << 20) as con:
        got = _sssp(con, D, loops, src, fast=True)
        np.testing.assert_array_equal(got, want)
        plan, run = con.engine.last_plan, con.engine.last_run
        assert "fastpath" in plan.memo  # the straight line ran it (fastpath.program)
        kernels = [t for t in plan.tasks if isinstance(t, Kernel)]
        assert plan.kernels[kernels[0].op].method == "semiring"
        # EXPLAIN ANALYZE's counts: every kernel call of the plan, counted per operation
        assert run.kernel_calls == len(kernels) == sum(m.kernel_calls for m in run.ops)
        assert 0 < run.peak_bytes
        text = con.explain(STEP.replace("CREATE OR REPLACE TENSOR dist[k] AS", "x[k] ="),
                           analyze=True)
        assert "semiring min_plus" in text and "measured" in text
        # D's Loads count its CSR bytes, not its dense ones
        for t in plan.tasks:
            if isinstance(t, Load) and t.tensor == "D":
                assert load_bytes(plan, t) < planned_bytes(plan, t)
                assert t.key in _read_sparse(plan)
        # the pool's run of the same steps gives the same distances
        assert np.array_equal(_sssp(con, D, loops, src, fast=False), want)


def test_a_sparse_kernels_calls_count_their_entries_not_their_extents(tmp_path):
    D, loops = _graph(2000, 12000, 4)
    with tensordb.connect(tmp_path / "g.tdb", workers=2) as con:
        con.load("D", loops, fill_value=np.inf)
        con.load("dist", np.zeros(2000))
        con.execute(STEP)
        plan = con.engine.last_plan
        kernels = [t for t in plan.tasks if isinstance(t, Kernel)]
        total = sum(t.flops for t in kernels)
        dense = plan.ops[0].flops  # the join space's extents
        # the cost model's figure from the catalog's nnz (2 a stored entry), up to rounding
        assert 2 * loops.nnz <= total <= 2 * loops.nnz + len(kernels)
        assert total < dense // 100
        # a dense operation's calls keep their extents' flops
        con.load("A", np.ones((64, 32)))
        con.load("B", np.ones((32, 16)))
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        dplan = con.engine.last_plan
        assert sum(t.flops for t in dplan.tasks if isinstance(t, Kernel)) == dplan.ops[0].flops \
            == 64 * 32 * 16  # (EinOp.flops: an element of the join space, one product)
        np.testing.assert_array_equal(con.tensor("C"), np.ones((64, 32)) @ np.ones((32, 16)))


def test_a_large_sparse_call_keeps_the_workers(tmp_path, monkeypatch):
    """Calls that each take a core for a while run side by side on the workers (the straight
    line would run them one after the other): here made "large" by weighing a sparse flop at
    a BLAS call's worth, so that the graph stays small."""
    monkeypatch.setattr(pool, "SPARSE_FLOP_WEIGHT", pool.FAST_CALL_FLOPS)
    D, loops = _graph(300, 2400, 5)
    src = int(np.argmax(np.diff(D.indptr)))
    want = shortest_path(D, method="D", directed=True, indices=src)
    with tensordb.connect(tmp_path / "g.tdb", workers=2) as con:
        got = _sssp(con, D, loops, src, fast=True)
        np.testing.assert_array_equal(got, want)
        plan = con.engine.last_plan
        assert "fastpath" not in plan.memo
        assert not pool._tiny(plan, True)


def test_the_budget_still_holds_where_a_dense_kernel_reads_a_sparse_box(tmp_path):
    """EXP of a sparse matrix is dense: each box of G is densified by the kernel that reads it,
    so its Load counts its dense bytes and a memory_limit below them puts the run under the
    budget's admission (not the straight line), which keeps the run's tiles under the limit."""
    rng = np.random.default_rng(6)
    n = 1500
    G = sp.random_array((n, n), density=0.002, format="csr", rng=rng, dtype=np.float64)
    limit = 12 << 20  # G dense is 18 MB; as CSR 0.1 MB
    with tensordb.connect(tmp_path / "g.tdb", workers=2, memory_limit=limit) as con:
        con.load("G", G)
        con.execute("s[i] = SUM(EXP(G[i,j]))")
        np.testing.assert_allclose(con.tensor("s"), np.exp(G.toarray()).sum(axis=1), rtol=1e-12)
        plan, run = con.engine.last_plan, con.engine.last_run
        loads = [t for t in plan.tasks if isinstance(t, Load) and t.tensor == "G"]
        sparse_read = _read_sparse(plan)
        assert loads and all(t.key not in sparse_read for t in loads)
        assert all(load_bytes(plan, t, False) == planned_bytes(plan, t) for t in loads)
        assert may_cross(plan, limit, sparse=True) and "fastpath" not in plan.memo
        assert run.peak_bytes <= limit
        # the same matrix read by a sparse kernel (SpMV): its entries only, no admission
        x = rng.standard_normal(n)
        con.load("x", x)
        con.execute("y[i] = SUM(G[i,j] * x[j])")
        np.testing.assert_allclose(con.tensor("y"), G @ x, rtol=1e-10, atol=1e-12)
        plan = con.engine.last_plan
        gl = [t for t in plan.tasks if isinstance(t, Load) and t.tensor == "G"]
        assert gl and all(t.key in _read_sparse(plan) for t in gl)
        assert sum(load_bytes(plan, t) for t in gl) < G.data.nbytes * 4 + 8 * (n + 1) * len(gl)
        assert upper_bytes(plan, sparse=True) < limit and not may_cross(plan, limit, sparse=True)
        assert upper_bytes(plan) > upper_bytes(plan, sparse=True)  # (a GPU's: read dense)


def test_the_graph_caches_bytes_come_off_the_room_a_run_may_fill(tmp_path):
    """A run that fits the memory_limit only without what the graph cache holds is admitted
    task by task (whose admission drops the cache's entries first): the cache and the run
    together stay under the limit."""
    D, loops = _graph(400, 3000, 7)
    with tensordb.connect(tmp_path / "g.tdb", workers=2) as con:
        con.load("D", loops, fill_value=np.inf)
        con.load("dist", np.zeros(400))
        con.execute(STEP)  # D's GraphBLAS matrix is cached now
        assert GRAPHS.bytes > 0
        ex = con.engine.executor()
        plan = con.engine.last_plan
        limit = upper_bytes(plan, sparse=True) + GRAPHS.bytes // 2
        assert ex.tiles.room(plan, limit) == limit - GRAPHS.bytes
        assert may_cross(plan, ex.tiles.room(plan, limit), sparse=True) and \
            not may_cross(plan, limit, sparse=True)
        assert ex.tiles.room(plan, None) is None
        con.set("memory_limit", limit)
        want = np.zeros(400)
        c = loops.tocoo()
        new = np.full(400, np.inf)
        np.minimum.at(new, c.col, want[c.row] + c.data)
        con.load("dist", np.zeros(400), replace=True)
        con.execute(STEP)
        np.testing.assert_array_equal(con.tensor("dist"), new)
        assert con.engine.last_run.peak_bytes <= limit
