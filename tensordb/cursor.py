"""DB-API 2.0 cursors (PEP 249) over a Connection, and the module's type objects.

A cursor runs statements through ``Connection.execute`` (the whole dialect: einsum statements,
plain SQL, ``?`` parameters for one plain SQL statement) and keeps the last result for fetching.
Cursors of one connection share its transactions and its BEGIN block.

>>> import numpy as np, tensordb
>>> con = tensordb.connect()
>>> con.load("A", np.eye(2))
>>> cur = con.cursor()
>>> cur.execute("SELECT i, j, value FROM A ORDER BY i").fetchall()
[(0, 0, 1.0), (1, 1, 1.0)]
>>> [d[:2] for d in cur.description]
[('i', BIGINT), ('j', BIGINT), ('value', DOUBLE)]
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Sequence

from .calls import one_at_a_time
from .errors import ProgrammingError

__all__ = ["Cursor", "STRING", "BINARY", "NUMBER", "DATETIME", "ROWID"]


class _TypeObject:
    """A PEP 249 type object: equal to every DuckDB type name of its group."""

    def __init__(self, name: str, *types: str) -> None:
        self.name, self.types = name, frozenset(types)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _TypeObject):
            return other is self
        # DECIMAL(18,3) and VARCHAR(10) are DECIMAL and VARCHAR; a description's type codes
        # are DuckDB's type objects, which print as their names
        if other is None:
            return False
        return str(other).upper().split("(")[0] in self.types

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"tensordb.{self.name}"


STRING = _TypeObject("STRING", "VARCHAR", "UUID", "ENUM")
BINARY = _TypeObject("BINARY", "BLOB", "BIT")
NUMBER = _TypeObject("NUMBER", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
                     "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL",
                     "BOOLEAN")
DATETIME = _TypeObject("DATETIME", "DATE", "TIME", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE",
                       "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS", "TIME WITH TIME ZONE",
                       "INTERVAL")
ROWID = _TypeObject("ROWID")


class Cursor:
    """A DB-API 2.0 cursor. ``execute`` returns the cursor, so calls chain:
    ``cur.execute(sql).fetchall()``. The last result is ``cur.result`` (a tensor result's
    ``.tensor()`` is the stored array; its rows are the tensor's relation)."""

    arraysize: int = 1

    def __init__(self, connection) -> None:
        self.connection = connection
        self.result = None
        self._rowcount = -1
        self._closed = False

    # -- state ---------------------------------------------------------------------------------
    @property
    def _call_lock(self):
        """The connection's: a cursor's calls wait for the connection's and its other cursors'."""
        return self.connection._call_lock

    def _check(self) -> None:
        if self._closed:
            raise ProgrammingError("the cursor is closed")
        if self.connection._store is None:
            raise ProgrammingError("the connection is closed")

    def close(self) -> None:
        """Close the cursor: every later call on it raises ProgrammingError."""
        self._closed = True
        self.result = None

    def __enter__(self) -> "Cursor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def description(self) -> list[tuple] | None:
        """One 7-tuple (name, type_code, None, None, None, None, None) per column of the last
        result, or None when it has no rows (an einsum statement's result has: its relation)."""
        return None if self.result is None else self.result.description

    @property
    def rowcount(self) -> int:
        """Rows of the last query; rows changed by INSERT/UPDATE/DELETE; -1 when not known."""
        return self._rowcount

    # -- running -------------------------------------------------------------------------------
    @one_at_a_time
    def execute(self, operation: str, parameters: Sequence[Any] | None = None) -> "Cursor":
        """Run one or more statements (``?`` parameters for one plain SQL statement)."""
        self._check()
        self.result, self._rowcount = None, -1
        saved = self.connection._last_result  # the connection's own fetches read its own
        try:
            self.result = self.connection.execute(operation, parameters)
        finally:
            self.connection._last_result = saved
        self._rowcount = self.result.rowcount
        return self

    @one_at_a_time
    def executemany(self, operation: str, seq_of_parameters: Iterable[Sequence[Any]]) -> "Cursor":
        """Run ``operation`` once per parameter sequence, all in one transaction: when one fails,
        none of them is stored. ``rowcount`` is the total of rows changed, -1 if not known."""
        self._check()
        self.result, self._rowcount = None, -1
        try:
            seq_of_parameters = iter(seq_of_parameters)
        except TypeError:
            raise ProgrammingError("executemany needs a sequence of parameter sequences, got "
                                   f"{type(seq_of_parameters).__name__}") from None
        store = self.connection.store
        total: int | None = 0
        last = None
        txn = store.transaction() if not (store.read_only or store.user_transaction) else None
        with txn if txn is not None else contextlib.nullcontext():
            saved = self.connection._last_result
            for params in seq_of_parameters:
                try:
                    last = self.connection.execute(operation, params)
                finally:
                    self.connection._last_result = saved
                n = last.count if last.count is not None else -1
                total = None if total is None or n < 0 else total + n
        self.result = last
        self._rowcount = -1 if total is None or last is None else total
        return self

    def setinputsizes(self, sizes) -> None:
        """Accepted and ignored (PEP 249)."""

    def setoutputsize(self, size, column=None) -> None:
        """Accepted and ignored (PEP 249)."""

    # -- fetching ------------------------------------------------------------------------------
    def _rows(self):
        self._check()
        if self.result is None:
            raise ProgrammingError("nothing to fetch: no statement has been executed")
        if self.result.description is None:
            raise ProgrammingError(f"nothing to fetch: the statement returned no rows "
                                   f"({self.result.message or self.result.kind})",
                                   statement=self.result.statement or None)
        return self.result

    @one_at_a_time
    def fetchone(self) -> tuple | None:
        return self._rows().fetchone()

    @one_at_a_time
    def fetchmany(self, size: int | None = None) -> list[tuple]:
        size = self.arraysize if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProgrammingError(f"fetchmany size must be an integer >= 0, got {size!r}")
        return self._rows().fetchmany(size)

    @one_at_a_time
    def fetchall(self) -> list[tuple]:
        return self._rows().fetchall()

    def __iter__(self):
        while True:
            row = self.fetchone()
            if row is None:
                return
            yield row

    # DuckDB's result methods, on the last result
    @one_at_a_time
    def fetchnumpy(self):
        return self._rows().rest().fetchnumpy()  # the rows not fetched yet, as DuckDB's

    @one_at_a_time
    def fetch_arrow_table(self):
        return self._rows().rest().fetch_arrow_table()  # the rows not fetched yet, as DuckDB's

    arrow = fetch_arrow_table

    @one_at_a_time
    def fetchdf(self):
        return self._rows().rest().fetchdf()  # the rows not fetched yet, as DuckDB's

    df = fetchdf

    @one_at_a_time
    def pl(self):
        return self._rows().rest().pl()  # the rows not fetched yet, as DuckDB's
