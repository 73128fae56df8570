"""One run of a TilePlan on a Dask cluster (``dask.py`` holds the executor and its cluster).

The plan becomes one Dask graph, a task per plan task, pinned to its worker and named by its
operation (``tdb-kernel-C-<run>-<key>``: Dask's dashboard groups tasks by that prefix). Where the
workers read the payload files themselves, a stored input tile is read from the storage by every
worker that needs it (a Load per worker, never a transfer); otherwise it is read here and
scattered. Stored output tiles go to the run's sink (exec/contract.py): with ``storage='shared'``
each worker writes the tiles it computed into their places in the new payload files
(storage/slots.py) and only their facts come back; else the tiles are gathered here and handed
to the sink. ``bytes_moved`` is measured on the workers: each input a task read that another
worker made, as the local pool counts it (exec/contract.py).
"""
from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import defaultdict

import numpy as np

from ..errors import Error, OperationalError
from ..physical.plan import Aggregate, Assemble, Kernel, Load, TilePlan
from ..storage.sparse import is_sparse, tile_nbytes
from .dask_worker import Payload, collect, forget, run_task, to_host, write_output
from .runtime import Ledger, RunResult, op_of, translate
from .tasks import run_load

__all__ = ["Attempt", "WorkerLost", "translate_cluster_error"]

POLL_SECONDS = 0.25  # how often a running query checks that its workers are still alive


class WorkerLost(Exception):
    """A worker the run needed left while it ran (the executor may try again). ``done``: the
    stored output tiles already finished on the workers left (key -> value: its facts, or
    the tile), which the next attempt keeps rather than computes again."""

    def __init__(self, message: str, done: dict | None = None) -> None:
        super().__init__(message)
        self.done = done or {}


class Attempt:
    """One submission of the whole plan, on the workers alive when it starts. ``readers``: the
    workers that read the payload files themselves (``_file_readers``); ``slots``: output task
    key -> the TileSlot its worker writes it into (the sink's, when the workers write)."""

    def __init__(self, ex, plan: TilePlan, progress, store=None, sink=None,
                 workers_write: bool = False, done: dict | None = None,
                 relocations: int = 0) -> None:
        self.ex, self.plan, self.progress, self.store = ex, plan, progress, store
        self.relocations = relocations  # workers this attempt may lose and go on (relocate)
        self.relocated: list[tuple[str, int]] = []  # (lost worker, tasks moved off it)
        self.where: dict[str, str] = {}
        self.scattered_to: set[str] = set()
        self.done = done if done is not None else {}  # outputs an earlier attempt finished
        self.sink, self.workers_write = sink, workers_write
        self.client = ex.client
        self.run_id = uuid.uuid4().hex[:12]
        self.addresses = ex.addresses()
        if not self.addresses:
            raise WorkerLost("no workers")
        n = len(self.addresses)  # plan worker w runs on the w % n-th address (as the pool's queues)
        self.addr = {t.key: self.addresses[t.worker % n] for t in plan.tasks}
        self.group = {t.key: _group(plan, t) for t in plan.tasks}
        self.consumers: dict[int, list[int]] = defaultdict(list)
        for t in plan.tasks:
            for k in t.inputs:
                self.consumers[k].append(t.key)
        self.readers: set[str] = set()
        self.local_loads: set[int] = set()
        self.slots: dict = {}

    def dkey(self, key: int, part: str = "") -> str:
        """A task's Dask key: its operation's group (what the dashboard shows), the run, the
        plan task's key."""
        return f"tdb-{self.group[key]}-{self.run_id}-{key}{part}"

    def ref(self, key: int, addr: str) -> str:
        """The key a task on worker ``addr`` reads input ``key`` under: a stored tile is read by
        each worker that can read the files (a copy of the Load on it, ``@i``)."""
        if key in self.local_loads and addr in self.readers and addr != self.addr[key]:
            return self.dkey(key, f"@{self.addresses.index(addr)}")
        return self.dkey(key)

    # -- the graph -----------------------------------------------------------------------------
    def go(self) -> RunResult:
        import dask
        t0 = time.perf_counter()
        scattered, scattered_bytes = self._scatter_loads()
        every = [k for out in self.plan.outputs.values() if out.stored for k in out.tiles.values()]
        if self.workers_write:
            self.slots = {k: s for k in every if (s := self.sink.slot(k)) is not None}
        # Only what is not finished yet: Dask computes just what the asked-for keys need, so the
        # outputs an attempt before finished on the workers left are not computed again.
        outs = [k for k in every if k not in self.done]
        graph, where = self._graph(set(scattered))
        self.where = where
        out_keys = [self._final_key(k) for k in outs]
        # Dask runs only what the keys asked for need: tasks no stored output reads (a result
        # the same group replaces) are asked for too, so that they run, and fail, as on the
        # local pool. Their values come back and are dropped.
        consumed = set(self.consumers) | set(every)
        dead = [self.dkey(t.key) for t in self.plan.tasks
                if t.key not in consumed and self.dkey(t.key) in graph]
        futures: list = []
        try:
            with dask.annotate(workers=lambda k: [where[k]], allow_other_workers=False):
                futures = self.client.get(graph, out_keys + dead, sync=False)
            values = self._wait(futures)[:len(out_keys)]
        except WorkerLost as lost:
            lost.done = {**self.done, **{outs[i]: v for i, v in lost.done.items()
                                         if i < len(outs)}}
            self._release(futures, scattered, drop_records=True)
            raise
        except Exception as exc:  # noqa: BLE001 - translated below
            # A worker lost with tiles the client sent it (no lineage): the scheduler forgets
            # what needed them and cancels those keys before the watch above sees the loss.
            gone = type(exc).__name__ in ("FutureCancelledError", "CancelledError") and \
                self._gone()
            self._release(futures, scattered, drop_records=True)
            if type(exc).__name__ == "KilledWorker" or gone:  # Dask gave up on the workers
                raise WorkerLost(str(exc) if not gone else
                                 f"worker {', '.join(sorted(gone))} is gone", self.done) \
                    from None
            raise translate_cluster_error(exc) from exc
        tiles, gathered = {}, 0
        reused = len(self.done)
        for k, v in [*self.done.items(), *zip(outs, values)]:
            if k in self.slots:  # the worker wrote it; its facts came back
                self.sink.wrote(k, v)
                continue
            tiles[k] = _host(v)
            gathered += tile_nbytes(tiles[k])
            if self.sink is not None:
                self.sink.finished(k, tiles[k])
        self._release(futures, scattered, drop_records=False)
        del futures, values
        seconds = time.perf_counter() - t0
        self.reused = reused
        return self._result(tiles, seconds, scattered_bytes, gathered)

    def _final_key(self, key: int) -> str:
        if key in self.slots and self.consumers.get(key):
            return self.dkey(key, "-write")
        if key in self.slots:  # written by its own task
            return self.dkey(key)
        return self.dkey(key, "-host") if self.ex.backend == "cupy" else self.dkey(key)

    def _graph(self, scattered: set[int]):
        """One Dask task per plan task, on its worker; a Load also on each other worker that
        reads its tile and can read the files; a write task after each output tile a worker
        writes itself."""
        from dask.task_spec import Task, TaskRef
        plan, run, backend = self.plan, self.run_id, self.ex.backend
        graph, where = {}, {}
        for t in plan.tasks:
            if isinstance(t, Load) and t.key in scattered:
                continue
            source = _sub_reader(plan.readers[t.tensor], t.starts, t.stops) \
                if isinstance(t, Load) else None
            choice = plan.kernels[t.op] if isinstance(t, Kernel) else None
            at = [self.addr[t.key]]
            if t.key in self.local_loads:
                at += sorted({self.addr[c] for c in self.consumers[t.key]} - {at[0]},
                             key=self.addresses.index)
            names = [self.ref(k, self.addr[t.key]) for k in t.inputs]
            given = [self.dkey(k) for k in t.inputs if k in scattered]
            # a stored output tile no task reads is written by the task that makes it
            slot = None if self.consumers.get(t.key) else self.slots.get(t.key)
            for addr in at:
                dk = self.ref(t.key, addr)
                graph[dk] = Task(dk, run_task, run, backend,
                                 Payload(dk, t, op_of(plan, t), source, choice, names, given,
                                         slot), *[TaskRef(n) for n in names])
                where[dk] = addr
        for out in plan.outputs.values():
            if not out.stored:
                continue
            for k in out.tiles.values():
                if k in self.slots and not self.consumers.get(k):
                    continue  # its own task writes it
                if k in self.slots:  # read by other tasks too: a task of its own writes it
                    wk = self.dkey(k, "-write")
                    graph[wk] = Task(wk, write_output, run, self.slots[k], TaskRef(self.dkey(k)))
                    where[wk] = self.addr[k]
                elif backend == "cupy":  # stored outputs come back to the client as NumPy
                    hk = self.dkey(k, "-host")
                    graph[hk] = Task(hk, to_host, TaskRef(self.dkey(k)))
                    where[hk] = self.addr[k]
        return graph, where

    def _scatter_loads(self) -> tuple[dict[int, object], int]:
        """Read here and scatter the Load tiles of workers that cannot read the payload files."""
        self.local_loads: set[int] = set()
        if not any(isinstance(t, Load) for t in self.plan.tasks):
            return {}, 0
        local = self.readers = self._file_readers()
        self.local_loads = {t.key for t in self.plan.tasks
                            if isinstance(t, Load) and self.addr[t.key] in local}
        by_addr: dict[str, dict] = defaultdict(dict)
        keys: dict[str, int] = {}
        nbytes = 0
        for t in self.plan.tasks:
            if isinstance(t, Load) and self.addr[t.key] not in local:
                tile = np.array(run_load(t, self.plan.readers[t.tensor]), order="C")  # 0-d stays 0-d
                by_addr[self.addr[t.key]][self.dkey(t.key)] = tile
                keys[self.dkey(t.key)] = t.key
                nbytes += tile.nbytes
        futures = {}
        self.scattered_to = set(by_addr)  # tiles there have no lineage: lost, not recomputed
        for addr, data in by_addr.items():
            for dk, fut in self.client.scatter(data, workers=[addr], broadcast=False).items():
                futures[keys[dk]] = fut
        return futures, nbytes

    def _file_readers(self) -> set[str]:
        """The workers that read the payload files themselves: as declared (``storage``) and,
        for local storage, as each worker answered when asked whether it sees the database."""
        mode, store, everyone = self.ex.scatter, self.store, set(self.addresses)
        if mode in ("never", "always"):
            return everyone if mode == "never" else set()
        if store is None:  # a plan run without its database: the client reads every tile
            return set()
        if store.objects is not None:  # an object store: every worker reads it, checking the
            return everyone  # prefix's id before its first read (storage/objreader.py)
        shared = store.storage == "shared"
        if store.database is None:  # an older database opened read-only: no id to ask about
            return everyone if shared else set()
        seen = self.ex.probe(str(store.root), store.database, self.addresses)
        if shared:
            bad = sorted(why for why in seen.values() if why is not None)
            if bad:
                more = f" (and {len(bad) - 1} more worker(s))" if len(bad) > 1 else ""
                raise OperationalError(
                    f"storage='shared' declares that every Dask worker sees the database at "
                    f"{store.root}, but {bad[0]}{more}; nothing was run",
                    hint="mount the database's directory at the same path on every worker, or "
                         "connect with storage='local' (the client then sends the tiles)")
            return everyone
        return {a for a, why in seen.items() if why is None}

    # -- waiting, with an eye on the workers ----------------------------------------------------
    def _wait(self, futures) -> list:
        """Gather the outputs (in a helper thread) while watching that the plan's workers stay."""
        box: dict = {}

        def gather():
            try:
                box["values"] = self.client.gather(futures)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc

        finished = [0]  # outputs gathered so far, for the progress reported while waiting
        if self.progress is not None:  # per-tile callbacks cost a loop wake-up each: CLI only
            count = itertools.count(1)

            def done(_) -> None:  # on Dask's thread: counted, reported by the loop below
                finished[0] = next(count)
            for f in futures:
                f.add_done_callback(done)
        thread = threading.Thread(target=gather, name="tensordb-dask-gather", daemon=True)
        thread.start()
        needed = set(self.addr.values())  # only workers that have tasks of this plan
        while thread.join(POLL_SECONDS) or thread.is_alive():
            if self.progress is not None:  # a few long tasks: the CLI's bar appears anyway
                self.progress(finished[0], len(futures))
            alive = set(self.ex.addresses())
            gone = needed - alive
            if gone and len(self.relocated) < self.relocations and alive \
                    and self._relocate(gone, sorted(alive)):
                needed = set(self.where.values())
                continue
            if gone:
                done = self._finished(futures)  # before the cancel: kept by the next attempt
                self.client.cancel(futures, force=True)  # ends the gather
                thread.join()
                raise WorkerLost(f"worker {', '.join(sorted(gone))} is gone", done)
        if "error" in box:
            raise box["error"]
        if self.progress is not None:  # done callbacks may still be on their way
            self.progress(len(futures), len(futures))
        return box["values"]

    def _gone(self) -> set[str]:
        """The workers of this run that left the cluster (none when it cannot be asked)."""
        try:
            return set(self.where.values()) - set(self.ex.addresses())
        except Error:
            return set()

    def _relocate(self, gone: set[str], alive: list[str]) -> bool:
        """Workers ``gone`` left mid-run: their tasks (those not finished, and those finished
        whose tiles were only on them) are pinned to the workers left (plan worker ``w`` on
        ``alive[w % n]``), and Dask goes on: what finished on the workers left stays, and Dask
        recomputes, from their lineage, only the lost tiles that something still needs. False
        (the run is then given up and tried again) if the scheduler could not be told."""
        if gone & self.scattered_to:  # tiles the client sent it: a new attempt sends them
            return False
        marker = f"-{self.run_id}-"
        moves = {}
        for dk, addr in self.where.items():
            if addr in gone:
                key = _plan_key(dk, marker)
                moves[dk] = alive[self.plan.task(key).worker % len(alive)]
        try:
            self.client.run_on_scheduler(_repinner(), moves, f"tdb-relocate-{self.run_id}")
        except Exception:  # noqa: BLE001 - the older way: cancel, keep outputs, run again
            return False
        for dk, addr in moves.items():
            self.where[dk] = addr
            key = _plan_key(dk, marker)
            if self.addr.get(key) in gone:
                self.addr[key] = addr
        self.relocated.append((", ".join(sorted(gone)), len(moves)))
        return True

    def _finished(self, futures) -> dict:
        """{position: value} of the futures finished on the workers still there (a value the
        lost worker held is not finished any more, or cannot be gathered: it is not kept)."""
        ready = {i: f for i, f in enumerate(futures) if f.status == "finished"}
        if not ready:
            return {}
        try:
            values = self.client.gather(list(ready.values()), errors="raise")
        except Exception:  # noqa: BLE001 - nothing kept: the next attempt computes them
            return {}
        return dict(zip(ready, values))

    def _release(self, futures, scattered, *, drop_records: bool) -> None:
        """Drop every key of this run from the cluster (and the workers' records on failure).
        After a run that succeeded the futures are only let go (the scheduler forgets keys
        nobody holds): cancelling finished keys, scattered ones among them, tripped an
        assertion in the scheduler, which then dropped the client."""
        try:
            if drop_records and (futures or scattered):
                self.client.cancel(list(futures) + list(scattered.values()), force=True)
            if drop_records:
                self.client.run(forget, self.run_id)
        except Exception:  # noqa: BLE001 - best effort: the keys die with their futures anyway
            pass

    # -- what happened --------------------------------------------------------------------------
    def _result(self, tiles, seconds, scattered_bytes, gathered) -> RunResult:
        plan = self.plan
        try:
            logs = self.client.run(collect, self.run_id)
        except Exception:  # noqa: BLE001 - a worker gone after the run costs measurements only
            logs = {}
        index = {a: i for i, a in enumerate(self.addresses)}
        ledger = Ledger(plan, len(self.addresses))
        ran_on, loads_on = {}, defaultdict(set)
        writes = 0.0
        for addr, (records, held, wrote) in logs.items():
            ledger.peak += held  # Dask's own count of the bytes each worker held, at its most
            writes += wrote
            for key, dt, nb, moved in records:
                task = plan.task(key)
                ledger.ran(task, index.get(addr, 0), dt)
                ledger.produced(task, 0, nb)  # Dask counts what its workers hold (above)
                if moved:  # measured on the worker: inputs another worker made
                    ledger.moved(task, moved)
                if isinstance(task, Load):  # read by each worker that needs its tile
                    loads_on[key].add(addr)
                else:
                    ran_on[key] = addr
        self.ex.last_run = {"addresses": self.addresses,
                            "planned_on": dict(self.addr),
                            "ran_on": ran_on, "loads_on": {k: sorted(v) for k, v in
                                                           loads_on.items()},
                            "scattered_bytes": scattered_bytes,
                            "gathered_bytes": gathered,
                            "written_by_workers": len(self.slots), "write_seconds": writes,
                            "kept_from_earlier_attempts": self.reused,
                            "relocated": list(self.relocated)}
        return ledger.result(tiles, seconds)


def _plan_key(dkey: str, marker: str) -> int:
    """The plan task a Dask key is for: ``tdb-kernel-C-<run>-12@1`` -> 12."""
    tail = dkey.split(marker, 1)[1]
    digits = itertools.takewhile(str.isdigit, tail)
    return int("".join(digits))


def _repinner():
    """The function run on the scheduler to re-pin tasks, made here so that it is sent by value
    (a nested function: cloudpickle sends its code), since a scheduler needs no tensordb."""
    def repin(moves: dict, stimulus_id: str, dask_scheduler=None) -> int:
        """Pin each task of ``moves`` (Dask key -> worker address) to its new worker, and
        send those stranded in ``no-worker`` (pinned to a worker that left) there. A key
        the scheduler forgot (finished and released) is left alone. How many were sent."""
        s = dask_scheduler
        ready = {}
        for key, addr in moves.items():
            ts = s.tasks.get(key)
            if ts is None:
                continue
            ts.worker_restrictions = {addr}
            if ts.state == "no-worker":
                ready[key] = "processing"
        if ready:
            s.transitions(ready, stimulus_id=stimulus_id)
        return len(ready)
    return repin


def _group(plan: TilePlan, task) -> str:
    """The dashboard's name for a task's group: what it does and the tensor it is for (Dask
    groups keys by their words up to the first that is not all letters)."""
    kind = {Load: "load", Kernel: "kernel", Aggregate: "aggregate", Assemble: "retile"}.get(
        type(task), "task")
    name = plan.readers[task.tensor].meta.name if isinstance(task, Load) else \
        op_of(plan, task).output
    letters = "".join(c for c in str(name) if c.isalpha())
    return f"{kind}-{letters}" if letters else kind


def _sub_reader(reader, starts, stops):
    """A reader holding only the tiles that overlap the box, so each Load task ships little."""
    try:
        from ..geometry import overlapping
        ranges = [overlapping(b, a, z) for b, a, z in zip(reader.meta.grid, starts, stops)]
        keep = [reader.entries[c] for c in itertools.product(*ranges) if c in reader.entries]
        return reader.with_entries(keep)
    except (AttributeError, TypeError):  # another reader type: ship it whole
        return reader


def translate_cluster_error(exc: BaseException) -> BaseException:
    """A failed gather as a tensordb error. A task's own failure was translated on its worker
    (by the runtime, naming the operation); what is left is the cluster's."""
    if isinstance(exc, Error):
        return exc
    if isinstance(exc, (OSError, TimeoutError)) or type(exc).__name__ in (
            "CommClosedError", "FutureCancelledError", "CancelledError"):
        return OperationalError(f"the Dask cluster failed the query: {type(exc).__name__}: {exc}")
    return translate(exc)


def _host(value):
    """A gathered tile as a host array (a CuPy one copied back); a CSR output tile as it is."""
    return value if isinstance(value, np.ndarray) or is_sparse(value) else np.asarray(value)

