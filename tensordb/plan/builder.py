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

__all__ = ["Graph", "Step", "bind", "parse_spec", "split_pairwise", "infer_dtype"]


@dataclass(frozen=True)
class Step:
    """One operation by name: ``into[out] = agg(join(inputs))``; labels are still unchecked."""

    into: str
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
    gets a label of its own that is summed away (a sum over one element).
    """
    text = spec.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise BinderError(f"einsum '{spec}' has {len(terms)} operand term(s) but "
                          f"{len(shapes)} operand(s) were given")
    for term in terms + ([rhs] if arrow else []):
        bad = [c for c in term.replace("...", "") if c not in string.ascii_letters]
        if bad or term.count("...") > 1 or "." in term.replace("...", ""):
            raise BinderError(f"einsum '{spec}': invalid subscript {term!r}",
                              hint="subscripts are letters, with at most one '...' per term")
    ell_rank = 0
    labels: list[list[str]] = []
    sizes: dict[str, int] = {}
    unique = iter(f"…b{n}" for n in range(10**6))
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
    ell_sizes = [1] * ell_rank
    for term, shape in zip(terms, shapes):
        if "..." in term:
            head = term.index("...")
            k = len(shape) - len(term.replace("...", ""))
            for d in range(k):
                n = shape[head + d]
                slot = ell_rank - k + d
                if n != 1 and ell_sizes[slot] not in (1, n):
                    raise BinderError(f"einsum '{spec}': '...' dimensions {ell_sizes[slot]} and {n} "
                                      "cannot be broadcast together")
                if n != 1:
                    ell_sizes[slot] = n
    for pos, (term, shape) in enumerate(zip(terms, shapes)):
        out: list[str] = []
        axis = 0
        i = 0
        while i < len(term):
            if term.startswith("...", i):
                k = len(shape) - len(term.replace("...", ""))
                for d in range(k):
                    slot = ell_rank - k + d
                    n = shape[axis]
                    lab = f"…{slot}" if n == ell_sizes[slot] else next(unique)
                    out.append(lab)
                    sizes[lab] = n
                    axis += 1
                i += 3
                continue
            lab, n = term[i], shape[axis]
            if lab in sizes and sizes[lab] != n:
                raise BinderError(f"einsum '{spec}': label '{lab}' has size {sizes[lab]} in one "
                                  f"place but {n} in operand {pos} axis {axis}")
            sizes[lab] = n
            out.append(lab)
            axis += 1
            i += 1
        labels.append(out)
    for slot, n in enumerate(ell_sizes):
        sizes.setdefault(f"…{slot}", n)
    if arrow:
        output: list[str] = []
        i = 0
        while i < len(rhs):
            if rhs.startswith("...", i):
                output.extend(f"…{s}" for s in range(ell_rank))
                i += 3
                continue
            if rhs[i] not in sizes:
                raise BinderError(f"einsum '{spec}': output label '{rhs[i]}' appears in no input")
            output.append(rhs[i])
            i += 1
        if "..." not in rhs and ell_rank and any(f"…{s}" in l for l in labels for s in range(ell_rank)):
            pass  # numpy sums '...' dimensions that the output omits
    else:
        counts: dict[str, int] = {}
        for ls in labels:
            for l in ls:
                counts[l] = counts.get(l, 0) + 1
        output = [f"…{s}" for s in range(ell_rank)]
        output += sorted(l for l, c in counts.items() if c == 1 and not l.startswith("…"))
    dup = sorted({l for l in output if output.count(l) > 1})
    if dup:
        raise BinderError(f"einsum '{spec}': label(s) {', '.join(dup)} repeated in the output")
    return labels, output, sizes


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
            name = f"{into}.{step + 1}"
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
    opener = getattr(catalog, "open", None)

    def finite(name: str) -> bool:
        """No stored tile holds NaN or inf (a catalog without per-tile facts: assumed)."""
        return opener is None or opener(name).facts()[0]

    known: dict[str, tuple[tuple[int, ...], str]] = {}
    inputs: dict[str, TensorInfo] = {}
    ops: list[EinOp] = []
    outputs: list[str] = []
    alias: dict[str, str] = {}     # a name redefined after it was read -> its newest definition
    store_as: list[tuple[str, str]] = []

    def lookup(name: str, into: str) -> tuple[tuple[int, ...], str]:
        name = alias.get(name, name)
        if name in known:
            return known[name]
        if not catalog.has(name):
            raise CatalogError(f"{into}: unknown tensor '{name}'")
        meta = catalog.meta(name)
        info = TensorInfo(name, tuple(meta.shape), np.dtype(meta.dtype).name)
        inputs[name] = info
        known[name] = (info.shape, info.dtype)
        return known[name]

    for step in graph.steps:
        if step.agg not in AGGS:
            raise BinderError(f"{step.into}: unknown aggregate '{step.agg}'",
                              hint=f"valid aggregates: {', '.join(AGGS)}")
        if step.into in known and step.into not in inputs or step.into in alias:
            raise BinderError(f"'{step.into}' is defined twice in one graph")
        names = [alias.get(t, t) for t, _ in step.inputs]
        metas = [lookup(t, step.into) for t in names]
        shapes = [m[0] for m in metas]
        dtypes = [m[1] for m in metas]
        for t, dt in zip(names, dtypes):
            check_dtype(dt, t)
        join = step.join if step.join is not None else scalar.product(len(names))
        bad = sorted(i for i in join.inputs() if not 0 <= i < len(names))
        if bad:  # checked before the join is evaluated (for its dtype) on sample values
            raise BinderError(f"{step.into}: the join refers to x{bad[0]}, but the einsum has "
                              f"{len(names)} operand(s): x0..x{len(names) - 1}",
                              hint="x0, x1, ... name the operands in the order given")
        if step.spec is not None:
            labels, out, sizes = parse_spec(step.spec, shapes)
        else:
            labels = [list(ls) for _, ls in step.inputs]
            out = list(step.out_labels or ())
            sizes = {}
            for t, ls, shape in zip(names, labels, shapes):
                if len(ls) != len(shape):
                    raise BinderError(f"{step.into}: {t} has {len(shape)} dimension(s) but is "
                                      f"indexed with {len(ls)} label(s) [{','.join(ls)}]")
                for axis, (l, n) in enumerate(zip(ls, shape)):
                    if l in sizes and sizes[l] != n:
                        raise BinderError(f"{step.into}: label '{l}' has size {sizes[l]} in one "
                                          f"place but {n} in {t} axis {axis}")
                    sizes[l] = n
        dtype = infer_dtype(join, dtypes, names)
        into = step.into
        if into in inputs:  # replaces a tensor this graph reads: compute under another name
            into = alias[step.into] = step.into + "'"
            if step.store:
                store_as.append((into, step.into))
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
        if einsum and (len(names) <= 2 or all(name in inputs and finite(name) for name in names)):
            pieces = split_pairwise(into, labels, out, sizes, names)
        else:
            pieces = [(into, out, list(zip(names, labels)))]
        for name, out_labels, operands in pieces:
            k = len(operands)
            j = join if len(pieces) == 1 else scalar.product(k)
            used = {l for _, ls in operands for l in ls}
            # Every pairwise step computes in the whole product's dtype, as np.einsum does (it
            # casts every operand to the result type): a float32 x float32 step under a float64
            # result would lose float64's precision.
            in_dtypes = tuple(dtype if einsum else known[t][1] for t, _ in operands)
            ops.append(EinOp(name, tuple(out_labels), tuple(Operand(t, tuple(ls)) for t, ls in operands),
                             tuple((l, sizes[l]) for l in sizes if l in used), j, step.agg, dtype,
                             in_dtypes))
            known[name] = (ops[-1].out_shape, dtype)
        if step.store:
            outputs.append(into)
    return EinGraph(tuple(inputs.values()), tuple(ops), tuple(outputs), tuple(store_as))
