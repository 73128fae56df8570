"""Aggregation trees: an aggregation of more partials than the executor combines in one task
becomes a tree of aggregations, each of at most ``fan_in`` partials, on the aggregation's worker.

The executor states its fan-in (``executor.max_fan_in``): None for the local pool, whose
aggregations fold partials as they arrive (its plans keep one Aggregate per output tile); Dask's
tasks combine all their inputs at once, so it asks for trees of 8. The tree is part of the plan:
its inner nodes are tasks like any other (TENSORDB_DEBUG=3 lists them), and each operation's
``OpStats`` says the largest fan-in left and how many levels its deepest tree has (EXPLAIN's
``fan-in`` column). Runs after placement: every node goes on its root's worker.

>>> from tensordb.physical.plan import Aggregate, Kernel, OpStats, TilePlan
>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("Y", "", [("X", "i")], {"i": 5})
>>> calls = [Kernel(k, 0, (None,), ((1,),), (), (k,)) for k in range(5)]
>>> plan = TilePlan((op,), calls + [Aggregate(5, "sum", (0, 1, 2, 3, 4), (), "float64")], {},
...                 [OpStats(op, {"i": 5}, 5, 1, 5, agg_levels=1)], 1)
>>> tree = aggregation_trees(plan, 2)
>>> [(t.key, t.parts) for t in tree.tasks if isinstance(t, Aggregate)]
[(6, (0, 1)), (7, (2, 3)), (8, (6, 7)), (5, (8, 4))]
>>> tree.stats[0].max_fan_in, tree.stats[0].agg_levels
(2, 3)
"""
from __future__ import annotations

from dataclasses import replace

from .plan import Aggregate, TilePlan

__all__ = ["aggregation_trees"]


def aggregation_trees(plan: TilePlan, fan_in: int | None) -> TilePlan:
    """``plan`` with every aggregation of more than ``fan_in`` partials split into a tree of
    aggregations of at most ``fan_in`` each, level by level (inner nodes do not fill skipped
    zeros: the root does); ``plan`` itself when ``fan_in`` is None or no aggregation is that wide."""
    if fan_in is None:
        return plan
    if fan_in < 2:
        raise ValueError(f"an aggregation tree needs a fan-in of at least 2, not {fan_in}")
    if not any(isinstance(t, Aggregate) and len(t.parts) > fan_in for t in plan.tasks):
        return plan
    next_key = max(t.key for t in plan.tasks) + 1
    tasks, owner = [], dict(plan.owner)
    widest = [0] * len(plan.ops)  # per operation: the most partials a task combines now
    levels = [0] * len(plan.ops)  # per operation: the depth of its deepest tree
    for t in plan.tasks:
        if not isinstance(t, Aggregate):
            tasks.append(t)
            continue
        op = plan.owner.get(t.key, 0)
        parts, depth = t.parts, 1
        while len(parts) > fan_in:
            level = []
            for i in range(0, len(parts), fan_in):
                if i + 1 == len(parts):  # a lone partial left over goes up a level as it is
                    level.append(parts[i])
                    continue
                node = replace(t, key=next_key, parts=tuple(parts[i:i + fan_in]), fill_zero=False)
                next_key += 1
                tasks.append(node)
                owner[node.key] = op
                level.append(node.key)
            parts, depth = tuple(level), depth + 1
        tasks.append(replace(t, parts=parts) if parts != t.parts else t)
        widest[op] = max(widest[op], min(len(t.parts), fan_in))
        levels[op] = max(levels[op], depth)
    stats = [replace(s, max_fan_in=widest[i], agg_levels=levels[i]) if levels[i] else s
             for i, s in enumerate(plan.stats)]
    return replace(plan, tasks=tasks, owner=owner, stats=stats)  # its kernel choices kept
