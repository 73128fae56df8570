"""Tensors as SQL relations: one column per dimension plus ``value``, one row per nonzero.

Absent cells (zeros) do not appear, whatever the tensor's density: a tensor is shown as its COO
table, the same table a COO load reads and a Parquet/CSV export writes. Each query that names a
tensor registers it with DuckDB as an Arrow stream that is produced tile by tile when (and each
time) the query runs. A replace registers the new version (``Store._refresh_views``), so a
relation, and a view over a tensor, read the version current when they run; a stream already
running keeps the version it mapped.

>>> import numpy as np
>>> from tensordb.storage import Store
>>> from tensordb.formats.load import load_tensor
>>> with Store() as store:
...     _ = load_tensor(store, "A", np.array([[0, 2], [3, 0]], "int32"), dims=["i", "j"])
...     sql(store, "SELECT i, j, value FROM A ORDER BY i").fetchall()
[(0, 1, 2), (1, 0, 3)]
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import duckdb

from ..errors import CatalogError, Error, ProgrammingError
from . import guard, pyobjects, sqltext, suggest
from ..storage import deferred, quote_ident, translating
from ..storage.views import TensorStream, expose_tensors, referenced_names

__all__ = ["sql", "expose_tensors", "referenced_names", "TensorStream", "Relation",
           "transaction_statement", "relation_from"]


_TRANSACTION = duckdb.StatementType.TRANSACTION


def sql(store, query: str, parameters=None, *, relation: bool = False, reads: bool = False):
    """Run plain SQL over tables and tensors: a :class:`Relation` for a query; for a statement
    with ``parameters`` (``?`` placeholders), a (columns, rows, type names) triple, or with
    ``relation`` a Relation (DuckDB's ``sql(query, params=...)``).

    Statements run one at a time, each checked first (guard.py): none may write inside the
    database directory. A script of several statements returns the last one's relation. A
    DataFrame or Arrow table the caller's code holds is scanned by the name the query gives it
    (pyobjects.py), for this call and for each later call of the relation it returns.
    ``reads``: the query is tensordb's own read of a tensor (``Result.relation``), which
    cannot change the catalog: the store's cached catalog answers (and with them its kept
    readers and the driver's replay of a training step) stay."""
    store.check_open()
    if parameters is not None and (isinstance(parameters, (str, bytes)) or
                                   not isinstance(parameters, (Sequence, Mapping))):
        raise ProgrammingError(f"params must be a list, tuple or dict, got "
                               f"{type(parameters).__name__}")
    try:
        stmts = guard.statements(query)
    except Error as exc:
        suggest.improve(exc, query, lambda: suggest.user_names(store))
        suggest.reader_note(exc, store)
        raise
    if parameters is not None and len(stmts) != 1:
        raise ProgrammingError(f"? parameters need exactly one SQL statement, got {len(stmts)}")
    rel = None
    scans = pyobjects.scans_for(store, query)
    attach = _user_tables(store, stmts)
    try:
        with store.lock, attach as attached, pyobjects.scanning(store, scans) as scan_more:
            for k, stmt in enumerate(stmts):
                while True:
                    try:
                        rel = _run_one(store, stmt, query if len(stmts) == 1 else stmt,
                                       parameters, last=k == len(stmts) - 1, relation=relation)
                        break
                    except CatalogError as exc:  # bound, not run: scan what it misses, again
                        found = pyobjects.missing_object(store, exc, scans)
                        if found is None:
                            raise
                        scan_more(*found)
            if attached and isinstance(rel, duckdb.DuckDBPyRelation):
                with translating():  # its rows, before the attachment goes
                    rel = store.duck.from_arrow(rel.to_arrow_table())
    except Error as exc:
        suggest.improve(exc, query, lambda: suggest.user_names(store))
        suggest.reader_note(exc, store)
        raise
    finally:
        # Any statement may have changed the catalog (DML on it, a ROLLBACK): reread it.
        if not reads:
            store.forget_cached()
    if parameters is not None and not relation:
        return rel
    return None if rel is None else Relation(rel, store, scans)


def _user_tables(store, stmts):
    """A read-only connection's statements naming one of the database's own tables or views
    run with ``catalog.duckdb`` attached for their duration (storage/readview.py): a context
    yielding whether it is attached (False: a writer holds it, and suggest.reader_note says
    so); else a context yielding None."""
    view = getattr(store, "view", None)
    known = view.user_tables if view is not None else None
    if not known or not any(referenced_names(s.query) & known for s in stmts):
        return contextlib.nullcontext()
    return view.attach_user_tables(store.duck)


def _run_one(store, stmt, text, parameters, last: bool, relation: bool = False):
    """Check and run one statement (``text``: the original query when it is the only one, so
    DuckDB's error positions refer to what the user wrote)."""
    for created in guard.tables_made(store, stmt):
        if store.has(created):
            raise CatalogError(f"cannot create table '{created}': a tensor named "
                               f"'{store.meta(created).name}' exists",
                               hint="tensors and tables share one namespace")
    guard.check_statement(store, stmt, parameters)
    begins = _begins_transaction(store, stmt)
    if begins is None:
        expose_tensors(store, stmt.query)
    with translating():
        # a mapping names $name parameters: passed as it is (list() would give its keys)
        values = parameters if parameters is None or isinstance(parameters, Mapping) \
            else list(parameters)
        if parameters is not None and relation:
            rel = store.duck.sql(text, params=values)
        elif parameters is not None:
            cur = store.duck.execute(text, values)
            cols = [d[0] for d in cur.description] if cur.description else []
            types = [str(d[1]) for d in cur.description] if cur.description else []
            rel = (cols, cur.fetchall() if cols else [], types)
        elif last:
            rel = store.duck.sql(text)
        else:
            store.duck.execute(text)
            rel = None
    if begins is not None:  # tensordb's own writes refuse to run inside the user's transaction
        store.user_transaction = begins
    return rel


def transaction_statement(query: str) -> bool:
    """Whether ``query`` holds a BEGIN, COMMIT or ROLLBACK (by DuckDB's parse)."""
    try:
        return any(stmt.type == _TRANSACTION for stmt in guard.statements(query))
    except Error:  # it does not parse: running it says so
        return False


def _begins_transaction(store, stmt) -> bool | None:
    """None for a statement that is not BEGIN, COMMIT or ROLLBACK (by DuckDB's parse: a comment
    before the word counts for nothing); else whether it begins a transaction. One may not run
    while tensordb's own transaction is open (a group of statements, which commits as one):
    it would commit or roll back that group's catalog rows behind tensordb's back."""
    if stmt.type != _TRANSACTION:
        return None
    word = next((w for _, w, op in sqltext.words(stmt.query) if not op), "")
    if store.in_transaction:
        raise ProgrammingError(
            f"{word.upper()} cannot run inside a group of tensordb statements: the group "
            "commits or rolls back as one",
            hint="end the group with the dialect's COMMIT or ROLLBACK, or run the SQL "
                 "transaction statement on its own")
    return word in ("begin", "start")


def relation_from(store, kind: str, *args, **kwargs) -> "Relation":
    """A relation of DuckDB's Python API: ``table``/``view`` (a table, view or tensor by name),
    ``read_parquet``, ``read_csv``, ``from_df``, ``from_arrow``."""
    store.check_open()
    if kind in ("table", "view"):
        name = args[0]
        if not isinstance(name, str):
            raise ProgrammingError(f"a {kind} name must be a string, got {type(name).__name__}")
        if guard.in_catalog_schema(store, tuple(p.strip('"') for p in name.split("."))):
            # a table relation may insert and update: read the catalog with con.sql instead
            raise ProgrammingError(f"con.{kind}('{name}') refused: a relation of a catalog table "
                                   "could change it", hint=f"read it with con.sql('SELECT * FROM "
                                                           f"{name}')")
        if store.has(name):  # a tensor: its relation, as con.sql gives it
            return sql(store, f"SELECT * FROM {quote_ident(store.meta(name).name)}")
        with store.lock, translating():
            return Relation(getattr(store.duck, kind)(name), store)
    if kind in ("from_df", "from_arrow") and not pyobjects.is_scannable(args[0]):
        raise ProgrammingError(f"{kind} needs a DataFrame or an Arrow table, got "
                               f"{type(args[0]).__name__}")
    with store.lock, translating():
        return Relation(getattr(store.duck, kind)(*args, **kwargs), store)


# A relation's methods that write: a file (its first argument), or a table or view (named by
# its first argument). They are checked as plain SQL that writes is (guard.py).
_WRITES_FILE = {"to_parquet": "file_name", "write_parquet": "file_name", "to_csv": "file_name",
                "write_csv": "file_name"}
_WRITES_TABLE = {"create": "table_name", "to_table": "table_name", "insert_into": "table_name",
                 "create_view": "view_name", "to_view": "view_name"}


def _check_write(store, method: str, args, kwargs) -> None:
    """ProgrammingError when a relation's ``method`` would write inside the database directory,
    into the catalog schema, or a table or view named like a tensor."""
    key = _WRITES_FILE.get(method) or _WRITES_TABLE.get(method)
    if key is None:
        return
    target = args[0] if args else kwargs.get(key)
    if not isinstance(target, (str, bytes)) and not hasattr(target, "__fspath__"):
        return  # DuckDB's own error says what it wants
    if method in _WRITES_FILE:
        guard.check_path(store, target, f"relation.{method}")
        return
    parts = tuple(p.strip('"') for p in str(target).split("."))
    if guard.in_catalog_schema(store, parts):
        raise ProgrammingError(f"relation.{method}('{target}') refused: it would change "
                               "tensordb's catalog", hint="the tensordb schema describes every "
                               "tensor; change tensors with tensordb's statements")
    if method != "insert_into" and store.has(parts[-1]):
        raise CatalogError(f"relation.{method}('{target}') refused: a tensor named "
                           f"'{store.meta(parts[-1]).name}' exists",
                           hint="tensors and tables share one namespace")


class Relation:
    """A DuckDB relation whose errors are tensordb errors; ``.relation`` is the DuckDB one.

    Every method of DuckDB's relation is available (``fetchall``, ``df``, ``arrow``,
    ``fetchnumpy``, ``filter``, ``show``, ...); methods returning relations return wrapped ones.
    A relation over Python objects its query named (``scans``) shows them to DuckDB again
    while each of its methods runs: DuckDB binds a relation's query anew when it runs.
    """

    __slots__ = ("relation", "_store", "_scans")

    def __init__(self, relation, store=None, scans=None) -> None:
        self.relation = relation
        self._store = store
        self._scans = scans or {}

    def _scanning(self):
        import contextlib
        store = self._store
        if store is not None and not store.closed and store.holds_rows:
            deferred.flush(store)  # in memory: commits' rows kept back, written before it runs
        if not self._scans or self._store is None or self._store.closed:
            return contextlib.nullcontext()
        return pyobjects.scanning(self._store, self._scans)

    def __getattr__(self, attr):
        with self._scanning(), translating():
            value = getattr(self.relation, attr)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            if self._store is not None:
                _check_write(self._store, attr, args, kwargs)
            scans = dict(self._scans)
            for a in args:  # a join's other relation may scan objects too
                if isinstance(a, Relation):
                    scans.update(a._scans)
            args = [a.relation if isinstance(a, Relation) else a for a in args]
            with Relation(self.relation, self._store, scans)._scanning(), translating():
                out = value(*args, **kwargs)
            return Relation(out, self._store, scans) if type(out) is type(self.relation) else out
        call.__name__ = attr
        call.__doc__ = getattr(value, "__doc__", None)
        return call

    def __len__(self) -> int:
        with self._scanning(), translating():
            return len(self.relation)

    def __repr__(self) -> str:
        with self._scanning(), translating():
            return repr(self.relation)

    __str__ = __repr__
