"""Exports keep the tensor: Parquet key-value metadata and a CSV sidecar record shape, dims and
dtype, so trailing zero rows and dimension names come back. Numpy arrays get dims i, j, k, ...

Oracles: numpy for the values, pyarrow/DuckDB/json for what the files hold."""
from __future__ import annotations

import json
import os

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

import tensordb

DTYPES = ["float32", "float64", "int32", "int64", "bool"]


def trailing_zeros(dtype):
    """A tensor whose last rows, last column and last plane are zeros: a COO table loses them."""
    rng = np.random.default_rng(5)
    a = (rng.random((6, 5, 4)) * 10 - 5).astype(dtype)
    a[4:] = 0
    a[:, -1] = 0
    a[:, :, -1] = 0
    return a


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_export_and_load_back_restore_the_tensor(con, tmp_path, dtype, suffix):
    a = trailing_zeros(dtype)
    con.load("A", a, dims=["batch", "row", "col"], tile=(4, 2, 3))
    path = tmp_path / f"a.{suffix}"
    con.export("A", path)
    con.load("B", path)  # no index=, no shape=: the file says
    info = next(t for t in con.tensors() if t["name"] == "B")
    assert info["shape"] == a.shape and info["dims"] == ("batch", "row", "col")
    back = con.tensor("B")
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    # the same through the dialect
    con.execute(f"LOAD TENSOR C FROM '{path}'")
    np.testing.assert_array_equal(con.tensor("C"), a)
    assert con.describe("C")["dims"] == ("batch", "row", "col")


def test_what_the_files_hold(con, tmp_path):
    a = trailing_zeros("float32")
    con.load("A", a, dims=["b", "r", "c"])
    con.export("A", tmp_path / "a.parquet")
    con.export("A", tmp_path / "a.csv")
    recorded = {"shape": [6, 5, 4], "dims": ["b", "r", "c"], "dtype": "float32"}
    kv = pq.read_metadata(tmp_path / "a.parquet").metadata
    assert json.loads(kv[b"tensordb"]) == recorded
    # DuckDB reads the same key
    rows = duckdb.sql(f"SELECT key, value FROM parquet_kv_metadata('{tmp_path / 'a.parquet'}') "
                      "WHERE key = 'tensordb'").fetchall()
    assert [json.loads(v) for _, v in rows] == [recorded]
    # the CSV stays a plain CSV (header dims + value, nonzeros only); the sidecar is next to it
    side = json.loads((tmp_path / "a.csv.tensordb.json").read_text())
    assert side == {**recorded, "csv_bytes": os.path.getsize(tmp_path / "a.csv")}
    got = duckdb.sql(f"SELECT b, r, c, value FROM read_csv('{tmp_path / 'a.csv'}')").fetchall()
    # (float32 values are printed in their shortest form, which reads back as the same float32)
    assert sorted((i, j, k, np.float32(v)) for i, j, k, v in got) == \
        sorted((int(i), int(j), int(k), a[i, j, k]) for i, j, k in zip(*np.nonzero(a)))


def test_index_naming_the_recorded_dims_takes_the_recorded_shape(con, tmp_path):
    a = np.zeros((5, 3))
    a[0, 0] = 2.0
    con.load("A", a)
    con.export("A", tmp_path / "a.parquet")
    con.execute(f"LOAD TENSOR B FROM '{tmp_path / 'a.parquet'}' INDEX (I, J) VALUE value")
    np.testing.assert_array_equal(con.tensor("B"), a)
    # a shape given wins; other index columns ignore the record
    con.execute(f"LOAD TENSOR C FROM '{tmp_path / 'a.parquet'}' INDEX (i, j) VALUE value "
                "SHAPE (7, 3)")
    assert con.tensor("C").shape == (7, 3)
    con.execute(f"LOAD TENSOR D FROM '{tmp_path / 'a.parquet'}' INDEX (j, i) VALUE value")
    assert con.tensor("D").shape == (1, 1)


def test_empty_tensor_round_trip(con, tmp_path):
    con.load("E", np.zeros((0, 3), "float32"))
    for suffix in ("parquet", "csv"):
        con.export("E", tmp_path / f"e.{suffix}")
        con.load(f"E_{suffix}", tmp_path / f"e.{suffix}")
        back = con.tensor(f"E_{suffix}")
        assert back.shape == (0, 3) and back.dtype == np.float32


def test_a_stale_sidecar_is_ignored(con, tmp_path):
    a = np.zeros((4, 2))
    a[1, 1] = 3.0
    con.load("A", a)
    con.export("A", tmp_path / "a.csv")
    # another tool writes the CSV again: the sidecar no longer matches its size
    duckdb.sql(f"COPY (SELECT 1 AS i, 1 AS j, 3.0 AS value UNION ALL SELECT 0, 0, 1.5) "
               f"TO '{tmp_path / 'a.csv'}' (HEADER)")
    con.load("B", tmp_path / "a.csv", index=["i", "j"])
    np.testing.assert_array_equal(con.tensor("B"), [[1.5, 0], [0, 3.0]])  # shape from the data


def test_bad_metadata_is_a_data_error_and_changes_nothing(con, tmp_path, snapshot):
    con.load("A", np.eye(2))
    con.export("A", tmp_path / "a.csv")
    side = tmp_path / "a.csv.tensordb.json"
    info = json.loads(side.read_text())
    side.write_text(json.dumps({**info, "shape": [-1, 2]}))
    before = snapshot(con)
    with pytest.raises(tensordb.DataError, match="metadata is not valid") as err:
        con.load("B", tmp_path / "a.csv")
    assert "SHAPE" in str(err.value)
    with pytest.raises(tensordb.DataError, match="metadata is not valid"):
        con.execute(f"LOAD TENSOR B FROM '{tmp_path / 'a.csv'}'")
    assert snapshot(con) == before
    # index= and shape= given: the file is a plain coordinate table
    con.load("B", tmp_path / "a.csv", index=["i", "j"], shape=(3, 3))
    np.testing.assert_array_equal(con.tensor("B"), np.pad(np.eye(2), ((0, 1), (0, 1))))


def test_tables_without_metadata_load_as_before(con, tmp_path):
    """A Parquet file no tensordb export wrote is a dense table without index=."""
    duckdb.sql(f"COPY (SELECT 1.0 AS a, 2.0 AS b UNION ALL SELECT 3.0, 4.0) "
               f"TO '{tmp_path / 't.parquet'}' (FORMAT parquet)")
    con.load("T", tmp_path / "t.parquet")
    np.testing.assert_array_equal(con.tensor("T"), [[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("ndim,dims", [(0, ()), (1, ("i",)), (2, ("i", "j")),
                                       (3, ("i", "j", "k")),
                                       (19, tuple(f"d{k}" for k in range(19)))])
def test_numpy_arrays_get_einsum_style_dims(con, ndim, dims):
    con.load("A", np.ones((1,) * ndim))
    assert con.describe("A")["dims"] == dims
    if ndim == 2:  # SQL sees them
        assert con.sql("SELECT i, j, value FROM A").fetchall() == [(0, 0, 1.0)]


@pytest.mark.parametrize("value", [2.5, 0.0, -7])
@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_zero_dimensional_round_trip(con, tmp_path, value, suffix):
    a = np.array(value, "int64" if isinstance(value, int) else "float32")
    con.load("S", a)
    con.export("S", tmp_path / f"s.{suffix}")
    con.load("T", tmp_path / f"s.{suffix}")
    back = con.tensor("T")
    assert back.shape == () and back.dtype == a.dtype and back == a


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("values", [np.inf, -np.inf, [np.inf, -np.inf], [[np.inf], [-np.inf]]])
def test_infinities_alone_round_trip_through_csv(tmp_path, dtype, values):
    """DuckDB's CSV sniffer reads a column of only inf and -inf as DATE ('infinity' is a date
    to it): the value column is read as the recorded dtype when read, not cast after it (a 0-d
    tensor of inf once failed to load: a DATE cannot be cast to FLOAT)."""
    a = np.array(values, dtype=dtype)
    path = tmp_path / "x.csv"
    with tensordb.connect(tmp_path / "db") as con:
        con.load("X", a)
        con.export("X", path)
        con.load("Y", path)
        got = con.tensor("Y")
    assert got.dtype == a.dtype and got.shape == a.shape
    np.testing.assert_array_equal(got, a)


def test_a_hand_written_csv_of_infinities_loads_and_real_dates_are_refused(tmp_path):
    """Without an export's metadata: a value column of inf and -inf is read as DOUBLE, a dense
    table's too; a column of real dates stays a date, refused as not numeric."""
    (tmp_path / "coo.csv").write_text("i,value\n0,inf\n1,-inf\n")
    (tmp_path / "dense.csv").write_text("a,b\ninf,1\n-inf,2\n")
    (tmp_path / "dates.csv").write_text("i,value\n0,2024-01-01\n")
    with tensordb.connect(tmp_path / "db") as con:
        con.execute(f"LOAD TENSOR C FROM '{tmp_path / 'coo.csv'}' INDEX (i) VALUE value")
        np.testing.assert_array_equal(con.tensor("C"), [np.inf, -np.inf])
        con.execute(f"LOAD TENSOR D FROM '{tmp_path / 'dense.csv'}'")
        np.testing.assert_array_equal(con.tensor("D"), [[np.inf, 1.0], [-np.inf, 2.0]])
        with pytest.raises(tensordb.DataError, match="has type DATE, which is not numeric"):
            con.execute(f"LOAD TENSOR E FROM '{tmp_path / 'dates.csv'}' INDEX (i) VALUE value")
        assert sorted(m.name for m in con.store.list()) == ["C", "D"]
