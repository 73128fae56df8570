"""Which kernel calls may be skipped. An absent tile is zeros, and skipping a kernel call is right only when the call's result is
certainly 0: ``0 * x`` is 0 only where x is finite (0 * inf is NaN) and ``0 / x`` only where x
holds no 0 and no NaN. The facts about inputs come per tile from the catalog (present; nonfinite;
nnz), so the same three-valued analysis is written once and evaluated either on Python booleans
(the optimizer, and which inputs gate the join) or as SQL over the tile join (each call: its SQL
is physical/tilejoin.py's).
Finite inputs can still overflow (1e200 * 1e200 is inf), so only functions that cannot make a
finite value infinite keep ``finite``; everything else is treated as possibly non-finite.
"""
from __future__ import annotations

import numpy as np

from .scalar import COMPARISONS, FUNCTIONS, Const, Expr, Input, Param

__all__ = ["zero_when_absent", "certainly_zero"]

_KEEPS_FINITE = {"neg", "abs", "relu", "tanh", "sin", "cos", "sigmoid", "max", "min", "_stop"}
_KEEPS_NONZERO = {"neg", "abs"}
_FALSE_ON_EQUAL = {"!=", "<", ">"}  # comparisons that are false (0) where both sides are 0


class _Bool:
    """The analysis on Python booleans (physical/tilejoin.py has its SQL flavour: the same
    attributes, on SQL text)."""

    true, false = True, False

    @staticmethod
    def const(value: bool) -> bool:
        return bool(value)

    @staticmethod
    def and_(a: bool, b: bool) -> bool:
        return a and b

    @staticmethod
    def or_(a: bool, b: bool) -> bool:
        return a or b


# A weak literal takes the dtype of the array it meets: next to float32, 1e300 is inf and 1e-50
# is 0. The analysis knows no dtypes, so a literal is finite (or nonzero) only if it is in float32.
_F32 = np.finfo(np.float32)


def _finite_in_float32(value) -> bool:
    if isinstance(value, int):  # exact: a Python int may be too large for any float
        return abs(value) <= float(_F32.max)
    return bool(np.isfinite(value)) and abs(value) <= float(_F32.max)


def _finite(expr: Expr, L, facts):
    """Certainly free of NaN and inf."""
    if isinstance(expr, Input):
        return facts[1](expr.index)
    if isinstance(expr, Param):  # a value not known when planning
        return L.false
    if isinstance(expr, Const):
        return L.const(_finite_in_float32(expr.value))
    a = expr.args
    if expr.fn in COMPARISONS:  # a bool
        return L.true
    if expr.fn == "where":
        return L.and_(_finite(a[1], L, facts), _finite(a[2], L, facts))
    if expr.fn in _KEEPS_FINITE:
        out = _finite(a[0], L, facts)
        return L.and_(out, _finite(a[1], L, facts)) if len(a) == 2 else out
    # Scaling by at most 1 in magnitude cannot overflow: c * x, x * c, x / c.
    if expr.fn == "*" and isinstance(a[0], Const) and abs(a[0].value) <= 1:
        return _finite(a[1], L, facts)
    if expr.fn == "*" and isinstance(a[1], Const) and abs(a[1].value) <= 1:
        return _finite(a[0], L, facts)
    if expr.fn == "/" and isinstance(a[1], Const) and abs(a[1].value) >= 1:
        return _finite(a[0], L, facts)
    return L.false


def _nonzero(expr: Expr, L, facts):
    """Certainly free of 0 and NaN (a divisor that keeps ``0 / x`` at 0)."""
    if isinstance(expr, Input):
        return facts[2](expr.index)
    if isinstance(expr, Param):
        return L.false
    if isinstance(expr, Const):
        v = expr.value
        return L.const(v != 0 and not np.isnan(v) and abs(v) >= float(_F32.tiny))  # not cast to f32
    if expr.fn in _KEEPS_NONZERO:
        return _nonzero(expr.args[0], L, facts)
    return L.false


def certainly_zero(expr: Expr, L, facts):
    """Certainly 0 everywhere, in the booleans of ``L`` (``_Bool``, or SQL text), given
    ``facts``: per input, callables for (its tile is absent, it holds no NaN/inf, it holds no 0
    and no NaN)."""
    if isinstance(expr, Input):
        return facts[0](expr.index)
    if isinstance(expr, Param):
        return L.false
    if isinstance(expr, Const):
        return L.const(expr.value == 0)
    a = expr.args
    if expr.fn == "*":
        return L.or_(L.and_(certainly_zero(a[0], L, facts), _finite(a[1], L, facts)),
                     L.and_(certainly_zero(a[1], L, facts), _finite(a[0], L, facts)))
    if expr.fn == "/":
        return L.and_(certainly_zero(a[0], L, facts), _nonzero(a[1], L, facts))
    if expr.fn in ("+", "-", "max", "min") or expr.fn in _FALSE_ON_EQUAL:
        return L.and_(certainly_zero(a[0], L, facts), certainly_zero(a[1], L, facts))
    if expr.fn in COMPARISONS:  # 0 == 0 is true
        return L.false
    if expr.fn == "where":  # both branches 0, or the condition certainly false and ELSE 0
        return L.and_(certainly_zero(a[2], L, facts),
                      L.or_(certainly_zero(a[1], L, facts), certainly_zero(a[0], L, facts)))
    if expr.fn == "pow":  # 0 ** c is 0 for c > 0 only (1 for c = 0, inf below)
        positive = isinstance(a[1], Const) and a[1].value > 0
        return L.and_(certainly_zero(a[0], L, facts), L.const(positive))
    if FUNCTIONS[expr.fn].zero_preserving:
        return certainly_zero(a[0], L, facts)
    return L.false


def zero_when_absent(expr: Expr, absent, finite=(), nonzero=()) -> bool:
    """True when ``expr`` is certainly 0 wherever the inputs in ``absent`` are 0, given that the
    inputs in ``finite`` hold no NaN or inf and those in ``nonzero`` hold no 0 and no NaN.

    >>> from tensordb.plan.scalar import parse_join
    >>> zero_when_absent(parse_join("x0 * x1"), {0}), zero_when_absent(parse_join("x0 * x1"), {0}, {1})
    (False, True)
    >>> zero_when_absent(parse_join("x0 / x1"), {0}, {1}, {1}), zero_when_absent(parse_join("exp(x0)"), {0})
    (True, False)
    """
    absent, finite, nonzero = set(absent), set(finite), set(nonzero)
    facts = (lambda k: k in absent, lambda k: k in absent or k in finite,
             lambda k: k not in absent and k in nonzero)
    return certainly_zero(expr, _Bool, facts)
