"""export_tensor: a stored tensor to .npy (dense), Parquet/CSV (COO, nonzeros only) or a zarr
array (its tiles as chunks: zarrio.py).

Parquet and CSV hold exactly what SQL shows for the tensor: one column per dimension, then
``value``, one row per nonzero element, and record the shape, dimension names and dtype
(filemeta.py: Parquet key-value metadata, a CSV sidecar), so loading the file back gives the
tensor, trailing zero rows included. Files are written under a temporary name
(``.<name>.<pid>.tmp`` beside the target) and renamed, so a failed export leaves no partial file;
an export killed before its rename (kill -9) leaves its temporary file, which the next export to
the same path removes once no process of that id is alive (``remove_leftovers``).
"""
from __future__ import annotations

import itertools
import os
import re

import numpy as np

from ..errors import OperationalError, ProgrammingError
from ..sqlfront import guard
from . import filemeta, zarrio
from ..storage import quote_ident, quote_str, translating
from ..storage.budget import batch_bytes, duck_bytes, duck_memory
from ..storage.sparse import scatter_into
from ..storage.views import TensorStream, arrow_schema, coo_batches

__all__ = ["export_tensor", "EXPORT_FORMATS", "remove_leftovers"]

EXPORT_FORMATS = ("npy", "parquet", "csv", "zarr")
_SUFFIX = {".npy": "npy", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv",
           ".zarr": "zarr"}
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
    if fmt == "zarr":  # a directory of chunks: the tensor's tiles (zarrio.py)
        return zarrio.export_zarr(reader, path, tmp)
    side_tmp = tmp + filemeta.SIDECAR
    remove_leftovers(path)
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


def remove_leftovers(path: str) -> list[str]:
    """Delete the temporary files that killed exports to ``path`` left beside it (and their CSV
    sidecars): ``.<name>.<pid>.tmp`` whose process is gone (``os.kill(pid, 0)`` finds none). A
    process of that id that is alive may still be writing it, and its file stays. Returns the
    paths removed."""
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(f".{os.path.basename(path)}.") + r"(\d+)\.tmp" +
                         f"(?:{re.escape(filemeta.SIDECAR)})?" + r"\Z")
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = pattern.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        leftover = os.path.join(directory, name)
        try:
            if not os.path.isdir(leftover) or os.path.islink(leftover):
                os.unlink(leftover)
                removed.append(leftover)
        except OSError:  # gone already, or not ours to delete: left alone
            pass
    return removed


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (this one's counts: its own export writes that name)."""
    if pid == os.getpid():
        return False  # ours: a file of that name is overwritten by this export anyway
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # another user's process (or an id no process can have: gone)
    return True


def _write_npy(reader, tmp: str) -> None:
    meta = reader.meta
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=meta.dtype, shape=meta.shape)
    try:
        # The file starts sparse (zeros); only stored tiles are written.
        for coords in reader.coords():
            entry = reader.entries[coords]
            if entry.sparse and not meta.fill:  # its entries, into the zeros: never dense
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
    with store.lock, translating(f"cannot export '{reader.meta.name}'"), \
            duck_memory(store, duck_bytes(limit)):
        store.duck.register(view, TensorStream(reader, _batch_rows(reader.meta, limit)))
        try:
            store.duck.execute(f"COPY (SELECT * FROM {quote_ident(view)}) TO {quote_str(tmp)} "
                               f"({options})")
        finally:
            store.duck.unregister(view)
