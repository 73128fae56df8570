"""Fusing a product into the sparse matrix that masks it: the masked SpGEMM and SDDMM forms.

The binder splits a product of three operands into pairwise steps (opt_einsum's order), so
``SUM(A[i,j] * A[j,k] * A[k,i])`` becomes ``T[i,k] = SUM(A[i,j] * A[j,k])`` (dense, I x K) then
``SUM(A[k,i] * T[i,k])``, and ``M[i,j] * SUM(U[i,r] * V[j,r])`` computes all of ``U @ V^T``
before M masks it. Where a step multiplies the previous step's result (used nowhere else), and
one of the three operands is a matrix stored with sparse tiles (fill 0), the two are one
operation of three operands,
``SUM(M * X * Y)``, that the masked or sampled kernel (plan/sparse_rules.py) computes only at
M's entries: ``fuse`` rewrites the graph so, where that kernel would be chosen, and leaves it
as it is everywhere else. The fused operation is the second step's (its name, output labels
and dtype); the first step's aggregated labels get names of their own.

>>> from tensordb.plan.ir import EinGraph, EinOp, TensorInfo
>>> t = EinOp.contraction("T", "ik", [("A", "ij"), ("A", "jk")], {"i": 4, "j": 4, "k": 4})
>>> c = EinOp.contraction("c", "", [("A", "ki"), ("T", "ik")], {"i": 4, "k": 4})
>>> g = EinGraph([TensorInfo("A", (4, 4), "float64")], [t, c], ["c"])
>>> [op.describe() for op in fuse(g, {"A"}, {"A": True}).ops]
['c[] = SUM(A[k,i] * A[i,j] * A[j,k])']
"""
from __future__ import annotations

from typing import Mapping

from .ir import EinGraph, EinOp, Operand
from .scalar import Call, Input, product
from .sparse_rules import masked_kernel, sddmm_kernel

__all__ = ["fuse"]


def _plain_product(op: EinOp) -> bool:
    """``x0 * x1`` of two operands under SUM (or elementwise), one dtype, no diagonal."""
    j = op.join
    return (len(op.inputs) == 2 and (op.agg == "sum" or not op.agg_labels)
            and not op.writes_diagonal
            and isinstance(j, Call) and j.fn == "*" and len(j.args) == 2
            and all(isinstance(a, Input) for a in j.args)
            and {a.index for a in j.args} == {0, 1}
            and all(d == op.dtype for d in (op.in_dtypes or (op.dtype,))))


def fuse(graph: EinGraph, sparse: set[str], finite: Mapping[str, bool]) -> EinGraph:
    """``graph`` with each (product, mask) pair that a masked or sampled kernel computes fused
    into one operation (see the module docstring). ``sparse``: the stored inputs that are
    matrices with sparse tiles and fill 0; ``finite``: per stored input, known to hold no NaN
    or inf (an earlier result is not known so)."""
    ops = list(graph.ops)
    changed = False
    for at, op2 in enumerate(list(ops)):
        if op2 is None or not _plain_product(op2):
            continue
        for t in (0, 1):
            fused = _fused(graph, ops, op2, t, sparse, finite)
            if fused is not None:
                ops[ops.index(graph.producer(op2.inputs[t].tensor))] = None
                ops[at] = fused
                changed = True
                break
    if not changed:
        return graph
    return EinGraph(graph.inputs, tuple(op for op in ops if op is not None), graph.outputs)


def _fused(graph: EinGraph, ops, op2: EinOp, t: int, sparse, finite) -> EinOp | None:
    other, tref = op2.inputs[1 - t], op2.inputs[t]
    op1 = graph.producer(tref.tensor)
    if op1 is None or op1 not in ops or tref.tensor in graph.outputs or \
            not _plain_product(op1) or op1.dtype != op2.dtype or \
            len(set(tref.labels)) != len(tref.labels) or \
            sum(o.tensor == tref.tensor for c in graph.consumers(tref.tensor) for o in c.inputs) != 1:
        return None
    # op1's labels in op2's names: its outputs as op2 reads them, its aggregated ones anew
    rename = dict(zip(op1.out_labels, tref.labels))
    taken = set(op2.labels) | set(rename.values())
    for l in op1.agg_labels:
        new, n = l, 0
        while new in taken:
            n += 1
            new = f"{l}{n}"
        rename[l] = new
        taken.add(new)
    sizes = dict(op2.size)
    sizes.update({rename[l]: n for l, n in op1.size.items()})
    inputs = (other,) + tuple(Operand(o.tensor, tuple(rename[l] for l in o.labels))
                              for o in op1.inputs)
    fused = EinOp(op2.output, op2.out_labels, inputs, tuple(sizes.items()), product(3), "sum",
                  op2.dtype, (), op2.backward)
    known = tuple(bool(finite.get(o.tensor, False)) for o in inputs)
    masks = tuple(n for n, o in enumerate(inputs) if o.tensor in sparse and len(o.labels) == 2)
    if masks and (masked_kernel(fused, masks, known) or sddmm_kernel(fused, masks, known)):
        return fused
    return None
