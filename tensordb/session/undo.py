"""What a failed unit puts back besides the store, whose transaction rolls back on its own: the
session's LETs, the connection's settings (``SET workers = 1``) and DuckDB's settings changed by
plain SQL (``SET threads = 1``, ``USE``), which DuckDB does not roll back with a transaction.

DuckDB's settings are read only before the first plain SQL statement of a unit that can change
one (reading them all takes milliseconds), and only those that changed are put back.

>>> import tensordb
>>> con = tensordb.connect()
>>> try:
...     con.execute("SET workers = 1; SET threads = 1; X[i] = Nope[i]")
... except tensordb.CatalogError:
...     pass
>>> con.settings.workers != 1, con.sql("SELECT current_setting('threads')").fetchall()[0][0] != 1
(True, True)
"""
from __future__ import annotations

import dataclasses

from ..dialect import ast as A
from ..dialect.lexer import words
from ..errors import Error
from ..storage import quote_ident

__all__ = ["UnitState"]

# The first words of plain SQL that may change a DuckDB setting (USE changes the schema and the
# search path; EXPLAIN ANALYZE runs its statement).
_SETTERS = {"SET", "RESET", "USE", "PRAGMA", "CALL", "EXPLAIN"}


class UnitState:
    """The state a unit starts from; ``restore`` returns to it after the unit failed."""

    def __init__(self, con, duck: bool = True, settings: bool = True) -> None:
        self.con = con
        self.lets = dict(con.session.lets)
        # None: the unit cannot change a setting (einsum statements alone)
        self.settings = dataclasses.replace(con.settings) if settings else None
        self.watch_duck = duck  # False: DuckDB's settings are left as they are (see run_unit)
        self.duck: dict[str, str] | None = None  # DuckDB's settings, once a statement may change one

    def will_run(self, script: str, stmt: A.Statement) -> None:
        """Called before each statement of the unit runs."""
        if self.watch_duck and self.duck is None and isinstance(stmt, A.SqlStmt):
            head = words(script, stmt.span.start, stmt.span.end, 1)
            if head and head[0].upper in _SETTERS:
                self.duck = _duck_settings(self.con)

    def restore(self) -> None:
        lets = self.con.session.lets
        lets.clear()
        lets.update(self.lets)
        if self.settings is not None:
            self.con.engine.restore_settings(self.settings)
        if self.duck is not None:
            _restore_duck(self.con, self.duck)


def _duck_settings(con) -> dict[str, str]:
    """DuckDB's settings as it shows them (text), read on its own connection: no guard or
    tensor views are wanted for its own table function."""
    return dict(con.store.query("SELECT name, value FROM duckdb_settings()"))


def _restore_duck(con, before: dict[str, str]) -> None:
    """Put back the DuckDB settings that differ from ``before``. A value is read back as text,
    rounded (memory sizes), so RESET comes first: a setting that was at its default is then
    exactly as it was; another is SET to the text it had, as a parameter (the guard's path
    check, which refuses parameters in SET, was passed when the value was set)."""
    store = con.store
    now = _duck_settings(con)
    for name, value in before.items():
        if now.get(name) == value:
            continue
        ident = quote_ident(name)  # one of DuckDB's own setting names
        try:
            with store.lock:
                store.query(f"RESET {ident}")
                if value is not None and _duck_settings_now(store, name) != value:
                    store.query(f"SET {ident} = ?", [value])
        except Error:  # a setting fixed once the database runs: it cannot have changed either
            pass


def _duck_settings_now(store, name: str) -> str | None:
    """One setting's value as ``duckdb_settings()`` shows it."""
    rows = store.query("SELECT value FROM duckdb_settings() WHERE name = ?", [name])
    return rows[0][0] if rows else None
