"""The binder's aggregates that are made of others, and the label rule's claim: kept apart from
binder.py (the statement's lowering), whose ``_Lowering`` they are part of.

- MEAN (AVG): numpy.mean, a SUM in the argument's float dtype over the count; COUNT: the count;
- LOGSUMEXP: scipy.special.logsumexp, the MAX and a SUM of EXP shifted by it;
- SOFTMAX(x, j): scipy.special.softmax along j, the same two steps over a renamed j;
- the claim: an aggregate call that uses no label outside its inner aggregate calls takes the
  labels they all use (the cross-entropy as written on paper).
"""
from __future__ import annotations

import math

import numpy as np

from ..dialect import ast as A
from ..plan import scalar
from .scope import free_labels as _free_labels
from .scope import is_aggregate as _is_aggregate
from .scope import labels_in as _labels_in

__all__ = ["Derived", "slot"]


class Derived:
    """Methods of the binder's ``_Lowering`` (which has ``sizes``, ``refs``, ``outer``,
    ``steps``, ``step``, ``conv``, ``aggregate``, ``dtype``, ``err``)."""

    def _claim(self, arg, outer: set[str]) -> list[str]:
        """The labels an aggregate call that uses no label outside its inner aggregate calls
        takes from them, as written on paper: in ``SUM(LOG(SUM(EXP(Z[b,c]))) - SUM(Y[b,c] *
        Z[b,c]))`` the outer SUM sums b, the inner ones c. It takes the labels that every inner
        aggregate uses, each only if every inner aggregate keeps a label of its own after it;
        a label fewer tensors use comes first (in ``MAX(SUM(Q[i,e] * K[k,e]))`` the MAX takes
        k and the SUM keeps e, its product's shared label: the row maximum of a matrix
        product), then the order of first use. Where no label is used by them all, it takes
        a free label of an inner aggregate that is a product's (one tensor uses it, and the
        inner call keeps a label two tensors use, its contraction), on the same terms: the
        softmax's denominator ``SUM(EXP(SUM(Q[i,e] * K[m,e]) - MAX(SUM(Q[i,e] * K[n,e]))))``
        sums m. None taken leaves the call with nothing (an error)."""
        inner, stack = [], [arg]
        while stack:  # the aggregate calls of ``arg`` that no other one of them contains
            node = stack.pop()
            if _is_aggregate(node):
                inner.append(node)
            elif isinstance(node, A.Call):
                stack.extend(node.args)
            elif isinstance(node, A.BinOp):
                stack.extend((node.left, node.right))
            elif isinstance(node, A.Neg):
                stack.append(node.operand)
            elif isinstance(node, A.Chain):
                stack.extend(node.operands)
        if not inner:
            return []
        first = _labels_in(arg)
        uses: dict[str, int] = {}
        for ref in A.refs(arg):
            for l in dict.fromkeys(x.name for x in ref.labels or ()):
                uses[l] = uses.get(l, 0) + 1

        def keeps_one(a, trial, claims: bool) -> bool:  # an inner call keeps a label to
            labels = _free_labels(a.args[0])  # aggregate (``claims``: or one to claim)
            if not labels and claims:
                labels = _labels_in(a.args[0])
            return any(l not in trial for l in labels)

        def take(candidates, claims: bool) -> list[str]:
            taken: list[str] = []
            for label in sorted(candidates, key=lambda l: (uses.get(l, 0), first.index(l))):
                trial = outer | set(taken) | {label}
                if all(keeps_one(a, trial, claims) for a in inner):
                    taken.append(label)
            return taken

        everyone = [l for l in first if l not in outer
                    and all(l in _labels_in(a.args[0]) for a in inner)]
        return take(everyone, False) or take(dict.fromkeys(
            l for a in inner for l in _product_free(a.args[0], outer)), True)

    def _derived(self, node: A.Call, slots, kept, own) -> scalar.Expr:
        """MEAN (AVG) and COUNT over the labels ``own``. COUNT is the number of elements they
        span, a Python int as numpy's ``x.size`` (a weak literal: ``SUM(x) / COUNT(x)`` keeps
        float32); only a statement of counts alone computes it as an int64 step. MEAN is
        numpy.mean: the SUM computed in the argument's float dtype (ints and bools in float64,
        as ``x * 1.0``), divided by the count; its gradient is the SUM's over the count."""
        n = math.prod(self.sizes[l][0] for l in own)
        span = node.span
        if node.fn == "logsumexp":
            return self._logsumexp(node, slots, kept, own)
        if node.fn == "count" and not self.count_steps:
            return scalar.Const(n)
        if node.fn == "count":
            inner, value = self._argument(node, own)
            one = scalar.Const(np.int64(1))  # where(v == v, 1, 1): 1 at every element, NaN too
            join = scalar.Call("where", (scalar.Call("==", (value, value)), one, one))
            return slot(slots, self.temporary(kept, inner, join, "sum", span), tuple(kept))
        total = A.Call("sum", (A.BinOp("*", node.args[0], A.Number(1.0, span), span),), span,
                       node.fn_span)
        return scalar.fold(scalar.Call("/", (self.aggregate(total, slots), scalar.Const(n))))

    def _logsumexp(self, node: A.Call, slots, kept, own) -> scalar.Expr:
        """LOG(SUM(EXP(x))) computed stably, as scipy.special.logsumexp: with m the MAX over
        the same labels (0 where it is not finite), m + LOG(SUM(EXP(x - m))). The shift is
        marked as having no derivative (it cancels), so the gradient is exactly the softmax."""
        def shift(m):  # where(m - m == 0, m, 0): the maximum where it is finite, else 0
            finite = scalar.Call("==", (scalar.Call("-", (m, m)), scalar.Const(0)))
            return scalar.Call("_stop", (scalar.Call("where", (finite, m, scalar.Const(0))),))
        # x * 1.0, as scipy reads x: a bool or int argument becomes float (bools would not
        # subtract), a float keeps its dtype
        span = node.span
        node = A.Call(node.fn, (A.BinOp("*", node.args[0], A.Number(1.0, span), span),),
                      span, node.fn_span)
        if any(self.sizes[l][0] == 0 for l in own):  # over nothing: LOG(0) = -inf, as scipy
            inner, value = self._argument(node, own)
            ones = scalar.Call("+", (scalar.Call("*", (value, scalar.Const(0))), scalar.Const(1)))
            total = self.temporary(kept, inner, ones, "sum", span)  # 0: no element to EXP
            return scalar.Call("log", (slot(slots, total, tuple(kept)),))
        m_slot, total = self._exp_sum(node, slots, kept, own, shift)
        return scalar.Call("+", (scalar.Call("log", (total,)), shift(m_slot)))

    def _exp_sum(self, node: A.Call, slots, kept, own, shift):
        """The MAX of ``node``'s argument over ``own`` and SUM(EXP(x - shift(MAX))): two
        temporary steps keeping ``kept``, referenced in ``slots``."""
        m_slot = self.aggregate(A.Call("max", node.args[:1], node.span, node.fn_span), slots)
        m_name, m_labels = slots[m_slot.index]
        inner, value = self._argument(node, own)
        m = slot(inner, m_name, m_labels)
        join = scalar.Call("exp", (scalar.Call("-", (value, shift(m))),))
        name = self.temporary(kept, inner, join, "sum", node.span)
        return m_slot, slot(slots, name, tuple(kept))

    def _argument(self, node: A.Call, own):
        """``node``'s argument converted with ``own`` as aggregated labels: its inputs and
        its scalar expression."""
        inner: list[tuple[str, tuple[str, ...]]] = []
        outer, self.outer = self.outer, self.outer | set(own)
        try:
            return inner, self.conv(node.args[0], inner)
        finally:
            self.outer = outer

    def _softmax(self, node: A.Call, slots) -> scalar.Expr:
        """SOFTMAX(x, j) = EXP(x - m) / SUM(EXP(x' - m)), m = MAX(x'), x' being x with j renamed
        to a label of its own that the MAX and the SUM aggregate (x's other labels are kept):
        scipy.special.softmax, NaN where m is not finite as there. The shift has no derivative
        (it cancels), so the gradient is exactly the softmax's."""
        args = node.args
        if len(args) != 2 or not isinstance(args[1], A.Label):
            raise self.err(node.span, "SOFTMAX takes an expression and the label to normalize "
                           "over: SOFTMAX(X[i,j], j)")
        label = args[1].name
        if label not in _labels_in(args[0]):
            raise self.err(args[1].span, f"SOFTMAX normalizes over label '{label}', which its "
                           "argument does not use",
                           hint=f"labels: {', '.join(_labels_in(args[0])) or 'none'}")
        stray = [l for l in _free_labels(args[0]) if l not in self.outer]
        if stray:
            raise self.err(node.span, f"SOFTMAX's argument uses label(s) {', '.join(stray)} that "
                           "the statement aggregates outside it",
                           hint="aggregate them inside the argument, e.g. SOFTMAX(SUM(...), j)")
        if self.sizes[label][0] == 0:  # an empty result, as scipy's: no MAX over nothing
            value = self.conv(args[0], slots)
            return scalar.Call("exp", (scalar.Call("-", (value, value)),))
        k = 1
        while f"{label}_sm{k}" in self.sizes:
            k += 1
        fresh = f"{label}_sm{k}"
        self.sizes[fresh] = self.sizes[label]
        renamed = A.Call("softmax", (self._relabel(args[0], label, fresh),), node.span,
                         node.fn_span)
        kept = [l for l in _labels_in(renamed) if l in self.outer]

        def shift(m):
            return scalar.Call("_stop", (m,))
        m_slot, total = self._exp_sum(renamed, slots, kept, [fresh], shift)
        value = self.conv(args[0], slots)
        return scalar.Call("/", (scalar.Call("exp", (scalar.Call("-", (value, shift(m_slot))),)),
                                 total))

    def _relabel(self, expr, old: str, new: str):
        """``expr`` with label ``old`` renamed ``new`` (its tensors resolved as before)."""
        if isinstance(expr, A.Ref):
            if expr.labels is None:
                return expr
            ref = A.Ref(expr.name, tuple(A.Label(new if l.name == old else l.name, l.span)
                                         for l in expr.labels), expr.span, expr.name_span)
            self.refs[id(ref)] = self.refs[id(expr)]
            self._kept.append(ref)  # ids stay unique while the statement is lowered
            return ref
        if isinstance(expr, A.Call):
            return A.Call(expr.fn, tuple(self._relabel(a, old, new) for a in expr.args),
                          expr.span, expr.fn_span)
        if isinstance(expr, A.BinOp):
            return A.BinOp(expr.op, self._relabel(expr.left, old, new),
                           self._relabel(expr.right, old, new), expr.span)
        if isinstance(expr, A.Neg):
            return A.Neg(self._relabel(expr.operand, old, new), expr.span)
        if isinstance(expr, A.Chain):
            return A.Chain(self._relabel(expr.first, old, new),
                           tuple((op, self._relabel(t, old, new)) for op, t in expr.rest),
                           expr.span)
        return expr  # a number, a string, a label


def slot(slots: list, tensor: str, labels: tuple[str, ...]) -> scalar.Input:
    key = (tensor, labels)
    if key not in slots:
        slots.append(key)
    return scalar.Input(slots.index(key))


def _product_free(arg, outer) -> list[str]:
    """The labels of an aggregate's argument ``arg`` that one of its tensors uses (outside its
    inner aggregates) when another label, used by two or more, is its contraction: the free
    labels of a matrix product ``Q[i,e] * K[m,e]`` (m) but none of ``X[b,c]``."""
    free = [l for l in _free_labels(arg) if l not in outer]
    uses: dict[str, int] = {}
    for ref in _refs_outside_aggregates(arg):
        for l in dict.fromkeys(x.name for x in ref.labels or ()):
            uses[l] = uses.get(l, 0) + 1
    if not any(uses.get(l, 0) >= 2 for l in free):
        return []
    return [l for l in dict.fromkeys(free) if uses.get(l, 0) == 1]


def _refs_outside_aggregates(expr) -> list:
    if isinstance(expr, A.Ref):
        return [expr]
    if _is_aggregate(expr):
        return []
    kids = expr.args if isinstance(expr, A.Call) else (expr.left, expr.right) \
        if isinstance(expr, A.BinOp) else (expr.operand,) if isinstance(expr, A.Neg) else \
        expr.operands if isinstance(expr, A.Chain) else ()
    return [r for k in kids for r in _refs_outside_aggregates(k)]
