"""Fill values, semiring products, masked SpGEMM and SDDMM on sparse tiles: each checked against
numpy on the densified inputs, and the graph algorithms against scipy.sparse.csgraph and
networkx (test-only oracles), on real on-disk catalogs."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

import tensordb

INF = np.inf


def _graph(n, density, seed, weights=True):
    a = sp.random(n, n, density=density, random_state=seed, format="csr")
    if weights:
        a.data = np.round(a.data * 9) + 1  # integral weights 1..10: sums are exact
    else:
        a.data[:] = 1.0
    return a


def _dense(a, fill):
    d = a.toarray()
    out = np.full(d.shape, fill)
    coo = a.tocoo()
    out[coo.row, coo.col] = coo.data
    return out


def _explain_json(con, sql):
    import json
    out = con.explain(sql, format="json")
    return out if isinstance(out, dict) else json.loads(out)


# -- fill values ---------------------------------------------------------------------------------

def test_fill_declared_in_sql_is_recorded_read_back_and_survives_reopen(tmp_path):
    db = tmp_path / "db"
    with tensordb.connect(db) as con:
        con.execute("CREATE TENSOR D FROM (SELECT * FROM (VALUES (0, 1, 2.0), (1, 2, 3.0), "
                    "(2, 0, 0.0)) t(i, j, w)) INDEX (i, j) VALUE w SHAPE (3, 4) FILL +inf")
        ref = np.full((3, 4), INF)
        ref[0, 1], ref[1, 2], ref[2, 0] = 2.0, 3.0, 0.0   # a stored 0 is an entry, not the fill
        np.testing.assert_array_equal(con.tensor("D"), ref)
    with tensordb.connect(db) as con:
        meta = con.store.meta("D")
        assert meta.fill == INF and meta.nnz == 3
        assert [t["fill"] for t in con.tensors()] == [INF]
        np.testing.assert_array_equal(con.tensor("D"), ref)
        # the relation view yields the stored entries (the 0 included), never the fill
        rows = sorted(con.sql("SELECT i, j, value FROM D").fetchall())
        assert rows == [(0, 1, 2.0), (1, 2, 3.0), (2, 0, 0.0)]
        # con.sparse: a pydata array that carries the fill
        s = con.sparse("D")
        assert s.fill_value == INF
        np.testing.assert_array_equal(s.todense(), ref)
        assert [r[-1] for r in con.execute("CHECK TENSOR D").fetchall()] == ["ok"]  # nnz: not fill


def test_fill_from_python_and_pydata_and_tiles_without_entries(tmp_path):
    sparse = pytest.importorskip("sparse")
    a = _graph(40, 0.05, 1)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("D", a, fill_value=INF, tile=(16, 16))   # some tiles hold no entry
        assert [r[-1] for r in con.execute("CHECK TENSOR D").fetchall()] == ["ok"]
        np.testing.assert_array_equal(con.tensor("D"), _dense(a, INF))
        # every tile is stored (an absent tile is zeros): the empty ones as empty sparse tiles
        meta = con.store.meta("D")
        assert meta.tile_count == meta.total_tiles == 9
        x = sparse.COO.from_numpy(_dense(a, -1.5), fill_value=-1.5)
        con.load("E", x)
        assert con.store.meta("E").fill == -1.5
        np.testing.assert_array_equal(con.tensor("E"), _dense(a, -1.5))
        with pytest.raises(tensordb.ProgrammingError, match="fill_value=2.0, but the sparse"):
            con.load("F", x, fill_value=2.0)
        with pytest.raises(tensordb.ProgrammingError, match="does not fit its dtype int64"):
            con.load("G", sp.csr_array(np.eye(3, dtype=np.int64)), fill_value=INF)
        with pytest.raises(tensordb.ProgrammingError, match="fill_value= applies to COO"):
            con.load("H", np.eye(3), fill_value=INF)
        assert not any(con.store.has(n) for n in "FGH")


def test_fill_syntax_errors_name_the_word():
    with tensordb.connect() as con:
        with pytest.raises(tensordb.ProgrammingError, match="FILL nan: expected a number") as e:
            con.execute("CREATE TENSOR D FROM (SELECT 1 AS i, 2.0 AS v) INDEX (i) FILL nan")
        assert "^" in str(e.value)
        assert not con.store.has("D")


def test_min_plus_keeps_the_fill_and_runs_on_graphblas(tmp_path):
    a = _graph(50, 0.06, 3)
    ref = _dense(a, INF)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("D", a, fill_value=INF, tile=(16, 50))
        sql = "P[i,k] = MIN(D[i,j] + D[j,k])"
        node = _explain_json(con, sql)["nodes"][0]
        assert node["kernel"]["method"] == "semiring"
        assert node["kernel"]["semiring"] == "min_plus"
        assert "semiring min_plus" in con.explain(sql)
        con.execute(sql)
        expect = (ref[:, :, None] + ref[None, :, :]).min(axis=1)
        np.testing.assert_array_equal(con.tensor("P"), expect)
        meta = con.store.meta("P")
        assert meta.fill == INF                              # kept: the output stays sparse
        assert meta.nnz == np.count_nonzero(expect != INF)
        assert meta.nbytes < expect.nbytes / 2


def test_single_source_shortest_paths_by_repeated_min_plus_equal_csgraph(tmp_path):
    n = 60
    a = _graph(n, 0.04, 5).tolil()
    a.setdiag(0)   # no self loops of their own: the loops below are the 0-weight ones
    a = sp.csr_array(a.tocsr())
    a.eliminate_zeros()
    coo = a.tocoo()
    # a 0-weight self loop at every node: a step keeps the distances it had (Bellman-Ford)
    loops = sp.coo_array((np.r_[coo.data, np.zeros(n)],
                          (np.r_[coo.row, np.arange(n)], np.r_[coo.col, np.arange(n)])), shape=(n, n))
    d0 = np.full(n, INF)
    d0[0] = 0.0
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("D", loops, fill_value=INF, tile=(16, n))
        con.load("dist", d0)
        step = "CREATE OR REPLACE TENSOR dist[k] AS MIN(dist[j] + D[j,k])"
        assert "semiring min_plus" in con.explain(step)
        for _ in range(n - 1):
            con.execute(step)
        expect = shortest_path(a, method="BF", directed=True, indices=0)
        np.testing.assert_array_equal(con.tensor("dist"), expect)


def test_max_times_with_fill_zero_counts_the_absent_products(tmp_path):
    """MAX over a row whose pairs are partly absent takes their 0 into account (numpy's answer
    on the dense arrays): negative products lose to it, an all-absent row is 0."""
    rng = np.random.default_rng(7)
    a = sp.random(30, 20, density=0.2, random_state=8, format="csr")
    a.data = rng.standard_normal(a.nnz)
    b = sp.random(20, 25, density=0.2, random_state=9, format="csr")
    b.data = rng.standard_normal(b.nnz)
    x = rng.standard_normal((20, 3))
    ad, bd = a.toarray(), b.toarray()
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.load("B", b)
        con.load("X", x)
        for sql, ref in [
                ("M[i,k] = MAX(A[i,j] * B[j,k])", (ad[:, :, None] * bd[None]).max(axis=1)),
                ("N[i,k] = MIN(A[i,j] * B[j,k])", (ad[:, :, None] * bd[None]).min(axis=1)),
                ("Q[i,r] = MAX(A[i,j] * X[j,r])", (ad[:, :, None] * x[None]).max(axis=1))]:
            assert "semiring m" in con.explain(sql)
            con.execute(sql)
            np.testing.assert_array_equal(con.tensor(sql.split("[")[0]), ref)


def test_a_tile_with_nan_or_a_meeting_infinity_falls_back_to_numpy(tmp_path):
    a = _graph(20, 0.2, 11)
    x = np.random.default_rng(1).standard_normal((20, 2))
    x[3, 0] = np.nan
    x[5, 1] = -INF           # -inf + an absent +inf is NaN in numpy: GraphBLAS would skip it
    with tensordb.connect(tmp_path / "db") as con:
        con.load("D", a, fill_value=INF)
        con.load("X", x)
        sql = "P[i,r] = MIN(D[i,j] + X[j,r])"
        assert "semiring min_plus" in con.explain(sql)
        con.execute(sql)
        ref = _dense(a, INF)
        with np.errstate(invalid="ignore"):
            expect = (ref[:, :, None] + x[None]).min(axis=1)
        np.testing.assert_array_equal(con.tensor("P"), expect)


def test_an_operation_that_keeps_no_fill_is_refused_and_changes_nothing(tmp_path, snapshot):
    a = _graph(10, 0.3, 2)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("D", a, fill_value=INF)
        con.load("X", np.ones((10, 2)))
        before = snapshot(con)
        with pytest.raises(tensordb.ProgrammingError) as e:
            con.execute("C[i,k] = SUM(D[i,j] * X[j,k]) - 1")
        msg = str(e.value)
        assert "D has fill value inf" in msg and "NaN" in msg
        assert "LINE 1: C[i,k] = SUM(D[i,j] * X[j,k]) - 1" in msg   # the statement
        assert snapshot(con) == before


def test_elementwise_and_reductions_over_a_fill_are_numpys(tmp_path):
    a = _graph(12, 0.3, 4)
    ref = _dense(a, INF)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("D", a, fill_value=INF, tile=(5, 5))
        con.execute("R[i] = MIN(D[i,j])")
        np.testing.assert_array_equal(con.tensor("R"), ref.min(axis=1))
        con.execute("H[i,j] = D[i,j] * 2 + 1")
        np.testing.assert_array_equal(con.tensor("H"), ref * 2 + 1)
        assert con.store.meta("H").fill == INF
        con.execute("E[i,j] = EXP(-D[i,j])")       # exp(-inf) = 0: the output's fill is 0
        np.testing.assert_array_equal(con.tensor("E"), np.exp(-ref))
        assert con.store.meta("E").fill == 0


# -- masked SpGEMM (triangles) and SDDMM ---------------------------------------------------------

def test_triangle_count_is_one_masked_spgemm_and_equals_networkx(tmp_path):
    nx = pytest.importorskip("networkx")
    a = _graph(80, 0.08, 6, weights=False)
    a = ((a + a.T) > 0).astype(np.float64).tolil()
    a.setdiag(0)
    a = sp.csr_array(a.tocsr())
    a.eliminate_zeros()
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("A", a, tile=(32, 80))
        sql = "t = SUM(A[i,j] * A[j,k] * A[k,i])"
        nodes = _explain_json(con, sql)["nodes"]
        assert len(nodes) == 1 and nodes[0]["kernel"]["method"] == "masked"
        con.execute(sql)
        triangles = sum(nx.triangles(nx.from_scipy_sparse_array(a)).values()) // 3
        assert con.tensor("t") == 6 * triangles
        d = a.toarray()
        assert con.tensor("t") == np.einsum("ij,jk,ki->", d, d, d)


def test_spgemm_of_two_sparse_matrices_equals_numpy(tmp_path):
    a = _graph(40, 0.05, 12)
    b = _graph(40, 0.05, 13)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.load("B", b)
        sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
        assert "spmm" in con.explain(sql)
        con.execute(sql)
        np.testing.assert_array_equal(con.tensor("C"), a.toarray() @ b.toarray())


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_sddmm_computes_only_at_the_mask(tmp_path, dtype):
    rng = np.random.default_rng(3)
    m = _graph(30, 0.1, 14).astype(dtype)
    u = rng.integers(-3, 4, (30, 5)).astype(dtype)
    v = rng.integers(-3, 4, (25, 5)).astype(dtype)
    m = sp.csr_array(m.toarray()[:, :25])
    with tensordb.connect(tmp_path / "db") as con:
        con.load("M", m)
        con.load("U", u)
        con.load("V", v)
        for sql, ref in [("S[i,j] = M[i,j] * SUM(U[i,r] * V[j,r])", m.toarray() * (u @ v.T)),
                         ("T[j,i] = M[i,j] * SUM(V[j,r] * U[i,r])", (m.toarray() * (u @ v.T)).T)]:
            nodes = _explain_json(con, sql)["nodes"]
            assert [n["kernel"]["method"] for n in nodes] == ["sddmm"]
            con.execute(sql)
            got = con.tensor(sql.split("[")[0])
            assert got.dtype == ref.dtype
            np.testing.assert_array_equal(got, ref)


def test_explain_shows_fills_kept_and_where_an_operation_densifies(tmp_path):
    a = _graph(30, 0.1, 21)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("D", a, fill_value=INF)
        con.load("X", a)
        text = con.explain("P[i,k] = MIN(D[i,j] + D[j,k])")
        assert "fill values: D +inf, P +inf (kept)" in text
        node = _explain_json(con, "P[i,k] = MIN(D[i,j] + D[j,k])")["nodes"][0]
        assert node["fill"] == INF and node["inputs"][0]["fill"] == INF
        # priced by nnz, as SpGEMM: each entry D[i,j] meets row j's entries (the catalog's
        # row profile), counted row by row
        assert node["flops"] == 2 * int(np.diff(a.indptr) @ np.bincount(a.indices, minlength=30))
        text = con.explain("E[i,j] = EXP(X[i,j])")
        assert "densifies: E (its value where the input is absent is 1)" in text
        assert "densifies" not in con.explain("F[i,j] = X[i,j] * 3")   # 0 * 3 is 0
        con.execute("E[i,j] = EXP(X[i,j])")
        np.testing.assert_array_equal(con.tensor("E"), np.exp(a.toarray()))


def test_on_a_gpu_the_sparse_kernels_compute_as_the_dense_ones():
    """A GPU (here tests/fakecupy's stand-in) gets every sparse tile densified: a semiring, a
    masked product, an elementwise join and a MAX reduction are numpy's answers there too."""
    from tensordb.exec.gpu import DeviceTiles
    from tensordb.exec.pool import LocalExecutor
    from tests.fakecupy.cupy import DeviceXp
    a = _graph(24, 0.15, 31)
    b = _graph(24, 0.15, 32)
    with tensordb.connect() as con:
        con.load("D", a, fill_value=INF)
        con.load("A", a)
        con.load("B", b)
        con._executor = LocalExecutor(1, tiles=DeviceTiles([0], xp=DeviceXp()))
        d, ad, bd = _dense(a, INF), a.toarray(), b.toarray()
        for sql, ref in [("P[i,k] = MIN(D[i,j] + D[j,k])", (d[:, :, None] + d[None]).min(1)),
                         ("t = SUM(A[i,j] * A[j,k] * A[k,i])", np.einsum("ij,jk,ki->", ad, ad, ad)),
                         ("S[i,j] = A[i,j] + B[i,j]", ad + bd),
                         ("M[i] = MAX(A[i,j])", ad.max(axis=1)),
                         ("Q[i,k] = MAX(A[i,j] * B[j,k])", (ad[:, :, None] * bd[None]).max(1))]:
            con.execute(sql)
            np.testing.assert_array_equal(con.tensor(sql.split("[")[0].split(" ")[0]), ref)


def test_elementwise_joins_of_two_sparse_matrices_intersect_and_unite(tmp_path):
    """A product keeps the intersection of the entries, a sum or difference their union
    (scipy.sparse); a NaN or inf in a tile sends its product to numpy (inf * an absent 0)."""
    a = sp.random(40, 30, density=0.1, format="csr", random_state=41)
    b = sp.random(40, 30, density=0.1, format="csr", random_state=42)
    b.data[0], b.data[1] = np.inf, np.nan
    ad, bd = a.toarray(), b.toarray()
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.load("B", b)
        con.load("BT", sp.csr_array(b.T))
        with np.errstate(invalid="ignore"):   # inf * 0 is NaN, as numpy says
            cases = [("C[i,j] = A[i,j] * B[i,j]", ad * bd), ("D[i,j] = A[i,j] + B[i,j]", ad + bd),
                     ("E[j,i] = BT[j,i] - A[i,j]", (bd - ad).T),
                     ("F[i,j] = A[i,j] * BT[j,i]", ad * bd)]
        for sql, ref in cases:
            assert "spjoin x0 x1 sparse" in con.explain(sql), sql
            con.execute(sql)
            np.testing.assert_array_equal(con.tensor(sql.split("[")[0]), ref)
        assert con.store.meta("C").nnz == np.count_nonzero(cases[0][1])


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_fill_survives_export_and_load_again(tmp_path, fmt):
    a = _graph(20, 0.1, 51)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("D", a, fill_value=-INF)
        path = str(tmp_path / f"D.{fmt}")
        con.export("D", path)
        con.load("E", path)                     # the file records the fill with the shape
        assert con.store.meta("E").fill == -INF
        np.testing.assert_array_equal(con.tensor("E"), _dense(a, -INF))
        np.save(tmp_path / "D.npy", con.tensor("D"))
        con.export("D", str(tmp_path / "X.npy"))  # a dense export holds the fill's elements
        np.testing.assert_array_equal(np.load(tmp_path / "X.npy"), _dense(a, -INF))


def test_reductions_of_rows_with_no_stored_entry_are_numpys(tmp_path):
    """SUM, MAX, MIN and PROD over rows and columns of a sparse matrix whose some rows hold no
    entry (and a negative-only row): numpy's answers on the dense array, for fill 0 and +inf."""
    d = np.zeros((12, 9))
    d[0, :3] = [-2.0, -5.0, -1.0]      # all stored entries negative: MAX is 0 (an absent 0)
    d[4, 1], d[7, 8] = 3.0, 4.0        # rows 1-3, 5, 6, 8-11: no entry at all
    a = sp.csr_array(d)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.load("D", a, fill_value=INF)
        dense_inf = _dense(a, INF)
        for agg in ("SUM", "MAX", "MIN", "PROD"):
            fn = {"SUM": np.sum, "MAX": np.max, "MIN": np.min, "PROD": np.prod}[agg]
            for out, axis in (("i", 1), ("j", 0)):
                for name, ref in (("A", d), ("D", dense_inf)):
                    sql = f"R[{out}] = {agg}({name}[i,j])"
                    con.execute(sql)
                    np.testing.assert_array_equal(con.tensor("R"), fn(ref, axis=axis), sql)


def test_graphblas_threads_held_by_overlapping_runs_end_in_any_order():
    """Two runs on two connections overlap and end in the order they did not start: the calls
    use the fewest threads any running run holds, and once both ended GraphBLAS's own setting
    again (a global set and restored by each run left the first run's count behind)."""
    from tensordb.exec import semiring
    assert semiring._opts() == {}
    first, second = semiring.threads(1), semiring.threads(2)
    first.__enter__()
    second.__enter__()
    assert semiring._opts() == {"nthreads": 1}
    first.__exit__(None, None, None)
    assert semiring._opts() == {"nthreads": 2}
    second.__exit__(None, None, None)
    assert semiring._opts() == {}
    with semiring.threads(0):
        assert semiring._opts() == {}
