"""Hints for DuckDB's errors that speak of the user's database, not DuckDB's.

DuckDB suggests the closest name it knows, which for a misspelt table is often one of its own
catalog tables (``Did you mean "pg_depend"?``). Its suggestion is kept only when it names a user
table, view or tensor; otherwise the closest user name is suggested, or none. A syntax error at
or next to a misspelt keyword (``SELCT 1``) gets a did-you-mean hint, as unknown functions do.

>>> e = improve(Error('syntax error at or near "SELCT"'), "SELCT 1", ["A"])
>>> e.hint
'did you mean SELECT?'
>>> e = improve(Error('Table with name Nowhre does not exist!\\nDid you mean "pg_depend"?'),
...             "SELECT * FROM Nowhre", ["Nowhere", "A"])
>>> e.message, e.hint
('Table with name Nowhre does not exist!', 'did you mean "Nowhere"?')
"""
from __future__ import annotations

import difflib
import functools
import re

import duckdb

from ..errors import Error, closest_keyword

__all__ = ["improve", "user_names", "keywords", "reader_note"]

_DID_YOU_MEAN = re.compile(r'\n?Did you mean "([^"\n]+)"\?')
_SYNTAX = re.compile(r'syntax error at or near "([^"\n]+)"')
# A missing relation; DuckDB's suggestions for functions, types and settings are kept as they are.
_MISSING = re.compile(r'\b(?:Table|View) with name "?([^"\s!]+)"? does not exist')
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Words of tensordb's statements that DuckDB does not reserve.
_OURS = ("TENSOR", "TENSORS", "LOAD", "LET", "SHOW", "DESCRIBE", "EXPLAIN", "ANALYZE", "COPY",
         "CHECK", "DATABASE", "INSERT", "UPDATE", "DELETE", "VALUES", "SUMMARIZE", "PRAGMA",
         "ATTACH", "DETACH", "INSTALL", "REPLACE", "EXISTS", "INDEX", "VALUE", "SHAPE", "TILE",
         "FORMAT", "BEGIN", "COMMIT", "ROLLBACK", "TRANSACTION", "DROP", "ALTER", "SET", "VIEW",
         "TABLES", "EINSUM")


@functools.lru_cache(maxsize=1)
def keywords() -> frozenset[str]:
    """DuckDB's reserved keywords and the words of tensordb's statements, upper case."""
    with duckdb.connect() as duck:
        rows = duck.execute("SELECT keyword_name FROM duckdb_keywords() "
                            "WHERE keyword_category = 'reserved'").fetchall()
    return frozenset(r[0].upper() for r in rows) | frozenset(_OURS)


def user_names(store) -> list[str]:
    """Tensors and the user's tables and views (never DuckDB's or tensordb's catalog tables).
    Best effort: this runs while an error is being reported (perhaps in an aborted transaction),
    and must not replace that error with its own."""
    try:
        names = [m.name for m in store.list()]
        with store.lock:
            rows = store.duck.execute(
                "SELECT table_name FROM duckdb_tables() WHERE NOT internal AND schema_name = 'main' "
                "UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal "
                "AND schema_name = 'main'").fetchall()
    except (duckdb.Error, Error):
        return []
    seen = {n.lower() for n in names}
    return names + [r[0] for r in rows if r[0].lower() not in seen]


def _close(word: str, candidates, cutoff: float) -> str | None:
    by_lower = {c.lower(): c for c in candidates}
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[found[0]] if found else None


def improve(exc: Error, query: str, names) -> Error:
    """``exc`` with DuckDB's foreign suggestions replaced and keyword hints added; returns it.
    ``names``: the user's tensors, tables and views (a list, or a function returning one)."""
    message = exc.message
    missing = _MISSING.search(message)
    if missing:
        all_names = names() if callable(names) else names
        m = _DID_YOU_MEAN.search(message)
        if m:
            message = (message[:m.start()] + message[m.end():])
        suggestion = m.group(1).split(".")[-1] if m else None
        if suggestion is not None and suggestion.lower() not in {n.lower() for n in all_names}:
            suggestion = None
        if suggestion is None:
            suggestion = _close(missing.group(1), all_names, 0.7)
        if suggestion and exc.hint is None:
            exc.hint = f'did you mean "{suggestion}"?'
        _set_message(exc, message)
        return exc
    syntax = _SYNTAX.search(message)
    if syntax and exc.hint is None:
        hint = _keyword_hint(syntax.group(1), query, message)
        if hint:
            exc.hint = f"did you mean {hint}?"
    return exc


_CARET = re.compile(r"LINE (\d+): ([^\n]*)\n( *)\^")


def _caret_offset(query: str, message: str) -> int | None:
    """Where DuckDB's caret points in ``query`` (None when it does not say)."""
    m = _CARET.search(message)
    if not m:
        return None
    line_no, shown = int(m.group(1)), m.group(2)
    col = len(m.group(3)) - len(f"LINE {line_no}: ")
    lines = query.split("\n")
    if not 1 <= line_no <= len(lines):
        return None
    if shown.startswith("..."):  # a long line, shown in a window
        found = lines[line_no - 1].find(shown[3:].rstrip(".")[:30])
        col = col - 3 + max(found, 0)
    return sum(len(l) + 1 for l in lines[:line_no - 1]) + col


def _keyword_hint(near: str, query: str, message: str) -> str | None:
    """The keyword a misspelt word at the error was meant to be: the word DuckDB stopped at, or
    the one before it (``SELECT * FORM t`` stops at t)."""
    kws = keywords()
    caret = _caret_offset(query, message)
    if caret is None:
        found = re.search(r"\b" + re.escape(near) + r"\b", query)
        caret = found.start() if found else len(query)
    before = [w.group() for w in _WORD.finditer(query) if w.end() <= caret]
    for word in [near] + before[-1:]:
        if not _WORD.fullmatch(word) or word.upper() in kws:
            continue
        close = closest_keyword(word.upper(), kws)
        if close:
            return close
    return None


def reader_note(exc: Error, store) -> Error:
    """A read-only connection holds a copy of the tensors' catalog only (storage/readview.py)
    and reads the database's own DuckDB tables and views from ``catalog.duckdb`` while no
    writer holds it: a missing relation that is one of them (or may be, where the reader does
    not know their names) says that readers do not see them while a writer has it open."""
    view = getattr(store, "view", None)
    missing = _MISSING.search(exc.message) if view is not None else None
    if missing is None:
        return exc
    name = missing.group(1).split(".")[-1]
    known = view.user_tables
    if known is not None and name.lower() not in known:
        return exc  # missing from the database too
    first, _, rest = exc.message.partition("\n")
    if known is not None:
        first = (f"Table with name {name} is not visible to a read-only connection now: it is "
                 "one of the database's own DuckDB tables or views, and while a writer has "
                 "the database open a reader sees the database's tensors only")
    else:
        first = (f"{first.rstrip('!')}: while a writer has the database open, a read-only "
                 "connection sees the database's tensors only, not its own DuckDB tables or "
                 f"views (if {name} is one of them)")
    _set_message(exc, first + ("\n" + rest if rest else ""))
    if exc.hint is None:
        exc.hint = ("query its tables once the writer closes (a reader reads them from "
                    "catalog.duckdb while no writer holds it), through the writer's connection, "
                    "or copy the table into a tensor")
    return exc


def _set_message(exc: Error, message: str) -> None:
    exc.message = message.rstrip()
    exc.args = (exc.message,)
