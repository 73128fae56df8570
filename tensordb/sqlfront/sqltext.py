"""What DuckDB's own parser and binder say about a piece of SQL text: its statements (and their
types), the one statement inside an EXPLAIN ANALYZE or a PREPARE, its tokens, and its bound
logical plan as JSON. tensordb parses no SQL itself; guard.py decides from these what to refuse.
"""
from __future__ import annotations

import json

import duckdb

from ..errors import ProgrammingError
from ..storage import translate, translating
from ..storage.views import standing_in

__all__ = ["statements", "single_statement", "single_select", "bound_plan", "strings", "words",
           "explained", "prepared"]

_T = duckdb.StatementType
# Plans DuckDB cannot serialize although they run: pragma calls (PRAGMA enable_profiling; the
# file it writes is a setting, checked when it was set). An assignment (PRAGMA x = ...) is a SET.
_UNBOUND_OK = {_T.PRAGMA}


def statements(query: str) -> list:
    """DuckDB's own split of ``query`` into statements (a ParserError when it does not parse)."""
    if not isinstance(query, str):
        raise ProgrammingError(f"SQL must be a string, got {type(query).__name__}")
    with translating():
        return duckdb.extract_statements(query)


def single_statement(text: str, what: str):
    """The one statement in ``text``; ProgrammingError when there are none or several."""
    stmts = statements(text)
    if len(stmts) != 1:
        raise ProgrammingError(f"{what} must be exactly one SQL statement, got {len(stmts)}",
                               hint="a ';' inside the text ends the statement")
    return stmts[0]


def single_select(text: str, what: str) -> str:
    """``text`` when DuckDB parses it as exactly one SELECT (WITH, VALUES, FROM-first and set
    operations included); else a ProgrammingError. Only such text may be spliced into a larger
    statement, where it is wrapped as ``(text\\n)``."""
    stmt = single_statement(text, what)
    if stmt.type != _T.SELECT:
        raise ProgrammingError(f"{what} must be a SELECT query, got a {stmt.type.name} statement")
    return text.strip().rstrip(";").strip()


# Plan errors that mean the statement cannot run at all (raised as running it would raise them).
_UNRUNNABLE = {"binder": duckdb.BinderException, "catalog": duckdb.CatalogException,
               "parser": duckdb.ParserException, "conversion": duckdb.ConversionException,
               "io": duckdb.IOException}


def bound_plan(store, stmt, refuse_unknown: bool = True):
    """DuckDB's logical plan of ``stmt`` as JSON (None for the types it cannot serialize but
    that write nothing themselves, or for any such type when not ``refuse_unknown``)."""
    with standing_in(store, stmt.query), translating():
        text = store.duck.execute("SELECT json_serialize_plan(?)", [stmt.query]).fetchall()[0][0]
    plan = json.loads(text)
    if not plan.get("error"):
        return plan
    kind, message = plan.get("error_type", ""), plan.get("error_message", "")
    if stmt.type in _UNBOUND_OK or (not refuse_unknown and kind not in _UNRUNNABLE):
        return None
    if kind in _UNRUNNABLE:  # it cannot run at all: DuckDB's own error, as running it would give
        raise translate(_UNRUNNABLE[kind](message))
    raise ProgrammingError(
        f"{stmt.type.name} statement refused: tensordb cannot tell where it writes ({message})",
        hint="write the query's result to a table first (CREATE TABLE t AS ...), then COPY t, "
             "or use COPY <tensor> TO '<path>'")


def strings(value):
    """Every string inside a serialized DuckDB value (lists, structs, maps)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, dict):
        if value.get("is_null"):
            return
        for key in ("value", "children"):
            if key in value:
                yield from strings(value[key])


def words(text: str) -> list[tuple[int, str, bool]]:
    """(position, lower-cased text, is an operator) of each token of DuckDB's tokenizer, comments
    left out."""
    toks = duckdb.tokenize(text)
    return [(pos, text[pos:(toks[k + 1][0] if k + 1 < len(toks) else len(text))].strip().lower(),
             kind == duckdb.token_type.operator) for k, (pos, kind) in enumerate(toks)
            if kind != duckdb.token_type.comment]


def _inner(stmt, start: int):
    """The statement that begins at ``start`` inside ``stmt``, which DuckDB must parse as exactly
    one statement."""
    if start is None:
        raise ProgrammingError(f"cannot find the statement inside this {stmt.type.name}")
    return single_statement(stmt.query[start:], f"the statement inside {stmt.type.name}")


def explained(stmt):
    """The statement EXPLAIN ANALYZE runs; None for a plain EXPLAIN, which runs nothing.
    The prefix is EXPLAIN, then ANALYZE/VERBOSE words or one parenthesized option list."""
    toks = words(stmt.query)
    if not any(w in ("analyze", "analyse") for _, w, op in toks if not op):
        return None
    depth = 0
    for pos, word, op in toks[1:]:
        if op and (depth or word.startswith("(")):
            depth += word.count("(") - word.count(")")
            continue
        if depth or word in ("analyze", "analyse", "verbose"):
            continue
        return _inner(stmt, pos)
    return _inner(stmt, None)


def prepared(stmt):
    """The statement after PREPARE name [(types)] AS."""
    depth, toks = 0, words(stmt.query)
    for k, (pos, word, op) in enumerate(toks):
        if op:
            depth += word.count("(") - word.count(")")
        elif depth == 0 and word == "as" and k + 1 < len(toks):
            return _inner(stmt, toks[k + 1][0])
    return _inner(stmt, None)
