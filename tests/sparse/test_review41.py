"""Adversarial review (stop 41) of the rank-3+ sparse kernels merged at stop 40 (nd40, hyp40b):
each test is a case the review found wrong or worth pinning, checked against NumPy on the
densified inputs (or a dict of entries where the extent is too large to densify)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tensordb

OPS = {"*": np.multiply, "+": np.add, "-": np.subtract}


def _huge(con, name, ext, first_a, step, value, tile):
    con.execute(f"CREATE TENSOR {name} FROM (SELECT {first_a} + {step} * r AS a, r AS b, "
                f"2 * r AS c, {value} + r AS v FROM range(10) t(r)) INDEX (a, b, c) VALUE v "
                f"SHAPE ({ext}, {ext}, {ext}) TILE ({tile}, {ext}, {ext})")
    return {(first_a + step * r, r, 2 * r): float(value + r) for r in range(10)}


@pytest.mark.parametrize("pieces", ["", " WITH (PIECES a 2)", " WITH (PIECES a 4, b 2)"])
def test_a_join_whose_box_of_one_operand_is_absent_reads_no_zeros(tmp_path, pieces):
    """T's entries in the first stored tile along a, U's in the second: a box where one is
    absent was np.zeros of the box (3.55 PiB: OutOfMemoryError at 1.2 KiB projected)."""
    ext = 10**5
    with tensordb.connect(str(tmp_path / "db"), memory_limit="512MB") as con:
        t = _huge(con, "T", ext, 0, 1, 1.0, ext // 2)
        u = _huge(con, "U", ext, ext - 10, 1, 2.0, ext // 2)
        for fn in OPS:
            q = f"X[a,b,c] = T[a,b,c] {fn} U[a,b,c]{pieces}"
            assert "coo tiles from the kernel" in con.explain(q), q
            con.execute(q)
            want = {k: OPS[fn](t.get(k, 0.0), u.get(k, 0.0)) for k in set(t) | set(u)}
            want = {k: v for k, v in want.items() if v != 0}
            got = {(a, b, c): v for a, b, c, v in con.execute("SELECT * FROM X").fetchall()}
            assert got == want, q


def _mat(rng, shape, nnz, dtype, special=()):
    a = np.zeros(shape, dtype)
    lin = rng.choice(a.size, nnz, replace=False)
    a.reshape(-1)[lin] = rng.integers(-5, 6, nnz).astype(dtype) + 0.5
    a.reshape(-1)[lin[:len(special)]] = special
    return a


def test_spgemm_nonfinite_directly_equals_numpy():
    from tensordb.exec.sparse_nonfinite import spgemm_nonfinite
    rng = np.random.default_rng(41)
    for trial in range(60):
        n, m, p = rng.integers(1, 9, 3)
        dtype = np.dtype(["float64", "float32"][trial % 2])
        sp_ = [np.inf, -np.inf, np.nan][: int(rng.integers(0, 3))]
        dp_ = [np.nan, np.inf][: int(rng.integers(0, 2))]
        s = _mat(rng, (n, m), int(rng.integers(len(sp_), n * m + 1)), dtype, sp_)
        d = _mat(rng, (m, p), int(rng.integers(len(dp_), m * p + 1)), dtype, dp_)
        si, sj = np.nonzero(s)
        dj, dk = np.nonzero(d)
        r, c, v = spgemm_nonfinite((si, sj, s[si, sj]), (dj, dk, d[dj, dk]), (n, p), dtype)
        got = np.zeros((n, p), dtype)
        got[r, c] = v
        with np.errstate(all="ignore"):
            want = s @ d
        assert v.dtype == dtype
        assert len(set(zip(r.tolist(), c.tolist()))) == r.size  # each element once
        np.testing.assert_array_equal(got, want, err_msg=f"{s}\n{d}")


@pytest.mark.parametrize("workers", [1, 2])
def test_spgemm_with_a_stored_inf_or_nan_equals_numpy(tmp_path, workers):
    rng = np.random.default_rng(42 + workers)
    with tensordb.connect(str(tmp_path / "db"), workers=workers) as con:
        for dtype in ("float64", "float32"):
            for sg, sh in [([np.inf], []), ([], [np.nan]), ([-np.inf], [np.nan])]:
                for tiles in [{}, {"G": (40, 60), "H": (45, 150)}]:
                    g = _mat(rng, (120, 90), 30, dtype, sg)
                    h = _mat(rng, (90, 150), 30, dtype, sh)
                    con.load("G", g, replace=True, **({"tile": tiles["G"]} if tiles else {}))
                    con.load("H", h, replace=True, **({"tile": tiles["H"]} if tiles else {}))
                    for q, eq in [("R[i,k] = SUM(G[i,j] * H[j,k])", "ij,jk->ik"),
                                  ("R[k,i] = SUM(H[j,k] * G[i,j])", "ij,jk->ki"),
                                  ("R[i,k] = SUM(G[i,j] * H[j,k]) WITH (PIECES i 2, j 3)",
                                   "ij,jk->ik")]:
                        con.execute(q)
                        with np.errstate(all="ignore"):
                            want = np.einsum(eq, g, h)
                        got = con.tensor("R")
                        assert got.dtype == want.dtype, q
                        np.testing.assert_array_equal(got, want, err_msg=q)


def test_a_hypersparse_spgemm_holding_inf_runs_on_its_entries(tmp_path):
    """G of 10^6 x 10^6 with 5 entries, one inf, times H: NumPy's answer is a row of NaN (inf
    times H's absent zeros) but where H has an entry. The plan (CSR output, 7.6 MiB) ran a
    dense tensordot: 7.28 TiB, OutOfMemoryError."""
    n = 10**6
    with tensordb.connect(str(tmp_path / "db"), memory_limit="2GB") as con:
        con.execute(f"CREATE TENSOR G FROM (SELECT r * 7 AS i, r * 7 AS j, CASE WHEN r = 3 "
                    f"THEN 'inf'::DOUBLE ELSE 1.0 + r END AS v FROM range(5) t(r)) INDEX (i, j) "
                    f"VALUE v SHAPE ({n}, {n})")
        con.execute(f"CREATE TENSOR H FROM (SELECT r * 7 AS j, r * 13 AS k, 2.0 + r AS v "
                    f"FROM range(5) t(r)) INDEX (j, k) VALUE v SHAPE ({n}, {n})")
        q = "R[i,k] = SUM(G[i,j] * H[j,k])"
        assert "spmm x0 sparse" in con.explain(q)
        con.execute(q)
        g = {(7 * r, 7 * r): (np.inf if r == 3 else 1.0 + r) for r in range(5)}
        h = {(7 * r, 13 * r): 2.0 + r for r in range(5)}
        want = {(i, k): gv * hv for (i, j), gv in g.items() for (j2, k), hv in h.items()
                if j == j2 and i != 21}
        rows = con.execute("SELECT i, k, value FROM R WHERE i <> 21").fetchall()
        assert {(i, k): v for i, k, v in rows} == want
        nan_row = con.execute("SELECT count(*), count(*) FILTER (WHERE isnan(value)), "
                              "max(value) FILTER (WHERE NOT isnan(value)) FROM R WHERE i = 21"
                              ).fetchall()
        assert nan_row == [(n, n - 1, np.inf)]  # inf * 5.0 at k = 39, inf * 0 elsewhere


@pytest.mark.parametrize("inf_in", ["G", "H"])
def test_an_absent_tile_times_a_hypersparse_tile_holding_inf(tmp_path, inf_in):
    """G's second column tile (j >= n/2) meets H's absent second row tile: inf * 0 is NaN over
    a row (or a column) of the output. The present COO tile was densified: 3.64 TiB."""
    n = 10**6
    inf = "CASE WHEN r = 3 THEN 'inf'::DOUBLE ELSE 1.0 + r END"
    with tensordb.connect(str(tmp_path / "db"), memory_limit="2GB") as con:
        # the inf at (21, n - 3) of G, or at (n - 3, 39) of H: in the tile the other lacks
        g_j = f"CASE WHEN r = 3 THEN {n} - 3 ELSE r * 7 END" if inf_in == "G" else "r * 7"
        h_j = f"CASE WHEN r = 3 THEN {n} - 3 ELSE r * 7 END" if inf_in == "H" else "r * 7"
        con.execute(f"CREATE TENSOR G FROM (SELECT r * 7 AS i, {g_j} AS j, "
                    f"{inf if inf_in == 'G' else '1.0 + r'} AS v FROM range(5) t(r)) "
                    f"INDEX (i, j) VALUE v SHAPE ({n}, {n}) TILE ({n}, {n // 2})")
        con.execute(f"CREATE TENSOR H FROM (SELECT {h_j} AS j, r * 13 AS k, "
                    f"{inf if inf_in == 'H' else '2.0 + r'} AS v FROM range(5) t(r)) "
                    f"INDEX (j, k) VALUE v SHAPE ({n}, {n}) TILE ({n // 2}, {n})")
        con.execute("R[i,k] = SUM(G[i,j] * H[j,k]) WITH (PIECES j 2)")
        line = "i = 21" if inf_in == "G" else "k = 39"
        assert con.execute(f"SELECT count(*), count(*) FILTER (WHERE isnan(value)) FROM R "
                           f"WHERE {line}").fetchall() == [(n, n)]
        others = con.execute(f"SELECT i, k, value FROM R WHERE NOT ({line})").fetchall()
        h = 1.0 if inf_in == "H" else 2.0
        want = {(7 * r, 13 * r): (1.0 + r) * (h + r) for r in range(5) if r != 3}
        assert {(i, k): v for i, k, v in others} == want


ND = [("R[a,b,k] = SUM(T[a,b,c] * M[c,k])", "abc,ck->abk"),  # M the sparse operand: was an
      ("R[k,a] = SUM(T[a,b,c] * M[c,k])", "abc,ck->ka"),    # InternalError (CooTile.data)
      ("R[a,k] = SUM(M[c,k] * T[a,b,c])", "ck,abc->ak"),
      ("R[b,c] = SUM(T[a,b,c] * M[c,a])", "abc,ca->bc"),
      ("R[c,b] = SUM(T[a,b,c] * M[c,a])", "abc,ca->cb"),
      ("R[k] = SUM(T[a,b,c] * M[c,k])", "abc,ck->k"),
      ("R[a,k] = SUM(T[a,b,c] * M[c,k]) WITH (PIECES a 2, c 2)", "abc,ck->ak"),
      ("R[a,b,k] = SUM(T[a,b,c] * U[a,c,k])", "abc,ack->abk"),
      ("R[a,k] = SUM(T[a,b,c] * U[a,c,k])", "abc,ack->ak"),
      ("R[k,b] = SUM(T[a,b,c] * U[a,c,k]) WITH (PIECES a 2, c 2)", "abc,ack->kb")]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int32"])
def test_a_rank_3_sparse_tensor_times_a_sparse_matrix_or_tensor_equals_numpy(tmp_path, dtype,
                                                                             workers):
    from tests.sparse.test_sparse_hyper import _tensor
    rng = np.random.default_rng(4100 + workers)
    with tensordb.connect(str(tmp_path / "db"), workers=workers) as con:
        for special in ("", "T", "M") if dtype.startswith("float") else ("",):
            t = _tensor(rng, (30, 25, 40), 40, dtype, special=special == "T")
            m = _tensor(rng, (40, 30), 25, dtype, special=special == "M")
            u = _tensor(rng, (30, 40, 30), 40, dtype, special=special == "M")
            con.load("T", t, replace=True)
            con.load("M", m, replace=True)
            con.load("U", u, replace=True)
            for q, eq in ND:
                ops = [t, m if "M[" in q else u]
                con.execute(q)
                with np.errstate(all="ignore"):
                    want = np.einsum(eq, *(ops[::-1] if eq.startswith("ck") else ops))
                got = con.tensor("R")
                assert got.dtype == want.dtype, q
                np.testing.assert_array_equal(got, want, err_msg=f"{special} {q}")


def test_a_hypersparse_rank_3_tensor_times_a_hypersparse_matrix_keeps_it_sparse(tmp_path):
    """R[a,k] = SUM(T[a,b,c] * M[c,k]), M of 10^5 x 10^5 with 5 entries: the plan holds M as
    its entries (8 KiB), the kernel densified it (74.5 GiB, OutOfMemoryError); the CSR output
    the plan names is what the kernel returns."""
    n = 10**5
    with tensordb.connect(str(tmp_path / "db"), memory_limit="2GB") as con:
        con.execute(f"CREATE TENSOR T FROM (SELECT r * 7 AS a, r * 3 AS b, r * 11 AS c, "
                    f"1.0 + r AS v FROM range(5) t(r)) INDEX (a, b, c) VALUE v "
                    f"SHAPE (1000, 1000, {n})")
        con.execute(f"CREATE TENSOR M FROM (SELECT r * 11 AS c, r * 13 AS k, 2.0 + r AS v "
                    f"FROM range(5) t(r)) INDEX (c, k) VALUE v SHAPE ({n}, {n})")
        q = "R[a,k] = SUM(T[a,b,c] * M[c,k])"
        text = con.explain(q)
        assert "spmm x0 sparse" in text and "csr tiles from the kernel" in text, text
        con.execute(q)
        want = {(7 * r, 13 * r): (1.0 + r) * (2.0 + r) for r in range(5)}
        assert {(a, k): v for a, k, v in con.execute("SELECT * FROM R").fetchall()} == want


def test_a_spgemm_of_two_hypersparse_rank_3_tensors_into_a_sparse_matrix(tmp_path):
    """R[a,k] = SUM(T[a,b,c] * U[a,c,k]) of 10^5-extent tensors of 5 entries: the plan says CSR
    tiles (kilobytes); contract_coo filled a dense (10^5, 10^5) output: 74.5 GiB."""
    n = 10**5
    with tensordb.connect(str(tmp_path / "db"), memory_limit="2GB") as con:
        con.execute(f"CREATE TENSOR T FROM (SELECT r * 7 AS a, r * 3 AS b, r * 11 AS c, "
                    f"1.0 + r AS v FROM range(5) t(r)) INDEX (a, b, c) VALUE v "
                    f"SHAPE ({n}, 1000, {n})")
        con.execute(f"CREATE TENSOR U FROM (SELECT r * 7 AS a, r * 11 AS c, r * 13 AS k, "
                    f"2.0 + r AS v FROM range(5) t(r)) INDEX (a, c, k) VALUE v "
                    f"SHAPE ({n}, {n}, {n})")
        for q, key in [("R[a,k] = SUM(T[a,b,c] * U[a,c,k])", lambda r: (7 * r, 13 * r)),
                       ("R[k,a] = SUM(U[a,c,k] * T[a,b,c])", lambda r: (13 * r, 7 * r))]:
            assert "csr tiles from the kernel" in con.explain(q), q
            con.execute(q)
            want = {key(r): (1.0 + r) * (2.0 + r) for r in range(5)}
            got = {(x, y): v for x, y, v in con.execute("SELECT * FROM R").fetchall()}
            assert got == want, q


@pytest.mark.parametrize("workers", [1, 2])
def test_matrix_joins_holding_nan_and_inf_equal_numpy(tmp_path, workers):
    rng = np.random.default_rng(4200 + workers)
    with tensordb.connect(str(tmp_path / "db"), workers=workers) as con:
        for dtype in ("float64", "float32"):
            a = _mat(rng, (60, 50), 40, dtype, [np.nan, np.inf, -np.inf])
            b = _mat(rng, (60, 50), 40, dtype, [np.inf, np.nan])
            b.reshape(-1)[np.flatnonzero(a)[3:8]] = 2.5  # some shared entries
            con.load("A", a, replace=True, tile=(30, 50))
            con.load("B", b, replace=True)
            con.load("BT", np.ascontiguousarray(b.T), replace=True)
            for fn in OPS:
                for q, other in [(f"X[i,j] = A[i,j] {fn} B[i,j]", b),
                                 (f"X[i,j] = A[i,j] {fn} BT[j,i]", b),
                                 (f"X[i,j] = B[i,j] {fn} A[i,j] WITH (PIECES i 2, j 2)", None)]:
                    assert "spjoin x0 x1 sparse" in con.explain(q), q
                    con.execute(q)
                    with np.errstate(all="ignore"):
                        want = OPS[fn](a, other) if other is not None else OPS[fn](b, a)
                    got = con.tensor("X")
                    assert got.dtype == want.dtype, q
                    np.testing.assert_array_equal(got, want, err_msg=q)


def test_a_hypersparse_matrix_product_holding_nan_is_its_entries(tmp_path):
    """A * B of 10^6 x 10^6 matrices of 5 entries, A holding a NaN where B has none: NumPy's
    NaN there. The kernel densified both (7.28 TiB) where the plan said CSR (22.9 MiB). An
    absent tile of A (two stored tiles along i) was np.zeros of its box too."""
    n = 10**6
    nan = "CASE WHEN r = 3 THEN 'nan'::DOUBLE ELSE 1.0 + r END"
    with tensordb.connect(str(tmp_path / "db"), memory_limit="2GB") as con:
        con.execute(f"CREATE TENSOR A FROM (SELECT r * 7 AS i, r * 7 AS j, {nan} AS v "
                    f"FROM range(5) t(r)) INDEX (i, j) VALUE v SHAPE ({n}, {n}) "
                    f"TILE ({n // 2}, {n})")
        con.execute(f"CREATE TENSOR B FROM (SELECT {n} - 1 - r * 7 AS i, r * 13 AS j, "
                    f"2.0 + r AS v FROM range(5) t(r) UNION ALL SELECT 0, 0, 5.0) "
                    f"INDEX (i, j) VALUE v SHAPE ({n}, {n}) TILE ({n // 2}, {n})")
        a = {(7 * r, 7 * r): (np.nan if r == 3 else 1.0 + r) for r in range(5)}
        b = {(n - 1 - 7 * r, 13 * r): 2.0 + r for r in range(5)}
        b[(0, 0)] = 5.0
        for fn in OPS:
            q = f"X[i,j] = A[i,j] {fn} B[i,j] WITH (PIECES i 2)"
            con.execute(q)
            got = {(i, j): v for i, j, v in con.execute("SELECT * FROM X").fetchall()}
            keys = set(a) | set(b) if fn != "*" else set(a)
            want = {k: OPS[fn](a.get(k, 0.0), b.get(k, 0.0)) for k in keys}
            want = {k: v for k, v in want.items() if v != 0}
            assert got.keys() == want.keys(), q
            np.testing.assert_array_equal([got[k] for k in sorted(got)],
                                          [want[k] for k in sorted(want)], err_msg=q)


def test_a_join_of_tensors_past_2_62_elements_is_cut_into_storable_output_tiles(tmp_path):
    """T + U of 10^7-cubed sparse tensors (10^21 elements, each stored in 217 tiles): the plan
    was one kernel call whose output tile the writer cannot index (DataError 'invalid dims' at
    run time); its output tiles are now at most 2**62 elements."""
    n = 10**7
    with tensordb.connect(str(tmp_path / "db"), memory_limit="2GB") as con:
        ents = {}
        for name, m in [("T", 17), ("U", 13)]:
            con.execute(f"CREATE TENSOR {name} FROM (SELECT r * 7919 AS a, r * 31 AS b, "
                        f"r * {m} AS c, 1.0 + r AS v FROM range(50) t(r)) INDEX (a, b, c) "
                        f"VALUE v SHAPE ({n}, {n}, {n})")
            ents[name] = {(7919 * r, 31 * r, m * r): 1.0 + r for r in range(50)}
        for fn in OPS:
            con.execute(f"X[a,b,c] = T[a,b,c] {fn} U[a,b,c]")
            t, u = ents["T"], ents["U"]
            keys = set(t) & set(u) if fn == "*" else set(t) | set(u)
            want = {k: OPS[fn](t.get(k, 0.0), u.get(k, 0.0)) for k in keys}
            got = {(a, b, c): v for a, b, c, v in con.execute("SELECT * FROM X").fetchall()}
            assert got == {k: v for k, v in want.items() if v != 0}, fn
            info = next(x for x in con.tensors() if x["name"] == "X")
            assert math.prod(info["tile_shape"]) <= 2**62


@pytest.mark.parametrize("workers", [1, 2])
def test_a_joins_coo_tiles_re_cut_for_a_later_statement_stay_entries(tmp_path, workers):
    """X = T + U (COO tiles of rank 3) then reductions of X over another tiling: the Assemble
    that re-cuts X's tiles densified them (10^21 elements at 10^7 cubed: DataError 'array is
    too big'); at a small extent every consumer equals NumPy."""
    from tests.sparse.test_sparse_hyper import _tensor
    rng = np.random.default_rng(4300 + workers)
    with tensordb.connect(str(tmp_path / "db"), workers=workers) as con:
        t = _tensor(rng, (30, 24, 40), 40, "float64", special=True)
        u = _tensor(rng, (30, 24, 40), 40, "float64")
        con.load("T", t)
        con.load("U", u)
        script = ("X[a,b,c] = T[a,b,c] + U[a,b,c] WITH (PIECES c 4); "
                  "Y[a,b] = SUM(X[a,b,c]) WITH (PIECES a 3); Z[c] = MAX(X[a,b,c]); "
                  "W[b,c,a] = X[a,b,c] * T[a,b,c] WITH (PIECES a 2)")
        con.execute(script)
        x = t + u
        with np.errstate(all="ignore"):
            for name, want in [("X", x), ("Y", x.sum(axis=2)), ("Z", x.max(axis=(0, 1))),
                               ("W", (x * t).transpose(1, 2, 0))]:
                got = con.tensor(name)
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want, err_msg=name)
    n = 10**7
    with tensordb.connect(str(tmp_path / "big"), memory_limit="2GB", workers=workers) as con:
        for name, m in [("T", 17), ("U", 13)]:
            con.execute(f"CREATE TENSOR {name} FROM (SELECT r * 7919 AS a, r * 31 AS b, "
                        f"r * {m} AS c, 1.0 + r AS v FROM range(50) t(r)) INDEX (a, b, c) "
                        f"VALUE v SHAPE ({n}, {n}, {n})")
        con.execute("X[a,b,c] = T[a,b,c] + U[a,b,c]; Y[a,b] = SUM(X[a,b,c])")
        want = {(7919 * r, 31 * r): 2 * (1.0 + r) for r in range(50)}
        assert {(a, b): v for a, b, v in con.execute("SELECT * FROM Y").fetchall()} == want


def test_the_reviewed_kernels_on_the_dask_executor(tmp_path):
    """Once on Dask: a SpGEMM holding inf, a matrix product holding NaN, a rank-3 tensor times
    a sparse matrix, and a rank-3 join re-cut for a reduction: NumPy's answers."""
    from tests.sparse.test_sparse_hyper import _tensor
    rng = np.random.default_rng(4400)
    with tensordb.connect(str(tmp_path / "db"), workers=2, executor="dask") as con:
        g = _mat(rng, (120, 90), 30, "float64", [np.inf])
        h = _mat(rng, (90, 150), 30, "float64", [np.nan])
        a = _mat(rng, (120, 90), 30, "float64", [np.nan])
        t = _tensor(rng, (30, 24, 40), 40, "float64")
        u = _tensor(rng, (30, 24, 40), 40, "float64", special=True)
        m = _tensor(rng, (40, 30), 25, "float64")
        for name, x in [("G", g), ("H", h), ("A", a), ("T", t), ("U", u), ("M", m)]:
            con.load(name, x)
        con.execute("R[i,k] = SUM(G[i,j] * H[j,k]); P[i,j] = A[i,j] * G[i,j]; "
                    "Q[a,k] = SUM(T[a,b,c] * M[c,k]); X[a,b,c] = T[a,b,c] - U[a,b,c] "
                    "WITH (PIECES c 4); Y[a,b] = SUM(X[a,b,c]) WITH (PIECES a 3)")
        with np.errstate(all="ignore"):
            want = {"R": g @ h, "P": a * g, "Q": np.einsum("abc,ck->ak", t, m),
                    "Y": (t - u).sum(axis=2)}
        for name, w in want.items():
            np.testing.assert_array_equal(con.tensor(name), w, err_msg=name)
