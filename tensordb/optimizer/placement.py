"""Placement: which worker runs each tile task.

Kernel calls are spread so that flops are balanced (largest first, onto the least-loaded worker,
preferring the worker that already holds partials of the same output tile); an aggregation runs
where most of its partial bytes already are; reading a stored tile is free on any worker (it is a
memory-mapped view), so each worker that needs a stored tile gets its own Load.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from ..physical.plan import Aggregate, Kernel, Load, TilePlan

__all__ = ["place"]


def place(plan: TilePlan) -> TilePlan:
    p = max(1, plan.workers)
    load = np.zeros(p)
    where: dict[int, int] = {}
    consumers = plan.consumers()
    # Kernels: group the partials of one output tile, then balance flops.
    kernels = [t for t in plan.tasks if isinstance(t, Kernel)]
    group_of: dict[int, int] = {}
    for t in plan.tasks:
        if isinstance(t, Aggregate):
            for k in t.parts:
                group_of[k] = t.key
    by_op: dict[int, list[Kernel]] = defaultdict(list)
    for k in kernels:
        by_op[k.op].append(k)
    for op_kernels in by_op.values():
        held: dict[int, set[int]] = defaultdict(set)
        for k in sorted(op_kernels, key=lambda k: -k.flops):
            g = group_of.get(k.key, k.key)
            best = min(range(p), key=lambda w: (load[w], w not in held[g], w))
            where[k.key] = best
            held[g].add(best)
            load[best] += max(k.flops, 1)
    tasks = []
    for t in plan.tasks:
        if isinstance(t, Kernel):
            tasks.append(dataclasses.replace(t, worker=where[t.key]))
        elif isinstance(t, Aggregate):
            weight: dict[int, int] = defaultdict(int)
            for k in t.parts:
                weight[where.get(k, 0)] += 1
            w = max(weight, key=lambda w: (weight[w], -load[w]))
            where[t.key] = w
            tasks.append(dataclasses.replace(t, worker=w))
        else:
            tasks.append(t)
    # Inputs (Load/Assemble) go where they are consumed; a Load read by several workers is
    # duplicated (free), an Assemble is built once on its first consumer's worker.
    final: list = []
    next_key = max((t.key for t in plan.tasks), default=-1) + 1
    rename: dict[tuple[int, int], int] = {}
    for t in tasks:
        if isinstance(t, Kernel) or isinstance(t, Aggregate):
            final.append(t)
            continue
        users = sorted({where.get(c, _first_worker(c, consumers, where)) for c in consumers[t.key]}) or [0]
        if isinstance(t, Load):
            for n, w in enumerate(users):
                key = t.key if n == 0 else next_key
                next_key += n > 0
                rename[(t.key, w)] = key
                final.append(dataclasses.replace(t, key=key, worker=w))
        else:
            where[t.key] = users[0]
            final.append(dataclasses.replace(t, worker=users[0]))
    out = []
    for t in final:
        if isinstance(t, Kernel):
            t = dataclasses.replace(t, args=tuple(None if a is None else rename.get((a, t.worker), a)
                                                  for a in t.args))
        out.append(t)
    # Keep a topological order: loads first, then everything else in its planned order.
    out.sort(key=lambda t: (not isinstance(t, Load),))
    owner = dict(plan.owner)
    for (old, _w), new in rename.items():
        owner[new] = plan.owner.get(old, 0)
    return TilePlan(plan.ops, out, plan.outputs, plan.stats, plan.workers, owner, plan.readers)


def _first_worker(key: int, consumers, where) -> int:
    for c in consumers.get(key, ()):
        if c in where:
            return where[c]
    return 0
