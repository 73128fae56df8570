"""BLAS threads: one call with every core, or split pieces with one thread each.

On the local executor (W workers on W cores) a BLAS-able operation can run two ways: split into
pieces, one per worker, each piece a BLAS call with one thread (the dynamic program's plan), or
as one BLAS call that OpenBLAS runs on W threads. A BLAS thread limit is process-wide, so the
choice is the plan's: the search prices both plans and keeps the cheaper.

- The split plan: the dynamic program's choice with one BLAS thread per call (``threads=1``).
- The one-call plan: every BLAS operation in one kernel call run with ``threads`` BLAS threads
  (``OpModel.rate``: ``threads`` x ``blas_efficiency`` of its M x N output, which falls for a
  small output such as a 128 x 128 Gram matrix); the dynamic program tiles the other operations
  (elementwise and other non-BLAS kernels, which NumPy runs on one thread) across the workers.

Both are priced by ``evaluate`` in the same bytes (the idle cores of a call are the ``balance``
term). The one-call plan is offered only where it can be run as priced: the executor is local
(``threads > 1``), no operation has pieces the user fixed (a user's pieces win), its
projected peak fits a worker's share of the memory limit (one call holds a whole operation),
and its largest call has at least ``BLAS_FLOPS_PER_THREAD`` flops per thread (smaller calls
wait for their threads longer than they compute: the executor's own rule, ``exec/pool.py``). The chosen plan records its thread
count (``Decomposition.details["blas_threads"]``; 0: the executor's rule), which the lowering
copies into the tile plan, the executor sets for the run and EXPLAIN shows.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ..errors import OutOfMemoryError
from ..plan.ir import EinGraph
from ..plan.memory import BLAS_FLOPS_PER_THREAD
from .cost import OpModel, PlanCost, evaluate

__all__ = ["BLAS_FLOPS_PER_THREAD", "one_call_threads", "one_call_plan"]


def one_call_threads(graph: EinGraph, models: Mapping[str, OpModel], threads: int) -> int:
    """The BLAS threads a one-call plan of ``graph`` would run with: ``threads``, at most one
    per ``BLAS_FLOPS_PER_THREAD`` of its largest BLAS operation (0: no one-call plan)."""
    largest = max((m.flops for m in models.values() if m.blas is not None), default=0)
    t = min(int(threads), int(largest // BLAS_FLOPS_PER_THREAD))
    return t if t > 1 else 0


def one_call_plan(graph: EinGraph, workers: int, models: Mapping[str, OpModel], threads: int,
                  solve, **kwargs) -> tuple[dict, PlanCost, Mapping] | None:
    """The one-call plan (pieces by operation, its cost, the search's choices) for
    ``threads`` BLAS threads, or None when ``graph`` has no BLAS operation or one call per BLAS
    operation does not fit the memory limit. ``solve``: the
    dynamic program (``dp.solve``), run with the BLAS operations fixed at one piece; ``kwargs``
    its and ``evaluate``'s other arguments."""
    threaded = {name: replace(m, threads=threads) for name, m in models.items()}
    fixed = {op.output: {l: 1 for l in op.labels} for op in graph.ops
             if threaded[op.output].blas is not None}
    if not fixed:
        return None
    try:
        by_op, choices, _, _ = solve(graph, workers, pieces=fixed, models=threaded, **kwargs)
    except OutOfMemoryError:  # one call per BLAS operation does not fit: the split plan only
        return None
    cost = evaluate(graph, by_op, workers, models=threaded, **kwargs)
    return by_op, cost, choices
