"""Scalar expressions: the JOIN of an extended einsum, over input slots x0..x{n-1}.

An expression is a small frozen tree. It is evaluated elementwise (with broadcasting) on tiles, and
analysed symbolically to know which absent (all-zero) input tiles make a kernel call unnecessary.

>>> e = parse_join("relu(x0 * x1 + 2)")
>>> e
Call(fn='relu', args=(Call(fn='+', args=(Call(fn='*', args=(Input(index=0), Input(index=1))), Const(value=2))),))
>>> sorted(e.inputs())
[0, 1]
"""
from __future__ import annotations

import ast
import math
import operator
import warnings
from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np

from ..errors import BinderError

__all__ = ["Expr", "Input", "Const", "Param", "Call", "FUNCTIONS", "COMPARISONS", "parse_join", "product",
           "product_of", "product_factors",
           "evaluate", "render", "fold", "dtype_of",
           "uniform_dtype"]


@dataclass(frozen=True)
class Input:
    """The value of input ``index`` at the current join index."""

    index: int

    def inputs(self) -> set[int]:
        return inputs_of(self)


@dataclass(frozen=True, eq=False)
class Const:
    """A literal. A Python ``int`` or ``float`` is a weak scalar (NumPy 2, NEP 50): it takes the
    dtype of the array it meets (``int64 * 2`` stays int64, ``float32 * 2.5`` stays float32). A
    NumPy scalar (the folded value of ``EXP(1)``, say) is strong, as ``np.exp(1)`` is in NumPy."""

    value: int | float | np.generic

    def inputs(self) -> set[int]:
        return set()

    # 2 == 2.0 in Python, but `x * 2` and `x * 2.0` differ in dtype: the type is part of the value.
    def __eq__(self, other) -> bool:
        return isinstance(other, Const) and type(self.value) is type(other.value) \
            and self.value == other.value

    def __hash__(self) -> int:
        return hash((type(self.value), self.value))


@dataclass(frozen=True)
class Param:
    """A parameter of a statement (``$lr``, ``?``): a Python scalar like a literal, whose value
    is given each time the statement runs. Two parameters of one name and kind are equal
    whatever their values, so a plan (cached by its graph) is reused for new values: nothing
    is planned from the value (no folding, no BLAS scale, no skipped call)."""

    name: str
    kind: str  # 'int' or 'float': the value's Python type, which the dtype depends on
    value: int | float = field(default=0, compare=False, repr=False)

    def inputs(self) -> set[int]:
        return set()


@dataclass(frozen=True)
class Call:
    """A function of sub-expressions: an operator (``+ - * / max min pow``) or a unary function."""

    fn: str
    args: tuple["Expr", ...]

    def __post_init__(self) -> None:
        spec = FUNCTIONS.get(self.fn)
        if spec is None:
            raise BinderError(f"unknown function '{self.fn}'",
                              hint=f"valid functions: {', '.join(sorted(FUNCTIONS))}")
        if len(self.args) != spec.arity:
            raise BinderError(f"function '{self.fn}' takes {spec.arity} argument(s), "
                              f"got {len(self.args)}")

    def inputs(self) -> set[int]:
        return inputs_of(self)


Expr = Union[Input, Const, Param, Call]


def _relu(x):
    # MAX(x, 0) with a weak 0, as NumPy computes it: int and float arrays keep their dtype, a
    # bool becomes int64, and RELU of a literal is a NumPy scalar like any function of one.
    return np.maximum(x, 0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _stop(x):
    """The value itself; its derivative is taken as 0 (a shift that cancels, such as the
    maximum LOGSUMEXP subtracts and adds back: plan/derivative.py)."""
    return x


@dataclass(frozen=True)
class FunctionSpec:
    arity: int
    ufunc: Callable
    zero_preserving: bool  # f(0, ..., 0) == 0 (unary) / see _zero below for binary operators


FUNCTIONS: dict[str, FunctionSpec] = {
    "+": FunctionSpec(2, np.add, True),
    "-": FunctionSpec(2, np.subtract, True),
    "*": FunctionSpec(2, np.multiply, True),
    "/": FunctionSpec(2, np.true_divide, True),
    "max": FunctionSpec(2, np.maximum, True),
    "min": FunctionSpec(2, np.minimum, True),
    "pow": FunctionSpec(2, np.power, False),
    "neg": FunctionSpec(1, np.negative, True),
    "abs": FunctionSpec(1, np.abs, True),
    "relu": FunctionSpec(1, _relu, True),
    "sqrt": FunctionSpec(1, np.sqrt, True),
    "tanh": FunctionSpec(1, np.tanh, True),
    "sin": FunctionSpec(1, np.sin, True),
    "square": FunctionSpec(1, np.square, True),
    "exp": FunctionSpec(1, np.exp, False),
    "log": FunctionSpec(1, np.log, False),
    "sigmoid": FunctionSpec(1, _sigmoid, False),
    "cos": FunctionSpec(1, np.cos, False),
    # Comparisons give NumPy's bool; WHERE(c, a, b) is numpy.where (CASE and IF in the dialect).
    "==": FunctionSpec(2, np.equal, False),
    "!=": FunctionSpec(2, np.not_equal, False),
    "<": FunctionSpec(2, np.less, False),
    "<=": FunctionSpec(2, np.less_equal, False),
    ">": FunctionSpec(2, np.greater, False),
    ">=": FunctionSpec(2, np.greater_equal, False),
    "where": FunctionSpec(3, np.where, False),
    # Internal functions of the backward pass (plan/grad.py): masks and signs of derivatives.
    # Their names are not words, so the dialect never offers them (binder.SCALAR_FUNCTIONS).
    "_eq": FunctionSpec(2, np.equal, False),
    "_gt": FunctionSpec(2, np.greater, False),
    "_sign": FunctionSpec(1, np.sign, True),
    "_stop": FunctionSpec(1, _stop, True),
}


def inputs_of(expr: Expr) -> set[int]:
    if isinstance(expr, Input):
        return {expr.index}
    if isinstance(expr, Call):
        return set().union(*(inputs_of(a) for a in expr.args))
    return set()


def product(n: int) -> Expr:
    """x0 * x1 * ... * x{n-1}: the default join."""
    expr: Expr = Input(0)
    for i in range(1, n):
        expr = Call("*", (expr, Input(i)))
    return expr


def product_of(expr: Expr) -> tuple[int | float, tuple[int, ...], bool] | None:
    """``(c, (a, b, ...), leading)`` when ``expr`` multiplies distinct inputs, each once, by at
    most one literal, placed where NumPy applies it first or last:

    - a product of inputs in any grouping, negations included: ``c`` is the sign (exact);
    - ``c * x_a * x_b * ...`` (left to right): ``c`` multiplies ``x_a`` before anything else
      (``leading``);
    - ``(x_a * x_b * ...) * c``, or ``/ c`` for a power of two ``c`` (``1 / c`` is exact): ``c``
      multiplies the product (not ``leading``).

    Anything else (two literals, a literal inside the product, ``/ 3``) is None: folding would
    change where NumPy overflows or rounds. ``c`` is exact in the arithmetic of the operation's
    dtype only when every product in ``expr`` is computed in that dtype: ``uniform_dtype`` says
    whether it is.

    >>> [product_of(parse_join(t)) for t in ("x1 * -x0", "2 * x0 * x1", "x0 * (x1 * 2)")]
    [(-1, (1, 0), True), (2, (0, 1), True), None]
    """
    plain = _plain_product(expr)
    if plain is not None:
        return plain[0], plain[1], True
    if isinstance(expr, Call) and expr.fn in ("*", "/") and isinstance(expr.args[1], Const):
        inner, c = _plain_product(expr.args[0]), expr.args[1].value
        if inner is None or not isinstance(c, (int, float)):
            return None
        if expr.fn == "*":
            return inner[0] * c, inner[1], False
        if c != 0 and math.isfinite(c) and math.frexp(c)[0] in (0.5, -0.5):
            return inner[0] / c, inner[1], False
        return None
    # c * x_a * x_b ...: the leftmost factor of a left-to-right chain is the literal.
    rights, e = [], expr
    while isinstance(e, Call) and e.fn == "*" and not isinstance(e.args[0], Const):
        rights.append(e.args[1])
        e = e.args[0]
    if not (isinstance(e, Call) and e.fn == "*" and isinstance(e.args[0], Const)):
        return None
    rights.append(e.args[1])
    parts = [_plain_product(r) for r in reversed(rights)]
    if any(p is None for p in parts) or not isinstance(e.args[0].value, (int, float)):
        return None
    inputs = tuple(i for p in parts for i in p[1])
    if len(set(inputs)) != len(inputs):
        return None
    return e.args[0].value * math.prod(p[0] for p in parts), inputs, True


def _plain_product(expr: Expr) -> tuple[int, tuple[int, ...]] | None:
    """(sign, inputs left to right) for a product of distinct inputs and negations only."""
    if isinstance(expr, Input):
        return 1, (expr.index,)
    if isinstance(expr, Call) and expr.fn == "neg":
        inner = _plain_product(expr.args[0])
        return None if inner is None else (-inner[0], inner[1])
    if isinstance(expr, Call) and expr.fn == "*":
        left, right = _plain_product(expr.args[0]), _plain_product(expr.args[1])
        if left is None or right is None or set(left[1]) & set(right[1]):
            return None
        return left[0] * right[0], left[1] + right[1]
    return None


def product_factors(expr: Expr) -> list[int] | None:
    """The inputs ``expr`` multiplies, left to right with repeats, when it is a product of
    inputs and nothing else (no literal), in any grouping; else None.

    >>> product_factors(parse_join("x1 * (x0 * x1)")), product_factors(parse_join("x0 * x1 * 1.0"))
    ([1, 0, 1], None)
    """
    seen: list[int] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Input):
            seen.append(e.index)
        elif isinstance(e, Call) and e.fn == "*":
            stack.extend(reversed(e.args))
        else:
            return None
    return seen


def _probe(dtypes) -> list:
    return [np.ones(1, dtype=d) for d in dtypes]


def dtype_of(expr: Expr, dtypes) -> np.dtype:
    """The dtype NumPy gives ``expr`` on arrays of ``dtypes`` (literals weak, NEP 50).

    Raises what NumPy raises for an expression it refuses (``TypeError`` for ``-`` on bool,
    ``OverflowError`` for a literal that does not fit an integer dtype). Kept per expression
    text (which spells each literal's type: ``1`` and ``1.0`` differ) and dtypes: the layers
    of a deep network ask the same question a thousand times."""
    key = (repr(expr), tuple(dtypes))
    hit = _DTYPES.get(key)
    if hit is None:
        if len(_DTYPES) > 4096:
            _DTYPES.clear()
        hit = _DTYPES[key] = _dtype_of(expr, dtypes)
    if isinstance(hit, Exception):
        raise type(hit)(*hit.args)
    return hit


_DTYPES: dict = {}  # dtype_of's answers (or the exception NumPy raised)


def _dtype_of(expr: Expr, dtypes):
    try:
        return _numpy_dtype_of(expr, dtypes)
    except (TypeError, OverflowError, ValueError) as exc:
        return exc


def _numpy_dtype_of(expr: Expr, dtypes) -> np.dtype:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = evaluate(expr, _probe(dtypes))
    return np.asarray(out).dtype if isinstance(out, (np.ndarray, np.generic)) \
        else np.result_type(out)


def uniform_dtype(expr: Expr, dtypes, dtype) -> bool:
    """True when every operator of the product ``expr`` computes in ``dtype``: then the inputs may
    be cast to ``dtype`` first and the constant applied after the product (NumPy's answer, up to
    rounding). ``2.5 * x0 * x1`` on int32 is: 2.5 * x0 is float64 already. ``x0 * x1 * 2.5`` is
    not: NumPy multiplies (and may overflow) in int32 before the scale."""
    if not isinstance(expr, Call):
        return True
    if dtype_of(expr, dtypes) != np.dtype(dtype):
        return False
    return all(uniform_dtype(a, dtypes, dtype) for a in expr.args)


def evaluate(expr: Expr, values: list, xp=np, out=None):
    """Evaluate elementwise on arrays (broadcasting), or on scalars. ``out``: an array of the
    result's shape and dtype that the outermost function writes into, when it is a NumPy ufunc
    (the result is then ``out``); otherwise it is ignored."""
    if isinstance(expr, Input):
        return values[expr.index]
    if isinstance(expr, (Const, Param)):
        return expr.value
    spec = FUNCTIONS[expr.fn]
    args = [evaluate(a, values, xp) for a in expr.args]
    if expr.fn in _PYTHON_OPS and all(type(a) in (int, float) for a in args):
        folded = _python_op(expr.fn, args)
        if folded is not None:
            return folded
    fn = getattr(xp, spec.ufunc.__name__, spec.ufunc) if xp is not np else spec.ufunc
    if expr.fn == "pow" and xp is not np:
        _refuse_negative_int_power(*args)
    if out is not None and isinstance(fn, np.ufunc):
        return fn(*args, out=out, casting="unsafe")
    if out is not None and fn is _relu and isinstance(args[0], np.ndarray):
        # the result NumPy's MAX(x, 0) gives (weak 0), cast into out as the ufuncs above are
        return np.maximum(args[0], 0, out=out, casting="unsafe")
    return fn(*args)


def _refuse_negative_int_power(base, exponent) -> None:
    """NumPy refuses an integer to a negative integer power (ValueError, a DataError for the
    user); CuPy computes something: refuse it on other array modules the same way."""
    def kind(a):
        return "i" if type(a) is int else getattr(getattr(a, "dtype", None), "kind", "f")
    if kind(base) not in "iub" or kind(exponent) != "i":
        return
    negative = exponent < 0 if type(exponent) is int else bool((exponent < 0).any())
    if negative:
        raise ValueError("Integers to negative integer powers are not allowed.")


# Operators on two Python scalars compute as Python does (``2 * 3`` is a weak int 6, as in the
# NumPy expression ``2 * 3 * x``); functions of literals are NumPy's (``np.exp(2)`` is a strong
# float64).
_PYTHON_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
               "neg": operator.neg}


def _python_op(fn: str, args: list):
    try:
        return _PYTHON_OPS[fn](*args)
    except (ZeroDivisionError, OverflowError):
        return None  # NumPy's inf / nan instead of Python's exception


def fold(call: Call) -> Expr:
    """Fold a call on literals only (``2 * 3`` -> 6) as the NumPy expression would compute it."""
    if not all(isinstance(a, Const) for a in call.args):
        return call
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            value = evaluate(call, [])
        except (TypeError, ValueError, OverflowError):
            return call  # left to the kernel (and refused with the statement's dtypes)
    return Const(value if type(value) in (int, float) else np.asarray(value)[()])


_INFIX = {"+": 1, "-": 1, "*": 2, "/": 2}
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")

# An integer ``a ** b`` between literals is computed exactly (a weak Python int); one past this
# many bits is refused before it is computed (it could not fit any dtype, and 10 ** 10 ** 10
# would take gigabytes and minutes).
MAX_LITERAL_BITS = 1024


def _check_power_size(base, exponent, text: str) -> None:
    if not (isinstance(base, int) and isinstance(exponent, int)) or abs(base) < 2 or exponent < 0:
        return
    if exponent * math.log2(abs(base)) > MAX_LITERAL_BITS:
        raise BinderError(
            f"join expression {text!r}: {base} ** {exponent} is an integer of more than "
            f"{MAX_LITERAL_BITS} bits", hint="write a float literal (10.0 ** 400 is inf) if that "
            "is what you mean")


def render(expr: Expr, names: list[str] | None = None, _prec: int = 0) -> str:
    """Render as text, with input slot i shown as names[i] (default x{i})."""
    if isinstance(expr, Input):
        return names[expr.index] if names else f"x{expr.index}"
    if isinstance(expr, Param):
        return f"${expr.name}"
    if isinstance(expr, Const):
        v = expr.value
        if isinstance(v, (int, np.integer)):
            return str(int(v))
        return str(int(v)) if float(v).is_integer() else repr(float(v))
    if expr.fn in COMPARISONS:  # not associative: both sides of a lower level in parentheses
        text = f"{render(expr.args[0], names, 1)} {expr.fn} {render(expr.args[1], names, 1)}"
        return f"({text})" if _prec > 0 else text
    if expr.fn in _INFIX:
        p = _INFIX[expr.fn]
        text = (f"{render(expr.args[0], names, p)} {expr.fn} "
                f"{render(expr.args[1], names, p + 1)}")
        return f"({text})" if p < _prec else text
    if expr.fn == "neg":
        return f"-{render(expr.args[0], names, 3)}"
    return f"{expr.fn.upper()}({', '.join(render(a, names) for a in expr.args)})"


_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "pow"}
_AST_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
                ast.GtE: ">="}


# The deepest expression a join may have: expressions are evaluated and analysed recursively (in
# the kernels too), and this bound keeps them well inside Python's recursion limit. The dialect's
# parser applies the same bound to statements.
MAX_EXPRESSION_DEPTH = 200


def _too_deep(text: str) -> BinderError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return BinderError(f"join expression {shown!r} is nested too deeply: at most "
                       f"{MAX_EXPRESSION_DEPTH} levels of operators, parentheses and calls",
                       hint="split it into several einsums, each computing a partial result")


def parse_join(text: str) -> Expr:
    """Parse a join written in Python syntax over x0, x1, ...: ``"relu(x0 + x1)"``."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        if "too many nested" in str(exc.msg):
            raise _too_deep(text) from None
        raise BinderError(f"cannot parse join expression {text!r}: {exc.msg}") from None
    except (RecursionError, MemoryError):  # Python's own parser gives up on very deep input
        raise _too_deep(text) from None
    stack = [(tree, 1)]  # measured without recursion, before conv() recurses
    while stack:
        node, depth = stack.pop()
        if depth > MAX_EXPRESSION_DEPTH:
            raise _too_deep(text)
        stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node))

    def conv(node: ast.AST) -> Expr:
        if isinstance(node, ast.Name) and node.id[:1] == "x" and node.id[1:].isdigit():
            return Input(int(node.id[1:]))
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return Const(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
            left, right = conv(node.left), conv(node.right)
            if isinstance(node.op, ast.Pow) and isinstance(left, Const) and isinstance(right, Const):
                _check_power_size(left.value, right.value, text)
                try:  # Python's ``2 ** 3`` is a weak int (POW in the dialect is np.power)
                    value = left.value ** right.value
                    if type(value) in (int, float):  # not (-8) ** 0.5, a complex
                        return Const(value)
                except (ZeroDivisionError, OverflowError, TypeError):
                    pass
            return Call(_AST_OPS[type(node.op)], (left, right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 \
                and type(node.ops[0]) in _AST_COMPARE:  # one comparison: a < b < c is refused
            return Call(_AST_COMPARE[type(node.ops[0])],
                        (conv(node.left), conv(node.comparators[0])))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = conv(node.operand)
            return Const(-inner.value) if isinstance(inner, Const) else Call("neg", (inner,))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return Call(node.func.id.lower(), tuple(conv(a) for a in node.args))
        raise BinderError(f"unsupported syntax in join expression {text!r}: {ast.dump(node)[:60]}")

    return conv(tree)
