"""The local executor: a pool of worker threads running a TilePlan as a dataflow graph.

Each worker has its own queue and runs only the tasks placed on it. A task is queued when its
inputs exist; a worker runs its ready tasks in the plan's memory-aware order (``TilePlan.rank``,
``physical/order.py``), aggregation folds first: an aggregation accumulates each partial as soon
as it arrives (on the aggregation's worker), so partials do not pile up. Tiles are freed when
their last consumer has run. With a ``memory_limit`` every task is admitted against it before it
runs (``budget.py``): intermediate tiles are spilled to disk (``spill.py``) or the task waits.
A tile read by a task on another worker than the one that produced it counts as a transfer.
What a task does, what it costs and what its failure means is the shared runtime's
(``runtime.py``); where tiles live and how they move between workers is the pool's ``tiles``
(host memory here, GPUs in ``gpu.py``).

BLAS threads are set once for the whole run (threadpoolctl limits are process-wide): the count
the plan records (``TilePlan.blas_threads``: the optimizer chose to run each BLAS operation as
one call with that many threads, optimizer/threads.py), else the executor's rule: with W busy
workers each gets cores // W BLAS threads, and no more than one per ``BLAS_FLOPS_PER_THREAD`` of
the plan's largest kernel call: a call of a few MFLOP split over threads waits for each of them
to get a core, which on a busy machine took a 256^3 product from 0.3 ms to 48 ms. The count set
for the last run is ``LocalExecutor.last_blas_threads``.

A tiny plan (8 tasks and 16 MFLOP, or 64 tasks and 4 MFLOP; no memory budget to keep, host
tiles) runs on the calling thread, in the same order and through the same task code: handing
it to a worker and waiting for it to come back would cost more than its kernels. Ctrl-C then lands in that thread and ends
the run the same way (the rest of the plan is skipped, nothing is stored).
"""
from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from contextlib import nullcontext

import numpy as np

from ..errors import InternalError
from ..physical.plan import Aggregate, Kernel, Load, TilePlan
from ..physical.order import ranks
from ..plan.memory import BLAS_FLOPS_PER_THREAD
from ..storage.writer import TileStats, tile_stats
from .contract import Capabilities, as_sink, pool_capabilities
from .budget import HEAP_SLACK, Budget, may_cross, return_freed_memory, temporary_bytes
from .ready import STOP, ReadyQueues
from .runtime import (Ledger, RunControl, RunResult, TaskRunner, held_bytes, op_of, plan_specs,
                      translate)
from .spill import SpillFiles
from .tiles import HostTiles

__all__ = ["LocalExecutor", "HostTiles", "pool_capabilities"]  # (the last: contract.py's)

_controller = None
_TICK = 0.05  # seconds between checks for Ctrl-C while the caller waits for a run
INLINE_TASKS = 8  # a plan of at most this many tasks...
INLINE_FLOPS = 1 << 24  # ...and this many flops (a few ms at most) runs on the calling thread
# So does one of more tasks, up to this many, doing little: a digits logistic-regression step,
# 11 tasks and 1.1 MFLOP, took 8.6 ms at the fastest on the workers and 3.5 ms on the calling
# thread (each hand-off to a worker and back is a thread wake-up; on a shared machine, a wait
# for a core), while a mid-size elementwise map in many tiles keeps both cores.
INLINE_MANY_TASKS = 64
INLINE_MANY_FLOPS = 1 << 22


def _blas_limits(threads: int):
    """A context manager capping BLAS threads for the whole process."""
    global _controller
    from threadpoolctl import ThreadpoolController
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=threads, user_api="blas")


class LocalExecutor:
    """W in-process workers: threads that live as long as the executor, one queue each."""

    max_fan_in = None  # an aggregation task combines any number of partials (physical/trees.py)

    def __init__(self, workers: int, *, memory_limit: int | None = None,
                 tiles: HostTiles | None = None):
        self.tiles = tiles if tiles is not None else HostTiles()
        self.name = self.tiles.name
        self.devices = list(self.tiles.devices)
        self.workers = max(1, int(workers))
        self.memory_limit = memory_limit
        if memory_limit and memory_limit < HEAP_SLACK * (self.workers + 1) * 4:
            return_freed_memory()  # what glibc keeps would be more than a quarter of the limit
        self.xp = self.tiles.xp
        self.cores = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                         else os.cpu_count() or 1)
        self.queues = ReadyQueues(self.workers)
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # one plan runs at a time
        self.last_blas_threads: int | None = None  # what the last run set (None: never set)
        self.pin_workers = True  # SET pin_workers: each worker thread on a core (see _pin)

    def _start(self) -> None:
        if not self.threads:
            self.threads = [threading.Thread(target=self._worker_loop, args=(w,), daemon=True,
                                             name=f"tensordb-{self.name}-worker-{w}")
                            for w in range(self.workers)]
            for th in self.threads:
                th.start()

    def _worker_loop(self, w: int) -> None:
        if self.pin_workers and self.tiles.pins_workers:
            _pin(w, self.workers)
        with self.tiles.worker(w):
            get = self.queues.get
            while True:
                item = get(w)
                if item is None:
                    return
                item[0].handle(w, item[1:])
                # Not kept while the worker waits: the run's last item would keep the whole run
                # alive (its results, its output buffers: a staged output's buffer could then
                # never be reused by the next query, writer.StagingBuffers).
                item = None

    def close(self) -> None:
        for w in range(self.workers):
            self.queues.put(w, STOP, None)
        for th in self.threads:
            th.join()
        self.threads = []
        self.tiles.close()

    def capabilities(self) -> Capabilities:
        """What planning reads of it (``exec.capabilities`` reads the same without one)."""
        return pool_capabilities(self.workers, self.memory_limit, self.max_fan_in)

    @property
    def alive(self) -> bool:
        return True  # threads in this process: nothing can take them away

    def resident(self, plan):
        """Which of ``plan``'s Loads find their tile on their device already (EXPLAIN; None
        for host tiles)."""
        return self.tiles.resident(plan)

    def run(self, plan: TilePlan, store=None, progress=None, destinations=None,
            finished=None, *, sink=None) -> RunResult:
        """Run ``plan``; its stored output tiles go to ``sink`` (exec/contract.py): computed in
        the buffers of ``sink.open()`` where the tiles are host memory, and each handed to
        ``sink.finished(key, tile, facts)`` on its worker once it is final and its statistics
        are taken (the sink hands it to its file then); returning True, the sink has written
        the tile, which the run then keeps only as long as its consumers need it.
        ``destinations`` and ``finished`` are the older form of a sink."""
        if not plan.tasks:
            return RunResult({}, ops=[])
        tiles = self.tiles
        sink = as_sink(sink, destinations, finished)
        buffers = sink.open(False) if sink is not None else {}
        dest = buffers if tiles.writes_destinations else {}
        inline = tiles.inline and _tiny(plan)
        limits = nullcontext()
        if tiles.limits_blas:
            threads = min(plan.blas_threads, self.cores) or _blas_threads(plan, self.cores, inline)
            self.last_blas_threads = threads
            limits = _blas_limits(threads)
        with self._lock, limits:
            plan = tiles.start_run(plan, store)
            run = _Run(self, plan, progress, dest, store)
            run.finished_tile = sink.finished if tiles.writes_destinations and sink else None
            if tiles.copies_out and sink is not None:  # a GPU's: to their buffers as finished
                run.out_buffers, run.finished_out = buffers, sink.finished
            result = None
            try:
                if inline and run.budget is None:
                    result = run.go_inline()
                else:
                    self._start()
                    result = run.go()
            finally:
                tiles.end_run(plan, run, result, sink)
                # The run object lives on in reference cycles until a garbage collection: the
                # output tiles it holds would stay with it after the caller lets them go.
                run.results.clear()
        landed = run.landed  # copied to the host already, on their workers
        result.tiles = {k: landed[k] if k in landed else tiles.to_host(v)
                        for k, v in result.tiles.items()}
        return result


def _pin(w: int, workers: int) -> None:
    """Keep worker thread ``w`` on a core of its own, when there are cores enough for every
    worker. Unpinned, the threads that slept between two runs were woken by the caller onto its
    core, two kernels sharing it until the scheduler moved one: after 0.3 s idle a run of two
    single-threaded products took 13 ms instead of 9.5 (pinned: 10)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))  # the process's: this thread is not pinned yet
    if workers > len(cpus) or len(cpus) < 2:
        return
    try:
        os.sched_setaffinity(0, {cpus[w]})  # 0: this thread
    except OSError:
        pass


def _blas_threads(plan: TilePlan, cores: int, inline: bool) -> int:
    """BLAS threads per kernel call for the run of ``plan``: the cores shared by the workers
    that run kernels (all of them for a plan run on the calling thread), at most one thread per
    ``BLAS_FLOPS_PER_THREAD`` of its largest call."""
    kernels = [t for t in plan.tasks if isinstance(t, Kernel)]
    busy = 1 if inline else max(1, len({t.worker for t in kernels}))
    largest = max((t.flops for t in kernels), default=0)
    return max(1, min(cores // busy, largest // BLAS_FLOPS_PER_THREAD))


def _tiny(plan: TilePlan) -> bool:
    """Whether ``plan`` is small enough to run on the calling thread (see the module's doc)."""
    n = len(plan.tasks)
    if n > INLINE_MANY_TASKS:
        return False
    flops = sum(t.flops for t in plan.tasks if isinstance(t, Kernel))
    return flops <= (INLINE_FLOPS if n <= INLINE_TASKS else INLINE_MANY_FLOPS)


class _Run:
    """One plan on the pool: the dataflow (what is ready, which worker runs it, when a tile is
    freed); the runtime runs each task and keeps the run's accounts."""

    def __init__(self, ex: LocalExecutor, plan: TilePlan, progress, destinations: dict,
                 store=None) -> None:
        self.ex, self.plan = ex, plan
        self.tiles = ex.tiles
        self.dest = destinations
        self.nnz: dict[int, int] = {}
        self.nonfinite: dict[int, bool] = {}
        self.crc32: dict[int, int] = {}
        self.control = RunControl(len(plan.tasks), progress)
        self.runner = TaskRunner(ex.xp, self.control.check, specs=plan_specs(plan, ex.xp))
        self.ledger = Ledger(plan, ex.workers)
        self.lock = threading.Lock()
        self.queues = ex.queues
        self.results: dict[int, object] = {}
        self.made_on: dict[int, int] = {}
        self.sent: set[tuple[int, int]] = set()  # (tile, worker) read there from another
        consumers = plan.consumers()
        self.consumers = consumers
        self.refs = {k: len(v) for k, v in consumers.items()}
        self.waiting = {t.key: len(t.inputs) for t in plan.tasks if not isinstance(t, Aggregate)}
        self.acc: dict[int, object] = {}
        self.acc_left = {t.key: len(t.parts) for t in plan.tasks if isinstance(t, Aggregate)}
        self.agg_of: dict[int, int] = {}
        for t in plan.tasks:
            if isinstance(t, Aggregate):
                for p in t.parts:
                    self.agg_of[p] = t.key
        self.keep = {k for out in plan.outputs.values() if out.stored for k in out.tiles.values()}
        self.finished = threading.Event()
        self.drained = threading.Event()
        self.draining = False
        self.rank = plan.rank or ranks(plan)
        self.spill = SpillFiles(store)
        self._inline: list | None = None  # go_inline's ready heap
        self.finished_tile = None  # called with (key, tile) once a stored output's tile is final
        # Device tiles (copies_out): a stored output's tile is copied to its buffer in host
        # memory (``out_buffers``, else a host array of its own) on the worker that finished
        # it, its statistics taken there and ``finished_out`` called, as the host pool does
        # with tiles computed in place; the device tile stays in ``results`` for its readers.
        self.out_buffers: dict = {}
        self.finished_out = None
        self.landed: dict[int, object] = {}  # output key -> its host copy
        limit = ex.memory_limit
        room = self.tiles.room(plan, limit)  # on a GPU, less what its cache keeps there
        # admission only where the run could cross the limit (see budget.may_cross)
        self.budget = Budget(self, limit, self.spill) if limit and may_cross(plan, room) else None

    def admit(self, item) -> bool:
        """May ``item`` (run, kind, task, ...) run now? Called under the queues' lock."""
        if self.budget is None:
            return True
        try:
            return self.budget.admit(item[1], item[2], item[3] if len(item) > 3 else None,
                                     force=self.control.error is not None)
        except BaseException as exc:  # noqa: BLE001 - the worker thread must live on
            self.control.fail(exc)  # the item runs, and is skipped: the run ends with exc
            self.finished.set()
            return True

    # -- scheduling ----------------------------------------------------------------------------
    def go(self) -> RunResult:
        t0 = time.perf_counter()
        control = self.control
        self.pending = 0  # items queued and not yet handled: the run ends when it drops to 0
        # The tasks without inputs, listed before any is queued: once workers run, `waiting`
        # changes under our feet, and a task counted down to 0 is queued by the worker.
        first = [t for t in self.plan.tasks if not isinstance(t, Aggregate) and not t.inputs]
        try:
            for t in first:
                self._queue(t.worker, ("run", t))
            # Timed waits: a SIGINT that the OS hands to a worker thread does not wake a blocked
            # wait, but Python runs its handler (KeyboardInterrupt) here within a tick.
            while not self.finished.wait(_TICK):
                control.report()  # also while one long BLAS call runs: the CLI's bar appears
            control.report()  # the last figure (workers count tasks; this thread reports)
        except BaseException as exc:  # Ctrl-C: stop the workers before giving up the run
            control.fail(exc)
            self.ex.queues.wake()  # workers waiting for room skip their queues now
            raise
        finally:
            with self.lock:  # let the workers drain what is already queued (they skip it)
                self.draining = True
                idle = self.pending == 0
            # A running kernel stops at its next chunk (see RunControl.check), so this wait is
            # short; a second Ctrl-C must not leave workers busy behind the caller's back.
            while not idle:
                try:
                    idle = self.drained.wait(_TICK)
                except KeyboardInterrupt:
                    continue
            self.spill.close()  # success, error or Ctrl-C: the run's spill files go
        if control.error is not None:
            raise translate(control.error)
        tiles = {k: self.results[k] for k in self.keep}
        budget = self.budget
        return self.ledger.result(tiles, time.perf_counter() - t0, nnz=self.nnz,
                                  nonfinite=self.nonfinite, crc32=self.crc32,
                                  over_budget=budget.over_budget if budget else 0,
                                  memory_limit=self.ex.memory_limit or None)

    def go_inline(self) -> RunResult:
        """Run the plan on the calling thread: the items the workers would have taken, in the
        order they would have taken them (folds first, then the plan's order)."""
        t0 = time.perf_counter()
        self.pending = 0
        self._inline = []
        self._seq = itertools.count()
        try:
            for t in self.plan.tasks:
                if not isinstance(t, Aggregate) and not t.inputs:
                    self._queue(t.worker, ("run", t))
            while self._inline and self.control.error is None:
                _, _, w, item = heapq.heappop(self._inline)
                self.handle(w % self.ex.workers, item)  # records an error (Ctrl-C too)
        finally:
            self.spill.close()
        if self.control.error is not None:
            raise translate(self.control.error)
        return self.ledger.result({k: self.results[k] for k in self.keep},
                                  time.perf_counter() - t0, nnz=self.nnz,
                                  nonfinite=self.nonfinite, crc32=self.crc32, over_budget=0,
                                  memory_limit=self.ex.memory_limit or None)

    def _queue(self, worker: int, item) -> None:
        with self.lock:
            self.pending += 1
        # folds first (they free a partial), then the plan's order
        key = item[1].key
        priority = (0, self.rank.get(key, 0)) if item[0] == "acc" else (1, self.rank.get(key, 0))
        if self._inline is not None:
            heapq.heappush(self._inline, (priority, next(self._seq), worker, item))
            return
        self.queues.put(worker % len(self.queues), priority, (self,) + item)

    def handle(self, w: int, item) -> None:
        """Run one queued item on worker ``w`` (called from the executor's worker threads)."""
        try:
            if self.control.error is None:
                t0 = time.perf_counter()
                kind, task = item[0], item[1]
                # numpy's answer for 1/0, overflow and invalid values, without RuntimeWarnings
                # (errstate is per thread: each worker sets its own)
                with np.errstate(all="ignore"):
                    if kind == "run":
                        self._run_task(w, task)
                    else:
                        self._accumulate(w, task, item[2])
                self.ledger.ran(task, w, time.perf_counter() - t0)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller by go()
            self.control.fail(exc)
            self.finished.set()
            self.ex.queues.wake()  # workers waiting for room skip their queues now
        finally:
            if self.budget is not None:
                with self.ex.queues.lock:
                    self.budget.ended(item[0], item[1], item[2] if len(item) > 2 else None)
                self.ex.queues.wake()
            with self.lock:
                self.pending -= 1
                last = self.draining and self.pending == 0
            if last:
                self.drained.set()

    def _fetch(self, w: int, task, key: int):
        value = self.results[key]
        src = self.made_on.get(key, w)
        if src != w:  # counted once per worker that reads it, as a cluster moves it once
            with self.lock:
                first = (key, w) not in self.sent
                self.sent.add((key, w))
            if first:
                self.ledger.moved(task, int(getattr(value, "nbytes", 0)))
        return self.tiles.fetch(value, src, w)  # also a tile the budget moved off a device

    def _run_task(self, w: int, task) -> None:
        if isinstance(task, Aggregate):  # pragma: no cover - aggregations are driven by _accumulate
            raise InternalError(f"unexpected task {task!r}")
        inputs = [self._fetch(w, task, k) for k in task.inputs]
        source = self.plan.readers[task.tensor] if isinstance(task, Load) else None
        dest = self.dest.get(task.key)
        # A kernel computing its output tile in slabs hands each one over while it is in the
        # cache: the tile's statistics are taken there, not in a sweep of their own after it.
        stats = TileStats() if dest is not None and isinstance(task, Kernel) and \
            self.ex.xp is np else None
        # the kernel's temporaries count in the run's peak while it runs (budget.py)
        temps = temporary_bytes(self.plan, task) if isinstance(task, Kernel) else 0
        if temps:
            self.ledger.hold(task.key, temps)
        try:
            choice = self.plan.kernels[task.op] if isinstance(task, Kernel) else None
            if source is not None:  # a Load: a GPU may have its tile cached (devcache.py)
                value = self.tiles.load(w, task, source, self.runner, op_of(self.plan, task))
            else:
                value = self.runner.run(task, inputs, op_of(self.plan, task), choice=choice,
                                        out=dest, source=source,
                                        sink=None if stats is None else stats.add)
        finally:
            if temps:
                self.ledger.drop(temps)
            if isinstance(task, Kernel):
                self.control.call_ended()
        self._release(task.inputs)
        self._publish(w, task, value, stats)

    def _accumulate(self, w: int, agg: Aggregate, part_key: int) -> None:
        part = self._fetch(w, agg, part_key)
        acc = self.acc.get(agg.key)
        op = op_of(self.plan, agg)
        if acc is None:
            acc = self.acc[agg.key] = self.runner.start(agg, part, op, self.dest.get(agg.key))
            self.ledger.acquire(agg.key, held_bytes(agg, acc))  # the partial is released below
        else:
            self.runner.fold(agg, acc, part, op)
        self._release((part_key,))
        self.acc_left[agg.key] -= 1
        if self.acc_left[agg.key] == 0:
            value = self.runner.finish(agg, self.acc.pop(agg.key), op)
            self.ledger.release(agg.key)  # _publish acquires it again, as a finished tile
            self._publish(w, agg, value)

    def _publish(self, w: int, task, value, stats: TileStats | None = None) -> None:
        """``stats``: the tile's statistics, where the kernel took them from every slab of
        ``value`` as it wrote them into the output file (``stats.nbytes`` tells)."""
        self.tiles.publish(value)
        self.tiles.produced(w, task.key, value)
        if self.finished_out is not None and task.key in self.keep:
            self._land(task.key, value)
        dest = self.dest.get(task.key)
        if dest is not None:
            if value is not dest:  # land it in the output file, on this worker
                self.ex.xp.copyto(dest, value, casting="unsafe")
                value = dest
                stats = None
            # The store needs these: worked out here, on the worker, as each tile is finished,
            # not one tile after another at the commit.
            facts = stats.result() if stats is not None and stats.nbytes == dest.nbytes else \
                tile_stats(dest)
            self.nnz[task.key], self.nonfinite[task.key], self.crc32[task.key] = facts
            if self.finished_tile is not None:
                self.finished_tile(task.key, dest, facts)
        written = dest is None and self.finished_tile is not None and task.key in self.keep \
            and self.finished_tile(task.key, value)
        self.results[task.key] = value
        self.made_on[task.key] = w
        self.ledger.produced(task, held_bytes(task, value), int(getattr(value, "nbytes", 0)))
        if dest is not None:  # an output file's pages now: the page cache's, not the budget's
            self.ledger.release(task.key)
        if written:  # in its file now: kept only while consumers (queued below) need it
            with self.lock:
                self.keep.discard(task.key)
                unused = not self.refs.get(task.key)
                if unused:
                    self.results.pop(task.key, None)
            if unused:
                self.ledger.release(task.key)
        ready = []
        with self.lock:
            for c in self.consumers[task.key]:
                if c in self.waiting:
                    self.waiting[c] -= 1
                    if self.waiting[c] == 0:
                        ready.append(c)
        agg = self.agg_of.get(task.key)
        if agg is not None:
            t = self.plan.task(agg)
            self._queue(t.worker, ("acc", t, task.key))
        for c in ready:
            t = self.plan.task(c)
            self._queue(t.worker, ("run", t))
        if self.control.task_done() == self.control.total:
            self.finished.set()

    def _land(self, key: int, value) -> None:
        """Device tile ``value`` of a stored output is final: copy it to the host now, on this
        worker (while other tiles are still computed), with its statistics, and hand it to
        its writer (``finished_out``: written early, or streamed into its file)."""
        buf, facts = self.out_buffers.get(key), None
        if buf is not None:
            self.tiles.copy_out(value, buf, key)
            facts = self.nnz[key], self.nonfinite[key], self.crc32[key] = tile_stats(buf)
        else:
            buf = self.tiles.to_host(value, key)
        self.landed[key] = buf
        self.finished_out(key, buf, facts)

    def _release(self, keys) -> None:
        for k in keys:
            with self.lock:
                self.refs[k] -= 1
                last = self.refs[k] == 0 and k not in self.keep
                value = self.results.pop(k, None) if last else None
            if value is not None:
                self.ledger.release(k)
                self.spill.drop(k)
                self.tiles.released(value)
