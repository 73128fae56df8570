"""The tile join of one stored input's tiles, made without DuckDB (physical/lower._join_one):
its rows equal the DuckDB join's (tilejoin.join, the oracle) and the results equal numpy's."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import tensordb
from tensordb.physical import tilejoin

lower = importlib.import_module("tensordb.physical.lower")
T = 16


def block_sparse(rng, n, m, density):
    a = np.zeros((n, m), np.float32)
    mask = rng.random((n // T, m // T)) < density
    mask[0, 0] = True
    for i, j in zip(*np.nonzero(mask)):
        a[i * T:(i + 1) * T, j * T:(j + 1) * T] = rng.standard_normal((T, T), dtype=np.float32)
    return a


@pytest.fixture
def checked(monkeypatch):
    """Each answer of _join_one compared with DuckDB's join; the count of answers given."""
    orig = lower._Lowering._join_one
    hits = []

    def both(self, op, pieces, bounds, inner, outer, whole):
        rows = orig(self, op, pieces, bounds, inner, outer, whole)
        if rows is not None:
            sql, params = tilejoin.join(
                op, pieces, inner, outer, whole,
                lambda k: self._presence_sql(op.inputs[k].tensor, op.inputs[k].labels, bounds))
            want = np.array(self.store.query(sql, params), np.int64).reshape(-1, rows.shape[1])
            want = want[np.lexsort(want.T[::-1])]
            assert rows.shape == want.shape and (rows == want).all(), op.describe()
            hits.append(op.describe())
        return rows
    monkeypatch.setattr(lower._Lowering, "_join_one", both)
    return hits


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("sql, oracle, applies", [
    ("C[i,k] = SUM(A[i,j] * B[j,k])", lambda a, b: a @ b, True),
    ("C[i,k] = SUM(B[j,i] * A[j,k])", lambda a, b: b.T @ a, True),
    ("C[j,k] = SUM(A[i,j] * B[i,k])", lambda a, b: a.T @ b, True),
    ("C[i,j] = A[i,j] * B2[i,j]", lambda a, b: a * b, True),
    ("C[i,j] = A[i,j] + B2[i,j]", lambda a, b: a + b, False),  # a union: SQL
    ("c[i] = SUM(A[i,i] * B[i,k])", lambda a, b: np.diag(a) * b.sum(axis=1), False),  # diagonal
])
def test_rows_and_results(tmp_path, checked, workers, sql, oracle, applies):
    rng = np.random.default_rng(workers)
    a = block_sparse(rng, 128, 128, 0.1)
    b = rng.standard_normal((128, 48), dtype=np.float32)
    b2 = rng.standard_normal((128, 128), dtype=np.float32)
    with tensordb.connect(str(tmp_path / "db"), workers=workers) as con:
        con.load("A", a, tile=(T, T))
        con.load("B", b, tile=(T, 48))
        con.load("B2", b2, tile=(T, T))
        con.execute(sql)
        got = con.tensor("c" if sql.startswith("c[") else "C")
    np.testing.assert_allclose(got, oracle(a, b2 if "B2" in sql else b), rtol=1e-4, atol=1e-4)
    if not applies:
        assert not checked
    elif workers == 1:  # the pieces are A's tiles on one worker; more may cut them otherwise
        assert checked


def test_no_tiles_present(tmp_path, checked):
    """A tensor whose tiles are all absent (zeros): no rows, an all-zero result."""
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("A", np.zeros((64, 64), np.float32), tile=(T, T))
        con.load("B", np.ones((64, 8), np.float32), tile=(T, 8))
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_array_equal(con.tensor("C"), np.zeros((64, 8), np.float32))


@pytest.mark.parametrize("case", ["negzero", "csr", "three", "vector", "nan_b", "let", "min_plus",
                                  "scaled", "transposed_out"])
def test_more_shapes_of_input_equal_duckdbs_join_and_numpy(tmp_path, checked, case):
    """Review of issue 26 (peers26): inputs the first tests leave out. A tile of -0.0 (stored,
    nnz 0), CSR tiles, three operands, a vector, a dense operand holding NaN (not whole: the
    SQL), a LET input (no reader), a min-plus of fill +inf, a scalar factor, a transposed
    output. Every row set the fast join gives is DuckDB's (the fixture), every result numpy's."""
    rng = np.random.default_rng(11)
    a = block_sparse(rng, 96, 96, 0.15)
    b = rng.standard_normal((96, 32)).astype(np.float32)
    e = rng.standard_normal((32, 16)).astype(np.float32)
    with tensordb.connect(str(tmp_path / "db"), workers=1) as con:
        if case == "negzero":
            a[T:2 * T, 2 * T:3 * T] = -0.0
        if case == "csr":
            import scipy.sparse as sp
            a = np.zeros((96, 96), np.float32)
            a[rng.random((96, 96)) < 0.02] = 1.5
            a[0, 0] = 2.0
            con.load("A", sp.csr_array(a), tile=(T, T))
        elif case == "min_plus":
            import scipy.sparse as sp
            d = np.where(a != 0, np.abs(a), np.inf).astype(np.float32)
            con.load("A", sp.csr_array(np.abs(a)), tile=(T, T), fill_value=np.inf)
        else:
            con.load("A", a, tile=(T, T))
        if case == "nan_b":
            b[3, 4] = np.nan
        con.load("B", b, tile=(T, 32))
        con.load("E", e, tile=(32, 16))
        con.load("v", b[:, 0].copy(), tile=(T,))
        if case in ("negzero", "csr", "nan_b"):
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
            want = a.astype(np.float64) @ b.astype(np.float64)
        elif case == "three":
            con.execute("C[i,l] = SUM(A[i,j] * B[j,k] * E[k,l])")
            want = a.astype(np.float64) @ b.astype(np.float64) @ e.astype(np.float64)
        elif case == "vector":
            con.execute("C[i] = SUM(A[i,j] * v[j])")
            want = a.astype(np.float64) @ b[:, 0].astype(np.float64)
        elif case == "let":
            con.execute("LET X[i,j] = A[i,j] * A[i,j]; C[i,k] = SUM(X[i,j] * B[j,k])")
            want = (a.astype(np.float64) ** 2) @ b.astype(np.float64)
        elif case == "min_plus":
            con.load("w", np.abs(b[:, 0]).astype(np.float32), tile=(T,))
            con.execute("C[k] = MIN(w[j] + A[j,k])")
            want = (np.abs(b[:, 0])[:, None].astype(np.float64) + d).min(axis=0)
        elif case == "scaled":
            con.execute("C[i,k] = SUM(2.5 * A[i,j] * B[j,k])")
            want = 2.5 * (a.astype(np.float64) @ b.astype(np.float64))
        else:
            con.execute("C[k,i] = SUM(A[i,j] * B[j,k])")
            want = (a.astype(np.float64) @ b.astype(np.float64)).T
        got = con.tensor("C")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    if case in ("negzero", "transposed_out"):  # A's tiles are the pieces: the fast join ran
        assert checked
