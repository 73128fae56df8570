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

import copy
import dataclasses
import math
from collections import defaultdict

import numpy as np

from .plan import (BYTES_CAP, Aggregate, Assemble, CallBlock, Columns, Kernel, Load, Once,
                   TilePlan)

__all__ = ["place", "transfers", "worker_flops", "SLACK"]

SLACK = 0.05  # how far above an even share of an operation's flops a worker may go


def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


def _task_bytes(plan: TilePlan, t) -> int:
    """Bytes of the tile task ``t`` produces, at most ``BYTES_CAP`` (2^56): a box of a sparse
    tensor, or a sparse kernel's output tile, whose extents pass int64 (its entries are what
    moves); a call's inputs summed in int64 stay below 2^63."""
    if isinstance(t, Kernel):
        n = math.prod(t.out_shape) * _itemsize(plan.ops[t.op].dtype)
    elif isinstance(t, (Aggregate, Assemble)):
        n = math.prod(t.shape) * _itemsize(t.dtype)
    else:
        reader = getattr(plan, "readers", {}).get(t.tensor)
        item = _itemsize(reader.meta.dtype) if reader is not None else 8
        n = math.prod(b - a for a, b in zip(t.starts, t.stops)) * item
    return min(n, BYTES_CAP)


def place(plan: TilePlan) -> TilePlan:
    """Return a copy of ``plan`` with a worker on every task (see the module docstring).

    The workers are chosen on the lowering's arrays (``plan.columns``; a plan built task by
    task is read into them); the placed tasks, each consuming worker's copy of a Load among
    them, are made when the plan's tasks are first read. For a lowered plan, what EXPLAIN
    shows of the placement (bytes moved, flops per worker, how many tasks) is counted here."""
    cols = plan.__dict__.get("columns")
    lowered = cols is not None
    if cols is None:
        cols = _columns_of(plan)
    placer = _Placer(plan, cols)
    aggs_of: dict[int, list[Aggregate]] = defaultdict(list)
    agg_of_part: dict[int, int] = {}
    for t in cols.others:
        if isinstance(t, Aggregate):
            for k in t.parts:
                agg_of_part[k] = t.key
            aggs_of[cols.owner[t.key]].append(t)
    for block in cols.blocks:
        if not len(block):
            continue
        placer.place_kernels(block, agg_of_part, bool(aggs_of.get(block.op)))
        for a in aggs_of.get(block.op, ()):
            placer.place_by_bytes(a)
    for t in cols.others:  # anything left: Assembles with no kernel consumer, stray aggregations
        if not isinstance(t, Load) and placer.where[t.key] < 0:
            placer.place_by_bytes(t)
    where = placer.where
    n_ops = len(plan.ops)
    facts = Once(lambda: _facts(n_ops, cols, placer)) if lowered else None
    unbound = copy.copy(plan)  # what is made later reads no stored tensor: keep no reader
    unbound.readers = {}

    def build() -> dict:
        tasks, owner = _with_loads(unbound, {k: w for k, w in enumerate(where) if w >= 0})
        return {"tasks": tasks, "owner": owner}

    return TilePlan.deferred(plan.ops, plan.outputs, plan.stats, plan.workers, plan.readers,
                             plan.kernels, plan.memo, Once(build), facts=facts,
                             blas_threads=plan.blas_threads)


def _columns_of(plan: TilePlan) -> Columns:
    """The columns of a plan built task by task (tests): its kernels in blocks, one per
    operation in the order of their first kernel."""
    kernels: dict[int, list[Kernel]] = defaultdict(list)
    others = []
    for t in plan.tasks:
        if isinstance(t, Kernel):
            kernels[t.op].append(t)
        else:
            others.append(t)
    blocks = [CallBlock.of(op, ks, _itemsize(plan.ops[op].dtype)) for op, ks in kernels.items()]
    n_keys = max((t.key for t in plan.tasks), default=-1) + 1
    return Columns(blocks, others, {t.key: plan.owner.get(t.key, 0) for t in others}, n_keys)


class _Placer:
    """The workers picked so far and the flops placed on each."""

    def __init__(self, plan: TilePlan, cols: Columns) -> None:
        self.p = max(1, int(plan.workers))
        self.where = [-1] * cols.n_keys           # task key -> worker (-1: not placed, a Load)
        self.where_arr = np.full(cols.n_keys, -1, dtype=np.int64)
        self.size = np.zeros(cols.n_keys, dtype=np.int64)  # bytes of each task's tile
        for b in cols.blocks:
            self.size[b.keys] = np.minimum(b.out_bytes, BYTES_CAP)
        self.assembled: dict[int, tuple[int, ...]] = {}  # Assemble key -> its inputs
        self.loads: list[int] = []
        for t in cols.others:
            self.size[t.key] = _task_bytes(plan, t)
            if isinstance(t, Assemble):
                self.assembled[t.key] = t.inputs
            elif isinstance(t, Load):
                self.loads.append(t.key)
        self.is_assembled = np.zeros(cols.n_keys, dtype=bool)
        self.is_assembled[list(self.assembled)] = True
        self.load = [0.0] * self.p                 # flops placed on each worker so far

    def _put(self, key: int, w: int) -> None:
        self.where[key] = w
        self.where_arr[key] = w

    def held(self, key: int, gains: dict[int, int]) -> None:
        """Add to ``gains[w]`` the bytes of task ``key``'s result that worker w already holds."""
        w = self.where[key]
        if w >= 0:
            gains[w] += int(self.size[key])
            return
        for k in self.assembled.get(key, ()):  # built where its consumer runs: its local pieces count
            self.held(k, gains)
        # a Load is free anywhere: no worker gains by holding it

    def place_kernels(self, b: CallBlock, agg_of_part: dict[int, int], aggregated: bool) -> None:
        """One operation's kernel calls, largest output group first, each where its inputs
        (and its group's partials) are, within the operation's flops cap."""
        flops = np.maximum(b.flops, 1)
        cap = max(int(flops.sum()) / self.p, int(flops.max())) * (1 + SLACK)
        if not aggregated and len(b) > 8 and self._place_where_held(b, flops, cap):
            return
        p, where = self.p, self.where
        keys, raw, args = b.keys.tolist(), b.flops.tolist(), b.args.tolist()
        out_bytes, fl = b.out_bytes.tolist(), flops.tolist()
        group = [agg_of_part.get(k, k) for k in keys]
        gflops: dict[int, int] = defaultdict(int)
        for g, f in zip(group, fl):
            gflops[g] += f
        order = sorted(range(len(keys)), key=lambda i: (-gflops[group[i]], group[i], -raw[i], keys[i]))
        op_load = [0.0] * p
        holders: dict[int, set[int]] = defaultdict(set)
        for i in order:
            f, g = fl[i], group[i]
            gains: dict[int, int] = defaultdict(int)
            for a in args[i]:
                if a >= 0:
                    self.held(a, gains)
            for w in holders[g]:
                gains[w] += out_bytes[i]
            # The worker holding most of its inputs, then the least loaded, among those within
            # the cap (all when none is). Workers that hold nothing tie on gains: only the
            # holders need the full key.
            fits = min(op_load) + f <= cap
            held = [w for w, n in gains.items() if n > 0 and (not fits or op_load[w] + f <= cap)]
            if held:
                w = min(held, key=lambda w: (-gains[w], op_load[w], self.load[w], w))
            else:
                w = min((op_load[w], self.load[w], w) for w in range(p)
                        if not fits or op_load[w] + f <= cap)[2]
            self._put(keys[i], w)
            holders[g].add(w)
            op_load[w] += f
            self.load[w] += f
            for a in args[i]:
                if a >= 0 and where[a] < 0 and a in self.assembled:
                    self._put(a, w)

    def _place_where_held(self, b: CallBlock, flops: np.ndarray, cap: float) -> bool:
        """The common case at once: every call has one worker holding more of its inputs than
        any other, and giving each call that worker keeps every worker within the cap. Then
        the call-by-call choice above picks exactly that worker for each (the cap test passes
        at every step, as a worker's load only grows to its final value), so it is done with
        arrays. False (nothing placed) otherwise, and placing goes call by call."""
        args = b.args
        if not args.shape[1] or self.is_assembled[np.maximum(args, 0)][args >= 0].any():
            return False
        w = np.where(args >= 0, self.where_arr[np.maximum(args, 0)], -1)
        size = np.where(w >= 0, self.size[np.maximum(args, 0)], 0)
        # gains[r, j]: bytes worker w[r, j] holds of call r's inputs
        gains = ((w[:, :, None] == w[:, None, :]) * size[:, None, :]).sum(axis=2)
        gains = np.where(w >= 0, gains, 0)
        best = gains.argmax(axis=1)
        rows = np.arange(len(w))
        top, pick = gains[rows, best], w[rows, best]
        rival = (gains == top[:, None]) & (w != pick[:, None]) & (w >= 0)
        if not (top > 0).all() or rival.any():
            return False
        op_load = np.bincount(pick, weights=flops, minlength=self.p)
        if (op_load > cap).any():
            return False
        self.where_arr[b.keys] = pick
        for k, worker in zip(b.keys.tolist(), pick.tolist()):
            self.where[k] = worker
        for worker in np.flatnonzero(op_load).tolist():
            self.load[worker] += float(op_load[worker])
        return True

    def place_by_bytes(self, t) -> None:
        """Where most of its inputs' bytes are; then the least loaded worker."""
        weight: dict[int, int] = defaultdict(int)
        for k in t.inputs:
            w = self.where[k]
            if w >= 0:
                weight[w] += int(self.size[k])
        top = max(weight.values(), default=0)
        if top > 0:
            w = min((self.load[w], w) for w, n in weight.items() if n == top)[1]
        else:
            w = min(range(self.p), key=lambda w: (self.load[w], w))
        self._put(t.key, w)


def _facts(n_ops: int, cols: Columns, placer: _Placer) -> dict:
    """What EXPLAIN shows of the placed plan, from the arrays: the bytes each operation moves
    between workers, the flops on each worker and how many tasks run (each Load once per
    worker consuming it). ``transfers`` and ``worker_flops`` compute the same from the tasks."""
    p, where, size = placer.p, placer.where_arr, placer.size
    is_load = np.zeros(cols.n_keys, dtype=bool)
    is_load[placer.loads] = True
    per_op = [0] * n_ops
    flops = np.zeros(p, dtype=np.int64)
    pairs = []  # load key * p + the worker of a task reading it
    for b in cols.blocks:
        if not len(b):
            continue
        on = where[b.keys]
        np.add.at(flops, on % p, b.flops)
        args = np.maximum(b.args, 0)
        read = b.args >= 0
        load = read & is_load[args]
        pairs.append((args * p + on[:, None])[load])
        moved = read & ~load & (where[args] != on[:, None])
        if 0 <= b.op < len(per_op):
            per_op[b.op] += int(size[args][moved].sum(dtype=object))  # no int64 wrap
    for t in cols.others:
        for k in t.inputs:
            if is_load[k]:
                pairs.append(np.array([k * p + where[t.key]], dtype=np.int64))
            elif where[k] != where[t.key]:
                op = cols.owner.get(t.key, 0)
                if 0 <= op < len(per_op):
                    per_op[op] += int(size[k])
    used = np.unique(np.concatenate(pairs)) // p if pairs else np.zeros(0, dtype=np.int64)
    copies = len(used) + len(placer.loads) - len(np.unique(used))
    return {"moved": (sum(per_op), per_op), "flops": flops.tolist(),
            "tasks": cols.n_keys - len(placer.loads) + copies}


def _with_loads(plan: TilePlan, where: dict[int, int]) -> tuple[list, dict[int, int]]:
    """Give every consuming worker its own Load, rewire the consumers, set every worker: the
    placed tasks and every task's operation."""
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
    return tasks, owner


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
    facts = plan.__dict__.get("facts")
    if facts is not None:
        moved, per_op = facts()["moved"]
        return moved, list(per_op)
    tasks = {t.key: t for t in plan.tasks}
    sizes: dict[int, int] = {}

    def size(key: int) -> int:
        if key not in sizes:
            sizes[key] = _task_bytes(plan, tasks[key])
        return sizes[key]

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
    facts = plan.__dict__.get("facts")
    if facts is not None:
        return list(facts()["flops"])
    out = [0] * max(1, plan.workers)
    for t in plan.tasks:
        if isinstance(t, Kernel):
            out[t.worker % len(out)] += t.flops
    return out
