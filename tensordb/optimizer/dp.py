"""The dynamic program that picks every operation's tiling together (strategy ``eindecomp``).

Operations are visited in topological order. For operation ``v`` and candidate tiling ``d`` the
table holds ``M[v][d]``: the cheapest cost of producing ``v`` tiled by ``d``, everything upstream
included::

    M[v][d] = cost(v, d) + sum over inputs u of v:
                  min( min{ M[u][e] : u's output tiling under e == what d needs of u },   # no re-cut
                       min_e M[u][e] + bytes(u) )                                        # re-cut

The edge term depends only on ``u``'s output tiling, so each producer keeps the best entry per
output tiling and each edge costs one dictionary lookup: the whole search is
O(sum of candidates x inputs). When every intermediate has one consumer (a tree) this is exact.

Shared intermediates (used by more than one operand) are fixed greedily, with one step of
look-ahead: when ``u``'s table is complete, ``u`` takes the tiling ``e`` that minimises
``M[u][e]`` plus, for each use, the cheapest consumer tiling given ``e`` (the consumer's own cost
plus re-tiling ``u`` if needed; the consumer's other inputs are not yet known). ``u``'s cost then
counts once, and its consumers see it as a fixed input, like a stored tensor. The gap to the best
tiling, measured against brute force on small DAGs, is in tests/test_optimizer_dp.py.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping

from ..plan.ir import EinGraph
from .candidates import candidates, pins_from_hints
from .cost import DEFAULT_PARAMS, CostParams, OpModel, as_dict, edge_retile, models_of

__all__ = ["Choice", "solve", "RUNNER_UPS"]

RUNNER_UPS = 3
_INF = float("inf")


@dataclass(frozen=True)
class Choice:
    """The tiling picked for one operation, with the best alternatives the search saw.

    ``cost`` is ``M[v][d]``: producing the operation this way, everything upstream included.
    """

    pieces: Mapping[str, int]
    cost: float
    runner_ups: tuple[tuple[Mapping[str, int], float], ...] = ()
    candidates: int = 0


class _Table:
    __slots__ = ("cands", "local", "total", "back", "by_out", "best")

    def __init__(self, cands, local) -> None:
        self.cands = cands
        self.local = local
        self.total = list(local)
        self.back: list[list] = [[] for _ in cands]   # per candidate: (producer, index) picks
        self.by_out: dict[tuple, tuple[float, int]] = {}
        self.best: tuple[float, int] = (_INF, -1)


def solve(graph: EinGraph, workers: int, *, memory_limit: int | None = None,
          hints: Mapping[str, Mapping[str, int]] | None = None,
          input_grids: Mapping | None = None, params: CostParams = DEFAULT_PARAMS):
    """Run the search; returns (tilings, choices, dp_cost, seconds)."""
    t0 = time.perf_counter()
    p = max(1, int(workers))
    models = models_of(graph, p, params)
    pins = pins_from_hints(graph, hints)
    grids = dict(input_grids or {})
    budget = None if memory_limit is None else max(1, int(memory_limit) // p)
    uses: dict[str, int] = {}
    for op in graph.ops:
        for o in op.inputs:
            uses[o.tensor] = uses.get(o.tensor, 0) + 1

    # Pass 1: candidates and each operation's own cost (stored inputs' re-tiling included).
    tables: dict[str, _Table] = {}
    for op in graph.ops:
        m = models[op.output]
        cands = candidates(m, pins.get(op.output), budget)
        local = []
        for d in cands:
            retile = 0.0
            for which, o in enumerate(op.inputs):
                if o.tensor not in models:
                    retile += edge_retile(m, which, d, None, None, grids.get(o.tensor))
            local.append(m.cost(d, retile).total)
        tables[op.output] = _Table(cands, local)

    # Pass 2: the tables, in topological order.
    fixed: dict[str, int] = {}
    constant = 0.0
    for op in graph.ops:
        name = op.output
        m, t = models[name], tables[name]
        for which, o in enumerate(op.inputs):
            u = tables.get(o.tensor)
            if u is None:
                continue
            um = models[o.tensor]
            recut = float(um.out_bytes)
            if o.tensor in fixed:
                have = um.out_tiling(u.cands[fixed[o.tensor]])
                for c, d in enumerate(t.cands):
                    if m.need(d, which) != have:
                        t.total[c] += recut
                continue
            best_cost, best_idx = u.best
            for c, d in enumerate(t.cands):
                hit = u.by_out.get(m.need(d, which))
                if hit is not None and hit[0] <= best_cost + recut:
                    t.total[c] += hit[0]
                    t.back[c].append((o.tensor, hit[1]))
                else:
                    t.total[c] += best_cost + recut
                    t.back[c].append((o.tensor, best_idx))
        for c, d in enumerate(t.cands):
            key = m.out_tiling(d)
            v = t.total[c]
            if v < t.by_out.get(key, (_INF,))[0]:
                t.by_out[key] = (v, c)
            if v < t.best[0]:
                t.best = (v, c)
        if uses.get(name, 0) > 1:
            fixed[name] = _fix_shared(graph, name, models, tables)
            constant += t.total[fixed[name]]

    # Reconstruct: shared producers from their fixed pick, sinks from their best entry.
    chosen: dict[str, int] = {}
    starts = [(n, c) for n, c in fixed.items()]
    sinks = [op.output for op in graph.ops if uses.get(op.output, 0) == 0]
    dp_cost = constant + sum(tables[s].best[0] for s in sinks)
    starts += [(s, tables[s].best[1]) for s in sinks]
    stack = list(starts)
    while stack:
        name, c = stack.pop()
        if name in chosen:
            continue
        chosen[name] = c
        stack.extend(tables[name].back[c])

    tilings: dict[str, dict[str, int]] = {}
    choices: dict[str, Choice] = {}
    for op in graph.ops:
        name = op.output
        m, t = models[name], tables[name]
        c = chosen[name]
        tilings[name] = as_dict(m, t.cands[c])
        order = sorted(range(len(t.cands)), key=lambda i: t.total[i])
        ups = tuple((as_dict(m, t.cands[i]), t.total[i]) for i in order if i != c)[:RUNNER_UPS]
        choices[name] = Choice(tilings[name], t.total[c], ups, len(t.cands))
    return tilings, choices, dp_cost, time.perf_counter() - t0


def _fix_shared(graph: EinGraph, name: str, models: Mapping[str, OpModel],
                tables: Mapping[str, _Table]) -> int:
    """Pick the tiling of a shared intermediate: its own table plus a one-step look-ahead."""
    um, u = models[name], tables[name]
    recut = float(um.out_bytes)
    looks: list[tuple[dict, float]] = []
    for op in graph.ops:
        for which, o in enumerate(op.inputs):
            if o.tensor != name:
                continue
            m, t = models[op.output], tables[op.output]
            by_need: dict[tuple, float] = {}
            for c, d in enumerate(t.cands):
                need = m.need(d, which)
                if t.local[c] < by_need.get(need, _INF):
                    by_need[need] = t.local[c]
            looks.append((by_need, min(t.local)))
    best, pick = _INF, u.best[1]
    for c, d in enumerate(u.cands):
        out = um.out_tiling(d)
        v = u.total[c]
        for by_need, floor in looks:
            v += min(by_need.get(out, _INF), floor + recut)
        if v < best - 1e-9 * abs(best) if math.isfinite(best) else v < best:
            best, pick = v, c
    return pick
