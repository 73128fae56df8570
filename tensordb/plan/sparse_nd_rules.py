"""When an elementwise join of a sparse tensor of rank 3 or more runs on its entries (the
``spjoin`` kernel, exec/sparse_nd_join.py), beside the matrix rule (plan/sparse_rules.py
``spjoin_kernel``):

- ``T * U``, ``T + U``, ``T - U`` of two stored sparse tensors of fill 0 over the output's
  labels (each once, in any order): computed on the union of their entries with NumPy's
  ufunc, NumPy's answer whatever their values (a NaN or inf meeting an absent 0 included);
- ``T * D`` of a stored sparse tensor of fill 0 over the output's labels and an operand ``D``
  over some of them known to hold no NaN or inf (an absent entry of ``T`` times ``D`` is then
  0): ``T``'s pattern, ``D`` gathered at its entries (``KernelChoice.gathers``).

A partner that may hold NaN or inf, or whose absent value is not 0, leaves the join to the
dense kernel, as for matrices. The dtypes: one numeric or bool result type that NumPy's
promotion of the operands gives (no ``-`` of bools).

>>> from tensordb.plan.ir import EinOp
>>> from tensordb.plan.scalar import parse_join
>>> op = EinOp.contraction("X", "abc", [("T", "abc"), ("U", "cab")], {"a": 4, "b": 5, "c": 6},
...                        join=parse_join("x0 + x1"))
>>> spjoin_nd_kernel(op, (0, 1), (False, False), (0.0, 0.0))
('spjoin', 0)
>>> g = EinOp.contraction("X", "abc", [("T", "abc"), ("D", "bc")], {"a": 4, "b": 5, "c": 6},
...                       join=parse_join("x0 * x1"))
>>> spjoin_nd_kernel(g, (0,), (False, True), (0.0, 0.0))
('spjoin', 0, 'gather')
>>> spjoin_nd_kernel(g, (0,), (False, False), (0.0, 0.0)) is None   # D may hold an inf
True
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .ir import EinOp
from .scalar import Call, Input

__all__ = ["spjoin_nd_kernel"]


def spjoin_nd_kernel(op: EinOp, sparse: Sequence[int], finite: Sequence[bool],
                     fills: Sequence[float]) -> tuple | None:
    """``('spjoin', 0)`` (two sparse operands), ``('spjoin', k, 'gather')`` (sparse operand
    ``k`` times a dense one gathered at its entries) or None (see the module docstring)."""
    j = op.join
    if len(op.inputs) != 2 or op.agg_labels or op.writes_diagonal or len(op.out_labels) < 3 \
            or not sparse:
        return None
    if not (isinstance(j, Call) and j.fn in ("*", "+", "-") and len(j.args) == 2 and all(
            isinstance(a, Input) for a in j.args) and {a.index for a in j.args} == {0, 1}):
        return None
    dtype = np.dtype(op.dtype)
    ins = [np.dtype(d) for d in (op.in_dtypes or (op.dtype,) * 2)]
    if dtype.kind not in "biuf" or np.result_type(*ins) != dtype or \
            (dtype.kind == "b" and j.fn == "-"):
        return None
    fills = tuple(fills) or (0.0, 0.0)
    labels = [o.labels for o in op.inputs]
    out = set(op.out_labels)
    if any(len(set(ls)) != len(ls) for ls in labels):
        return None
    full = [len(ls) == len(op.out_labels) and set(ls) == out for ls in labels]
    if sorted(sparse) == [0, 1] and all(full) and not any(fills[k] for k in (0, 1)):
        return "spjoin", 0
    if j.fn != "*" or len(finite) != 2:
        return None
    for k in sparse:
        if full[k] and not fills[k] and finite[1 - k] and set(labels[1 - k]) <= out \
                and (1 - k) not in sparse:
            return "spjoin", k, "gather"
    return None
