"""Scalar expressions: the JOIN of an extended einsum, over input slots x0..x{n-1}.

An expression is a small frozen tree. It is evaluated elementwise (with broadcasting) on tiles, and
analysed symbolically to know which absent (all-zero) input tiles make a kernel call unnecessary.

>>> e = parse_join("relu(x0 * x1 + 2)")
>>> e
Call(fn='relu', args=(Call(fn='+', args=(Call(fn='*', args=(Input(index=0), Input(index=1))), Const(value=2.0))),))
>>> sorted(e.inputs())
[0, 1]
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from ..errors import BinderError

__all__ = ["Expr", "Input", "Const", "Call", "FUNCTIONS", "parse_join", "product", "product_of",
           "evaluate", "nonzero_sql", "zero_when_absent", "render"]


@dataclass(frozen=True)
class Input:
    """The value of input ``index`` at the current join index."""

    index: int

    def inputs(self) -> set[int]:
        return inputs_of(self)


@dataclass(frozen=True)
class Const:
    value: float

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


Expr = Union[Input, Const, Call]


def _relu(x):
    return np.maximum(x, x.dtype.type(0)) if hasattr(x, "dtype") else max(x, 0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


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


def product_of(expr: Expr) -> tuple[float, tuple[int, ...]] | None:
    """If ``expr`` is ``c * x_a * x_b * ...`` with each input once, return (c, (a, b, ...))."""
    if isinstance(expr, Input):
        return 1.0, (expr.index,)
    if isinstance(expr, Const):
        return expr.value, ()
    if isinstance(expr, Call) and expr.fn == "*":
        left, right = product_of(expr.args[0]), product_of(expr.args[1])
        if left is None or right is None or set(left[1]) & set(right[1]):
            return None
        return left[0] * right[0], left[1] + right[1]
    if isinstance(expr, Call) and expr.fn == "/" and isinstance(expr.args[1], Const):
        left = product_of(expr.args[0])
        if left is None or expr.args[1].value == 0:
            return None
        return left[0] / expr.args[1].value, left[1]
    if isinstance(expr, Call) and expr.fn == "neg":
        inner = product_of(expr.args[0])
        return None if inner is None else (-inner[0], inner[1])
    return None


def evaluate(expr: Expr, values: list, xp=np, out=None):
    """Evaluate elementwise on arrays (broadcasting), or on scalars. ``out``: an array of the
    result's shape and dtype that the outermost function writes into, when it is a NumPy ufunc
    (the result is then ``out``); otherwise it is ignored."""
    if isinstance(expr, Input):
        return values[expr.index]
    if isinstance(expr, Const):
        return expr.value
    spec = FUNCTIONS[expr.fn]
    args = [evaluate(a, values, xp) for a in expr.args]
    fn = getattr(xp, spec.ufunc.__name__, spec.ufunc) if xp is not np else spec.ufunc
    if out is not None and isinstance(fn, np.ufunc):
        return fn(*args, out=out, casting="unsafe")
    return fn(*args)


def zero_when_absent(expr: Expr, absent: frozenset[int] | set[int]) -> bool:
    """True when ``expr`` is certainly 0 wherever the inputs in ``absent`` are 0."""
    if isinstance(expr, Input):
        return expr.index in absent
    if isinstance(expr, Const):
        return expr.value == 0
    zs = [zero_when_absent(a, absent) for a in expr.args]
    if expr.fn in ("*",):
        return zs[0] or zs[1]
    if expr.fn == "/":
        return zs[0]
    if expr.fn in ("+", "-", "max", "min"):
        return zs[0] and zs[1]
    return FUNCTIONS[expr.fn].zero_preserving and zs[0]


def nonzero_sql(expr: Expr, present: Callable[[int], str]) -> str:
    """A SQL boolean that is false only where ``expr`` is certainly zero, given presence flags."""
    if isinstance(expr, Input):
        return present(expr.index)
    if isinstance(expr, Const):
        return "TRUE" if expr.value != 0 else "FALSE"
    parts = [nonzero_sql(a, present) for a in expr.args]
    if expr.fn == "*":
        return f"({parts[0]} AND {parts[1]})"
    if expr.fn == "/":
        return parts[0]
    if expr.fn in ("+", "-", "max", "min"):
        return f"({parts[0]} OR {parts[1]})"
    return parts[0] if FUNCTIONS[expr.fn].zero_preserving else "TRUE"


_INFIX = {"+": 1, "-": 1, "*": 2, "/": 2}


def render(expr: Expr, names: list[str] | None = None, _prec: int = 0) -> str:
    """Render as text, with input slot i shown as names[i] (default x{i})."""
    if isinstance(expr, Input):
        return names[expr.index] if names else f"x{expr.index}"
    if isinstance(expr, Const):
        v = expr.value
        return str(int(v)) if float(v).is_integer() else repr(v)
    if expr.fn in _INFIX:
        p = _INFIX[expr.fn]
        text = (f"{render(expr.args[0], names, p)} {expr.fn} "
                f"{render(expr.args[1], names, p + 1)}")
        return f"({text})" if p < _prec else text
    if expr.fn == "neg":
        return f"-{render(expr.args[0], names, 3)}"
    return f"{expr.fn.upper()}({', '.join(render(a, names) for a in expr.args)})"


_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "pow"}


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
            return Const(float(node.value))
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
            return Call(_AST_OPS[type(node.op)], (conv(node.left), conv(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = conv(node.operand)
            return Const(-inner.value) if isinstance(inner, Const) else Call("neg", (inner,))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return Call(node.func.id.lower(), tuple(conv(a) for a in node.args))
        raise BinderError(f"unsupported syntax in join expression {text!r}: {ast.dump(node)[:60]}")

    return conv(tree)
