"""The catalog tables in DuckDB (schema ``tensordb``) and the rows that describe a tensor.

    tensors(name, version, dtype, shape, dims, grid, nbytes, tile_count, nnz, density, created)
    tiles(tensor, version, coords, starts, shape, file, "offset", nbytes, nnz, crc32, nonfinite,
          format)

A tensor is one ``tensors`` row plus one ``tiles`` row per stored tile; absent tiles are zeros.
``nonfinite`` says whether a tile holds NaN or inf (NULL: not known, as in catalogs written before
the column existed; the planner then assumes it may): an absent tile's kernel calls are skipped
only when the partner tiles are finite (0 * inf is NaN).
Physical planning reads ``tiles`` through the tile join (physical/tilejoin.py), which joins
these rows in DuckDB.

Columns added after the first release go at the end, are nullable, and are added on open by
:func:`create` (``ADD COLUMN IF NOT EXISTS``: idempotent), so an older database opens and works;
rows are inserted BY NAME, so the order in which such columns were added does not matter.
``crc32`` is NULL for tiles written before checksums were recorded. ``format`` is the tile's
payload layout, 'dense' or a sparse one ('csr', 'coo': storage/sparse.py); NULL (a catalog
written before sparse tiles) reads as 'dense'.
"""
from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import pyarrow as pa

from ._duck import first_row
from .meta import TensorMeta
from .reader import TileEntry

__all__ = ["SCHEMA", "create", "exists", "has_column", "find", "all_metas", "tile_entries",
           "tile_entries_many", "payload_file", "payload_files",
           "insert", "replace", "store", "delete", "referenced_files", "versions", "max_version", "table_named", "tables_named"]

SCHEMA = "tensordb"

_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.tensors (
    name VARCHAR NOT NULL, version BIGINT NOT NULL, dtype VARCHAR NOT NULL,
    shape BIGINT[] NOT NULL, dims VARCHAR[] NOT NULL, grid BIGINT[][] NOT NULL,
    nbytes BIGINT NOT NULL, tile_count BIGINT NOT NULL, nnz BIGINT NOT NULL,
    density DOUBLE NOT NULL, created TIMESTAMP NOT NULL DEFAULT current_localtimestamp());
CREATE TABLE IF NOT EXISTS {SCHEMA}.tiles (
    tensor VARCHAR NOT NULL, version BIGINT NOT NULL, coords BIGINT[] NOT NULL,
    starts BIGINT[] NOT NULL, shape BIGINT[] NOT NULL, file VARCHAR NOT NULL,
    "offset" BIGINT NOT NULL, nbytes BIGINT NOT NULL, nnz BIGINT NOT NULL);
ALTER TABLE {SCHEMA}.tiles ADD COLUMN IF NOT EXISTS crc32 BIGINT;
ALTER TABLE {SCHEMA}.tiles ADD COLUMN IF NOT EXISTS nonfinite BOOLEAN;
ALTER TABLE {SCHEMA}.tiles ADD COLUMN IF NOT EXISTS format VARCHAR;
ALTER TABLE {SCHEMA}.tensors ADD COLUMN IF NOT EXISTS fill DOUBLE;
"""

_COLUMNS = "name, version, dtype, shape, dims, grid, nbytes, tile_count, nnz, density, fill"
# A catalog written before fill values (read-only, so the column could not be added) reads 0.
_OLD_COLUMNS = _COLUMNS.replace(", fill", ", 0.0 AS fill")

_TILES_SCHEMA = pa.schema([
    ("tensor", pa.string()), ("version", pa.int64()), ("coords", pa.list_(pa.int64())),
    ("starts", pa.list_(pa.int64())), ("shape", pa.list_(pa.int64())), ("file", pa.string()),
    ("offset", pa.int64()), ("nbytes", pa.int64()), ("nnz", pa.int64()), ("crc32", pa.int64()),
    ("nonfinite", pa.bool_()), ("format", pa.string())])


_FEW = 256  # up to this many tiles a tensor's rows are inserted from list parameters
_SQL_TYPES = {pa.string(): "VARCHAR[]", pa.int64(): "BIGINT[]", pa.list_(pa.int64()): "BIGINT[][]",
              pa.bool_(): "BOOLEAN[]"}


def create(duck) -> None:
    duck.execute(_DDL)


def exists(duck) -> bool:
    """Whether both catalog tables are there."""
    return duck.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name IN "
        "('tensors', 'tiles') AND database_name = current_database()", [SCHEMA]).fetchall()[0][0] == 2


def has_column(duck, table: str, column: str) -> bool:
    """Whether catalog ``table`` has ``column`` (a read-only open of an older database may not)."""
    return bool(duck.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND "
        "schema_name = ? AND table_name = ? AND column_name = ?", [SCHEMA, table, column]
    ).fetchall()[0][0])


def _first_value(cursor):
    row = first_row(cursor)
    return None if row is None else row[0]


def _meta(row) -> TensorMeta:
    name, version, dtype, shape, dims, grid, nbytes, tiles, nnz, density, fill = row
    return TensorMeta(name, int(version), np.dtype(dtype), tuple(shape), tuple(dims),
                      tuple(tuple(b) for b in grid), int(nbytes), int(tiles), int(nnz),
                      float(density), 0.0 if fill is None else float(fill))


def _select(duck, where: str, params=()):
    """The ``tensors`` rows ``where`` says, with their fill (0 in a catalog that predates it)."""
    try:
        return duck.execute(f"SELECT {_COLUMNS} FROM {SCHEMA}.tensors {where}", params)
    except duckdb.BinderException:
        return duck.execute(f"SELECT {_OLD_COLUMNS} FROM {SCHEMA}.tensors {where}", params)


def find(duck, name: str) -> TensorMeta | None:
    """The tensor called ``name`` (case-insensitive), or None."""
    row = first_row(_select(duck, "WHERE lower(name) = lower(?)", [name]))
    return None if row is None else _meta(row)


def all_metas(duck) -> list[TensorMeta]:
    rows = _select(duck, "ORDER BY lower(name)").fetchall()
    return [_meta(r) for r in rows]


def tile_entries(duck, meta: TensorMeta, optional: frozenset = frozenset(("crc32", "nonfinite", "format"))
                 ) -> tuple[str | None, list[TileEntry]]:
    """(payload file name, entries) of one tensor version. ``optional``: the columns added after
    the first release that this catalog has; the others read as NULL (a read-only open of an
    older database cannot add them)."""
    crc, nonfinite, fmt = (c if c in optional else "NULL"
                           for c in ("crc32", "nonfinite", "format"))
    rows = duck.execute(
        f'SELECT coords, starts, shape, file, "offset", nbytes, nnz, {crc}, {nonfinite}, {fmt} '
        f'FROM {SCHEMA}.tiles WHERE tensor = ? AND version = ? ORDER BY "offset"',
        [meta.name, meta.version]).fetchall()
    entries = [TileEntry(tuple(c), tuple(s), tuple(sh), int(o), int(nb), int(nz),
                         None if cs is None else int(cs), None if nf is None else bool(nf),
                         fm or "dense")
               for c, s, sh, _, o, nb, nz, cs, nf, fm in rows]
    return _one_or_parts([r[3] for r in rows], entries)


def _one_or_parts(files: list, entries: list) -> tuple[str | None, list]:
    """(file, entries) of a version whose tiles (``entries``, in offset order) lie in
    ``files``: one file; or, for a version written in parts by Dask workers (objparts.py),
    the first part's, with each entry naming its own (``TileEntry.file``)."""
    if not files:
        return None, entries
    if len(set(files)) == 1:
        return files[0], entries
    return files[0], [dataclasses.replace(e, file=f) for e, f in zip(entries, files)]


def payload_files(duck, meta: TensorMeta) -> list[str]:
    """Every payload file or object of one tensor version (several: written in parts)."""
    return [r[0] for r in duck.execute(f"SELECT DISTINCT file FROM {SCHEMA}.tiles WHERE "
                                       "tensor = ? AND version = ?",
                                       [meta.name, meta.version]).fetchall()]


def payload_file(duck, meta: TensorMeta) -> str | None:
    """The payload file of one tensor version (None: it stores no tile)."""
    return _first_value(duck.execute(f"SELECT file FROM {SCHEMA}.tiles WHERE tensor = ? AND version = ? "
                                    "LIMIT 1", [meta.name, meta.version]))


def tile_entries_many(duck, metas, optional: frozenset = frozenset(("crc32", "nonfinite", "format"))
                      ) -> dict[int, tuple[str | None, list[TileEntry]]]:
    """``tile_entries`` of several tensor versions in one query: version -> (file, entries)."""
    metas = list(metas)
    if not metas:
        return {}
    crc, nonfinite, fmt = (c if c in optional else "NULL"
                           for c in ("crc32", "nonfinite", "format"))
    rows = duck.execute(
        f'SELECT version, coords, starts, shape, file, "offset", nbytes, nnz, {crc}, {nonfinite}, '
        f'{fmt} '
        f'FROM {SCHEMA}.tiles WHERE (tensor, version) IN (SELECT (unnest(?), unnest(?))) '
        f'ORDER BY version, "offset"',
        [[m.name for m in metas], [m.version for m in metas]]).fetchall()
    out: dict[int, tuple[list, list]] = {m.version: ([], []) for m in metas}
    for v, c, s, sh, f, o, nb, nz, cs, nf, fm in rows:
        files, entries = out[v]
        files.append(f)
        entries.append(TileEntry(tuple(c), tuple(s), tuple(sh), int(o), int(nb), int(nz),
                                 None if cs is None else int(cs), None if nf is None else bool(nf),
                                 fm or "dense"))
    return {v: _one_or_parts(files, entries) for v, (files, entries) in out.items()}


def insert(duck, meta: TensorMeta, file: str, entries) -> None:
    """The rows of a new tensor: its ``tensors`` row and one ``tiles`` row per entry."""
    duck.execute(f"INSERT INTO {SCHEMA}.tensors ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 [meta.name, meta.version, meta.dtype.name, list(meta.shape), list(meta.dims),
                  [list(b) for b in meta.grid], meta.nbytes, meta.tile_count, meta.nnz,
                  meta.density, meta.fill])
    _insert_tiles(duck, meta, file, entries)


def store(duck, rows) -> None:
    """The rows of several tensors stored at once, each ``(old, meta, file, entries)``:
    ``old`` the version it replaces (None: a new tensor). Replacements that keep their name
    and layout (a training step's new weights) share three statements: one UPDATE of all
    their ``tensors`` rows, one DELETE of their old tile rows, one INSERT of the new ones. A
    DuckDB statement costs 0.3-1 ms whatever it does, and a step stored three tensors in
    eight. The others go one by one (``insert``, ``replace``)."""
    same = [r for r in rows if r[0] is not None and r[0].name == r[1].name
            and _same_layout(r[0], r[1])]
    if len(same) < 2:
        same = []
    for old, meta, file, entries in rows:
        if not any(r[1] is meta for r in same):
            if old is None:
                insert(duck, meta, file, entries)
            else:
                replace(duck, old, meta, file, entries)
    if not same:
        return
    marks = "(?::VARCHAR, ?::BIGINT, ?::BIGINT, ?::VARCHAR, ?::BIGINT, ?::BIGINT, ?::BIGINT, " \
            "?::DOUBLE, ?::DOUBLE)"
    duck.execute(
        f"UPDATE {SCHEMA}.tensors AS t SET version = v.new, dtype = v.dtype, nbytes = v.nbytes, "
        "tile_count = v.tile_count, nnz = v.nnz, density = v.density, fill = v.fill, "
        "created = current_localtimestamp() FROM (VALUES " + ", ".join([marks] * len(same))
        + ") AS v(name, old, new, dtype, nbytes, tile_count, nnz, density, fill) "
        "WHERE t.name = v.name AND t.version = v.old",
        [x for old, meta, _, _ in same for x in (
            old.name, old.version, meta.version, meta.dtype.name, meta.nbytes, meta.tile_count,
            meta.nnz, meta.density, meta.fill)])
    duck.execute(f"DELETE FROM {SCHEMA}.tiles WHERE "
                 + " OR ".join(["(tensor = ? AND version = ?)"] * len(same)),
                 [x for old, _, _, _ in same for x in (old.name, old.version)])
    count = sum(len(r[3]) for r in same)
    if 0 < count <= _FEWEST:
        _insert_rows(duck, [(meta, file, e) for _, meta, file, entries in same for e in entries])
    elif count:
        for _, meta, file, entries in same:
            _insert_tiles(duck, meta, file, entries)


def _same_layout(old: TensorMeta, meta: TensorMeta) -> bool:
    return old.shape == meta.shape and old.dims == meta.dims and old.grid == meta.grid


def replace(duck, old: TensorMeta, meta: TensorMeta, file: str, entries) -> None:
    """Swap version ``old`` of a tensor for ``meta``: its ``tensors`` row is updated in place (one
    statement where a delete and an insert would be two), its tile rows replaced (a single tile
    row updated in place too). The list columns (shape, dims, grid; a lone tile's coords, starts
    and shape) are set only where they change: a training step's new weights keep their layout,
    and DuckDB updates a row's scalars in a fraction of the time it takes to rewrite its lists."""
    layout = _same_layout(old, meta)
    sets = "version = ?, dtype = ?, nbytes = ?, tile_count = ?, nnz = ?, density = ?, fill = ?"
    params = [meta.version, meta.dtype.name, meta.nbytes, meta.tile_count, meta.nnz, meta.density,
              meta.fill]
    if old.name != meta.name:
        sets, params = sets + ", name = ?", params + [meta.name]
    if not layout:
        sets += ", shape = ?, dims = ?, grid = ?"
        params += [list(meta.shape), list(meta.dims), [list(b) for b in meta.grid]]
    duck.execute(f"UPDATE {SCHEMA}.tensors SET {sets}, created = current_localtimestamp() "
                 "WHERE name = ? AND version = ?", params + [old.name, old.version])
    if len(entries) == 1 and old.tile_count == 1:  # one tile row for another: update it in place
        e = entries[0]
        sets = 'tensor = ?, version = ?, file = ?, "offset" = ?, nbytes = ?, nnz = ?, crc32 = ?, ' \
            'nonfinite = ?, format = ?'
        params = [meta.name, meta.version, e.file or file, e.offset, e.nbytes, e.nnz, e.crc32,
                  e.nonfinite, e.format]
        if not (layout and meta.total_tiles == 1):  # else the lone tile is the whole tensor
            sets += ", coords = ?, starts = ?, shape = ?"
            params += [list(e.coords), list(e.starts), list(e.shape)]
        n = duck.execute(f"UPDATE {SCHEMA}.tiles SET {sets} WHERE tensor = ? AND version = ?",
                         params + [old.name, old.version]).fetchall()
        if n and n[0][0] == 1:
            return
        # tile_count disagreed with the rows (a damaged catalog): delete both versions' rows
        duck.execute(f"DELETE FROM {SCHEMA}.tiles WHERE tensor = ? AND version IN (?, ?)",
                     [meta.name, old.version, meta.version])
    else:
        duck.execute(f"DELETE FROM {SCHEMA}.tiles WHERE tensor = ? AND version = ?",
                     [old.name, old.version])
    _insert_tiles(duck, meta, file, entries)


_TILE_COLUMNS = ", ".join(f'"{f.name}"' for f in _TILES_SCHEMA)
_FEWEST = 16  # up to this many tiles the rows are one VALUES list of parameters


def _insert_tiles(duck, meta: TensorMeta, file: str, entries) -> None:
    if not entries:
        return
    if len(entries) <= _FEWEST:  # plain row parameters: DuckDB binds them fastest
        _insert_rows(duck, [(meta, file, e) for e in entries])
        return
    if len(entries) <= _FEW:  # list parameters: no Arrow table to build and register
        lists = [[meta.name] * len(entries), [meta.version] * len(entries),
                 [list(e.coords) for e in entries], [list(e.starts) for e in entries],
                 [list(e.shape) for e in entries], [e.file or file for e in entries],
                 [e.offset for e in entries], [e.nbytes for e in entries],
                 [e.nnz for e in entries], [e.crc32 for e in entries],
                 [e.nonfinite for e in entries], [e.format for e in entries]]
        values = ", ".join(f"unnest(?::{_SQL_TYPES[f.type]})" for f in _TILES_SCHEMA)
        duck.execute(f"INSERT INTO {SCHEMA}.tiles ({_TILE_COLUMNS}) SELECT {values}", lists)
        return
    rows = pa.Table.from_pydict({
        "tensor": [meta.name] * len(entries), "version": [meta.version] * len(entries),
        "coords": [list(e.coords) for e in entries], "starts": [list(e.starts) for e in entries],
        "shape": [list(e.shape) for e in entries], "file": [e.file or file for e in entries],
        "offset": [e.offset for e in entries], "nbytes": [e.nbytes for e in entries],
        "nnz": [e.nnz for e in entries], "crc32": [e.crc32 for e in entries],
        "nonfinite": [e.nonfinite for e in entries], "format": [e.format for e in entries]},
        schema=_TILES_SCHEMA)
    view = f"__tensordb_rows_{meta.version}"
    duck.register(view, rows)
    try:
        duck.execute(f"INSERT INTO {SCHEMA}.tiles BY NAME SELECT * FROM {view}")
    finally:
        duck.unregister(view)


def _insert_rows(duck, rows) -> None:
    """Tile rows ``(meta, file, entry)``, of one tensor or several, as one VALUES list."""
    marks = "(" + ", ".join("?" * len(_TILES_SCHEMA)) + ")"
    params = [x for meta, file, e in rows for x in (
        meta.name, meta.version, list(e.coords), list(e.starts), list(e.shape), e.file or file,
        e.offset, e.nbytes, e.nnz, e.crc32, e.nonfinite, e.format)]
    duck.execute(f"INSERT INTO {SCHEMA}.tiles ({_TILE_COLUMNS}) VALUES "
                 + ", ".join([marks] * len(rows)), params)


def delete(duck, meta: TensorMeta) -> None:
    duck.execute(f"DELETE FROM {SCHEMA}.tiles WHERE tensor = ? AND version = ?",
                 [meta.name, meta.version])
    duck.execute(f"DELETE FROM {SCHEMA}.tensors WHERE name = ? AND version = ?",
                 [meta.name, meta.version])


def referenced_files(duck) -> set[str]:
    return {r[0] for r in duck.execute(f"SELECT DISTINCT file FROM {SCHEMA}.tiles").fetchall()}


def versions(duck) -> set[int]:
    """The versions of the stored tensors."""
    return {int(r[0]) for r in duck.execute(f"SELECT version FROM {SCHEMA}.tensors").fetchall()}


def max_version(duck) -> int:
    return int(duck.execute(f"SELECT coalesce(max(version), 0) FROM {SCHEMA}.tensors").fetchall()[0][0])


def table_named(duck, name: str) -> str | None:
    """The user table or view in the main schema whose name equals ``name`` ignoring case."""
    return tables_named(duck, [name]).get(name.lower())


def tables_named(duck, names) -> dict[str, str]:
    """The user tables and views in the main schema named like one of ``names`` (ignoring
    case): lower-cased name -> the table's own spelling. One query for all of them."""
    wanted = sorted({n.lower() for n in names})
    rows = duck.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND list_contains(?, lower(table_name)) "
        "UNION ALL SELECT view_name FROM duckdb_views() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND NOT temporary AND NOT internal "
        "AND list_contains(?, lower(view_name))", [wanted, wanted]).fetchall()
    return {r[0].lower(): r[0] for r in reversed(rows)}  # a table before a view of that name


# -- relations for the tile join ------------------------------------------------------------------
#
