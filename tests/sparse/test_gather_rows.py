"""A gather by a vector is Loaded as a ``RowGather`` (storage/boxes.py: its rows named, not
taken): a batch of row products takes them a slab at a time (exec/gathered.py), an SpMM reads the
base through its columns renumbered (exec/sparse_kernels.py), every other kernel takes them whole.
Checked against numpy, and bit for bit against the same statements run with the rows taken at
the Load (``GatherReader.read_rows`` answering None: the path every gather took before)."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec import gathered
from tensordb.storage import boxes
from tensordb.storage.boxes import RowGather
from tests.bench.bench_sparse_mf import LAM, LR, STEP  # sql/train_mf.sql's step


def _problem(users=300, items=120, nnz=2500, rank=8, seed=0, sort=True, duplicates=False):
    rng = np.random.default_rng(seed)
    flat = rng.choice(users * items, nnz, replace=duplicates)
    if sort:
        flat = np.sort(flat)
    rows, cols = (flat // items).astype(np.int64), (flat % items).astype(np.int64)
    vals = rng.integers(1, 6, nnz).astype(np.float64)
    U = 0.5 + 0.1 * rng.standard_normal((users, rank))
    V = 0.5 + 0.1 * rng.standard_normal((items, rank))
    return rows, cols, vals, U, V


def _load(con, rows, cols, vals, U, V):
    con.load("U", U)
    con.load("V", V)
    con.load("obs_user", rows)
    con.load("obs_item", cols)
    con.load("obs_rating", vals)


def _peer_step(rows, cols, vals, U, V):
    """The step by hand (numpy, scipy.sparse), as tests/bench/bench_sparse_mf.py's peer."""
    e = np.einsum("nr,nr->n", U[rows], V[cols]) - vals
    E = sp.coo_array((2 * e, (rows, cols)), shape=(U.shape[0], V.shape[0])).tocsr()
    return U - LR * (E @ V + 2 * LAM * U), V - LR * (E.T @ U + 2 * LAM * V)


@pytest.fixture
def eager(monkeypatch):
    """Run a callable with every gather's rows taken at its Load (the path before RowGather)."""
    def run(fn):
        with monkeypatch.context() as m:
            m.setattr(boxes.GatherReader, "read_rows", lambda self, starts, stops: None)
            return fn()
    return run


def _steps(problem, steps=2, workers=1, **connect):
    with tensordb.connect(None, workers=workers, **connect) as con:
        _load(con, *problem)
        for _ in range(steps):
            con.execute(STEP)
        return con.tensor("U"), con.tensor("V")


def test_row_gather_takes_numpys_rows_and_pickles():
    base = np.arange(24.0).reshape(6, 4)
    rows = np.array([5, 0, 0, 3, 5], dtype=np.int64)
    g = RowGather(base, rows)
    assert g.shape == (5, 4) and g.dtype == base.dtype and g.ndim == 2
    np.testing.assert_array_equal(np.asarray(g), base[rows])
    np.testing.assert_array_equal(g.take(1, 4), base[rows[1:4]])
    assert np.asarray(g, dtype=np.float32).dtype == np.float32
    back = pickle.loads(pickle.dumps(g))
    np.testing.assert_array_equal(np.asarray(back), base[rows])
    assert g.nbytes == rows.nbytes + base.nbytes  # its own copy of the base, and its rows


@pytest.mark.parametrize("workers", [1, 2])
def test_mf_steps_are_the_bits_of_the_rows_taken_at_the_load(eager, workers):
    problem = _problem()
    lazy = _steps(problem, workers=workers)
    before = eager(lambda: _steps(problem, workers=workers))
    np.testing.assert_array_equal(lazy[0], before[0])
    np.testing.assert_array_equal(lazy[1], before[1])
    U, V = problem[3], problem[4]
    for _ in range(2):
        U, V = _peer_step(*problem[:3], U, V)
    np.testing.assert_allclose(lazy[0], U, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lazy[1], V, rtol=1e-13, atol=1e-15)


def test_mf_step_in_many_slabs_unsorted_and_with_repeated_pairs(eager, monkeypatch):
    """Slabs of 16 rows (the last one short), ratings in no order, a (user, item) pair rated
    twice: the scatter-add's order of j is S's, as before, so still the same bits."""
    problem = _problem(nnz=1003, sort=False, duplicates=True, seed=3)
    assert len(set(zip(problem[0], problem[1]))) < 1003
    monkeypatch.setattr(gathered, "SLAB_BYTES", 16 * 2 * 8 * 8)
    lazy = _steps(problem, steps=1)
    before = eager(lambda: _steps(problem, steps=1))
    np.testing.assert_array_equal(lazy[0], before[0])
    np.testing.assert_array_equal(lazy[1], before[1])
    want = _peer_step(*problem)
    np.testing.assert_allclose(lazy[0], want[0], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lazy[1], want[1], rtol=1e-13, atol=1e-15)


def test_the_gathered_copies_are_not_held(eager):
    """EXPLAIN ANALYZE's measured peak of tiles alive at once stays under one gathered copy
    (nnz x rank float64); taken at the Load, both copies are alive together."""
    nnz, rank = 20_000, 16
    problem = _problem(users=2000, items=500, nnz=nnz, rank=rank, seed=5)
    one_copy = nnz * rank * 8

    def peak():
        with tensordb.connect(None, workers=1) as con:
            _load(con, *problem)
            plan = json.loads(con.explain(STEP, format="json", analyze=True))
            return plan["measured"]["peak_bytes"]
    assert peak() < one_copy
    assert eager(peak) >= 2 * one_copy


def test_row_products_of_gathers_are_numpys_matmul_bits(monkeypatch):
    rng = np.random.default_rng(7)
    A = rng.standard_normal((40, 6)).astype(np.float32)
    B = rng.standard_normal((30, 6)).astype(np.float32)
    ia = rng.integers(-40, 40, 517)  # numpy's negative rows too
    ib = rng.integers(0, 30, 517)
    monkeypatch.setattr(gathered, "SLAB_BYTES", 100)  # 2 rows a slab
    with tensordb.connect(None) as con:
        con.load("A", A)
        con.load("B", B)
        con.load("ia", ia)
        con.load("ib", ib)
        con.execute("CREATE TENSOR d[n] AS SUM(A[ia[n], f] * B[ib[n], f])")
        con.execute("CREATE TENSOR s[n] AS 3 * SUM(A[ia[n], f] * B[ib[n], f])")
        want = np.matmul(A[ia][:, None, :], B[ib][:, :, None]).reshape(-1)
        got = con.tensor("d")
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(con.tensor("s"), 3 * want, rtol=1e-6)


def test_other_kernels_take_the_rows_whole():
    rng = np.random.default_rng(9)
    E = rng.standard_normal((25, 3))
    ids = rng.integers(-25, 25, 40)
    W = rng.standard_normal((3, 2))
    with tensordb.connect(None) as con:
        con.load("E", E)
        con.load("ids", ids)
        con.load("W", W)
        con.execute("CREATE TENSOR R[n,d] AS RELU(E[ids[n], d]) * 2")
        con.execute("CREATE TENSOR M[n] AS MAX(E[ids[n], d])")
        con.execute("CREATE TENSOR H[n,f] AS SUM(E[ids[n], d] * W[d,f])")
        np.testing.assert_array_equal(con.tensor("R"), np.maximum(E[ids], 0) * 2)
        np.testing.assert_array_equal(con.tensor("M"), E[ids].max(axis=1))
        np.testing.assert_allclose(con.tensor("H"), E[ids] @ W, rtol=1e-12)


def test_an_index_out_of_range_is_still_a_data_error_and_changes_nothing():
    with tensordb.connect(None) as con:
        con.load("U", np.ones((5, 2)))
        con.load("V", np.ones((4, 2)))
        con.load("iu", np.array([0, 4, 5]))
        con.load("iv", np.array([0, 1, 2]))
        with pytest.raises(tensordb.DataError, match=r"iu\[2\] = 5 is out of range"):
            con.execute("CREATE TENSOR d[n] AS SUM(U[iu[n], f] * V[iv[n], f])")
        assert "d" not in {r[0] for r in con.execute("SHOW TENSORS").fetchall()}


@pytest.mark.parametrize("tile", [None, (40, 60)])
def test_a_stored_sparse_matrix_times_a_gather_is_the_bits_of_the_rows_taken(eager, tile):
    """``SUM(G[i,j] * E[ids[j], f])``: the spmm reads E through G's columns renumbered by ids
    (one CSR tile), or the rows taken whole (a box over several row tiles)."""
    rng = np.random.default_rng(4)
    G = sp.random_array((90, 60), density=0.1, format="csr", rng=rng)
    E = rng.standard_normal((25, 5))
    ids = rng.integers(-25, 25, 60)

    def run():
        with tensordb.connect(None) as con:
            con.load("G", G, **({} if tile is None else {"tile": tile}))
            con.load("E", E)
            con.load("ids", ids)
            con.execute("CREATE TENSOR Y[i,f] AS SUM(G[i,j] * E[ids[j], f])")
            kernels = json.loads(con.explain("Z[i,f] = SUM(G[i,j] * E[ids[j], f])",
                                             format="json"))["nodes"][0]["kernel"]["method"]
            return con.tensor("Y"), kernels
    got, kernel = run()
    assert kernel == "spmm"
    np.testing.assert_array_equal(got, eager(run)[0])
    np.testing.assert_allclose(got, G @ E[ids], rtol=1e-12, atol=1e-14)
