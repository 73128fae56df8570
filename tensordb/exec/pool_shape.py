"""What every pool run of a plan starts from (``PlanShape``), worked out once a plan and kept
in its memo, which a cached plan's rebound copies share: each task's consumers, the counts a
run copies and counts down, the Loads a consumer runs itself, and the call the run cuts before
it starts (``precut_for``; pool_run.py ``_Run._pre_cut``)."""
from __future__ import annotations

from ..physical.plan import Aggregate, Kernel, Load, TilePlan
from ..physical.order import ranks

__all__ = ["PlanShape"]


class PlanShape:
    """What every run of a plan starts from, worked out once a plan (kept in its ``memo``,
    which a cached plan's rebound copies share): each task's consumers and the aggregation
    each partial goes to (read only), and the counts a run copies and counts down.

    ``lazy``: the Loads with no inputs whose consumers (kernels, re-tilings: no aggregation,
    no stored output) all run on the Load's own worker. Such a Load is not a queued task: the
    first of its consumers to start runs it, on that worker, just before its kernel (a
    block-sparse product's 18 Loads were 18 items through the workers' queues, each one's
    hand-off costing more than the view it makes). ``waiting_lazy`` counts a task's inputs
    without them."""

    __slots__ = ("tasks", "outputs", "consumers", "refs", "waiting", "waiting_lazy",
                 "acc_left", "agg_of", "keep", "lazy", "kernels", "rank", "_precut")

    @classmethod
    def of(cls, plan: TilePlan) -> "PlanShape":
        kept = plan.memo.get("pool_shape")
        if kept is None or kept.tasks is not plan.tasks or kept.outputs is not plan.outputs:
            kept = plan.memo["pool_shape"] = cls(plan)
        return kept

    def __init__(self, plan: TilePlan) -> None:
        self.tasks, self.outputs = plan.tasks, plan.outputs
        consumers = self.consumers = plan.consumers()
        self.refs = {k: len(v) for k, v in consumers.items()}
        self.waiting = {t.key: len(t.inputs) for t in plan.tasks if not isinstance(t, Aggregate)}
        self.kernels = sum(isinstance(t, Kernel) for t in plan.tasks)
        self.acc_left = {t.key: len(t.parts) for t in plan.tasks if isinstance(t, Aggregate)}
        self.agg_of = {p: t.key for t in plan.tasks if isinstance(t, Aggregate) for p in t.parts}
        self.keep = frozenset(k for out in plan.outputs.values() if out.stored
                              for k in out.tiles.values())
        worker = {t.key: t.worker for t in plan.tasks}
        self.lazy = frozenset(
            t.key for t in plan.tasks
            if isinstance(t, Load) and not t.inputs and consumers[t.key]
            and t.key not in self.keep and t.key not in self.agg_of
            and all(c in self.waiting and worker[c] == t.worker for c in consumers[t.key]))
        waiting = dict(self.waiting)
        for k in self.lazy:
            for c in consumers[k]:
                waiting[c] -= 1
        self.waiting_lazy = waiting
        self.rank = plan.rank or ranks(plan)
        self._precut: dict[int, tuple | None] = {}  # workers -> ``precut_for``'s answer

    def precut_for(self, workers: int) -> tuple | None:
        """(the call to cut, its worker, the worker given its second half) where the plan's
        kernel calls, on ``workers`` workers, leave the heaviest worker's flops ahead of the
        lightest's by at least three quarters of its last call (in the plan's order: the
        one it runs last), and that call reads only Loads its own worker runs (``lazy``);
        else None. Cut in two, the call's half moves to the lightest worker: the makespan
        drops by up to half the call (``_Run._pre_cut``)."""
        if workers in self._precut:
            return self._precut[workers]
        found, flops, last = None, [0] * workers, [None] * workers
        rank = self.rank
        for t in self.tasks:
            if isinstance(t, Kernel):
                w = t.worker % workers
                flops[w] += t.flops
                if last[w] is None or rank.get(t.key, 0) >= rank.get(last[w].key, 0):
                    last[w] = t
        heavy = max(range(workers), key=flops.__getitem__)
        light = min(range(workers), key=flops.__getitem__)
        call = last[heavy]
        if call is not None and heavy != light and call.flops > 0 and \
                4 * (flops[heavy] - flops[light]) >= 3 * call.flops and call.inputs and \
                all(k in self.lazy for k in call.inputs):
            found = (call.key, heavy, light)
        self._precut[workers] = found
        return found
