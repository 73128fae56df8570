"""Candidate tilings of one operation, and the pieces a user fixed for some labels.

A candidate gives every label of the operation a number of pieces ``d_l <= size_l``. The product
(the number of kernel calls) is the number of workers ``p``: every worker gets work, none gets two
shares. Three exceptions:

- a small operation (at most ``CostParams.small_op_flops``) may also use any divisor of ``p``
  kernel calls, down to one: its idle workers cost nothing (cost.py), so it runs as the fewest
  calls its bytes allow: one task saves more than splitting tens of microseconds could;
- when the labels are too small to make ``p`` pieces, every reachable divisor of ``p`` is offered;
- when a memory budget is set and no candidate's projected peak (``OpModel.peak``: what its
  largest kernel call holds, plan/memory.py) fits it, the product doubles (``2p``, ``4p``, ...:
  more pieces of output labels, or of contracted labels, a sliced contraction folded into an
  accumulator) until one does; if none does with at most ``MAX_CALLS_PER_WORKER`` kernel calls
  per worker, the operation cannot run and ``OutOfMemoryError`` names it, with its smallest
  projected peak and the budget, before anything runs.

Labels whose pieces the user fixed (``WITH (PIECES ...)``, ``pieces=``) keep them; the search
completes the others. Fixed pieces never make planning fail: if they do not divide ``p``, the
free labels make the largest power of two that keeps the product at most ``p`` (whole, if the
fixed labels alone exceed ``p``).

>>> from tensordb.plan.ir import EinOp
>>> from tensordb.optimizer.cost import OpModel
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 256, "j": 256, "k": 256})
>>> cands = candidates(OpModel.of(op, {"A": "float32", "B": "float32"}, 4))   # labels i, k, j
>>> len(cands), sorted(cands)[:3]
(6, [(1, 1, 4), (1, 2, 2), (1, 4, 1)])
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Mapping

from ..config import format_bytes
from ..errors import OutOfMemoryError, ProgrammingError
from ..plan.aggregates import ARG_AGGS
from ..plan.ir import EinGraph
from ..sparsity import MAX_TILE_ELEMENTS
from .cost import OpModel

__all__ = ["candidates", "pieces_per_op", "divisors", "MAX_CALLS_PER_WORKER"]

MAX_CALLS_PER_WORKER = 4096


@lru_cache(maxsize=None)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    (1, 2, 3, 4, 6, 12)
    """
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return tuple(sorted(set(small) | {n // k for k in small}))


@lru_cache(maxsize=4096)
def _level(sizes: tuple[int, ...], fixed: tuple[int, ...], total: int) -> tuple[tuple[int, ...], ...]:
    """Every vector with ``fixed`` (0 = free) kept whose free entries multiply to ``total``."""
    free = [i for i, p in enumerate(fixed) if not p]
    out: list[tuple[int, ...]] = []
    vec = [p or 1 for p in fixed]

    def rec(at: int, rest: int) -> None:
        if at == len(free):
            if rest == 1:
                out.append(tuple(vec))
            return
        i = free[at]
        for v in divisors(rest):
            if v > max(sizes[i], 1):
                break
            vec[i] = v
            rec(at + 1, rest // v)
        vec[i] = 1

    rec(0, total)
    return tuple(out)


def candidates(model: OpModel, fixed: Mapping[str, int] | None = None,
               budget: int | None = None) -> list[tuple[int, ...]]:
    """Candidate pieces vectors (in ``model.labels`` order) for one operation."""
    p = model.workers
    sizes = model.sizes
    fixed_vec = [0] * len(sizes)
    for l, d in (fixed or {}).items():
        i = model.labels.index(l)
        fixed_vec[i] = max(1, min(int(d), max(sizes[i], 1)))
    fixed_t = tuple(fixed_vec)
    fixed_prod = math.prod(d for d in fixed_vec if d)
    free_reach = math.prod(max(n, 1) for n, d in zip(sizes, fixed_vec) if not d)
    if p % fixed_prod == 0:
        base = p // fixed_prod
    else:  # fixed pieces that do not divide p: fill up to the largest power of two that still fits
        base = 1 << max(0, (p // fixed_prod).bit_length() - 1) if fixed_prod <= p else 1
    small = model.flops <= model.params.small_op_flops
    levels = divisors(base) if small else (base,)
    cands = [v for t in levels for v in _level(sizes, fixed_t, t)]
    if not cands:  # labels too small to make ``base`` pieces: every reachable divisor of it
        cands = [v for t in divisors(base) for v in _level(sizes, fixed_t, t)]
    # Block-sparse inputs: also the tiling on their stored grid (fixed pieces permitting).
    cands += [v for v in model.aligned() if v not in cands
              and all(not f or f == x for f, x in zip(fixed_t, v))]
    # an output tile of more than 2**62 elements cannot be stored (its linear indices pass
    # int64): a join of two 10^7-cubed sparse tensors is cut into more calls, as for memory
    if budget is None and not any(_too_big(model, v) for v in cands):
        return cands

    def fit(v, peak) -> bool:
        return not _too_big(model, v) and (budget is None or peak <= budget)
    fits = [v for v in cands if fit(v, model.peak(v) if budget is not None else 0)]
    # More kernel calls than this per worker is not a plan anyone wants to run: stop there.
    limit = max(p, 1) * MAX_CALLS_PER_WORKER
    total, level = base, cands
    smallest = min((model.peak(v) for v in cands), default=0)
    while not fits and total * 2 <= min(free_reach, limit):
        total *= 2
        level = _level(sizes, fixed_t, total) or level
        peaks = [model.peak(v) for v in level]
        smallest = min([smallest, *peaks])
        fits = [v for v, peak in zip(level, peaks) if fit(v, peak)]
    if not fits:
        op = model.op
        if budget is None or smallest <= budget:
            raise OutOfMemoryError(
                f"{op.describe()}: no tiling keeps its output tiles within {MAX_TILE_ELEMENTS} "
                f"(2**62) elements with up to {min(total, limit)} kernel calls",
                hint="compute it over a slice of its labels")
        raise OutOfMemoryError(
            f"{op.describe()}: no tiling fits the memory budget: the smallest projected peak, "
            f"with labels {', '.join(f'{l}={n}' for l, n in zip(model.labels, sizes))} cut into "
            f"up to {min(total, limit)} kernel calls, is {format_bytes(smallest)} per worker, "
            f"more than its {format_bytes(budget)} (its share of memory_limit among {p} "
            "worker(s))",
            hint="raise memory_limit, use fewer workers, or fix fewer pieces")
    return fits


def _too_big(model: OpModel, v) -> bool:
    """Whether tiling ``v`` makes an output tile of more than ``MAX_TILE_ELEMENTS``."""
    tile = [-(-n // k) if n else 0 for n, k in zip(model.sizes, v)]
    out = [tile[p] for p in model.out_pos] if model.out_pos else tile[: model.n_out]
    return math.prod(out) > MAX_TILE_ELEMENTS


def pieces_per_op(graph: EinGraph, pieces: Mapping[str, Mapping[str, int]] | None
                  ) -> dict[str, dict[str, int]]:
    """Map the pieces a user fixed (result name -> {label: pieces}) to each operation's.

    Pieces fixed for ``D`` also apply to every operation computed under the name ``D`` (its
    ``TensorRef``): the pairwise steps ``D.1``, ``D.2``, ... that a multi-operand einsum into
    ``D`` was split into, its temporaries, earlier versions and internal name, for each label
    that operation has.
    """
    out: dict[str, dict[str, int]] = {}
    for key, labels in (pieces or {}).items():
        group = [op for op in graph.ops if op.output.within(key)]
        if not group:
            raise ProgrammingError(f"pieces for '{key}', which no operation produces",
                                   hint=f"results: {', '.join(op.output for op in graph.ops)}")
        for l, d in dict(labels).items():
            try:
                d = int(d)
            except (TypeError, ValueError):
                raise ProgrammingError(f"pieces of {key}.{l} must be an integer, "
                                       f"got {d!r}") from None
            if d < 1:
                raise ProgrammingError(f"pieces of {key}.{l} must be at least 1, got {d}")
            hit = [op for op in group if l in op.size]
            if not hit:
                known = sorted({x for op in group for x in op.labels})
                raise ProgrammingError(f"pieces for '{key}' name label '{l}', which it "
                                       f"does not have", hint=f"labels: {', '.join(known)}")
            for op in hit:
                out.setdefault(op.output, {})[l] = d
    for op in graph.ops:  # an index over a label is found in one piece of it (no partials)
        if op.agg in ARG_AGGS:
            out.setdefault(op.output, {}).update((l, 1) for l in op.agg_labels)
    return out
