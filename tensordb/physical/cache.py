"""The plan cache: a bound graph planned once is not planned again while nothing it depends on
changed, so a repeated statement (a training loop, a dashboard) pays only for running.

A plan depends on the bound graph (its operations, input names, shapes, dtypes and outputs), the
pieces the user fixed, the *layout* of each input (its grid, which tiles are present, and per
tile its NaN/inf flag and whether every element is nonzero: ``TensorReader.layout``), the
settings that steer planning, and the executor's fan-in. It does not depend on the input's
version: a training step that writes new weights of the same layout plans once. The connection
builds that key (``plan_key``). The cache keeps the most recent ``capacity`` plans *without*
their readers (so no replaced payload file stays mapped); ``rebind`` gives a cached plan the
readers of the inputs' current versions, and ``prune`` drops the plans reading a dropped tensor.

    >>> cache = PlanCache(capacity=2)
    >>> cache.get("k") is None, cache.stats()["misses"]
    (True, 1)
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Callable, Hashable

from ..plan import scalar

__all__ = ["PlanCache", "plan_key", "rebind"]


def plan_key(graph, pieces, layouts: dict[str, bytes], settings: tuple, fan_in) -> Hashable:
    """The key of a plan: everything its decomposition and tile plan depend on (``layouts``:
    input name -> ``TensorReader.layout()``)."""
    fixed = tuple(sorted((str(name), tuple(sorted(p.items()))) for name, p in (pieces or {}).items()))
    literals = tuple(_literals(op.join) for op in graph.ops)
    return (graph, literals, fixed, tuple(sorted(layouts.items())), settings, fan_in)


def _literals(expr) -> tuple:
    """The literals of a join as their type and spelling: equal graphs may differ in them
    (``0.0 == -0.0``, ``1 == 1.0 == True``), and each gives another result."""
    if isinstance(expr, scalar.Const):
        return ((type(expr.value).__name__, repr(expr.value)),)
    if isinstance(expr, scalar.Call):
        return tuple(x for a in expr.args for x in _literals(a))
    return ()


def rebind(plan, readers: dict, ops=None):
    """``plan`` reading through ``readers`` (input name -> TensorReader of its current version).
    Everything else in a TilePlan names tensors, never versions: its tasks, outputs and stats
    are shared with the cached plan. ``ops``: the operations of the graph it runs now, equal to
    the plan's but for the values of their parameters (``scalar.Param``), which they bring."""
    bound = copy.copy(plan)
    bound.readers = dict(readers)
    if ops is not None and any(_has_param(op.join) for op in ops):
        bound.ops = tuple(ops)
    return bound


def _has_param(expr) -> bool:
    if isinstance(expr, scalar.Param):
        return True
    return isinstance(expr, scalar.Call) and any(_has_param(a) for a in expr.args)


class PlanCache:
    """A small LRU map from ``plan_key`` to (Decomposition, placed TilePlan), with counters."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[Hashable, tuple[Any, Any, frozenset[str]]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Hashable):
        """The cached (Decomposition, TilePlan) of ``key`` (its readers empty: ``rebind`` it),
        or None."""
        try:
            entry = self._plans[key]
        except (KeyError, TypeError):  # TypeError: an unhashable part (never cached)
            self.misses += 1
            return None
        self._plans.move_to_end(key)
        self.hits += 1
        return entry[:2]

    def put(self, key: Hashable, decomp, plan, inputs) -> None:
        """Keep ``plan`` (a copy without its readers) under ``key``; ``inputs``: the names it reads."""
        if self.capacity <= 0:
            return
        try:
            self._plans[key] = (decomp, rebind(plan, {}), frozenset(inputs))
        except TypeError:
            return
        self._plans.move_to_end(key)
        while len(self._plans) > self.capacity:
            self._plans.popitem(last=False)

    def prune(self, exists: Callable[[str], bool]) -> None:
        """Drop the plans that read a tensor that no longer exists (``exists(name)`` is False)."""
        stale = [k for k, (_, _, inputs) in self._plans.items()
                 if not all(exists(name) for name in inputs)]
        for k in stale:
            del self._plans[k]

    def clear(self) -> None:
        self._plans.clear()

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._plans)}
