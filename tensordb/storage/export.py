"""export_tensor: a stored tensor to .npy (dense) or Parquet/CSV (COO, nonzeros only).

Parquet and CSV hold exactly what SQL shows for the tensor: one column per dimension, then
``value``, one row per nonzero element, so ``load(..., index=dims, shape=...)`` reads them back.
Files are written under a temporary name and renamed, so a failed export leaves no partial file.
"""
from __future__ import annotations

import itertools
import os

import numpy as np

from ..errors import OperationalError, ProgrammingError
from . import guard
from ._duck import quote_ident, quote_str, translating
from .relations import TensorStream

__all__ = ["export_tensor", "EXPORT_FORMATS"]

EXPORT_FORMATS = ("npy", "parquet", "csv")
_SUFFIX = {".npy": "npy", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
_counter = itertools.count()


def export_tensor(store, name: str, path, *, format: str | None = None) -> None:
    """Write tensor ``name`` to ``path``; the format comes from ``format`` or the suffix."""
    reader = store.open(name)
    path = os.fspath(path)
    fmt = (format or _SUFFIX.get(os.path.splitext(path)[1].lower(), "")).lower().lstrip(".")
    if fmt not in EXPORT_FORMATS:
        raise ProgrammingError(f"cannot export to {path}: unknown format '{fmt or '?'}'",
                               hint=f"formats: {', '.join(EXPORT_FORMATS)}")
    guard.check_path(store, path, f"cannot export '{name}'")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise OperationalError(f"cannot export to {path}: directory {directory} does not exist")
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        if fmt == "npy":
            _write_npy(reader, tmp)
        else:
            _write_table(store, reader, tmp, fmt)
        os.replace(tmp, path)
    except OSError as exc:
        raise OperationalError(f"cannot export '{name}' to {path}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_npy(reader, tmp: str) -> None:
    meta = reader.meta
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=meta.dtype, shape=meta.shape)
    try:
        # The file starts sparse (zeros); only stored tiles are written.
        for entry, tile in reader.tiles():
            out[tuple(slice(s, s + n) for s, n in zip(entry.starts, entry.shape))] = tile
        out.flush()
    finally:
        del out


def _write_table(store, reader, tmp: str, fmt: str) -> None:
    view = f"__tensordb_export_{next(_counter)}"
    options = "FORMAT parquet" if fmt == "parquet" else "FORMAT csv, HEADER true"
    with store._lock, translating(f"cannot export '{reader.meta.name}'"):
        store.duck.register(view, TensorStream(reader))
        try:
            store.duck.execute(f"COPY (SELECT * FROM {quote_ident(view)}) TO {quote_str(tmp)} "
                               f"({options})")
        finally:
            store.duck.unregister(view)
