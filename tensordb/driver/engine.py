"""The engine: what the driver keeps between calls for one connection (its store, settings,
session, executor and prepared-statement cache), and the calls the Connection, the session
(tensordb/session/), the CLI and EXPLAIN make of it. Each call takes one catalog snapshot,
prepares against it and runs (pipeline.py).

>>> import numpy as np, tensordb
>>> con = tensordb.connect()
>>> con.load("A", np.eye(2))
>>> from tensordb.dialect import parse
>>> text = "B[i,k] = SUM(A[i,j] * A[j,k])"
>>> con.engine.run_statements([(text, s) for s in parse(text)]).kernel_calls
1
"""
from __future__ import annotations

import dataclasses
import os

from ..config import Settings, debug_level, gc_paused, stage
from ..errors import CatalogError, InterfaceError
from .cache import PreparedCache, rebind
from .pipeline import Prepared, Target, prepare
from .replay import lets_key
from .sink import ArraySink, StoreSink
from .snapshot import Snapshot

__all__ = ["Engine", "EXECUTOR_SETTINGS"]

# Settings the executor is made with: changing one makes a new executor.
EXECUTOR_SETTINGS = frozenset({"workers", "executor", "memory_limit", "pin_workers"})


class Engine:
    """One connection's driver state (see the module's docstring). ``last_plan`` and
    ``last_run``: the TilePlan of the last einsum run and what that run returned (EXPLAIN
    ANALYZE, tests); ``progress_callback(done, total)`` is called while a plan runs."""

    def __init__(self, store, settings: Settings, session) -> None:
        self._store, self.settings, self.session = store, settings, session
        self.cache = PreparedCache()
        self.progress_callback = None
        self.last_plan = self.last_run = None
        self._executor = None
        self._target = None  # (the settings' values, the Target they give): ``target``

    @property
    def store(self):
        if self._store is None:
            raise InterfaceError("the connection is closed")
        return self._store

    # -- the executor ------------------------------------------------------------------------------
    def executor(self):
        """The executor the settings name, made on first use."""
        if self._executor is not None and not getattr(self._executor, "alive", True):
            self.drop_executor()  # its cluster went away: connect again
        if self._executor is None:
            from ..exec import make_executor
            self._executor = make_executor(self.settings.executor, self.settings.workers,
                                           memory_limit=self.settings.memory_limit)
            if hasattr(self._executor, "pin_workers"):
                self._executor.pin_workers = self.settings.pin_workers  # before threads start
            if getattr(self._executor, "other_processes_read_files", False):
                self.store.spares.disable()  # a retired file may be mapped in another process
        return self._executor

    def drop_executor(self) -> None:
        """The executor was made for other settings: the next run makes a new one."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def set_executor(self, executor) -> None:
        """Run on ``executor`` (made by the caller) until the settings change."""
        self.drop_executor()
        self._executor = executor

    def setting_changed(self, name: str) -> None:
        if name in EXECUTOR_SETTINGS:
            self.drop_executor()

    def restore_settings(self, saved: Settings) -> None:
        """Return every setting to ``saved``: a unit that failed leaves them as it found them."""
        changed = [f.name for f in dataclasses.fields(saved)
                   if getattr(saved, f.name) != getattr(self.settings, f.name)]
        for name in changed:
            setattr(self.settings, name, getattr(saved, name))
        if EXECUTOR_SETTINGS.intersection(changed):
            self.drop_executor()

    def target(self) -> Target:
        """What planning needs of the executor, from the settings and its class: the local
        pool's workers, or what a Dask cluster's workers report of themselves (the one case a
        live executor is asked): each worker's threads are workers of the plan (a worker of 2
        threads runs 2 of its tasks at once), and each its share of the smallest worker's
        memory (exec/dask.py ``capabilities``), so a 2 GB worker gets tiles that fit it. For
        the local pool and the GPU, whose target the settings alone give, it is made once per
        settings (a repeated statement asks each call)."""
        s = self.settings
        fixed = s.executor in ("local", "gpu")
        if fixed:
            key = tuple(vars(s).values()) + ((_cores(),) if s.blas_one_call else ())
            kept = self._target
            if kept is not None and kept[0] == key:
                return kept[1]
        target = self._make_target()
        if fixed:
            self._target = (key, target)
        return target

    def _make_target(self) -> Target:
        from ..exec import max_fan_in
        s = self.settings
        fan_in = max_fan_in(s.executor, self.executor)
        local = s.executor == "local"
        memory_limit, cluster = s.memory_limit, ()
        if s.executor.split("://", 1)[0] == "dask":  # one call to the scheduler
            memory_limit, workers, cluster = cluster_target(self.executor().capabilities(),
                                                            s.memory_limit)
        else:
            workers = s.workers if local else self.executor().workers
        # The local pool's workers share this machine's cores: with SET blas_one_call = on, one
        # BLAS call may use them all (optimizer/threads.py); a Dask cluster's or a GPU's calls,
        # and by default the pool's, stay as the tiling makes them.
        threads = min(workers, _cores()) if local and s.blas_one_call else 1
        steering = tuple((f.name, getattr(s, f.name)) for f in dataclasses.fields(s)
                         if f.name != "progress")
        return Target(workers, fan_in, memory_limit, threads, s.tiling,
                      (steering, fan_in, cluster), cluster=cluster)

    # -- the pipeline ------------------------------------------------------------------------------
    def prepare(self, source, pieces=None, lets=None) -> Prepared:
        """One catalog snapshot, and ``source`` prepared against it (pipeline.prepare)."""
        return prepare(source, Snapshot(self.store), self.target(), self.cache, lets=lets,
                       pieces=pieces)

    def run(self, prepared: Prepared, sink):
        """Run ``prepared`` on the executor into ``sink``."""
        executor = self.executor()  # before the writers take spares: it may turn them off
        return prepared.run(executor, sink, self.progress_callback, ran=self._ran)

    def _ran(self, plan, result) -> None:
        self.last_plan, self.last_run = plan, result

    def store_sink(self, replace: bool = True) -> StoreSink:
        return StoreSink(self.store, self.settings.memory_limit, replace)

    # -- what the session, the connection and EXPLAIN call -----------------------------------------
    def run_statements(self, items):
        """A group of einsum statements with the session's LETs: prepare, run, commit. The
        run's result, or None when they only define LETs."""
        lets, store, replay = self.session.lets, self.store, self.cache.replay
        target = self.target()
        snapshot = Snapshot(store)
        again = replay.prepare(items, lets, target, snapshot, self.cache) \
            if not debug_level() else None  # (TENSORDB_DEBUG: every stage, timed)
        replayed = again is not None
        if replayed:
            graph, pieces, decomp, plan, readers = again
            prepared = Prepared(snapshot, graph, pieces, decomp, rebind(plan, readers, graph.ops))
        replay.forget()  # kept again once this call has committed
        if not replayed:
            before = lets_key(lets)
            prepared = prepare(items, snapshot, target, self.cache, lets=lets)
        if prepared.graph is None:
            return None
        result = self.run(prepared, self.store_sink())
        if replayed:
            replay.remember_again(store)
        else:
            replay.remember(items, before, lets, prepared, self.cache.last_bound, target, store,
                            lambda: rebind(prepared.plan, {}))
        if result.output_nonfinite:  # an EXP that overflowed: a warning naming it
            from ..bind.overflow import warn_nonfinite
            readers = prepared.plan.readers
            warn_nonfinite(prepared.graph, result.output_nonfinite, items,
                           lambda name: name not in readers or readers[name].facts()[0])
        return result

    def explain_statements(self, items, format: str = "text", analyze: bool = False) -> str:
        return self.explain(self.prepare(items, lets=self.session.lets), format, analyze)

    def run_graph(self, graph, pieces=None, replace: bool = False, prepared=None):
        """Prepare a Graph (or bound EinGraph) unless ``prepared`` is given; run; commit."""
        prepared = prepared if prepared is not None else self.prepare(graph, pieces)
        if not replace:
            for name in prepared.graph.outputs:
                name = prepared.graph.stored_name(name)
                if self.store.has(name):
                    raise CatalogError(f"tensor '{name}' already exists",
                                       hint="use replace=True (CREATE OR REPLACE) to overwrite it")
        return self.run(prepared, self.store_sink(replace))

    def compute(self, graph, name: str, check=None):
        """Run a graph whose one output is ``name`` and return it as an array; nothing is
        stored. ``check(what, shape, dtype)`` refuses a result too big, before the run."""
        return self.run(self.prepare(graph), ArraySink(name, check))

    def plan(self, graph, pieces=None):
        """(Decomposition, placed TilePlan) of a Graph or bound EinGraph; nothing runs."""
        prepared = self.prepare(graph, pieces)
        return prepared.decomp, prepared.plan

    def explain(self, prepared: Prepared, format: str = "text", analyze: bool = False) -> str:
        """Have explain render ``prepared`` (with ``analyze``: run that very plan first)."""
        from ..explain import render
        # on a GPU: what of the inputs is on the devices already (before ANALYZE's run); an
        # executor not started yet holds nothing, and EXPLAIN starts none
        resident = getattr(self._executor, "resident", lambda plan: None)(prepared.plan)
        result = self.run(prepared, self.store_sink()) if analyze else None
        with gc_paused():
            return render(prepared.decomp, prepared.plan, format=format, result=result,
                          resident=resident,
                          device=getattr(self._executor, "name", None) == "gpu")

    def load(self, name: str, source, **options) -> list:
        """Store a tensor (storage/load.py); the catalog entries of what it stored: one tensor,
        or one per array of a .npz file loaded whole (``<name>_<array>``)."""
        from ..formats.load import load_tensor
        with stage("load"):
            metas = load_tensor(self.store, name, source, memory_limit=self.settings.memory_limit,
                                **options)
        return metas if isinstance(metas, list) else [metas]

    def close(self) -> None:
        self.drop_executor()
        self._store = None


def cluster_target(caps, memory_limit):
    """(memory_limit, workers, report) planning uses for a cluster whose workers reported
    ``caps`` (exec/contract.py Capabilities): a plan worker per worker thread, each with its
    thread's share of the tile memory one worker may hold (the smallest worker's), so that the
    optimizer's ``memory_limit / workers`` is exactly that share. Without a per-worker limit
    the connection's ``memory_limit`` is shared as before."""
    threads = max(1, int(caps.threads_per_worker))
    workers = max(1, int(caps.workers)) * threads
    per = caps.memory_per_worker
    if per is not None:
        memory_limit = max(1, int(per) // threads) * workers
    report = (("executor", "dask"), ("workers", int(caps.workers)), ("threads", threads),
              ("memory_per_worker", None if per is None else int(per)),
              ("plan_workers", workers))
    return memory_limit, workers, report


def _cores() -> int:
    """The cores this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)
