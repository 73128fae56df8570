"""export_tensor: a stored tensor to .npy (dense) or Parquet/CSV (COO, nonzeros only).

Parquet and CSV hold exactly what SQL shows for the tensor: one column per dimension, then
``value``, one row per nonzero element, and record the shape, dimension names and dtype
(filemeta.py: Parquet key-value metadata, a CSV sidecar), so loading the file back gives the
tensor, trailing zero rows included. Files are written under a temporary name and renamed, so a
failed export leaves no partial file.
"""
from __future__ import annotations

import itertools
import os

import numpy as np

from ..errors import OperationalError, ProgrammingError
from . import filemeta, guard
from ._duck import quote_ident, quote_str, translating
from .budget import batch_bytes, duck_bytes, duck_memory
from .sparse import scatter_into
from .views import TensorStream, arrow_schema, coo_batches

__all__ = ["export_tensor", "EXPORT_FORMATS"]

EXPORT_FORMATS = ("npy", "parquet", "csv")
_SUFFIX = {".npy": "npy", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
_counter = itertools.count()


def _unknown_format(path: str, format: str | None) -> ProgrammingError:
    """The error for a format given that is none, or a path whose suffix names none."""
    if format:
        return ProgrammingError(f"cannot export to {path}: unknown format '{format}'",
                                hint=f"formats: {', '.join(EXPORT_FORMATS)}")
    suffix = os.path.splitext(path)[1].lower()
    said = f"the suffix '{suffix}' names none" if suffix else "the path has no suffix"
    known = ", ".join(f"{fmt} ({', '.join(s for s, f in _SUFFIX.items() if f == fmt)})"
                      for fmt in dict.fromkeys(_SUFFIX.values()))
    return ProgrammingError(f"cannot export to '{path}': unknown format ({said})",
                            hint=f"formats: {known}; or name one with (FORMAT csv) (format= in "
                                 "Python)")


def export_tensor(store, name: str, path, *, format: str | None = None,
                  memory_limit: int | None = None) -> None:
    """Write tensor ``name`` to ``path``; the format comes from ``format`` or the suffix.
    One tile (or one batch of a tile's nonzeros) at a time; ``memory_limit`` (the connection's)
    sizes the batches and what DuckDB may hold while it writes CSV (budget.py)."""
    reader = store.open(name)
    path = os.fspath(path)
    fmt = (format or _SUFFIX.get(os.path.splitext(path)[1].lower(), "")).lower().lstrip(".")
    if fmt not in EXPORT_FORMATS:
        raise _unknown_format(path, format)
    guard.check_path(store, path, f"cannot export '{name}'")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise OperationalError(f"cannot export to {path}: directory {directory} does not exist")
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    side_tmp = tmp + filemeta.SIDECAR
    try:
        if fmt == "npy":
            _write_npy(reader, tmp)
        elif fmt == "parquet":
            _write_parquet(reader, tmp, memory_limit)
        else:
            _write_csv(store, reader, tmp, memory_limit)
            # The sidecar first: one that does not match the CSV's size is ignored when loading.
            filemeta.write_sidecar(reader.meta, side_tmp, tmp)
            os.replace(side_tmp, filemeta.sidecar_path(path))
        os.replace(tmp, path)
    except OSError as exc:
        raise OperationalError(f"cannot export '{name}' to {path}: {exc.strerror or exc}") from None
    finally:
        for leftover in (tmp, side_tmp):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _write_npy(reader, tmp: str) -> None:
    meta = reader.meta
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=meta.dtype, shape=meta.shape)
    try:
        # The file starts sparse (zeros); only stored tiles are written.
        for coords in reader.coords():
            entry = reader.entries[coords]
            if entry.sparse:  # its entries, into the file's zeros: never the dense tile
                scatter_into(out, entry.starts, reader.stored_tile(coords))
                continue
            out[tuple(slice(s, s + n) for s, n in zip(entry.starts, entry.shape))] = \
                reader.tile(coords)
        out.flush()
    finally:
        del out


_ROW_GROUP = 1 << 20  # rows: tiles' batches are gathered into row groups of about this many


def _write_parquet(reader, tmp: str, limit: int | None) -> None:
    """The COO table, with the tensor's shape, dims and dtype in the file's key-value metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = arrow_schema(reader.meta).with_metadata({filemeta.KEY: filemeta.describe(reader.meta)})
    rows_per_batch = _batch_rows(reader.meta, limit)
    group = min(_ROW_GROUP, 4 * rows_per_batch)
    with pq.ParquetWriter(tmp, schema) as out:
        pending, rows = [], 0
        for batch in coo_batches(reader, rows_per_batch):
            pending.append(batch)
            rows += batch.num_rows
            if rows >= group:
                out.write_table(pa.Table.from_batches(pending, schema))
                pending, rows = [], 0
        if pending:
            out.write_table(pa.Table.from_batches(pending, schema))


def _batch_rows(meta, limit: int | None) -> int:
    """Rows per COO batch: a batch row holds one int64 per dimension and the value."""
    return max(1024, batch_bytes(limit) // (8 * meta.ndim + meta.dtype.itemsize))


def _write_csv(store, reader, tmp: str, limit: int | None) -> None:
    view = f"__tensordb_export_{next(_counter)}"
    options = "FORMAT csv, HEADER true"
    with store._lock, translating(f"cannot export '{reader.meta.name}'"), \
            duck_memory(store, duck_bytes(limit)):
        store.duck.register(view, TensorStream(reader, _batch_rows(reader.meta, limit)))
        try:
            store.duck.execute(f"COPY (SELECT * FROM {quote_ident(view)}) TO {quote_str(tmp)} "
                               f"({options})")
        finally:
            store.duck.unregister(view)
