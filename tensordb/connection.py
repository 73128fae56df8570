"""Connection: the embedded database. It is the one driver of the pipeline; each stage is one
call, timed under TENSORDB_DEBUG=1:

    text --parse--> statements --bind--> EinGraph --optimize--> Decomposition
         --lower--> TilePlan --place--> --run--> tiles --commit--> store

The statements that are not einsums, blocks and LETs are the session's (tensordb/session/).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from . import optimizer, physical
from .calls import one_at_a_time
from .config import Settings, debug_level, stage
from .duckapi import DuckAPI, connect_arguments
from .errors import CatalogError, InterfaceError, ParserError, ProgrammingError
from .plan.builder import Graph
from .plan.ir import EinGraph
from .session import Session
from .storage import Store
from .tensor_io import TensorIO

__all__ = ["Connection", "connect"]

# A statement planned afresh whose kernels do at most this many flops (a few ms) leaves the user
# table check to its commit (see _run_graph).
EARLY_CHECK_FLOPS = 1 << 24
# Settings the executor is made with: changing one makes a new executor.
_EXECUTOR_SETTINGS = frozenset({"workers", "executor", "memory_limit", "pin_workers"})


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


def _bind_group(store, lets, items) -> tuple[EinGraph | None, dict]:
    from .bind import bind_statements
    binder = bind_statements(store, lets, items)
    if not (binder.steps and binder.outputs):
        return None, {}
    return binder.eingraph(), dict(binder.pieces)


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
        self._executor = None
        self.session = Session()  # the dialect's state: LETs and the open BEGIN block
        self.last_plan = None  # the TilePlan of the last einsum run (for EXPLAIN ANALYZE, tests)
        self.last_run = None   # what that run returned: tiles and statistics (exec.RunResult)
        # Called as (done, total) tasks while a plan runs (the CLI); ``done`` counts the running
        # kernel calls' fractions too, so it grows while a few long calls run.
        self.progress_callback = None
        # Plans of bound graphs, reused while their inputs' versions and the settings hold.
        self._plan_cache = physical.PlanCache()
        from .bind.reuse import BoundCache
        self._bound = BoundCache()

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        if self._store is None:
            raise InterfaceError("the connection is closed")
        return self._store

    @one_at_a_time
    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
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
        if key in _EXECUTOR_SETTINGS:
            self._drop_executor()

    def _restore_settings(self, saved: Settings) -> None:
        """Return every setting to ``saved``: a unit that failed leaves them as it found them."""
        changed = [f.name for f in dataclasses.fields(saved)
                   if getattr(saved, f.name) != getattr(self.settings, f.name)]
        for name in changed:
            setattr(self.settings, name, getattr(saved, name))
        if _EXECUTOR_SETTINGS.intersection(changed):
            self._drop_executor()

    def _drop_executor(self) -> None:
        """The executor was made for other settings: the next run makes a new one."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    # -- the SQL dialect -----------------------------------------------------------------------
    @one_at_a_time
    def execute(self, sql: str, parameters: Sequence[Any] | None = None):
        """Run one or more statements of the dialect; returns the result of the last one (an
        empty status result when there is none)."""
        from .result import Result
        if parameters is not None and (isinstance(parameters, (str, bytes)) or
                                       not isinstance(parameters, (Sequence, Mapping))):
            raise ProgrammingError(f"parameters must be a list or tuple of values (one per ?), "
                                   f"got {type(parameters).__name__}")
        results = self.execute_script(sql, parameters)
        # the connection's fetches read it (DuckDB's con.execute(...); con.fetchall())
        self._last_result = results[-1] if results else Result.status("OK", sql)
        return self._last_result

    @one_at_a_time
    def execute_script(self, sql: str, parameters: Sequence[Any] | None = None,
                       on_result=None) -> list:
        """Run every statement of ``sql``: one Result per statement. ``on_result`` sees each
        result as soon as it exists (the CLI prints it while later statements run)."""
        from .session import run_script
        try:
            stmts = self._parse(sql)
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
            graph, pieces = self._bind(query, pieces)
            return self._explain_graph(graph, pieces, format=format, analyze=analyze)
        if pieces:
            raise ProgrammingError("pieces= applies to a Graph; in SQL text write "
                                   "WITH (PIECES label n, ...) after the statement")
        from .session import explain_format, explain_script
        fmt = explain_format(format)
        return explain_script(self, query, self._parse(query), fmt, analyze)

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
        stored (the output tiles stay in memory and are assembled here)."""
        from .geometry import tile_box
        bound, pieces = self._bind(graph)
        decomp, plan = self.plan(bound, pieces)
        out = plan.outputs[name]
        self._check_dense("the einsum's result", out.shape, out.dtype)
        result = self._run(plan)
        # Tiles no call produced are zeros. np.zeros' pages take memory only once written, and
        # each tile is let go as it lands: the run's tiles and the array are not both held whole.
        arr = np.zeros(out.shape, out.dtype)
        for coords, key in out.tiles.items():
            lo, hi = tile_box(out.grid, coords)
            arr[tuple(slice(a, b) for a, b in zip(lo, hi))] = result.tiles.pop(key)
        return arr[()] if arr.ndim == 0 else arr  # a numpy scalar, as numpy.einsum gives

    @one_at_a_time
    def run(self, graph: Graph | EinGraph, *, pieces: Mapping[str, Mapping[str, int]] | None = None,
            replace: bool = True):
        """Plan and run a whole graph of operations at once; stores its outputs atomically,
        replacing tensors of the same names as assignments do (``replace=False`` refuses).
        ``pieces`` maps result names to {label: pieces} fixed for them (added to the graph's)."""
        graph, pieces = self._bind(graph, pieces)
        return self._run_graph(graph, pieces=pieces, replace=replace)

    # -- the pipeline: each stage one call ------------------------------------------------------
    def _parse(self, sql: str) -> list:
        """parse: text -> statements (ASTs with spans)."""
        from .dialect import parse
        if not isinstance(sql, str):
            raise ProgrammingError(f"a statement must be a string, got {type(sql).__name__}")
        with stage("parse"):
            return parse(sql)

    def _bind(self, graph: Graph | EinGraph, pieces=None) -> tuple[EinGraph, dict]:
        """bind: a Graph of named steps -> the checked EinGraph, and the pieces it carries."""
        from .bind import bind_graph
        if isinstance(graph, EinGraph):
            return graph, dict(pieces or {})
        with stage("bind"):
            return bind_graph(graph, self.store), {**graph.pieces, **(pieces or {})}

    def _bind_statements(self, items) -> tuple[EinGraph | None, dict]:
        """bind: einsum statements (with the session's LETs) -> the EinGraph of what they store
        (None when they only define LETs), and its pieces. A repeated group whose LETs and
        catalog answers are the same again (a training step) is bound once (``bind/reuse.py``)."""
        with stage("bind"):
            return self._bound.bind(self.store, self.session.lets, items, _bind_group)

    def _run_statements(self, items) -> None:
        """A group of einsum statements: bind, optimize, lower, place, run, commit."""
        graph, pieces = self._bind_statements(items)
        if graph is not None:
            self._run_graph(graph, pieces=pieces, replace=True)

    def _explain_statements(self, items, format: str = "text", analyze: bool = False) -> str:
        graph, pieces = self._bind_statements(items)
        return self._explain_graph(graph, pieces, format=format, analyze=analyze)

    def _explain_graph(self, graph: EinGraph, pieces, format: str = "text", analyze: bool = False):
        """Plan ``graph`` (and with ``analyze`` run that very plan) and have explain render it."""
        from .explain import render
        decomp, plan = self.plan(graph, pieces)
        # on a GPU: what of the inputs is on the devices already (before ANALYZE's run); an
        # executor not started yet holds nothing, and EXPLAIN starts none
        resident = getattr(self._executor, "resident", lambda plan: None)(plan)
        result = self._run_graph(graph, replace=True, planned=(decomp, plan)) if analyze else None
        return render(decomp, plan, format=format, result=result, resident=resident)

    @one_at_a_time
    def plan(self, graph: EinGraph, pieces=None):
        """optimize, lower, place: a bound graph -> (Decomposition, placed TilePlan); nothing
        runs. Aggregations wider than the executor combines in one task (its ``max_fan_in``;
        None: any) become trees on their worker. A plan is cached under the layout of its
        inputs, not their versions (physical/cache.py): a graph over new versions of the same
        layout (a training step) reuses it, reading the current versions. TENSORDB_DEBUG=2
        prints the plan as EXPLAIN shows it, =3 its tile tasks too."""
        from .exec import max_fan_in
        fan_in = max_fan_in(self.settings.executor, self._get_executor)
        # The one read of the inputs' catalog entries for the whole plan (cached in the store):
        # the plan cache's key, the optimizer's sparsity and facts and the lowering's tile
        # joins all read these readers.
        readers = self.store.open_many([t.name for t in graph.inputs])
        layouts = {name: r.layout() for name, r in readers.items()}
        key = physical.plan_key(graph, pieces, layouts, self._plan_settings(), fan_in)
        cached = self._plan_cache.get(key)
        if cached is not None:
            if debug_level() >= 1:
                print(f"[tensordb] plan cache hit ({self._plan_cache.hits} hits)", file=sys.stderr)
            decomp, plan = cached
            return decomp, physical.rebind(plan, readers, graph.ops)
        facts = {name: r.facts() for name, r in readers.items()}
        decomp = self._optimize(graph, pieces, readers, facts)
        with stage("lower"):
            plan = physical.lower(graph, decomp, self.store, readers, facts)
        with stage("place"):
            plan = physical.place(plan)
            plan = physical.aggregation_trees(plan, fan_in)  # on the workers placement chose
            plan = physical.order(plan)  # the memory-aware order the pool runs tasks in
        self._plan_cache.prune(self.store.has)
        self._plan_cache.put(key, decomp, plan, readers)
        if debug_level() >= 2:
            from .explain import render
            print(render(decomp, plan), physical.describe(plan), sep="\n", file=sys.stderr)
        if debug_level() >= 3:
            print(physical.describe_tasks(plan), file=sys.stderr)
        return decomp, plan

    @property
    def plan_cache_stats(self) -> dict[str, int]:
        """The plan cache's counters: ``hits``, ``misses`` and ``size`` (plans kept)."""
        return self._plan_cache.stats()

    def _plan_settings(self) -> tuple:
        """The settings a plan depends on (all but the CLI's progress display)."""
        return tuple((f.name, getattr(self.settings, f.name))
                     for f in dataclasses.fields(self.settings) if f.name != "progress")

    def _optimize(self, graph: EinGraph, pieces, readers, facts):
        """optimize: the Decomposition (pieces per label of every operation) and its cost, from
        the inputs' ``readers`` and their ``facts`` (TensorReader.facts) that ``plan`` read."""
        metas = {name: r.meta for name, r in readers.items()}
        grids = {name: m.grid for name, m in metas.items()}
        # Block-sparse inputs: the optimizer counts only the kernel calls whose tiles exist,
        # and only where the partner tiles are finite (0 * inf is NaN): what the catalog knows.
        sparse = {name: r.coords() for name, r in readers.items()
                  if metas[name].tile_count < metas[name].total_tiles}
        # Fixed pieces name statements: the operations computed under a statement's name (its
        # pairwise steps, temporaries, internal name) take them on; bad ones are errors here.
        pieces = optimizer.pieces_per_op(graph, pieces)
        # The optimizer plans for the workers that will run the plan: the local pool's, or the
        # cluster's when the executor is a Dask cluster.
        local = self.settings.executor == "local"
        workers = self.settings.workers if local else self._get_executor().workers
        # The local pool's workers share this machine's cores: with SET blas_one_call = on, one
        # BLAS call may use them all (optimizer/threads.py); a Dask cluster's or a GPU's calls,
        # and by default the pool's, stay as the tiling makes them.
        threads = min(workers, _cores()) if local and self.settings.blas_one_call else 1
        with stage("optimize"):
            return optimizer.decompose(graph, workers, strategy=self.settings.tiling,
                                       memory_limit=self.settings.memory_limit, pieces=pieces,
                                       input_grids=grids, input_tiles=sparse, input_facts=facts,
                                       blas_threads=threads, input_stats=_stored_stats(readers))

    def _run(self, plan, destinations=None, finished=None):
        """run: the executor runs the placed plan; its output tiles come back (or, with
        ``destinations``, are written straight into their new payload files, each handed to
        ``finished`` once it is final)."""
        with stage("run"):
            result = self._get_executor().run(plan, self.store, progress=self.progress_callback,
                                              destinations=destinations, finished=finished)
        self.last_plan, self.last_run = plan, result
        return result

    def _run_graph(self, graph: EinGraph, *, pieces=None, replace=False, planned=None):
        """Plan (unless ``planned`` = (decomposition, plan) is given), run, commit atomically."""
        for name in graph.outputs:
            name = graph.stored_name(name)
            if self.store.has(name) and not replace:
                raise CatalogError(f"tensor '{name}' already exists",
                                   hint="use replace=True (CREATE OR REPLACE) to overwrite it")
        hits = self._plan_cache.hits
        decomp, plan = planned if planned is not None else self.plan(graph, pieces)
        # Output tiles are computed straight into their new payload files where the executor
        # can (in-process workers); nothing is visible until the catalog commit. A user table
        # named like an output is refused by the commit; a graph planned afresh (a new
        # statement) is also checked before its run, so that a refused name costs no compute,
        # unless its kernels are a few milliseconds at most: then that catalog query (0.5 ms)
        # would cost more than it could save. A repeated graph (its plan cached) is not.
        # Outputs computed in anonymous memory are outside the memory budget: a sixteenth of
        # the limit at most (no limit: the writer's own cap per file).
        limit = self.settings.memory_limit
        self._get_executor()  # before the writers take spares: it may turn their recycling off
        # the staging buffers kept between statements: no more than one statement may stage
        self.store.staging.cap(None if limit is None else limit // 16)
        writers = physical.OutputWriters(self.store, plan, replace=replace,
                                         check_tables=self._plan_cache.hits == hits and
                                         sum(s.flops for s in plan.stats) > EARLY_CHECK_FLOPS,
                                         stage_max=None if limit is None else limit // 16,
                                         sparse_nnz=decomp.details.get("output_nnz"))
        try:
            result = self._run(plan, writers.buffers, writers.finished)
        except BaseException:
            writers.abort()
            raise
        with stage("commit"):
            writers.store_tiles(result.tiles, result.nnz, result.nonfinite, result.crc32)
        result.output_nnz = writers.nnz()  # what EXPLAIN ANALYZE compares the estimate with
        # The tiles are the stored tensors' now (read them through the catalog): the result
        # keeps its statistics, not the buffers, which the next run's outputs may then reuse
        # (a staging buffer, a spare payload file no mapping holds).
        result.tiles = {}
        return result

    def _get_executor(self):
        if self._executor is not None and not getattr(self._executor, "alive", True):
            self._drop_executor()  # its cluster went away: connect again
        if self._executor is None:
            from .exec import make_executor
            self._executor = make_executor(self.settings.executor, self.settings.workers,
                                           memory_limit=self.settings.memory_limit)
            if hasattr(self._executor, "pin_workers"):
                self._executor.pin_workers = self.settings.pin_workers  # before threads start
            if getattr(self._executor, "other_processes_read_files", False):
                self.store.spares.disable()  # a retired file may be mapped in another process
        return self._executor


def _cores() -> int:
    """The cores this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


def _stored_stats(readers) -> dict:
    """Per stored input, its tiles' formats, nonzeros and payload bytes (the catalog's): the
    optimizer prices sparse inputs by them, and EXPLAIN shows them."""
    out = {}
    for name, r in readers.items():
        if not hasattr(r, "entries"):  # a slice's or a gather's reader: read densified (boxes.py)
            continue
        entries = r.entries.values()
        out[name] = optimizer.StoredStats(tuple(sorted({e.format for e in entries})) or ("dense",),
                                          sum(int(e.nnz) for e in entries),
                                          sum(int(e.nbytes) for e in entries))
    return out
