"""The local executor: a pool of worker threads running a TilePlan as a dataflow graph.

Each worker has its own queue and runs only the tasks placed on it. A task is queued when its
inputs exist; an aggregation accumulates each partial as soon as it arrives (on the aggregation's
worker), so partials do not pile up. Tiles are freed when their last consumer has run. A tile read
by a task on another worker than the one that produced it counts as a transfer.

BLAS threads are set once for the whole run (threadpoolctl limits are process-wide): with W busy
workers each gets cores // W BLAS threads.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError, Error, InternalError, OutOfMemoryError
from ..physical.plan import Aggregate, Assemble, Kernel, Load, TilePlan
from ..storage.writer import has_nonfinite
from .kernels import KernelSpec, combine, get_backend
from .tasks import finish_aggregate, run_assemble, run_kernel, run_load, start_aggregate

__all__ = ["LocalExecutor", "RunResult"]

_controller = None
_TICK = 0.05  # seconds between checks for Ctrl-C while the caller waits for a run


def _blas_limits(threads: int):
    """A context manager capping BLAS threads for the whole process."""
    global _controller
    from threadpoolctl import ThreadpoolController
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=threads, user_api="blas")


@dataclass
class RunResult:
    tiles: dict = field(repr=False)  # output task key -> tile (numpy array)
    seconds: float = 0.0
    bytes_moved: int = 0        # bytes of tiles read by a worker other than their producer
    peak_bytes: int = 0         # the most tile bytes alive at once (owned arrays, not mmap views)
    kernel_calls: int = 0
    worker_busy: list = field(default_factory=list)
    nnz: dict = field(default_factory=dict, repr=False)  # output key -> nonzeros, when counted
    nonfinite: dict = field(default_factory=dict, repr=False)  # output key -> holds NaN/inf


def _owned_nbytes(a) -> int:
    """Bytes of process memory a tile holds: 0 for views of memory-mapped files (stored tiles,
    output buffers), which the page cache holds."""
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return int(a.nbytes) if isinstance(base, np.ndarray) else 0


def _tile_bytes(task, value) -> int:
    """The memory a tile alive in the run stands for: all of it for a tile the run computed
    (written into an output file's mapping or not, its pages are this run's), only what it owns
    for a Load (a view of a stored tensor costs nothing until read; absent tiles are zeros)."""
    return _owned_nbytes(value) if isinstance(task, Load) else int(getattr(value, "nbytes", 0))


class LocalExecutor:
    """W in-process workers: threads that live as long as the executor, one queue each."""

    name = "local"

    def __init__(self, workers: int, *, memory_limit: int | None = None, backend: str = "numpy"):
        self.workers = max(1, int(workers))
        self.memory_limit = memory_limit
        self.xp = get_backend(backend)
        self.cores = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                         else os.cpu_count() or 1)
        self.queues = [queue.SimpleQueue() for _ in range(self.workers)]
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # one plan runs at a time

    def _start(self) -> None:
        if not self.threads:
            self.threads = [threading.Thread(target=_worker_loop, args=(w, self.queues[w]), daemon=True,
                                             name=f"tensordb-worker-{w}") for w in range(self.workers)]
            for th in self.threads:
                th.start()

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for th in self.threads:
            th.join()
        self.threads = []

    def run(self, plan: TilePlan, store=None, progress=None, destinations=None) -> RunResult:
        """Run ``plan``; ``destinations`` maps output task keys to buffers to compute into."""
        if not plan.tasks:
            return RunResult({})
        busy = {t.worker for t in plan.tasks if isinstance(t, Kernel)}
        blas = max(1, self.cores // max(1, len(busy)))
        with self._lock, _blas_limits(blas):
            self._start()
            return _Run(self, plan, progress, destinations or {}).go()


class _Cancelled(Exception):
    """Raised inside a kernel to stop it: the run already has the error that ends it."""


def _worker_loop(w: int, q: queue.SimpleQueue) -> None:
    while True:
        item = q.get()
        if item is None:
            return
        item[0].handle(w, item[1:])


class _Run:
    def __init__(self, ex: LocalExecutor, plan: TilePlan, progress, destinations: dict) -> None:
        self.ex, self.plan, self.progress = ex, plan, progress
        self.dest = destinations
        self.nnz: dict[int, int] = {}
        self.nonfinite: dict[int, bool] = {}
        self.xp = ex.xp
        self.specs = {i: KernelSpec(op, self.xp, plan.kernels[i]) for i, op in enumerate(plan.ops)}
        self.lock = threading.Lock()
        self.queues = ex.queues
        self.results: dict[int, object] = {}
        self.made_on: dict[int, int] = {}
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
        self.total = len(plan.tasks)
        self.done = 0
        self.partial: dict[int, float] = {}  # worker thread -> fraction of its kernel call done
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self.drained = threading.Event()
        self.draining = False
        self.live = 0
        self.counted: dict[int, int] = {}  # task key -> bytes _track counted for its tile
        self.peak = 0
        self.moved = 0
        self.busy = [0.0] * ex.workers
        n_ops = len(plan.ops)
        self.op_seconds = [0.0] * n_ops
        self.op_moved = [0] * n_ops
        self.op_peak = [0] * n_ops
        self.op_calls = [0] * n_ops

    # -- scheduling ----------------------------------------------------------------------------
    def go(self) -> RunResult:
        t0 = time.perf_counter()
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
                self._report()  # also while one long BLAS call runs: the CLI's bar appears
        except BaseException as exc:  # Ctrl-C: stop the workers before giving up the run
            with self.lock:
                if self.error is None:
                    self.error = exc
            raise
        finally:
            with self.lock:  # let the workers drain what is already queued (they skip it)
                self.draining = True
                idle = self.pending == 0
            # A running kernel stops at its next chunk (see _check), so this wait is short; a
            # second Ctrl-C must not leave workers busy behind the caller's back, so it waits on.
            while not idle:
                try:
                    idle = self.drained.wait(_TICK)
                except KeyboardInterrupt:
                    continue
        if self.error is not None:
            raise self._translate(self.error)
        seconds = time.perf_counter() - t0
        for s, sec, moved, peak, calls in zip(self.plan.stats, self.op_seconds, self.op_moved,
                                              self.op_peak, self.op_calls):
            s.measured = {"seconds": sec, "kernel_calls": calls, "bytes_moved": moved,
                          "peak_tile_bytes": peak}
        tiles = {k: self.results[k] for k in self.keep}
        return RunResult(tiles, seconds, self.moved, self.peak, sum(self.op_calls), self.busy,
                         self.nnz, self.nonfinite)

    def _queue(self, worker: int, item) -> None:
        with self.lock:
            self.pending += 1
        self.queues[worker % len(self.queues)].put((self,) + item)

    def handle(self, w: int, item) -> None:
        """Run one queued item on worker ``w`` (called from the executor's worker threads)."""
        try:
            if self.error is None:
                t0 = time.perf_counter()
                kind, task = item[0], item[1]
                # numpy's answer for 1/0, overflow and invalid values, without RuntimeWarnings
                # (errstate is per thread: each worker sets its own)
                with np.errstate(all="ignore"):
                    if kind == "run":
                        self._run_task(w, task)
                    else:
                        self._accumulate(w, task, item[2])
                dt = time.perf_counter() - t0
                with self.lock:
                    self.busy[w] += dt
                    self.op_seconds[self.plan.owner.get(task.key, 0)] += dt
        except BaseException as exc:  # noqa: BLE001 - reported to the caller by go()
            with self.lock:
                if self.error is None:
                    self.error = exc
            self.finished.set()
        finally:
            with self.lock:
                self.pending -= 1
                last = self.draining and self.pending == 0
            if last:
                self.drained.set()

    def _fetch(self, w: int, task, key: int):
        value = self.results[key]
        if self.made_on.get(key, w) != w:
            n = int(getattr(value, "nbytes", 0))
            with self.lock:
                self.moved += n
                self.op_moved[self.plan.owner.get(task.key, 0)] += n
        return value

    def _run_task(self, w: int, task) -> None:
        if isinstance(task, Load):
            value = run_load(task, self.plan.readers[task.tensor], self.xp)
        elif isinstance(task, Assemble):
            value = run_assemble(task, [self._fetch(w, task, k) for k in task.inputs], self.xp)
        elif isinstance(task, Kernel):
            args = [None if a is None else self._fetch(w, task, a) for a in task.args]
            try:
                value = run_kernel(task, self.specs[task.op], args, self.dest.get(task.key),
                                   self._check)
            finally:
                with self.lock:
                    self.partial.pop(threading.get_ident(), None)
            self.op_calls[task.op] += 1
        else:  # pragma: no cover - aggregations are driven by _accumulate
            raise InternalError(f"unexpected task {task!r}")
        self._release(task.inputs)
        self._publish(w, task, value)

    def _check(self, fraction: float | None = None) -> None:
        """Called by kernels between chunks: stop when the run has failed or was cancelled, and
        report progress within the call, so that a plan of a few long calls shows it too."""
        if self.error is not None:
            raise _Cancelled()
        if fraction is not None and self.progress is not None:
            self.partial[threading.get_ident()] = fraction
            self._report()

    def _report(self) -> None:
        """Progress: finished tasks plus the fractions of the kernel calls running now."""
        if self.progress is None:
            return
        with self.lock:
            done = self.done
            running = sum(self.partial.values())
        self.progress(min(done + running, self.total), self.total)

    def _accumulate(self, w: int, agg: Aggregate, part_key: int) -> None:
        part = self._fetch(w, agg, part_key)
        acc = self.acc.get(agg.key)
        if acc is None:
            acc = self.acc[agg.key] = start_aggregate(agg, part, self.xp, self.dest.get(agg.key))
            self._track(_tile_bytes(agg, acc))  # the partial's own bytes are released just below
        else:
            combine(agg.agg, acc, part, self.xp)
        self._release((part_key,))
        self.acc_left[agg.key] -= 1
        if self.acc_left[agg.key] == 0:
            value = finish_aggregate(agg, self.acc.pop(agg.key), self.xp)
            self._track(-_tile_bytes(agg, value))  # _publish counts it again
            self._publish(w, agg, value)

    def _track(self, delta: int) -> None:
        """Count tile bytes alive (for the peak EXPLAIN ANALYZE reports). The memory budget is
        enforced when planning: every kernel call's tiles fit memory_limit / workers."""
        with self.lock:
            self.live += delta
            self.peak = max(self.peak, self.live)

    def _publish(self, w: int, task, value) -> None:
        dest = self.dest.get(task.key)
        if dest is not None:
            if value is not dest:  # land it in the output file, on this worker
                self.xp.copyto(dest, value, casting="unsafe")
                value = dest
            self.nnz[task.key] = int(np.count_nonzero(dest))  # the store needs it: count here
            self.nonfinite[task.key] = has_nonfinite(dest)
        self.results[task.key] = value
        self.made_on[task.key] = w
        nbytes = self.counted[task.key] = _tile_bytes(task, value)
        self._track(nbytes)
        op = self.plan.owner.get(task.key, 0)
        ready = []
        with self.lock:
            self.op_peak[op] = max(self.op_peak[op], int(getattr(value, "nbytes", 0)))
            self.done += 1
            for c in self.consumers[task.key]:
                if c in self.waiting:
                    self.waiting[c] -= 1
                    if self.waiting[c] == 0:
                        ready.append(c)
            done = self.done
        agg = self.agg_of.get(task.key)
        if agg is not None:
            t = self.plan.task(agg)
            self._queue(t.worker, ("acc", t, task.key))
        for c in ready:
            t = self.plan.task(c)
            self._queue(t.worker, ("run", t))
        if self.progress is not None:
            self.progress(done, self.total)
        if done == self.total:
            self.finished.set()

    def _release(self, keys) -> None:
        for k in keys:
            with self.lock:
                self.refs[k] -= 1
                last = self.refs[k] == 0 and k not in self.keep
                value = self.results.pop(k, None) if last else None
            if value is not None:
                self._track(-self.counted.pop(k, 0))

    @staticmethod
    def _translate(exc: BaseException) -> Error:
        if isinstance(exc, Error):
            return exc
        if isinstance(exc, MemoryError):
            return OutOfMemoryError(f"out of memory while running a tile task: {exc}")
        if isinstance(exc, (ValueError, ArithmeticError)):  # the data, e.g. int ** negative int
            return DataError(f"a tile kernel failed on the data: {exc}")
        err = InternalError(f"a tile task failed: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err
