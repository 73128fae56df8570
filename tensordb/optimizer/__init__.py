"""The optimizer: choose how many pieces each label of each operation is split into, and where
each tile task runs.

Interface relied on by the rest of tensordb:

``decompose(graph, workers, *, strategy=None, memory_limit=None, hints=None, input_grids=None)``
    -> ``Decomposition``. ``hints`` maps an operation's output name to {label: pieces} the user
    pinned; ``input_grids`` maps stored tensor names to their stored grid.
``Decomposition.pieces(output_name) -> dict[label, pieces]`` (every label of the operation).
``place(plan) -> TilePlan``: assigns a worker to every task of a lowered plan.
``STRATEGIES``: the registered tiling searches; an unknown name fails listing the valid ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import ProgrammingError
from ..plan.ir import EinGraph, EinOp

__all__ = ["Decomposition", "decompose", "place", "STRATEGIES", "register_strategy"]


@dataclass(frozen=True)
class Decomposition:
    """Pieces per label for every operation, plus whatever the search knows about its choice."""

    workers: int
    tilings: Mapping[str, Mapping[str, int]]
    strategy: str = "default"
    details: Mapping[str, object] = field(default_factory=dict)  # per-op estimates, runner-ups

    def pieces(self, output: str) -> dict[str, int]:
        return dict(self.tilings[output])


StrategyFn = Callable[..., Decomposition]
STRATEGIES: dict[str, StrategyFn] = {}


def register_strategy(name: str, fn: StrategyFn) -> None:
    STRATEGIES[name] = fn


def _split_largest_output(graph: EinGraph, workers: int, *, hints=None, **_) -> Decomposition:
    """The simple default: split each operation's largest output label across the workers."""
    tilings = {}
    for op in graph.ops:
        pieces = {l: 1 for l in op.labels}
        pinned = dict((hints or {}).get(op.output, {}))
        if op.out_labels and not pinned:
            big = max(op.out_labels, key=lambda l: op.size[l])
            pieces[big] = max(1, min(workers, op.size[big]))
        for l, d in pinned.items():
            pieces[l] = max(1, min(int(d), max(op.size[l], 1)))
        tilings[op.output] = pieces
    return Decomposition(workers, tilings, "default")


register_strategy("default", _split_largest_output)
DEFAULT_STRATEGY = "default"


def decompose(graph: EinGraph, workers: int, *, strategy: str | None = None, memory_limit=None,
              hints=None, input_grids=None) -> Decomposition:
    name = strategy or DEFAULT_STRATEGY
    fn = STRATEGIES.get(name)
    if fn is None:
        raise ProgrammingError(f"unknown tiling strategy '{name}'",
                               hint=f"valid strategies: {', '.join(sorted(STRATEGIES))}")
    return fn(graph, workers, memory_limit=memory_limit, hints=hints, input_grids=input_grids)


def place(plan):
    """Assign workers: see placement.py."""
    from .placement import place as _place
    return _place(plan)
