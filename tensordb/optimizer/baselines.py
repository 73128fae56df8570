"""Fixed tiling rules: the schemes the search is compared against, registered as strategies.

- ``data-parallel``: every operation splits its first output label (rows, the batch) across
  the workers and nothing else; weights are replicated.
- ``even``: every operation splits all its labels about equally, largest labels first, so that
  the product is the number of workers (the "split every dimension" baseline of the EinDecomp
  experiments).

Both honour the pieces the user fixed and ignore cost and memory: they exist to be measured.

>>> from tensordb.plan.ir import EinOp, EinGraph, TensorInfo
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 64, "j": 64, "k": 64})
>>> g = EinGraph((TensorInfo("A", (64, 64), "float64"), TensorInfo("B", (64, 64), "float64")),
...              (op,), ("C",))
>>> even_pieces(g, 8)["C"], data_parallel_pieces(g, 8)["C"]
({'i': 2, 'k': 2, 'j': 2}, {'i': 8, 'k': 1, 'j': 1})
"""
from __future__ import annotations

from typing import Mapping

from ..plan.ir import EinGraph
from .candidates import pieces_per_op

__all__ = ["data_parallel_pieces", "even_pieces"]


def _fixed(graph: EinGraph, fixed, by_op: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    for name, labels in pieces_per_op(graph, fixed).items():
        op = graph.op(name)
        for l, d in labels.items():
            by_op[name][l] = max(1, min(d, max(op.size[l], 1)))
    return by_op


def data_parallel_pieces(graph: EinGraph, workers: int, fixed: Mapping | None = None
                         ) -> dict[str, dict[str, int]]:
    out = {}
    for op in graph.ops:
        pieces = {l: 1 for l in op.labels}
        if op.out_labels:
            row = op.out_labels[0]
            pieces[row] = max(1, min(workers, op.size[row]))
        out[op.output] = pieces
    return _fixed(graph, fixed, out)


def even_pieces(graph: EinGraph, workers: int, fixed: Mapping | None = None
                ) -> dict[str, dict[str, int]]:
    out = {}
    for op in graph.ops:
        pieces = {l: 1 for l in op.labels}
        rest = max(1, workers)
        # Hand out factors of two round-robin over the labels, largest label first; stop when
        # no label can take another factor.
        order = sorted(op.labels, key=lambda l: -op.size[l])
        while rest > 1:
            grew = False
            for l in order:
                if rest > 1 and pieces[l] * 2 <= op.size[l] and rest % 2 == 0:
                    pieces[l] *= 2
                    rest //= 2
                    grew = True
            if not grew:
                if rest % 2:  # an odd factor left (workers not a power of two): biggest label
                    big = next((l for l in order if pieces[l] * rest <= op.size[l]), None)
                    if big is not None:
                        pieces[big] *= rest
                break
        out[op.output] = pieces
    return _fixed(graph, fixed, out)
