"""A reduction's join value read again by a later elementwise call of the straight-line run
(exec/fastpath.py; issue 29: the EXP computed once across forward and backward).

A LOGSUMEXP computes ``SUM(EXP(Z - s))`` over its label, and its GRAD ``g * EXP(Z - s)``: the
same EXP of the same tiles, twice (numpy's step computes ``e = exp(z - m)`` once and reads it
for the sum and for the softmax). The reduction's kernel makes that EXP as a fresh array before
it reduces it, in its join space; ``shares`` finds, once per program, the later elementwise
kernel calls whose join holds the reduction's whole join as a subexpression over the very same
tiles (the same keys, the labels of each operand mapped one to one), and writes for each an
operation of its own (``Share.op``) that reads the kept value as one more operand in place of
that subexpression. The run keeps the value (``bound.bind(..., keep=True)``) until the last
such call has read it.

The answers are the same bytes: the subexpression's NumPy calls on the same operands' values
give the same elements wherever they are laid out (each ufunc computes an element from the
elements it reads; the kept array is one NumPy made itself, contiguous in memory, as the
recomputed one is). Where the reduction was not bound (its spec was called) or made no fresh
array of the whole join space, nothing is kept and the later call computes its join as
written. The pool is not changed: a tile there may be computed on another worker.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..plan.aggregates import ARG_AGGS
from ..plan.ir import EinOp, Operand
from ..plan.scalar import Call, Const, Input, dtype_of

__all__ = ["Share", "shares"]

_SKIP = ("_stop",)  # a call that is no NumPy work of its own


@dataclass(frozen=True)
class Share:
    """A later call's rewritten operation: ``op`` (its inputs and one more, the kept value
    under ``key``), and the reduction step whose value it reads (``source``)."""

    source: int
    key: int
    op: EinOp


def shares(plan, steps, kernel_kind: int) -> tuple[dict, dict]:
    """({reduction step index: key its join value is kept under}, {consumer step index:
    Share}); the key is one no task of the plan has, and the value is freed after the last
    consumer's step (``last``: {step index: keys})."""
    kernels, ops = plan.kernels, plan.ops
    keep: dict = {}
    use: dict = {}
    next_key = max((t.key for t in plan.tasks), default=0) + 1
    reductions = []  # (step index, op, the join's dtype, its join space)
    for r, s in enumerate(steps):
        if s.kind != kernel_kind or None in s.task.args:
            continue
        op = ops[s.task.op]
        if kernels[s.task.op].method != "broadcast" or op.writes_diagonal:
            continue
        if op.agg_labels:
            if op.agg in ARG_AGGS or not _work(op.join) or \
                    op.join.inputs() != set(range(len(op.inputs))):
                continue
            try:
                dtype = dtype_of(op.join, op.in_dtypes or (op.dtype,) * len(op.inputs))
            except Exception:  # noqa: BLE001 - NumPy refuses it: nothing is shared
                continue
            reductions.append((r, op, dtype, op.agg_labels + op.out_labels))
            continue
        best = None  # the largest subexpression a reduction before it computed
        for src, rop, dtype, space in reductions:
            found = _find(rop, steps[src].task.args, op, s.task.args, space)
            if found is not None and (best is None or _size(found[0]) > _size(best[1][0])):
                best = (src, found, rop, dtype)
        if best is None:
            continue
        src, (sub, labels), rop, dtype = best
        if src not in keep:
            keep[src] = next_key
            next_key += 1
        n = len(op.inputs)
        alt = EinOp(op.output, op.out_labels,
                    op.inputs + (Operand(f"{rop.output}~join", labels),), op.sizes,
                    _replace(op.join, sub, Input(n)), op.agg, op.dtype,
                    (op.in_dtypes or (op.dtype,) * n) + (str(dtype),), op.backward)
        use[r] = Share(src, keep[src], alt)
    return keep, use


def _size(expr) -> int:
    return 1 + sum(_size(a) for a in expr.args) if isinstance(expr, Call) else 1


def _work(expr) -> bool:
    """Does ``expr`` make a NumPy call of its own (not only an operand times 1)?"""
    if not isinstance(expr, Call):
        return False
    if expr.fn in _SKIP:
        return _work(expr.args[0])
    if expr.fn == "*":
        for one, e in ((expr.args[1], expr.args[0]), (expr.args[0], expr.args[1])):
            if isinstance(one, Const) and type(one.value) in (int, float) and one.value == 1:
                return _work(e)
    return True


def _find(op, args, cop, cargs, space):
    """A subexpression of ``cop``'s join equal to ``op``'s whole join, each input of it the
    same tile as ``op``'s input it stands for, with the labels of each such pair of operands
    mapped one to one: (the subexpression, ``space``'s labels in ``cop``'s names); None."""
    for sub in _subexpressions(cop.join):
        if sub is cop.join:
            continue  # the whole join: the call would be a copy of the kept value
        m: dict = {}
        if not _same(op.join, sub, m):
            continue
        rho: dict = {}
        ok = True
        for j, i in m.items():
            if args[j] != cargs[i]:
                ok = False
                break
            for a, b in zip(op.inputs[j].labels, cop.inputs[i].labels):
                if rho.setdefault(a, b) != b:
                    ok = False
            if len(op.inputs[j].labels) != len(cop.inputs[i].labels):
                ok = False
        if not ok or len(set(rho.values())) != len(rho) or any(l not in rho for l in space):
            continue
        sizes, csizes = dict(op.sizes), dict(cop.sizes)
        if any(sizes[l] != csizes[rho[l]] for l in space):
            continue
        return sub, tuple(rho[l] for l in space)
    return None


def _subexpressions(expr):
    if isinstance(expr, Call):
        yield expr
        for a in expr.args:
            yield from _subexpressions(a)


def _same(a, b, m: dict) -> bool:
    """Are ``a`` and ``b`` the same expression, input ``i`` of ``a`` being input ``m[i]`` of
    ``b`` (``m`` filled in, one to one)?"""
    if isinstance(a, Input):
        if not isinstance(b, Input):
            return False
        if m.setdefault(a.index, b.index) != b.index:
            return False
        return list(m.values()).count(b.index) == 1
    if isinstance(a, Call):
        return isinstance(b, Call) and a.fn == b.fn and len(a.args) == len(b.args) and \
            all(_same(x, y, m) for x, y in zip(a.args, b.args))
    # a literal: the same type and value (a weak 1 and 1.0 differ in what they give), and
    # the same sign of a zero (0.0 == -0.0, but Z + 0.0 and Z + -0.0 differ where Z is -0.0)
    return type(a) is type(b) and type(getattr(a, "value", None)) is \
        type(getattr(b, "value", None)) and a == b and \
        _negative_zero(getattr(a, "value", None)) == _negative_zero(getattr(b, "value", None))


def _negative_zero(value) -> bool:
    return isinstance(value, (float, np.floating)) and value == 0 and \
        math.copysign(1.0, float(value)) < 0


def _replace(expr, sub, new):
    if expr is sub:
        return new
    if isinstance(expr, Call):
        return Call(expr.fn, tuple(_replace(a, sub, new) for a in expr.args))
    return expr
