"""Export to .npy (dense) and Parquet/CSV (COO of the nonzeros), read back with numpy/DuckDB."""
from __future__ import annotations

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

import tensordb

DTYPES = ["float32", "float64", "int32", "int64"]


def sample(dtype):
    rng = np.random.default_rng(2)
    a = (rng.random((30, 20)) * 100 - 50).astype(dtype)
    a[a > 20] = 0
    a[8:16] = 0
    return a


@pytest.mark.parametrize("dtype", DTYPES)
def test_export_npy(con, tmp_path, dtype):
    a = sample(dtype)
    con.load("A", a, tile=(8, 7))
    con.export("A", tmp_path / "a.npy")
    back = np.load(tmp_path / "a.npy")
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_export_parquet_and_csv(con, tmp_path, dtype):
    a = sample(dtype)
    con.load("A", a, dims=["row", "col"], tile=(8, 7))
    con.export("A", tmp_path / "a.parquet")
    t = pq.read_table(tmp_path / "a.parquet")
    assert t.column_names == ["row", "col", "value"]
    assert t.schema.field("value").type.to_pandas_dtype() == a.dtype
    back = np.zeros_like(a)
    back[t["row"].to_numpy(), t["col"].to_numpy()] = t["value"].to_numpy()
    np.testing.assert_array_equal(back, a)
    assert t.num_rows == np.count_nonzero(a)  # the nonzeros, as SQL shows them
    con.export("A", tmp_path / "a.csv")
    rows = duckdb.sql(f"SELECT row, col, value FROM read_csv('{tmp_path / 'a.csv'}')").fetchall()
    back = np.zeros_like(a)
    for r, c, v in rows:
        back[r, c] = v
    np.testing.assert_array_equal(back, a)
    # and load accepts its own exports
    con.load("B", tmp_path / "a.parquet", index=["row", "col"], shape=a.shape)
    np.testing.assert_array_equal(con.tensor("B"), a)
    assert con.tensor("B").dtype == a.dtype


def test_export_scalar_empty_and_format_option(con, tmp_path):
    con.load("S", np.array(3, "int32"))
    con.export("S", tmp_path / "s.npy")
    assert np.load(tmp_path / "s.npy") == 3
    con.load("E", np.zeros((0, 3)))
    con.export("E", tmp_path / "e.out", format="parquet")
    assert pq.read_table(tmp_path / "e.out").num_rows == 0


def test_export_errors_leave_no_file(con, tmp_path):
    con.load("A", np.ones(3))
    with pytest.raises(tensordb.ProgrammingError, match="unknown format"):
        con.export("A", tmp_path / "a.xlsx")
    with pytest.raises(tensordb.OperationalError, match="does not exist"):
        con.export("A", tmp_path / "no" / "dir" / "a.npy")
    with pytest.raises(tensordb.CatalogError):
        con.export("B", tmp_path / "b.npy")
    assert list(tmp_path.iterdir()) == []
