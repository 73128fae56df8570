"""load_tensor: numpy arrays, .npy, .npz, Parquet, CSV and SQL queries become stored tensors.

Arrays are cut into tiles and written one tile at a time (a .npy file is memory-mapped, so a
file larger than memory loads in about one tile of memory). Tables go through DuckDB; see
tables.py. Every load is one writer commit: on any error nothing is stored.

>>> import numpy as np
>>> from tensordb.storage import Store
>>> with Store() as store:
...     _ = load_tensor(store, "A", np.eye(3, dtype="float32"), dims=["i", "j"])
...     store.meta("A").shape
(3, 3)
"""
from __future__ import annotations

import math
import os
import zipfile
import zlib
from typing import Sequence

import numpy as np

from ..errors import DataError, ProgrammingError
from ..sqlfront import guard, pyobjects
from . import zarrio
from ..storage import quote_ident, translating
from ..storage.arrays import load_array
from .coo import check_duplicates, from_object, is_sparse_object, load_coo
from ..storage.meta import TensorMeta, check_name
from .npyfile import NpyFile, open_input, read_header
from .npzfile import member_info, open_member
from .slabs import is_slab_stream, load_slabs

__all__ = ["load_tensor", "load_array", "FORMATS"]

FORMATS = ("npy", "npz", "parquet", "csv", "sql", "zarr")
_SUFFIX = {".npy": "npy", ".npz": "npz", ".parquet": "parquet", ".pq": "parquet",
           ".csv": "csv", ".tsv": "csv", ".txt": "csv", ".zarr": "zarr"}


def load_tensor(store, name: str, source, *, tile: Sequence[int] | None = None,
                replace: bool = False, array: str | None = None,
                index: Sequence[str] | None = None, value: str | None = None,
                shape: Sequence[int] | None = None, dims: Sequence[str] | None = None,
                format: str | None = None, query: str | None = None,
                memory_limit: int | None = None, duplicates: str | None = None,
                fill_value: float | None = None) -> TensorMeta:
    """Store ``source`` as tensor ``name``; returns its catalog entry.

    ``source``: a numpy array (or anything ``np.asarray`` takes), a scipy.sparse matrix or array
    or a pydata ``sparse`` array (stored from its entries: coo.py), a pandas or polars DataFrame
    or an Arrow table with ``index=`` (a COO table, read by DuckDB), an iterator of scipy.sparse
    row slabs with ``shape=`` (a matrix streamed one band of tiles at a time: slabs.py), a path to .npy/.npz/.parquet/
    .csv, a SQL string with ``format="sql"``, or None with ``query=``. ``duplicates``: 'sum'
    (the default, as scipy) or 'error', for coordinates given twice (COO tables, sparse arrays). Table options: ``index``
    (coordinate columns) with ``value`` (the value column, default ``value``) and ``shape``;
    without ``index`` every column must be numeric and the table becomes a rows x columns matrix.
    ``memory_limit``: the connection's, bounding what DuckDB holds while it reads a table
    (budget.py); arrays are read one tile at a time whatever it is. ``fill_value``: the value
    of the entries a COO table or sparse array leaves out (default 0; a pydata array's own
    ``fill_value``), recorded in the catalog (TensorMeta.fill).
    """
    store.check_open(writing=True)
    check_name(name)
    if fill_value is not None and not is_sparse_object(source) and index is None and \
            not is_slab_stream(source):
        raise ProgrammingError(f"load '{name}': fill_value= applies to COO tables (index=) and "
                               "sparse arrays, whose absent entries it gives")
    if is_slab_stream(source):  # row slabs of a matrix, one band of tiles at a time: slabs.py
        if format is not None or query is not None or any(
                v is not None for v in (index, value, array)):
            raise ProgrammingError(f"load '{name}': a stream of row slabs takes shape=, tile=, "
                                   "dims=, duplicates= and fill_value= only")
        store.check_free(name, replace)
        return load_slabs(store, name, source, shape=shape, tile=tile, replace=replace,
                          dims=dims, duplicates=duplicates, fill=fill_value,
                          memory_limit=memory_limit)
    if is_sparse_object(source):  # scipy.sparse, pydata sparse: entries, never densified
        if format is not None or query is not None or any(
                v is not None for v in (index, value, shape, array)):
            raise ProgrammingError(f"load '{name}': a sparse array takes tile=, dims= and "
                                   "duplicates= only")
        check_duplicates(duplicates, name)
        store.check_free(name, replace)
        coords, values, shape, fill = from_object(source)
        if fill_value is not None and fill != 0 and float(fill_value) != fill:
            raise ProgrammingError(f"load '{name}': fill_value={fill_value!r}, but the sparse "
                                   f"array's fill value is {fill!r}")
        return load_coo(store, name, coords, values, shape, tile=tile, replace=replace,
                        dims=dims, duplicates=duplicates, where=f"tensor '{name}'",
                        fill=fill if fill_value is None else fill_value)
    if duplicates is not None:
        check_duplicates(duplicates, name)
    from .tables import is_frame, load_frame
    if index is not None and is_frame(source):  # a DataFrame or Arrow table of COO rows
        if format is not None or query is not None or array is not None:
            raise ProgrammingError(f"load '{name}': a table in memory takes index=, value=, "
                                   "shape=, duplicates=, tile= and dims=")
        store.check_free(name, replace)
        return load_frame(store, name, source, tile=tile, replace=replace, dims=dims,
                          index=index, value=value, shape=shape, memory_limit=memory_limit,
                          duplicates=duplicates, fill=fill_value)
    if pyobjects.is_xarray(source):  # its dims name the tensor's dimensions
        dims = list(source.dims) if dims is None else dims
        source = source.values
    fmt, target = ("zarr", source) if zarrio.is_zarr(source) else _resolve(source, format, query)
    if fmt == "frame":  # a data frame or Arrow table: read by DuckDB, as a query over it is
        scans = {f"_tensordb_load_{id(target):x}": target}
        with pyobjects.scanning(store, scans):
            return load_tensor(store, name, None, tile=tile, replace=replace, index=index,
                               value=value, shape=shape, dims=dims, memory_limit=memory_limit,
                               fill_value=fill_value,
                               query=f"SELECT * FROM {quote_ident(next(iter(scans)))}")
    if fmt in ("npy", "npz", "parquet", "csv") or (fmt == "zarr" and isinstance(target, str)):
        guard.check_path(store, target, f"cannot load '{name}'")
    if fmt in ("parquet", "csv"):
        _check_not_a_pattern(store, name, target)
    table_opts = {"index": index, "value": value, "shape": shape, "duplicates": duplicates,
                  "fill": fill_value}
    if fmt not in ("parquet", "csv", "sql"):
        given = [k for k, v in table_opts.items() if v is not None]
        if given:
            raise ProgrammingError(f"load '{name}': {', '.join(given)} apply to tables "
                                   "(Parquet, CSV, SQL), not to arrays")
    if array is not None and fmt != "npz":
        raise ProgrammingError(f"load '{name}': array= chooses a member of a .npz file")
    if fmt != "npz" or array is not None:
        store.check_free(name, replace)  # fail before reading any data
    if fmt == "numpy":
        return load_array(store, name, target, tile=tile, replace=replace, dims=dims,
                          what=f"tensor '{name}'", check_tables=False)  # checked just above
    if fmt == "npy":
        with NpyFile(target) as npy:
            return load_array(store, name, npy.array, tile=tile, replace=replace, dims=dims,
                              what=target, after_tile=npy.release, check_tables=False)
    if fmt == "zarr":  # streamed a tile (of whole chunks) at a time
        return zarrio.load_zarr(store, name, target, tile=tile, replace=replace, dims=dims)
    if fmt == "npz":
        return _load_npz(store, name, target, array, tile=tile, replace=replace, dims=dims)
    from .tables import load_table
    # a query may name the caller's DataFrames and Arrow tables, as in con.sql (pyobjects.py)
    scans = pyobjects.scans_for(store, target) if fmt == "sql" else {}
    with pyobjects.scanning(store, scans):
        return load_table(store, name, fmt, target, tile=tile, replace=replace, dims=dims,
                          memory_limit=memory_limit, **table_opts)


def _check_not_a_pattern(store, name: str, path: str) -> None:
    """DuckDB reads a table file's path as a glob pattern (``*``, ``?``, ``[...]``), and LOAD
    names one file: a path whose pattern matches anything but that file is refused, since
    DuckDB would read those files instead (perhaps one inside the database directory)."""
    if not any(c in path for c in "*?["):
        return
    with store.lock, translating(f"cannot load '{name}'"):
        matched = [r[0] for r in store.duck.execute("SELECT file FROM glob(?)", [path]).fetchall()]
    if [os.path.realpath(m) for m in matched] != [os.path.realpath(path)]:
        shown = ", ".join(matched[:3]) + (", ..." if len(matched) > 3 else "") or "no file"
        raise ProgrammingError(
            f"cannot load '{name}': DuckDB reads {path} as a pattern (* ? [ ] in its name), "
            f"which matches {shown}, not the file itself",
            hint="rename the file, or link it under a name without * ? [ ]")


def _resolve(source, format: str | None, query: str | None) -> tuple[str, object]:
    """(format, array or path or SQL text)."""
    if format is not None:
        format = str(format).lower().lstrip(".")
        if format not in FORMATS:
            raise ProgrammingError(f"unknown format '{format}'", hint=f"formats: {', '.join(FORMATS)}")
    if query is not None:
        if source is not None:
            raise ProgrammingError("give either a source or query=, not both")
        return "sql", str(query)
    if format == "sql":
        if not isinstance(source, str):
            raise ProgrammingError("format='sql' needs the query text as the source")
        return "sql", source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if format is None:
            format = _SUFFIX.get(os.path.splitext(path)[1].lower())
            if format is None:
                raise ProgrammingError(f"cannot tell the format of {path} from its suffix",
                                       hint="pass format='npy', 'npz', 'parquet' or 'csv'")
        if not os.path.exists(path):
            open_input(path).close()  # raises: file not found
        return format, path
    if source is None:
        raise ProgrammingError("nothing to load: give an array, a path or query=")
    if format is not None:
        raise ProgrammingError(f"format='{format}' applies to paths, not to in-memory arrays")
    if pyobjects.is_scannable(source):
        return "frame", source
    try:
        if hasattr(source, "__dlpack__") and not isinstance(source, np.ndarray):
            # torch, JAX, CuPy...: numpy reads host memory in place (a GPU array raises)
            arr = np.from_dlpack(source)
            return "numpy", arr
        arr = np.asarray(source)
    except Exception as exc:  # ragged lists and the like
        raise DataError(f"cannot read {type(source).__name__} as an array: {exc}") from None
    return "numpy", arr


def _member_tensors(path: str, name: str, members: list[str], files: list[str]) -> dict:
    """tensor name -> member, for every array of an archive loaded whole (``<name>_<member>``).
    Two members whose tensors would have one name (names are case-insensitive: 'W' and 'w';
    or 'a' and 'a.npy') are refused before anything is read: one would replace the other."""
    chosen: dict[str, str] = {}
    seen: dict[str, str] = {}  # lower-cased tensor name -> the archive's file name
    for m, file in zip(members, files):
        tname = check_name(f"{name}_{m}")
        other = seen.get(tname.lower())
        if other is not None:
            raise DataError(f"{path}: its arrays '{other}' and '{file}' would both be tensor "
                            f"'{tname}' (tensor names ignore case)",
                            hint="load them one at a time with ARRAY, each under a name of its own")
        seen[tname.lower()] = file
        chosen[tname] = m
    return chosen


def _load_npz(store, name, path, member, *, tile, replace, dims) -> TensorMeta:
    """One member, or every member as <name>_<member>, stored together or not at all; each is
    read one tile (or one slab of rows) at a time (npzfile.py)."""
    with open_input(path):
        pass
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        if _is_npy(path):
            raise DataError(f"{path} is not a .npz archive (it holds a single array: use .npy)"
                            ) from None
        raise DataError(f"cannot read {path} as a .npz file: {exc}") from None
    with z:
        members = [n[:-4] if n.endswith(".npy") else n for n in z.namelist()]
        if member is not None:
            if member not in members:
                raise DataError(f"{path} has no array '{member}'",
                                hint=f"its arrays: {', '.join(members) or '(none)'}")
            chosen = {name: member}
        elif len(members) == 1:
            chosen = {name: members[0]}
        elif not members:
            raise DataError(f"{path} holds no arrays")
        else:
            chosen = _member_tensors(path, name, members, z.namelist())
        for tname in chosen:
            store.check_free(tname, replace)
        metas = []
        with store.transaction():
            for tname, m in chosen.items():
                _check_member(z, m, path)
                try:
                    with open_member(z, path, m, tile=tile, name=tname,
                                     scratch=str(store.root)) as (arr, tile_shape, after):
                        metas.append(load_array(store, tname, arr, tile=tile_shape,
                                                replace=replace, dims=dims,
                                                what=f"{path}['{m}']", after_tile=after,
                                                check_tables=False))  # checked above
                except (ValueError, OSError, EOFError, RuntimeError, NotImplementedError,
                        zipfile.BadZipFile, zlib.error) as exc:  # encrypted, unknown method...
                    raise DataError(f"cannot read array '{m}' of {path}: {exc}") from None
        return metas[0] if len(metas) == 1 else metas


def _is_npy(path: str) -> bool:
    with open_input(path) as f:
        return f.read(6) == b"\x93NUMPY"


def _check_member(z, member: str, path: str) -> None:
    """Check an .npz member's header before numpy allocates the array it claims: a corrupt or
    hostile header (negative or huge shape) is a DataError, not a ValueError or MemoryError."""
    what = f"{path}['{member}']"
    try:
        info = member_info(z, member)
        with z.open(info) as f:
            shape, _, dtype = read_header(f, what)
            offset = f.tell()
    except DataError:
        raise
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise DataError(f"cannot read array '{member}' of {path}: {exc}") from None
    need = math.prod(shape) * dtype.itemsize
    if info.file_size - offset < need:
        raise DataError(f"{what} is truncated: shape {shape} of {dtype.name} needs {need} bytes "
                        f"of data, the member has {max(info.file_size - offset, 0)}")
