"""Elementwise joins of hypersparse matrices (COO tiles: far more rows than entries) on their
entries (exec/sparse_hyper.py, lim41): ``A * B``, ``A + B``, ``A - B`` make no CSR row pointers
over a box's rows, and a hypersparse output comes back as COO tiles (``coo tiles from the
kernel``). The oracle is NumPy on the densified matrices; at 10^10 rows the entries."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import tensordb

DTYPES = ["float64", "float32", "int64", "int32"]
OPS = {"*": np.multiply, "+": np.add, "-": np.subtract}


def _hyper(rng, shape, n, dtype, special=False):
    a = np.zeros(shape, dtype)
    lin = rng.choice(shape[0] * shape[1], n, replace=False)
    a.reshape(-1)[lin] = (rng.integers(1, 20, n) * rng.choice([-1, 1], n)).astype(dtype)
    if special and np.dtype(dtype).kind == "f":
        a.reshape(-1)[lin[:3]] = [np.nan, np.inf, -np.inf]
    return a


@pytest.mark.parametrize("dtype", DTYPES)
def test_joins_of_hypersparse_matrices_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(410 + DTYPES.index(dtype))
    shape = (3000, 7)  # 3000 rows, 12 entries: COO tiles
    a = _hyper(rng, shape, 12, dtype, special=True)
    b = _hyper(rng, shape, 10, dtype, special=True)
    b.reshape(-1)[np.flatnonzero(a)[4:8]] = 3  # entries that meet
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        e = np.zeros(shape, dtype)  # one entry that meets none of A's
        e.reshape(-1)[np.flatnonzero(a == 0)[0]] = 5
        con.load("E", e)
        assert {f for (f,) in con.execute("SELECT DISTINCT format FROM tensordb.tiles")
                .fetchall()} == {"coo"}
        for fn, op in OPS.items():
            for q, want in [(f"C[i,j] = A[i,j] {fn} B[i,j]", lambda: op(a, b)),
                            (f"C[j,i] = B[i,j] {fn} A[i,j]", lambda: op(b, a).T),
                            (f"C[i,j] = A[i,j] {fn} E[i,j]", lambda: op(a, e))]:  # A * E: no entry meets (NaN * 0 aside)
                text = con.explain(q)
                # C[j,i] has 7 rows: CSR tiles (computed on the COO boxes' entries too)
                fmt = "csr" if q.startswith("C[j,i]") else "coo"
                assert "spjoin x0 x1 sparse" in text and f"{fmt} tiles from the kernel" in text, \
                    (q, text)
                con.execute(q)
                with np.errstate(all="ignore"):
                    w = np.ascontiguousarray(want())
                got = con.tensor("C")
                assert got.dtype == w.dtype, q
                np.testing.assert_array_equal(got, w, err_msg=q)  # NaN at NaN
                assert con.execute("SELECT count(*) FROM C").fetchall() == \
                    [(int(np.count_nonzero(w)),)], q


def test_a_join_of_a_10_to_the_10_row_matrix_is_its_entries(tmp_path):
    n = 10**10  # CSR row pointers of one box: 74.5 GiB (refused at planning before)
    with tensordb.connect(str(tmp_path / "db"), memory_limit="1GB") as con:
        con.execute(f"CREATE TENSOR G FROM (SELECT r * 1000000007 AS a, r * 999999937 AS b, "
                    f"1.5 + r AS v FROM range(5) t(r)) INDEX (a, b) VALUE v SHAPE ({n}, {n})")
        g = {(r * 1000000007, r * 999999937): 1.5 + r for r in range(5)}
        script = "J[i,j] = G[i,j] * G[i,j]; K[i,j] = G[i,j] - J[i,j]"
        text = con.explain(script)
        assert text.count("coo tiles from the kernel") == 2, text
        tracemalloc.start()
        try:
            con.execute(script)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 * 2**20, peak
        assert sorted(con.execute("SELECT * FROM J").fetchall()) == \
            sorted((a, b, v * v) for (a, b), v in g.items())
        assert sorted(con.execute("SELECT * FROM K").fetchall()) == \
            sorted((a, b, v - v * v) for (a, b), v in g.items())
        assert all(r[-1] == "ok" for r in con.execute("CHECK DATABASE").fetchall())
