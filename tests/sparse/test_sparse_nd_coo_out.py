"""Contractions of sparse tensors of rank 3 and more into COO output tiles (AUDIT26 rows 2.16
and 3.13, lim41): ``R[a,b,k] = SUM(T[a,b,c] * U[c,k])`` returns its entries where the plan's
estimate says sparse (``coo tiles from the kernel``), with a dense or a sparse ``U``, and an
output tile whose element count passes int64 is stored, read, exported, checked and replaced.
The oracle is NumPy's einsum on the densified inputs; at large extents a dict of the entries."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import tensordb
from tests.sparse.test_sparse_hyper import _tensor

DTYPES = ["float64", "float32", "int64", "int32"]

QUERIES = [  # (statement, einsum of the sparse tensor and its partner, their names)
    ("R[a,b,k] = SUM(T[a,b,c] * D[c,k])", "abc,ck->abk", "T", "D"),
    ("R[k,b,a] = SUM(D[c,k] * T[a,b,c])", "abc,ck->kba", "T", "D"),
    ("R[b] = SUM(W[a,b,c] * F[a,c])", "abc,ac->b", "W", "F"),  # a sparse vector
    ("R[a,b,k] = SUM(T[a,b,c] * S[c,k])", "abc,ck->abk", "T", "S"),
    ("R[a,c,k] = SUM(T[a,b,c] * G[a,b,k])", "abc,abk->ack", "T", "G"),  # a kept (batch) label
]


def _close(got, want, q):
    assert got.dtype == want.dtype, q
    assert got.shape == want.shape, q
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=q)  # NaN at NaN
    else:
        np.testing.assert_array_equal(got, want, err_msg=q)


def _formats(con, name):
    return {f for (f,) in con.execute(
        "SELECT DISTINCT format FROM tensordb.tiles WHERE tensor = ?", [name]).fetchall()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pieces", ["", " WITH (PIECES c 2)", " WITH (PIECES a 2)"])
def test_contractions_of_a_rank_3_sparse_tensor_return_coo_tiles_equal_to_numpy(tmp_path, dtype,
                                                                                pieces):
    rng = np.random.default_rng(41 + DTYPES.index(dtype))
    shape = (19, 17, 23)
    t = _tensor(rng, shape, 30, dtype, special=True)  # floats: NaN, inf, -inf among them
    ops = {"D": rng.integers(-4, 5, (23, 3)).astype(dtype),
           "F": rng.integers(-4, 5, (19, 23)).astype(dtype),
           "S": _tensor(rng, (23, 40), 15, dtype),  # a sparse matrix partner
           "G": rng.integers(-4, 5, (19, 17, 2)).astype(dtype),
           "T": t, "W": _tensor(rng, (5, 400, 6), 20, dtype, special=True)}
    for c in np.argwhere(t != 0)[:8]:  # entries of S that T's entries meet
        ops["S"][c[2], rng.integers(0, 40)] = 3
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        con.load("T", t, tile=(10, 17, 23))  # two COO tiles
        for name, a in ops.items():
            if name != "T":
                con.load(name, a)
        ops["F"] = rng.integers(-4, 5, (5, 6)).astype(dtype)
        con.load("F", ops["F"], replace=True)
        for q, eq, first, other in QUERIES:
            # a sparse partner of a T holding NaN/inf: the product is dense (a NaN of T times
            # an absent 0 of S is NumPy's NaN; plan/kernel_forms.spmm_nd_operand)
            on_entries = other != "S" or np.dtype(dtype).kind != "f"
            text = con.explain(q + pieces)
            if on_entries:
                assert "spmm x" in text and "coo tiles from the kernel" in text, (q, text)
            con.execute(q + pieces)
            with np.errstate(all="ignore"):
                want = np.einsum(eq, ops[first], ops[other])
            _close(con.tensor("R"), want, q + pieces)
            if on_entries:
                assert _formats(con, "R") <= {"coo"}, (q, _formats(con, "R"))
            # the entries SELECT * yields: the nonzeros of NumPy's answer
            rows = con.execute("SELECT * FROM R").fetchall()
            nz = np.argwhere(want != 0)
            assert len(rows) == len(nz), q


def test_a_float_tensor_holding_nan_with_a_sparse_partner_is_numpys_nan(tmp_path):
    # T's NaN meets U's absent 0s: NaN for every k (NumPy's 0 * NaN), not an entry-only product
    t = np.zeros((6, 5, 4))
    t[1, 2, 3], t[0, 0, 0], t[4, 4, 1] = np.nan, 2.0, -np.inf
    u = np.zeros((4, 9))
    u[3, 1], u[0, 8], u[2, 2] = 5.0, -1.0, 7.0
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("T", t)
        con.load("U", u)
        q = "R[a,b,k] = SUM(T[a,b,c] * U[c,k])"
        assert "spmm x0 sparse" not in con.explain(q)  # not on the entries: computed dense
        con.execute(q)
        with np.errstate(all="ignore"):
            want = np.einsum("abc,ck->abk", t, u)
        _close(con.tensor("R"), want, q)
        assert np.isnan(con.tensor("R")[1, 2]).all()


def test_empty_operands_and_an_empty_label(tmp_path):
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("T", np.zeros((30, 20, 10)))
        con.load("D", np.ones((10, 3)))
        con.load("Z", np.zeros((10, 0)))
        con.execute("R[a,b,k] = SUM(T[a,b,c] * D[c,k])")
        _close(con.tensor("R"), np.zeros((30, 20, 3)), "empty T")
        assert con.execute("SELECT count(*) FROM R").fetchall() == [(0,)]
        t = np.zeros((30, 20, 10))
        t[1, 2, 3] = 4.0
        con.load("T", t, replace=True)
        con.execute("R[a,b,k] = SUM(T[a,b,c] * Z[c,k])")
        _close(con.tensor("R"), np.zeros((30, 20, 0)), "empty k")


def _hyper(con, ext, n=1000):
    con.execute(f"CREATE TENSOR T FROM (SELECT (r * 7919) % {ext} AS a, (r * 104729) % {ext} AS b,"
                f" (r * 31) % {ext} AS c, 1.0 + r AS v FROM range({n}) t(r))"
                f" INDEX (a, b, c) VALUE v SHAPE ({ext}, {ext}, {ext})")
    r = np.arange(n)
    return {(int(i * 7919 % ext), int(i * 104729 % ext), int(i * 31 % ext)): 1.0 + i for i in r}


def _product(tv, uv):
    """SUM over c of T[a,b,c] * U[c,k], from the entries (a dict: the oracle)."""
    by_c: dict = {}
    for (c, k), y in uv.items():
        by_c.setdefault(c, []).append((k, y))
    want: dict = {}
    for (a, b, c), x in tv.items():
        for k, y in by_c.get(c, ()):
            want[(a, b, k)] = want.get((a, b, k), 0.0) + x * y
    return {key: v for key, v in want.items() if v != 0}


def _peak(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("partner", ["dense", "sparse"])
def test_a_hypersparse_rank_3_contraction_stores_its_entries(tmp_path, partner):
    # T: 10^5-cubed, 1,000 entries; its dense output (10^5 x 10^5 x 4) is 298 GiB
    ext, width = 10**5, 4
    rng = np.random.default_rng(5)
    with tensordb.connect(str(tmp_path / "db"), memory_limit="1GB") as con:
        tv = _hyper(con, ext)
        if partner == "dense":
            u = rng.integers(-3, 4, (ext, width)).astype(float)
            con.load("U", u)
            uv = {(int(c), int(k)): float(u[c, k]) for c, k in np.argwhere(u != 0)}
        else:
            con.execute(f"CREATE TENSOR U FROM (SELECT (r * 31) % {ext} AS c, r % {width} AS k,"
                        f" 2.0 + r AS v FROM range(1000) t(r)) INDEX (c, k) VALUE v"
                        f" SHAPE ({ext}, {width})")
            uv = {(int(i * 31 % ext), int(i % width)): 2.0 + i for i in range(1000)}
        q = "R[a,b,k] = SUM(T[a,b,c] * U[c,k])"
        text = con.explain(q)
        assert "spmm x0 sparse" in text and "coo tiles from the kernel" in text, text
        peak = _peak(lambda: con.execute(q))
        assert peak < 256 * 2**20, peak  # the entries and U, not the 298 GiB output
        want = _product(tv, uv)
        got = {(a, b, k): v for a, b, k, v in con.execute("SELECT * FROM R").fetchall()}
        assert set(got) == set(want)
        for key, v in want.items():
            assert got[key] == pytest.approx(v, rel=1e-12)
        info = next(t for t in con.tensors() if t["name"] == "R")
        assert info["bytes"] < 1 << 20, info


def test_an_output_tile_past_int64_elements_is_written_read_checked_and_replaced(tmp_path):
    # R: 10^7-cubed, one output tile of 10^21 elements (its linear ids pass int64)
    ext = 10**7
    with tensordb.connect(str(tmp_path / "db"), memory_limit="1GB") as con:
        tv = _hyper(con, ext)
        con.execute(f"CREATE TENSOR U FROM (SELECT (r * 31) % {ext} AS c, (r * 12347) % {ext} AS k,"
                    f" 2.0 + r AS v FROM range(1000) t(r)) INDEX (c, k) VALUE v"
                    f" SHAPE ({ext}, {ext})")
        uv = {(int(i * 31 % ext), int(i * 12347 % ext)): 2.0 + i for i in range(1000)}
        want = _product(tv, uv)
        for pieces in ("", " WITH (PIECES c 2)"):  # the second replaces R; its partials combine
            q = "R[a,b,k] = SUM(T[a,b,c] * U[c,k])" + pieces
            assert "coo tiles from the kernel" in con.explain(q)
            peak = _peak(lambda: con.execute(q))
            assert peak < 256 * 2**20, peak
            got = {(a, b, k): v for a, b, k, v in con.execute("SELECT * FROM R").fetchall()}
            assert set(got) == set(want), pieces
            for key, v in want.items():
                assert got[key] == pytest.approx(v, rel=1e-12)
            assert _formats(con, "R") == {"coo"}
        assert all(r[-1] == "ok" for r in con.execute("CHECK DATABASE").fetchall())
        # a later statement reads it; an export writes its entries
        con.execute("S[a] = SUM(R[a,b,k])")
        sums: dict = {}
        for (a, _, _), v in want.items():
            sums[a] = sums.get(a, 0.0) + v
        got = dict(con.execute("SELECT * FROM S").fetchall())
        assert set(got) == {a for a, v in sums.items() if v}
        for a, v in got.items():
            assert v == pytest.approx(sums[a], rel=1e-12)
        con.export("R", str(tmp_path / "r.parquet"))
        import duckdb
        assert duckdb.sql(f"SELECT count(*) FROM '{tmp_path / 'r.parquet'}'").fetchall() == \
            [(len(want),)]
        with pytest.raises(tensordb.NotSupportedError, match="int64"):
            con.sparse("R")  # pydata's COO linearises its indices: a user error, named
    with tensordb.connect(str(tmp_path / "db")) as con:  # reopened: as written
        assert con.execute("SELECT count(*) FROM R").fetchall() == [(len(want),)]
