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
to get a core, which on a busy machine took a 256^3 product from 0.3 ms to 48 ms. A sparse
kernel's call (scipy, GraphBLAS) counts the flops of its stored entries, weighed
``SPARSE_FLOP_WEIGHT`` times a BLAS flop (``_work``), here and where a plan is found tiny. The
count set for the last run is ``LocalExecutor.last_blas_threads``.

Calls that do not divide evenly among the workers leave cores idle at the end of a run: the
run's last matrix-product call may be cut by rows among the workers with nothing queued
(tail.py, ``pool_run._Run._cut``; ``tail_cut``, off unless ``TAIL_CUT``: it measured level on a
2-core machine; ``last_tail_cuts`` the calls the last run cut).

A tiny plan (8 tasks and 16 MFLOP, or 64 tasks and 4 MFLOP; no memory budget to keep, host
tiles) runs on the calling thread, in the same order and through the same task code: handing
it to a worker and waiting for it to come back would cost more than its kernels. Ctrl-C then lands in that thread and ends
the run the same way (the rest of the plan is skipped, nothing is stored).
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import nullcontext

import numpy as np

from ..physical.plan import Kernel, TilePlan
from ..plan.memory import BLAS_FLOPS_PER_THREAD, SPARSE_FLOP_WEIGHT
from .contract import Capabilities, as_sink, pool_capabilities
from . import fastpath, semiring
from .budget import HEAP_SLACK, may_cross, return_freed_memory
from .graphcache import GRAPHS
from .ready import STOP, ReadyQueues
from .runtime import RunControl, RunResult, plan_specs
from .pool_run import _Run
from .tiles import HostTiles

__all__ = ["LocalExecutor", "HostTiles", "pool_capabilities"]  # (the last: contract.py's)

_controller = None
INLINE_TASKS = 8  # a plan of at most this many tasks...
INLINE_FLOPS = 1 << 24  # ...and this many flops (a few ms at most) runs on the calling thread
# So does one of more tasks, up to this many, doing little: a digits logistic-regression step,
# 11 tasks and 1.1 MFLOP, took 8.6 ms at the fastest on the workers and 3.5 ms on the calling
# thread (each hand-off to a worker and back is a thread wake-up; on a shared machine, a wait
# for a core), while a mid-size elementwise map in many tiles keeps both cores.
INLINE_MANY_TASKS = 64
INLINE_MANY_FLOPS = 1 << 22
# A plan run as a straight line of calls (fastpath.py: a few microseconds a task, not the
# dataflow's tens) stays on the calling thread up to these: the digits MLP step (48 tasks, 28
# MFLOP) took 9.6 ms at the fastest there against 27 on the workers (median 31 against 50,
# CPU 7.9 against 10.8 ms; one process, alternating, load 15), five of them in one call (140
# MFLOP) 6.7 against 22.9 ms a step (median 28.5 against 37.4); its BLAS calls still have
# every core (_blas_threads: one busy worker).
# A plan with a call larger than FAST_CALL_FLOPS, or more than FAST_TASK_FLOPS a task on
# average (a product split in tiles for the workers: 512^3 in 64 calls, 1.3 MFLOP a task),
# keeps the workers: there its calls run side by side, and the per-task cost the straight
# line saves is small beside them.
FAST_TASKS = 1024
FAST_FLOPS = 1 << 28
FAST_CALL_FLOPS = 1 << 25
FAST_TASK_FLOPS = 1 << 20
# A plan of one kernel call (its Loads beside it) has nothing to run side by side: a worker
# would only add two thread wake-ups to it. Up to this many (weighed) flops it stays on the
# calling thread: a 50,000-node graph's plan-cached SpMV (500,000 entries, 256M weighed flops,
# 0.6 ms of scipy) took 1.33 ms through a worker and 1.07 ms here (quiet, one process,
# alternated). Above it a call is long enough that the wake-ups do not matter, and a worker
# keeps Ctrl-C's wait in the caller's short ticks.
ONE_CALL_FLOPS = 1 << 30


def _blas_limits(threads: int) -> "_BlasLimit":
    """A context manager capping BLAS threads for the whole process. The BLAS libraries
    loaded are found again (1-2 ms) when the process has imported modules since the last
    look: a library loaded later (scipy's OpenBLAS beside numpy's) is limited too."""
    global _controller
    modules = len(sys.modules)
    if _controller is None or _controller[0] != modules:
        from threadpoolctl import ThreadpoolController
        _controller = (len(sys.modules), [lib for lib in ThreadpoolController().lib_controllers
                                          if lib.user_api == "blas"])
    return _BlasLimit(_controller[1], threads)


class _BlasLimit:
    """threadpoolctl's ``limit(limits=threads, user_api="blas")`` without its bookkeeping
    (an info dict per library, a limiter object: 20-40 us a run, a tenth of a small training
    step's fixed cost): each BLAS library found once is set through its own threadpoolctl
    controller (which keeps threadpoolctl's rule of one thread controlling OpenBLAS) only where
    its count differs, and put back as it was on exit."""

    __slots__ = ("libs", "threads", "saved")

    def __init__(self, libs, threads: int) -> None:
        self.libs, self.threads, self.saved = libs, threads, ()

    def __enter__(self) -> "_BlasLimit":
        saved = []
        for lib in self.libs:
            calls = _openblas_calls(lib)
            n = lib.num_threads if calls is None else calls[0]()
            if n is not None and n != self.threads:
                _set_threads(lib, calls, self.threads)
                saved.append((lib, calls, n))
        self.saved = saved
        return self

    def __exit__(self, *exc) -> None:
        for lib, calls, n in self.saved:
            _set_threads(lib, calls, n)


# An OpenBLAS controller of threadpoolctl (its pthreads layer) -> its library's own
# (get, set) functions, found once: threadpoolctl's properties find them again at each call
# (the symbol's name formatted, the controlling thread looked up), 8-9 us of a small step's
# run each way (call29e). None for another library or threading layer: threadpoolctl's calls.
_OPENBLAS_CALLS: dict[int, tuple] = {}


def _openblas_calls(lib):
    kept = _OPENBLAS_CALLS.get(id(lib))
    if kept is not None and kept[0] is lib:
        return kept[1]
    calls = None
    symbol = getattr(lib, "_get_symbol", None)  # (threadpoolctl 3.2's; else its calls)
    if symbol is not None and getattr(lib, "internal_api", None) == "openblas" and \
            getattr(lib, "threading_layer", None) not in (None, "openmp"):
        get = symbol("openblas_get_num_threads")
        put = symbol("openblas_set_num_threads")
        shared = getattr(type(lib), "_SHARED_STATE", None)
        if get is not None and put is not None and shared is not None:
            calls = (get, put, shared)
    _OPENBLAS_CALLS[id(lib)] = (lib, calls)
    return calls


def _set_threads(lib, calls, n: int) -> None:
    """``lib.set_num_threads(n)``; where this thread controls OpenBLAS already (threadpoolctl's
    rule: one thread sets a process-wide pool's size, the others do nothing), the library's
    own call, as threadpoolctl would make it."""
    if calls is not None and calls[2].controlling_thread is threading.current_thread():
        calls[1](n)
    else:
        lib.set_num_threads(n)


# whether a new executor cuts a run's last matrix-product call (``LocalExecutor.tail_cut``)
TAIL_CUT = False
# whether a new executor cuts, before the run, the call that leaves its worker the last busy
# (``LocalExecutor.pre_cut``; pool_split ``_pre_cut``): off until measured on a quiet machine
# (under load 5-15 its block medians were 0.97-1.14x the uncut run's, minima level: blk39)
PRE_CUT = False
# whether the thread that runs a plan serves worker 0's queue itself (``LocalExecutor.
# serve_caller``; pool_run ``_Run.serve``): off until measured on a quiet machine (under load
# its tenth percentiles were better, its minima 0.1-1 ms worse: the caller is not pinned and
# may share worker 1's core; blk39, docs/benchmarks.md)
SERVE_CALLER = False
# ...where no kernel call of the plan is larger than this (flops, a sparse call's weighed): a
# Ctrl-C lands in the calling thread, and waits for the C call it runs to return.
SERVE_CALL_FLOPS = 1 << 28


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
        # a tiny plan runs as a straight line of calls (fastpath.py); off: through _Run
        self.fast_path = True
        # the run's last matrix-product call cut by rows among idle workers (tail.py): off
        # unless TAIL_CUT says otherwise (it measured level on this 2-core VM, docs/benchmarks.md)
        self.tail_cut = TAIL_CUT
        self.last_tail_cuts = 0  # calls the last run cut
        self.pre_cut = PRE_CUT
        # the calling thread serves worker 0's queue while a run goes (ready.py ``claim``)
        self.serve_caller = SERVE_CALLER
        self.last_pre_cuts = 0  # calls the last run cut before it started (0 or 1)

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
        if store is not None:  # its commits retire the GraphBLAS matrices of stored graphs
            GRAPHS.listen(store)
        sink = as_sink(sink, destinations, finished)
        buffers = sink.open(False) if sink is not None else {}
        dest = buffers if tiles.writes_destinations else {}
        fast = self.fast_path and type(tiles) is HostTiles and not (self.memory_limit and may_cross(
            plan, tiles.room(plan, self.memory_limit), sparse=True))
        inline = tiles.inline and _tiny(plan, fast)
        limits = nullcontext()
        if tiles.limits_blas and (not inline or _calls_blas(plan)):
            threads = min(plan.blas_threads, self.cores) or _blas_threads(plan, self.cores, inline)
            self.last_blas_threads = threads
            limits = _limits(threads)
        if inline and fast:
            with self._lock, limits:  # a straight line on this thread (fastpath.py)
                control = RunControl(len(plan.tasks), progress) if progress else None
                return fastpath.run_program(
                    plan, fastpath.program(plan, self.workers), dest, sink.finished if sink else None,
                    plan_specs(plan, np), self.workers,
                    control.check if control else None, control.task_done if control else None,
                    getattr(sink, "versions", None) if dest else None)
        with self._lock, limits:
            plan = tiles.start_run(plan, store)
            run = _Run(self, plan, progress, dest, store)
            run.serve = run.serve and _work(plan)[1] <= SERVE_CALL_FLOPS
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
                self.last_tail_cuts = run.cuts
                self.last_pre_cuts = int(run.precut is not None)
                tiles.end_run(plan, run, result, sink)
                # The run object lives on in reference cycles until a garbage collection: the
                # output tiles it holds would stay with it after the caller lets them go (and
                # the output buffers, views of an allocation the next statement's output may
                # reuse once nothing refers to it: storage/memfiles.py ``take``).
                run.results.clear()
                run.dest = run.acc = {}
                run.precut = None
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


class _limits:
    """BLAS capped at ``threads`` for the run, and GraphBLAS's kernel calls too (semiring.py).
    (A class, not a generator: entered once a run.)"""

    __slots__ = ("blas", "graphblas")

    def __init__(self, threads: int) -> None:
        self.blas, self.graphblas = _blas_limits(threads), semiring.threads(threads)

    def __enter__(self) -> None:
        self.blas.__enter__()
        try:
            self.graphblas.__enter__()
        except BaseException:
            self.blas.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.graphblas.__exit__(*exc)
        finally:
            self.blas.__exit__(*exc)


def _blas_threads(plan: TilePlan, cores: int, inline: bool) -> int:
    """BLAS threads per kernel call for the run of ``plan``: the cores shared by the workers
    that run kernels (all of them for a plan run on the calling thread), at most one thread per
    ``BLAS_FLOPS_PER_THREAD`` of its largest call (a sparse call's flops weighed, ``_work``)."""
    kept = plan.memo.get("blas_busy")  # (tasks, busy workers): once a plan
    if kept is None or kept[0] is not plan.tasks:
        kept = plan.memo["blas_busy"] = (plan.tasks, max(1, len(
            {t.worker for t in plan.tasks if isinstance(t, Kernel)})))
    busy = 1 if inline else kept[1]
    return max(1, min(cores // busy, _work(plan)[1] // BLAS_FLOPS_PER_THREAD))


def _work(plan: TilePlan) -> tuple[int, int]:
    """The flops of ``plan``'s kernel calls, all together and the largest call's, a sparse
    kernel's (scipy, GraphBLAS: its flops counted from the stored entries, physical/lower.py)
    weighed by ``SPARSE_FLOP_WEIGHT``, what a flop of it costs against a BLAS flop: an SSSP step's
    call of 1.1M flops takes a core about as long as a dense product of 290M (once a plan)."""
    kept = plan.memo.get("kernel_flops")  # (tasks, ...): a copy with other tasks counts anew
    if kept is None or kept[0] is not plan.tasks:
        calls = [t.flops * (SPARSE_FLOP_WEIGHT if plan.kernels[t.op].sparse is not None else 1)
                 for t in plan.tasks if isinstance(t, Kernel)]
        kept = plan.memo["kernel_flops"] = (plan.tasks, sum(calls), max(calls, default=0))
    return kept[1], kept[2]


def _calls_blas(plan: TilePlan) -> bool:
    """Whether a kernel of ``plan`` may call BLAS (one computed by broadcasting NumPy does
    not): a plan of elementwise maps and reductions on the calling thread sets no limits
    (threadpoolctl's, 20-40 us a run)."""
    kept = plan.memo.get("calls_blas")
    if kept is None or kept[0] is not plan.kernels:
        kept = plan.memo["calls_blas"] = (plan.kernels, any(
            c.method != "broadcast" or c.fallback is not None for c in plan.kernels))
    return kept[1]


def _tiny(plan: TilePlan, fast: bool = False) -> bool:
    """Whether ``plan`` is small enough to run on the calling thread (see the module's doc);
    ``fast``: as a straight line of calls (fastpath.py), which costs far less a task than the
    pool's dataflow, so more plans are worth it."""
    n = len(plan.tasks)
    if n > (FAST_TASKS if fast else INLINE_MANY_TASKS):
        return False
    flops, largest = _work(plan)
    if flops == largest and flops <= ONE_CALL_FLOPS and n <= INLINE_TASKS and \
            sum(isinstance(t, Kernel) for t in plan.tasks) == 1:
        return True  # one call: nothing to run side by side
    if fast and flops <= FAST_FLOPS and largest <= FAST_CALL_FLOPS and \
            flops <= FAST_TASK_FLOPS * n:
        return True
    return n <= INLINE_MANY_TASKS and \
        flops <= (INLINE_FLOPS if n <= INLINE_TASKS else INLINE_MANY_FLOPS)
