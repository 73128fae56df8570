"""Loading and exporting sparse tensors without densifying: COO rows from SQL, scipy.sparse,
pydata sparse; duplicates summed or refused; bad coordinates; con.sparse and COO files."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb

sparse = pytest.importorskip("sparse")


def formats(con, name):
    return sorted(r[0] for r in con.execute(
        "SELECT coalesce(format, 'dense') FROM tensordb.tiles WHERE tensor = ?", [name]).fetchall())


def edges(con, n, m, seed=0, table="e"):
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, n, m), rng.integers(0, n, m)
    v = rng.standard_normal(m).astype(np.float32)
    con.store.duck.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM (SELECT "
                           "unnest(?) AS i, unnest(?) AS j, unnest(?)::FLOAT AS v)",
                           [i.tolist(), j.tolist(), v.tolist()])
    dense = np.zeros((n, n), np.float32)
    np.add.at(dense, (i, j), v)  # duplicates summed
    return dense


def test_a_huge_sparse_graph_loads_from_sql_as_few_sparse_tiles():
    """100,000^2 float32 would be 37 GiB dense: loading it at all shows nothing densified."""
    with tensordb.connect() as con:
        rng = np.random.default_rng(1)
        i, j = rng.integers(0, 100_000, 3000), rng.integers(0, 100_000, 3000)
        con.store.duck.execute("CREATE TABLE e AS SELECT * FROM (SELECT unnest(?) AS i, "
                               "unnest(?) AS j, 1.0::FLOAT AS v)", [i.tolist(), j.tolist()])
        con.execute("CREATE TENSOR G FROM (SELECT i, j, v FROM e) INDEX (i, j) VALUE v "
                    "SHAPE (100000, 100000)")
        d = con.describe("G")
        # 3,000 entries in 100,000 rows: hypersparse, stored COO (CSR's row pointers would be
        # most of its bytes)
        assert d["tile_count"] == 1 and formats(con, "G") == ["coo"]
        want = sp.csr_array(sp.coo_array((np.ones(3000, np.float32), (i, j)), shape=(100_000,) * 2))
        got = con.sparse("G")
        assert got.shape == want.shape and got.dtype == np.float32
        assert (got != want).nnz == 0
        assert d["bytes"] <= 1.5 * (want.data.nbytes + want.indices.nbytes + want.indptr.nbytes)
        assert con.execute("SELECT count(*), sum(value) FROM G").fetchall() == \
            [(want.nnz, float(want.sum()))]


@pytest.mark.parametrize("tile", [None, (37, 50), (200, 7)])
def test_sql_coo_rows_round_trip_with_duplicates_summed(tile):
    with tensordb.connect() as con:
        dense = edges(con, 200, 600)
        con.load("G", None, query="SELECT i, j, v FROM e", index=["i", "j"], value="v",
                 shape=(200, 200), tile=tile)
        np.testing.assert_allclose(con.tensor("G"), dense, rtol=1e-6)
        # sparse tiles: CSR, or COO where a tile has over three times more rows than entries
        assert set(formats(con, "G")) <= {"csr", "coo"} and \
            ("csr" in formats(con, "G")) == (tile != (200, 7))
        assert con.check()[-1]["problem"] == "ok"
        np.testing.assert_allclose(con.sparse("G").toarray(), dense, rtol=1e-6)


def test_duplicates_error_refuses_and_stores_nothing():
    with tensordb.connect() as con:
        con.sql("CREATE TABLE e AS SELECT * FROM (VALUES (0, 1, 1.5), (2, 0, 2.0), (2, 0, 3.0)) "
                "t(i, j, v)")
        con.load("G", np.ones((2, 2)))
        with pytest.raises(tensordb.DataError, match=r"\(i=2, j=0\) appears more than once"):
            con.execute("CREATE OR REPLACE TENSOR G FROM (SELECT i, j, v FROM e) INDEX (i, j) "
                        "VALUE v SHAPE (50, 50) DUPLICATES ERROR")
        np.testing.assert_array_equal(con.tensor("G"), np.ones((2, 2)))
        con.execute("CREATE OR REPLACE TENSOR G FROM (SELECT i, j, v FROM e) INDEX (i, j) "
                    "VALUE v SHAPE (50, 50) DUPLICATES SUM")
        assert con.tensor("G")[2, 0] == 5.0 and con.tensor("G")[0, 1] == 1.5
        with pytest.raises(tensordb.ProgrammingError, match="DUPLICATES SUM or DUPLICATES ERROR"):
            con.execute("CREATE TENSOR H FROM e INDEX (i, j) VALUE v DUPLICATES keep")
        with pytest.raises(tensordb.ProgrammingError, match="duplicates must be one of"):
            con.load("H", sp.eye(3, format="csr"), duplicates="last")


@pytest.mark.parametrize("bad, match", [
    ("(7, -1, 1.0)", r"negative coordinate \(i=7, j=-1\)"),
    ("(50, 3, 1.0)", r"coordinate \(i=50, j=3\) is outside shape \(50, 50\)"),
])
def test_bad_coordinates_are_data_errors_naming_them_and_change_nothing(bad, match):
    with tensordb.connect() as con:
        con.sql(f"CREATE TABLE e AS SELECT * FROM (VALUES (0, 1, 1.5), {bad}) t(i, j, v)")
        con.load("G", np.eye(3))
        with pytest.raises(tensordb.DataError, match=match):
            con.execute("CREATE OR REPLACE TENSOR G FROM (SELECT i, j, v FROM e) INDEX (i, j) "
                        "VALUE v SHAPE (50, 50)")
        np.testing.assert_array_equal(con.tensor("G"), np.eye(3))
        m = sp.coo_array((np.array([1.0, 2.0]), (np.array([0, 3]), np.array([1, 2]))),
                         shape=(4, 4))
        m.row[1] = -3  # scipy lets a coordinate go negative after construction
        with pytest.raises(tensordb.DataError, match=r"negative coordinate \(i=-3, j=2\) \(entry 1\)"):
            con.load("G", m, replace=True)
        np.testing.assert_array_equal(con.tensor("G"), np.eye(3))


@pytest.mark.parametrize("kind", ["csr_matrix", "csr_array", "coo_matrix", "csc_array", "dok"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_scipy_sparse_loads_and_exports(kind, dtype):
    m = sp.random(120, 90, density=0.03, random_state=3, format="coo")
    m.data = (m.data * 10 + 1).astype(dtype)
    want = m.toarray()
    obj = {"csr_matrix": sp.csr_matrix, "csr_array": sp.csr_array, "coo_matrix": sp.coo_matrix,
           "csc_array": sp.csc_array, "dok": sp.dok_matrix}[kind](m)
    with tensordb.connect() as con:
        con.load("M", obj, dims=["r", "c"])
        got = con.tensor("M")
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)
        assert formats(con, "M") == ["csr"]
        back = con.sparse("M")
        assert isinstance(back, sp.csr_array) and back.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(back.toarray(), want)
        assert con.execute("SELECT count(*) FROM M").fetchall()[0][0] == np.count_nonzero(want)


def test_scipy_duplicates_are_summed_or_refused():
    m = sp.coo_array((np.array([1.0, 2.0, 4.0]), (np.array([0, 0, 1]), np.array([1, 1, 0]))),
                     shape=(30, 30))
    with tensordb.connect() as con:
        con.load("M", m)
        np.testing.assert_array_equal(con.tensor("M"), m.toarray())  # scipy sums them too
        with pytest.raises(tensordb.DataError, match=r"\(i=0, j=1\) appears more than once"):
            con.load("N", m, duplicates="error")
        assert not con.store.has("N")


def test_pydata_sparse_arrays_round_trip():
    s = sparse.random((12, 30, 40), density=0.01, random_state=2)
    v = sparse.random((500,), density=0.02, random_state=3)
    with tensordb.connect() as con:
        con.load("S", s)
        con.load("V", v)
        np.testing.assert_array_equal(con.tensor("S"), s.todense())
        np.testing.assert_array_equal(con.tensor("V"), v.todense())
        assert formats(con, "S") == ["coo"]
        back = con.sparse("S")
        assert isinstance(back, sparse.COO) and back.shape == s.shape
        np.testing.assert_array_equal(back.todense(), s.todense())
        # a fill value other than 0 is the tensor's own (docs/storage.md, "Fill values")
        f = sparse.COO(s.coords, s.data, shape=s.shape, fill_value=np.inf)
        con.load("F", f)
        assert con.store.meta("F").fill == np.inf
        np.testing.assert_array_equal(con.tensor("F"), f.todense())
        assert con.sparse("F").fill_value == np.inf


def test_coo_files_round_trip(tmp_path):
    m = sp.random(300, 200, density=0.005, random_state=4, format="csr", dtype=np.float32)
    with tensordb.connect() as con:
        con.load("M", m)
        for suffix in ("parquet", "csv"):
            path = str(tmp_path / f"m.{suffix}")
            con.export("M", path)
            con.load(f"M_{suffix}", path)
            assert formats(con, f"M_{suffix}") == ["csr"]
            np.testing.assert_array_equal(con.tensor(f"M_{suffix}"), m.toarray())


@pytest.mark.parametrize("kind", ["pandas", "polars", "arrow"])
def test_coo_rows_from_a_dataframe_or_arrow_table(kind):
    pd = pytest.importorskip("pandas")
    import pyarrow as pa
    rng = np.random.default_rng(5)
    src, dst = rng.integers(0, 400, 900), rng.integers(0, 300, 900)
    w = rng.standard_normal(900)
    df = pd.DataFrame({"src": src, "dst": dst, "w": w})
    frame = {"pandas": lambda: df, "arrow": lambda: pa.Table.from_pandas(df),
             "polars": lambda: pytest.importorskip("polars").from_pandas(df)}[kind]()
    want = np.zeros((400, 300))
    np.add.at(want, (src, dst), w)
    with tensordb.connect() as con:
        con.load("G", frame, index=["src", "dst"], value="w", shape=(400, 300))
        np.testing.assert_allclose(con.tensor("G"), want, rtol=1e-12)
        assert con.describe("G")["dims"] == ("src", "dst") and formats(con, "G") == ["csr"]
        with pytest.raises(tensordb.DataError, match="appears more than once"):
            con.load("H", frame, index=["src", "dst"], value="w", duplicates="error")
        bad = pd.DataFrame({"i": [0, 3, -2], "v": [1.0, 2.0, 3.0]})
        with pytest.raises(tensordb.DataError, match=r"negative coordinate \(i=-2\)"):
            con.load("H", bad, index=["i"], value="v")
        assert not con.store.has("H")
        # the registered table is gone again
        assert con.store.duck.execute("SELECT count(*) FROM duckdb_views() WHERE view_name LIKE "
                                      "'__tensordb_frame%'").fetchall()[0][0] == 0


def test_uint64_entries_are_refused_as_a_dense_load_refuses_them():
    """uint64 values past int64's range would wrap: refused, like a dense uint64 array, and
    nothing is stored."""
    big = sp.coo_array((np.array([2**63 + 5, 7], np.uint64), (np.array([0, 1]), np.array([1, 0]))),
                       shape=(2, 2))
    with tensordb.connect() as con:
        with pytest.raises(tensordb.DataError, match="uint64"):
            con.load("U", big)
        with pytest.raises(tensordb.DataError, match="uint64"):
            con.load("V", big.toarray())
        assert not con.store.has("U")
        con.load("W", big.astype(np.uint32))  # narrower unsigned entries fit int64
        np.testing.assert_array_equal(con.tensor("W"), big.astype(np.uint32).toarray())
