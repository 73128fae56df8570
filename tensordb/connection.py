"""Connection: the embedded database. It runs the pipeline; each stage is one call.

    text --dialect--> statements --binder--> EinGraph --optimizer--> Decomposition
         --lower--> TilePlan --place--> --executor--> tiles --> store
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from . import optimizer, physical
from .config import Settings, available_memory, debug_level, format_bytes, stage
from .errors import CatalogError, InterfaceError, OutOfMemoryError, ProgrammingError
from .plan.builder import Graph, bind
from .plan.ir import EinGraph
from .storage import Store

__all__ = ["Connection", "connect"]


def connect(path: str | os.PathLike | None = None, *, workers: int | None = None,
            memory_limit: int | str | None = None, executor: str = "local",
            read_only: bool = False) -> "Connection":
    """Open a database: in memory when ``path`` is None, else a directory that persists.

    >>> import numpy as np, tensordb
    >>> with tensordb.connect() as con:
    ...     con.load("A", np.eye(3))
    ...     _ = con.einsum("ij,jk->ik", "A", "A", into="B")
    ...     float(con.tensor("B").sum())
    3.0
    """
    return Connection(path, workers=workers, memory_limit=memory_limit, executor=executor,
                      read_only=read_only)


class Connection:
    """One open database. Use as a context manager: leaving the block closes it."""

    def __init__(self, path=None, *, workers=None, memory_limit=None, executor="local",
                 read_only=False) -> None:
        self.settings = Settings()
        for key, value in (("workers", workers), ("memory_limit", memory_limit),
                           ("executor", executor)):
            if value is not None:
                self.settings.set(key, value)
        if executor is not None:  # refuse an unguarded script here, before anything starts
            from .exec.spawn import check_main_guard
            check_main_guard(self.settings.executor)
        self._store: Store | None = Store(path, read_only=read_only)
        self._executor = None
        self.last_plan = None  # the TilePlan of the last einsum run (for EXPLAIN ANALYZE, tests)
        # Called as (done, total) tasks while a plan runs (the CLI); ``done`` counts the running
        # kernel calls' fractions too, so it grows while a few long calls run.
        self.progress_callback = None

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        if self._store is None:
            raise InterfaceError("the connection is closed")
        return self._store

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- DB-API 2.0 ----------------------------------------------------------------------------
    def cursor(self):
        """A DB-API 2.0 cursor over this connection (see tensordb/cursor.py)."""
        from .cursor import Cursor
        _ = self.store  # a closed connection: InterfaceError
        return Cursor(self)

    def commit(self) -> None:
        """Every statement commits on its own (each ``execute`` call is a unit), so this does
        nothing unless a transaction is open: it ends a BEGIN block as COMMIT does (its
        statements run and are stored, or none is), or commits a transaction begun with plain
        SQL (``con.sql("BEGIN")``)."""
        from .dialect.executor import session
        if session(self).block is not None:
            self.execute("COMMIT")
        elif self.store.user_transaction:
            self.sql("COMMIT")

    def rollback(self) -> None:
        """Discard an open BEGIN block (as ROLLBACK does) or a transaction begun with plain SQL;
        nothing to undo otherwise (what ran is committed)."""
        from .dialect.executor import session
        if session(self).block is not None:
            self.execute("ROLLBACK")
        elif self.store.user_transaction:
            self.sql("ROLLBACK")

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set(self, name: str, value: Any) -> None:
        """Change a setting (``workers``, ``memory_limit``, ``executor``, ``tiling``, ...)."""
        key = str(name).lower()
        if key == "tiling" and value:
            from .optimizer import STRATEGIES
            if str(value) not in STRATEGIES:
                raise ProgrammingError(f"unknown tiling strategy '{value}'",
                                       hint=f"valid strategies: {', '.join(sorted(STRATEGIES))}")
        if key == "executor":
            from .exec import EXECUTORS
            if str(value).split("://", 1)[0] not in EXECUTORS:
                raise ProgrammingError(f"unknown executor '{value}'",
                                       hint=f"executors: {', '.join(sorted(EXECUTORS))}")
        if key == "executor" and isinstance(value, str):
            from .exec.spawn import check_main_guard
            check_main_guard(value)  # before the setting changes
        self.settings.set(name, value)
        if name.lower() in ("workers", "executor", "memory_limit") and self._executor is not None:
            self._executor.close()
            self._executor = None

    # -- the SQL dialect -----------------------------------------------------------------------
    def execute(self, sql: str, parameters: Sequence[Any] | None = None):
        """Run one or more statements of the dialect; returns the result of the last one."""
        from . import dialect
        if parameters is not None and (isinstance(parameters, (str, bytes)) or
                                       not isinstance(parameters, (Sequence, Mapping))):
            raise ProgrammingError(f"parameters must be a list or tuple of values (one per ?), "
                                   f"got {type(parameters).__name__}")
        return dialect.execute(self, sql, parameters)

    def explain(self, sql: str, format: str = "text", analyze: bool = False) -> str:
        """EXPLAIN [ANALYZE] a statement, as text or JSON."""
        from . import dialect
        return dialect.explain(self, sql, format=format, analyze=analyze)

    def sql(self, query: str):
        """Plain SQL over tables and tensors (a DuckDB relation); tensors appear as
        relations with one column per dimension plus ``value``."""
        from .storage.relations import sql
        if not isinstance(query, str):
            raise ProgrammingError(f"a query must be a string, got {type(query).__name__}")
        return sql(self.store, query)

    # -- tensors in and out --------------------------------------------------------------------
    def load(self, name: str, source, *, tile: Sequence[int] | None = None, replace: bool = False,
             **options) -> None:
        """Store a tensor from a numpy array, a .npy/.npz/.parquet/.csv path, or a SQL query.

        Options: ``array`` (npz member), ``index``/``value``/``shape`` (coordinate tables),
        ``dims`` (dimension names), ``format`` (when the suffix does not say), ``query`` (SQL).
        """
        from .storage.load import load_tensor
        with stage("load"):
            load_tensor(self.store, name, source, tile=tile, replace=replace, **options)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as a dense numpy array (OutOfMemoryError, before allocating, when it would
        not fit the memory_limit or the memory available)."""
        reader = self.store.open(name)
        meta = reader.meta
        self._check_dense(f"tensor '{meta.name}'", meta.shape, meta.dtype)
        try:
            return reader.to_numpy()
        except MemoryError:  # the estimate above was too hopeful
            raise OutOfMemoryError(f"out of memory reading tensor '{meta.name}' "
                                   f"({format_bytes(math.prod(meta.shape) * meta.dtype.itemsize)})"
                                   " as a dense array") from None

    def _check_dense(self, what: str, shape, dtype) -> None:
        dtype = np.dtype(dtype)
        need = math.prod(shape) * dtype.itemsize
        limit, free = self.settings.memory_limit, available_memory()
        for budget, where in ((limit, "the memory_limit"), (free, "the memory available")):
            if budget is not None and need > budget:
                raise OutOfMemoryError(
                    f"{what} {dtype.name} {tuple(shape)} needs {format_bytes(need)} as a dense "
                    f"array, more than {where} ({format_bytes(budget)})",
                    hint="read it in parts with SQL (con.sql), or COPY it to a file")

    def tensors(self) -> list[dict]:
        """One dict per stored tensor: name, shape, dtype, tiling, bytes, stored tiles, density."""
        from .storage.info import list_tensors
        return list_tensors(self.store)

    def describe(self, name: str) -> dict:
        from .storage.info import describe_tensor
        return describe_tensor(self.store, name)

    def export(self, name: str, path: str | os.PathLike, format: str | None = None) -> None:
        """Write a tensor to .npy, .parquet or .csv (COPY name TO 'path')."""
        from .storage.export import export_tensor
        if not isinstance(path, (str, os.PathLike)):
            raise ProgrammingError(f"an export path must be a string or path, got {type(path).__name__}")
        if format is not None and not isinstance(format, str):
            raise ProgrammingError(f"an export format must be a string, got {type(format).__name__}")
        export_tensor(self.store, name, path, format=format)

    def drop(self, name: str, if_exists: bool = False) -> None:
        self.store.drop(name, if_exists=if_exists)

    def check(self, name: str | None = None) -> list[dict]:
        """Verify every stored tile of tensor ``name`` (None: the whole database, orphan files
        too) against its checksum and catalog row, reading the files (CHECK TENSOR / CHECK
        DATABASE). One dict per problem (tensor, tile, file, offset, problem); a single row whose
        problem is 'ok' when none was found. Changes nothing.

        >>> import numpy as np, tensordb
        >>> with tensordb.connect() as con:
        ...     con.load("A", np.eye(3))
        ...     con.check("A")[-1]["problem"]
        'ok'
        """
        from .storage.integrity import COLUMNS, check
        return [dict(zip(COLUMNS, row)) for row in check(self.store, name)]

    # -- einsum --------------------------------------------------------------------------------
    def einsum(self, spec: str, *operands: str, into: str | None = None, join: str | None = None,
               agg: str = "sum", tile: Mapping[str, int] | None = None, replace: bool = True):
        """Run a numpy-style einsum over stored tensors.

        Without ``into`` the result is returned as a numpy array (a numpy scalar when it has no
        dimensions), like ``numpy.einsum``, and nothing is stored. With ``into`` it is stored
        under that name, replacing a tensor of that name as an assignment statement does
        (``replace=False`` refuses instead), and the run's measurements are returned. ``join``
        replaces the product with a scalar expression over x0, x1, ... (``"x0 + x1"`` with
        ``agg="min"`` is a min-plus product); ``tile`` pins pieces per label.

        >>> import numpy as np, tensordb
        >>> with tensordb.connect() as con:
        ...     con.load("A", np.arange(4.0).reshape(2, 2))
        ...     con.einsum("ij,jk->ik", "A", "A")
        array([[ 2.,  3.],
               [ 6., 11.]])
        """
        if into is not None:
            graph = Graph().einsum(spec, *operands, into=into, join=join, agg=agg, tile=tile)
            return self.run(graph, replace=replace)
        name = next(n for n in (f"einsum_{k}" for k in range(len(operands) + 1))
                    if n not in operands and not self.store.has(n))
        graph = Graph().einsum(spec, *operands, into=name, join=join, agg=agg, tile=tile)
        return self._compute(graph, name)

    def _compute(self, graph: Graph, name: str):
        """Run a graph whose one output is ``name`` and return it as an array; nothing is
        stored (the output tiles stay in memory and are assembled here)."""
        from .geometry import tile_box
        hints = dict(graph.hints)
        with stage("bind"):
            bound = bind(graph, self.store)
        decomp, plan = self.plan(bound, hints)
        out = plan.outputs[name]
        self._check_dense("the einsum's result", out.shape, out.dtype)
        with stage("run"):
            result = self._get_executor().run(plan, self.store, progress=self.progress_callback)
        self.last_plan = plan
        arr = np.zeros(out.shape, out.dtype)  # tiles no call produced are zeros
        for coords, key in out.tiles.items():
            lo, hi = tile_box(out.grid, coords)
            arr[tuple(slice(a, b) for a, b in zip(lo, hi))] = result.tiles[key]
        return arr[()] if arr.ndim == 0 else arr  # a numpy scalar, as numpy.einsum gives

    def run(self, graph: Graph | EinGraph, *, hints: Mapping[str, Mapping[str, int]] | None = None,
            replace: bool = True):
        """Plan and run a whole graph of operations at once; stores its outputs atomically,
        replacing tensors of the same names as assignments do (``replace=False`` refuses)."""
        if isinstance(graph, Graph):
            hints = {**graph.hints, **(hints or {})}
            with stage("bind"):
                graph = bind(graph, self.store)
        return self._run_graph(graph, hints=hints, replace=replace)

    def plan(self, graph: EinGraph, hints=None):
        """Optimize, lower and place a bound graph: the TilePlan (nothing runs)."""
        metas = {t.name: self.store.meta(t.name) for t in graph.inputs}
        grids = {name: m.grid for name, m in metas.items()}
        # Block-sparse inputs: the optimizer counts only the kernel calls whose tiles exist.
        readers = {name: self.store.open(name) for name in metas}
        sparse = {name: r.coords() for name, r in readers.items()
                  if metas[name].tile_count < metas[name].total_tiles}
        # ...and only where the partner tiles are finite (0 * inf is NaN): what the catalog knows.
        facts = {name: r.facts() for name, r in readers.items()}
        # Hints name statements: the operations computed under a statement's name (its pairwise
        # steps, temporaries, internal name) take them on; bad hints are errors here.
        hints = optimizer.pins_from_hints(graph, hints)
        # The optimizer plans for the workers that will run the plan: the local pool's, or the
        # cluster's when the executor is a Dask cluster.
        workers = self.settings.workers if self.settings.executor == "local" else \
            self._get_executor().workers
        with stage("optimize"):
            decomp = optimizer.decompose(graph, workers, strategy=self.settings.tiling,
                                         memory_limit=self.settings.memory_limit, hints=hints,
                                         input_grids=grids, input_tiles=sparse,
                                         input_facts=facts)
        with stage("lower"):
            plan = physical.lower(graph, decomp, self.store)
        with stage("place"):
            plan = physical.place(plan)
        if debug_level() >= 2:
            print(physical.describe(plan), file=sys.stderr)
        return decomp, plan

    def _run_graph(self, graph: EinGraph, *, hints=None, replace=False, planned=None):
        """Plan (unless ``planned`` = (decomposition, plan) is given), run, store atomically."""
        for name in graph.outputs:
            name = graph.stored_name(name)
            if self.store.has(name) and not replace:
                raise CatalogError(f"tensor '{name}' already exists",
                                   hint="use replace=True (CREATE OR REPLACE) to overwrite it")
        decomp, plan = planned if planned is not None else self.plan(graph, hints)
        executor = self._get_executor()
        # Output tiles are computed straight into their new payload files where the executor
        # can (in-process workers); nothing is visible until the catalog commit.
        writers = physical.OutputWriters(self.store, plan, replace=replace)
        try:
            with stage("run"):
                result = executor.run(plan, self.store, progress=self.progress_callback,
                                      destinations=writers.buffers)
        except BaseException:
            writers.abort()
            raise
        with stage("store"):
            writers.store_tiles(result.tiles, result.nnz, result.nonfinite)
        self.last_plan = plan
        return result

    def _get_executor(self):
        if self._executor is None:
            from .exec import make_executor
            self._executor = make_executor(self.settings.executor, self.settings.workers,
                                           memory_limit=self.settings.memory_limit)
        return self._executor
