"""The derivative of a JOIN (a scalar expression over input slots x0, x1, ...), symbolically:
the backward pass (plan/grad.py) multiplies it into each input's gradient.

``None`` stands for a derivative that is 0 everywhere: it is dropped, not computed. The helpers
(``add``, ``mul``, ...) simplify around 0 and 1 so that the derivative of a product stays a
product (which the kernels then run on BLAS).

>>> from tensordb.plan.scalar import parse_join, render
>>> render(derivative(parse_join("relu(x0 * x1 + 2)"), 0))
'_GT(x0 * x1 + 2, 0) * x1'
>>> render(derivative(parse_join("x0 / x1"), 1))
'-(x0 / x1 / x1)'
"""
from __future__ import annotations

import math

from ..errors import NotSupportedError
from .scalar import Call, Const, Expr, Input, Param

__all__ = ["derivative", "DIFFERENTIABLE", "add", "sub", "neg", "mul", "div", "power", "call"]

# ``None`` is a derivative that is 0 everywhere (structurally): it is dropped, not computed.

def _is(e: Expr | None, value) -> bool:
    return isinstance(e, Const) and type(e.value) in (int, float) and e.value == value


def add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return Call("+", (a, b))


def sub(a, b):
    if b is None:
        return a
    if a is None:
        return neg(b)
    return Call("-", (a, b))


def neg(a):
    if a is None:
        return None
    if isinstance(a, Const) and type(a.value) in (int, float):
        return Const(-a.value)
    if isinstance(a, Call) and a.fn == "neg":
        return a.args[0]
    return Call("neg", (a,))


def mul(a, b):
    if a is None or b is None:
        return None
    if _is(a, 1):
        return b
    if _is(b, 1):
        return a
    if _is(a, -1):
        return neg(b)
    if _is(b, -1):
        return neg(a)
    return Call("*", (a, b))


def div(a, b):
    if a is None:
        return None
    if _is(b, 1):
        return a
    return Call("/", (a, b))


def power(a, b):
    if _is(b, 1):
        return a
    return Call("pow", (a, b))


def call(name: str, *args) -> Expr:
    return Call(name, tuple(args))


def derivative(expr: Expr, k: int) -> Expr | None:
    """The partial derivative of ``expr`` with respect to input ``k`` (None: 0 everywhere).

    Conventions where the function has no derivative: RELU'(0) = 0, ABS'(0) = 0, and MAX/MIN of
    two equal values pass half of the gradient to each (as autograd and JAX do)."""
    if isinstance(expr, Input):
        return Const(1) if expr.index == k else None
    if isinstance(expr, (Const, Param)):
        return None
    if k not in expr.inputs():
        return None
    fn, args = expr.fn, expr.args
    if fn == "where":  # the branch chosen; the condition is a step (0 wherever it has one)
        da, db = derivative(args[1], k), derivative(args[2], k)
        if da is None and db is None:
            return None
        return Call("where", (args[0], Const(0) if da is None else da,
                              Const(0) if db is None else db))
    da = derivative(args[0], k)
    if len(args) == 1:
        if da is None:
            return None
        a = args[0]
        local = _UNARY.get(fn)
        if local is None:
            raise NotSupportedError(f"GRAD: the function {fn.upper()} has no derivative in "
                                    "tensordb", hint=f"functions with derivatives: "
                                    f"{', '.join(sorted(f.upper() for f in DIFFERENTIABLE))}")
        return mul(local(a, expr), da)
    a, b = args
    db = derivative(b, k)
    if fn == "+":
        return add(da, db)
    if fn == "-":
        return sub(da, db)
    if fn == "*":
        return add(mul(da, b), mul(a, db))
    if fn == "/":
        return sub(div(da, b), mul(div(div(a, b), b), db))
    if fn == "pow":
        return add(_pow_base(a, b, da), _pow_exponent(expr, a, db))
    if fn in _STEPS:  # a comparison: 0 wherever it has a derivative (the masks of a backward)
        return None
    if fn in ("max", "min"):
        win_a = call("_gt", a, b) if fn == "max" else call("_gt", b, a)
        win_b = call("_gt", b, a) if fn == "max" else call("_gt", a, b)
        tie = div(mul(call("_eq", a, b), add(da, db)), Const(2))
        return add(add(mul(win_a, da), mul(win_b, db)), tie)
    raise NotSupportedError(f"GRAD: the function {fn.upper()} has no derivative in tensordb",
                            hint=f"functions with derivatives: "
                                 f"{', '.join(sorted(f.upper() for f in DIFFERENTIABLE))}")


def _pow_base(a, b, da):
    """d(a^b)/da = b a^(b-1), and 0 where b = 0 (a^0 is 1 whatever a is; b a^(b-1) would be
    0 * inf at a = 0, and an integer a to the power -1 is an error): the exponent is
    b - 1 where b is not 0, else 1, as autograd writes it."""
    if da is None:
        return None
    if isinstance(b, Const) and type(b.value) in (int, float):
        if b.value == 0:
            return None
        return mul(mul(b, power(a, Const(b.value - 1))), da)
    exponent = add(sub(b, Const(1)), mul(Const(2), call("_eq", b, Const(0))))
    return mul(mul(b, power(a, exponent)), da)


def _pow_exponent(expr, a, db):
    """d(a^b)/db = a^b log a, and 0 where a = 0 (a^b is 0 there for every b > 0; log 0 would
    make it 0 * -inf): log is taken of 1 where a is 0, as autograd does."""
    if db is None:
        return None
    if isinstance(a, Const) and type(a.value) in (int, float):
        log_a = Const(math.log(a.value)) if a.value > 0 else \
            Const(0.0) if a.value == 0 else Call("log", (a,))
    else:
        log_a = Call("log", (add(a, call("_eq", a, Const(0))),))
    return mul(mul(expr, log_a), db)


# The backward's masks (RELU's a > 0, MAX's x == max): steps, whose derivative is 0 wherever
# it exists, so that a gradient of a gradient (GRAD of a loss written with one) goes through.
_STEPS = {"_gt", "_eq", "==", "!=", "<", "<=", ">", ">="}

# f'(a) for the unary functions, given a and f(a) (``out``, to reuse: sigmoid' = s (1 - s)).
_UNARY = {
    "neg": lambda a, out: Const(-1),
    "abs": lambda a, out: call("_sign", a),
    "relu": lambda a, out: call("_gt", a, Const(0)),
    "sqrt": lambda a, out: div(Const(0.5), out),
    "tanh": lambda a, out: sub(Const(1), mul(out, out)),
    "sigmoid": lambda a, out: mul(out, sub(Const(1), out)),
    "sin": lambda a, out: call("cos", a),
    "cos": lambda a, out: neg(call("sin", a)),
    "square": lambda a, out: mul(Const(2), a),
    "exp": lambda a, out: out,
    "log": lambda a, out: div(Const(1), a),
    "_sign": lambda a, out: None,
    "_stop": lambda a, out: None,
}
DIFFERENTIABLE = {f for f in _UNARY if not f.startswith("_")} | \
    {"+", "-", "*", "/", "pow", "max", "min", "where"} | (_STEPS - {"_gt", "_eq"})
