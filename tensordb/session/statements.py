"""The statements that are not einsums: DDL on tensors, SHOW/DESCRIBE, COPY, CHECK, SET, plain
SQL."""
from __future__ import annotations

import difflib
import re
from dataclasses import fields

import numpy as np

from ..config import Settings, format_bytes
from ..errors import BinderError, CatalogError, Error, ParserError, Span
from ..result import Result
from ..storage import quote_ident
from ..storage.arrays import create_zeros
from ..storage.meta import MAX_DIMS
from ..dialect import ast as A
from ..dialect.lexer import words
from .letsql import let_relations

__all__ = ["run", "DTYPES", "sql_with_parameters", "position_from_message"]

DTYPES = {
    "float32": "float32", "float": "float32", "real": "float32", "float4": "float32",
    "float64": "float64", "double": "float64", "float8": "float64",
    "int32": "int32", "int": "int32", "integer": "int32", "int4": "int32",
    "int64": "int64", "bigint": "int64", "int8": "int64", "long": "int64",
    "bool": "bool", "boolean": "bool",
}
_SETTINGS = [f.name for f in fields(Settings)]


def run(con, script: str, stmt: A.Statement, text: str) -> Result:
    handler = _HANDLERS[type(stmt)]
    return handler(con, script, stmt, text)


def _err(cls, script, span, message, hint=None) -> Error:
    return cls(message, statement=script, span=span, hint=hint)


# -- CREATE TENSOR (zeros) ----------------------------------------------------------------------

def _create(con, script, s: A.CreateStmt, text) -> Result:
    dtype = DTYPES.get(s.dtype.lower())
    if dtype is None:
        raise _err(BinderError, script, s.dtype_span, f"unknown type '{s.dtype}'",
                   hint="types: FLOAT32, FLOAT64 (DOUBLE), INT32, INT64 (BIGINT), BOOL (BOOLEAN)")
    if len(s.dims) > MAX_DIMS:
        raise _err(BinderError, script, s.dims[MAX_DIMS].span, f"tensor '{s.name}' would have "
                   f"{len(s.dims)} dimensions; numpy supports at most {MAX_DIMS}")
    named = [d.name is not None for d in s.dims]
    if any(named) and not all(named):
        bad = next(d for d in s.dims if d.name is None)
        raise _err(BinderError, script, bad.span, "name every dimension or none")
    dims = [d.name for d in s.dims] if all(named) else None
    for k, d in enumerate(s.dims):
        if dims and d.name in dims[:k]:
            raise _err(BinderError, script, d.span, f"dimension '{d.name}' is named twice")
    shape = tuple(d.size for d in s.dims)
    if con.store.has(s.name):
        if s.if_not_exists and not s.replace:
            return Result.status(f"tensor {s.name} exists: nothing done", text)
        if not s.replace:
            raise _err(CatalogError, script, s.name_span, f"tensor '{s.name}' already exists",
                       hint=f"CREATE OR REPLACE TENSOR {s.name} ... replaces it")
    tile = tile_shape(script, s.tile, shape, dims) if s.tile else None
    create_zeros(con.store, s.name, shape, dtype, tile=tile, dims=dims, replace=s.replace)
    return Result.status(f"CREATE TENSOR {s.name}: {dtype} {shape}", text)


def tile_shape(script: str, values, shape, dims) -> tuple[int, ...]:
    """TILE (i 512, k 1024) or TILE (512, 1024) -> one tile extent per dimension (``shape`` is
    None when not known yet, as for LOAD)."""
    if all(p.label is None for p in values):
        if shape is not None and len(values) != len(shape):
            raise _err(BinderError, script, values[0].span, f"TILE gives {len(values)} extent(s) for "
                       f"{len(shape)} dimension(s)")
        out = [p.value for p in values]
    else:
        if dims is None:
            raise _err(BinderError, script, values[0].span, "TILE names dimensions, but the tensor's "
                       "dimensions have no names",
                       hint="write TILE (512, 1024), or name the dimensions: LOAD TENSOR B (i, j) ...")
        out = list(shape) if shape is not None else [None] * len(dims)
        given = set()
        for p in values:
            if p.label is None:
                raise _err(BinderError, script, p.span, "name every TILE extent or none")
            if p.label not in dims:
                raise _err(BinderError, script, p.span, f"TILE names '{p.label}', which is not a "
                           f"dimension", hint=f"dimensions: {', '.join(dims)}")
            if p.label in given:
                raise _err(BinderError, script, p.span, f"TILE gives '{p.label}' twice")
            given.add(p.label)
            out[dims.index(p.label)] = p.value
        if None in out:  # the shape is not known before loading: every extent is needed
            missing = [d for d, t in zip(dims, out) if t is None]
            raise _err(BinderError, script, values[0].span,
                       f"TILE needs an extent for every dimension; missing: {', '.join(missing)}")
    for p in values:
        if p.value < 1:
            raise _err(BinderError, script, p.span, f"tile extents must be positive, got {p.value}")
    return tuple(out) if not shape else tuple(min(t, n) for t, n in zip(out, shape))


# -- LOAD TENSOR / CREATE TENSOR ... FROM ---------------------------------------------------------

def _load(con, script, s: A.LoadStmt, text) -> Result:
    if con.store.has(s.name) and not s.replace:
        raise _err(CatalogError, script, s.name_span, f"tensor '{s.name}' already exists",
                   hint="CREATE OR REPLACE TENSOR ... FROM (or LOAD OR REPLACE TENSOR) replaces it")
    dims = [d.name for d in s.dims] if s.dims else (list(s.index) if s.index else None)
    tile = tile_shape(script, s.tile, None, dims) if s.tile else None
    options = dict(tile=tile, replace=s.replace, dims=dims, format=s.format)
    for key in ("array", "index", "value", "shape", "duplicates"):
        if getattr(s, key) is not None:
            options[key] = list(getattr(s, key)) if isinstance(getattr(s, key), tuple) else getattr(s, key)
    if s.fill is not None:
        options["fill_value"] = s.fill
    if s.path is not None:
        source = s.path
    elif s.query is not None:
        source, options["query"] = None, s.query
    else:
        source, options["query"] = None, f"SELECT * FROM {quote_ident(s.table)}"
    try:
        metas = con.engine.load(s.name, source, **options)
    except Error as exc:
        if exc.hint and "format=" in exc.hint:  # the Python API's words; say it in SQL
            exc.hint = "add FORMAT NPY | NPZ | PARQUET | CSV"
        raise exc.with_source(script, s.source_span)
    if len(metas) == 1:
        return Result.for_tensor(con, metas[0].name, text)
    # a .npz file loaded whole: one tensor per array, named <name>_<array>
    loaded = "; ".join(f"{m.name} {np.dtype(m.dtype).name} {tuple(m.shape)}" for m in metas)
    return Result.status(f"LOAD TENSOR {s.name}: loaded {len(metas)} tensors: {loaded}", text)


# -- SHOW, DESCRIBE, DROP, COPY, SET ------------------------------------------------------------

def _show_tensors(con, script, s, text) -> Result:
    rows = con.tensors()
    cols = ["name", "shape", "dtype", "dims", "tile_shape", "tile_count", "total_tiles", "density",
            "bytes"]
    return Result.rows(cols, [tuple(r.get(c) for c in cols) for r in rows], text)


def _setting_value(con, name):
    """A setting as it would be typed: ``on``/``off``, ``2GB`` (the largest unit that divides
    the size exactly; else rounded, as ``18.8 GiB``)."""
    value = getattr(con.settings, name)
    if isinstance(value, bool):
        return "on" if value else "off"
    if name == "memory_limit":
        if value is None:
            return "none"
        for unit, size in (("TiB", 2**40), ("TB", 10**12), ("GiB", 2**30), ("GB", 10**9),
                           ("MiB", 2**20), ("MB", 10**6), ("KiB", 2**10), ("kB", 10**3)):
            if value >= size and value % size == 0:
                return f"{value // size}{unit}"
        return format_bytes(value)
    return value


def _show_setting(con, script, s: A.ShowSettingStmt, text) -> Result:
    names = _SETTINGS if s.name is None else [s.name]
    return Result.rows(["name", "value"], [(n, _setting_value(con, n)) for n in names], text)


def _table_or_error(con, script, name: str, span: Span) -> None:
    """DESCRIBE and COPY of a name that is no tensor: fine if it is a table, else say so."""
    rows = sql_with_parameters(con, "SELECT 1 FROM information_schema.tables WHERE "
                               "lower(table_name) = lower(?)", [name]).fetchall()
    if not rows:
        known = [m["name"] for m in con.tensors()][:12]
        raise _err(CatalogError, script, span, f"no tensor or table named '{name}'",
                   hint=f"tensors: {', '.join(known)}" if known else None)


def _describe(con, script, s: A.DescribeStmt, text) -> Result:
    if not con.store.has(s.name):
        _table_or_error(con, script, s.name, s.name_span)
        return _sql(con, script, A.SqlStmt(text, s.span), text)  # DESCRIBE <table>
    info = con.describe(s.name)
    rows = [(k, v) for k, v in info.items() if k != "dimensions"]
    for d in info.get("dimensions", ()):
        rows.append((f"dimension {d['name']}", f"size {d['size']}, tile {d['tile']}, "
                     f"{d['tiles']} tile(s)"))
    return Result.rows(["property", "value"], rows, text)


def _drop(con, script, s: A.DropStmt, text) -> Result:
    if s.if_exists and not con.store.has(s.name):  # as psql: say that nothing was dropped
        return Result.status(f"DROP TENSOR: no tensor named '{s.name}', nothing dropped", text)
    try:
        con.drop(s.name, if_exists=s.if_exists)
    except Error as exc:
        raise exc.with_source(script, s.name_span)
    return Result.status(f"DROP TENSOR {s.name}", text)


def _copy(con, script, s: A.CopyStmt, text) -> Result:
    if not con.store.has(s.name):
        _table_or_error(con, script, s.name, s.name_span)
        return _sql(con, script, A.SqlStmt(text, s.span), text)  # COPY <table> TO ...
    try:
        con.export(s.name, s.path, format=s.format)
    except Error as exc:  # point at the path when the statement spells it out
        at = script.find(s.path, s.span.start, s.span.end)
        raise exc.with_source(script, Span(at, at + len(s.path)) if at >= 0 else s.span)
    return Result.status(f"COPY {s.name} TO '{s.path}'", text)


def _check(con, script, s: A.CheckStmt, text) -> Result:
    from ..storage.integrity import COLUMNS
    try:
        rows = [tuple(r.values()) for r in con.check(s.name)]
    except Error as exc:
        raise exc.with_source(script, s.name_span or s.span)
    return Result.rows(COLUMNS, rows, text)


def _set(con, script, s: A.SetStmt, text) -> Result:
    try:  # the connection checks the value (a strategy, an executor): the caret goes under the SET
        con.set(s.name, s.value)
    except Error as exc:
        raise exc.with_source(script, s.span) from None
    # echoed as typed ('2GB', off); a DEFAULT says what it stands for
    head = words(script, s.span.start, s.span.end, 3)
    typed = script[head[2].start + len(head[2].text):s.span.end].strip() if len(head) == 3 else \
        str(s.value)
    shown = f"{typed} ({_setting_value(con, s.name)})" if Settings.is_default(s.name, s.value) \
        else typed
    return Result.status(f"SET {s.name} = {shown}", text)


# -- plain SQL ---------------------------------------------------------------------------------

# Statements whose DuckDB result is only a row count: shown as a status, like psql does.
_COUNTED = {"CREATE", "INSERT", "UPDATE", "DELETE", "DROP", "ALTER", "COPY", "ATTACH", "DETACH",
            "INSTALL", "LOAD", "USE", "CHECKPOINT", "VACUUM", "SET", "RESET", "TRUNCATE"}


def _bare_name(con, script, s: A.SqlStmt) -> Result | None:
    """``P;``: a statement that is only a tensor's name prints the tensor (as in numpy's REPL).
    Any other single word is DuckDB's (CHECKPOINT, VACUUM, ...)."""
    head = words(script, s.span.start, s.span.end, 2)
    if len(head) != 1 or not (head[0].text[:1].isalpha() or head[0].text[:1] == "_") \
            or not head[0].text.replace("_", "").isalnum():
        return None
    if con.store.has(head[0].text):
        return Result.for_tensor(con, con.store.meta(head[0].text).name, s.text)
    return None


def _unknown_bare_name(con, script, s: A.SqlStmt, exc: Error) -> Error:
    """A single word that is neither a tensor nor SQL: say which names exist."""
    head = words(script, s.span.start, s.span.end, 2)
    if len(head) != 1 or not (head[0].text[:1].isalpha() or head[0].text[:1] == "_"):
        return exc
    name = head[0].text
    known = [m["name"] for m in con.tensors()]
    close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    hint = f"did you mean '{known[[k.lower() for k in known].index(close[0])]}'?" if close else \
        f"tensors: {', '.join(known[:12])}" if known else "the database holds no tensors yet"
    return _err(CatalogError, script, Span(head[0].start, head[0].start + len(name)),
                f"no tensor named '{name}' (a statement that is only a name prints that tensor)",
                hint=hint)


def _sql(con, script, s: A.SqlStmt, text) -> Result:
    shown = _bare_name(con, script, s)
    if shown is not None:
        return shown
    with let_relations(con, script, s):  # the LETs it names, for this statement (letsql.py)
        return _run_sql(con, script, s, text)


def _run_sql(con, script, s: A.SqlStmt, text) -> Result:
    try:
        rel = con.sql(s.text)
        head = words(script, s.span.start, s.span.end, 4)
        n_verb = 1 if head and head[0].upper not in ("CREATE", "DROP", "ALTER") else \
            4 if len(head) > 1 and head[1].upper == "OR" else 2
        verb = " ".join(w.upper for w in head[:n_verb])
        if rel is not None and head and head[0].upper in _COUNTED and rel.columns in (["Count"], ["Success"]):
            rows = rel.fetchall()
            row = rows[0] if rows else None
            n = int(row[0]) if row and isinstance(row[0], int) else None
            r = Result.status(verb if not n else f"{verb}: {n} row{'s' if n != 1 else ''}", text)
            r.count = n
            return r.with_rows(rel.columns, rows, [str(t) for t in rel.types])
        return Result.from_relation(rel, text)
    except Error as exc:
        if isinstance(exc, ParserError) and len(words(script, s.span.start, s.span.end, 2)) == 1:
            raise _unknown_bare_name(con, script, s, exc) from None
        _our_show_or_set(script, s, exc)
        raise position_from_message(exc, script, s.span)


def _our_show_or_set(script, s: A.SqlStmt, exc: Error) -> None:
    """``SHOW TENSRS`` and ``SET worker = 2`` reach DuckDB (they are not ours as written); when
    DuckDB fails, hint at the statement of ours that was probably meant."""
    head = words(script, s.span.start, s.span.end, 3)
    if exc.hint is not None or len(head) < 2 or head[0].upper not in ("SHOW", "SET"):
        return
    word = head[1].text
    options = list(_SETTINGS) + (["TENSORS", "ALL", "TABLES"] if head[0].upper == "SHOW" else [])
    close = difflib.get_close_matches(word.lower(), [o.lower() for o in options], n=1, cutoff=0.75)
    if close:
        meant = options[[o.lower() for o in options].index(close[0])]
        exc.hint = f"did you mean {head[0].upper} {meant}?"


def sql_with_parameters(con, query: str, parameters) -> Result:
    from ..sqlfront.relations import sql
    cols, rows, types = sql(con.store, query, parameters)
    head = words(query, 0, len(query), 1)
    if head and head[0].upper in _COUNTED and cols == ["Count"] and len(rows) == 1:
        n = int(rows[0][0])  # INSERT ... VALUES (?): a status with the count, as without ?
        r = Result.status(f"{head[0].upper}: {n} row{'s' if n != 1 else ''}", query)
        r.count = n
        return r.with_rows(cols, rows, types)
    return Result.rows(cols, rows, query, types) if cols else Result.status("OK", query)


_DUCK_CARET = re.compile(r"\n*LINE (\d+): ([^\n]*)\n( *)\^[^\n]*")


def position_from_message(exc: Error, script: str, span: Span) -> Error:
    """DuckDB puts its own caret in the message; turn it into our span into the script."""
    if exc.span is not None:  # refused by tensordb (guard.py): its span is in the SQL statement
        return exc.with_source(script, span)
    m = _DUCK_CARET.search(exc.message)
    pos = span.start
    if m:
        line_no, shown, pad = int(m.group(1)), m.group(2), len(m.group(3))
        col = pad - len(f"LINE {line_no}: ")
        text = script[span.start:span.end]
        lines = text.split("\n")
        if 1 <= line_no <= len(lines):
            line_start = sum(len(l) + 1 for l in lines[:line_no - 1])
            line = lines[line_no - 1]
            if shown.startswith("..."):
                # DuckDB elides long lines: find the shown text to learn the offset
                at = line.find(shown[3:].rstrip(".")[:30])
                col = col - 3 + (at if at >= 0 else 0)
            pos = span.start + line_start + max(0, min(col, len(line)))
        exc.message = (exc.message[:m.start()] + exc.message[m.end():]).strip()
        exc.args = (exc.message,)
    else:  # no caret from DuckDB (its binder errors): point at the first name the message quotes
        text = script[span.start:span.end].lower()
        for quoted in (a or b for a, b in _QUOTED.findall(exc.message)):
            at = text.find(quoted.lower())
            if quoted and at >= 0:
                pos = span.start + at
                break
    return exc.with_source(script, Span(pos, min(pos + 1, span.end)) if pos < span.end else span)


_QUOTED = re.compile(r'"([^"\n]+)"|with name (\w+)')


_HANDLERS = {
    A.CreateStmt: _create, A.LoadStmt: _load, A.ShowTensorsStmt: _show_tensors,
    A.ShowSettingStmt: _show_setting, A.DescribeStmt: _describe, A.DropStmt: _drop,
    A.CopyStmt: _copy, A.CheckStmt: _check, A.SetStmt: _set, A.SqlStmt: _sql,
}
