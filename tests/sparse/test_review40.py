"""Review of stop 39's sparse changes (rev40): the dense fallback of a masked or sampled product
(values that overflow GraphBLAS's finite path) kept within ``memory_limit``, and banded calls'
answers against numpy."""
import json
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec import semiring, sparse_bands

TRI = "t = SUM(A[i,j] * A[j,k] * A[k,i])"


def _method(con, sql):
    out = con.explain(sql, format="json")
    out = out if isinstance(out, dict) else json.loads(out)
    return out["nodes"][0]["kernel"]["method"]


def _overflowing(n, seed):
    """A sparse matrix of small integers with a few entries near the float64 maximum: finite (the
    catalog says so, the plan keeps the masked kernel) but their products overflow."""
    a = sp.random_array((n, n), density=0.05, rng=np.random.default_rng(seed), format="csr")
    a.data = np.round(a.data * 9) + 1
    a.data[::97] = 1e300
    return a


def test_an_overflowing_masked_product_falls_back_within_memory_limit(tmp_path):
    """The fallback used to make the call's whole join space at once (500 x 500 x 250 float64,
    500 MB per call and two calls at once) under a 200 MB ``memory_limit``; now in slabs. The
    answer is numpy's on the dense matrix (NaN here: an inf meets a 0)."""
    a = _overflowing(500, 5)
    d = a.toarray()
    with tensordb.connect(tmp_path / "t.tdb") as con:
        con.execute("SET memory_limit = '200MB'")
        con.load("A", a)
        assert _method(con, TRI) == "masked"
        tracemalloc.start()
        try:
            con.execute(TRI)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        got = float(con.tensor("t"))
    assert peak < 200e6, peak
    with np.errstate(all="ignore"):
        want = float(np.einsum("ij,jk,ki->", d, d, d))
    np.testing.assert_equal(got, want)


@pytest.mark.parametrize("out_labels", [True, False])
def test_the_slabbed_dense_fallback_is_numpys_answer(tmp_path, monkeypatch, out_labels):
    """Slabs of one row each (``CHUNK`` tiny): the fallback's result is numpy's on the dense
    operands, a row-kept output element for element, a scalar to rounding; finite values."""
    monkeypatch.setattr(semiring, "CHUNK", 1)
    rng = np.random.default_rng(11)
    m = sp.random_array((40, 30), density=0.2, rng=rng, format="csr")
    u, v = rng.standard_normal((40, 5)), rng.standard_normal((30, 5))
    m.data[0] = 1e300  # finite, but the products may overflow: the dense fallback
    u[0, 0] = 1e300
    sql = ("C[i,j] = SUM(M[i,j] * U[i,r] * V[j,r])" if out_labels else
           "c = SUM(M[i,j] * U[i,r] * V[j,r])")
    with tensordb.connect(tmp_path / "f.tdb") as con:
        con.load("M", m)
        con.load("U", u)
        con.load("V", v)
        con.execute(sql)
        got = con.tensor("C" if out_labels else "c")
        got = got.toarray() if hasattr(got, "toarray") else np.asarray(got)
    with np.errstate(all="ignore"):
        want = np.einsum("ij,ir,jr->ij" if out_labels else "ij,ir,jr->", m.toarray(), u, v)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_banded_float_triangle_sum_equals_numpy_to_rounding(tmp_path, monkeypatch):
    """The masked product summed to a float scalar is the one banded reduction: the bands'
    sums are added in another order than the one call's (docs/sql.md says so), within a few
    ulps of numpy's answer; an empty band (rows with no entries) adds nothing."""
    a = sp.random_array((90, 90), density=0.06, rng=np.random.default_rng(4), format="lil")
    a[10:30, :] = 0  # whole bands of empty rows
    a = a.tocsr()
    d = a.toarray()
    with tensordb.connect(tmp_path / "b.tdb") as con:
        con.load("A", a)
        assert _method(con, TRI) == "masked"
        monkeypatch.setattr(sparse_bands, "FORCE_ROWS", 7)
        monkeypatch.setattr(sparse_bands, "SMALL_WORK", 1 << 21)
        con.execute(TRI)
        got = float(con.tensor("t"))
    assert got == pytest.approx(float(np.einsum("ij,jk,ki->", d, d, d)), rel=1e-13)
