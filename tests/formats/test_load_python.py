"""con.load from the Python ecosystem: pandas/polars DataFrames and Arrow tables (dense numeric:
rows x columns), xarray DataArrays (dims name the dimensions), DLPack objects; and back out with
to_xarray. numpy (and DuckDB reading the same frame) is the oracle."""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import tensordb

xr = pytest.importorskip("xarray", reason="xarray is in the xarray extra")


def _frames():
    rng = np.random.default_rng(7)
    values = rng.standard_normal((9, 3))
    pdf = pd.DataFrame(values, columns=["x", "y", "z"], index=np.arange(9) * 10)
    return values, [pdf, pl.from_pandas(pdf), pa.Table.from_pandas(pdf, preserve_index=False)]


def test_frames_load_as_rows_by_columns(con):
    values, frames = _frames()
    for k, frame in enumerate(frames):
        con.load(f"F{k}", frame, tile=(4, 2))
        np.testing.assert_array_equal(con.tensor(f"F{k}"), values)  # columns in their order
        assert con.describe(f"F{k}")["tile_shape"] == (4, 2)
    # DuckDB reads the same frame to the same rows
    pdf = frames[0]
    np.testing.assert_array_equal(con.tensor("F0"), np.array(duckdb.sql("SELECT * FROM pdf").fetchall()))
    # nothing of the loads stays registered: the only views are the tensors' own (a listing
    # query shows every tensor as a view of its name)
    views = {v for (v,) in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert views <= {"F0", "F1", "F2"}


def test_integer_columns_keep_an_integer_dtype(con):
    frame = pd.DataFrame({"a": np.arange(4, dtype=np.int32), "b": np.arange(4, dtype=np.int64)})
    con.load("I", frame)
    got = con.tensor("I")
    assert got.dtype == np.result_type(np.int32, np.int64)
    np.testing.assert_array_equal(got, frame.to_numpy())


def test_a_frame_that_is_not_numeric_or_has_nulls_is_refused(con):
    with pytest.raises(tensordb.DataError, match="column 's' has type VARCHAR"):
        con.load("S", pd.DataFrame({"x": [1.0], "s": ["a"]}))
    with pytest.raises(tensordb.DataError, match="NULL"):
        con.load("N", pa.table({"x": pa.array([1.0, None])}))
    assert con.tensors() == []


def test_a_relation_loads_like_a_frame(con):
    rel = con.sql("SELECT range AS a, range * 2.0 AS b FROM range(5)")
    con.load("Q", rel)
    np.testing.assert_array_equal(con.tensor("Q"), np.stack([np.arange(5), np.arange(5) * 2.0], 1))


def test_xarray_dims_become_dimension_names_and_come_back(con):
    data = np.arange(24.0).reshape(2, 3, 4)
    da = xr.DataArray(data, dims=("time", "lat", "lon"))
    con.load("T", da)
    assert con.describe("T")["dims"] == ("time", "lat", "lon")
    back = con.to_xarray("T")
    assert back.dims == da.dims and back.name == "T"
    np.testing.assert_array_equal(back.values, data)
    # dimension names are what einsum statements see
    result = con.execute("M[time, lat] = SUM(T[time, lat, lon])")
    np.testing.assert_array_equal(con.tensor("M"), da.sum("lon").values)
    assert con.to_xarray("M").dims == ("time", "lat")
    assert result.to_xarray().equals(da.sum("lon").rename("M"))
    with pytest.raises(tensordb.ProgrammingError, match="holds no tensor"):
        con.execute("SELECT 1").to_xarray()
    con.load("U", da, dims=["a", "b", "c"])  # dims= still decides
    assert con.describe("U")["dims"] == ("a", "b", "c")


class DLPackOnly:
    """An array that numpy can read only through DLPack (as a torch or JAX CPU array)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_objects_load(con):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    con.load("D", DLPackOnly(data))
    got = con.tensor("D")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, data)
    con.load("E", data)  # numpy 2 arrays have __dlpack__ too
    np.testing.assert_array_equal(con.tensor("E"), data)
    # and out: a tensor is a numpy array, which DLPack consumers take
    np.testing.assert_array_equal(np.from_dlpack(con.tensor("D")), data)


def test_dlpack_object_numpy_cannot_read_is_a_data_error(con):
    class Broken:
        def __dlpack__(self, **kwargs):
            raise BufferError("on a GPU")

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(tensordb.DataError, match="cannot read Broken"):
        con.load("G", Broken())


# -- zarr -------------------------------------------------------------------------------------------

def test_zarr_arrays_load_chunk_by_chunk_and_export(con, tmp_path):
    zarr = pytest.importorskip("zarr", reason="zarr is in the zarr extra")
    rng = np.random.default_rng(5)
    data = rng.standard_normal((10, 7)).astype(np.float32)
    data[:4, :3] = 0  # a chunk of zeros: no tile stored, no chunk written
    z = zarr.create_array(store=str(tmp_path / "in.zarr"), shape=data.shape, dtype=data.dtype,
                          chunks=(3, 4), dimension_names=("row", "col"), fill_value=0)
    z[...] = data
    con.load("Z", z)  # an array object
    np.testing.assert_array_equal(con.tensor("Z"), data)
    info = con.describe("Z")
    assert info["dims"] == ("row", "col")
    assert all(t % c == 0 or t == n for t, c, n in zip(info["tile_shape"], (3, 4), data.shape))
    con.load("P", str(tmp_path / "in.zarr"), tile=(5, 7))  # a path; tile= decides
    np.testing.assert_array_equal(con.tensor("P"), data)
    assert con.describe("P")["tile_shape"] == (5, 7)
    con.execute(f"LOAD TENSOR Q FROM '{tmp_path / 'in.zarr'}'")  # the dialect's LOAD
    np.testing.assert_array_equal(con.tensor("Q"), data)

    con.export("P", str(tmp_path / "out.zarr"))
    back = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    np.testing.assert_array_equal(back[...], data)
    assert back.chunks == (5, 7) and tuple(back.metadata.dimension_names) == ("row", "col")
    con.execute("M[row, col] = P[row, col] * 2")
    con.execute(f"COPY M TO '{tmp_path / 'out.zarr'}'")  # replaces a zarr array
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[...],
                                  data * 2)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "keep.txt").write_text("mine")
    with pytest.raises(tensordb.ProgrammingError, match="not a zarr array"):
        con.export("M", str(tmp_path / "plain.zarr").replace("plain.zarr", "plain"), format="zarr")
    assert (tmp_path / "plain" / "keep.txt").read_text() == "mine"
    with pytest.raises(tensordb.ProgrammingError, match="inside the database directory"):
        con.export("M", str(con.store.root / "x.zarr"))


def test_a_zarr_array_larger_than_a_tile_streams(con, tmp_path):
    """Each tile read is a slice of the array: the loader never asks for the whole of it."""
    zarr = pytest.importorskip("zarr", reason="zarr is in the zarr extra")
    data = np.arange(64 * 48, dtype=np.float64).reshape(64, 48)
    z = zarr.create_array(store=str(tmp_path / "big.zarr"), shape=data.shape, dtype=data.dtype,
                          chunks=(16, 16), fill_value=0)
    z[...] = data

    class Watched:
        """The zarr array, recording the size of every read."""
        def __init__(self, arr):
            self.arr, self.reads = arr, []
            self.shape, self.dtype, self.ndim, self.chunks = arr.shape, arr.dtype, arr.ndim, arr.chunks
            self.metadata = arr.metadata

        def __getitem__(self, key):
            out = self.arr[key]
            self.reads.append(out.size)
            return out

    watched = Watched(z)
    from tensordb.formats.zarrio import load_zarr
    load_zarr(con.store, "W", watched, tile=(16, 48), replace=False, dims=None)
    np.testing.assert_array_equal(con.tensor("W"), data)
    assert len(watched.reads) == 4 and max(watched.reads) == 16 * 48


def test_an_export_never_replaces_a_zarr_group(con, tmp_path):
    """A zarr group at the target holds other arrays: the export refuses it and the group is
    left as it was (only a zarr array is replaced)."""
    zarr = pytest.importorskip("zarr", reason="zarr is in the zarr extra")
    path = str(tmp_path / "data.zarr")
    group = zarr.open_group(path, mode="w")
    kept = group.create_array("kept", shape=(3,), dtype="f8")
    kept[:] = [1.0, 2.0, 3.0]
    con.load("A", np.arange(4.0))
    with pytest.raises(tensordb.ProgrammingError, match="not a zarr array"):
        con.export("A", path)
    np.testing.assert_array_equal(zarr.open_group(path, mode="r")["kept"][:], [1.0, 2.0, 3.0])
    con.export("A", str(tmp_path / "a.zarr"))
    con.export("A", str(tmp_path / "a.zarr"))  # an array there is replaced
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[:],
                                  np.arange(4.0))
