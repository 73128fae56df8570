"""DuckDB's Python API on the Connection: the methods DuckDB users call out of habit, with
DuckDB's meaning (``register``, ``table``, ``read_parquet``, ``executemany``, the fetches of the
last result, ...), and the module's functions on a default in-memory connection
(``tensordb.sql``, ``tensordb.execute``), as ``duckdb.sql`` has them. ``Connection`` inherits
``DuckAPI``; the module's functions are in default.py. What differs from DuckDB, and why, is
listed in docs/python.md.

>>> import pandas as pd, tensordb
>>> with tensordb.connect() as con:
...     _ = con.register("people", pd.DataFrame({"age": [31, 45]}))
...     con.sql("SELECT max(age) FROM people").fetchall()
[(45,)]
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .calls import one_at_a_time
from .errors import ProgrammingError

if TYPE_CHECKING:
    from .storage import Store

__all__ = ["DuckAPI", "connect_arguments"]

# duckdb.connect(config={...}) keys that have a tensordb setting of their own.
_CONFIG = {"memory_limit": "memory_limit", "max_memory": "memory_limit", "threads": "workers",
           "worker_threads": "workers"}


def connect_arguments(path, database, config, **args) -> dict:
    """``connect``'s arguments, DuckDB's spellings included: ``database`` names the path
    (``':memory:'`` or ``''``: in memory); ``config`` holds ``memory_limit``, ``threads``
    (the workers) and ``access_mode`` ('read_only'). A setting tensordb has no use for is
    refused rather than ignored."""
    if database is not None:
        if path is not None:
            raise ProgrammingError("give the database as path or as database=, not both")
        path = database
    if isinstance(path, str) and path in (":memory:", ""):
        path = None
    elif isinstance(path, str) and path.startswith(":memory:"):
        raise ProgrammingError(f"named in-memory databases ({path!r}) are not supported",
                               hint="connect() (or ':memory:') opens a database of its own; "
                                    "share it by passing the connection")
    for key, value in dict(config or {}).items():
        key = str(key).lower()
        if key == "access_mode":
            args["read_only"] = args["read_only"] or str(value).lower() == "read_only"
        elif key in _CONFIG:
            args[_CONFIG[key]] = value
        else:
            raise ProgrammingError(f"unknown connect config option '{key}'",
                                   hint="tensordb reads memory_limit, threads and access_mode; "
                                        "SET others after connecting")
    return {"path": path, **args}


class DuckAPI:
    """Mixed into ``Connection``, whose ``store``, ``execute`` and ``sql`` these methods use."""

    store: "Store"
    _last_result: Any = None

    # -- Python objects as relations -----------------------------------------------------------
    @one_at_a_time
    def register(self, view_name: str, python_object):
        """Show a pandas or polars DataFrame, an Arrow table (or batch, reader, dataset) or a
        relation to later SQL as the view ``view_name`` until ``unregister`` (DuckDB's
        ``register``). A tensor's name is refused: tensors, tables and registered objects share
        one namespace. Returns the connection, as DuckDB's does."""
        from .sqlfront.pyobjects import register
        register(self.store, view_name, python_object)
        return self

    @one_at_a_time
    def unregister(self, view_name: str):
        """Forget the object registered as ``view_name`` (nothing happens when there is none)."""
        from .sqlfront.pyobjects import unregister
        unregister(self.store, view_name)
        return self

    def _relation(self, kind: str, *args, **kwargs):
        from .sqlfront.relations import relation_from
        return relation_from(self.store, kind, *args, **kwargs)

    @one_at_a_time
    def table(self, table_name: str):
        """A table, view or tensor as a relation (a tensor's: its dims and ``value``)."""
        return self._relation("table", table_name)

    @one_at_a_time
    def view(self, view_name: str):
        """A view (a registered object, a tensor) as a relation."""
        return self._relation("view", view_name)

    @one_at_a_time
    def read_parquet(self, file_glob, **options):
        """A relation over Parquet files (DuckDB's ``read_parquet``, its options too)."""
        return self._relation("read_parquet", file_glob, **options)

    from_parquet = read_parquet

    @one_at_a_time
    def read_csv(self, path_or_buffer, **options):
        """A relation over CSV files (DuckDB's ``read_csv``, its options too)."""
        return self._relation("read_csv", path_or_buffer, **options)

    from_csv_auto = read_csv

    @one_at_a_time
    def read_json(self, path_or_buffer, **options):
        """A relation over JSON files (DuckDB's ``read_json``)."""
        return self._relation("read_json", path_or_buffer, **options)

    @one_at_a_time
    def from_df(self, df):
        """A relation over a pandas DataFrame."""
        return self._relation("from_df", df)

    @one_at_a_time
    def from_arrow(self, arrow_object):
        """A relation over an Arrow table, batch, reader or dataset (or a polars DataFrame)."""
        return self._relation("from_arrow", arrow_object)

    @one_at_a_time
    def query(self, query: str, *, alias: str = "", params=None):
        """The same as ``sql`` (DuckDB's alias)."""
        return self.sql(query, alias=alias, params=params)

    from_query = query

    @one_at_a_time
    def values(self, *values):
        """A one-row relation of ``values`` (DuckDB's ``values``)."""
        return self._relation("values", *values)

    @one_at_a_time
    def append(self, table_name: str, df, *, by_name: bool = False):
        """Append the rows of a DataFrame (or Arrow table) to a table, as DuckDB's ``append``:
        an INSERT, checked as plain SQL that writes is (a tensor's name is refused)."""
        import uuid
        from .storage import quote_ident
        from .sqlfront.pyobjects import is_scannable
        if not isinstance(table_name, str):
            raise ProgrammingError(f"a table name must be a string, got {table_name!r}")
        if not is_scannable(df):
            raise ProgrammingError(f"append needs a DataFrame or an Arrow table, got "
                                   f"{type(df).__name__}")
        if self.store.has(table_name):
            raise ProgrammingError(f"cannot append to '{table_name}': it is a tensor",
                                   hint="a tensor is stored whole: con.load(name, data, "
                                        "replace=True), or INSERT into a table of your own")
        source = f"_tensordb_append_{uuid.uuid4().hex[:12]}"
        self.register(source, df)
        try:
            self.sql(f"INSERT INTO {quote_ident(table_name)} {'BY NAME ' if by_name else ''}"
                     f"SELECT * FROM {quote_ident(source)}")
        finally:
            self.unregister(source)
        return self

    @one_at_a_time
    def begin(self):
        """Open a BEGIN ... COMMIT block (``commit()`` ends it, ``rollback()`` drops it): its
        statements, einsums and plain SQL alike, wait for the COMMIT and land together."""
        self.execute("BEGIN")
        return self

    def duplicate(self):
        """Another handle on this database (DuckDB's ``duplicate``, its ``cursor``): a cursor
        of this connection, whose results are its own."""
        return self.cursor()

    # -- running and fetching, DuckDB's way ----------------------------------------------------
    @one_at_a_time
    def executemany(self, query: str, parameters: Iterable[Sequence[Any]] = ()):
        """Run ``query`` once per parameter sequence, all in one transaction (one fails: none is
        stored); returns the last statement's result, which the connection's fetches read."""
        cur = self.cursor()
        cur.executemany(query, parameters)
        self._last_result = cur.result
        if cur.result is not None and cur.rowcount >= 0:
            cur.result.count = cur.rowcount  # the total, as DuckDB's rowcount is
        return cur.result

    def _last(self):
        _ = self.store  # a closed connection: InterfaceError
        last = self._last_result
        if last is None:
            raise ProgrammingError("nothing to fetch: no statement has been run with execute",
                                   hint="con.sql(...) returns a relation: fetch from it")
        if last.description is None:
            raise ProgrammingError(f"nothing to fetch: the statement returned no rows "
                                   f"({last.message or last.kind})",
                                   statement=last.statement or None)
        return last

    @property
    def description(self) -> list[tuple] | None:
        """The last ``execute`` result's DB-API description (DuckDB's type objects)."""
        last = self._last_result
        return None if last is None else last.description

    @property
    def rowcount(self) -> int:
        """Rows the last ``execute`` (or all of an ``executemany``) changed; -1 after a query
        or a statement that changes no rows, as DuckDB's connection gives it."""
        last = self._last_result
        if last is None or last.kind != "status" or last.count is None:
            return -1
        return last.count

    @one_at_a_time
    def fetchone(self) -> tuple | None:
        """The next row of the last ``execute`` result (DuckDB's connection keeps it)."""
        return self._last().fetchone()

    @one_at_a_time
    def fetchmany(self, size: int = 1) -> list[tuple]:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProgrammingError(f"fetchmany size must be an integer >= 0, got {size!r}")
        return self._last().fetchmany(size)

    @one_at_a_time
    def fetchall(self) -> list[tuple]:
        return self._last().fetchall()

    @one_at_a_time
    def fetchnumpy(self):
        return self._last().rest().fetchnumpy()  # the rows not fetched yet, as DuckDB's

    @one_at_a_time
    def fetchdf(self):
        return self._last().rest().fetchdf()

    df = fetch_df = fetchdf

    @one_at_a_time
    def fetch_arrow_table(self):
        return self._last().rest().fetch_arrow_table()

    arrow = to_arrow_table = fetch_arrow_table  # DuckDB 2's name, and earlier ones

    @one_at_a_time
    def to_arrow_reader(self, batch_size: int = 1_000_000):
        """The rest of the last result as a pyarrow RecordBatchReader."""
        return self._last().rest().fetch_arrow_table().to_reader(batch_size)

    @one_at_a_time
    def pl(self):
        return self._last().rest().pl()

    @one_at_a_time
    def torch(self):
        """The rest of the last result as torch tensors, one per column (DuckDB's
        ``fetch_torch``); a tensor result as one torch.Tensor."""
        last = self._last()
        return last.torch() if last.kind == "tensor" else last.rest().torch()

    fetch_torch = torch
