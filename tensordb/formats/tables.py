"""Tables (Parquet, CSV, any DuckDB query) as tensors, streamed through DuckDB tile by tile.

COO (``index=[...]``): each row is one element. A matrix sparse as a whole (fill 0, numeric
values) is read with no sort, a pass of tile rows at a time, and bucketed into CSR in scipy
(coo_scan.py). Any other: DuckDB computes every row's tile coordinates and
sorts by them, so the loader collects one tile's rows at a time and never holds the table nor
makes the dense tensor: each tile is stored sparse or dense by the format rule (coo.py,
``sparsity.choose_format``), and a table sparse as a whole gets tiles sized by its rows
(``sparsity.sparse_tile_shape``). Missing cells are zeros; tiles with no nonzero row are not
stored. Rules: indices are integers, at least 0 and inside ``shape`` (inferred as max + 1 when
not given); a coordinate that appears more than once is summed (as scipy does), or, with
``duplicates="error"``, a DataError naming it; NULL indices or values are errors.

Dense (no ``index``): every column must be numeric; the table is a rows x columns matrix in the
order the source yields rows, dtype the NumPy result type of the columns.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa

from ..errors import DataError, ProgrammingError
from ..geometry import default_tile_shape
from ..sparsity import is_sparse_overall
from ..storage import first_row, quote_ident, quote_str, translate_message, translating
from ..sqlfront import guard
from . import coo_scan, filemeta
from ..storage.budget import SORT_MEMORY, batch_bytes, duck_bytes, duck_memory
from ..storage.arrays import load_array
from .coo import TileEntries, check_duplicates, default_tile
from ..storage.meta import check_dims, check_tile_shape, supported_dtype

__all__ = ["load_table", "load_frame", "is_frame", "source_sql", "numpy_type"]

_INT32 = {"TINYINT", "SMALLINT", "INTEGER", "UTINYINT", "USMALLINT"}
_INT64 = {"BIGINT", "UINTEGER", "UBIGINT", "HUGEINT", "UHUGEINT"}
_SORT_ROW_BYTES = 4  # DuckDB memory per row a COO sort needs within a memory_limit (see _load_coo)
_SQL_TYPE = {"bool": "BOOLEAN", "float32": "FLOAT", "float64": "DOUBLE", "int32": "INTEGER",
             "int64": "BIGINT"}


def numpy_type(duck_type: str, column: str, where: str) -> np.dtype:
    """The stored dtype of a numeric DuckDB column (small integers widen to int32)."""
    t = duck_type.upper()
    if t in _INT32:
        return np.dtype("int32")
    if t in _INT64:
        return np.dtype("int64")
    if t == "FLOAT":
        return np.dtype("float32")
    if t == "DOUBLE" or t.startswith("DECIMAL"):
        return np.dtype("float64")
    if t == "BOOLEAN":
        return supported_dtype("bool", f"{where}: column '{column}'")
    raise DataError(f"{where}: column '{column}' has type {duck_type}, which is not numeric")


def source_sql(fmt: str, target: str, types: dict[str, str] | None = None) -> str:
    """The relation of a table source; ``types``: CSV columns read as these SQL types rather
    than as DuckDB's sniffer guesses them."""
    if fmt == "parquet":
        return f"read_parquet({quote_str(target)})"
    if fmt == "csv":
        # skip = 0: no lines are taken for a preamble. DuckDB's sniffer skips the lines before
        # the first run of rows of one width, and with them the rows of a ragged file.
        args = [quote_str(target), "skip = 0"]
        if types:
            args.append("types = {" + ", ".join(f"{quote_str(c)}: {quote_str(t)}"
                                                for c, t in types.items()) + "}")
        return f"read_csv({', '.join(args)})"
    if fmt == "frame":  # a DataFrame or Arrow table registered with DuckDB (load_frame)
        return quote_ident(target)
    if not target.strip().rstrip(";").strip():
        raise ProgrammingError("empty query")
    # Spliced into larger statements: DuckDB must see exactly one SELECT (no '); DROP ...'), and
    # the newline keeps a trailing '--' comment from swallowing the closing parenthesis.
    return f"({guard.single_select(target, 'the query')}\n)"


# Queries over the source run as DuckDB relations (duck.sql), not duck.execute: DuckDB 2.0's
# client stops a relation's query at Ctrl-C at once more often than an execute's (which it
# stopped only when the query had ended, in the runs tried).


def load_table(store, name, fmt, target, *, tile, replace, dims, index, value, shape,
               memory_limit=None, duplicates=None, fill=None):
    where = target if fmt not in ("sql", "frame") else \
        f"query for '{name}'" if fmt == "sql" else f"table for '{name}'"
    src = source_sql(fmt, target)
    recorded = _recorded(fmt, target, index, value, shape)
    if recorded is not None:  # a tensordb export: the tensor it was, trailing zero rows included
        index = list(recorded["dims"]) if index is None else index
        shape = recorded["shape"]
        fill = recorded.get("fill") or None if fill is None else fill  # and its fill value
    if fmt == "sql":
        # One SELECT, and one that writes no file into the database (enable_logging(...)).
        guard.check_statement(store, guard.single_statement(target, "the query"))
        from ..storage.views import expose_tensors
        expose_tensors(store, target)
    # DuckDB's share of the limit from the first query on: counting rows of a query with an
    # ORDER BY sorts it too.
    with store.lock, translating(f"cannot read {where}"), \
            duck_memory(store, duck_bytes(memory_limit)):
        rel = store.duck.sql(f"SELECT * FROM {src}")
        columns = dict(zip(rel.columns, (str(t) for t in rel.types)))
        if fmt == "csv":
            types = _empty_csv_types(store.duck, src, columns, index)
            types.update(_csv_types(store.duck, src, columns, index, value,
                                    recorded["dtype"] if recorded is not None else None))
            if types:
                src = source_sql(fmt, target, types)
                columns = {**columns, **types}
        if recorded is not None and not recorded["dims"]:
            return _load_scalar(store, name, src, columns, where, replace=replace, value=value)
        if index is not None:
            return _load_coo(store, name, src, columns, where, tile=tile, replace=replace,
                             dims=dims, index=index, value=value, shape=shape,
                             limit=memory_limit, duplicates=duplicates, fill=fill)
        if value is not None or shape is not None:
            raise ProgrammingError(f"load '{name}': value= and shape= need index= (a COO table)")
        return _load_dense(store, name, src, columns, where, tile=tile, replace=replace, dims=dims,
                           limit=memory_limit)


def load_frame(store, name, frame, **options):
    """A pandas or polars DataFrame or an Arrow table, read by DuckDB as a table (a COO table
    with ``index=``: its rows stored tile by tile as sparse or dense tiles, as a query's)."""
    table = _arrow_table(frame)
    view = f"__tensordb_frame_{id(table):x}"
    with store.lock, translating(f"cannot read the table for '{name}'"):
        store.duck.register(view, table)
    try:
        return load_table(store, name, "frame", view, **options)
    finally:
        with store.lock:
            store.duck.unregister(view)


def is_frame(obj) -> bool:
    """Whether ``obj`` is a pandas or polars DataFrame or an Arrow table (or record batch)."""
    mod = type(obj).__module__.split(".")[0]
    return mod in ("pandas", "polars") and type(obj).__name__ == "DataFrame" or \
        isinstance(obj, (pa.Table, pa.RecordBatch))


def _arrow_table(frame) -> pa.Table:
    if isinstance(frame, pa.Table):
        return frame
    if isinstance(frame, pa.RecordBatch):
        return pa.Table.from_batches([frame])
    if type(frame).__module__.startswith("polars"):
        return frame.to_arrow()
    return pa.Table.from_pandas(frame, preserve_index=False)


def _recorded(fmt, target, index, value, shape) -> dict | None:
    """The shape/dims/dtype an export recorded, when the load leaves them to the file: no index,
    value and shape given, or an index naming the recorded dims without a shape."""
    if fmt not in ("parquet", "csv") or shape is not None:
        return None
    if index is None and value is not None:
        return None
    recorded = filemeta.read(fmt, target)
    if recorded is None or index is None:
        return recorded
    names = [index] if isinstance(index, str) else list(index)
    return recorded if [str(c).lower() for c in names] == [d.lower() for d in recorded["dims"]] \
        else None


def _load_scalar(store, name, src, columns, where, *, replace, value):
    """An exported 0-dimensional tensor: one row holding its value, or none when it is 0."""
    val = _column(columns, "value" if value is None else value, where)
    dtype = numpy_type(columns[val], val, where)
    rows = store.duck.sql(f"SELECT CAST({quote_ident(val)} AS {_SQL_TYPE[dtype.name]}) "
                              f"FROM {src} LIMIT 2").fetchall()
    if len(rows) > 1:
        raise DataError(f"{where}: a 0-dimensional tensor holds one value, the file has more rows")
    if rows and rows[0][0] is None:
        raise DataError(f"{where}: value column '{val}' has NULL values")
    arr = np.array(rows[0][0] if rows else 0, dtype=dtype)
    return load_array(store, name, arr, replace=replace, dims=(), what=where)


def _csv_types(duck, src: str, columns: dict, index, value, dtype: str | None
               ) -> dict[str, str]:
    """CSV has no types, and DuckDB's sniffer reads a column of only inf and -inf as DATE
    (infinity is a date to it): the value column is read as the dtype an export recorded,
    and a value column that DuckDB reads as dates that are all infinite as DOUBLE (one of
    real dates stays DATE, refused as not numeric). Typed when read, not cast after: DuckDB
    cannot cast a DATE to a float."""
    if index or dtype is not None:  # a COO table (or an exported scalar): its value column
        values = [c for c in columns if c.lower() == str(value or "value").lower()]
    else:  # a dense table: every column is values
        values = list(columns)

    def all_infinite(c: str) -> bool:
        return not duck.sql(f"SELECT count(*) FROM {src} WHERE NOT isinf({quote_ident(c)})"
                            ).fetchall()[0][0]
    types = {c: "DOUBLE" for c in values if columns[c].upper() == "DATE" and all_infinite(c)}
    if dtype is not None:
        types.update({c: _SQL_TYPE[dtype] for c in values})
    return types


def _empty_csv_types(duck, src: str, columns: dict, index) -> dict[str, str]:
    """A CSV file with a header and no rows carries no types (DuckDB reads every column as
    VARCHAR), yet it is what exporting an empty tensor writes: read its index columns as BIGINT
    and its values as DOUBLE. A file with rows keeps the types DuckDB finds (no types here)."""
    if not columns or any(t.upper() != "VARCHAR" for t in columns.values()) or \
            duck.sql(f"SELECT count(*) FROM {src}").fetchall()[0][0]:
        return {}
    wanted = {str(c).lower() for c in ([index] if isinstance(index, str) else index or ())}
    return {c: "BIGINT" if c.lower() in wanted else "DOUBLE" for c in columns}


def _column(columns: dict, col: str, where: str) -> str:
    """The source's own spelling of column ``col`` (matched ignoring case, as SQL does)."""
    for c in columns:
        if c.lower() == str(col).lower():
            return c
    raise DataError(f"{where} has no column '{col}'", hint=f"its columns: {', '.join(columns)}")


def _load_coo(store, name, src, columns, where, *, tile, replace, dims, index, value, shape,
              limit, duplicates=None, fill=None):
    duck = store.duck
    index = [index] if isinstance(index, str) else list(index)
    if not index:
        raise ProgrammingError(f"load '{name}': index= needs at least one column")
    idx = [_column(columns, c, where) for c in index]
    val = _column(columns, "value" if value is None else value, where)
    for c in idx:
        if columns[c].upper() not in _INT32 | _INT64:
            raise DataError(f"{where}: index column '{c}' has type {columns[c]}, not an integer type")
    dtype = numpy_type(columns[val], val, where)
    dims = check_dims(dims if dims is not None else idx, len(idx), name)
    q = [quote_ident(c) for c in idx]
    qv = quote_ident(val)
    stats = duck.sql(
        f"SELECT count(*), count({qv}), "
        + ", ".join(f"count({c}), min({c}), max({c})" for c in q) + f" FROM {src}").fetchall()[0]
    rows, vals = stats[0], stats[1]
    counts, mins, maxs = stats[2::3], stats[3::3], stats[4::3]
    for c, n in zip(idx, counts):
        if n != rows:
            raise DataError(f"{where}: index column '{c}' has NULL values")
    if vals != rows:
        raise DataError(f"{where}: value column '{val}' has NULL values")
    coord = ", ".join(q)
    if rows and min(mins) < 0:
        bad = first_row(duck.sql(f"SELECT {coord} FROM {src} WHERE "
                                     + " OR ".join(f"{c} < 0" for c in q) + " LIMIT 1"))
        raise DataError(f"{where}: negative coordinate {_fmt(idx, bad)}",
                        hint="coordinates count from 0")
    if shape is None:
        shape = tuple(int(m) + 1 if rows else 0 for m in maxs)
    else:
        shape = tuple(int(n) for n in ([shape] if isinstance(shape, int) else shape))
        if len(shape) != len(idx) or any(n < 0 for n in shape):
            raise ProgrammingError(f"load '{name}': shape {shape} does not fit index {idx}")
        if rows and any(m >= n for m, n in zip(maxs, shape)):
            bad = first_row(duck.sql(f"SELECT {coord} FROM {src} WHERE "
                                         + " OR ".join(f"{c} >= {n}" for c, n in zip(q, shape))
                                         + " LIMIT 1"))
            raise DataError(f"{where}: coordinate {_fmt(idx, bad)} is outside shape {shape}")
    tile_shape = (check_tile_shape(tile, shape, name) if tile is not None
                  else default_tile(shape, rows, dtype))  # sized by nonzeros when sparse
    duplicates = check_duplicates(duplicates, name)
    if rows and is_sparse_overall(shape, rows, dtype) and \
            coo_scan.applies(shape, tile_shape, dtype, fill, limit):
        # a sparse matrix: read as it comes, bucketed by counting sorts (no ORDER BY)
        with store.writer(name, shape, dtype, tile_shape, dims=dims, replace=replace,
                          fill=0.0) as w:
            coo_scan.load_passes(w, duck, src, idx, val, tile_shape=tile_shape, rows=rows,
                                 limit=limit, duplicates=duplicates, where=where,
                                 stream=_stream)
        return w.meta()
    keys = [f"{c} // {max(t, 1)}" for c, t in zip(q, tile_shape)]
    # Zero rows are kept: they cannot change a tile, but a duplicate among them is still a duplicate.
    # A sparse tensor's rows in C order within each tile: its tiles' entries arrive sorted
    # (coo.write_tile_entries sorts nothing); a dense one's are scattered. Tiles that are row
    # slabs (one tile across every other dimension) are in that order when the rows are in C
    # order: the coordinates alone are the sort's keys (two fewer for DuckDB to sort by).
    order = [f"__t{d}" for d in range(len(keys))]
    if is_sparse_overall(shape, rows, dtype):
        slabs = all(t >= n for t, n in zip(tile_shape[1:], shape[1:]))
        order = q if slabs else order + q
    select = (f"SELECT {', '.join(k + f' AS __t{d}' for d, k in enumerate(keys))}, "
              + ", ".join(f"CAST({c} AS BIGINT)" for c in q)
              + f", CAST({qv} AS {_SQL_TYPE[dtype.name]}) FROM {src} "
              + f"ORDER BY {', '.join(order)}")
    # the sort's share: a tile's rows (at most the table's), not its dense extent
    tile_bytes = min(int(np.prod(tile_shape, dtype=np.int64)) * dtype.itemsize,
                     max(rows, 1) * (16 * len(idx) + 8))
    # The writer first: DuckDB runs nothing else on the connection while a result streams.
    with store.writer(name, shape, dtype, tile_shape, dims=dims, replace=replace,
                      fill=fill or 0.0) as w:
        # DuckDB's sort needs memory that grows with the rows, spilling or not (268M rows fail
        # with 128 MB): within a memory_limit it gets its share, 2 tiles, or 4 bytes a row up to
        # SORT_MEMORY, whichever is most; without one, SORT_MEMORY or 8 tiles.
        sort_bytes = (max(SORT_MEMORY, 8 * tile_bytes) if limit is None else
                      max(duck_bytes(limit), 2 * tile_bytes,
                          min(SORT_MEMORY, _SORT_ROW_BYTES * rows)))
        with duck_memory(store, sort_bytes), \
                _stream(duck, select, 16 * len(idx) + 8, limit) as reader:
            _fill_coo(w, reader, idx, where, duplicates)
    return w.meta()


def _fill_coo(w, reader, names, where, duplicates) -> None:
    """Collect the rows of one tile at a time (they arrive sorted by tile) and store the tile
    from its entries (``coo.TileEntries``): sparse or dense as the format rule says, never the
    dense tensor. Duplicates are summed or refused (``duplicates``)."""
    ndim = len(names)
    current = None
    for batch in reader:
        cols = [batch.column(k).to_numpy(zero_copy_only=False) for k in range(2 * ndim + 1)]
        tkeys = np.stack(cols[:ndim], axis=1)
        coords, values = cols[ndim:2 * ndim], cols[2 * ndim]
        change = np.flatnonzero(np.any(tkeys[1:] != tkeys[:-1], axis=1)) + 1
        for a, b in zip(np.r_[0, change], np.r_[change, batch.num_rows]):
            key = tuple(int(k) for k in tkeys[a])
            if current is None or key != current.key:
                if current is not None:
                    current.finish()
                current = TileEntries(w, key, duplicates=duplicates, where=where, names=names)
            current.add([c[a:b] for c in coords], values[a:b])
    if current is not None:
        current.finish()


def _load_dense(store, name, src, columns, where, *, tile, replace, dims, limit):
    if not columns:
        raise DataError(f"{where} has no columns")
    dtypes = [numpy_type(t, c, where) for c, t in columns.items()]
    dtype = np.result_type(*dtypes)
    rows = store.duck.sql(f"SELECT count(*) FROM {src}").fetchall()[0][0]
    shape = (int(rows), len(columns))
    tile_shape = (check_tile_shape(tile, shape, name) if tile is not None
                  else default_tile_shape(shape, dtype))
    dims = check_dims(dims, 2, name)
    sql_type = _SQL_TYPE[dtype.name]
    select = ("SELECT " + ", ".join(f"CAST({quote_ident(c)} AS {sql_type})" for c in columns)
              + f" FROM {src}")
    with store.writer(name, shape, dtype, tile_shape, dims=dims, replace=replace) as w:
        with _stream(store.duck, select, len(columns) * dtype.itemsize, limit) as reader:
            _fill_dense(w, reader, list(columns), where)
    return w.meta()


def _fill_dense(w, reader, names, where) -> None:
    """Collect rows into one slab of row tiles at a time and write its tiles."""
    row_bounds, col_bounds = w.grid
    nrows = row_bounds[-1]
    slab_index, filled = 0, 0
    slab = np.zeros((row_bounds[1] - row_bounds[0] if nrows else 0, len(names)), w.dtype)
    seen = 0
    for batch in reader:
        at = 0
        while at < batch.num_rows:
            take = min(batch.num_rows - at, slab.shape[0] - filled)
            if take <= 0:
                raise DataError(f"{where} yielded more rows than it counted")
            for k, col in enumerate(batch.columns):
                part = col.slice(at, take)
                if part.null_count:
                    raise DataError(f"{where}: column '{names[k]}' has NULL values "
                                    f"(near row {seen + at})")
                slab[filled:filled + take, k] = part.to_numpy(zero_copy_only=False)
            at += take
            filled += take
            if filled == slab.shape[0]:
                for cj in range(len(col_bounds) - 1):
                    w.write_tile((slab_index, cj), slab[:, col_bounds[cj]:col_bounds[cj + 1]])
                slab_index += 1
                filled = 0
                rows = (row_bounds[slab_index + 1] - row_bounds[slab_index]
                        if slab_index < len(row_bounds) - 1 else 0)  # 0: no room for more rows
                slab = np.zeros((rows, len(names)), w.dtype)
        seen += batch.num_rows
    if seen != nrows:
        raise DataError(f"{where} yielded {seen} rows but counted {nrows}")


@contextlib.contextmanager
def _stream(duck, select: str, row_bytes: int, limit: int | None):
    """Arrow batches of a query; closed on the way out so the connection is free again."""
    reader = duck.sql(select).to_arrow_reader(max(2048, batch_bytes(limit) // max(row_bytes, 1)))
    try:
        yield reader
    except (pa.ArrowException, OSError) as exc:  # DuckDB errors met while streaming
        raise translate_message(str(exc)) from None
    finally:
        reader.close()


def _fmt(names, values) -> str:
    return "(" + ", ".join(f"{n}={v}" for n, v in zip(names, values)) + ")"

