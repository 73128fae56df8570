"""Every bad input gives a clear tensordb error and changes nothing (catalog rows and files)."""
from __future__ import annotations

import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tensordb


@pytest.fixture
def db(disk_con, tmp_path):
    """An on-disk database that already holds tensor A (so "changes nothing" is visible)."""
    disk_con.load("A", np.arange(12, dtype="float32").reshape(3, 4), dims=["i", "j"])
    return disk_con


def fails(db, snapshot, exc, match, *args, **kwargs):
    before = snapshot(db)
    with pytest.raises(exc, match=match) as info:
        db.load(*args, **kwargs)
    assert snapshot(db) == before
    np.testing.assert_array_equal(db.tensor("A"), np.arange(12, dtype="float32").reshape(3, 4))
    return info.value


def test_missing_file(db, snapshot, tmp_path):
    for suffix in ("npy", "npz", "parquet", "csv"):
        path = tmp_path / f"nope.{suffix}"
        fails(db, snapshot, tensordb.OperationalError, f"file not found: .*nope.{suffix}", "B", path)


def test_unreadable_npy(db, snapshot, tmp_path):
    (tmp_path / "junk.npy").write_bytes(b"this is not numpy at all")
    fails(db, snapshot, tensordb.DataError, "junk.npy as a .npy file", "B", tmp_path / "junk.npy")
    (tmp_path / "empty.npy").write_bytes(b"")
    fails(db, snapshot, tensordb.DataError, "empty.npy", "B", tmp_path / "empty.npy")


def test_truncated_npy(db, snapshot, tmp_path):
    np.save(tmp_path / "t.npy", np.ones((100, 100), "float64"))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[:-8])
    err = fails(db, snapshot, tensordb.DataError, "truncated", "B", tmp_path / "t.npy")
    assert "(100, 100)" in str(err) and "80000" in str(err)
    (tmp_path / "h.npy").write_bytes(data[:40])  # cut inside the header
    fails(db, snapshot, tensordb.DataError, "h.npy", "B", tmp_path / "h.npy")


@pytest.mark.parametrize("dtype", ["complex128", "uint64", "float16", "int16", "uint8", "object", "U3"])
def test_unsupported_dtype(db, snapshot, tmp_path, dtype):
    a = np.zeros((2, 2), dtype)
    err = fails(db, snapshot, tensordb.DataError, "unsupported dtype|unknown dtype", "B", a)
    assert "'B'" in str(err)
    if dtype != "object":
        np.save(tmp_path / "x.npy", a)
        fails(db, snapshot, tensordb.DataError, "x.npy: unsupported dtype", "B", tmp_path / "x.npy")


def test_unsupported_column_types(db, snapshot, tmp_path):
    # (BOOLEAN columns load as bool tensors: tests/bind/test_dtypes.py)
    pq.write_table(pa.table({"i": [0, 1], "value": pa.array([0, 1], pa.date32())}),
                   tmp_path / "d.parquet")
    fails(db, snapshot, tensordb.DataError, "column 'value' has type DATE", "B",
          tmp_path / "d.parquet", index=["i"])
    pq.write_table(pa.table({"x": [1.0], "name": ["a"]}), tmp_path / "s.parquet")
    fails(db, snapshot, tensordb.DataError, "column 'name' has type VARCHAR", "B",
          tmp_path / "s.parquet")
    pq.write_table(pa.table({"i": [0.5], "value": [1.0]}), tmp_path / "f.parquet")
    fails(db, snapshot, tensordb.DataError, "index column 'i' has type DOUBLE", "B",
          tmp_path / "f.parquet", index=["i"])


def test_coo_outside_shape(db, snapshot, tmp_path):
    pq.write_table(pa.table({"i": [0, 5], "j": [1, 2], "value": [1.0, 2.0]}), tmp_path / "c.parquet")
    err = fails(db, snapshot, tensordb.DataError, r"coordinate \(i=5, j=2\) is outside shape \(4, 4\)",
                "B", tmp_path / "c.parquet", index=["i", "j"], shape=(4, 4))
    assert "c.parquet" in str(err)


def test_coo_negative_and_null(db, snapshot, tmp_path):
    pq.write_table(pa.table({"i": [0, -1], "value": [1.0, 2.0]}), tmp_path / "n.parquet")
    fails(db, snapshot, tensordb.DataError, r"negative coordinate \(i=-1\)", "B",
          tmp_path / "n.parquet", index=["i"])
    pq.write_table(pa.table({"i": [0, None], "value": [1.0, 2.0]}), tmp_path / "u.parquet")
    fails(db, snapshot, tensordb.DataError, "index column 'i' has NULL", "B",
          tmp_path / "u.parquet", index=["i"])
    pq.write_table(pa.table({"i": [0, 1], "value": [1.0, None]}), tmp_path / "v.parquet")
    fails(db, snapshot, tensordb.DataError, "value column 'value' has NULL", "B",
          tmp_path / "v.parquet", index=["i"])
    pq.write_table(pa.table({"x": [1.0, None]}), tmp_path / "d.parquet")
    fails(db, snapshot, tensordb.DataError, "column 'x' has NULL", "B", tmp_path / "d.parquet")


def test_duplicate_coordinates(db, snapshot, tmp_path):
    (tmp_path / "dup.csv").write_text("i,j,value\n0,0,1\n1,2,3\n1,2,4\n")
    err = fails(db, snapshot, tensordb.DataError, r"coordinate \(i=1, j=2\) appears more than once",
                "B", tmp_path / "dup.csv", index=["i", "j"], duplicates="error")
    assert "SUM(value)" in str(err)  # the hint says how to aggregate
    (tmp_path / "dup0.csv").write_text("i,j,value\n5,5,0\n0,0,1\n5,5,2\n")  # a zero row counts
    fails(db, snapshot, tensordb.DataError, r"\(i=5, j=5\) appears more than once", "B",
          tmp_path / "dup0.csv", index=["i", "j"], duplicates="error")


def test_missing_columns(db, snapshot, tmp_path):
    (tmp_path / "c.csv").write_text("i,j,v\n0,0,1\n")
    fails(db, snapshot, tensordb.DataError, "no column 'value'", "B", tmp_path / "c.csv",
          index=["i", "j"])
    fails(db, snapshot, tensordb.DataError, "no column 'k'", "B", tmp_path / "c.csv",
          index=["i", "k"], value="v")


def test_name_exists_and_replace(db, snapshot):
    err = fails(db, snapshot, tensordb.CatalogError, "tensor 'A' already exists", "A", np.ones(3))
    assert "replace=True" in str(err)
    fails(db, snapshot, tensordb.CatalogError, "already exists", "a", np.ones(3))  # case-insensitive


def test_name_is_a_table(db, snapshot):
    db.sql("CREATE TABLE users (id INTEGER)")
    fails(db, snapshot, tensordb.CatalogError, "a table named 'users' exists", "Users", np.ones(3))
    fails(db, snapshot, tensordb.CatalogError, "a table named 'users' exists", "users", np.ones(3),
          replace=True)


def test_name_does_not_exist(db, snapshot):
    before = snapshot(db)
    for call in (lambda: db.tensor("nope"), lambda: db.drop("nope"), lambda: db.describe("nope"),
                 lambda: db.export("nope", "/tmp/x.npy")):
        with pytest.raises(tensordb.CatalogError, match="tensor 'nope' does not exist"):
            call()
    assert snapshot(db) == before


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "x;DROP", "é", None, 3, "a" * 200])
def test_invalid_names(db, snapshot, name):
    fails(db, snapshot, tensordb.ProgrammingError, "invalid tensor name", name, np.ones(3))


@pytest.mark.parametrize("dims", [["i"], ["i", "i"], ["i", "I"], ["i", "value"], ["i", "1j"]])
def test_invalid_dims(db, snapshot, dims):
    fails(db, snapshot, tensordb.ProgrammingError, "dimension", "B", np.ones((2, 2)), dims=dims)


def test_bad_tile(db, snapshot):
    fails(db, snapshot, tensordb.ProgrammingError, "tile", "B", np.ones((4, 4)), tile=(2,))
    fails(db, snapshot, tensordb.ProgrammingError, "tile", "B", np.ones((4, 4)), tile=(0, 2))
    fails(db, snapshot, tensordb.ProgrammingError, "tile", "B", np.ones((4, 4)), tile="big")


def test_bad_npz(db, snapshot, tmp_path):
    np.savez(tmp_path / "z.npz", x=np.ones(3), y=np.zeros(2))
    err = fails(db, snapshot, tensordb.DataError, "has no array 'w'", "B", tmp_path / "z.npz", array="w")
    assert "x, y" in str(err)
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    fails(db, snapshot, tensordb.DataError, "bad.npz", "B", tmp_path / "bad.npz")
    with zipfile.ZipFile(tmp_path / "mixed.npz", "w") as z:  # one good member, one bad dtype
        with z.open("good.npy", "w") as f:
            np.save(f, np.ones(3))
        with z.open("bad.npy", "w") as f:
            np.save(f, np.ones(3, "complex64"))
    fails(db, snapshot, tensordb.DataError, "unsupported dtype complex64", "M", tmp_path / "mixed.npz")
    assert not db.store.has("M_good")  # all members or none
    (tmp_path / "empty.npz").write_bytes((tmp_path / "z.npz").read_bytes()[:30])
    fails(db, snapshot, tensordb.DataError, "empty.npz", "B", tmp_path / "empty.npz")


def test_bad_options(db, snapshot, tmp_path):
    fails(db, snapshot, tensordb.ProgrammingError, "cannot tell the format", "B", tmp_path / "x.dat")
    fails(db, snapshot, tensordb.ProgrammingError, "unknown format", "B", np.ones(2), format="xls")
    fails(db, snapshot, tensordb.ProgrammingError, "apply to tables", "B", np.ones(2), index=["i"])
    fails(db, snapshot, tensordb.ProgrammingError, "member of a .npz", "B", np.ones(2), array="x")
    fails(db, snapshot, tensordb.ProgrammingError, "nothing to load", "B", None)


def test_bad_query(db, snapshot):
    fails(db, snapshot, tensordb.ProgrammingError, "syntax error", "B", None, query="SELEC 1")
    fails(db, snapshot, tensordb.CatalogError, "no_such_table", "B", None,
          query="SELECT * FROM no_such_table")
    # An error while streaming rows (after the writer started) still changes nothing.
    fails(db, snapshot, tensordb.DataError, "convert", "B", None,
          query="SELECT CASE WHEN range < 5000 THEN range ELSE (range::VARCHAR || 'x')::INTEGER "
                "END AS v FROM range(10000)")


def test_failed_load_does_not_replace(db, snapshot, tmp_path):
    (tmp_path / "dup.csv").write_text("i,value\n0,1\n0,2\n")
    fails(db, snapshot, tensordb.DataError, "appears more than once", "A", tmp_path / "dup.csv",
          index=["i"], replace=True, duplicates="error")


def test_open_errors(tmp_path):
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(tensordb.OperationalError, match="is a file, not a database directory"):
        tensordb.connect(tmp_path / "file.txt")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "mine.txt").write_text("keep me")
    with pytest.raises(tensordb.OperationalError, match="not empty"):
        tensordb.connect(tmp_path / "dir")
    assert (tmp_path / "dir" / "mine.txt").read_text() == "keep me"
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "catalog.duckdb").write_text("x" * 5000)
    with pytest.raises(tensordb.OperationalError, match="not a DuckDB database"):
        tensordb.connect(tmp_path / "fake")
    with pytest.raises(tensordb.OperationalError, match="does not exist"):
        tensordb.connect(tmp_path / "absent", read_only=True)


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("files", [{"W.npy": [1.0, 2.0], "w.npy": [3.0, 4.0, 5.0]},
                                   {"a": [1.0], "a.npy": [2.0, 3.0]}])
def test_npz_members_whose_tensors_would_share_a_name_are_refused(tmp_path, replace, files):
    """An archive loaded whole makes <name>_<member>: members W and w (names ignore case), or
    the files a and a.npy (both member a), would be one tensor. Once one replaced the other in
    the same load (with OR REPLACE: the load reported two tensors and stored one), or the
    error named a tensor that did not exist. Now a DataError naming both, before anything is
    stored."""
    path = tmp_path / "m.npz"
    with zipfile.ZipFile(path, "w") as z:  # np.savez cannot write a and a.npy both
        for file, values in files.items():
            with z.open(file, "w") as f:
                np.lib.format.write_array(f, np.array(values))
    with tensordb.connect(tmp_path / "db") as con:
        con.load("X_keep", np.ones(2))
        with pytest.raises(tensordb.DataError, match="would both be tensor") as info:
            con.execute(f"LOAD {'OR REPLACE ' if replace else ''}TENSOR X FROM '{path}'")
        assert "ARRAY" in info.value.hint and all(f"'{f}'" in str(info.value) for f in files)
        assert [m.name for m in con.store.list()] == ["X_keep"]


def test_a_ragged_csv_is_refused_not_cut(tmp_path):
    """Rows of different widths: DuckDB's sniffer once took the lines before the last run of
    one width for a preamble and skipped them, header included: the load stored [[4, 5, 6]]
    of a file of three rows. Read with no preamble, the file is one column of text, refused."""
    path = tmp_path / "r.csv"
    path.write_text("a,b\n1,2\n3\n4,5,6\n")
    with tensordb.connect(tmp_path / "db") as con:
        with pytest.raises(tensordb.DataError, match="not numeric"):
            con.execute(f"LOAD TENSOR R FROM '{path}'")
        assert con.store.list() == []
        (tmp_path / "ok.csv").write_text("a,b\n1,2\n3,4\n")  # a regular file still loads
        con.execute(f"LOAD TENSOR R FROM '{tmp_path / 'ok.csv'}'")
        np.testing.assert_array_equal(con.tensor("R"), [[1, 2], [3, 4]])
