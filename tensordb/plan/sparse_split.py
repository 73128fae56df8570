"""Splitting an operation so that its sparse part is an operation of its own: the sparse
intermediates of a statement (docs/explain.md, "Sparse intermediates").

The binder makes ``E[u,i] = M[u,i] * SUM(U[u,r] * V[i,r]) - R[u,i]`` two operations, ``E.t1 =
SUM(U * V)`` and ``E = M * E.t1 - R``: one elementwise join of three inputs that no sparse
kernel computes, so ``E`` and ``E.t1`` were dense users x items. Where ``M`` is sparse (a
matrix stored with sparse tiles, fill 0, or a result whose entries are a subset or a union of
such matrices' entries: a product keeps the intersection, a sum or difference the union), the
join ``x_a * x_b -+ x_c`` is split into the product ``E.1 = M * E.t1`` (which plan/sparse_fuse.py
then fuses into an SDDMM, CSR tiles out) and ``E = E.1 - R`` (a sparse join of two sparse
matrices); and ``SUM(E[u,i] * E[u,i])`` over a sparse ``E`` into ``E * E`` (a sparse join)
and its SUM (a sparse reduction); ``E[u,i] + E[u,i]`` read as one operand (GRAD's derivative of
``E * E``) is made a join of two operands, which the sparse join takes. Nothing is split where no operand is sparse, so dense
statements plan as they did. Each step computes what NumPy computes for the join, in the
same dtype, in the same order (``a * b`` first, then ``- c``).

>>> from tensordb.plan.ir import EinGraph, EinOp, TensorInfo
>>> from tensordb.plan.scalar import parse_join
>>> s = {"u": 4, "i": 3, "r": 2}
>>> t = EinOp.contraction("E.t1", "ui", [("U", "ur"), ("V", "ir")], s)
>>> e = EinOp.contraction("E", "ui", [("M", "ui"), ("E.t1", "ui"), ("R", "ui")], s,
...                       join=parse_join("x0 * x1 - x2"))
>>> g = EinGraph([TensorInfo(n, (s[a], s[b]), "float64") for n, (a, b) in
...               (("U", "ur"), ("V", "ir"), ("M", "ui"), ("R", "ui"))], [t, e], ["E"])
>>> [op.describe() for op in split(g, {"M", "R"}).ops]
['E.t1[u,i] = SUM(U[u,r] * V[i,r])', 'E.1[u,i] = M[u,i] * E.t1[u,i]', 'E[u,i] = E.1[u,i] - R[u,i]']
"""
from __future__ import annotations

from .ir import EinGraph, EinOp, Operand
from .scalar import Call, Input

__all__ = ["split", "sparse_pattern"]


def _matrix(op: EinOp, o: Operand) -> bool:
    """``o`` holds exactly ``op``'s two output labels, each once."""
    return len(op.out_labels) == 2 and len(set(op.out_labels)) == 2 and \
        len(o.labels) == 2 and set(o.labels) == set(op.out_labels)


def _uniform(op: EinOp) -> bool:
    """Every input and the result in one integer or float dtype: a step computes what the
    whole join computes."""
    import numpy as np
    return np.dtype(op.dtype).kind in "iuf" and all(
        np.dtype(d) == np.dtype(op.dtype) for d in (op.in_dtypes or ()))


def _product_pair(expr) -> tuple[int, int] | None:
    if isinstance(expr, Call) and expr.fn == "*" and all(isinstance(a, Input) for a in expr.args):
        return expr.args[0].index, expr.args[1].index
    return None


def sparse_pattern(graph: EinGraph, sparse: set[str]) -> set[str]:
    """The names of ``graph`` whose entries lie within a sparse pattern: the stored sparse
    matrices ``sparse`` (fill 0), and in graph order each elementwise matrix result that is
    a product with one of them (the intersection) or a sum or difference of two of them (the
    union). An upper bound on the pattern; the optimizer's estimate decides the format."""
    out = set(sparse)
    for op in graph.ops:
        if _patterned(op, out):
            out.add(op.output)
    return out


def _patterned(op: EinOp, pattern: set[str]) -> bool:
    if op.agg_labels or op.writes_diagonal or not all(_matrix(op, o) for o in op.inputs):
        return False
    j = op.join
    if not isinstance(j, Call) or not all(isinstance(a, Input) for a in j.args):
        return False
    names = [op.inputs[a.index].tensor for a in j.args]
    return (j.fn == "*" and any(n in pattern for n in names)) or \
        (j.fn in ("+", "-") and all(n in pattern for n in names))


def split(graph: EinGraph, sparse: set[str]) -> EinGraph:
    """``graph`` with each operation whose sparse part a sparse kernel computes alone split
    in two (see the module docstring); ``graph`` itself where there is none. ``sparse``: the
    stored inputs that are matrices with sparse tiles, fill 0."""
    pattern = set(sparse)
    ops: list[EinOp] = []
    taken = {t.name for t in graph.inputs} | {op.output for op in graph.ops}
    changed = False
    for op in graph.ops:
        parts = _split_one(op, pattern, taken)
        if parts is not None:
            changed = True
            taken.add(parts[0].output)
        for part in parts or (op,):
            ops.append(part)
            if _patterned(part, pattern):
                pattern.add(part.output)
    if not changed:
        return graph
    return EinGraph(graph.inputs, tuple(ops), graph.outputs)


def _name(op: EinOp, taken: set) -> str:
    n = 1
    while op.output.pairwise(n) in taken:
        n += 1
    return op.output.pairwise(n)


def _split_one(op: EinOp, pattern: set[str], taken: set) -> tuple | None:
    if op.writes_diagonal or not _uniform(op) or not op.inputs:
        return None
    j = op.join
    if not op.agg_labels and isinstance(j, Call) and j.fn in ("+", "-", "*") and \
            len(op.inputs) == 1 and j.args == (Input(0), Input(0)) and \
            op.inputs[0].tensor in pattern and _matrix(op, op.inputs[0]):
        # E + E (GRAD's d(E*E)/dE), E * E: the operand twice, a sparse join of two operands
        return (EinOp(op.output, op.out_labels, op.inputs * 2, op.sizes,
                      Call(j.fn, (Input(0), Input(1))), None, op.dtype, (), op.backward),)
    if not op.agg_labels and isinstance(j, Call) and j.fn in ("+", "-") and \
            all(_matrix(op, o) for o in op.inputs):
        # x_a * x_b -+ x_c (either side), a or b sparse, c sparse: product, then the join
        for side in (0, 1):
            pair, rest = _product_pair(j.args[side]), j.args[1 - side]
            if pair is None or not isinstance(rest, Input):
                continue
            a, b = pair
            if len({a, b, rest.index}) != 3 or op.inputs[rest.index].tensor not in pattern or \
                    not (op.inputs[a].tensor in pattern or op.inputs[b].tensor in pattern):
                continue
            name = _name(op, taken)
            first = EinOp(name, op.out_labels, (op.inputs[a], op.inputs[b]), op.sizes,
                          Call("*", (Input(0), Input(1))), None, op.dtype, (), op.backward)
            args = [Input(0), Input(1)] if side == 0 else [Input(1), Input(0)]
            second = EinOp(op.output, op.out_labels,
                           (Operand(name, op.out_labels), op.inputs[rest.index]), op.sizes,
                           Call(j.fn, tuple(args)), None, op.dtype, (), op.backward)
            return first, second
        return None
    pair = _product_pair(j)
    if op.agg == "sum" and op.agg_labels and pair is not None and len(op.inputs) == 2 and \
            sorted(pair) == [0, 1] and all(o.tensor in pattern for o in op.inputs) and \
            all(len(o.labels) == 2 and len(set(o.labels)) == 2 for o in op.inputs) and \
            set(op.inputs[0].labels) == set(op.inputs[1].labels):
        # SUM(A[i,j] * B[i,j]) of two sparse matrices: the product's entries, then their sum
        labels = op.inputs[0].labels
        name = _name(op, taken)
        first = EinOp(name, labels, op.inputs, tuple((l, op.size[l]) for l in labels), j, None,
                      op.dtype, (), op.backward)
        second = EinOp(op.output, op.out_labels, (Operand(name, labels),),
                       tuple((l, op.size[l]) for l in labels), Input(0), "sum", op.dtype, (),
                       op.backward)
        return first, second
    return None
