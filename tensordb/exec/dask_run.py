"""One run of a TilePlan on a Dask cluster (``dask.py`` holds the executor and its cluster).

The plan becomes one Dask graph, submitted at once: each worker's tasks of one stage fused into
one Dask task (``dask_fuse.py``), pinned to its worker and named by its operation
(``tdb-kernel-C-<run>-<n>``: Dask's dashboard groups tasks by that prefix). Where the workers
read the payload files themselves, a stored input tile is read from the storage by every worker
that needs it (a Load per worker, never a transfer); otherwise it is read here and scattered.
Stored output tiles go to the run's sink (exec/contract.py): with ``storage='shared'`` each
worker writes the tiles it computed into their places in the new payload files
(storage/slots.py), or, in an object store that takes parts, into the parts it uploads
(storage/objparts.py), and only their facts come back; else the tiles are gathered here and handed
to the sink. The records of what ran where come back with the results (no round trip to the
workers after the run). ``bytes_moved`` counts each input a task read that another worker made,
as the local pool counts it (exec/contract.py).
"""
from __future__ import annotations

import itertools
import time
import uuid
from collections import defaultdict

import numpy as np

from ..errors import Error, OperationalError
from ..physical.plan import Load, TilePlan
from ..storage.objparts import ObjectSlot
from ..storage.sparse import is_sparse, tile_nbytes
from .dask_collect import collect
from .dask_fuse import Fusion
from .dask_worker import GroupOut, forget
from .runtime import Ledger, RunResult, translate
from .tasks import run_load

__all__ = ["Attempt", "WorkerLost", "translate_cluster_error"]

POLL_SECONDS = 0.25  # how often a running query checks that its workers are still alive


class WorkerLost(Exception):
    """A worker the run needed left while it ran (the executor may try again). ``done``: the
    stored output tiles already finished on the workers left (plan key -> value: its facts,
    or the tile), which the next attempt keeps rather than computes again."""

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
        self.relocated: list[tuple[str, int]] = []  # (lost worker, Dask tasks moved off it)
        self.where: dict[str, str] = {}  # Dask key -> the worker it is pinned to now
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
        self.consumers: dict[int, list[int]] = defaultdict(list)
        for t in plan.tasks:
            for k in t.inputs:
                self.consumers[k].append(t.key)
        self.readers: set[str] = set()
        self.local_loads: set[int] = set()
        self.slots: dict = {}
        self.collected: dict = {}  # Dask key -> the value its worker handed over (_wait)

    # -- the graph -----------------------------------------------------------------------------
    def go(self) -> RunResult:
        import dask
        t0 = time.perf_counter()
        scattered, scattered_bytes = self._scatter_loads()
        every = [k for out in self.plan.outputs.values() if out.stored for k in out.tiles.values()]
        if self.workers_write:
            self.slots = {k: s for k in every if (s := self.sink.slot(k)) is not None}
        # Only what is not finished yet: the outputs an attempt before finished on the workers
        # left are not computed again.
        outs = [k for k in every if k not in self.done]
        # Tasks no stored output reads (a result the same group replaces) run too, and fail, as
        # on the local pool.
        consumed = set(self.consumers) | set(every)
        dead = [t.key for t in self.plan.tasks if t.key not in consumed]
        fused = Fusion(self.plan, self.run_id, self.ex.backend, self.addr, self.addresses,
                       self.readers, self.local_loads, {k: f.key for k, f in scattered.items()},
                       outs, self.slots, dead)
        self.fused = fused
        self.where = dict(fused.where)  # what _relocate changes (the annotations keep theirs)
        futures: list = []
        try:
            if fused.gather:
                # the annotations are shipped to the scheduler: they must not hold the plan
                where, first = fused.where, fused.priority
                with dask.annotate(workers=lambda k: [where[k]], allow_other_workers=False,
                                   priority=lambda k: first.get(k, 1)):
                    futures = self.client.get(_expression(fused.graph, self.run_id),
                                              fused.gather, sync=False)
            got = _merge(self._wait(futures))
        except WorkerLost as lost:
            lost.done = {**self.done, **lost.done}
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
        values = {k: got.facts[k] if k in self.slots else got.client[k] for k in outs}
        for k, v in [*self.done.items(), *values.items()]:
            if k in self.slots:  # the worker wrote it; its facts came back
                self.sink.wrote(k, v)
                continue
            tiles[k] = _host(v)
            gathered += tile_nbytes(tiles[k])
            if self.sink is not None:
                self.sink.finished(k, tiles[k])
        self._release(futures, scattered, drop_records=False)
        if self._object_parts():
            self._forget()  # each part went up with its last tile: nothing should be left
        del futures, values
        seconds = time.perf_counter() - t0
        self.reused = reused
        return self._result(tiles, seconds, scattered_bytes, gathered, got.records)

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
                dk = f"tdb-load-{self.run_id}-{t.key}"
                by_addr[self.addr[t.key]][dk] = tile
                keys[dk] = t.key
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
        """Gather the outputs while watching that the plan's workers stay: the gather runs on
        the client's event loop (no thread of our own to start: that cost milliseconds a query
        on a busy machine), this thread looks at the workers every POLL_SECONDS."""
        if not futures:
            return []
        import asyncio
        import concurrent.futures

        finished = [0]  # outputs gathered so far, for the progress reported while waiting
        if self.progress is not None:  # per-tile callbacks cost a loop wake-up each: CLI only
            count = itertools.count(1)

            def done(_) -> None:  # on Dask's thread: counted, reported by the loop below
                finished[0] = next(count)
            for f in futures:
                f.add_done_callback(done)
        # results straight from the workers that made them (dask_collect.py), else gathered
        # through the scheduler
        direct = self.ex.collectors(self.addresses)
        fetch = collect(self.client, futures, {k: a for k, a in self.where.items()
                                               if a in direct}, self.collected) if direct else \
            self.client._gather(futures)
        pending = asyncio.run_coroutine_threadsafe(fetch, self.client.loop.asyncio_loop)
        needed = set(self.addr.values())  # only workers that have tasks of this plan
        while True:
            try:
                values = pending.result(POLL_SECONDS)
                break
            except concurrent.futures.TimeoutError:
                pass
            if self.progress is not None:  # a few long tasks: the CLI's bar appears anyway
                self.progress(finished[0], len(futures))
            alive = set(self.ex.addresses(fresh=True))
            gone = needed - alive
            if gone and len(self.relocated) < self.relocations and alive \
                    and self._relocate(gone, sorted(alive)):
                needed = set(self.where.values())
                continue
            if gone:
                done = self._finished(futures)  # before the cancel: kept by the next attempt
                self.client.cancel(futures, force=True)  # ends the gather
                pending.cancel()  # and the requests to the workers
                concurrent.futures.wait([pending])
                raise WorkerLost(f"worker {', '.join(sorted(gone))} is gone", done)
        if self.progress is not None:  # done callbacks may still be on their way
            self.progress(len(futures), len(futures))
        return values

    def _gone(self) -> set[str]:
        """The workers of this run that left the cluster (none when it cannot be asked)."""
        try:
            return set(self.where.values()) - set(self.ex.addresses(fresh=True))
        except Error:
            return set()

    def _relocate(self, gone: set[str], alive: list[str]) -> bool:
        """Workers ``gone`` left mid-run: their Dask tasks (fused groups and picks: those not
        finished, and those finished whose results were only on them) are pinned to the
        workers left, and Dask goes on: what finished on the workers left stays, and Dask
        recomputes, from their lineage, only the lost results that something still needs.
        Every task of a lost worker goes to the same one (``alive[i % n]`` for the ``i``-th
        address of the run), so that the tiles of an output object's part, laid out by plan
        worker, are still spooled and uploaded by one worker. False (the run is then given up
        and tried again) if the scheduler could not be told."""
        if gone & self.scattered_to:  # tiles the client sent it: a new attempt sends them
            return False
        if self._object_parts():
            # The lost worker held, in memory, the parts of output objects it was filling; a
            # group whose results (the tiles' facts) survive on another worker is not run
            # again, so its tiles would never reach a part again: a new attempt keeps only the
            # tiles of the parts uploaded (sink.kept) and makes the rest.
            return False
        index = {a: i for i, a in enumerate(self.addresses)}
        to = {a: alive[index.get(a, 0) % len(alive)] for a in gone}
        moves = {dk: to[addr] for dk, addr in self.where.items() if addr in gone}
        try:
            self.client.run_on_scheduler(_repinner(), moves, f"tdb-relocate-{self.run_id}")
        except Exception:  # noqa: BLE001 - the older way: cancel, keep outputs, run again
            return False
        self.where.update(moves)
        for key, addr in self.addr.items():
            if addr in gone:
                self.addr[key] = to[addr]
        self.relocated.append((", ".join(sorted(gone)), len(moves)))
        return True

    def _finished(self, futures) -> dict:
        """{plan key: value} of the stored output tiles in hand: those their workers handed
        over already (``collected``) and those in the futures finished on the workers still
        there (a value the lost worker held is not finished any more, or cannot be gathered:
        it is not kept)."""
        have = dict(self.collected)  # handed over by their workers already (dask_collect.py)
        ready = [f for f in futures if f.status == "finished" and f.key not in have]
        if not ready and not have:
            return {}
        try:
            got = _merge([*have.values(), *(self.client.gather(ready, errors="raise")
                                            if ready else ())])
        except Exception:  # noqa: BLE001 - nothing kept: the next attempt computes them
            return {}
        return {**{k: v for k, v in got.client.items()},
                **{k: v for k, v in got.facts.items() if k in self.slots}}

    def _release(self, futures, scattered, *, drop_records: bool) -> None:
        """Drop every key of this run from the cluster (cancelled, on failure).
        After a run that succeeded the futures are only let go (the scheduler forgets keys
        nobody holds): cancelling finished keys, scattered ones among them, tripped an
        assertion in the scheduler, which then dropped the client."""
        try:
            if drop_records and (futures or scattered):
                self.client.cancel(list(futures) + list(scattered.values()), force=True)
            elif not drop_records:
                _let_go(self.client, [*futures, *scattered.values()])
                futures.clear()  # this thread holds none of them now: no release from here
                scattered.clear()
        except Exception:  # noqa: BLE001 - best effort: the keys die with their futures anyway
            pass
        if drop_records and self._object_parts():
            self._forget()  # the parts of output objects the workers were filling

    def _object_parts(self) -> bool:
        """Whether the workers write output objects in parts (storage/objparts.py)."""
        return any(isinstance(s, ObjectSlot) for s in self.slots.values())

    def _forget(self) -> None:
        """Drop, on every worker, what is left of this run: the parts of output objects it was
        filling (nothing else of a run stays on a worker: dask_worker.py)."""
        try:
            self.client.run(forget, self.run_id)
        except Exception:  # noqa: BLE001 - a worker gone took its parts with it
            pass

    # -- what happened --------------------------------------------------------------------------
    def _result(self, tiles, seconds, scattered_bytes, gathered, records) -> RunResult:
        plan = self.plan
        index = {a: i for i, a in enumerate(self.addresses)}
        ledger = Ledger(plan, len(self.addresses))
        ran_on, loads_on = {}, defaultdict(set)
        writes, held = 0.0, defaultdict(int)
        for addr, rows, most, wrote in records.values():
            held[addr] = max(held[addr], most)  # Dask's count of the bytes the worker held
            writes += wrote
            for key, dt, nb, moved in rows:
                task = plan.task(key)
                ledger.ran(task, index.get(addr, 0), dt)
                ledger.produced(task, 0, nb)  # Dask counts what its workers hold (above)
                if moved:  # measured on the worker: inputs another worker made
                    ledger.moved(task, moved)
                if isinstance(task, Load):  # read by each worker that needs its tile
                    loads_on[key].add(addr)
                else:
                    ran_on[key] = addr
        ledger.peak += sum(held.values())
        self.ex.last_run = {"addresses": self.addresses,
                            "planned_on": dict(self.addr),
                            "ran_on": ran_on, "loads_on": {k: sorted(v) for k, v in
                                                           loads_on.items()},
                            "scattered_bytes": scattered_bytes,
                            "gathered_bytes": gathered,
                            "written_by_workers": len(self.slots), "write_seconds": writes,
                            "kept_from_earlier_attempts": self.reused,
                            "relocated": list(self.relocated),
                            "dask_tasks": len(self.fused.graph),
                            "groups": len(self.fused.groups),
                            "group_sizes": dict(self.fused.sizes),
                            "collected": sorted(map(str, self.collected))}
        return ledger.result(tiles, seconds)


def _let_go(client, futures: list) -> None:
    """Release a run's futures in one hop to the client's event loop (each one let go here
    would be a hop of its own: a wake-up of the loop, and the GIL passed back and forth)."""
    if futures:
        client.loop.add_callback(_release_all, futures)


def _release_all(futures: list) -> None:
    """On the client's event loop: release each future, then drop them."""
    for f in futures:
        f.release()
    futures.clear()


def _expression(graph: dict, run: str):
    """The graph as Dask's expression, named by the run: Dask would otherwise tokenize every
    task of it (milliseconds a query) to name a graph whose keys are unique already."""
    try:
        from dask._expr import LLGExpr
        return LLGExpr(graph, _determ_token=f"tdb-{run}")
    except (ImportError, TypeError):  # an older Dask: it names the dict itself
        return graph


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


def _merge(values) -> GroupOut:
    """The gathered groups' results as one: tiles for the client, facts, records."""
    got = GroupOut()
    for v in values:
        got.client.update(v.client)
        got.take(v)
    return got


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

