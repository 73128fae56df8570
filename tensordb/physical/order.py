"""The task order: in which order the executor prefers to run ready tasks, so that few tiles are
alive at once. Placement says where a task runs; the order says when, among the ready ones.

A depth-first walk from the plan's sinks (its output tiles, in plan order) numbers each task after
its inputs (a post-order, as dask.order does): one output tile's work (its input tiles, its kernel
calls, then its aggregation) is finished before the next output tile's starts. A task whose other
inputs exist (or are Loads: views of stored tiles) comes right after the tile it consumes is made,
so that tile can be freed: in ``LET H = f(X W1); Y = H W2`` each H tile is consumed by the kernel
calls that read it as soon as it is made. The rank is data in the plan (``TilePlan.rank``: task
key -> position); the local pool runs a worker's ready tasks lowest rank first, aggregation folds
before anything (they free a partial).

>>> from tensordb.physical.plan import Aggregate, Kernel, Load, TilePlan
>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("Y", "", [("X", "i")], {"i": 8})
>>> tasks = [Load(0, "X", (0,), (4,)), Load(1, "X", (4,), (8,)),
...          Kernel(2, 0, (0,), ((4,),), (), (0,)), Kernel(3, 0, (1,), ((4,),), (), (1,)),
...          Aggregate(4, "sum", (2, 3), (), "float64")]
>>> ranked = order(TilePlan((op,), tasks, {}, [], 1, {t.key: 0 for t in tasks}))
>>> sorted(ranked.rank, key=ranked.rank.get)
[0, 2, 1, 3, 4]
"""
from __future__ import annotations

import copy
import dataclasses

from .plan import Load, Once, TilePlan

__all__ = ["order", "ranks"]


def ranks(plan: TilePlan) -> dict[int, int]:
    """Task key -> its position in the memory-aware order (see the module docstring)."""
    consumers = plan.consumers()
    loads = {t.key for t in plan.tasks if isinstance(t, Load)}
    sinks = [t.key for t in plan.tasks if not consumers[t.key]]
    rank: dict[int, int] = {}

    def emit(key: int) -> None:
        """Rank ``key``, then every consumer of a tile just made whose other inputs exist (or
        are Loads, ranked right before it): they run as soon as they can, and free it."""
        rank[key] = len(rank)
        made = [key] if key not in loads else []
        while made:
            for c in consumers[made.pop()]:
                if c in rank:
                    continue
                inputs = plan.task(c).inputs
                if all(k in rank or k in loads for k in inputs):
                    for k in inputs:
                        if k not in rank:
                            rank[k] = len(rank)
                    rank[c] = len(rank)
                    made.append(c)

    for sink in sinks:
        if sink in rank:
            continue
        # An iterative post-order: (key, index of the next input to visit).
        stack = [(sink, 0)]
        while stack:
            key, i = stack[-1]
            inputs = plan.task(key).inputs
            while i < len(inputs) and inputs[i] in rank:
                i += 1
            if i < len(inputs):
                stack[-1] = (key, i + 1)
                stack.append((inputs[i], 0))  # a plan is acyclic: no key is on the stack twice
                continue
            stack.pop()
            if key not in rank:
                emit(key)
    return rank


def order(plan: TilePlan) -> TilePlan:
    """``plan`` with its ``rank`` (called after placement, which adds tasks). A plan whose tasks
    are not made yet (``TilePlan.deferred``) ranks them when they are: EXPLAIN reads no rank."""
    if "_build" in plan.__dict__ and "tasks" not in plan.__dict__:
        unbound = copy.copy(plan)  # ranking reads no stored tensor: keep no reader
        unbound.readers = {}

        def build() -> dict:
            return {"tasks": unbound.tasks, "owner": unbound.owner, "rank": ranks(unbound)}

        return TilePlan.deferred(plan.ops, plan.outputs, plan.stats, plan.workers, plan.readers,
                                 plan.kernels, plan.memo, Once(build),
                                 facts=plan.__dict__.get("facts"), blas_threads=plan.blas_threads)
    return dataclasses.replace(plan, rank=ranks(plan))
