"""The binder's expressions (a mixin of ``binder._Lowering``): an einsum statement's
expression -> the JOIN scalar expression over its input slots (``plan/scalar.py``): numbers,
parameters, references, operators, comparison chains, function calls, and nested aggregate calls
made temporary steps of their own; a sum of products of functions of tensors split into
elementwise steps (``split``, hoist.py).
"""
from __future__ import annotations

import difflib

from ..errors import Error
from ..plan import scalar
from ..plan.aggregates import ARG_AGGS
from ..plan.builder import TensorRef, infer_dtype
from ..dialect import ast as A
from .derived import Derived
from .derived import slot as _slot
from . import hoist
from .scope import AGGREGATES, DERIVED
from .scope import free_labels as _free_labels
from .scope import is_aggregate as _is_aggregate
from .scope import labels_in as _labels_in

__all__ = ["Expressions", "SCALAR_FUNCTIONS"]

# User-visible scalar functions: the alphabetic entries of the join language, and IF(c, a, b),
# another name for WHERE(c, a, b) (numpy.where; CASE WHEN c THEN a ELSE b END is the same).
SCALAR_FUNCTIONS = tuple(sorted({f for f in scalar.FUNCTIONS if f.isalpha() and f != "neg"}
                                | {"if", "softmax"}))
_ALIASES = {"if": "where"}

_fold = scalar.fold


class Expressions(Derived):
    """Expressions -> joins over input slots (the state is ``_Lowering``'s)."""

    def conv(self, node, slots) -> scalar.Expr:
        if isinstance(node, A.Number):
            return scalar.Const(node.value)
        if isinstance(node, A.Param):
            return self.param(node)
        if isinstance(node, A.String):
            raise self.err(node.span, f"type error: the string '{node.value}' cannot be used in "
                           "arithmetic", hint="tensor expressions compute with numbers")
        if isinstance(node, A.Ref):
            gname = self.refs[id(node)][0]
            return _slot(slots, gname, tuple(l.name for l in node.labels or ()))
        if isinstance(node, A.Neg):
            inner = self.conv(node.operand, slots)
            return scalar.Const(-inner.value) if isinstance(inner, scalar.Const) else \
                scalar.Call("neg", (inner,))
        if isinstance(node, A.BinOp):
            return _fold(scalar.Call(node.op, (self.conv(node.left, slots), self.conv(node.right, slots))))
        if isinstance(node, A.Chain):
            return self.chain(node, slots)
        if isinstance(node, A.Call):
            return self.call(node, slots)
        raise TypeError(f"unexpected node {node!r}")  # pragma: no cover

    def param(self, node: A.Param) -> scalar.Param:
        """A parameter, with the value given for it (session/script.py matched them)."""
        for start, name, value in self.stmt.params or ():
            if start == node.span.start:
                return scalar.Param(name, type(value).__name__, value)
        raise self.err(node.span, f"parameter {node.text} has no value",
                       hint="pass the values with the statement: con.execute(sql, [0.1]) for ? "
                            "and $1, con.execute(sql, {'lr': 0.1}) for $lr")

    def call(self, node: A.Call, slots) -> scalar.Expr:
        fn, args = node.fn, node.args
        if _is_aggregate(node):
            return self.aggregate(node, slots)
        if fn == "softmax":
            return self._softmax(node, slots)
        if fn in ("sum", "prod") + ARG_AGGS + DERIVED:
            raise self.err(node.span, f"{fn.upper()} takes one argument, got {len(args)}")
        if fn in ("max", "min") and len(args) != 2:
            raise self.err(node.span, f"{fn.upper()} takes one argument (an aggregate) or two "
                           f"(elementwise), got {len(args)}")
        spec = scalar.FUNCTIONS.get(_ALIASES.get(fn, fn)) if fn.isalpha() else None
        if spec is None:
            names = sorted(set(SCALAR_FUNCTIONS) | set(AGGREGATES) | {"einsum"})
            close = difflib.get_close_matches(fn, names, n=1, cutoff=0.6)
            raise self.err(node.fn_span, f"unknown function '{fn}'",
                           hint=(f"did you mean {close[0].upper()}? " if close else "") +
                           "functions: " + ", ".join(n.upper() for n in names))
        if len(args) != spec.arity:
            raise self.err(node.span, f"{fn.upper()} takes {spec.arity} argument(s), got {len(args)}")
        return _fold(scalar.Call(_ALIASES.get(fn, fn), tuple(self.conv(a, slots) for a in args)))

    def chain(self, node: A.Chain, slots) -> scalar.Expr:
        """A long chain, left to right as numpy would evaluate it, in parts of CHAIN_LIMIT
        operands: each part but the last is an elementwise temporary step over every label of its
        operands, and the next part starts from it. The join of each step stays shallow, and the
        values (and the dtype of each partial result) are those of the unbroken chain."""
        items = [("", node.first)] + list(node.rest)
        start: scalar.Expr | tuple[str, tuple[str, ...]] | None = None  # a Const or a step's slot
        i = 0
        while len(items) - i > A.CHAIN_LIMIT:
            inner: list[tuple[str, tuple[str, ...]]] = []
            join = self._chain_part(start, items[i:i + A.CHAIN_LIMIT], inner)
            i += A.CHAIN_LIMIT
            if not inner:  # numbers only: fold on into the next part
                start = join
                continue
            labels = tuple(dict.fromkeys(l for _, ls in inner for l in ls))
            name = TensorRef.of(self.into).temporary(len(self.steps) + 1)
            self.dtypes[name] = infer_dtype(join, [self.dtypes[t] for t, _ in inner])
            self.step(name, labels, inner, join, "sum", False, self.dtypes[name])
            start = (name, labels)
        return self._chain_part(start, items[i:], slots)

    def _chain_part(self, start, items, slots) -> scalar.Expr:
        expr = None if start is None else \
            _slot(slots, *start) if isinstance(start, tuple) else start
        for op, term in items:
            e = self.conv(term, slots)
            expr = e if expr is None else _fold(scalar.Call(op, (expr, e)))
        return expr

    def aggregate(self, node: A.Call, slots) -> scalar.Expr:
        """A nested aggregate: a temporary step, referenced by the enclosing expression. It keeps
        the labels of enclosing scopes (``self.outer``) and aggregates the labels it uses outside
        its own nested aggregates; labels used only inside those belong to them."""
        outer = self.outer
        kept = [l for l in _labels_in(node.args[0]) if l in outer]
        own = [l for l in dict.fromkeys(_free_labels(node.args[0])) if l not in outer] or \
            self._claim(node.args[0], outer)
        if not own:
            raise self._nothing_to_aggregate(node, outer)
        if node.fn in DERIVED:
            return self._derived(node, slots, kept, own)
        self._check_empty(node, own)
        self._check_index(node, own)
        inner: list[tuple[str, tuple[str, ...]]] = []
        self.outer = outer | set(own)
        try:
            join = self.conv(node.args[0], inner)
            if not inner and not self.count_steps and \
                    any(isinstance(n, A.Call) and n.fn == "count" for n in A.walk(node.args[0])):
                self.count_steps = True  # MEAN(COUNT(x)): the counts as a step, aggregated
                try:
                    join = self.conv(node.args[0], inner)
                finally:
                    self.count_steps = False
        finally:
            self.outer = outer
        if not inner:
            raise self.err(node.span, f"{node.fn.upper()} of no tensor")
        join, inner = self.split(join, inner, kept, node.fn, node.span)
        name = self.temporary(kept, inner, join, node.fn, node.span)
        return _slot(slots, name, tuple(kept))

    def temporary(self, labels, inner, join, agg, span) -> str:
        """The name of a temporary step ``agg(join)`` keeping ``labels``: a new step, or an
        earlier one of the statement equal to it but for the names of labels (``SUM(C[i,k])``
        and ``SUM(C[i,m])``), computed once."""
        dtype = "int64" if agg in ARG_AGGS else self.dtype(join, inner, span)
        key = hoist.canonical(labels, inner, join, agg, dtype)
        if key not in self.temps:
            name = TensorRef.of(self.into).temporary(len(self.steps) + 1)
            self.dtypes[name] = dtype
            self.step(name, labels, inner, join, agg, False, dtype)
            self.temps[key] = name
        return self.temps[key]

    def _storable(self, join, inner) -> bool:
        """Whether ``join`` has a dtype a step may have (a part of a join may not)."""
        try:
            infer_dtype(join, [self.dtypes[t] for t, _ in inner])
        except Error:
            return False
        return True

    def split(self, join, slots, out_labels, agg, span):
        """A sum of a product with factors that are functions of tensors (``SUM(RELU(H[b,f]) *
        W2[f,o])``) -> the product of their elementwise steps, as a LET of each would make it
        (``hoist.py``): the planner then runs it as a contraction, not a broadcast."""
        if not hoist.splittable(join, slots, out_labels, agg):
            labels = hoist.own_step(join, slots)  # an elementwise step made already: read it
            if labels is not None:
                inner: list[tuple[str, tuple[str, ...]]] = []
                fjoin = hoist.remap(join, lambda i: _slot(inner, *slots[i]).index)
                if not self._storable(fjoin, inner):
                    return join, slots
                key = hoist.canonical(labels, inner, fjoin, "sum", self.dtype(fjoin, inner, span))
                if key in self.temps:
                    return scalar.Input(0), [(self.temps[key], labels)]
            return join, slots
        out: list[tuple[str, tuple[str, ...]]] = []
        parts = []
        for f in hoist.factors(join):
            labels = hoist.own_step(f, slots)
            inner: list[tuple[str, tuple[str, ...]]] = []
            fjoin = hoist.remap(f, lambda i: _slot(inner, *slots[i]).index)
            if labels is not None and not self._storable(fjoin, inner):
                labels = None  # (1 + LOG(b) on a bool is float16: kept in the join, as NumPy)
            if labels is None:
                parts.append(hoist.remap(f, lambda i: _slot(out, *slots[i]).index))
                continue
            name = self.temporary(labels, inner, fjoin, "sum", span)
            parts.append(_slot(out, name, labels))
        return hoist.product(parts), out
