"""When an operation over sparse stored matrices runs as a semiring, masked or sampled kernel
(exec/semiring.py): the rules the lowering's kernel choice (physical/choice.py) and the cost
model share, beside ``plan.memory.sparse_kernel`` (spmm, spreduce).

- ``semiring``: ``AGG_j (S[i,j] (+) X[j,...])`` with AGG MIN or MAX and (+) a plain ``+`` or
  ``*``, S a matrix stored with sparse tiles (GraphBLAS's ``mxm`` on the stored entries):
  min-plus (max-plus) where every sparse operand's fill is +inf (-inf), so an absent entry
  never wins and an output with no pair is the fill again; max-times and min-times where
  the fills are 0, an output with an absent pair then taking 0 into its MAX or MIN too.
- ``masked``: ``SUM(A[i,j] * B[j,k] * C[k,i])``, the triangle count's form (each of the three
  a matrix, C stored sparse): ``C^T .* (A @ B)`` only where C has entries (a masked SpGEMM).
- ``sddmm``: ``M[i,j] * SUM_r(U[i,r] * V[j,r])`` (sampled dense-dense): an output element
  only where M has an entry, as the element-wise mask of M with ``U @ V^T``.
- ``spjoin``: an elementwise ``A[i,j] * B[i,j]`` (the intersection of their entries), ``A + B``
  or ``A - B`` (the union) of two stored sparse matrices (fill 0, either orientation), by
  scipy.sparse on their entries.

Each is NumPy's answer on the densified inputs wherever the values are what the rule assumes
(no NaN, no inf against a 0); the kernel checks that on each tile, and computes a tile where
they are not the dense way, so the answer is NumPy's either way.

>>> from tensordb.plan.ir import EinOp
>>> from tensordb.plan.scalar import parse_join
>>> inf = float("inf")
>>> mp = EinOp.contraction("P", "ik", [("D", "ij"), ("D", "jk")], {"i": 3, "j": 3, "k": 3},
...                        join=parse_join("x0 + x1"), agg="min")
>>> semiring_kernel(mp, (0, 1), (inf, inf))
('semiring', 0, 'min_plus')
>>> semiring_kernel(mp, (0, 1), (0.0, 0.0)) is None   # absent 0s would take part
True
"""
from __future__ import annotations

import functools
import importlib.util
from typing import Sequence

import numpy as np

from .ir import EinOp
from .scalar import Call, Input
from .sparse_nd_rules import spjoin_nd_kernel

__all__ = ["choose", "have_graphblas", "semiring_kernel", "matrix_operand", "SEMIRINGS", "masked_kernel",
           "sddmm_kernel", "spjoin_kernel", "METHODS", "mask_orientation"]

METHODS = ("semiring", "masked", "sddmm", "spjoin")  # the kernels of exec/semiring.py

# (agg, join operator) -> (semiring name, the fill every sparse operand must have; None: 0)
SEMIRINGS = {("min", "+"): ("min_plus", float("inf")), ("max", "+"): ("max_plus", float("-inf")),
             ("max", "*"): ("max_times", 0.0), ("min", "*"): ("min_times", 0.0)}


def _pair(expr, fn: str) -> bool:
    """Whether ``expr`` is ``x0 fn x1`` (either order)."""
    return isinstance(expr, Call) and expr.fn == fn and len(expr.args) == 2 and all(
        isinstance(a, Input) for a in expr.args) and {a.index for a in expr.args} == {0, 1}


def matrix_operand(op: EinOp, k: int) -> bool:
    """Whether operand ``k`` of a two-operand ``op`` is a matrix ``S[i,j]`` whose ``j`` is
    contracted with the other operand ``X`` and whose ``i`` is kept, ``X`` holding ``j`` and
    labels all kept, each label once: then ``op`` is one product ``S @ X`` (in some semiring)."""
    s, d = op.inputs[k].labels, op.inputs[1 - k].labels
    if len(s) != 2 or len(set(s)) != 2 or len(set(d)) != len(d):
        return False
    shared = [l for l in s if l in d]
    if len(shared) != 1 or shared[0] in op.out_labels:
        return False
    kept = [l for l in s if l != shared[0]]
    return kept[0] in op.out_labels and kept[0] not in d and all(
        l == shared[0] or l in op.out_labels for l in d)


@functools.lru_cache(maxsize=1)
def have_graphblas() -> bool:
    """Whether python-graphblas is installed (the ``graph`` extra): without it a semiring
    product runs as the dense kernel, and a masked product with scipy.sparse."""
    return importlib.util.find_spec("graphblas") is not None


def semiring_kernel(op: EinOp, sparse: Sequence[int], fills: Sequence[float]) -> tuple | None:
    """``('semiring', operand, name)`` when ``op`` runs as a GraphBLAS semiring product (see
    the module docstring), else None. ``sparse``: the operands stored as matrices with sparse
    tiles; ``fills``: every operand's fill value (0 for an earlier result)."""
    if not sparse or len(op.inputs) != 2 or op.writes_diagonal or len(op.agg_labels) != 1 \
            or not have_graphblas():
        return None
    dtypes = op.in_dtypes or (op.dtype,) * 2
    if np.dtype(op.dtype).kind not in "iuf" or any(np.dtype(d) != np.dtype(op.dtype) for d in dtypes):
        return None
    for (agg, fn), (name, fill) in SEMIRINGS.items():
        if op.agg != agg or not _pair(op.join, fn):
            continue
        if any(fills[k] != fill for k in sparse):
            return None
        for k in sparse:
            if matrix_operand(op, k):
                return "semiring", k, name
    return None


def masked_kernel(op: EinOp, sparse: Sequence[int], finite: Sequence[bool]) -> tuple | None:
    """``('masked', operand)`` for ``SUM(A[i,j] * B[j,k] * C[k,i])`` over all three labels
    into a scalar, the operand a stored sparse matrix (the mask, here C), all three known to
    hold no NaN or inf (an absent C entry times the others is 0, and grouping the products
    does not matter); None otherwise. Float or integer, one dtype."""
    if op.out_labels or not _sum_of_product3(op):
        return None
    labels = [o.labels for o in op.inputs]
    if any(len(l) != 2 or len(set(l)) != 2 for l in labels) or len(set(op.labels)) != 3:
        return None
    # a cycle i -> j -> k -> i: each label in exactly two operands
    if any(sum(l in ls for ls in labels) != 2 for l in op.labels):
        return None
    # every operand finite: then the sum over the mask's entries of M * (A @ B) is numpy's sum
    # of the three-way products, whatever the grouping (an inf would meet a 0 differently)
    if len(finite) != 3 or not all(finite):
        return None
    for k in sparse:
        return "masked", k
    return None


def _sum_of_product3(op: EinOp) -> bool:
    """Whether ``op`` is a SUM of ``x0 * x1 * x2`` (``_product3``) over its three inputs, all of
    its own integer or float dtype, writing no diagonal: what the masked and the SDDMM kernels
    both compute."""
    if len(op.inputs) != 3 or op.agg != "sum" or op.writes_diagonal:
        return False
    if not (isinstance(op.join, Call) and _product3(op.join)):
        return False
    return np.dtype(op.dtype).kind in "iuf" and all(
        np.dtype(d) == np.dtype(op.dtype) for d in (op.in_dtypes or ()))


def _product3(expr) -> bool:
    """``x0 * x1 * x2`` in any grouping and order, nothing else."""
    seen: list[int] = []

    def walk(e) -> bool:
        if isinstance(e, Input):
            seen.append(e.index)
            return True
        return isinstance(e, Call) and e.fn == "*" and len(e.args) == 2 and all(
            walk(a) for a in e.args)
    return walk(expr) and sorted(seen) == [0, 1, 2]


def sddmm_kernel(op: EinOp, sparse: Sequence[int], finite: Sequence[bool]) -> tuple | None:
    """``('sddmm', operand)`` for ``SUM_r(M[i,j] * U[i,r] * V[j,r])`` kept ``i, j`` (in either
    order), M a stored sparse matrix (the mask), all three known to hold no NaN or inf (an
    absent M entry times U and V is then 0, and ``M * sum(U * V)`` is ``sum(M * U * V)``);
    None otherwise."""
    if len(op.out_labels) != 2 or not _sum_of_product3(op):
        return None
    if len(op.agg_labels) != 1 or len(finite) != 3:
        return None
    r = op.agg_labels[0]
    out = set(op.out_labels)
    for k in sparse:
        m = op.inputs[k].labels
        others = [o.labels for n, o in enumerate(op.inputs) if n != k]
        if set(m) != out or len(set(m)) != 2 or not all(finite):
            continue
        if all(len(o) == 2 and r in o and len(set(o) & out) == 1 for o in others) and \
                {next(l for l in o if l != r) for o in others} == out:
            return "sddmm", k
    return None


def spjoin_kernel(op: EinOp, sparse: Sequence[int], fills: Sequence[float]) -> tuple | None:
    """``('spjoin', 0)`` for ``A * B``, ``A + B`` or ``A - B`` elementwise, both operands stored
    sparse matrices of fill 0 over the output's two labels; None otherwise."""
    j = op.join
    if len(op.inputs) != 2 or op.agg_labels or op.writes_diagonal or sorted(sparse) != [0, 1]:
        return None
    if any(fills[k] for k in (0, 1)) or not (isinstance(j, Call) and j.fn in ("*", "+", "-")
                                             and _pair(j, j.fn)):
        return None
    dtypes = op.in_dtypes or (op.dtype,) * 2
    if np.dtype(op.dtype).kind not in "iuf" or any(np.dtype(d) != np.dtype(op.dtype) for d in dtypes):
        return None
    labels = [o.labels for o in op.inputs]
    if any(len(l) != 2 or len(set(l)) != 2 or set(l) != set(op.out_labels) for l in labels):
        return None
    return "spjoin", 0


def choose(op: EinOp, sparse: Sequence[int], finite: Sequence[bool],
           fills: Sequence[float]) -> tuple | None:
    """The semiring, masked or sampled kernel ``op`` runs as, ``(method, operand[, semiring])``,
    or None; ``sparse``: the operands stored as matrices with sparse tiles, ``finite`` and
    ``fills`` per operand (an earlier result: not known finite, fill 0)."""
    if not sparse:
        return None
    fills = tuple(fills) or (0.0,) * len(op.inputs)
    plain = tuple(k for k in sparse if fills[k] == 0)
    return (semiring_kernel(op, sparse, fills) or masked_kernel(op, plain, finite)
            or sddmm_kernel(op, plain, finite) or spjoin_kernel(op, sparse, fills)
            or spjoin_nd_kernel(op, sparse, finite, fills))


def mask_orientation(op, k_mask: int) -> tuple:
    """For ``masked`` and ``sddmm`` (on the CPU and a GPU): the mask's labels (a, b), the third
    label c, and the operands holding a and b (x with a and c, y with b): (a, b, c, x, y)."""
    a, b = op.inputs[k_mask].labels
    rest = [n for n in range(3) if n != k_mask]
    x = next(n for n in rest if a in op.inputs[n].labels)
    y = next(n for n in rest if n != x)
    (c,) = [l for l in op.inputs[x].labels if l != a]
    return a, b, c, x, y
