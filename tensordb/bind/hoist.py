"""Shaping a statement's steps as a hand split would: the natural form gets the LET form's plan.

Two rewrites of the binder's steps (``binder._Lowering``), neither of which changes a value:

* a factor of a product under SUM that is itself a function of tensors (``RELU(H[b,f])`` in
  ``SUM(RELU(H[b,f]) * W2[f,o])``) becomes an elementwise step of its own, so that the product
  is a product of tensors, which the planner runs as a contraction (a matrix product) rather
  than as a broadcast over the summed label. This is what ``LET R[b,f] = RELU(H[b,f])`` gives.
  Only a factor over no more labels than one of its tensors has is split off (its step is no
  larger than that tensor), and only where the product sums some label over two or more
  factors with tensors (where a contraction is to be had);
* a temporary equal to an earlier one of the same statement but for the names of its labels
  (``SUM(C[i,k])`` and ``SUM(C[i,m])`` in a layer norm) is computed once (``canonical``).

>>> from tensordb.plan.scalar import parse_join
>>> [render(f) for f in factors(parse_join("relu(x0) * x1 * 2"))]
['RELU(x0)', 'x1', '2']
>>> canonical(("i",), (("C", ("i", "k")),), parse_join("x0"), "sum", "float64") == \\
...     canonical(("i",), (("C", ("i", "m")),), parse_join("x0"), "sum", "float64")
True
"""
from __future__ import annotations

from ..plan import scalar
from ..plan.scalar import Call, Const, Expr, Input, inputs_of, render

__all__ = ["factors", "remap", "canonical", "splittable", "own_step", "product", "render"]


def factors(expr: Expr) -> list[Expr]:
    """The factors of a product, left to right, in any grouping (``expr`` itself if none)."""
    if isinstance(expr, Call) and expr.fn == "*":
        return factors(expr.args[0]) + factors(expr.args[1])
    return [expr]


def remap(expr: Expr, index) -> Expr:
    """``expr`` with input ``i`` read as input ``index(i)``."""
    if isinstance(expr, Input):
        return Input(index(expr.index))
    if not isinstance(expr, Call):  # a constant or a parameter
        return expr
    return Call(expr.fn, tuple(remap(a, index) for a in expr.args))


def canonical(out_labels, inputs, join: Expr, agg: str, dtype: str) -> tuple:
    """A key equal for two steps that differ only in the names of their labels."""
    names: dict[str, int] = {}
    for l in list(out_labels) + [l for _, ls in inputs for l in ls]:
        names.setdefault(l, len(names))
    return (tuple(names[l] for l in out_labels),
            tuple((t, tuple(names[l] for l in ls)) for t, ls in inputs), join, agg, dtype)


def splittable(join: Expr, slots, out_labels, agg: str) -> bool:
    """Whether ``agg(join)`` over ``slots`` is a sum of a product that sums some label and has
    a factor worth an elementwise step of its own (see the module's docstring)."""
    if agg != "sum" or scalar.product_of(join) is not None:  # a (signed, scaled) product already
        return False
    fs = factors(join)
    if sum(1 for f in fs if inputs_of(f)) < 2:
        return False
    if not any(l not in out_labels for _, ls in slots for l in ls):
        return False
    return any(own_step(f, slots) is not None for f in fs)


def own_step(factor: Expr, slots):
    """The labels of the elementwise step computing ``factor`` (a function of tensors that is
    not one tensor), or None where it has none: over more labels than any one of its tensors."""
    core = factor
    while isinstance(core, Call) and core.fn == "neg":  # -x is a sign the planner folds
        core = core.args[0]
    if isinstance(core, (Input, Const)) or not inputs_of(core):
        return None
    used = [slots[i] for i in sorted(inputs_of(factor))]
    labels = tuple(dict.fromkeys(l for _, ls in used for l in ls))
    if not any(set(labels) <= set(ls) for _, ls in used):
        return None
    return labels


def product(fs: list[Expr]) -> Expr:
    out = fs[0]
    for f in fs[1:]:
        out = scalar.fold(Call("*", (out, f)))
    return out
