"""Loading: every dtype from every source round-trips through con.tensor()."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tensordb
from tests.files import payload_files

DTYPES = ["float32", "float64", "int32", "int64"]
SHAPE = (37, 23)
TILE = (16, 8)


def sample(dtype, shape=SHAPE, seed=0):
    """Block-sparse-ish data: some zero tiles, some zeros inside tiles."""
    rng = np.random.default_rng(seed)
    a = (rng.random(shape) * 100 - 50).astype(dtype)
    a[rng.random(shape) < 0.3] = 0
    a[16:32, 8:16] = 0  # exactly one tile of TILE is empty
    return a


def coo_table(a, dims=("i", "j")):
    nz = np.nonzero(a)
    cols = {d: pa.array(ix.astype(np.int64)) for d, ix in zip(dims, nz)}
    cols["value"] = pa.array(a[nz])
    return pa.table(cols)


def dense_table(a):
    return pa.table({f"c{k}": pa.array(a[:, k]) for k in range(a.shape[1])})


def check(con, name, expected, dtype=None):
    got = con.tensor(name)
    assert got.shape == expected.shape
    assert got.dtype == np.dtype(dtype or expected.dtype)
    np.testing.assert_array_equal(got, expected.astype(got.dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_npy_npz(con, tmp_path, dtype):
    a = sample(dtype)
    con.load("A", a, tile=TILE)
    check(con, "A", a)
    np.save(tmp_path / "a.npy", a)
    con.load("B", str(tmp_path / "a.npy"), tile=TILE)
    check(con, "B", a)
    np.savez(tmp_path / "one.npz", x=a)
    con.load("C", tmp_path / "one.npz")
    check(con, "C", a)
    b = sample(dtype, (5, 7), seed=1)
    np.savez_compressed(tmp_path / "two.npz", x=a, y=b)
    con.load("D", tmp_path / "two.npz", array="y")
    check(con, "D", b)
    con.load("E", tmp_path / "two.npz")  # one tensor per array: E_x, E_y
    check(con, "E_x", a)
    check(con, "E_y", b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_parquet_coo_and_dense(con, tmp_path, dtype):
    a = sample(dtype)
    pq.write_table(coo_table(a), tmp_path / "coo.parquet")
    con.load("A", tmp_path / "coo.parquet", index=["i", "j"], value="value", shape=SHAPE, tile=TILE)
    check(con, "A", a)
    assert con.describe("A")["dims"] == ("i", "j")  # dims default to the index columns
    pq.write_table(dense_table(a), tmp_path / "dense.parquet")
    con.load("B", tmp_path / "dense.parquet")
    check(con, "B", a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_csv_coo_and_dense(con, tmp_path, dtype):
    # CSV has no types: DuckDB infers BIGINT or DOUBLE, and the tensor keeps what it infers.
    a = sample(dtype)
    nz = np.nonzero(a)
    fmt = "%d" if a.dtype.kind == "i" else "%.17g"
    rows = np.column_stack([nz[0], nz[1], a[nz].astype(np.float64)])
    np.savetxt(tmp_path / "coo.csv", rows, delimiter=",", header="i,j,value", comments="",
               fmt=["%d", "%d", fmt])
    want = "int64" if a.dtype.kind == "i" else "float64"
    con.load("A", tmp_path / "coo.csv", index=["i", "j"], shape=SHAPE)
    check(con, "A", a, want)
    np.savetxt(tmp_path / "dense.csv", a.astype(np.float64), delimiter=",", fmt=fmt,
               header=",".join(f"c{k}" for k in range(a.shape[1])), comments="")
    con.load("B", tmp_path / "dense.csv")
    check(con, "B", a, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_query_coo_and_dense(con, dtype):
    a = sample(dtype)
    sqltype = {"float32": "FLOAT", "float64": "DOUBLE", "int32": "INTEGER", "int64": "BIGINT"}[dtype]
    con.sql(f"CREATE TABLE t (i BIGINT, j INTEGER, v {sqltype})")
    nz = np.nonzero(a)
    con.store.duck.executemany("INSERT INTO t VALUES (?, ?, ?)",
                               [(int(i), int(j), a[i, j].item()) for i, j in zip(*nz)])
    con.load("A", None, query="SELECT i, j, v AS value FROM t", index=["i", "j"], shape=SHAPE)
    check(con, "A", a)
    con.load("A2", "SELECT i, j, v FROM t", format="sql", index=["i", "j"], value="v", shape=SHAPE)
    check(con, "A2", a)
    con.sql(f"CREATE TABLE d AS SELECT * FROM (VALUES (1::{sqltype}, 0::{sqltype}), "
            f"(0::{sqltype}, 3::{sqltype})) v(x, y)")
    con.load("B", None, query="SELECT x, y FROM d")
    check(con, "B", np.array([[1, 0], [0, 3]], dtype))


def test_dense_table_mixed_types_use_result_type(con):
    con.sql("CREATE TABLE mixed AS SELECT 1::INTEGER AS a, 2.5::FLOAT AS b, 3::BIGINT AS c")
    con.load("M", None, query="SELECT * FROM mixed")
    assert con.tensor("M").dtype == np.result_type(np.int32, np.float32, np.int64)
    np.testing.assert_array_equal(con.tensor("M"), [[1, 2.5, 3]])


def test_query_over_tensor(con):
    a = sample("float64")
    con.load("A", a, dims=["i", "j"])
    con.load("B", None, query="SELECT i, j, value * 2 AS value FROM A", index=["i", "j"],
             shape=SHAPE)
    np.testing.assert_array_equal(con.tensor("B"), 2 * a)


@pytest.mark.parametrize("layout", ["fortran", "strided", "transposed", "negative"])
def test_layouts(con, tmp_path, layout):
    base = sample("float32", (40, 30))
    a = {"fortran": np.asfortranarray(base), "strided": base[::2, 1::3],
         "transposed": base.T, "negative": base[::-1, ::-2]}[layout]
    con.load("A", a, tile=(8, 8))
    check(con, "A", a)
    np.save(tmp_path / "a.npy", a)  # Fortran stays Fortran in the .npy header
    con.load("B", tmp_path / "a.npy", tile=(8, 8))
    check(con, "B", a)


def test_block_sparse_tiles_not_stored(con):
    a = np.zeros((64, 64), "float32")
    a[:16, :16] = 1
    a[48:, 32:48] = np.arange(256).reshape(16, 16)  # one zero inside: still one tile
    con.load("S", a, tile=(16, 16))
    rows = con.store.duck.execute(
        "SELECT coords, nnz FROM tensordb.tiles WHERE tensor = 'S' ORDER BY coords").fetchall()
    assert rows == [([0, 0], 256), ([3, 2], 255)]
    info = con.describe("S")
    assert (info["tile_count"], info["total_tiles"], info["nnz"]) == (2, 16, 511)
    assert info["bytes"] == 2 * 16 * 16 * 4
    check(con, "S", a)


def test_all_zero_from_every_source_stores_no_tiles(con, tmp_path):
    z = np.zeros((10, 10), "int64")
    con.load("Z", z)
    pq.write_table(pa.table({"i": [1, 2], "j": [3, 4], "value": [0.0, 0.0]}), tmp_path / "z.parquet")
    con.load("Y", tmp_path / "z.parquet", index=["i", "j"])
    assert [t["tile_count"] for t in con.tensors()] == [0, 0]
    np.testing.assert_array_equal(con.tensor("Y"), np.zeros((3, 5)))


def test_explicit_and_default_tiles(con):
    a = sample("float64", (100, 50))
    con.load("A", a, tile=(32, 50))
    m = con.store.meta("A")
    assert m.tile_shape == (32, 50) and m.grid[0] == (0, 32, 64, 96, 100)
    big = np.ones((5000, 1000), "float32")  # 20 MB: more than one default tile
    con.load("B", big)
    assert con.store.meta("B").tile_shape == tensordb.geometry.default_tile_shape(big.shape,
                                                                                       "float32")
    assert con.describe("B")["total_tiles"] > 1
    con.load("C", a, tile=(1000, 1000))  # larger than the tensor: one tile
    assert con.store.meta("C").tile_shape == (100, 50)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 4, 5)])
def test_scalars_and_empty(con, shape):
    a = np.full(shape, 7.5, "float64")
    con.load("X", a)
    got = con.tensor("X")
    assert got.shape == shape and got.dtype == np.float64
    np.testing.assert_array_equal(got, a)
    rows = con.store.duck.execute("SELECT coords FROM tensordb.tiles").fetchall()
    assert rows == ([([],)] if shape == () else [])


def test_nd_arrays_and_lists(con):
    a = sample("int32", (6, 5, 4, 3))
    con.load("A", a, tile=(4, 2, 4, 2))
    check(con, "A", a)
    con.load("L", [[1, 2], [3, 4]])
    check(con, "L", np.array([[1, 2], [3, 4]]))


def test_big_endian_is_stored_native(con):
    a = sample("float64").astype(">f8")
    con.load("A", a)
    got = con.tensor("A")
    assert got.dtype == np.dtype("float64") and got.dtype.isnative
    np.testing.assert_array_equal(got, a)


def test_coo_shape_inferred_and_names_case_insensitive(con, tmp_path):
    pq.write_table(pa.table({"User": pa.array([0, 4], pa.int32()), "Item": pa.array([2, 1], pa.int32()),
                             "rating": pa.array([5.0, 3.0], pa.float32())}), tmp_path / "r.parquet")
    con.load("R", tmp_path / "r.parquet", index=["user", "item"], value="RATING")
    got = con.tensor("r")
    assert got.shape == (5, 3) and got.dtype == np.float32
    assert got[0, 2] == 5 and got[4, 1] == 3 and got.sum() == 8
    assert con.describe("R")["dims"] == ("User", "Item")


def test_coo_large_streams_many_tiles(con):
    # Several Arrow batches and many tiles: the scatter must follow tile changes across batches.
    n = 1 << 21
    con.sql(f"CREATE TABLE big AS SELECT range // 1024 AS i, range % 1024 AS j, "
            f"(range % 7)::DOUBLE AS value FROM range({n})")
    con.load("B", None, query="SELECT * FROM big", index=["i", "j"], tile=(128, 256))
    got = con.tensor("B")
    np.testing.assert_array_equal(got.reshape(-1), (np.arange(n) % 7).astype(np.float64))
    assert con.describe("B")["tile_count"] == (2048 // 128) * (1024 // 256)


def test_coo_duplicates_across_batches_and_memory_setting_restored(con):
    n = 1 << 21  # every coordinate of a 2048 x 1024 tensor once, then (7, 9) again at the end
    con.sql(f"CREATE TABLE dups AS SELECT range // 1024 AS i, range % 1024 AS j, 1.0 AS value "
            f"FROM range({n}) UNION ALL SELECT 7, 9, 2.0")
    before = con.sql("SELECT current_setting('memory_limit')").fetchall()
    with pytest.raises(tensordb.DataError, match=r"\(i=7, j=9\) appears more than once"):
        con.load("D", None, query="SELECT * FROM dups", index=["i", "j"], tile=(4096, 4096),
                 duplicates="error")
    assert con.sql("SELECT current_setting('memory_limit')").fetchall() == before
    assert con.tensors() == []
    # by default duplicates are summed, as scipy sums them
    con.load("D", None, query="SELECT * FROM dups", index=["i", "j"], tile=(4096, 4096))
    want = np.ones((2048, 1024))
    want[7, 9] += 2.0
    np.testing.assert_array_equal(con.tensor("D"), want)


def test_replace_and_drop(con):
    con.load("A", np.ones((3, 3)))
    con.load("A", np.full((2, 2), 2, "int32"), replace=True)
    check(con, "A", np.full((2, 2), 2, "int32"))
    assert [t["name"] for t in con.tensors()] == ["A"]
    assert len(payload_files(con.store)) == 1  # the replaced version's payload is gone (or a spare)
    con.drop("a")
    assert con.tensors() == []
    assert list(__import__("os").scandir(con.store.tiles_dir)) == []
    con.drop("A", if_exists=True)


def test_persistence_across_reopen(db_path):
    a = sample("int64")
    with tensordb.connect(db_path) as c:
        c.load("A", a, dims=["row", "col"], tile=TILE)
        c.sql("CREATE TABLE notes AS SELECT 'hello' AS s")
    with tensordb.connect(db_path) as c:
        check(c, "A", a)
        assert c.describe("A")["dims"] == ("row", "col")
        assert c.sql("SELECT s FROM notes").fetchall() == [("hello",)]
    with tensordb.connect(db_path, read_only=True) as c:
        check(c, "A", a)
        with pytest.raises(tensordb.OperationalError, match="read-only"):
            c.load("B", a)
