"""Fill values through a graph: the value of an output's absent entries, from its inputs' fills.

A stored tensor's fill (``TensorMeta.fill``, 0 unless declared: ``FILL +inf``) is the value of
every entry its sparse tiles leave out. An operation over inputs whose fills are all 0 has fill
0, as before fill values. Otherwise its fill is what the operation gives where every input is
at its fill: the join evaluated on the fills, then aggregated over the aggregated labels (MIN and
MAX keep it, SUM multiplies it by their extent, PROD raises it to it). Min-plus over distances
with fill +inf keeps +inf (``MIN(D[i,j] + D[j,k])``: inf + inf is inf), so the shortest-path
step stays sparse. Where that value is NaN (``SUM(D[i,j] * X[j,k])`` with D's fill +inf:
inf * 0) the algebra keeps no fill, and the statement is refused: its answer would be NaN
wherever D has no entry, which is never what a graph query means.

Any fill is exact (the writer stores the entries that differ from it); it only decides how
sparse the stored output is. An output whose fill does not fit its dtype (+inf of an integer
result) gets 0.

>>> from tensordb.plan.ir import EinOp
>>> from tensordb.plan.scalar import parse_join
>>> mp = EinOp.contraction("P", "ik", [("D", "ij"), ("D", "jk")], {"i": 3, "j": 3, "k": 3},
...                        join=parse_join("x0 + x1"), agg="min")
>>> op_fill(mp, [float("inf"), float("inf")])
inf
>>> op_fill(EinOp.contraction("C", "ik", [("D", "ij"), ("X", "jk")], {"i": 3, "j": 3, "k": 2}),
...         [float("inf"), 0.0])
Traceback (most recent call last):
...
tensordb.errors.ProgrammingError: C[i,k] = SUM(D[i,j] * X[j,k]): D has fill value inf, and the operation's value where its inputs are at their fills is NaN: the result cannot keep a fill
HINT: min-plus (MIN(D[i,j] + D[j,k])) and max-plus keep +inf and -inf fills; to compute anything else, store the tensor with fill 0 first
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..errors import Error, ProgrammingError
from . import scalar
from .ir import EinGraph, EinOp

__all__ = ["graph_fills", "op_fill", "densifying"]


def graph_fills(graph: EinGraph, input_fills: Mapping[str, float]) -> dict[str, float]:
    """The fill of every operation's output (by its name in the graph), from the stored inputs'
    ``input_fills`` (a name left out: 0); raises ProgrammingError where an operation over an
    input with another fill than 0 keeps none (``op_fill``)."""
    fills = {name: float(f) for name, f in input_fills.items()}
    out: dict[str, float] = {}
    for op in graph.ops:
        f_in = [fills.get(o.tensor, 0.0) for o in op.inputs]
        out[op.output] = fills[op.output] = op_fill(op, f_in) if any(f_in) else 0.0
    return out


def densifying(graph: EinGraph, input_fills: Mapping[str, float], sparse: set[str],
               out_fills: Mapping[str, float]) -> dict[str, float]:
    """The operations over a sparse stored input (``sparse``) whose value where every input is
    at its fill is not their output's fill (``EXP(X)`` of an X of fill 0 is 1 there): their
    output is dense wherever the input is absent. By output name, that value (EXPLAIN says so)."""
    fills = {**{n: float(f) for n, f in input_fills.items()}, **out_fills}
    out: dict[str, float] = {}
    for op in graph.ops:
        if not any(o.tensor in sparse for o in op.inputs):
            continue
        try:
            v = _at_fills(op, [fills.get(o.tensor, 0.0) for o in op.inputs])
        except (ArithmeticError, ValueError, TypeError, Error):
            continue
        if not math.isnan(v) and v != out_fills.get(op.output, 0.0):
            out[op.output] = v
    return out


def _at_fills(op: EinOp, fills: Sequence[float]) -> float:
    """``op``'s join at its inputs' ``fills``, aggregated over its aggregated labels."""
    dtypes = op.in_dtypes or (op.dtype,) * len(op.inputs)
    with np.errstate(all="ignore"):
        at = [np.array(f).astype(d) if np.dtype(d).kind == "f" or math.isfinite(f) else
              np.array(f) for f, d in zip(fills, dtypes)]
        v = np.asarray(scalar.evaluate(op.join, at), dtype=np.float64).reshape(()).item()
        n = math.prod(op.size[l] for l in op.agg_labels)
        if op.agg_labels and (op.agg in ("argmax", "argmin") or n == 0):
            return 0.0  # the first index of an all-fill row; an empty aggregate
        if op.agg_labels and op.agg == "sum":
            v = v * n if v != 0 else 0.0
        elif op.agg_labels and op.agg == "prod":
            v = v ** n if v not in (0.0, 1.0) else v
    return v


def op_fill(op: EinOp, fills: Sequence[float]) -> float:
    """The fill of ``op``'s output given its inputs' ``fills`` (see the module docstring)."""
    try:
        v = _at_fills(op, fills)
    except (ArithmeticError, ValueError, TypeError, Error):
        return 0.0  # the join refuses the fills' values (an int to a negative power): fill 0
    if math.isnan(v):
        bad = next(o.tensor for o, f in zip(op.inputs, fills) if f != 0)
        f = next(f for f in fills if f != 0)
        raise ProgrammingError(
            f"{describe(op)}: {bad} has fill value {f}, and the operation's value where its "
            "inputs are at their fills is NaN: the result cannot keep a fill",
            hint="min-plus (MIN(D[i,j] + D[j,k])) and max-plus keep +inf and -inf fills; to "
                 "compute anything else, store the tensor with fill 0 first")
    dtype = np.dtype(op.dtype)
    if v == 0 or dtype.kind not in "fiu":
        return 0.0
    with np.errstate(all="ignore"):
        if dtype.kind != "f" and not math.isfinite(v) or \
                float(np.array(v).astype(dtype)) != v:
            return 0.0  # not an element this dtype holds
    return float(v)


def describe(op: EinOp) -> str:
    """``C[i,k] = SUM(D[i,j] * X[j,k])``: an operation as its statement would read."""
    names = [f"{o.tensor}[{','.join(o.labels)}]" for o in op.inputs]
    body = scalar.render(op.join, names)
    if op.agg_labels:
        body = f"{op.agg.upper()}({body})"
    return f"{op.output}[{','.join(op.out_labels)}] = {body}"
