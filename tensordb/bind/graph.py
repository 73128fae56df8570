"""The Python API's ``Graph`` (``Graph.einsum``/``op``, ``con.run``, ``con.einsum``) -> checked
steps, through the checks the statements get, with a caret on every error.

A step has no source text, so the binder writes one: the call as the user made it
(``einsum('ij,jk->ik', 'A', 'B', into='C')``), remembering where each part is, and every error
points at its part (the operand, the spec, a label, the join, the aggregate).

>>> class Cat:
...     def has(self, n): return n == "A"
...     def meta(self, n): return type("M", (), {"name": "A", "shape": (2, 3), "dtype": "float64"})
>>> from tensordb.plan.builder import Graph
>>> try:
...     bind_graph(Graph().einsum("ij,jk->ik", "A", "B", into="C"), Cat())
... except Exception as exc:
...     print(exc)
unknown tensor 'B'
LINE 1: einsum('ij,jk->ik', 'A', 'B', into='C')
                                 ^~~
HINT: known tensors: A
"""
from __future__ import annotations

import difflib
import math
import warnings
import re

from ..dtypes import check_dtype
from ..geometry import BoxName, GatherName
from ..errors import BinderError, CatalogError, Error, GradientWarning, InternalError, Span
from ..plan import scalar
from ..plan.aggregates import AGGREGATES, AGGS, ARG_AGGS, empty_aggregate
from ..plan.builder import Graph, GradRequest, Step, infer_dtype, parse_spec
from ..plan.ir import EinGraph, TensorInfo
from ..plan.names import TensorRef
from ..plan.select import box_select
from .emit import BoundStep, Emitter, GradStep

__all__ = ["bind_graph", "source_of"]

_SLICE = re.compile(r"^\s*([^\W\d]\w*)\s*\[(.*)\]\s*$", re.S)
_NAME = re.compile(r"^[^\W\d]\w*$")
_RANGE = re.compile(r"^\s*(-?\d{1,30})?\s*:\s*(-?\d{1,30})?\s*$")


def bind_graph(graph: Graph, catalog) -> EinGraph:
    """Resolve a Graph's names against ``catalog`` (anything with ``has`` and ``meta``; ``list``
    for hints, ``open`` for finiteness facts) and check it into an EinGraph."""
    binder = _GraphBinder(catalog)
    for step in graph.steps:
        text, spans = source_of(step)
        try:
            binder.add(step, spans)
        except Error as exc:
            raise exc.with_source(text, spans["call"])
        except Exception as exc:
            raise InternalError(f"internal error: {type(exc).__name__}: {exc}", statement=text,
                                span=spans["call"]) from exc
    return binder.emitter.graph()


# -- the source text of a step ------------------------------------------------------------------

class _Writer:
    """Text written part by part, with the span of each named part."""

    def __init__(self) -> None:
        self.text = ""
        self.spans: dict = {}

    def put(self, text: str, key=None) -> None:
        if key is not None:
            self.spans[key] = Span(len(self.text), len(self.text) + len(text))
        self.text += text

    def labels(self, labels, key) -> None:
        """Labels as the user may have written them: 'ij' (one character each) or a list."""
        labels = list(labels)
        start = len(self.text)
        if all(len(l) == 1 and l.isalnum() for l in labels):
            self.put("'")
            for axis, l in enumerate(labels):
                self.put(l, (key, axis))
            self.put("'")
        else:
            self.put("[")
            for axis, l in enumerate(labels):
                self.put(", " if axis else "")
                self.put(repr(l), (key, axis))
            self.put("]")
        self.spans[key] = Span(start, len(self.text))


def source_of(step: Step | GradRequest) -> tuple[str, dict]:
    """The call that made ``step``, as text, and the span of each part: ``"call"``, ``"into"``,
    ``"spec"``, ``"out"``, ``("operand", k)``, ``("labels", k)`` and ``(("labels", k), axis)``,
    ``"join"``, ``"agg"``; for a ``grad`` call ``"loss"``, ``("wrt", k)`` and ``("into", k)``."""
    w = _Writer()
    if isinstance(step, GradRequest):
        w.put("grad(")
        w.put(repr(str(step.loss)), "loss")
        for key, names in (("wrt", step.wrt), ("into", step.into)):
            w.put(", into=" if key == "into" else ", ")
            w.put("[" if len(names) > 1 else "")
            for k, n in enumerate(names):
                w.put(", " if k else "")
                w.put(repr(str(n)), (key, k))
            w.put("]" if len(names) > 1 else "")
        w.put(")")
        w.spans["call"] = Span(0, len(w.text))
        return w.text, w.spans
    if step.spec is not None:
        w.put("einsum(")
        w.put(repr(step.spec), "spec")
        for k, (t, _) in enumerate(step.inputs):
            w.put(", ")
            w.put(repr(str(t)), ("operand", k))
        if step.named:
            w.put(", into=")
            w.put(repr(str(step.into)), "into")
    else:
        w.put("op(")
        w.put(repr(str(step.into)), "into")
        w.put(", ")
        w.labels(step.out_labels or (), "out")
        w.put(", [")
        for k, (t, ls) in enumerate(step.inputs):
            w.put(", (" if k else "(")
            w.put(repr(str(t)), ("operand", k))
            w.put(", ")
            w.labels(ls or (), ("labels", k))
            w.put(")")
        w.put("]")
    if step.join is not None:
        w.put(", join=")
        w.put(repr(scalar.render(step.join)), "join")
    if step.agg != "sum":
        w.put(", agg=")
        w.put(repr(step.agg), "agg")
    if not step.store:
        w.put(", store=False")
    w.put(")")
    w.spans["call"] = Span(0, len(w.text))
    return w.text, w.spans


# -- the checks ---------------------------------------------------------------------------------

def _at(exc: Error, span: Span) -> Error:
    """``exc`` pointing at ``span`` (the text is attached by ``bind_graph``)."""
    if exc.span is None:
        exc.span = span
    return exc


class _GraphBinder:
    """Check steps one by one (names, labels, sizes, dtypes) and emit them."""

    def __init__(self, catalog) -> None:
        self.catalog = catalog
        self.emitter = Emitter(catalog)
        self.known: dict[str, tuple[tuple[int, ...], str]] = {}  # name -> shape, dtype

    def add(self, step: Step | GradRequest, spans: dict) -> None:
        emitter = self.emitter
        if isinstance(step, GradRequest):
            self._grad(step, spans)
            return
        if step.agg not in AGGS + _DERIVED:
            raise BinderError(f"unknown aggregate '{step.agg}'", span=spans.get("agg"),
                              hint=f"valid aggregates: {', '.join(AGGS + _DERIVED)}")
        if step.into in self.known and step.into not in emitter.inputs or \
                step.into in emitter.alias:
            raise BinderError(f"'{step.into}' is defined twice in one graph",
                              span=spans.get("into", spans["call"]))
        names = [emitter.alias.get(t, t) for t, _ in step.inputs]
        shapes, dtypes = [], []
        for k, name in enumerate(names):
            if "[" in name:  # a slice, 'X[0:100, :]': a box of a stored tensor
                names[k], shape, dtype = self._resolve_box(name, spans[("operand", k)])
            else:
                shape, dtype = self._resolve(name, spans[("operand", k)])
            shapes.append(shape)
            dtypes.append(dtype)
        join = step.join if step.join is not None else scalar.product(len(names))
        where = spans.get("join", spans["call"])
        bad = sorted(i for i in join.inputs() if not 0 <= i < len(names))
        if bad:
            raise BinderError(f"the join refers to x{bad[0]}, but the einsum has "
                              f"{len(names)} operand(s): x0..x{len(names) - 1}", span=where,
                              hint="x0, x1, ... name the operands in the order given")
        if step.spec is not None:
            try:
                labels, out, sizes = parse_spec(step.spec, shapes)
            except Error as exc:
                raise _at(exc, spans["spec"]) from None
        else:
            labels, out, sizes = _explicit_labels(step, names, shapes, spans)
        agg = step.agg
        if agg == "mean":  # numpy.mean: the SUM in the float dtype (x * 1.0), then / the count
            join, agg = scalar.Call("*", (join, scalar.Const(1.0))), "sum"
        elif agg == "logsumexp":  # its MAX first; x * 1.0, as scipy reads bools and ints
            join, agg = scalar.Call("*", (join, scalar.Const(1.0))), "max"
        try:
            dtype = infer_dtype(join, dtypes, names)
        except Error as exc:
            raise _at(exc, where) from None
        aggregated = [l for ls in labels for l in ls if l not in out]
        if step.agg in ARG_AGGS and aggregated:
            if len(set(aggregated)) != 1:
                raise BinderError(f"agg={step.agg!r} aggregates exactly one label into an index, "
                                  f"here {len(set(aggregated))}: "
                                  f"{', '.join(dict.fromkeys(aggregated))}",
                                  span=spans.get("agg", spans["call"]))
            dtype = "int64"
        empty = [l for l in dict.fromkeys(aggregated) if sizes[l] == 0]
        if empty and step.agg == "logsumexp":  # over nothing: LOG(0) = -inf, as scipy's
            agg = "sum"
        if empty and AGGREGATES[agg].identity is None:
            shown = [f"{t}[{','.join(ls)}]" for t, ls in zip(names, labels)]
            what = f"{step.into}[{','.join(out)}] = {step.agg.upper()}({scalar.render(join, shown)})"
            raise _at(empty_aggregate(step.agg, empty, what), spans.get("agg", spans["call"]))
        n = len(emitter.ops)
        inputs = tuple(zip(names, map(tuple, labels)))
        if step.agg == "mean" and aggregated:
            count = math.prod(sizes[l] for l in dict.fromkeys(aggregated))
            total = TensorRef.of(step.into).temporary(1)
            emitter.add(BoundStep(total, tuple(out), inputs, join, "sum", False,
                                  tuple(sizes.items()), dtype))
            join = scalar.Call("/", (scalar.Input(0), scalar.Const(count)))
            inputs = ((total, tuple(out)),)
        elif step.agg == "logsumexp" and empty:  # SUM over nothing (0), then its LOG
            total = TensorRef.of(step.into).temporary(1)
            ones = scalar.Call("+", (scalar.Call("*", (join, scalar.Const(0))), scalar.Const(1)))
            dtype = infer_dtype(scalar.Call("*", (join, scalar.Const(1.0))), dtypes, names)
            emitter.add(BoundStep(total, tuple(out), inputs, ones, "sum", False,
                                  tuple(sizes.items()), dtype))
            join, inputs = scalar.Call("log", (scalar.Input(0),)), ((total, tuple(out)),)
        elif step.agg == "logsumexp" and aggregated:
            inputs, join, agg, dtype = _logsumexp(emitter, step, inputs, join, out, sizes,
                                                  dtypes, names, where)
        emitter.add(BoundStep(step.into, tuple(out), inputs, join, agg, step.store,
                              tuple(sizes.items()), dtype))
        for op in emitter.ops[n:]:
            self.known[op.output] = (op.out_shape, op.dtype)

    def _grad(self, req: GradRequest, spans: dict) -> None:
        """grad(loss, wrt, into=): the loss a scalar float computed by an earlier step."""
        emitter = self.emitter
        loss = emitter.alias.get(req.loss, req.loss)
        if not any(op.output == loss for op in emitter.ops):
            raise BinderError(f"grad: the loss '{req.loss}' is not computed by an earlier step "
                              "of this graph", span=spans["loss"],
                              hint="add the step that computes it to the same Graph first")
        shape, dtype = self.known[loss]
        if shape != ():
            raise BinderError(f"grad: the loss '{req.loss}' is not a scalar: it has shape "
                              f"{shape}", span=spans["loss"])
        if check_dtype(dtype, req.loss).kind != "f":
            raise BinderError(f"grad: the loss '{req.loss}' is {dtype}, not a float",
                              span=spans["loss"])
        wrt = []
        for k, (name, into) in enumerate(zip(req.wrt, req.into)):
            t = emitter.alias.get(name, name)
            wshape, wdtype = self._resolve(t, spans[("wrt", k)])
            index_of = [str(n) for n in emitter.inputs
                        if isinstance(n, GatherName) and n.index == t]
            if index_of:  # integer positions: no derivative
                raise BinderError(f"grad with respect to '{name}', the index of the gather "
                                  f"{index_of[0]}: an index has no gradient",
                                  span=spans[("wrt", k)])
            if into in self.known and into not in emitter.inputs or into in emitter.alias or \
                    into in req.into[:k]:
                raise BinderError(f"'{into}' is defined twice in one graph",
                                  span=spans[("into", k)])
            _warn_unused(emitter, req.loss, loss, name, t)
            wrt.append((t, into, req.store))
            self.known[into] = (wshape, wdtype if check_dtype(wdtype, t).kind == "f"
                                else "float64")
        emitter.add(GradStep(loss, tuple(wrt)))

    def _resolve(self, name: str, span: Span) -> tuple[tuple[int, ...], str]:
        """An earlier step's result, else a stored tensor (read once, handed to the emitter)."""
        if name in self.known:
            return self.known[name]
        if not self.catalog.has(name):
            raise CatalogError(f"unknown tensor '{name}'", span=span, hint=self._hint(name))
        meta = self.catalog.meta(name)
        info = TensorInfo(name, tuple(int(n) for n in meta.shape),
                          check_dtype(meta.dtype, name).name)
        self.emitter.read(info)
        self.known[name] = (info.shape, info.dtype)
        return self.known[name]

    def _resolve_box(self, text: str, span: Span):
        """An operand ``'X[0:100, :]'``: numpy's basic slicing (half-open ranges, omitted and
        negative bounds, axes left out read whole; no step) of a stored tensor, read as the
        box it names (geometry.BoxName). Out-of-range and empty slices are errors."""
        m = _SLICE.match(text)
        if m is None:
            raise BinderError(f"operand '{text}': a slice is written 'X[0:100, :]' (ranges "
                              "lo:hi, without a step)", span=span)
        name = m.group(1)
        computed = name in self.known and name not in self.emitter.stored
        shape, dtype = self._resolve(name, span)
        parts = [p.strip() for p in m.group(2).split(",")]
        if len(parts) == 1 and _NAME.match(parts[0]):  # 'E[tok]': a gather, numpy's E[tok]
            if computed:
                raise BinderError(f"cannot gather from '{name}': it is computed by this graph, "
                                  "and a gather reads stored tensors", span=span,
                                  hint=f"store {name} first, then gather from it in another graph")
            return self._gather(name, parts[0], shape, dtype, span)
        if len(parts) > len(shape):
            raise BinderError(f"operand '{text}': {len(parts)} subscripts for {name} of shape "
                              f"{shape}", span=span)
        box = []
        for axis, n in enumerate(shape):
            r = _RANGE.match(parts[axis]) if axis < len(parts) else _RANGE.match(":")
            if r is None:
                raise BinderError(f"operand '{text}': subscript '{parts[axis]}' is not a range "
                                  "lo:hi", span=span, hint="an index or a step is not supported")
            lo, hi = (None if g is None else int(g) for g in r.groups())
            start = 0 if lo is None else lo + n if lo < 0 else lo
            stop = n if hi is None else hi + n if hi < 0 else hi
            if not (0 <= start <= n and 0 <= stop <= n):
                raise BinderError(f"operand '{text}': slice '{parts[axis]}' is out of range for "
                                  f"{name} axis {axis}, of size {n}", span=span)
            if stop <= start:
                raise BinderError(f"operand '{text}': slice '{parts[axis]}' of {name} axis "
                                  f"{axis} (size {n}) is empty", span=span)
            box.append((start, stop))
        if computed:  # an earlier step's result: selected by an operation (plan/select.py)
            into = TensorRef(f"{name}.slice[{','.join(f'{a}:{b}' for a, b in box)}]")
            if into not in self.known:
                sel = box_select(shape, box, dtype).with_source(name)
                for t, _ in sel.inputs[1:]:
                    self.emitter.read(TensorInfo(t, t.shape, "int64"))
                self.emitter.add(BoundStep(into, sel.out_labels, sel.inputs, sel.join, sel.agg,
                                           False, tuple(sel.sizes.items()), dtype))
                self.known[into] = (tuple(b - a for a, b in box), dtype)
            return (into, *self.known[into])
        b = BoxName(name, box)
        self.emitter.read(TensorInfo(b, b.shape, dtype))
        return b, b.shape, dtype

    def _gather(self, name: str, index: str, shape, dtype: str, span: Span):
        """An operand ``'E[tok]'``: the rows of stored ``E`` that the values of the stored
        integer tensor ``tok`` select (geometry.GatherName)."""
        if index in self.known and index not in self.emitter.stored:
            raise BinderError(f"cannot gather with '{index}': it is computed by this graph, and "
                              "a gather reads stored tensors", span=span)
        ishape, idtype = self._resolve(index, span)
        if check_dtype(idtype, index).kind not in "iu":
            raise BinderError(f"the index tensor {index} of a gather is {idtype}, not an integer "
                              "tensor", span=span, hint="load the row numbers as int32 or int64")
        if not shape:
            raise BinderError(f"{name} is a scalar: a gather selects rows", span=span)
        g = GatherName(name, index, ishape, shape)
        self.emitter.read(TensorInfo(g, g.shape, dtype))
        return g, g.shape, dtype

    def _hint(self, name: str) -> str | None:
        lister = getattr(self.catalog, "list", None)
        known = [m.name for m in lister()] if lister is not None else []
        known += [str(k) for k in self.known if k not in known]
        close = [k for k in known if k.lower() == name.lower()] or \
            difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        return f"did you mean '{close[0]}'?" if close else \
            f"known tensors: {', '.join(known[:12])}" if known else None


def _warn_unused(emitter, loss_name: str, loss: str, name: str, t: str) -> None:
    """A GradientWarning when the graph's ``loss`` does not depend on ``t``: zeros."""
    need = {loss}
    for op in reversed(emitter.ops):
        if op.output in need:
            need |= {o.tensor for o in op.inputs}
    if t in need or any(isinstance(n, (BoxName, GatherName)) and n.base == t for n in need):
        return
    why = f"'{name}' was replaced after '{loss_name}' read it" if t != name else \
        f"'{loss_name}' does not read '{name}'"
    warnings.warn(GradientWarning(f"grad({loss_name!r}, {name!r}) is zeros: {why}"),
                  stacklevel=3)


def _explicit_labels(step: Step, names: list[str], shapes: list[tuple[int, ...]], spans: dict
                     ) -> tuple[list[list[str]], list[str], dict[str, int]]:
    """Labels given per operand: one per dimension, one size per label, an output of labels
    the inputs use, each once."""
    labels = [list(ls) for _, ls in step.inputs]
    sizes: dict[str, int] = {}
    first: dict[str, str] = {}
    for k, (t, ls, shape) in enumerate(zip(names, labels, shapes)):
        if len(ls) != len(shape):
            raise BinderError(f"{t} has {len(shape)} dimension(s) but is indexed with "
                              f"{len(ls)} label(s) [{','.join(ls)}]", span=spans[("labels", k)],
                              hint=f"{t} has shape {shape}")
        for axis, (l, n) in enumerate(zip(ls, shape)):
            if l in sizes and sizes[l] != n:
                raise BinderError(f"label '{l}' has size {sizes[l]} in {first[l]} but {n} in "
                                  f"{t} axis {axis}", span=spans[(("labels", k), axis)])
            sizes.setdefault(l, n)
            first.setdefault(l, f"{t} axis {axis}")
    out = list(step.out_labels or ())
    for axis, l in enumerate(out):
        if l not in sizes:
            raise BinderError(f"output label '{l}' appears in no input", span=spans[("out", axis)])
        if out.index(l) != axis:
            raise BinderError(f"label '{l}' is repeated in the output", span=spans[("out", axis)])
    return labels, out, sizes


# Aggregates the Python API computes from others (the dialect's are in derived.py).
_DERIVED = ("mean", "logsumexp")


def _logsumexp(emitter, step, inputs, join, out, sizes, dtypes, names, where):
    """agg='logsumexp' as scipy.special.logsumexp: m = MAX of the join, SUM(EXP(join - s)) and
    LOG of it + s, with s = m where it is finite, else 0, not differentiated (it cancels).
    Returns the last step's inputs, join, aggregate and dtype."""
    def shift(m):
        finite = scalar.Call("==", (scalar.Call("-", (m, m)), scalar.Const(0)))
        return scalar.Call("_stop", (scalar.Call("where", (finite, m, scalar.Const(0))),))
    m = TensorRef.of(step.into).temporary(1)
    total = TensorRef.of(step.into).temporary(2)
    sized = tuple(sizes.items())
    m_dtype = infer_dtype(join, dtypes, names)
    emitter.add(BoundStep(m, tuple(out), inputs, join, "max", False, sized, m_dtype))
    body = scalar.Call("exp", (scalar.Call("-", (join, shift(scalar.Input(len(inputs))))),))
    try:
        dtype = infer_dtype(body, [*dtypes, m_dtype])
    except Error as exc:
        raise _at(exc, where) from None
    emitter.add(BoundStep(total, tuple(out), inputs + ((m, tuple(out)),), body, "sum", False,
                          sized, dtype))
    last = scalar.Call("+", (scalar.Call("log", (scalar.Input(0),)), shift(scalar.Input(1))))
    return ((total, tuple(out)), (m, tuple(out))), last, "sum", dtype

