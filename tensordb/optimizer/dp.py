"""The dynamic program that picks every operation's tiling together (strategy ``eindecomp``).

Operations are visited in topological order. For operation ``v`` and candidate tiling ``d`` the
table holds ``M[v][d]``: the cheapest cost of producing ``v`` tiled by ``d``, everything upstream
included::

    M[v][d] = cost(v, d) + sum over inputs u of v:
                  min( min{ M[u][e] : u's output tiling under e == what d needs of u },   # no re-cut
                       min_e M[u][e] + recut(u) )                                        # re-cut

where ``recut(u)`` is u's bytes, or half of them when the tiling needed refines u's (cost.py's
``recut_bytes``: every piece needed lies in one tile made).

The edge term depends only on ``u``'s output tiling, so each producer keeps the best entry per
output tiling and each edge costs one dictionary lookup: the whole search is
O(sum of candidates x inputs). Operations that differ only by name (the layers of a model) share
their candidates and own costs. When every intermediate has one consumer (a tree) this is
exact but for the refinement discount, which is taken against the producer's best entry only (a
costlier entry that the consumer's tiling refines is not tried).

Shared intermediates (used by more than one operand) are fixed greedily, with one step of
look-ahead: when ``u``'s table is complete, ``u`` takes the tiling ``e`` that minimises
``M[u][e]`` plus, for each use, the cheapest consumer tiling given ``e`` (the consumer's own cost
plus re-tiling ``u`` if needed; the consumer's other inputs are not yet known). ``u``'s cost then
counts once, and its consumers see it as a fixed input, like a stored tensor. The gap to the best
tiling, measured against brute force on small DAGs, is in tests/optimizer/test_optimizer_dp.py.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Mapping

from ..plan.ir import EinGraph
from ..plan.memory import worker_budget
from .candidates import candidates, pieces_per_op
from .cost import DEFAULT_PARAMS, CostParams, OpModel, as_dict, edge_retile, models_of, recut_bytes

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
    __slots__ = ("cands", "local", "needs", "outs", "total", "back", "by_out", "best")

    def __init__(self, cands, local, needs, outs) -> None:
        self.cands = cands
        self.local = local
        self.needs = needs    # per input: the tiling each candidate needs of it
        self.outs = outs      # per candidate: its output tiling
        self.total = list(local)
        self.back: list[list] = [[] for _ in cands]   # per candidate: (producer, index) picks
        self.by_out: dict[tuple, tuple[float, int]] = {}
        self.best: tuple[float, int] = (_INF, -1)


def solve(graph: EinGraph, workers: int, *, memory_limit: int | None = None,
          pieces: Mapping[str, Mapping[str, int]] | None = None,
          input_grids: Mapping | None = None, params: CostParams = DEFAULT_PARAMS,
          presence: Mapping | None = None, facts: Mapping | None = None,
          models: Mapping | None = None):
    """Run the search; returns (pieces by operation, choices, dp_cost, seconds). ``models``:
    the operations' cost models (``cost.models_of`` with these arguments), when the caller
    has them (it prices the result with the same ones)."""
    t0 = time.perf_counter()
    p = max(1, int(workers))
    budget = worker_budget(memory_limit, p)
    models = models or models_of(graph, p, params, presence, facts, input_grids, budget)
    fixed = pieces_per_op(graph, pieces)
    tables = _own_tables(graph, models, fixed, dict(input_grids or {}), budget)
    uses, shared, constant = _fill_tables(graph, models, tables)
    chosen, dp_cost = _reconstruct(graph, tables, uses, shared, constant)
    by_op, choices = _choices(graph, models, tables, chosen)
    return by_op, choices, dp_cost, time.perf_counter() - t0


def _own_tables(graph: EinGraph, models: Mapping[str, OpModel], fixed: Mapping, grids: Mapping,
                budget: int | None) -> dict[str, _Table]:
    """Pass 1: candidates and each operation's own cost (stored inputs' re-tiling included).
    Repeated layers have identical operations up to names: price each shape once."""
    tables: dict[str, _Table] = {}
    seen: dict[tuple, tuple] = {}
    for op in graph.ops:
        m = models[op.output]
        fix = fixed.get(op.output)
        sig = (m.sizes, m.n_out, m.out_bytes, m.flops, tuple(sorted((fix or {}).items())),
               tuple((i.pos, i.nbytes, i.itemsize, id(i.presence), i.inner,
                      grids.get(o.tensor, ()) if o.tensor not in models else None)
                     for i, o in zip(m.inputs, op.inputs)))
        hit = seen.get(sig)
        if hit is None:
            cands = candidates(m, fix, budget)
            local = []
            for d in cands:
                retile = 0.0
                for which, o in enumerate(op.inputs):
                    if o.tensor not in models:
                        retile += edge_retile(m, which, d, None, None, grids.get(o.tensor))
                local.append(m.cost(d, retile, memory=False).total)
            needs = [[m.need(d, w) for d in cands] for w in range(len(op.inputs))]
            outs = [m.out_tiling(d) for d in cands]
            hit = seen[sig] = (cands, local, needs, outs)
        tables[op.output] = _Table(*hit)
    return tables


def _fill_tables(graph: EinGraph, models: Mapping[str, OpModel], tables: Mapping[str, _Table]
                 ) -> tuple[dict[str, int], dict[str, int], float]:
    """Pass 2: the tables, in topological order; shared intermediates are fixed as they complete.
    Returns the uses of every tensor, the fixed picks and the cost they add once."""
    uses: dict[str, int] = {}
    readers: dict[str, list[tuple[str, int]]] = {}   # tensor -> (consumer, operand position)
    for op in graph.ops:
        for which, o in enumerate(op.inputs):
            uses[o.tensor] = uses.get(o.tensor, 0) + 1
            readers.setdefault(o.tensor, []).append((op.output, which))
    fixed: dict[str, int] = {}
    constant = 0.0
    for op in graph.ops:
        name = op.output
        t = tables[name]
        for which, o in enumerate(op.inputs):
            if o.tensor in tables:
                _add_edge(t, which, tables[o.tensor], o.tensor, float(models[o.tensor].out_bytes),
                          fixed.get(o.tensor))
        _index_best(t)
        if uses.get(name, 0) > 1:
            fixed[name] = _fix_shared(name, readers[name], models, tables)
            constant += t.total[fixed[name]]
    return uses, fixed, constant


def _add_edge(t: _Table, which: int, u: _Table, producer: str, recut: float,
              fixed: int | None) -> None:
    """Add input ``which`` (produced by ``u``) to every candidate's total: the producer's best
    entry with the output tiling the candidate needs, or its best entry re-cut; a fixed producer
    costs only the re-cut, when its tiling is not the one needed."""
    needs = t.needs[which]
    if fixed is not None:
        have = u.outs[fixed]
        for c in range(len(t.cands)):
            t.total[c] += recut_bytes(recut, have, needs[c])
        return
    best_cost, best_idx = u.best
    best_out = u.outs[best_idx]
    for c in range(len(t.cands)):
        hit = u.by_out.get(needs[c])
        cut = best_cost + recut_bytes(recut, best_out, needs[c])
        if hit is not None and hit[0] <= cut:
            t.total[c] += hit[0]
            t.back[c].append((producer, hit[1]))
        else:
            t.total[c] += cut
            t.back[c].append((producer, best_idx))


def _index_best(t: _Table) -> None:
    """The best entry per output tiling, and the best entry overall."""
    for c in range(len(t.cands)):
        key = t.outs[c]
        v = t.total[c]
        if v < t.by_out.get(key, (_INF,))[0]:
            t.by_out[key] = (v, c)
        if v < t.best[0]:
            t.best = (v, c)


def _reconstruct(graph: EinGraph, tables: Mapping[str, _Table], uses: Mapping[str, int],
                 fixed: Mapping[str, int], constant: float) -> tuple[dict[str, int], float]:
    """Shared producers from their fixed pick, sinks from their best entry, then back along the
    picks. Returns each operation's candidate index and the search's cost."""
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
    return chosen, dp_cost


def _choices(graph: EinGraph, models: Mapping[str, OpModel], tables: Mapping[str, _Table],
             chosen: Mapping[str, int]) -> tuple[dict[str, dict[str, int]], dict[str, Choice]]:
    """Each operation's pieces, and its Choice with the runner-ups."""
    by_op: dict[str, dict[str, int]] = {}
    choices: dict[str, Choice] = {}
    for op in graph.ops:
        name = op.output
        m, t = models[name], tables[name]
        c = chosen[name]
        by_op[name] = as_dict(m, t.cands[c])
        order = heapq.nsmallest(RUNNER_UPS + 1, range(len(t.cands)), key=t.total.__getitem__)
        ups = tuple((as_dict(m, t.cands[i]), t.total[i]) for i in order if i != c)[:RUNNER_UPS]
        choices[name] = Choice(by_op[name], t.total[c], ups, len(t.cands))
    return by_op, choices


def _fix_shared(name: str, readers: list[tuple[str, int]], models: Mapping[str, OpModel],
                tables: Mapping[str, _Table]) -> int:
    """Pick the tiling of a shared intermediate: its own table plus a one-step look-ahead."""
    u = tables[name]
    recut = float(models[name].out_bytes)
    looks: list[tuple[dict, float]] = []
    for consumer, which in readers:
        t = tables[consumer]
        by_need: dict[tuple, float] = {}
        for c, need in enumerate(t.needs[which]):
            if t.local[c] < by_need.get(need, _INF):
                by_need[need] = t.local[c]
        looks.append((by_need, min(t.local)))
    best, pick = _INF, u.best[1]
    for c, out in enumerate(u.outs):
        v = u.total[c]
        for by_need, floor in looks:
            v += min(by_need.get(out, _INF), floor + recut)
        if v < best:  # ties keep the earlier candidate: deterministic plans
            best, pick = v, c
    return pick
