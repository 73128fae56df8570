"""From user-level einsums to a bound EinGraph.

A ``Graph`` records steps by name (numpy einsum specs or explicit operations); ``bind`` resolves
the names against the catalog, checks labels and shapes, infers result dtypes, and splits
multi-operand products into pairwise steps in the order opt_einsum's path search finds best.

>>> g = Graph().einsum("ij,jk,kl->il", "A", "B", "C", into="D")
>>> [s.into for s in g.steps]
['D']
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import opt_einsum as oe

from ..dtypes import SUPPORTED_DTYPES, check_dtype
from ..errors import BinderError, CatalogError, DataError
from . import scalar
from .aggregates import AGGS
from .ir import EinGraph, EinOp, Operand, TensorInfo
from .names import TensorRef

__all__ = ["Graph", "Step", "TensorRef", "bind", "parse_spec", "split_pairwise", "infer_dtype"]


@dataclass(frozen=True)
class Step:
    """One operation by name: ``into[out] = agg(join(inputs))``; labels are still unchecked."""

    into: str                                     # a TensorRef for a version or temporary
    out_labels: tuple[str, ...] | None            # None: numpy spec, resolved at bind time
    inputs: tuple[tuple[str, tuple[str, ...] | None], ...]
    join: scalar.Expr | None = None               # None: product of the inputs
    agg: str = "sum"
    store: bool = True
    spec: str | None = None                       # the numpy spec, when given as one


@dataclass
class Graph:
    """A computation by name, planned and run as one graph by ``Connection.run``."""

    steps: list[Step] = field(default_factory=list)
    pieces: dict[str, dict[str, int]] = field(default_factory=dict)  # output -> {label: pieces}

    def einsum(self, spec: str, *operands: str, into: str, join: str | scalar.Expr | None = None,
               agg: str = "sum", store: bool = True, pieces: Mapping[str, int] | None = None) -> "Graph":
        """numpy's einsum (``...``, implicit output, repeated labels), optionally with another
        join over x0, x1, ... and another aggregate; ``pieces`` fixes pieces per label."""
        if not isinstance(spec, str) or not spec.strip():
            raise BinderError("an einsum needs a non-empty spec such as 'ij,jk->ik'")
        if not operands:
            raise BinderError(f"einsum '{spec}' needs at least one operand")
        j = _join(join)
        self.steps.append(Step(into, None, tuple((o, None) for o in operands), j, agg, store, spec))
        if pieces:
            self.pieces[into] = _pieces(pieces)
        return self

    def op(self, into: str, out: Sequence[str] | str, inputs: Sequence[tuple[str, Sequence[str] | str]],
           *, join: str | scalar.Expr | None = None, agg: str = "sum", store: bool = True,
           pieces: Mapping[str, int] | None = None) -> "Graph":
        """An explicit operation: labels given per input (a string is one label per character)."""
        j = _join(join)
        self.steps.append(Step(into, tuple(out), tuple((t, tuple(ls)) for t, ls in inputs),
                               j, agg, store))
        if pieces:
            self.pieces[into] = _pieces(pieces)
        return self


def _join(join) -> scalar.Expr | None:
    if join is None or isinstance(join, (scalar.Input, scalar.Const, scalar.Call)):
        return join
    if isinstance(join, str):
        return scalar.parse_join(join)
    raise BinderError(f"a join is a string such as 'x0 + x1', not {type(join).__name__}")


def _pieces(pieces) -> dict[str, int]:
    if not isinstance(pieces, Mapping):
        raise BinderError(f"pieces= maps labels to pieces, e.g. {{'i': 4}}, not {type(pieces).__name__}")
    return dict(pieces)


# -- numpy einsum specs ------------------------------------------------------------------------

def parse_spec(spec: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[list[str]], list[str],
                                                                       dict[str, int]]:
    """Numpy einsum semantics -> (labels per operand, output labels, label sizes).

    ``...`` becomes labels '…0', '…1', ... aligned from the right; a broadcast dimension of size 1
    gets a label of its own that is summed away (a sum over one element). opt_einsum's parser
    expands the ellipses and finds numpy's implicit output; the checks around it give tensordb's
    errors, with the spec named.
    """
    shapes = [tuple(s) for s in shapes]
    lhs, arrow, rhs = spec.replace(" ", "").partition("->")
    terms = lhs.split(",")
    ell_rank = _check_terms(spec, terms, rhs if arrow else None, shapes)
    parsed, implicit = _parse_numpy(spec, lhs, shapes)
    letters = set(lhs)
    # The implicit output starts with the ellipsis dimensions' symbols, in order (numpy's rule).
    slots = {c: slot for slot, c in enumerate(c for c in implicit if c not in letters)}
    labels, sizes = _label_operands(spec, parsed, shapes, slots, ell_rank)
    if arrow:
        output = _explicit_output(spec, rhs, sizes, ell_rank)
    else:
        output = [_ellipsis_label(slots[c]) if c in slots else c for c in implicit]
    return labels, output, sizes


def _check_terms(spec: str, terms: list[str], rhs: str | None,
                 shapes: Sequence[tuple[int, ...]]) -> int:
    """Subscripts are letters with at most one '...' per term, one term per operand, naming as
    many dimensions as the operand has. Returns the number of dimensions '...' stands for."""
    if len(terms) != len(shapes):
        raise BinderError(f"einsum '{spec}' has {len(terms)} operand term(s) but "
                          f"{len(shapes)} operand(s) were given")
    for term in terms + ([rhs] if rhs is not None else []):
        bad = [c for c in term.replace("...", "") if c not in string.ascii_letters]
        if bad or term.count("...") > 1 or "." in term.replace("...", ""):
            raise BinderError(f"einsum '{spec}': invalid subscript {term!r}",
                              hint="subscripts are letters, with at most one '...' per term")
    ell_rank = 0
    for pos, (term, shape) in enumerate(zip(terms, shapes)):
        explicit = len(term.replace("...", ""))
        if "..." not in term and explicit != len(shape):
            raise BinderError(f"einsum '{spec}': operand {pos} has {len(shape)} dimension(s) but "
                              f"subscripts {term!r} name {explicit}")
        k = len(shape) - explicit
        if k < 0:
            raise BinderError(f"einsum '{spec}': operand {pos} has {len(shape)} dimension(s), "
                              f"fewer than subscripts {term!r} name")
        ell_rank = max(ell_rank, k if "..." in term else 0)
    return ell_rank


def _parse_numpy(spec: str, lhs: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[str], str]:
    """opt_einsum's parser on the input terms: one symbol per dimension (the ellipses expanded)
    and numpy's implicit output. The explicit output is checked by ``_explicit_output``."""
    try:
        inputs, implicit, _ = oe.parser.parse_einsum_input((lhs, *shapes), shapes=True)
    except ValueError as exc:  # the checks above leave none; kept for a newer opt_einsum
        raise BinderError(f"einsum '{spec}': {exc}") from None
    return inputs.split(","), implicit


def _label_operands(spec: str, parsed: list[str], shapes: Sequence[tuple[int, ...]],
                    slots: dict[str, int], ell_rank: int
                    ) -> tuple[list[list[str]], dict[str, int]]:
    """Labels per operand and their sizes. ``slots`` maps the symbols of ellipsis dimensions to
    their place among them. Ellipsis dimensions broadcast: a dimension of size 1 where another
    operand has n gets a label of its own (summed away)."""
    ell_sizes = [1] * ell_rank
    for term, shape in zip(parsed, shapes):
        for c, n in zip(term, shape):
            if c not in slots or n == 1:
                continue
            slot = slots[c]
            if ell_sizes[slot] not in (1, n):
                raise BinderError(f"einsum '{spec}': '...' dimensions {ell_sizes[slot]} and {n} "
                                  "cannot be broadcast together")
            ell_sizes[slot] = n
    unique = iter(f"…b{n}" for n in range(10**6))
    labels: list[list[str]] = []
    sizes: dict[str, int] = {}
    for pos, (term, shape) in enumerate(zip(parsed, shapes)):
        out: list[str] = []
        for axis, (c, n) in enumerate(zip(term, shape)):
            if c in slots:
                lab = _ellipsis_label(slots[c]) if n == ell_sizes[slots[c]] else next(unique)
            else:
                lab = c
                if lab in sizes and sizes[lab] != n:
                    raise BinderError(f"einsum '{spec}': label '{lab}' has size {sizes[lab]} in "
                                      f"one place but {n} in operand {pos} axis {axis}")
            sizes[lab] = n
            out.append(lab)
        labels.append(out)
    for slot, n in enumerate(ell_sizes):
        sizes.setdefault(_ellipsis_label(slot), n)
    return labels, sizes


def _ellipsis_label(slot: int) -> str:
    return f"…{slot}"


def _explicit_output(spec: str, rhs: str, sizes: dict[str, int], ell_rank: int) -> list[str]:
    """The output after '->': '...' stands for every ellipsis dimension; numpy sums the ones
    it omits. Each label appears in an input, once."""
    head, dots, tail = rhs.partition("...")
    output: list[str] = list(head) + [_ellipsis_label(s) for s in range(ell_rank) if dots] + \
        list(tail)
    for lab in head + tail:
        if lab not in sizes:
            raise BinderError(f"einsum '{spec}': output label '{lab}' appears in no input")
    dup = sorted({l for l in output if output.count(l) > 1})
    if dup:
        raise BinderError(f"einsum '{spec}': label(s) {', '.join(dup)} repeated in the output")
    return output


def split_pairwise(into: str, labels: list[list[str]], output: list[str], sizes: dict[str, int],
                   names: list[str]) -> list[tuple[str, list[str], list[tuple[str, list[str]]]]]:
    """Split a product of several operands into pairwise contractions (opt_einsum's path).

    Returns steps ``(name, out_labels, [(operand, labels), ...])``; the last one is ``into``.
    """
    if len(labels) <= 2:
        return [(into, output, list(zip(names, labels)))]
    symbol = {l: oe.get_symbol(i) for i, l in enumerate(sizes)}
    eq = ",".join("".join(symbol[l] for l in ls) for ls in labels) + "->" + \
        "".join(symbol[l] for l in output)
    shapes = [tuple(sizes[l] for l in ls) for ls in labels]
    path, _ = oe.contract_path(eq, *shapes, shapes=True, optimize="auto")
    live = [(n, list(ls)) for n, ls in zip(names, labels)]
    steps = []
    for step, pair in enumerate(path):
        picked = [live[i] for i in sorted(pair)]
        for i in sorted(pair, reverse=True):
            live.pop(i)
        if not live:
            out, name = output, into
        else:
            keep = set(output) | {l for _, ls in live for l in ls}
            out = []
            for _, ls in picked:
                for l in ls:
                    if l in keep and l not in out:
                        out.append(l)
            name = TensorRef.of(into).pairwise(step + 1)
        steps.append((name, out, picked))
        live.append((name, out))
    return steps


def infer_dtype(join: scalar.Expr, dtypes: Sequence[str], names: Sequence[str] | None = None) -> str:
    """The dtype NumPy gives the join on arrays of ``dtypes`` with literals as Python scalars
    (NEP 50): ``int64 * 2`` is int64, ``2.5 * int32`` float64, ``exp`` of an int a float. The
    aggregate keeps it, as ``np.einsum`` does. Refused: what NumPy refuses, and a result dtype
    tensordb does not store (``EXP`` of a bool is float16 in NumPy)."""
    shown = scalar.render(join, list(names) if names else None)
    on = ", ".join(np.dtype(d).name for d in dtypes)
    try:
        dt = scalar.dtype_of(join, dtypes)
    except OverflowError as exc:
        raise DataError(f"{shown} on {on}: {exc}",
                        hint="NumPy refuses an integer literal that its array's dtype cannot hold; "
                             "write it as a float (e.g. 1e12) or store the tensor as int64") from None
    except (TypeError, ValueError) as exc:
        # NumPy's own text suggests operators (^, ~) that the dialect does not have.
        why = str(exc).split(",")[0].split(".")[0]
        raise BinderError(f"type error: NumPy refuses {shown} on {on} ({why})",
                          hint="convert first: multiply a bool by 1 for int64, by 1.0 for float64"
                          ) from None
    if dt.name not in SUPPORTED_DTYPES:
        raise DataError(f"{shown} on {on} gives {dt.name} in NumPy, which tensordb does not store",
                        hint="convert first, e.g. multiply by 1.0 for float64 or by 1 for int64")
    return dt.name


# -- binding -----------------------------------------------------------------------------------

def bind(graph: Graph, catalog, *, temporaries: Mapping[str, tuple] | None = None) -> EinGraph:
    """Resolve names against ``catalog`` (anything with ``has`` and ``meta``) into an EinGraph."""
    binder = _Binder(catalog)
    for step in graph.steps:
        binder.add(step)
    return EinGraph(tuple(binder.inputs.values()), tuple(binder.ops), tuple(binder.outputs))


class _Binder:
    """The names bound so far: stored tensors read, results computed, operations emitted."""

    def __init__(self, catalog) -> None:
        self.catalog = catalog
        self.known: dict[str, tuple[tuple[int, ...], str]] = {}  # name -> shape, dtype
        self.inputs: dict[str, TensorInfo] = {}
        self.ops: list[EinOp] = []
        self.outputs: list[str] = []
        self.alias: dict[str, TensorRef] = {}  # a name redefined after it was read -> its newest

    def add(self, step: Step) -> None:
        """Bind one step: check it, resolve its operands, label them, name its result, and emit
        its operations (a product of several operands split pairwise)."""
        self._check_step(step)
        names = [self.alias.get(t, t) for t, _ in step.inputs]
        shapes, dtypes = self._resolve(names, step.into)
        join = step.join if step.join is not None else scalar.product(len(names))
        _check_join_inputs(join, len(names), step.into)
        if step.spec is not None:
            labels, out, sizes = parse_spec(step.spec, shapes)
        else:
            labels, out, sizes = _explicit_labels(step, names, shapes)
        dtype = infer_dtype(join, dtypes, names)
        into = self._result_name(step)
        # A product of tensors (no literal) under SUM is np.einsum: every operand is cast to
        # the result dtype first, whatever the order the product is written in. A tensor used
        # twice (A[i,j] * A[i,j] * B[k], one input of the join) is two operands of the einsum.
        factors = scalar.product_factors(join) if step.agg == "sum" else None
        einsum = factors is not None and sorted(set(factors)) == list(range(len(names)))
        if einsum and len(factors) != len(names):
            names, labels = [names[k] for k in factors], [labels[k] for k in factors]
            join = scalar.product(len(factors))
        # A product of three or more is split into pairs only where that cannot change the
        # answer: grouping the sum over a pair first differs from summing the products next to
        # an inf (inf * (2 - 1) is inf, 2 * inf - 1 * inf is NaN), so every operand must be a
        # stored tensor that the catalog knows to be finite.
        if einsum and (len(names) <= 2 or all(n in self.inputs and self._finite(n) for n in names)):
            pieces = split_pairwise(into, labels, out, sizes, names)
        else:
            pieces = [(into, out, list(zip(names, labels)))]
        for name, out_labels, operands in pieces:
            self._emit(name, out_labels, operands, sizes, join if len(pieces) == 1 else None,
                       step.agg, dtype, cast=einsum)
        if step.store:
            self.outputs.append(into)

    def _check_step(self, step: Step) -> None:
        if step.agg not in AGGS:
            raise BinderError(f"{step.into}: unknown aggregate '{step.agg}'",
                              hint=f"valid aggregates: {', '.join(AGGS)}")
        if step.into in self.known and step.into not in self.inputs or step.into in self.alias:
            raise BinderError(f"'{step.into}' is defined twice in one graph")

    def _finite(self, name: str) -> bool:
        """No stored tile holds NaN or inf (a catalog without per-tile facts: assumed)."""
        opener = getattr(self.catalog, "open", None)
        return opener is None or opener(name).facts()[0]

    def _lookup(self, name: str, into: str) -> tuple[tuple[int, ...], str]:
        if name in self.known:
            return self.known[name]
        if not self.catalog.has(name):
            raise CatalogError(f"{into}: unknown tensor '{name}'")
        meta = self.catalog.meta(name)
        info = TensorInfo(name, tuple(meta.shape), np.dtype(meta.dtype).name)
        self.inputs[name] = info
        self.known[name] = (info.shape, info.dtype)
        return self.known[name]

    def _resolve(self, names: list[str], into: str) -> tuple[list[tuple[int, ...]], list[str]]:
        """Shapes and dtypes of the operands (stored tensors or earlier results)."""
        metas = [self._lookup(t, into) for t in names]
        for t, (_, dt) in zip(names, metas):
            check_dtype(dt, t)
        return [m[0] for m in metas], [m[1] for m in metas]

    def _result_name(self, step: Step) -> TensorRef:
        """The name the step computes under: its own, or an internal one when it replaces a
        tensor this graph reads (stored under the tensor's name all the same)."""
        into = TensorRef.of(step.into)
        if into in self.inputs:
            into = self.alias[step.into] = into.internal_copy()
        return into

    def _emit(self, name: str, out_labels, operands, sizes: dict[str, int],
              join: scalar.Expr | None, agg: str, dtype: str, cast: bool = False) -> None:
        """One EinOp; ``join`` None: a pairwise step of a split product; ``cast``: a product of
        tensors, whose operands are all cast to the result dtype (np.einsum's rule)."""
        used = {l for _, ls in operands for l in ls}
        # Every pairwise step computes in the whole product's dtype, as np.einsum does (it casts
        # every operand to the result type): a float32 x float32 step under a float64 result
        # would lose float64's precision.
        in_dtypes = tuple(dtype if join is None or cast else self.known[t][1]
                          for t, _ in operands)
        j = join if join is not None else scalar.product(len(operands))
        op = EinOp(name, tuple(out_labels), tuple(Operand(t, tuple(ls)) for t, ls in operands),
                   tuple((l, sizes[l]) for l in sizes if l in used), j, agg, dtype, in_dtypes)
        self.ops.append(op)
        self.known[name] = (op.out_shape, dtype)


def _check_join_inputs(join: scalar.Expr, n: int, into: str) -> None:
    """Checked before the join is evaluated (for its dtype) on sample values."""
    bad = sorted(i for i in join.inputs() if not 0 <= i < n)
    if bad:
        raise BinderError(f"{into}: the join refers to x{bad[0]}, but the einsum has "
                          f"{n} operand(s): x0..x{n - 1}",
                          hint="x0, x1, ... name the operands in the order given")


def _explicit_labels(step: Step, names: list[str], shapes: list[tuple[int, ...]]
                     ) -> tuple[list[list[str]], list[str], dict[str, int]]:
    """Labels given per operand: one per dimension, one size per label."""
    labels = [list(ls) for _, ls in step.inputs]
    sizes: dict[str, int] = {}
    for t, ls, shape in zip(names, labels, shapes):
        if len(ls) != len(shape):
            raise BinderError(f"{step.into}: {t} has {len(shape)} dimension(s) but is "
                              f"indexed with {len(ls)} label(s) [{','.join(ls)}]")
        for axis, (l, n) in enumerate(zip(ls, shape)):
            if l in sizes and sizes[l] != n:
                raise BinderError(f"{step.into}: label '{l}' has size {sizes[l]} in one "
                                  f"place but {n} in {t} axis {axis}")
            sizes[l] = n
    return labels, list(step.out_labels or ()), sizes
