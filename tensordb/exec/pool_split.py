"""The calls of a pool run cut by rows (tail.py ``row_split``): the pre-cut, decided from the
plan before the run starts (``_pre_cut``), and the tail cut, made when the run's last call
starts beside idle workers (``_cut``); the blocks a worker runs for another (``_part``). A
part of ``pool_run._Run`` (``Splits`` is its base: the run's state is its)."""
from __future__ import annotations

import time

import numpy as np

from ..physical.plan import Kernel
from .kernels import KernelSpec
from .runtime import op_of, plan_specs, translate
from .tail import row_split
from .tasks import tile_view

__all__ = ["Splits"]


class Splits:
    """The run's cut calls (methods of ``pool_run._Run``)."""

    def _pre_cut(self) -> list:
        """The pre-cut: the calls of a run that do not divide evenly among the workers (nine
        equal tile products on two: five and four) leave the lighter worker idle for the
        heavier one's last call. Where the plan has such a call (``_Shape.precut``: the
        heaviest worker's last call, and the lightest worker, at least three quarters of the
        call's flops lighter), the call is cut by rows in two (tail.py ``row_split``: the
        uncut call's bits) before the run starts: the second block is queued on the lighter
        worker after all its own tasks, the first is the heavier worker's when it reaches the
        call, and a block the lighter worker has not started by then is taken back (never a
        wait for a worker that has not started). The call's operands are views of stored
        tiles (Loads only its own worker would run: ``lazy``), read here. The items to queue."""
        found = self.shape.precut_for(len(self.queues))
        if found is None:
            return []
        key, heavy, light = found
        plan = self.plan
        task = plan.task(key)
        views = []
        for k in task.inputs:
            load = plan.task(k)
            view = tile_view(load, plan.readers[load.tensor])
            if view is None:
                return []  # a copy to make: not on the caller's thread before the run
            views.append((load, view))
        for load, view in views:
            if load.key not in self.results:
                self._publish(heavy, load, view)  # its worker's Load, made here
        spec = plan_specs(plan, np).get(task.op)
        if spec is None:
            spec = plan_specs(plan, np)[task.op] = KernelSpec(op_of(plan, task), np,
                                                              plan.kernels[task.op])
        it = iter([self.results[k] for k in task.inputs])
        args = [None if a is None else next(it) for a in task.args]
        split = row_split(spec, args, task.arg_shapes, task.out_shape, self.dest.get(key), 2)
        if split is None:
            return []  # not a call that cuts without changing its bits: run whole
        item = (self, "part", task, split, 1)
        split.given(1)
        self.precut = (key, split, item, light)
        return [(light, (2, 0), item)]

    def _last_call(self) -> bool:
        """A kernel call starts: whether no other is left to start after it."""
        with self.lock:
            self.unstarted -= 1
            return self.unstarted == 0

    def _cut(self, w: int, task: Kernel, inputs: list, choice, dest):
        """The run's last call cut by rows among the workers with nothing queued: their blocks
        queued first on theirs, this worker's block run here, then any block a worker has not
        taken run here too (``ReadyQueues.take_back``). The result, or None (not cut)."""
        helpers = self.queues.idle(w)[:max(0, self.ex.cores // self.threads - 1)]
        if not helpers:
            return None
        op = op_of(self.plan, task)
        specs = plan_specs(self.plan, np)
        spec = specs.get(task.op)
        if spec is None:
            spec = specs[task.op] = KernelSpec(op, np, choice)
        it = iter(inputs)
        args = [None if a is None else next(it) for a in task.args]
        split = row_split(spec, args, task.arg_shapes, task.out_shape, dest, 1 + len(helpers))
        if split is None:
            return None
        given = [(v, (self, "part", task, split, i))
                 for i, v in enumerate(helpers[:len(split) - 1], 1)]
        with self.lock:
            self.pending += len(given)
        split.given(len(given))
        self.queues.put_many([(v, (-1, 0), item) for v, item in given])
        self.cuts += 1
        return self._finish_split(task, split, given)

    def _finish_split(self, task: Kernel, split, given: list):
        """This worker's block of a cut call (0), then each block given to another worker
        that it has not taken yet (``given``: (worker, queued item)), then a wait for those
        being run there. The result (the whole call's)."""
        op = op_of(self.plan, task)
        try:
            try:
                self.control.check()
                split.run(0)
            finally:
                for v, item in given:  # not taken yet: run here (or, after a failure, dropped)
                    if self.queues.take_back(v, item):
                        with self.lock:
                            self.pending -= 1
                        try:
                            if self.control.error is None:
                                split.run(item[4])
                        finally:
                            split.ended()
                split.done.wait()
            if split.error is not None:
                raise split.error
        except Exception as exc:  # named for its operation, as the uncut call's (runner.run)
            err = translate(exc, op)
            if err is exc:
                raise
            raise err from exc
        return split.result

    def _part(self, w: int, split, i: int) -> None:
        """Block ``i`` of a cut call, on worker ``w`` (its seconds count in ``w``'s busy time;
        the call is counted once, by the worker that cut it)."""
        t0, error = time.perf_counter(), None
        try:
            if self.control.error is None:
                split.run(i)
        except BaseException as exc:  # noqa: BLE001 - the cutting worker raises it
            error = exc
        finally:
            split.ended(error)
            with self.ledger.lock:
                self.ledger.busy[w] += time.perf_counter() - t0
            with self.lock:
                self.pending -= 1
                last = self.draining and self.pending == 0
            if last:
                self.drained.set()
