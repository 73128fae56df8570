"""Sparse tensors through the plan cache, Ctrl-C, the memory budget (spilling) and Dask: a repeated
sparse step (PageRank, an MF step with GRAD) is planned once and follows a replaced matrix; a
long query over a sparse tensor stops at Ctrl-C and stores nothing; an SpMM's intermediate twice
the memory limit spills and the answers are scipy's; an MF step with GRAD on Dask workers too."""
from __future__ import annotations

import _thread
import os
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb

MB = 1 << 20


def _graph(n, nnz, seed, dtype=np.float64):
    """About ``nnz`` random entries (a repeated pair summed, as scipy does), values in [0, 1)."""
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, n, nnz), rng.integers(0, n, nnz)
    return sp.csr_array((rng.random(nnz).astype(dtype), (rows, cols)), shape=(n, n))


# One SGD step of matrix factorisation over the observed ratings r at (ou[n], oi[n]).
MF_STEP = ("LET E[n] = SUM(U[ou[n], f] * V[oi[n], f]) - r[n]; L = SUM(E[n] * E[n]); "
           "LET dU = GRAD(L, U); LET dV = GRAD(L, V); "
           "U[u,f] = U[u,f] - 0.01 * dU[u,f]; V[i,f] = V[i,f] - 0.01 * dV[i,f]")


def _ratings(rng, users: int, items: int, nnz: int):
    """``nnz`` distinct (user, item) ratings of 1-5 and factors U, V of rank 4 near 0.5."""
    flat = rng.choice(users * items, nnz, replace=False)
    rows, cols, vals = flat // items, flat % items, rng.integers(1, 6, nnz).astype(float)
    U, V = 0.5 + 0.1 * rng.standard_normal((users, 4)), 0.5 + 0.1 * rng.standard_normal((items, 4))
    return rows, cols, vals, U, V


def test_a_repeated_sparse_step_is_planned_once_and_follows_a_replaced_matrix():
    n = 2000
    G = _graph(n, 20_000, 1)
    G = sp.csr_array(G / np.maximum(G.sum(axis=0), 1e-12))  # column-stochastic where not empty
    step = "x[i] = 0.15 / 2000 + 0.85 * SUM(G[i,j] * x[j])"
    with tensordb.connect(workers=2) as con:
        con.load("G", G)
        con.load("x", np.full(n, 1.0 / n))
        before = dict(con.plan_cache_stats)
        assert "spmm" in con.explain(step)  # planned here, once
        want = np.full(n, 1.0 / n)
        for _ in range(5):
            con.execute(step)
            want = 0.15 / n + 0.85 * (G @ want)
        stats = con.plan_cache_stats
        assert stats["misses"] - before["misses"] == 1 and stats["hits"] - before["hits"] == 5
        np.testing.assert_allclose(con.tensor("x"), want, rtol=1e-12)
        # a new G (other entries, other nnz): the step reads it, whatever the cache holds
        G2 = _graph(n, 35_000, 2)
        con.load("G", G2, replace=True)
        con.execute(step)
        np.testing.assert_allclose(con.tensor("x"), 0.15 / n + 0.85 * (G2 @ want), rtol=1e-12)


def test_an_mf_step_with_grad_is_planned_once_from_step_to_step():
    rng = np.random.default_rng(3)
    users, items, nnz = 300, 200, 1500
    rows, cols, vals, U, V = _ratings(rng, users, items, nnz)
    step = MF_STEP
    with tensordb.connect(workers=2) as con:
        for name, a in (("U", U), ("V", V), ("ou", rows), ("oi", cols), ("r", vals)):
            con.load(name, a)
        before = dict(con.plan_cache_stats)
        for _ in range(4):
            con.execute(step)
            e = np.einsum("nf,nf->n", U[rows], V[cols]) - vals
            E = sp.csr_array((2 * e, (rows, cols)), shape=(users, items))
            U, V = U - 0.01 * (E @ V), V - 0.01 * (E.T @ U)
        stats = con.plan_cache_stats
        assert stats["misses"] - before["misses"] == 1 and stats["hits"] - before["hits"] == 3
        np.testing.assert_allclose(con.tensor("U"), U, rtol=1e-12)
        np.testing.assert_allclose(con.tensor("V"), V, rtol=1e-12)


def test_ctrl_c_stops_a_query_over_a_sparse_tensor_and_stores_nothing(tmp_path):
    """A query that densifies a sparse tensor tile by tile (a function of its entries) runs
    for seconds; Ctrl-C stops it between chunks, nothing is stored, the connection works."""
    db = tmp_path / "c.tdb"
    n = 9000
    G = _graph(n, 50_000, 4)
    with tensordb.connect(db, workers=2) as con:
        con.load("G", G)
        files = sorted(os.listdir(db / "tiles"))
        timer = threading.Timer(0.5, _thread.interrupt_main)
        finished = False
        timer.start()
        t0 = time.perf_counter()
        try:
            with pytest.raises(KeyboardInterrupt):
                con.execute("S[i] = SUM(EXP(G[i,j]) * COS(G[i,j]) + SIN(G[i,j]))")
                finished = True
                time.sleep(5)  # where the interrupt lands if the query was too quick for it
        finally:
            timer.cancel()
        assert not finished, "the query ended before the interrupt: make it longer"
        assert time.perf_counter() - t0 < 10
        assert not con.store.has("S")
        assert sorted(os.listdir(db / "tiles")) == files
        small = _graph(50, 200, 5)
        con.load("H", small)
        con.execute("s[i] = SUM(EXP(H[i,j]))")
        np.testing.assert_allclose(con.tensor("s"), np.exp(small.toarray()).sum(1), rtol=1e-12)
    with tensordb.connect(db) as con:
        assert sorted(t["name"] for t in con.tensors()) == ["G", "H", "s"]


def test_an_spmm_intermediate_twice_the_limit_spills_and_equals_scipy(tmp_path):
    """H = G @ X (16 MiB as float32, a LET) is needed by Y and again by Z, after Q is made:
    under an 8 MiB limit it spills, and every answer is scipy's."""
    rng = np.random.default_rng(6)
    n = 4096
    G = _graph(n, 10_000, 7, np.float32)
    X = rng.standard_normal((n, 1024), dtype=np.float32)
    W2 = rng.standard_normal((1024, 64), dtype=np.float32)
    W3 = rng.standard_normal((n, 64), dtype=np.float32)
    sql = ("LET H[i,k] = SUM(G[i,j] * X[j,k]); Y[i,m] = SUM(H[i,k] * W2[k,m]); "
           "LET Q[i,m] = RELU(SUM(G[i,j] * W3[j,m])); Z[k,m] = SUM(H[i,k] * Q[i,m])")
    with tensordb.connect(tmp_path / "s.tdb", workers=2, memory_limit=8 * MB) as con:
        for name, a in (("G", G), ("X", X), ("W2", W2), ("W3", W3)):
            con.load(name, a)
        assert "spmm" in con.explain(sql)
        con.execute(sql)
        assert con.last_run.spilled_bytes > 0
        con.execute("SET memory_limit = DEFAULT")
        h = (G.astype(np.float64) @ X.astype(np.float64))
        q = np.maximum(G.astype(np.float64) @ W3.astype(np.float64), 0)
        np.testing.assert_allclose(con.tensor("Y"), h @ W2, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(con.tensor("Z"), h.T @ q, rtol=2e-3, atol=2e-2)


def test_an_mf_step_with_grad_on_the_dask_executor_equals_scipy(tmp_path):
    """The sparse one-hot scatter-adds (SpMM, their entries scaled) run on Dask workers too."""
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    rng = np.random.default_rng(9)
    users, items, nnz = 120, 80, 600
    rows, cols, vals, U, V = _ratings(rng, users, items, nnz)
    step = MF_STEP
    with local_cluster(2, local_directory=str(tmp_path / "dask")) as cluster, \
            tensordb.connect(tmp_path / "db", workers=2, storage="shared",
                             executor=f"dask://{cluster.scheduler_address}") as con:
        for name, a in (("U", U), ("V", V), ("ou", rows), ("oi", cols), ("r", vals)):
            con.load(name, a, tile=(64,) if a.ndim == 1 else (64, 4))
        assert con.explain(step).count("spmm x1 sparse") == 2
        for _ in range(2):
            con.execute(step)
            e = np.einsum("nf,nf->n", U[rows], V[cols]) - vals
            E = sp.csr_array((2 * e, (rows, cols)), shape=(users, items))
            U, V = U - 0.01 * (E @ V), V - 0.01 * (E.T @ U)
        np.testing.assert_allclose(con.tensor("U"), U, rtol=1e-12)
        np.testing.assert_allclose(con.tensor("V"), V, rtol=1e-12)
