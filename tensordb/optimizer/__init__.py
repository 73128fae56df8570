"""The optimizer: choose how many pieces each label of each operation is split into (where each
tile task runs is decided after lowering, by ``physical.place``).

Interface relied on by the rest of tensordb:

``decompose(graph, workers, *, strategy=None, memory_limit=None, pieces=None, input_grids=None)``
    -> ``Decomposition``. ``pieces`` maps an operation's output name to {label: pieces} the user
    fixed; ``input_grids`` maps stored tensor names to their stored grid.
``Decomposition.pieces(output_name) -> dict[label, pieces]`` (every label of the operation).
``price(graph, decomposition, ...) -> Decomposition``: the same with its cost (a hand-made one).
``STRATEGIES``: the registered tiling searches; an unknown name fails listing the valid ones.

Strategies: ``eindecomp`` (the default: the cost-based dynamic program of dp.py), ``default``
(the first engine rule: split the largest output label), ``data-parallel`` and ``even`` (the
baselines of baselines.py). ``Decomposition.details`` always holds ``"cost"`` (a ``PlanCost``
from cost.py); ``eindecomp`` adds ``"choices"`` (a ``Choice`` per operation, with runner-ups),
``"dp_cost"``, ``"search_seconds"`` and ``"blas_threads"`` (threads.py: the BLAS threads of the
one-call plan when it is chosen, else 0; with ``"split_cost"`` and, where a one-call plan was
priced, ``"one_call_cost"`` and ``"one_call_threads"``). Where a sparse matrix's row label is split
and even cuts would be unbalanced, ``details["cuts"]`` says where its pieces are cut (row slabs
of equal nonzeros, balance.py) and ``details["balance"]`` what that achieves. ``details["memory"]`` is the plan's projected memory
(``PlanMemory``, plan/memory.py): per operation what its largest kernel call holds, the peak per
worker against ``memory_limit / workers``, and the intermediates the executor may spill.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from ..errors import ProgrammingError
from ..plan.ir import EinGraph
from ..plan.memory import PlanMemory, project, worker_budget
from .balance import balance
from .baselines import data_parallel_pieces, even_pieces
from .candidates import pieces_per_op
from .cost import DEFAULT_PARAMS, CostParams, PlanCost, Presence, StoredStats, evaluate, models_of
from .dp import Choice, solve
from .threads import one_call_plan, one_call_threads

__all__ = ["Decomposition", "decompose", "price", "STRATEGIES", "register_strategy",
           "DEFAULT_STRATEGY", "CostParams", "PlanCost", "PlanMemory", "Choice", "evaluate",
           "pieces_per_op", "StoredStats", "balance_cuts"]


@dataclass(frozen=True)
class Decomposition:
    """Pieces per label for every operation, plus whatever the search knows about its choice."""

    workers: int
    pieces_by_op: Mapping[str, Mapping[str, int]]  # output name -> {label: pieces}
    strategy: str = "default"
    details: Mapping[str, object] = field(default_factory=dict)  # per-op estimates, runner-ups

    def pieces(self, output: str) -> dict[str, int]:
        return dict(self.pieces_by_op[output])


StrategyFn = Callable[..., Decomposition]
STRATEGIES: dict[str, StrategyFn] = {}


def register_strategy(name: str, fn: StrategyFn) -> None:
    STRATEGIES[name] = fn


def _split_largest_output(graph: EinGraph, workers: int, *, pieces=None, **_) -> Decomposition:
    """The first engine default: split each operation's largest output label across the workers."""
    by_op = {}
    for op in graph.ops:
        split = {l: 1 for l in op.labels}
        fixed = dict((pieces or {}).get(op.output, {}))
        if op.out_labels and not fixed:
            big = max(op.out_labels, key=lambda l: op.size[l])
            split[big] = max(1, min(workers, op.size[big]))
        for l, d in fixed.items():
            split[l] = max(1, min(int(d), max(op.size[l], 1)))
        by_op[op.output] = split
    return Decomposition(workers, by_op, "default")


def _eindecomp(graph: EinGraph, workers: int, *, memory_limit=None, pieces=None, input_grids=None,
               params: CostParams = DEFAULT_PARAMS, presence=None, facts=None, blas_threads=1,
               stats=None, **_) -> Decomposition:
    """The cost-based search: the dynamic program of dp.py over the candidates of candidates.py.
    It prices its choice with the cost models it searched with (each is built once). With
    ``blas_threads`` > 1 (the local executor) it also prices the one-call plan (threads.py)
    and keeps the cheaper of the two."""
    t0 = time.perf_counter()
    models = models_of(graph, workers, params, presence, facts, input_grids,
                       worker_budget(memory_limit, workers), stats)
    by_op, choices, dp_cost, _ = solve(graph, workers, memory_limit=memory_limit, pieces=pieces,
                                       input_grids=input_grids, params=params, presence=presence,
                                       facts=facts, models=models)
    cost = evaluate(graph, by_op, workers, params=params, input_grids=input_grids, models=models,
                    presence=presence, facts=facts, memory_limit=memory_limit)
    details = {"choices": choices, "dp_cost": dp_cost, "blas_threads": 0, "split_cost": cost.total}
    threads = one_call_threads(graph, models, blas_threads) \
        if not any((pieces or {}).values()) else 0
    alt = one_call_plan(graph, workers, models, threads, solve, memory_limit=memory_limit,
                        input_grids=input_grids, params=params, presence=presence,
                        facts=facts) if threads else None  # None: not offered or does not fit
    if alt is not None:
        details["one_call_cost"], details["one_call_threads"] = alt[1].total, threads
        fits = project(graph, {name: c.memory for name, c in alt[1].ops.items()}, memory_limit,
                       workers).fits
        if fits and alt[1].total < cost.total:
            by_op, cost = alt[0], alt[1]
            details["blas_threads"] = threads
            details["choices"] = alt[2]
    seconds = time.perf_counter() - t0
    return Decomposition(workers, by_op, "eindecomp", {**details, "search_seconds": seconds,
                                                       "cost": cost})


def _fixed(rule, name):
    def strategy(graph: EinGraph, workers: int, *, pieces=None, **_) -> Decomposition:
        return Decomposition(workers, rule(graph, workers, pieces), name)
    strategy.__doc__ = rule.__doc__
    return strategy


register_strategy("default", _split_largest_output)
register_strategy("eindecomp", _eindecomp)
register_strategy("data-parallel", _fixed(data_parallel_pieces, "data-parallel"))
register_strategy("even", _fixed(even_pieces, "even"))
DEFAULT_STRATEGY = "eindecomp"


def decompose(graph: EinGraph, workers: int, *, strategy: str | None = None, memory_limit=None,
              pieces=None, input_grids=None, params: CostParams | None = None,
              input_tiles: Mapping | None = None,
              input_facts: Mapping[str, tuple[bool, bool]] | None = None,
              blas_threads: int = 1,
              input_stats: Mapping[str, StoredStats] | None = None) -> Decomposition:
    """Choose the pieces of every label of every operation with the named strategy.

    ``input_tiles`` maps block-sparse stored inputs to the coordinates of their stored tiles
    (dense inputs may be left out): the cost model then counts only kernel calls that exist.
    ``input_facts`` maps stored inputs to (finite, nonzero) as the catalog knows them: an absent
    tile skips kernel calls only next to finite partners (see ``plan.skip.zero_when_absent``);
    without it every input is taken to be finite. ``blas_threads``: the most BLAS threads one
    kernel call may use (the local executor's cores; 1 elsewhere): above 1 the default search
    also prices running each BLAS operation as one call with that many threads (threads.py)
    and records the count it chose in ``details["blas_threads"]`` (0: split, the executor's rule).
    ``input_stats`` maps stored inputs to their formats, nonzeros and payload bytes
    (``sparse_cost.StoredStats``): sparse inputs are priced by nnz (their payload read, a sparse
    kernel's flops), and EXPLAIN shows them (``details["inputs"]``).

    The result's ``details["cost"]`` is the cost model's estimate (a ``PlanCost``), whatever the
    strategy, so that EXPLAIN and the benchmarks compare strategies with one yardstick.

    >>> from tensordb.plan.ir import EinOp, EinGraph, TensorInfo
    >>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 65536, "j": 8, "k": 8})
    >>> g = EinGraph((TensorInfo("A", (65536, 8), "float64"), TensorInfo("B", (8, 8), "float64")),
    ...              (op,), ("C",))
    >>> decompose(g, 4).pieces("C")     # tall and skinny: split the rows
    {'i': 4, 'k': 1, 'j': 1}
    """
    name = strategy or DEFAULT_STRATEGY
    fn = STRATEGIES.get(name)
    if fn is None:
        raise ProgrammingError(f"unknown tiling strategy '{name}'",
                               hint=f"valid strategies: {', '.join(sorted(STRATEGIES))}")
    workers = max(1, int(workers))
    prm = params or DEFAULT_PARAMS
    presence = _presence(input_grids, input_tiles)
    kwargs = {"params": prm, "presence": presence, "facts": input_facts,
              "blas_threads": blas_threads, "stats": input_stats} if fn is _eindecomp else {}
    decomp = fn(graph, workers, memory_limit=memory_limit, pieces=pieces, input_grids=input_grids,
                **kwargs)
    decomp = price(graph, decomp, params=prm, input_grids=input_grids, input_tiles=input_tiles,
                   input_facts=input_facts, memory_limit=memory_limit, input_stats=input_stats)
    return balanced(graph, decomp, input_stats, input_grids)


def balanced(graph: EinGraph, decomp: Decomposition,
             input_stats: Mapping[str, StoredStats] | None, input_grids=None) -> Decomposition:
    """``decomp`` with its cuts of equal nonzeros (balance.py): ``details["cuts"]``, which the
    lowering follows, and ``details["balance"]``, which EXPLAIN shows."""
    cuts, shown = balance_cuts(graph, decomp, input_stats, input_grids)
    if not cuts:
        return decomp
    return replace(decomp, details={**decomp.details, "cuts": cuts, "balance": shown})


def balance_cuts(graph: EinGraph, decomp: Decomposition,
                 input_stats: Mapping[str, StoredStats] | None, input_grids=None):
    """(cuts, balance) that ``balanced`` adds to ``decomp`` for inputs of ``input_stats``: the
    plan cache asks again when a matrix they were cut by is replaced (driver/cache.py)."""
    sparse_ops = set(decomp.details.get("output_nnz", {}))
    if not input_stats or not sparse_ops:
        return {}, {}
    cuts, shown = balance(graph, decomp.pieces_by_op, input_stats, sparse_ops, input_grids)
    # An uneven cut makes a piece wider than the projection's even one: where its working set,
    # scaled by how much wider, would pass a worker's budget, the even cuts stay.
    mem = decomp.details.get("memory")
    budget = getattr(mem, "budget", None)
    if budget is not None:
        size = {op.output: op.size for op in graph.ops}
        wide = set()
        for name, by_label in cuts.items():
            call = mem.ops.get(name)
            for l, b in by_label.items():
                even = -(-size[name][l] // (len(b) - 1))
                widest = max(y - x for x, y in zip(b, b[1:]))
                if call is not None and call.total * widest / max(even, 1) > budget:
                    wide.add(tuple(b))
        if wide:
            cuts = {n: {l: b for l, b in c.items() if tuple(b) not in wide}
                    for n, c in cuts.items()}
            cuts = {n: c for n, c in cuts.items() if c}
            shown = {n: v for n, v in shown.items() if tuple(v["bounds"]) not in wide}
    return cuts, shown


def price(graph: EinGraph, decomp: Decomposition, *, params: CostParams | None = None,
          input_grids=None, input_tiles: Mapping | None = None,
          input_facts: Mapping[str, tuple[bool, bool]] | None = None,
          memory_limit: int | None = None,
          input_stats: Mapping[str, StoredStats] | None = None) -> Decomposition:
    """``decomp`` carrying its cost in ``details["cost"]`` (as it is when it already does) and
    its projected memory in ``details["memory"]`` (a ``plan.memory.PlanMemory``: the peak a
    worker reaches against its share of ``memory_limit``): what EXPLAIN shows and the
    benchmarks compare. The arguments are ``decompose``'s.

    >>> from tensordb.plan.ir import EinOp, EinGraph, TensorInfo
    >>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 64, "j": 8, "k": 8})
    >>> g = EinGraph((TensorInfo("A", (64, 8), "float64"), TensorInfo("B", (8, 8), "float64")),
    ...              (op,), ("C",))
    >>> by_hand = Decomposition(2, {"C": {"i": 2, "j": 1, "k": 1}}, "by hand")
    >>> price(g, by_hand).details["cost"].total == evaluate(g, by_hand.pieces_by_op, 2).total
    True
    """
    if "cost" in decomp.details and "memory" in decomp.details:
        return decomp
    cost = decomp.details.get("cost") or evaluate(
        graph, decomp.pieces_by_op, decomp.workers, params=params or DEFAULT_PARAMS,
        input_grids=input_grids, presence=_presence(input_grids, input_tiles), facts=input_facts,
        memory_limit=memory_limit, stats=input_stats)
    mem = project(graph, {name: c.memory for name, c in cost.ops.items()}, memory_limit,
                  decomp.workers, {name: c.out_nnz for name, c in cost.ops.items()
                                   if c.out_nnz is not None})
    inputs = {name: {"format": st.format, "nnz": int(st.nnz), "bytes": int(st.nbytes),
                     **({"fill": st.fill} if st.fill else {})}
              for name, st in (input_stats or {}).items()}
    # a sparse kernel's estimated output nonzeros: the writer stores such an output sparse
    # when the format rule says so (physical.OutputWriters), EXPLAIN shows it
    out_nnz = {name: c.out_nnz for name, c in cost.ops.items() if c.out_nnz is not None}
    return replace(decomp, details={**decomp.details, "cost": cost, "memory": mem,
                                    **({"inputs": inputs} if inputs else {}),
                                    **({"output_nnz": out_nnz} if out_nnz else {})})


def _presence(input_grids, input_tiles) -> dict[str, Presence]:
    return {name: Presence(input_grids[name], coords)
            for name, coords in (input_tiles or {}).items() if name in (input_grids or {})}
