"""The plan cache: a bound graph planned once is not planned again while nothing it depends on
changed, so a repeated statement (a training loop, a dashboard) pays only for running.

A plan depends on the bound graph (its operations, shapes, dtypes and outputs), the pieces the
user fixed, the catalog versions of its inputs (a version's tiles and facts never change), the
settings that steer planning, and the executor's fan-in. The connection builds that key
(``plan_key``); the cache keeps the most recent ``capacity`` plans, and ``prune`` drops those
whose inputs have newer versions (their readers would keep replaced payload files mapped).

    >>> cache = PlanCache(capacity=2)
    >>> cache.get("k") is None, cache.stats()["misses"]
    (True, 1)
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable

__all__ = ["PlanCache", "plan_key"]


def plan_key(graph, pieces, versions: dict[str, int], settings: tuple, fan_in) -> Hashable:
    """The key of a plan: everything its decomposition and tile plan depend on."""
    fixed = tuple(sorted((str(name), tuple(sorted(p.items()))) for name, p in (pieces or {}).items()))
    return (graph, fixed, tuple(sorted(versions.items())), settings, fan_in)


class PlanCache:
    """A small LRU map from ``plan_key`` to (Decomposition, placed TilePlan), with counters."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[Hashable, tuple[Any, Any, dict[str, int]]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Hashable):
        try:
            entry = self._plans[key]
        except (KeyError, TypeError):  # TypeError: an unhashable part (never cached)
            self.misses += 1
            return None
        self._plans.move_to_end(key)
        self.hits += 1
        return entry[:2]

    def put(self, key: Hashable, decomp, plan, versions: dict[str, int]) -> None:
        if self.capacity <= 0:
            return
        try:
            self._plans[key] = (decomp, plan, dict(versions))
        except TypeError:
            return
        self._plans.move_to_end(key)
        while len(self._plans) > self.capacity:
            self._plans.popitem(last=False)

    def prune(self, current: Callable[[str], int | None]) -> None:
        """Drop the plans that read a tensor whose current version (``current(name)``; None:
        dropped) is not the one they were planned for."""
        stale = [k for k, (_, _, versions) in self._plans.items()
                 if any(current(name) != v for name, v in versions.items())]
        for k in stale:
            del self._plans[k]

    def clear(self) -> None:
        self._plans.clear()

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "size": len(self._plans)}
