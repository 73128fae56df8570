"""Which labels an expression uses, and where: the facts the binder's label scoping rests on.

A label used *free* in an expression is used outside every aggregate call in it; the binder
gives a label to the outermost scope that uses it free (docs/sql.md, the label rule).

>>> from tensordb.dialect import parse
>>> e = parse("S[i,j] = EXP(X[i,j] - MAX(X[i,k])) / SUM(EXP(X[i,k] - MAX(X[i,m])))")[0].expr
>>> free_labels(e), labels_in(e)
(['i', 'j'], ['i', 'j', 'k', 'm'])
"""
from __future__ import annotations

from ..dialect import ast as A
from ..plan.aggregates import AGGS

__all__ = ["AGGREGATES", "DERIVED", "is_aggregate", "terms", "free_labels", "labels_in"]

# The dialect's aggregates: the one table's (plan/aggregates.py), and those the binder computes
# from others (MEAN and its other name AVG: the SUM over the count; COUNT: the count;
# LOGSUMEXP: the MAX, and the SUM of EXP shifted by it).
DERIVED = ("mean", "avg", "count", "logsumexp")
AGGREGATES = AGGS + DERIVED


def is_aggregate(node) -> bool:
    return isinstance(node, A.Call) and node.fn in AGGREGATES and len(node.args) == 1


def terms(expr) -> list:
    """The parts of ``expr`` joined by + and - (Einstein's convention sums each on its own)."""
    if isinstance(expr, A.BinOp) and expr.op in "+-":
        return terms(expr.left) + terms(expr.right)
    if isinstance(expr, A.Chain) and expr.additive:
        return [t for x in expr.operands for t in terms(x)]
    if isinstance(expr, A.Neg):
        return terms(expr.operand)
    return [expr]


def free_labels(expr) -> list[str]:
    """Labels of the tensors of ``expr`` that are not inside one of its aggregate calls."""
    if isinstance(expr, A.Ref):
        return [l.name for l in expr.labels or ()]
    if is_aggregate(expr):
        return []
    kids = expr.args if isinstance(expr, A.Call) else (expr.left, expr.right) \
        if isinstance(expr, A.BinOp) else (expr.operand,) if isinstance(expr, A.Neg) else \
        expr.operands if isinstance(expr, A.Chain) else ()
    return [l for k in kids for l in free_labels(k)]


def labels_in(expr) -> list[str]:
    """Every label of the tensors of ``expr``, in order of first use."""
    out: list[str] = []
    for r in A.refs(expr):
        for l in r.labels or ():
            if l.name not in out:
                out.append(l.name)
    return out
