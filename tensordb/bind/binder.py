"""Einsum statements (AST) -> checked steps (``emit.BoundStep``), with every check made here so
that errors point at the source.

Label rules (the Einstein convention, with explicit aggregates):

* a label on the left is kept; every other label is aggregated;
* labels are scoped like variables: a label belongs to the outermost scope (the statement's term,
  or an aggregate call: SUM, MAX, MIN, PROD, ARGMAX, ARGMIN, MEAN, COUNT, LOGSUMEXP with one
  argument) where it is used outside every
  aggregate call nested in that scope, and is aggregated there; inner aggregates keep it. A label
  used only inside aggregate calls belongs to each of them separately, so in
  ``S[i,j] = EXP(X[i,j] - MAX(X[i,k])) / SUM(EXP(X[i,k] - MAX(X[i,m])))`` the first MAX and the
  SUM each aggregate their own k; unless that leaves an aggregate call with nothing: then it
  claims the labels all its inner aggregate calls use (derived.py);
* a label used outside every aggregate is summed by an implicit SUM around its term, as in
  Einstein's convention: ``C[i,k] = A[i,j] * B[j,k] + D[i,k]`` sums the product over j, not D;
* a nested aggregate becomes a temporary step of its own (``H.t1``), never stored;
* a label has one size throughout a statement.

>>> from tensordb.dialect import parse
>>> class Cat:
...     def has(self, n): return n in "XWc"
...     def meta(self, n): return type("M", (), {"shape": {"X": (2, 3), "W": (3, 4), "c": (4,)}[n],
...                                              "dtype": "float64"})
>>> text = "H[b,f] = RELU(SUM(X[b,h] * W[h,f]) + c[f])"
>>> low = lower(text, parse(text)[0], Lookup(Cat()).resolve, "H")
>>> [(s.into, s.out_labels, s.agg) for s in low.steps], low.shape
([('H.t1', ('b', 'f'), 'sum'), ('H', ('b', 'f'), 'sum')], (2, 4))
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from ..errors import BinderError, CatalogError, Error, NotSupportedError, Span
from ..geometry import BoxName, GatherName
from ..plan import scalar
from ..dtypes import check_dtype
from ..plan.builder import infer_dtype, parse_spec
from ..plan.aggregates import ARG_AGGS, empty_aggregate
from ..dialect import ast as A
from .exprs import SCALAR_FUNCTIONS, Expressions
from .emit import BoundStep
from .scope import free_labels as _free_labels
from .scope import AGGREGATES, DERIVED
from .scope import is_aggregate as _is_aggregate
from .scope import labels_in as _labels_in
from .scope import terms as _terms

__all__ = ["BoundStep", "Lowered", "Lookup", "lower", "AGGREGATES", "SCALAR_FUNCTIONS", "check_pieces"]


# resolve(name, span[, box]) -> (graph name, shape, dtype); raises CatalogError with the span.
# With a box (one (start, stop) per dimension: a slice), the name of that box of a stored tensor
# (geometry.BoxName), its extent and dtype; a BinderError when the name is not a stored tensor.
Resolver = Callable[..., tuple[str, tuple[int, ...], str]]


class Lookup:
    """Resolve names against the catalog only (what a single statement sees)."""

    def __init__(self, catalog) -> None:
        self.catalog = catalog

    def resolve(self, name: str, span: Span, box=None, gather=None):
        if not self.catalog.has(name):
            raise CatalogError(f"unknown tensor '{name}'", span=span)
        meta = self.catalog.meta(name)
        dtype = check_dtype(meta.dtype, name).name
        if box is not None:
            b = BoxName(name, box)
            return b, b.shape, dtype
        if gather is not None:
            g = GatherName(name, gather, self.catalog.meta(gather).shape, meta.shape)
            return g, g.shape, dtype
        return name, tuple(int(n) for n in meta.shape), dtype


def _err(script: str, span: Span, message: str, cls=BinderError, hint: str | None = None) -> Error:
    return cls(message, statement=script, span=span, hint=hint)


def check_pieces(script: str, values, labels: set[str], what: str) -> dict[str, int]:
    """PIECES (label pieces, ...) of a WITH clause -> {label: pieces}, each label one the statement has."""
    out: dict[str, int] = {}
    for v in values:
        if v.label is None:
            raise _err(script, v.span, "WITH (PIECES ...) names labels: write PIECES i 4, k 2")
        if v.label not in labels:
            raise _err(script, v.span, f"PIECES names label '{v.label}', which {what} does not use",
                       hint=f"labels: {', '.join(sorted(labels))}")
        if v.value < 1:
            raise _err(script, v.span, f"label '{v.label}' needs at least 1 piece, got {v.value}")
        if v.label in out:
            raise _err(script, v.span, f"label '{v.label}' is given pieces twice")
        out[v.label] = v.value
    return out


@dataclass(frozen=True)
class Lowered:
    """The steps of one statement (temporaries first), the result's shape and dtype, the pieces
    fixed per label (WITH (PIECES ...))."""

    steps: list[BoundStep]
    shape: tuple[int, ...]
    dtype: str
    pieces: dict[str, int]


def lower(script: str, stmt: A.AssignStmt, resolve: Resolver, into: str, *, store: bool = True
          ) -> Lowered:
    """The steps computing ``stmt`` into graph name ``into``."""
    expr = stmt.expr
    for node in A.walk(expr):
        if isinstance(node, A.Call) and node.fn == "einsum" and node is not expr:
            raise _err(script, node.fn_span, "EINSUM must be the whole right side of a statement")
        if isinstance(node, A.Call) and node.fn == "grad":
            raise _err(script, node.fn_span, "GRAD must be the whole right side of a statement",
                       hint="write dW = GRAD(L, W); then use dW in other statements")
    if isinstance(expr, A.Call) and expr.fn == "einsum":
        return _lower_einsum(script, stmt, expr, resolve, into, store)
    return _Lowering(script, stmt, resolve, into, store).run()


def _lower_einsum(script, stmt, call: A.Call, resolve, into, store):
    if stmt.target.labels is not None:
        raise _err(script, stmt.target.span, "EINSUM's spec gives the output labels: write "
                   f"{stmt.target.name} = EINSUM('...', ...) without labels on the left")
    if not call.args or not isinstance(call.args[0], A.String):
        raise _err(script, call.span, "EINSUM needs a spec string first: EINSUM('ij,jk->ik', A, B)")
    spec = call.args[0].value
    names, shapes, dtypes = [], [], []
    for arg in call.args[1:]:
        if not isinstance(arg, A.Ref) or arg.labels is not None:
            raise _err(script, arg.span, "EINSUM operands are tensor names (without labels)")
        gname, shape, dtype = resolve(arg.name, arg.name_span)
        names.append(gname)
        dtypes.append(dtype)
        shapes.append(shape)
    if not names:
        raise _err(script, call.span, "EINSUM needs at least one tensor operand")
    try:
        labels, out, sizes = parse_spec(spec, shapes)
    except BinderError as exc:
        raise _err(script, call.args[0].span, exc.message, hint=exc.hint) from None
    used = {l for ls in labels for l in ls}
    pieces = check_pieces(script, stmt.pieces, {l for l in used if len(l) == 1}, "the spec")
    join = scalar.product(len(names))
    dtype = infer_dtype(join, dtypes)
    step = BoundStep(into, tuple(out), tuple((n, tuple(ls)) for n, ls in zip(names, labels)), join,
                     "sum", store, tuple(sizes.items()), dtype)
    return Lowered([step], tuple(sizes[l] for l in out), dtype, pieces)


class _Lowering(Expressions):
    """One index-notation statement -> steps (temporaries for nested aggregates first)."""

    def __init__(self, script, stmt: A.AssignStmt, resolve: Resolver, into: str, store: bool):
        self.script, self.stmt, self.resolve = script, stmt, resolve
        self.into, self.store = into, store
        self.steps: list[BoundStep] = []
        self.sizes: dict[str, tuple[int, str, Span]] = {}  # label -> (size, where, span)
        self.refs: dict[int, tuple[str, tuple[int, ...], str]] = {}  # id(Ref) -> resolved
        self.dtypes: dict[str, str] = {}
        self.count_steps = False  # COUNT as a step of its own (a statement of counts alone)
        self._kept: list = []     # AST nodes made while lowering (SOFTMAX), kept alive
        self.temps: dict[tuple, str] = {}  # hoist.canonical(temporary step) -> its name

    def err(self, span, message, **kw):
        return _err(self.script, span, message, **kw)

    def step(self, into, out_labels, slots, join, agg, store, dtype) -> None:
        """A checked step over the statement's labels (their sizes checked once, here)."""
        sizes = tuple((l, n) for l, (n, _, _) in self.sizes.items())
        self.steps.append(BoundStep(into, tuple(out_labels), tuple(slots), join, agg, store,
                                    sizes, dtype))

    def dtype(self, join, slots, span) -> str:
        """NumPy's dtype for ``join`` (see ``infer_dtype``), or its error at ``span``."""
        names = [f"{t}[{','.join(ls)}]" if ls else t for t, ls in slots]
        try:
            return infer_dtype(join, [self.dtypes[t] for t, _ in slots], names)
        except Error as exc:
            raise exc.with_source(self.script, span) from None

    def run(self):
        stmt = self.stmt
        lhs = stmt.target.labels or ()
        seen = set()
        for lab in lhs:
            if lab.name in seen:
                raise self.err(lab.span, f"label '{lab.name}' appears twice on the left")
            seen.add(lab.name)
        self._resolve_refs(stmt.expr)
        for node in A.walk(stmt.expr):  # an aggregate with no argument leaves labels unused:
            if isinstance(node, A.Call) and node.fn in ("sum", "prod") + DERIVED and not node.args:
                self.call(node, [])  # say what is wrong with it, not with the labels
        used = Counter(l.name for r in A.refs(stmt.expr) for l in (r.labels or ()))
        for lab in lhs:
            if lab.name not in used:
                raise self.err(lab.span, f"label '{lab.name}' on the left appears nowhere on the right")
        self.lhs = [l.name for l in lhs]
        expr = stmt.expr
        top = _is_aggregate(expr) and expr.fn not in DERIVED  # MEAN is a SUM's step, then a /
        if top:
            agg, body = expr.fn, expr.args[0]
        else:
            agg, body = "sum", expr
            if len(_terms(expr)) > 1:
                body = self._split_terms(expr)
        # Labels the top step keeps or aggregates; nested aggregates keep these.
        self.outer = set(self.lhs) | set(_free_labels(body))
        if top and self.outer == set(self.lhs):  # nothing of its own: what it may claim
            self.outer |= set(self._claim(body, self.outer))
        slots: list[tuple[str, tuple[str, ...]]] = []
        join = self.conv(body, slots)
        if not slots and any(isinstance(n, A.Call) and n.fn == "count" for n in A.walk(expr)):
            self.steps, self.count_steps = [], True  # counts alone: computed over the labels kept
            join = self.conv(body, slots)
        if not slots:
            raise self.err(expr.span, "the right side uses no tensor")
        if top and all(l in self.lhs for _, ls in slots for l in ls):
            raise self._nothing_to_aggregate(expr, set(self.lhs))
        if top:
            own = [l for _, ls in slots for l in ls if l not in self.lhs]
            self._check_empty(expr, own)
            self._check_index(expr, own)
        pieces = check_pieces(self.script, stmt.pieces, set(used), "the statement")
        shape = tuple(self.sizes[l][0] for l in self.lhs)
        join, slots = self.split(join, slots, self.lhs, agg, expr.span)
        dtype = self.dtype(join, slots, expr.span)
        if agg in ARG_AGGS:
            dtype = "int64"
        self.step(self.into, self.lhs, slots, join, agg, self.store, dtype)
        return Lowered(self.steps, shape, dtype, pieces)

    def _check_index(self, node: A.Call, aggregated) -> None:
        """ARGMAX and ARGMIN give an index along one label (numpy.argmax with one axis)."""
        own = list(dict.fromkeys(aggregated))
        if node.fn in ARG_AGGS and len(own) != 1:
            raise self.err(node.fn_span, f"{node.fn.upper()} aggregates exactly one label into "
                           f"an index, here {len(own)}: {', '.join(own)}",
                           hint="keep the other labels on the left, or aggregate them first "
                                "with an inner MAX or SUM")

    def _check_empty(self, node: A.Call, aggregated) -> None:
        """MAX, MIN, ARGMAX and ARGMIN over a label of size 0 have no value (numpy raises too)."""
        empty = [l for l in dict.fromkeys(aggregated) if self.sizes[l][0] == 0]
        if empty and node.fn in ("max", "min") + ARG_AGGS:
            err = empty_aggregate(node.fn, empty, self.into)
            raise self.err(node.fn_span, err.message, cls=type(err), hint=err.hint)

    def _nothing_to_aggregate(self, node: A.Call, outer: set[str]) -> Error:
        """The error for an aggregate call none of whose labels is its own, with the reason."""
        fn = node.fn.upper()
        inner = [l for l in _labels_in(node.args[0]) if l not in outer]
        if inner:  # its other labels belong to aggregates inside it
            names = ", ".join(f"'{l}'" for l in inner)
            return self.err(node.fn_span, f"{fn} aggregates no label: {names} "
                            f"{'is' if len(inner) == 1 else 'are'} aggregated by the aggregate "
                            "calls inside it, and its other labels are kept",
                            hint="a label used only inside aggregate calls belongs to each of "
                                 "them; use it outside them too for the outer call to aggregate it")
        if all(l in self.lhs for l in _labels_in(node.args[0])):
            return self.err(node.fn_span, f"{fn} aggregates no label: every label of its "
                            "argument is on the left",
                            hint="a label that is not on the left is aggregated")
        return self.err(node.fn_span, f"{fn} aggregates no label: each label of its argument is "
                        "also used outside it or on the left",
                        hint="use a label of its own for the dimension to aggregate, "
                             "e.g. MAX(X[i,k]) next to X[i,j]")

    def _split_terms(self, node):
        """Einstein's convention sums per term: in ``A[i,j]*B[j,k] + c[k]`` only the product sums
        over j. A term with labels that are not on the left (outside its own aggregates) becomes
        an implicit SUM of that term, which is then the scope of those labels."""
        if isinstance(node, A.BinOp) and node.op in "+-":
            return A.BinOp(node.op, self._split_terms(node.left), self._split_terms(node.right), node.span)
        if isinstance(node, A.Chain) and node.additive:
            return A.Chain(self._split_terms(node.first),
                           tuple((op, self._split_terms(t)) for op, t in node.rest), node.span)
        if isinstance(node, A.Neg):
            return A.Neg(self._split_terms(node.operand), node.span)
        free = [l for l in _free_labels(node) if l not in self.lhs]
        if free:
            node = A.Call("sum", (node,), node.span, node.span)
        return node

    # -- names, label counts and sizes --------------------------------------------------------
    def _resolve_refs(self, expr) -> None:
        for ref in A.refs(expr):
            gname, shape, dtype = self.resolve(ref.name, ref.name_span)
            labels = ref.labels or ()
            if ref.gather is not None:  # E[tok[b], d]: the rows of E that tok's values select
                gname, shape, dtype = self._gather(ref, shape)
            if len(labels) != len(shape):
                shown = f"[{','.join(l.name for l in labels)}]" if ref.labels is not None else "no labels"
                raise self.err(ref.span, f"{ref.name} has {len(shape)} dimension(s) but is indexed "
                               f"with {len(labels)} label(s): {shown}",
                               hint=f"{ref.name} has shape {shape}")
            if any(lab.range is not None for lab in labels):  # a slice: a box of a stored tensor
                box = tuple(self._box(ref, axis, lab, shape) for axis, lab in enumerate(labels))
                gname, shape, dtype = self.resolve(ref.name, ref.span, box)
            for axis, (lab, n) in enumerate(zip(labels, shape)):
                where = f"{ref.name} axis {axis}" if lab.range is None else \
                    f"the slice {ref.name}[{self.script[lab.span.start:lab.span.end]}] of axis {axis}"
                if lab.name in self.sizes and self.sizes[lab.name][0] != n:
                    first_n, first_where, _ = self.sizes[lab.name]
                    raise self.err(lab.span, f"label '{lab.name}' has size {first_n} in {first_where} "
                                   f"but {n} in {where}")
                self.sizes.setdefault(lab.name, (n, where, lab.span))
            self.refs[id(ref)] = (gname, shape, dtype)
            self.dtypes[gname] = dtype

    def _gather(self, ref: A.Ref, shape: tuple[int, ...]):
        """A gather's input: its index a stored integer tensor with one label per dimension."""
        index, ispan, n = ref.gather
        _, ishape, idtype = self.resolve(index, ispan)
        if len(ishape) != n:
            raise self.err(ispan, f"the index tensor {index} has {len(ishape)} dimension(s) but "
                           f"is indexed with {n} label(s)", hint=f"{index} has shape {ishape}")
        if not idtype.startswith(("int", "uint")):
            raise self.err(ispan, f"the index tensor {index} of a gather is {idtype}, not an "
                           "integer tensor", hint="load the row numbers as int32 or int64")
        if not shape:
            raise self.err(ref.name_span, f"{ref.name} is a scalar: a gather selects rows")
        sliced = next((l for l in ref.labels if l.range is not None), None)
        if sliced is not None:
            raise self.err(sliced.span, "a slice next to a gather is not supported",
                           cls=NotSupportedError)
        return self.resolve(ref.name, ref.name_span, gather=index)

    def _box(self, ref: A.Ref, axis: int, lab: A.Label, shape) -> tuple[int, int]:
        """The (start, stop) a subscript reads of ``axis`` of ``shape``: all of it for a label;
        a slice's bounds as Python's (omitted: the ends; negative: from the end). A slice out of
        range or empty is an error (numpy would clip it, or give an empty array)."""
        n = shape[axis]
        if lab.range is None:
            return 0, n
        lo, hi = lab.range
        start = 0 if lo is None else lo + n if lo < 0 else lo
        stop = n if hi is None else hi + n if hi < 0 else hi
        text = self.script[lab.span.start:lab.span.end]
        if not (0 <= start <= n and 0 <= stop <= n):
            raise self.err(lab.span, f"slice '{text}' is out of range for {ref.name} axis {axis}, "
                           f"of size {n}", hint=f"{ref.name} has shape {shape}; "
                           f"bounds lie in -{n}..{n}")
        if stop <= start:
            raise self.err(lab.span, f"slice '{text}' of {ref.name} axis {axis} (size {n}) is empty: "
                           f"it reads {start}:{stop}", hint="a slice reads at least one element")
        return start, stop

