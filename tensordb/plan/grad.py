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
with a repeated label (a diagonal, ``X[i,i]``) would need an identity tensor the IR cannot make:
it is refused with a NotSupportedError.

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

from ..errors import BinderError, NotSupportedError
from .ir import EinOp, Operand
from .names import TensorRef
from .scalar import Call, Const, Expr, Input, dtype_of

__all__ = ["derivative", "backward"]


# -- the derivative of a join -------------------------------------------------------------------
# ``None`` is a derivative that is 0 everywhere (structurally): it is dropped, not computed.

def _is(e: Expr | None, value) -> bool:
    return isinstance(e, Const) and type(e.value) in (int, float) and e.value == value


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return Call("+", (a, b))


def _sub(a, b):
    if b is None:
        return a
    if a is None:
        return _neg(b)
    return Call("-", (a, b))


def _neg(a):
    if a is None:
        return None
    if isinstance(a, Const) and type(a.value) in (int, float):
        return Const(-a.value)
    if isinstance(a, Call) and a.fn == "neg":
        return a.args[0]
    return Call("neg", (a,))


def _mul(a, b):
    if a is None or b is None:
        return None
    if _is(a, 1):
        return b
    if _is(b, 1):
        return a
    if _is(a, -1):
        return _neg(b)
    if _is(b, -1):
        return _neg(a)
    return Call("*", (a, b))


def _div(a, b):
    if a is None:
        return None
    if _is(b, 1):
        return a
    return Call("/", (a, b))


def _pow(a, b):
    if _is(b, 1):
        return a
    return Call("pow", (a, b))


def _fn(name: str, *args) -> Expr:
    return Call(name, tuple(args))


def derivative(expr: Expr, k: int) -> Expr | None:
    """The partial derivative of ``expr`` with respect to input ``k`` (None: 0 everywhere).

    Conventions where the function has no derivative: RELU'(0) = 0, ABS'(0) = 0, and MAX/MIN of
    two equal values pass half of the gradient to each (as autograd and JAX do)."""
    if isinstance(expr, Input):
        return Const(1) if expr.index == k else None
    if isinstance(expr, Const):
        return None
    if k not in expr.inputs():
        return None
    fn, args = expr.fn, expr.args
    da = derivative(args[0], k)
    if len(args) == 1:
        if da is None:
            return None
        a = args[0]
        local = _UNARY.get(fn)
        if local is None:
            raise NotSupportedError(f"GRAD: the function {fn.upper()} has no derivative in "
                                    "tensordb", hint=f"functions with derivatives: "
                                    f"{', '.join(sorted(f.upper() for f in _DIFFERENTIABLE))}")
        return _mul(local(a, expr), da)
    a, b = args
    db = derivative(b, k)
    if fn == "+":
        return _add(da, db)
    if fn == "-":
        return _sub(da, db)
    if fn == "*":
        return _add(_mul(da, b), _mul(a, db))
    if fn == "/":
        return _sub(_div(da, b), _mul(_div(_div(a, b), b), db))
    if fn == "pow":
        first = None
        if da is not None:
            if isinstance(b, Const) and type(b.value) in (int, float):
                first = _mul(_mul(b, _pow(a, Const(b.value - 1))), da)
            else:
                first = _mul(_mul(b, _pow(a, _sub(b, Const(1)))), da)
        second = None
        if db is not None:
            if isinstance(a, Const) and type(a.value) in (int, float):
                log_a = Const(math.log(a.value)) if a.value > 0 else Call("log", (a,))
            else:
                log_a = Call("log", (a,))
            second = _mul(_mul(expr, log_a), db)
        return _add(first, second)
    if fn in ("max", "min"):
        win_a = _fn("_gt", a, b) if fn == "max" else _fn("_gt", b, a)
        win_b = _fn("_gt", b, a) if fn == "max" else _fn("_gt", a, b)
        tie = _div(_mul(_fn("_eq", a, b), _add(da, db)), Const(2))
        return _add(_add(_mul(win_a, da), _mul(win_b, db)), tie)
    raise NotSupportedError(f"GRAD: the function {fn.upper()} has no derivative in tensordb",
                            hint=f"functions with derivatives: "
                                 f"{', '.join(sorted(f.upper() for f in _DIFFERENTIABLE))}")


# f'(a) for the unary functions, given a and f(a) (``out``, to reuse: sigmoid' = s (1 - s)).
_UNARY = {
    "neg": lambda a, out: Const(-1),
    "abs": lambda a, out: _fn("_sign", a),
    "relu": lambda a, out: _fn("_gt", a, Const(0)),
    "sqrt": lambda a, out: _div(Const(0.5), out),
    "tanh": lambda a, out: _sub(Const(1), _mul(out, out)),
    "sigmoid": lambda a, out: _mul(out, _sub(Const(1), out)),
    "sin": lambda a, out: _fn("cos", a),
    "cos": lambda a, out: _neg(_fn("sin", a)),
    "square": lambda a, out: _mul(Const(2), a),
    "exp": lambda a, out: out,
    "log": lambda a, out: _div(Const(1), a),
    "_sign": lambda a, out: None,
}
_DIFFERENTIABLE = {f for f in _UNARY if not f.startswith("_")} | \
    {"+", "-", "*", "/", "pow", "max", "min"}


# -- the backward operations --------------------------------------------------------------------

def _subst(expr: Expr, slot_of) -> Expr:
    """``expr`` with input i replaced by ``slot_of(i)``."""
    if isinstance(expr, Input):
        return slot_of(expr.index)
    if isinstance(expr, Const):
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
             wrt: Sequence[tuple[str, str]]) -> list[EinOp]:
    """The backward operations of the forward operations ``ops`` (in order) for the scalar
    ``loss`` (an output of one of them): for every ``(tensor, into)`` of ``wrt``, operations
    ending in one named ``into``, of the tensor's shape and dtype, holding d loss / d tensor.
    ``stored`` gives the shape and dtype of the stored tensors the operations read."""
    return _Backward(ops, stored, loss).run(wrt)


class _Backward:
    def __init__(self, ops: Sequence[EinOp], stored, loss: str) -> None:
        self.fwd = list(ops)
        self.producer = {op.output: op for op in self.fwd}
        self.stored = dict(stored)
        self.loss = loss
        if loss not in self.producer:
            raise BinderError(f"GRAD: the loss '{loss}' is not computed by this graph")
        if self.producer[loss].out_shape != ():
            raise BinderError(f"GRAD: the loss '{loss}' is not a scalar: it has shape "
                              f"{self.producer[loss].out_shape}")
        self.ops: list[EinOp] = []
        self.parts: dict[str, list[str]] = {}   # tensor -> its gradient's contributions
        self.total: dict[str, str | None] = {}  # tensor -> its gradient (None: the seed, 1)
        self.helpers: dict[tuple[str, str], str] = {}
        self.counter: dict[str, int] = {}

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

    def name(self, t: str, part: bool = True) -> TensorRef:
        base = f"d{self.loss}/d{t}"
        if not part:
            return TensorRef(base)
        n = self.counter[base] = self.counter.get(base, 0) + 1
        return TensorRef(base, temp=n)

    def emit(self, name, out_labels, slots: _Slots, join: Expr, sizes: Mapping[str, int],
             agg: str = "sum", dtype: str | None = None) -> str:
        in_dtypes = [self.dtype(t) for t, _ in slots.items]
        if dtype is None:
            dtype = dtype_of(join, in_dtypes).name
            if np.dtype(dtype).kind != "f":
                dtype = np.result_type(*[d for d in in_dtypes if np.dtype(d).kind == "f"],
                                       np.float64 if not in_dtypes else in_dtypes[0]).name
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
        # How many contributions each tensor gets: a wrt tensor with one is computed under its
        # result's name straight away.
        count: dict[str, int] = {}
        for op in self.fwd:
            if op.output in active:
                for o in op.inputs:
                    if o.tensor in active:
                        count[o.tensor] = count.get(o.tensor, 0) + 1
        first_into = {}
        for t, into in wrt:
            first_into.setdefault(t, into)
        self.first_into = first_into
        self.count = count
        self.parts[self.loss] = []
        self.total[self.loss] = None  # the seed: d loss / d loss = 1
        for op in reversed(self.fwd):
            if op.output not in active or op.output not in self.parts:
                continue
            g = self.gradient(op.output)
            for k, o in enumerate(op.inputs):
                if o.tensor in active:
                    part = self.input_grad(op, k, g)
                    if part is not None:
                        self.parts.setdefault(o.tensor, []).append(part)
        done: dict[str, str] = {}
        for t, into in wrt:
            if t in done:  # the same tensor twice: a copy
                self.copy(done[t], t, into)
                continue
            g = self.gradient(t) if t in self.parts else "zeros"
            if g == "zeros":
                self.zeros(t, into)
            elif g is None:
                self.ones(t, into)
            elif g != into:
                self.copy(g, t, into)
            done[t] = into
        return self.ops

    def gradient(self, t: str) -> str | None:
        """The name of the gradient of ``t``: its one contribution, or their SUM (an operation);
        None for the loss itself (the seed); "zeros" when nothing reached it."""
        if t in self.total:
            return self.total[t]
        parts = self.parts.get(t) or []
        if not parts:
            self.total[t] = "zeros"
            return "zeros"
        if len(parts) == 1:
            self.total[t] = parts[0]
            return parts[0]
        labels = tuple(f"d{i}" for i in range(len(self.shape(t))))
        slots = _Slots()
        join = slots(parts[0], labels)
        for p in parts[1:]:
            join = Call("+", (join, slots(p, labels)))
        into = self.first_into.get(t)
        name = TensorRef.of(into) if into is not None else self.name(t, part=False)
        dtype = self.dtype(t) if into is not None else None
        self.total[t] = self.emit(name, labels, slots, join, dict(zip(labels, self.shape(t))),
                                  dtype=dtype)
        return self.total[t]

    def zeros(self, t: str, into: str) -> None:
        labels = tuple(f"d{i}" for i in range(len(self.shape(t))))
        slots = _Slots()
        join = Call("*", (Const(0), Call("pow", (slots(t, labels), Const(0)))))
        self.emit(TensorRef.of(into), labels, slots, join, dict(zip(labels, self.shape(t))),
                  dtype=self._float(t))

    def ones(self, t: str, into: str) -> None:
        slots = _Slots()
        self.emit(TensorRef.of(into), (), slots, Call("pow", (slots(t, ()), Const(0))), {},
                  dtype=self._float(t))

    def copy(self, source: str, t: str, into: str) -> None:
        labels = tuple(f"d{i}" for i in range(len(self.shape(t))))
        slots = _Slots()
        self.emit(TensorRef.of(into), labels, slots, slots(source, labels),
                  dict(zip(labels, self.shape(t))), dtype=self._float(t))

    def _float(self, t: str) -> str:
        d = np.dtype(self.dtype(t))
        return d.name if d.kind == "f" else "float64"

    # -- one input of one operation ------------------------------------------------------------
    def input_grad(self, op: EinOp, k: int, g: str | None) -> str | None:
        lk = op.inputs[k].labels
        if len(set(lk)) != len(lk):
            raise NotSupportedError(
                f"GRAD through {op.inputs[k].tensor}[{','.join(lk)}], read with a repeated label "
                f"(a diagonal) in {op.describe()}: its gradient would need an identity tensor",
                hint="compute the diagonal as a tensor of its own outside the differentiated "
                     "part, or write the computation without a repeated label")
        d = derivative(op.join, k)
        if d is None:
            return None
        slots = _Slots()
        def slot_of(i):
            return slots(op.inputs[i].tensor, op.inputs[i].labels)
        local = _subst(d, slot_of)
        o = op.out_labels
        grad = Const(1) if g is None else slots(g, o)
        agg = op.agg if op.agg_labels else None
        if agg in ("max", "min", "prod"):
            join = _subst(op.join, slot_of)
        if agg in ("max", "min"):
            out = slots(op.output, o)
            count = slots(self.helper(op, "count"), o)
            weight = _div(_fn("_eq", join, out), count)
        elif agg == "prod":
            out = slots(op.output, o)
            zeros = slots(self.helper(op, "zeros"), o)
            nonzero = slots(self.helper(op, "nonzero"), o)
            m = _fn("_eq", join, Const(0))
            weight = _add(_mul(_sub(Const(1), m), _div(out, _add(join, m))),
                          _mul(_mul(m, _fn("_eq", zeros, Const(1))), nonzero))
        else:
            weight = Const(1)
        expr = _mul(_mul(grad, weight), local)
        if expr is None:
            return None
        missing = [l for l in lk if l not in slots.labels()]
        if missing or not slots.items:
            expr = _mul(expr, _pow(slots(op.inputs[k].tensor, lk), Const(0)))
        covered = slots.labels()
        size = op.size
        extra = math.prod(size[l] for l in op.labels if l not in covered and l not in lk)
        if extra != 1:
            expr = _mul(expr, Const(extra))
        t = op.inputs[k].tensor
        into = self.first_into.get(t)
        if into is not None and self.count.get(t) == 1:
            return self.emit(TensorRef.of(into), lk, slots, expr, size, dtype=self._float(t))
        return self.emit(self.name(t), lk, slots, expr, size)

    def helper(self, op: EinOp, kind: str) -> str:
        """``count`` (MAX/MIN: the elements equal to the result), ``zeros`` and ``nonzero``
        (PROD: the zeros, and the product of the other elements) of ``op``'s groups."""
        key = (op.output, kind)
        if key in self.helpers:
            return self.helpers[key]
        slots = _Slots()
        join = _subst(op.join, lambda i: slots(op.inputs[i].tensor, op.inputs[i].labels))
        if kind == "count":
            body = _fn("_eq", join, slots(op.output, op.out_labels))
            agg = "sum"
        elif kind == "zeros":
            body, agg = _fn("_eq", join, Const(0)), "sum"
        else:
            body, agg = Call("+", (join, _fn("_eq", join, Const(0)))), "prod"
        name = self.emit(self.name(op.output), op.out_labels, slots, body, op.size, agg=agg,
                         dtype=op.dtype if np.dtype(op.dtype).kind == "f" else "float64")
        self.helpers[key] = name
        return name
