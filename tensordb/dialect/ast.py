"""Syntax nodes, exactly as written. Every node carries a Span into the full script text.

Expressions: ``Number``, ``String``, ``Ref`` (a tensor with labels; ``labels`` is None for a bare
name), ``Call``, ``BinOp``, ``Neg``, ``Chain`` (a very long ``a + b + ...``). Statements are the classes ending in ``Stmt``; plain SQL that
DuckDB runs is ``SqlStmt``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..errors import Span

__all__ = [
    "Label", "Number", "String", "Param", "Ref", "Call", "BinOp", "Neg", "Chain", "CHAIN_LIMIT",
    "Expr",
    "Target", "Dim", "LabelValue",
    "CreateStmt", "LoadStmt", "AssignStmt", "ExplainStmt", "ShowTensorsStmt", "ShowSettingStmt",
    "DescribeStmt", "DropStmt", "CopyStmt", "CheckStmt", "SetStmt", "BeginStmt", "CommitStmt",
    "RollbackStmt",
    "SqlStmt", "Statement", "walk", "refs",
]


@dataclass(frozen=True)
class Label:
    """A label of a tensor reference; ``range`` (start, stop), each None where omitted and
    negative from the end as in Python, when the subscript is a slice (``X[i 0:100, d]``; a
    bare ``0:100`` gets a label of its own, ``anonymous``)."""

    name: str
    span: Span
    range: tuple[int | None, int | None] | None = None
    anonymous: bool = False


@dataclass(frozen=True)
class Number:
    value: int | float
    span: Span


@dataclass(frozen=True)
class String:
    value: str
    span: Span


@dataclass(frozen=True)
class Param:
    """A parameter: ``?`` (the next value of a list), ``$1`` (the first) or ``$name`` (from a
    dict), bound to a value passed with the statement (``AssignStmt.params``)."""

    text: str
    span: Span


@dataclass(frozen=True)
class Ref:
    """``A[i,j]``; ``labels`` is None for a bare name (a scalar, or an EINSUM operand)."""

    name: str
    labels: tuple[Label, ...] | None
    span: Span
    name_span: Span
    # A gather, ``E[tok[b], d]``: (the index tensor's name, its span, how many of ``labels``
    # are its labels, in place of the first axis of ``name``).
    gather: tuple[str, Span, int] | None = None


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]
    span: Span
    fn_span: Span


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / or a comparison: == != < <= > >=
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class Chain:
    """A long chain ``a + b - c + ...`` (or ``a * b / c ...``), evaluated left to right like the
    BinOps it stands for. The parser makes one only for chains longer than CHAIN_LIMIT operators:
    nested BinOps that deep would overflow every recursive walk; the binder computes a Chain in
    parts (see binder._Lowering.chain)."""

    first: "Expr"
    rest: tuple[tuple[str, "Expr"], ...]  # (operator, operand), in order
    span: Span

    @property
    def additive(self) -> bool:
        return self.rest[0][0] in "+-"

    @property
    def operands(self) -> list["Expr"]:
        return [self.first] + [t for _, t in self.rest]


# The longest chain of one precedence level that the parser builds as nested BinOps.
CHAIN_LIMIT = 100

Expr = Union[Number, String, Param, Ref, Call, BinOp, Neg, Chain]


def walk(expr: Expr):
    """Every node of an expression, parents before children."""
    yield expr
    if isinstance(expr, Call):
        for a in expr.args:
            yield from walk(a)
    elif isinstance(expr, BinOp):
        yield from walk(expr.left)
        yield from walk(expr.right)
    elif isinstance(expr, Neg):
        yield from walk(expr.operand)
    elif isinstance(expr, Chain):
        for t in expr.operands:
            yield from walk(t)


def refs(expr: Expr) -> list[Ref]:
    return [n for n in walk(expr) if isinstance(n, Ref)]


@dataclass(frozen=True)
class Target:
    """The left side: ``C[i,k]``, or ``s`` / ``C`` (labels None)."""

    name: str
    labels: tuple[Label, ...] | None
    span: Span
    name_span: Span


@dataclass(frozen=True)
class Dim:
    """One dimension of CREATE TENSOR: an optional name and a size."""

    name: str | None
    size: int
    span: Span


@dataclass(frozen=True)
class LabelValue:
    """``label number`` in TILE (...) and PIECES lists: a label (or dimension, or None for a bare
    number) and an extent (TILE) or a number of pieces (PIECES)."""

    label: str | None
    value: int
    span: Span


@dataclass(frozen=True)
class CreateStmt:
    """CREATE [OR REPLACE] TENSOR name (dims) [dtype] [TILE (...)]: a tensor of zeros."""

    name: str
    dims: tuple[Dim, ...]
    dtype: str
    tile: tuple[LabelValue, ...] | None
    replace: bool
    if_not_exists: bool
    span: Span
    name_span: Span
    dtype_span: Span


@dataclass(frozen=True)
class LoadStmt:
    """LOAD TENSOR / CREATE TENSOR ... FROM a file, a table or a query."""

    name: str
    dims: tuple[Label, ...] | None
    path: str | None
    query: str | None
    table: str | None
    format: str | None
    array: str | None
    index: tuple[str, ...] | None
    value: str | None
    shape: tuple[int, ...] | None
    tile: tuple[LabelValue, ...] | None
    replace: bool
    span: Span
    name_span: Span
    source_span: Span
    duplicates: str | None = None  # 'sum' or 'error' (DUPLICATES SUM | ERROR)
    fill: float | None = None  # FILL +inf: the value of the entries the table leaves out


@dataclass(frozen=True)
class AssignStmt:
    """``C[i,k] = expr``, ``CREATE [OR REPLACE] TENSOR C[i,k] AS expr`` or ``LET H[b,f] = expr``.

    ``mode``: 'assign' (replaces an existing tensor), 'create', 'replace' or 'let'.
    """

    target: Target
    expr: Expr
    pieces: tuple[LabelValue, ...]  # WITH (PIECES i 4, ...): pieces fixed per label
    mode: str
    span: Span
    # The values of its parameters, given with the statement: (position of the parameter in
    # the script, its name, its value) each; None when none were given (session/script.py).
    params: tuple[tuple[int, str, int | float], ...] | None = None


@dataclass(frozen=True)
class ExplainStmt:
    statement: "Statement"
    analyze: bool
    format: str
    span: Span


@dataclass(frozen=True)
class ShowTensorsStmt:
    span: Span


@dataclass(frozen=True)
class ShowSettingStmt:
    name: str | None  # None: SHOW ALL
    span: Span


@dataclass(frozen=True)
class DescribeStmt:
    name: str
    span: Span
    name_span: Span


@dataclass(frozen=True)
class DropStmt:
    name: str
    if_exists: bool
    span: Span
    name_span: Span


@dataclass(frozen=True)
class CopyStmt:
    name: str
    path: str
    format: str | None
    span: Span
    name_span: Span


@dataclass(frozen=True)
class CheckStmt:
    """CHECK TENSOR name, or CHECK DATABASE (``name`` None): the integrity check."""

    name: str | None
    span: Span
    name_span: Span | None


@dataclass(frozen=True)
class SetStmt:
    name: str
    value: object
    span: Span


@dataclass(frozen=True)
class BeginStmt:
    span: Span


@dataclass(frozen=True)
class CommitStmt:
    span: Span


@dataclass(frozen=True)
class RollbackStmt:
    span: Span


@dataclass(frozen=True)
class SqlStmt:
    """Plain SQL, handed to DuckDB as written."""

    text: str
    span: Span


Statement = Union[CreateStmt, LoadStmt, AssignStmt, ExplainStmt, ShowTensorsStmt, ShowSettingStmt,
                  DescribeStmt, DropStmt, CopyStmt, CheckStmt, SetStmt, BeginStmt, CommitStmt,
                  RollbackStmt,
                  SqlStmt]
