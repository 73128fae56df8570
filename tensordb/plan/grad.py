"""Reverse-mode differentiation of an EinGraph: the backward operations are extended einsums too.

For an operation ``out[o] = AGG over a of J(x0[l0], ..., xn[ln])`` and the gradient ``g[o]`` of
the loss with respect to ``out``, the gradient of input k is

    d_xk[lk] = SUM over the labels not in lk of  g[o] * w * dJ/dxk(x0, ..., xn)

where ``dJ/dxk`` is the partial derivative of the join, built symbolically from its scalar tree
(``derivative``), and ``w`` the derivative of the aggregate with respect to one element:

- SUM (or no aggregate): 1;
- MAX, MIN: ``(J == out) / count``, ``count[o] = SUM over a of (J == out)``: the gradient is split
  evenly between tied elements (as autograd and JAX do);
- PROD: ``out / J`` where J is not 0; where J is 0, the product of the other elements if J is the
  only 0 of its group, else 0 (``zeros[o]`` counts the zeros, ``nonzero[o]`` multiplies the
  elements that are not 0).

A label of ``lk`` that no other operand of the backward operation has is broadcast (``xk ** 0``
brings it in: 1 even where xk is NaN or inf); an aggregated label that no operand has counts its
size. A tensor read by several operations (or several times by one) gets the SUM of the
contributions; a tensor the loss does not depend on gets zeros. The gradient of a tensor read
with a repeated label (a diagonal, ``M[i,i]``) is the same einsum with the repeated label in its
output: it writes the diagonal, ``dM[i,j] = [i == j] g[i]``, and is 0 elsewhere (plan/ir.py).

The backward operations read the forward values they need (the operations' inputs and, for MAX,
MIN and PROD, their outputs) as any operation reads an earlier one's output: they are planned with
the forward ones in one EinGraph and each temporary is freed after its last reader has run. Every
backward operation carries ``backward=True`` (EXPLAIN marks it).

>>> from tensordb.plan.ir import EinOp
>>> from tensordb.plan.scalar import parse_join, render
>>> render(derivative(parse_join("relu(x0 * x1 + 2)"), 0))
'_GT(x0 * x1 + 2, 0) * x1'
>>> fwd = [EinOp.contraction("L", "", [("A", "ij"), ("B", "j")], {"i": 2, "j": 3})]
>>> ops = backward(fwd, {"A": ((2, 3), "float64"), "B": ((3,), "float64")}, "L", [("A", "dA")])
>>> [op.describe() for op in ops]
['backward dA[i,j] = B[j] * POW(A[i,j], 0)']
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..errors import BinderError
from .derivative import add, call, derivative, div, mul, power, sub
from .aggregates import ARG_AGGS
from .ir import EinOp, Operand
from .names import TensorRef
from .scalar import Call, Const, Expr, Input, Param, dtype_of

__all__ = ["derivative", "backward"]


# -- the backward operations --------------------------------------------------------------------

def _subst(expr: Expr, slot_of) -> Expr:
    """``expr`` with input i replaced by ``slot_of(i)``."""
    if isinstance(expr, Input):
        return slot_of(expr.index)
    if isinstance(expr, (Const, Param)):
        return expr
    return Call(expr.fn, tuple(_subst(a, slot_of) for a in expr.args))


class _Slots:
    """The operands of one backward operation, each (tensor, labels) once."""

    def __init__(self) -> None:
        self.items: list[tuple[str, tuple[str, ...]]] = []

    def __call__(self, tensor: str, labels) -> Input:
        key = (tensor, tuple(labels))
        if key not in self.items:
            self.items.append(key)
        return Input(self.items.index(key))

    def labels(self) -> set[str]:
        return {l for _, ls in self.items for l in ls}


def backward(ops: Sequence[EinOp], stored: Mapping[str, tuple[tuple[int, ...], str]], loss: str,
             wrt: Sequence[tuple[str, str]], pass_no: int = 1,
             fills: Mapping[str, float] | None = None) -> list[EinOp]:
    """The backward operations of the forward operations ``ops`` (in order) for the scalar
    ``loss`` (an output of one of them): for every ``(tensor, into)`` of ``wrt``, operations
    ending in one named ``into``, of the tensor's shape and dtype, holding d loss / d tensor.
    ``stored`` gives the shape and dtype of the stored tensors the operations read.
    ``pass_no``: the how-manieth backward pass of ``loss`` in its graph (the names of a later
    one's tensors are ``d<loss>(n)/d<t>``, apart from the first's ``d<loss>/d<t>``).
    ``fills``: the stored tensors whose fill value is not 0 (plan/fills.py), by name: the
    gradient of such a tensor is taken on its stored entries only (``_on_entries``)."""
    return _Backward(ops, stored, loss, pass_no, fills).run(wrt)


class _Backward:
    """One backward pass. A gradient is a tensor's name, a ``Const`` (the same value at every
    element, known without computing anything: the seed d loss / d loss = 1, and what constant
    factors and sums make of it), or None (0: nothing reached the tensor)."""

    def __init__(self, ops: Sequence[EinOp], stored, loss: str, pass_no: int = 1,
                 fills: Mapping[str, float] | None = None) -> None:
        self.fwd = list(ops)
        self.fills = {t: float(f) for t, f in (fills or {}).items() if f}
        self.producer = {op.output: op for op in self.fwd}
        self.stored = dict(stored)
        self.loss = loss
        self.d = f"d{loss}" if pass_no == 1 else f"d{loss}({pass_no})"  # names' prefix
        if loss not in self.producer:
            raise BinderError(f"GRAD: the loss '{loss}' is not computed by this graph")
        if self.producer[loss].out_shape != ():
            raise BinderError(f"GRAD: the loss '{loss}' is not a scalar: it has shape "
                              f"{self.producer[loss].out_shape}")
        self.ops: list[EinOp] = []
        self.parts: dict[str, list] = {}        # tensor -> its gradient's contributions
        self.total: dict[str, object] = {}      # tensor -> its gradient
        self.helpers: dict[tuple[str, str], str] = {}
        self.counter: dict[str, int] = {}
        self.count: dict[str, int] = {}         # tensor -> contributions it will get
        self.first_into: dict[str, str] = {}    # wrt tensor -> the name of its gradient

    # -- tensors -------------------------------------------------------------------------------
    def shape(self, t: str) -> tuple[int, ...]:
        op = self.producer.get(t)
        return op.out_shape if op is not None else tuple(self.stored[t][0])

    def dtype(self, t: str) -> str:
        if t in self.producer:
            return self.producer[t].dtype
        if t in self.stored:
            return np.dtype(self.stored[t][1]).name
        return next(op.dtype for op in self.ops if op.output == t)

    def _float(self, t: str) -> str:
        d = np.dtype(self.dtype(t))
        return d.name if d.kind == "f" else "float64"

    def name(self, t: str, part: bool = True) -> TensorRef:
        """``d<loss>/d<t>``: the gradient of t; ``d<loss>/d<t>#n``: its n-th contribution (a
        later pass of the loss: ``d<loss>(n)/d<t>``)."""
        base = f"{self.d}/d{t}"
        if not part or self.count.get(t, 0) <= 1:
            return TensorRef(base)
        n = self.counter[base] = self.counter.get(base, 0) + 1
        return TensorRef(f"{base}#{n}")

    def emit(self, name, out_labels, slots: _Slots, join: Expr, sizes: Mapping[str, int],
             agg: str = "sum", dtype: str | None = None) -> str:
        in_dtypes = [self.dtype(t) for t, _ in slots.items]
        if dtype is None:
            dtype = dtype_of(join, in_dtypes).name
            if np.dtype(dtype).kind != "f":
                floats = [d for d in in_dtypes if np.dtype(d).kind == "f"]
                dtype = np.result_type(*floats).name if floats else "float64"
        used = slots.labels() | set(out_labels)
        op = EinOp(name, tuple(out_labels), tuple(Operand(t, ls) for t, ls in slots.items),
                   tuple((l, sizes[l]) for l in sizes if l in used), join, agg, dtype,
                   tuple(in_dtypes), backward=True)
        self.ops.append(op)
        return op.output

    # -- the pass ------------------------------------------------------------------------------
    def run(self, wrt: Sequence[tuple[str, str]]) -> list[EinOp]:
        targets = {t for t, _ in wrt}
        ancestors = {self.loss}
        for op in reversed(self.fwd):
            if op.output in ancestors:
                ancestors.update(o.tensor for o in op.inputs)
        depends = set(targets)
        for op in self.fwd:
            if any(o.tensor in depends for o in op.inputs):
                depends.add(op.output)
        active = ancestors & depends
        # One contribution per operation and distinct operand (tensor and labels) of an active
        # tensor: a wrt tensor with one is computed under its result's name straight away.
        groups: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for op in self.fwd:
            if op.output in active:
                by_operand: dict[tuple, list[int]] = {}
                for k, o in enumerate(op.inputs):
                    if o.tensor in active:
                        by_operand.setdefault((o.tensor, o.labels), []).append(k)
                groups[op.output] = list(by_operand.items())
                for (t, _), _ in groups[op.output]:
                    self.count[t] = self.count.get(t, 0) + 1
        for t, into in wrt:
            self.first_into.setdefault(t, into)
        self.parts[self.loss] = [Const(1)]  # the seed: d loss / d loss = 1
        for op in reversed(self.fwd):
            if op.output not in active or not self.parts.get(op.output):
                continue
            g = self.gradient(op.output)
            for (t, _), ks in groups[op.output]:
                part = self.input_grad(op, ks, g)
                if part is not None:
                    self.parts.setdefault(t, []).append(part)
        done: dict[str, str] = {}
        for t, into in wrt:
            g = self.gradient(t) if t not in done else done[t]
            if g is None or isinstance(g, Const):
                self.constant(t, into, 0 if g is None else g.value)
            elif g != into:
                self.copy(g, t, into)
            done[t] = into
        return self.ops

    def gradient(self, t: str):
        """The gradient of ``t``: its one contribution, a constant, or the SUM of its
        contributions (an operation); None when nothing reached it."""
        if t in self.total:
            return self.total[t]
        parts = self.parts.get(t) or []
        consts = [p.value for p in parts if isinstance(p, Const)]
        names = [p for p in parts if not isinstance(p, Const)]
        c = sum(consts) if consts else None
        if not names:
            self.total[t] = None if c is None else Const(c)
        elif len(names) == 1 and c is None:
            self.total[t] = names[0]
        else:
            labels = tuple(f"d{i}" for i in range(len(self.shape(t))))
            slots = _Slots()
            join = slots(names[0], labels)
            for p in names[1:]:
                join = Call("+", (join, slots(p, labels)))
            if c is not None:
                join = Call("+", (join, Const(c)))
            into = self.first_into.get(t)
            name = TensorRef.of(into) if into is not None else self.name(t, part=False)
            self.total[t] = self.emit(name, labels, slots, join,
                                      dict(zip(labels, self.shape(t))),
                                      dtype=self._float(t) if into is not None else None)
        return self.total[t]

    def constant(self, t: str, into: str, value) -> None:
        """``into``, of t's shape, holding ``value`` everywhere (``t ** 0`` is 1 even where t is
        NaN or inf, so 0 stays 0)."""
        labels = tuple(f"d{i}" for i in range(len(self.shape(t))))
        slots = _Slots()
        join = mul(Const(value), Call("pow", (slots(t, labels), Const(0))))
        join = self._on_entries(join, slots, t, labels)
        self.emit(TensorRef.of(into), labels, slots, join, dict(zip(labels, self.shape(t))),
                  dtype=self._float(t))

    def copy(self, source: str, t: str, into: str) -> None:
        labels = tuple(f"d{i}" for i in range(len(self.shape(t))))
        slots = _Slots()
        self.emit(TensorRef.of(into), labels, slots, slots(source, labels),
                  dict(zip(labels, self.shape(t))), dtype=self._float(t))

    # -- one operand of one operation ----------------------------------------------------------
    def input_grad(self, op: EinOp, ks: Sequence[int], g):
        """The contribution of ``op`` to the gradient of its operand ``ks`` (the input slots
        reading one tensor with the same labels): a new operation's name, or a constant."""
        operand = op.inputs[ks[0]]
        t, lk = operand.tensor, operand.labels
        if op.agg in ARG_AGGS and op.agg_labels:  # an index: constant where it has a derivative
            return None
        d = None
        for k in ks:
            d = add(d, derivative(op.join, k))
        if d is None:
            return None
        slots = _Slots()

        def slot_of(i):
            return slots(op.inputs[i].tensor, op.inputs[i].labels)
        local = _subst(d, slot_of)
        o = op.out_labels
        grad = g if isinstance(g, Const) else slots(g, o)
        agg = op.agg if op.agg_labels else None
        if agg in ("max", "min", "prod"):
            join = _subst(op.join, slot_of)
        if agg in ("max", "min"):
            out = slots(op.output, o)
            count = slots(self.helper(op, "count"), o)
            weight = div(call("_eq", join, out), count)
        elif agg == "prod":
            out = slots(op.output, o)
            zeros = slots(self.helper(op, "zeros"), o)
            nonzero = slots(self.helper(op, "nonzero"), o)
            m = call("_eq", join, Const(0))
            weight = add(mul(sub(Const(1), m), div(out, add(join, m))),
                          mul(mul(m, call("_eq", zeros, Const(1))), nonzero))
        else:
            weight = Const(1)
        expr = mul(mul(grad, weight), local)
        size = op.size
        extra = math.prod(size[l] for l in op.labels if l not in slots.labels() and l not in lk)
        if extra != 1:
            expr = mul(expr, Const(extra))
        if not slots.items and len(set(lk)) == len(lk):  # the same value at every element
            value = _const_value(expr)  # (a diagonal read gets it on its diagonal only)
            if value is not None:
                return Const(value)
        if [l for l in lk if l not in slots.labels()] or not slots.items:
            expr = mul(expr, power(slots(t, lk), Const(0)))
        expr = self._on_entries(expr, slots, t, lk)
        into = self.first_into.get(t)
        if into is not None and self.count.get(t) == 1:
            return self.emit(TensorRef.of(into), lk, slots, expr, size, dtype=self._float(t))
        return self.emit(self.name(t), lk, slots, expr, size)

    def _on_entries(self, expr: Expr, slots: _Slots, t: str, labels) -> Expr:
        """``expr``, a contribution to the gradient of ``t``, kept only at t's stored entries
        when t is a stored tensor whose fill f is not 0 (``WHERE(t != f, expr, 0)``): its
        absent entries are its structure (a graph's missing edges at +inf), not parameters, so
        their gradient is 0, and the gradient is sparse on t's entries (fill 0). At a stored
        entry it is the gradient numpy's rules give (MIN's: split between the entries equal to
        the minimum). A stored entry never equals the fill (the writer leaves those out)."""
        f = self.fills.get(t)
        if not f:
            return expr
        return call("where", call("!=", slots(t, labels), Const(f)), expr, Const(0))

    def helper(self, op: EinOp, kind: str) -> str:
        """``count`` (MAX/MIN: the elements equal to the result), ``zeros`` and ``nonzero``
        (PROD: the zeros, and the product of the other elements) of ``op``'s groups."""
        key = (op.output, kind)
        if key in self.helpers:
            return self.helpers[key]
        slots = _Slots()
        join = _subst(op.join, lambda i: slots(op.inputs[i].tensor, op.inputs[i].labels))
        if kind == "count":
            body = call("_eq", join, slots(op.output, op.out_labels))
            agg = "sum"
        elif kind == "zeros":
            body, agg = call("_eq", join, Const(0)), "sum"
        else:
            body, agg = Call("+", (join, call("_eq", join, Const(0)))), "prod"
        # named for its pass, as the gradients are: two losses of one graph may share a MAX
        name = self.emit(TensorRef(f"{self.d}:{kind}({op.output})"), op.out_labels, slots,
                         body, op.size, agg=agg,
                         dtype=op.dtype if np.dtype(op.dtype).kind == "f" else "float64")
        self.helpers[key] = name
        return name


def _const_value(expr: Expr):
    """The value of an expression of literals only (Python arithmetic), else None."""
    if isinstance(expr, Const):
        return expr.value if type(expr.value) in (int, float) else None
    if isinstance(expr, Call) and expr.fn in ("*", "/", "+", "-", "neg"):
        vals = [_const_value(a) for a in expr.args]
        if any(v is None for v in vals):
            return None
        try:
            if expr.fn == "neg":
                return -vals[0]
            a, b = vals
            return {"*": a * b, "+": a + b, "-": a - b}[expr.fn] if expr.fn != "/" else a / b
        except ZeroDivisionError:
            return None
    return None
