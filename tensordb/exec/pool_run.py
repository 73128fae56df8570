"""One plan's run on the local pool (``pool.LocalExecutor.run`` makes a ``_Run`` for each plan):
the dataflow of its tasks (what is ready, which worker runs it, when a tile is freed), run on the
workers' queues or, for a tiny plan, on the calling thread (``go_inline``); aggregations fold
each partial as it arrives; a stored output's tile is handed to the sink once final. A Load
that only tasks on its own worker read is run by the first of them (``_Shape.lazy``), not
queued. The run's last
matrix-product call is cut by rows among the workers left idle (``tail.py``). What a task
does and what it costs is the shared runtime's (``runtime.py``), where its tiles live the pool's
``tiles`` (``tiles.py``, ``gpu.py``).
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InternalError
from ..physical.plan import Aggregate, Kernel, Load, TilePlan
from ..storage import held_interrupt
from ..storage.sparse import tile_nbytes
from ..storage.writer import TileStats, tile_stats
from .budget import Budget, may_cross, temporary_bytes
from .donate import donor
from .runtime import (Ledger, RunControl, RunResult, TaskRunner, held_bytes, op_of, plan_specs,
                      translate)
from .spill import SpillFiles
from .pool_shape import PlanShape as _Shape
from .pool_split import Splits
from .tiles import HostTiles

if TYPE_CHECKING:  # pragma: no cover
    from .pool import LocalExecutor

__all__ = ["_Run"]

_TICK = 0.05  # seconds between checks for Ctrl-C while the caller waits for a run


class _Run(Splits):
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
        shape = _Shape.of(plan)  # what every run of the plan starts from (kept in its memo)
        self.shape = shape
        self.consumers, self.agg_of = shape.consumers, shape.agg_of  # read only
        self.refs = dict(shape.refs)
        self.acc: dict[int, object] = {}
        self.acc_left = dict(shape.acc_left)
        self.keep = set(shape.keep)
        self.finished = threading.Event()
        self.drained = threading.Event()
        self.draining = False
        self.rank = shape.rank  # (plan.rank or ranks(plan): once a plan)
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
        # (host tiles read a sparse box as its entries: a device's loads it dense, a copy)
        sparse = not getattr(self.tiles, "loads_copy", False)
        self.budget = Budget(self, limit, self.spill) if limit and may_cross(
            plan, room, sparse) else None
        # Loads run by their consumer, on its worker, as it starts (``_Shape.lazy``): where
        # every task is admitted as it comes (a budget), or a Load copies its box to a
        # device, each stays a task of its own.
        self.lazy = shape.lazy if self.budget is None and sparse else frozenset()
        self.waiting = dict(shape.waiting_lazy if self.lazy else shape.waiting)
        # The tail (tail.py): kernel calls not yet started; a call started when none is left
        # after it may be cut among the idle workers (host tiles, no admission, several
        # workers, BLAS threads to spare for them: ``threads`` a call).
        self.unstarted = shape.kernels
        self.threads = ex.last_blas_threads or 1
        self.cuts = 0  # calls cut in this run (``LocalExecutor.last_tail_cuts``)
        self.may_cut = ex.tail_cut and ex.xp is np and self.budget is None and sparse \
            and ex.workers > 1 and 2 * self.threads <= ex.cores
        # The pre-cut (``_pre_cut``): a call whose second row block is the lightest worker's
        # from the start; (key, RowSplit, the block's queued item) once made (``go``).
        self.may_precut = ex.pre_cut and ex.xp is np and self.budget is None and sparse \
            and ex.workers > 1 and bool(self.lazy)
        self.precut = None
        # The calling thread serves worker 0's queue while the run goes (ready.py ``claim``):
        # no wake-up of worker 0's thread at the start, none of this thread's at the end.
        # Host tiles without admission (a budget's waits are the workers'), and no progress
        # callback (this thread reports it while it waits: not while it runs a long call).
        self.serve = ex.serve_caller and type(self.tiles) is HostTiles and \
            self.budget is None and progress is None and ex.workers > 1

    def admit(self, item) -> bool:
        """May ``item`` (run, kind, task, ...) run now? Called under the queues' lock."""
        if self.budget is None:
            return True
        try:
            return self.budget.admit(item[1], item[2], item[3] if len(item) > 3 else None,
                                     force=self.control.error is not None)
        except BaseException as exc:  # noqa: BLE001 - the worker thread must live on
            self.control.fail(exc)  # the item runs, and is skipped: the run ends with exc
            self._finished()
            return True

    def _finished(self) -> None:
        self.finished.set()
        if self.serve:
            self.queues.nudge()  # the caller may sleep in ``take``

    # -- scheduling ----------------------------------------------------------------------------
    def go(self) -> RunResult:
        t0 = time.perf_counter()
        control = self.control
        self.pending = 0  # items queued and not yet handled: the run ends when it drops to 0
        serve, queues = self.serve, self.queues
        try:
            if serve:  # this thread is worker 0 for the run (``serve``)
                queues.claim(0)
            # The tasks ready at the start, queued at once: the first put wakes a worker,
            # whose Python then competes with this thread's for the interpreter while the
            # rest are put, and the other worker started 0.2 ms after it.
            self._queue_first()
            # Timed waits: a SIGINT that the OS hands to a worker thread does not wake a blocked
            # wait, but Python runs its handler (KeyboardInterrupt) here within a tick.
            if serve:
                finished, take, handle = self.finished, queues.take, self.handle
                while not finished.is_set():
                    item = take(0, _TICK)
                    if item is not None:
                        handle(0, item[1:])  # records an error (Ctrl-C too), ends the run
                        item = None
            else:
                while not self.finished.wait(_TICK):
                    control.report()  # also while one long BLAS call runs: the CLI's bar
            control.report()  # the last figure (workers count tasks; this thread reports)
        except BaseException as exc:  # Ctrl-C: stop the workers before giving up the run
            control.fail(exc)
            self.ex.queues.wake()  # workers waiting for room skip their queues now
            raise
        finally:
            if serve:  # what is left of heap 0 (after a failure) is its thread's to drain
                queues.release()
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
        self.may_cut = self.serve = False  # no other worker runs anything
        self._inline = []
        self._seq = itertools.count()
        try:
            self._queue_first()
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

    def _queue_first(self) -> None:
        """Queue the tasks ready before any ran (no inputs but Loads their consumer runs):
        listed first, as once workers run ``waiting`` changes under our feet; and the
        pre-cut call's second block, last on its worker's queue (``_pre_cut``)."""
        waiting, lazy = self.waiting, self.lazy
        first = [t for t in self.plan.tasks
                 if t.key in waiting and waiting[t.key] == 0 and t.key not in lazy]
        if self._inline is not None:
            for t in first:
                self._queue(t.worker, ("run", t))
            return
        extra = self._pre_cut() if self.may_precut else []
        rank, n = self.rank, len(self.queues)
        items = [(t.worker % n, (1, rank.get(t.key, 0)), (self, "run", t)) for t in first] + extra
        with held_interrupt():  # a Ctrl-C between count and put: go() waited for them forever
            with self.lock:
                self.pending += len(items)
            self.queues.put_many(items)

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
        if item[0] == "part":
            return self._part(w, item[2], item[3])
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
            self._finished()
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
        if self.lazy:
            for k in task.inputs:  # its consumers run on this worker: no other runs it now
                if k in self.lazy and k not in self.results:
                    self._run_task(w, self.plan.task(k))
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
            elif self.precut is not None and task.key == self.precut[0]:
                if self.may_cut:
                    self._last_call()
                _, split, item, light = self.precut
                value = self._finish_split(task, split, [(light, item)])
            elif choice is not None and self.may_cut and self._last_call() and \
                    (value := self._cut(w, task, inputs, choice, dest)) is not None:
                pass
            else:
                out = dest if dest is not None or self.ex.xp is not np or \
                    not isinstance(task, Kernel) else \
                    donor(self.plan, task, inputs, self.refs, self.keep)  # donate.py
                value = self.runner.run(task, inputs, op_of(self.plan, task), choice=choice,
                                        out=out, source=source,
                                        sink=None if stats is None else stats.add)
        finally:
            if temps:
                self.ledger.drop(temps)
            if isinstance(task, Kernel):
                self.control.call_ended()
        # The inputs whose last consumer this was leave the ledger now: their memory must go
        # with them, not when this call returns (after the output is published and other
        # workers admitted against the room they left).
        del inputs
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
            acc = self.acc[agg.key] = self.runner.fold(agg, acc, part, op)
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
        self.ledger.produced(task, held_bytes(task, value), tile_nbytes(value), value)
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
        if task.key in self.lazy:  # its consumer is running it: counted down at the start
            if self.control.task_done() == self.control.total:  # pragma: no cover - never last
                self._finished()
            return
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
            self._finished()

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

