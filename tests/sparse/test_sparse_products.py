"""SpMV, SpMM and SpGEMM on stored sparse tiles against scipy: the SpMV/SpMM kernel calls
scipy's own product kernels straight into the output's rows (exec/sparse_kernels._direct) where
the dtypes agree, and scipy's product where they do not: scipy's bytes. SpGEMM's CSR output is
GraphBLAS's product (semiring.plus_times_csr), or without GraphBLAS the product of the
transposes turned to CSC (exec/sparse_out.sorted_product, scipy's bytes): scipy's structure,
its values to rounding (exact for integer weights).

Oracles: scipy's ``G @ x``, ``G @ X`` and ``G @ G`` (its rows sorted), compared byte for byte
where the same C function computes them: random float values, so a sum taken in another order
would differ in its last bits."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec.sparse_out import sorted_product


def _graph(rng, n, per_row, dtype, empty_rows=True):
    m = n * per_row
    i = rng.integers(0, n, m)
    if empty_rows:
        i = i[i % 7 != 3]  # rows with no entry
    j = rng.integers(0, n, i.size)
    v = rng.standard_normal(i.size).astype(dtype)
    g = sp.csr_array(sp.coo_array((v, (i, j)), shape=(n, n)))
    g.sum_duplicates()
    return g


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmv_and_spmm_equal_scipys_bytes(workers, dtype):
    rng = np.random.default_rng(31)
    n = 3000
    G = _graph(rng, n, 6, dtype)
    x = rng.standard_normal(n).astype(dtype)
    X = rng.standard_normal((n, 5)).astype(dtype)
    with tensordb.connect(workers=workers) as con:
        con.load("G", G, tile=(700, n))  # several CSR row tiles
        con.load("x", x)
        con.load("M", X)
        con.execute("w[i] = SUM(G[i,j] * x[j])")
        con.execute("Y[i,k] = SUM(G[i,j] * M[j,k])")
        assert "spmm" in con.explain("w[i] = SUM(G[i,j] * x[j])")
        assert con.tensor("w").tobytes() == (G @ x).tobytes()
        assert con.tensor("Y").tobytes() == (G @ X).tobytes()


def test_spmv_of_other_dtypes_still_equals_scipy():
    """A float32 graph times a float64 vector: the product is float64 (scipy converts the
    graph), so the kernel takes scipy's product, not its own direct call."""
    rng = np.random.default_rng(32)
    n = 2000
    G = _graph(rng, n, 5, np.float32)
    x = rng.standard_normal(n)
    with tensordb.connect() as con:
        con.load("G", G)
        con.load("x", x)
        con.execute("w[i] = SUM(G[i,j] * x[j])")
        got = con.tensor("w")
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, G @ x)


def test_sorted_product_is_scipys_product_sorted_bit_for_bit():
    rng = np.random.default_rng(33)
    A = _graph(rng, 500, 8, np.float64)
    B = _graph(rng, 500, 8, np.float64)
    for a, b in ((A, B), (A, B.T), (A.T, B)):
        want = sp.csr_array(a @ b)
        want.sort_indices()
        got = sorted_product(a, b)
        assert got.has_sorted_indices
        assert np.array_equal(got.indptr, want.indptr)
        assert np.array_equal(got.indices, want.indices)
        assert got.data.tobytes() == want.data.tobytes()


@pytest.mark.parametrize("weights", ["float", "integer", "cancelling"])
def test_spgemm_stored_csr_equals_scipys(tmp_path, weights):
    rng = np.random.default_rng(34)
    n = 600
    G = _graph(rng, n, 6, np.float64)
    if weights != "float":
        G.data[:] = rng.integers(-3, 4, G.nnz) if weights == "cancelling" else \
            rng.integers(1, 10, G.nnz)
        G.data[G.data == 0] = 1.0
    want = sp.csr_array(G @ G)  # scipy leaves out a sum of 0
    want.sort_indices()
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("G", G)
        con.execute("C[i,k] = SUM(G[i,j] * G[j,k])")
        r = con.store.open("C")
        assert {e.format for e in r.entries.values()} == {"csr"}
        got = con.sparse("C")
        got.sort_indices()
        assert np.array_equal(got.indptr, want.indptr)
        assert np.array_equal(got.indices, want.indices)
        if weights == "float":
            np.testing.assert_allclose(got.data, want.data, rtol=1e-12, atol=1e-12)
        else:  # exact sums, in any order
            assert got.data.tobytes() == want.data.tobytes()
        con.execute("CHECK TENSOR C")


@pytest.mark.parametrize("iso", [True, False], ids=["one-weight", "weights"])
def test_min_plus_csr_output_equals_numpy_on_the_dense_graph(tmp_path, iso):
    """The min-plus kernel's output moved out of GraphBLAS (semiring._unpack_csr), one value
    for every entry (GraphBLAS's iso matrix) or many: numpy's MIN over j of the dense sums."""
    rng = np.random.default_rng(35)
    n = 500
    G = _graph(rng, n, 5, np.float64)
    G.data[:] = 1.0 if iso else rng.integers(1, 10, G.nnz)
    D = np.full((n, n), np.inf)
    D[G.nonzero()] = G.data
    want = np.full((n, n), np.inf)
    for j in range(n):
        np.minimum(want, D[:, j, None] + D[None, j, :], out=want)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("D", G, fill_value=np.inf)
        con.execute("P[i,k] = MIN(D[i,j] + D[j,k])")
        r = con.store.open("P")
        assert {e.format for e in r.entries.values()} == {"csr"}
        np.testing.assert_array_equal(con.tensor("P"), want)
        con.execute("CHECK TENSOR P")
