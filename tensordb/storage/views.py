"""Tensors shown to DuckDB: each one a view of its COO table (one column per dimension plus
``value``, nonzeros only), produced tile by tile as an Arrow stream when a query scans it; or, while
DuckDB binds a statement to say what it writes, an empty typed view standing in for it.

>>> sorted(referenced_names('SELECT i FROM "A" WHERE x = 1 -- C'))
['a', 'from', 'i', 'select', 'where', 'x']
"""
from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa

from ..errors import Error
from ._duck import note_interrupt, note_stream_error, quote_ident, spelled_names, translating
from .reader import TensorReader
from .sparse import CooTile

__all__ = ["referenced_names", "arrow_schema", "coo_batches", "TensorStream", "expose_tensors",
           "standing_in"]

# Strings and comments are skipped; quoted and bare identifiers are collected.
_ARROW = {"bool": pa.bool_(), "float32": pa.float32(), "float64": pa.float64(), "int32": pa.int32(),
          "int64": pa.int64()}


def referenced_names(query: str) -> set[str]:
    """Identifiers (and keywords) in ``query``, lower-cased, by DuckDB's own tokenizer, which
    knows every kind of string and comment ($$...$$, E'...'): a name inside one is none.
    Over-matching only registers an extra view."""
    return {word.lower() for word in spelled_names(query)}


def arrow_schema(meta) -> pa.Schema:
    return pa.schema([(d, pa.int64()) for d in meta.dims] + [("value", _ARROW[meta.dtype.name])])


COO_ROWS = 1 << 18  # elements of a tile scanned per batch: a batch is at most this many rows


def coo_batches(reader: TensorReader, max_rows: int = COO_ROWS):
    """Arrow batches of (coordinates..., value), nonzeros only, tile by tile; a tile larger than
    ``max_rows`` elements is scanned in slabs of its leading dimension, a batch per slab. Of a
    tensor whose fill is not 0 (TensorMeta.fill), the entries that are not the fill."""
    meta = reader.meta
    schema = arrow_schema(meta)
    for coords in reader.coords():
        entry, tile = reader.entries[coords], reader.stored_tile(coords)
        if entry.sparse:  # its entries, never the dense tile
            yield from _sparse_batches(entry, tile, schema, max_rows, meta.fill)
            continue
        if meta.ndim == 0:
            if tile != meta.fill:
                yield pa.record_batch([pa.array(tile.reshape(1))], schema=schema)
            continue
        row = max(1, tile[0].size) if tile.shape[0] else 1
        step = max(1, max_rows // row)
        for lo in range(0, tile.shape[0], step):
            part = tile[lo:lo + step]
            nz = np.nonzero(part != meta.fill) if meta.fill else np.nonzero(part)
            if not len(nz[0]):
                continue
            starts = (entry.starts[0] + lo,) + tuple(entry.starts[1:])
            cols = [pa.array(ix.astype(np.int64) + s) for ix, s in zip(nz, starts)]
            yield pa.record_batch(cols + [pa.array(part[nz])], schema=schema)


def _sparse_batches(entry, tile, schema, max_rows: int, fill: float = 0.0):
    """The nonzeros of a sparse tile (``-0.0`` entries are zeros, as a dense tile's)."""
    if isinstance(tile, CooTile):
        coords, values = tile.coords, tile.values
    else:
        coords = (np.repeat(np.arange(tile.shape[0]), np.diff(tile.indptr)), tile.indices)
        values = tile.data
    keep = np.flatnonzero(values != 0) if not fill else np.arange(values.size)
    for lo in range(0, keep.size, max_rows):
        part = keep[lo:lo + max_rows]
        cols = [pa.array(np.asarray(c)[part].astype(np.int64) + s)
                for c, s in zip(coords, entry.starts)]
        yield pa.record_batch(cols + [pa.array(np.asarray(values)[part])], schema=schema)


class TensorStream:
    """An Arrow stream source DuckDB can scan any number of times (a fresh stream each scan)."""

    def __init__(self, reader: TensorReader, max_rows: int = COO_ROWS) -> None:
        self.reader = reader
        self.max_rows = max_rows
        self.schema = arrow_schema(reader.meta)
        if reader.path is not None:
            reader.mapping()  # map now: the snapshot survives a later replace or drop

    def __arrow_c_schema__(self):
        return self.schema.__arrow_c_schema__()

    def __arrow_c_stream__(self, requested_schema=None):
        stream = pa.RecordBatchReader.from_batches(self.schema, self._batches())
        return stream.__arrow_c_stream__(requested_schema)

    def _batches(self):
        try:
            yield from coo_batches(self.reader, self.max_rows)
        except KeyboardInterrupt:  # DuckDB runs this and would report it as its own error
            note_interrupt()
            raise
        except Error as exc:  # a damaged tile: reported as itself, not as DuckDB's error
            note_stream_error(exc)
            raise


# Words of a query that lists tables (SHOW TABLES, information_schema.tables, duckdb_views()):
# every tensor is registered for it, so that tensors are listed before a query names them.
LISTINGS = frozenset({"tables", "information_schema", "duckdb_tables", "duckdb_views",
                      "duckdb_columns", "pg_catalog", "sqlite_master"})


def expose_tensors(store, query: str) -> list[str]:
    """Register every stored tensor that ``query`` names (all of them for a query that lists
    tables); returns their names."""
    wanted = referenced_names(query)
    every = not wanted.isdisjoint(LISTINGS)
    names = [m.name for m in store.list() if every or m.name.lower() in wanted]
    for name in names:
        try:
            store._register_view(name, TensorStream(store.open(name)))
        except Error:
            if name.lower() in wanted:
                raise
            # only listed: a damaged tensor (CHECK DATABASE names it) is listed with its
            # columns; a query that names it reads it, and fails then
            store._register_view(name, arrow_schema(store.meta(name)).empty_table())
    return names


_SQL_TYPE = {"float32": "FLOAT", "float64": "DOUBLE", "int32": "INTEGER", "int64": "BIGINT",
             "bool": "BOOLEAN"}


@contextlib.contextmanager
def standing_in(store, query: str):
    """Empty typed views in place of the tensors and Python objects ``query`` names, while
    DuckDB binds it to say what it writes: a plan that scans a Python Arrow stream (or a data
    frame) cannot be serialized, one over a view can. They are registered again afterwards."""
    wanted = referenced_names(query)
    names = [m for m in store.list() if m.name.lower() in wanted]
    shown = {m.name for m in names if m.name in store._views}
    objects = {n: obj for n, obj in {**store.registered, **store.scanning}.items()
               if n.lower() in wanted}
    stand_ins = []
    for meta in names:
        cols = [f"CAST(NULL AS BIGINT) AS {quote_ident(d)}" for d in meta.dims]
        cols.append(f"CAST(NULL AS {_SQL_TYPE.get(meta.dtype.name, 'DOUBLE')}) AS value")
        stand_ins.append((meta.name, cols))
    for name in objects:
        with translating():
            rel = store.duck.table(name)
            cols = [f"CAST(NULL AS {t}) AS {quote_ident(c)}" for c, t in zip(rel.columns, rel.types)]
        stand_ins.append((name, cols))
    try:
        for name, cols in stand_ins:
            with translating():
                store.duck.execute(f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS "
                                   f"SELECT {', '.join(cols)} WHERE FALSE")
        yield
    finally:
        for meta in names:  # the tensor again where it was shown (earlier relations read it)
            store._forget_view(meta.name)
            with contextlib.suppress(Exception), translating():
                store.duck.execute(f"DROP VIEW IF EXISTS temp.main.{quote_ident(meta.name)}")
            if meta.name in shown:
                store._register_view(meta.name, TensorStream(store.open(meta.name)))
        for name, obj in objects.items():  # and the objects
            with contextlib.suppress(Exception):
                store.duck.execute(f"DROP VIEW IF EXISTS temp.main.{quote_ident(name)}")
            with translating():
                store.duck.register(name, obj)
