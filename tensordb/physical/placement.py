"""Placement: which worker runs each tile task. The executor follows it exactly.

Operations are placed one after another, in plan order. Within one operation:

- Kernel calls, largest first, grouped by the output tile they contribute to, each go to the
  worker that already holds the most bytes of their inputs (owner computes) plus, when partials of
  the same output tile are already there, the bytes of one partial (a local aggregation moves
  nothing). A worker whose share of the operation's flops would pass ``(1 + SLACK) / p`` of the
  total is skipped, so flops stay balanced; ties go to the least loaded worker overall.
- An aggregation runs where most of its partial bytes already are.
- An Assemble (re-tiling of an intermediate) is built on the worker of its first consumer, which
  fetches the pieces it does not hold.
- Reading stored tiles is free anywhere (memory-mapped views): each worker that consumes a Load
  gets its own copy of that Load task (fresh keys, inserted right after the original).

>>> from tensordb.physical.plan import Kernel, Load, TilePlan
>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("Y", "i", [("X", "i")], {"i": 8})
>>> tasks = [Load(0, "X", (0,), (4,)), Load(1, "X", (4,), (8,)),
...          Kernel(2, 0, (0,), ((4,),), (4,), (0,), 4), Kernel(3, 0, (1,), ((4,),), (4,), (1,), 4)]
>>> placed = place(TilePlan((op,), tasks, {}, [], 2, {t.key: 0 for t in tasks}))
>>> [(t.key, t.worker) for t in placed.tasks]
[(0, 0), (1, 1), (2, 0), (3, 1)]
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np

from .plan import Aggregate, Assemble, Kernel, Load, TilePlan

__all__ = ["place", "transfers", "worker_flops", "SLACK"]

SLACK = 0.05  # how far above an even share of an operation's flops a worker may go


def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


class _Sizes:
    """Bytes of the tile each task produces."""

    def __init__(self, plan: TilePlan) -> None:
        self.plan = plan
        self.cache: dict[int, int] = {}

    def __call__(self, key: int) -> int:
        n = self.cache.get(key)
        if n is None:
            n = self.cache[key] = self._compute(self.plan.task(key))
        return n

    def _compute(self, t) -> int:
        if isinstance(t, Kernel):
            return math.prod(t.out_shape) * _itemsize(self.plan.ops[t.op].dtype)
        if isinstance(t, (Aggregate, Assemble)):
            return math.prod(t.shape) * _itemsize(t.dtype)
        reader = getattr(self.plan, "readers", {}).get(t.tensor)
        item = _itemsize(reader.meta.dtype) if reader is not None else 8
        return math.prod(b - a for a, b in zip(t.starts, t.stops)) * item


def place(plan: TilePlan) -> TilePlan:
    """Return a copy of ``plan`` with a worker on every task (see the module docstring)."""
    placer = _Placer(plan)
    order, kernels_of, aggs_of, agg_of_part = _by_operation(plan)
    for op in order:
        placer.place_kernels(kernels_of[op], agg_of_part)
        for a in aggs_of.get(op, ()):
            _place_by_bytes(a, placer.where, placer.size, placer.load, placer.p)
    for t in plan.tasks:  # anything left: Assembles with no kernel consumer, stray aggregations
        if not isinstance(t, Load) and t.key not in placer.where:
            _place_by_bytes(t, placer.where, placer.size, placer.load, placer.p)
    return _with_loads(plan, placer.where)


def _by_operation(plan: TilePlan):
    """The operations in plan order, each one's kernels and aggregations, and the aggregation
    each partial belongs to."""
    kernels_of: dict[int, list[Kernel]] = defaultdict(list)
    aggs_of: dict[int, list[Aggregate]] = defaultdict(list)
    agg_of_part: dict[int, int] = {}
    order: list[int] = []
    for t in plan.tasks:
        if isinstance(t, Kernel):
            if t.op not in kernels_of:
                order.append(t.op)
            kernels_of[t.op].append(t)
        elif isinstance(t, Aggregate):
            for k in t.parts:
                agg_of_part[k] = t.key
            aggs_of[plan.owner[t.key]].append(t)
    return order, kernels_of, aggs_of, agg_of_part


class _Placer:
    """The workers picked so far and the flops placed on each."""

    def __init__(self, plan: TilePlan) -> None:
        self.plan = plan
        self.p = max(1, int(plan.workers))
        self.size = _Sizes(plan)
        self.where: dict[int, int] = {}
        self.load = [0.0] * self.p                 # flops placed on each worker so far

    def held(self, key: int, gains: dict[int, int]) -> None:
        """Add to ``gains[w]`` the bytes of task ``key``'s result that worker w already holds."""
        if key in self.where:
            gains[self.where[key]] += self.size(key)
            return
        t = self.plan.task(key)
        if isinstance(t, Assemble):  # built where its consumer runs: its local pieces count
            for k in t.inputs:
                self.held(k, gains)
        # a Load is free anywhere: no worker gains by holding it

    def place_kernels(self, ks: list[Kernel], agg_of_part: dict[int, int]) -> None:
        """One operation's kernel calls, largest output group first, each where its inputs
        (and its group's partials) are, within the operation's flops cap."""
        p, where = self.p, self.where
        flops = [max(1, k.flops) for k in ks]
        cap = max(sum(flops) / p, max(flops)) * (1 + SLACK)
        group = {k.key: agg_of_part.get(k.key, k.key) for k in ks}
        gflops: dict[int, int] = defaultdict(int)
        for k, f in zip(ks, flops):
            gflops[group[k.key]] += f
        ks = sorted(ks, key=lambda k: (-gflops[group[k.key]], group[k.key], -k.flops, k.key))
        op_load = [0.0] * p
        holders: dict[int, set[int]] = defaultdict(set)
        for k in ks:
            f = max(1, k.flops)
            g = group[k.key]
            gains: dict[int, int] = defaultdict(int)
            for a in k.inputs:
                self.held(a, gains)
            for w in holders[g]:
                gains[w] += self.size(k.key)
            # The worker holding most of its inputs, then the least loaded, among those within
            # the cap (all when none is). Workers that hold nothing tie on gains: only the
            # holders need the full key.
            fits = min(op_load) + f <= cap
            held = [w for w, b in gains.items() if b > 0 and (not fits or op_load[w] + f <= cap)]
            if held:
                w = min(held, key=lambda w: (-gains[w], op_load[w], self.load[w], w))
            else:
                w = min((op_load[w], self.load[w], w) for w in range(p)
                        if not fits or op_load[w] + f <= cap)[2]
            where[k.key] = w
            holders[g].add(w)
            op_load[w] += f
            self.load[w] += f
            for a in k.inputs:
                if a not in where and isinstance(self.plan.task(a), Assemble):
                    where[a] = w


def _place_by_bytes(t, where, size, load, p) -> None:
    weight = [0] * p
    for k in t.inputs:
        if k in where:
            weight[where[k]] += size(k)
    where[t.key] = min(range(p), key=lambda w: (-weight[w], load[w], w))


def _with_loads(plan: TilePlan, where: dict[int, int]) -> TilePlan:
    """Give every consuming worker its own Load, rewire the consumers, set every worker."""
    users: dict[int, set[int]] = defaultdict(set)
    loads = {t.key for t in plan.tasks if isinstance(t, Load)}
    for t in plan.tasks:
        if t.key in where:
            for k in t.inputs:
                if k in loads:
                    users[k].add(where[t.key])
    next_key = max((t.key for t in plan.tasks), default=-1) + 1
    copy: dict[tuple[int, int], int] = {}
    owner = dict(plan.owner)
    tasks: list = []
    for t in plan.tasks:
        if isinstance(t, Load):
            ws = sorted(users.get(t.key, ())) or [0]
            for n, w in enumerate(ws):
                key = t.key if n == 0 else next_key
                if n:
                    next_key += 1
                    if t.key in owner:
                        owner[key] = owner[t.key]
                if key != t.key:
                    copy[(t.key, w)] = key
                tasks.append(t if key == t.key and w == t.worker else _with(t, key=key, worker=w))
            continue
        w = where[t.key]

        def fix(k):
            return None if k is None else copy.get((k, w), k)

        if isinstance(t, Kernel):
            args = tuple(fix(a) for a in t.args) if copy else t.args
            if args != t.args:
                t = _with(t, args=args, worker=w)
            elif w != t.worker:
                t = _with(t, worker=w)
        elif isinstance(t, Assemble):
            t = dataclasses.replace(t, pieces=tuple((fix(s), a, b) for s, a, b in t.pieces),
                                    worker=w)
        elif isinstance(t, Aggregate):
            t = dataclasses.replace(t, parts=tuple(fix(k) for k in t.parts), worker=w)
        tasks.append(t)
    return dataclasses.replace(plan, tasks=tasks, owner=owner)


def _with(task, **changes):
    """``dataclasses.replace`` for a task already checked (a plan has a task per kernel call:
    replace, which runs the constructor again, was most of placement's time)."""
    new = object.__new__(type(task))
    new.__dict__.update(task.__dict__)
    new.__dict__.update(changes)
    return new


def transfers(plan: TilePlan) -> tuple[int, list[int]]:
    """Bytes the placed plan moves between workers, in total and per operation: every input a
    task reads from a tile produced on another worker (the executor's count)."""
    size = _Sizes(plan)
    on = {t.key: t.worker for t in plan.tasks}
    owner = plan.owner
    per_op = [0] * len(plan.ops)
    for t in plan.tasks:
        for k in t.inputs:
            if on[k] != t.worker:
                n = size(k)
                op = owner.get(t.key, t.op if isinstance(t, Kernel) else 0)
                if 0 <= op < len(per_op):
                    per_op[op] += n
    return sum(per_op), per_op


def worker_flops(plan: TilePlan) -> list[int]:
    """Kernel flops placed on each worker."""
    out = [0] * max(1, plan.workers)
    for t in plan.tasks:
        if isinstance(t, Kernel):
            out[t.worker % len(out)] += t.flops
    return out
