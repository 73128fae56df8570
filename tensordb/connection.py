"""Connection: the embedded database. Its calls go to the driver (tensordb/driver/: parse ->
bind -> optimize -> lower -> place -> run -> commit, each stage one call, timed under
TENSORDB_DEBUG=1) through its ``engine``; the statements that are not einsums, blocks and LETs
are the session's (tensordb/session/), which runs einsum groups on the same engine.
"""
from __future__ import annotations

import dataclasses
import os
import weakref
from typing import Any, Mapping, Sequence

from .calls import one_at_a_time
from .config import Settings, gc_paused
from .driver import Engine, parse
from .duckapi import DuckAPI, connect_arguments
from .errors import InterfaceError, ParserError, ProgrammingError
from .plan.builder import Graph
from .plan.ir import EinGraph
from .session import Session, run_script
from .storage import Store
from .tensor_io import TensorIO

__all__ = ["Connection", "connect"]

def connect(path: str | os.PathLike | None = None, read_only: bool = False, config=None, *,
            workers: int | None = None, memory_limit: int | str | None = None,
            executor: str = "local", database: str | os.PathLike | None = None,
            storage: str = "local", storage_options: dict | None = None) -> "Connection":
    """Open a database: in memory when ``path`` is None (or ``':memory:'``), else a directory
    that persists. ``database`` is another name for ``path``, and ``config`` a dict of
    settings, as in ``duckdb.connect`` (duckapi.connect_arguments).

    ``storage`` declares where its payload files are for executors with workers in other
    processes: ``'local'`` (the client's disk: workers shown to see the database at its path
    read the files, the others get their tiles from the client) or ``'shared'`` (mounted at the
    same path on every worker, which reads the files itself); docs/distributed.md. An object
    store URL (``'s3://bucket/prefix'``, with ``storage_options={'endpoint': ...,
    'access_key': ..., 'secret_key': ...}``) keeps the payloads there and the catalog in
    ``path``; every worker reads the objects itself (docs/storage.md, "Object storage").

    ``memory_limit`` (bytes, or text such as ``'2GB'``) is shared by the workers; left out, it
    is 80% of the machine's memory (``config.default_memory_limit``); ``'none'``: no limit.

    >>> import numpy as np, tensordb
    >>> with tensordb.connect() as con:
    ...     con.load("A", np.eye(3))
    ...     _ = con.einsum("ij,jk->ik", "A", "A", into="B")
    ...     float(con.tensor("B").sum())
    3.0
    """
    args = connect_arguments(path, database, config, workers=workers, memory_limit=memory_limit,
                             executor=executor, read_only=read_only, storage=storage,
                             storage_options=storage_options)
    return Connection(args.pop("path"), **args)


class Connection(TensorIO, DuckAPI):
    """One open database. Use as a context manager: leaving the block closes it. Its methods
    that move tensors in and out (``load``, ``tensor``, ``export``, ...) are in tensor_io.py,
    those of DuckDB's Python API (``register``, ``table``, ``fetchall``, ...) in duckapi.py."""

    def __init__(self, path=None, *, workers=None, memory_limit=None, executor="local",
                 read_only=False, storage="local", storage_options=None) -> None:
        self.settings = Settings()
        for key, value in (("workers", workers), ("memory_limit", memory_limit),
                           ("executor", executor)):
            if value is not None:
                self.settings.set(key, value)
        if executor is not None:  # refuse an unguarded script here, before anything starts
            from .exec.spawn import check_main_guard
            check_main_guard(self.settings.executor)
        # a second connection to a database open in this process shares its store, as DuckDB's
        # share a database instance, and with it the turns of its calls (calls.py)
        self._store: Store | None = Store.shared(path, read_only=read_only, storage=storage,
                                                 storage_options=storage_options)
        self._call_lock = self._store.call_lock
        self._release = weakref.finalize(self, self._store.release)  # at close, or collected
        self.session = Session()  # the dialect's state: LETs and the open BEGIN block
        # the driver's state: executor, prepared-statement cache, last plan and run
        self.engine = Engine(self._store, self.settings, self.session)

    # the engine's, shown here (tests, the CLI, EXPLAIN ANALYZE read them)
    last_plan = property(lambda self: self.engine.last_plan,
                         doc="The TilePlan of the last einsum run.")
    last_run = property(lambda self: self.engine.last_run,
                        doc="What the last einsum run returned (exec.RunResult).")

    @property
    def progress_callback(self):
        """Called as (done, total) tasks while a plan runs (the CLI); ``done`` counts the
        running kernel calls' fractions too, so it grows while a few long calls run."""
        return self.engine.progress_callback

    @progress_callback.setter
    def progress_callback(self, fn) -> None:
        self.engine.progress_callback = fn

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        if self._store is None:
            raise InterfaceError("the connection is closed")
        return self._store

    @one_at_a_time
    def close(self) -> None:
        self.engine.close()
        if self._store is not None:
            self._release()
            self._store = None

    # -- DB-API 2.0 ----------------------------------------------------------------------------
    def cursor(self):
        """A DB-API 2.0 cursor over this connection (see tensordb/cursor.py)."""
        from .cursor import Cursor
        _ = self.store  # a closed connection: InterfaceError
        return Cursor(self)

    @one_at_a_time
    def commit(self) -> None:
        """Every statement commits on its own (each ``execute`` call is a unit), so this does
        nothing unless a transaction is open: it ends a BEGIN block as COMMIT does (its
        statements run and are stored, or none is), or commits a transaction begun with plain
        SQL (``con.sql("BEGIN")``)."""
        if self.session.block is not None:
            self.execute("COMMIT")
        elif self.store.user_transaction:
            self.sql("COMMIT")

    @one_at_a_time
    def rollback(self) -> None:
        """Discard an open BEGIN block (as ROLLBACK does) or a transaction begun with plain SQL;
        nothing to undo otherwise (what ran is committed)."""
        if self.session.block is not None:
            self.execute("ROLLBACK")
        elif self.store.user_transaction:
            self.sql("ROLLBACK")

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @one_at_a_time
    def set(self, name: str, value: Any) -> None:
        """Change a setting (``workers``, ``memory_limit``, ``executor``, ``tiling``, ...);
        ``'DEFAULT'`` returns it to its default (not ``tiling``, which has a strategy of that
        name)."""
        key = str(name).lower()
        if Settings.is_default(key, value):
            value = getattr(Settings(), key, value)
        if key == "tiling" and value:
            from .optimizer import STRATEGIES
            if str(value) not in STRATEGIES:
                raise ProgrammingError(f"unknown tiling strategy '{value}'",
                                       hint=f"valid strategies: {', '.join(sorted(STRATEGIES))}")
        if key == "executor":
            from .exec import EXECUTORS
            if str(value).split("://", 1)[0] not in EXECUTORS:
                raise ProgrammingError(f"unknown executor '{value}'",
                                       hint=f"valid executors: {', '.join(sorted(EXECUTORS))}")
        if key == "executor" and isinstance(value, str):
            from .exec.spawn import check_main_guard
            check_main_guard(value)  # before the setting changes
        self.settings.set(name, value)
        self.engine.setting_changed(key)

    # -- the SQL dialect -----------------------------------------------------------------------
    @one_at_a_time
    def execute(self, sql: str, parameters: Sequence[Any] | None = None):
        """Run one or more statements of the dialect; returns the result of the last one (an
        empty status result when there is none)."""
        if parameters is not None and type(parameters) not in (dict, list, tuple) and (
                isinstance(parameters, (str, bytes))
                or not isinstance(parameters, (Sequence, Mapping))):  # (typing's ABCs: slow)
            raise ProgrammingError(f"parameters must be a list or tuple of values (one per ?), "
                                   f"got {type(parameters).__name__}")
        try:
            stmts = parse(sql)
        except ParserError:  # as execute_script: an open block can only be rolled back now
            self.session.abort_block()
            raise
        results = run_script(self, sql, stmts, parameters, last=True)  # the last result only
        # the connection's fetches read it (DuckDB's con.execute(...); con.fetchall())
        if results:
            self._last_result = results[-1]
        else:
            from .result import Result
            self._last_result = Result.status("OK", sql)
        return self._last_result

    @one_at_a_time
    def execute_script(self, sql: str, parameters: Sequence[Any] | None = None,
                       on_result=None) -> list:
        """Run every statement of ``sql``: one Result per statement. ``on_result`` sees each
        result as soon as it exists (the CLI prints it while later statements run)."""
        from .session import run_script
        try:
            stmts = parse(sql)
        except ParserError:  # a block open since an earlier call can only be rolled back now
            self.session.abort_block()
            raise
        return run_script(self, sql, stmts, parameters, on_result)

    def pending_statements(self) -> int | None:
        """How many statements wait in an open BEGIN block for COMMIT; None when none is open."""
        return self.session.pending()

    @one_at_a_time
    def explain(self, query: str | Graph | EinGraph, format: str = "text", analyze: bool = False,
                *, pieces: Mapping[str, Mapping[str, int]] | None = None) -> str:
        """EXPLAIN [ANALYZE] a statement (SQL text) or a graph, as text, JSON, dot or svg. With
        ``analyze`` it runs (its outputs are stored) and the measurements are shown too."""
        if isinstance(query, (Graph, EinGraph)):
            from .explain import check_format
            check_format(format)
            return self.engine.explain(self.engine.prepare(query, pieces), format, analyze)
        if pieces:
            raise ProgrammingError("pieces= applies to a Graph; in SQL text write "
                                   "WITH (PIECES label n, ...) after the statement")
        from .session import explain_format, explain_script
        fmt = explain_format(format)
        if analyze:  # it runs: the collector waits only while each stage builds (pipeline.py)
            return explain_script(self, query, parse(query), fmt, analyze)
        with gc_paused():  # parse to text, nothing run: the collector waits for it all
            return explain_script(self, query, parse(query), fmt, analyze)

    @one_at_a_time
    def sql(self, query: str, *, alias: str = "", params=None):
        """Plain SQL over tables and tensors (a DuckDB relation); tensors appear as
        relations with one column per dimension plus ``value``; ``params`` fill ``?`` or
        ``$name`` placeholders, as in DuckDB's ``sql``. DataFrames and Arrow tables of the
        calling code are read by their variable names, as DuckDB reads them."""
        from .sqlfront.relations import sql, transaction_statement
        if not isinstance(query, str):
            raise ProgrammingError(f"a query must be a string, got {type(query).__name__}")
        if self.session.block is not None and transaction_statement(query):
            # the block's statements wait for its COMMIT: a transaction of DuckDB's begun or
            # ended meanwhile would take them in, or leave them out, behind the block's back
            raise ProgrammingError("a BEGIN ... COMMIT block of tensordb statements is open: "
                                   "con.sql cannot begin or end a transaction now",
                                   hint="end the block with COMMIT or ROLLBACK first")
        rel = sql(self.store, query, params, relation=True)
        return rel.set_alias(alias) if alias and rel is not None else rel

    @one_at_a_time
    def _read_sql(self, query: str):
        """``sql`` of a query of tensordb's own that only reads tensors (a result's rows):
        the catalog's cached answers stay (relations.sql ``reads``)."""
        from .sqlfront.relations import sql
        return sql(self.store, query, None, relation=True, reads=True)

    # -- einsum --------------------------------------------------------------------------------
    @one_at_a_time
    def einsum(self, spec: str, *operands, into: str | None = None, join: str | None = None,
               agg: str = "sum", pieces: Mapping[str, int] | None = None, replace: bool = True,
               optimize: Any = None):
        """Run a numpy-style einsum over stored tensors (names) or arrays, which are stored as
        temporaries for the call (``TensorIO._operands``). ``optimize`` takes any of numpy's
        values and changes nothing: tensordb's own optimizer plans every einsum.

        Without ``into`` the result is returned as a numpy array (a numpy scalar when it has no
        dimensions), like ``numpy.einsum``, and nothing is stored. With ``into`` it is stored
        under that name, replacing a tensor of that name as an assignment statement does
        (``replace=False`` refuses instead), and the run's measurements are returned. ``join``
        replaces the product with a scalar expression over x0, x1, ... (``"x0 + x1"`` with
        ``agg="min"`` is a min-plus product); ``pieces`` fixes the pieces of some labels
        (``{"i": 4}``: split ``i`` in 4), the optimizer chooses the others. Next to an inf the
        answer is the sum of the products, which numpy's einsum is not when it sums a label of
        one operand first (docs/sql.md, "Absent tiles and non-finite values").

        >>> import numpy as np, tensordb
        >>> with tensordb.connect() as con:
        ...     con.load("A", np.arange(4.0).reshape(2, 2))
        ...     con.einsum("ij,jk->ik", "A", "A")
        array([[ 2.,  3.],
               [ 6., 11.]])
        """
        with self._operands(operands) as operands:
            return self._einsum(spec, operands, into, join, agg, pieces, replace)

    def _einsum(self, spec, operands, into, join, agg, pieces, replace):
        if into is not None:
            graph = Graph().einsum(spec, *operands, into=into, join=join, agg=agg, pieces=pieces)
            return self.run(graph, replace=replace)
        name = next(n for n in (f"einsum_{k}" for k in range(len(operands) + 1))
                    if n not in operands and not self.store.has(n))
        graph = Graph().einsum(spec, *operands, into=name, join=join, agg=agg, pieces=pieces)
        graph.steps[-1] = dataclasses.replace(graph.steps[-1], named=False)  # errors show no into=
        return self._compute(graph, name)

    def _compute(self, graph: Graph, name: str):
        """Run a graph whose one output is ``name`` and return it as an array; nothing is
        stored (the output tiles stay in memory and are assembled: driver.ArraySink)."""
        return self.engine.compute(graph, name, check=self._check_dense)

    @one_at_a_time
    def run(self, graph: Graph | EinGraph, *, pieces: Mapping[str, Mapping[str, int]] | None = None,
            replace: bool = True):
        """Plan and run a whole graph of operations at once; stores its outputs atomically,
        replacing tensors of the same names as assignments do (``replace=False`` refuses).
        ``pieces`` maps result names to {label: pieces} fixed for them (added to the graph's)."""
        return self.engine.run_graph(graph, pieces, replace=replace)

    @one_at_a_time
    def plan(self, graph: Graph | EinGraph, pieces=None):
        """optimize, lower, place: a graph -> (Decomposition, placed TilePlan); nothing runs
        (the driver's ``prepare``, tensordb/driver/pipeline.py). A plan is cached under the
        layout of its inputs, not their versions: a graph over new versions of the same layout
        (a training step) reuses it, reading the current versions."""
        return self.engine.plan(graph, pieces)

    def _run_graph(self, graph: EinGraph, *, pieces=None, replace=False, planned=None):
        """Run ``graph`` as planned: ``planned`` = (decomposition, plan) as ``plan`` gave, or
        changed by the caller (tests that force a kernel)."""
        from .driver import Prepared, Snapshot
        prepared = None if planned is None else Prepared(Snapshot(self.store), graph, pieces or {},
                                                         *planned, fresh=True)
        return self.engine.run_graph(graph, pieces, replace=replace, prepared=prepared)

    @property
    def plan_cache_stats(self) -> dict[str, int]:
        """The plan cache's counters: ``hits``, ``misses`` and ``size`` (plans kept)."""
        return self._plan_cache.stats()

    # the engine's executor and prepared-statement cache (tests reach for them)
    def _get_executor(self):
        return self.engine.executor()

    _executor = property(lambda self: self.engine._executor,
                         lambda self, ex: self.engine.set_executor(ex))
    _plan_cache = property(lambda self: self.engine.cache)
