"""The Python API's graphs of einsums, and the rules the binder applies to every einsum.

A ``Graph`` records steps by name (numpy einsum specs or explicit operations), unchecked; the
binder (``tensordb.bind.bind_graph``) resolves the names, checks labels, shapes and dtypes with a
caret on every error, and emits the EinGraph. Here too: numpy's spec semantics (``parse_spec``),
NumPy's dtype rule (``infer_dtype``) and the pairwise split of a product (``split_pairwise``).

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

from ..dtypes import SUPPORTED_DTYPES
from ..errors import BinderError, DataError
from . import scalar
from .names import TensorRef

__all__ = ["Graph", "Step", "GradRequest", "TensorRef", "parse_spec", "split_pairwise",
           "infer_dtype"]


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
    named: bool = True                            # False: con.einsum without into= named it


@dataclass(frozen=True)
class GradRequest:
    """The gradients of the scalar ``loss`` (an earlier step's result) with respect to the tensors
    ``wrt``, computed under the names ``into`` (one backward pass for all); still unchecked."""

    loss: str
    wrt: tuple[str, ...]
    into: tuple[str, ...]
    store: bool = True


@dataclass
class Graph:
    """A computation by name, planned and run as one graph by ``Connection.run``."""

    steps: list[Step | GradRequest] = field(default_factory=list)
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

    def grad(self, loss: str, wrt: str | Sequence[str], *, into: str | Sequence[str] | None = None,
             store: bool = True) -> "Graph":
        """The gradient of the scalar ``loss``, computed by an earlier step, with respect to
        ``wrt`` (one tensor, or several: one backward pass computes them all), each of its
        tensor's shape, stored under ``into`` (default: ``d`` + the tensor's name)."""
        names = (wrt,) if isinstance(wrt, str) else tuple(wrt)
        if not names or not all(isinstance(n, str) for n in names):
            raise BinderError("grad(loss, wrt): wrt is a tensor name or a list of them")
        if into is None:
            targets = tuple(f"d{n}" for n in names)
        else:
            targets = (into,) if isinstance(into, str) else tuple(into)
        if len(targets) != len(names):
            raise BinderError(f"grad: {len(names)} tensor(s) in wrt but {len(targets)} name(s) "
                              "in into")
        self.steps.append(GradRequest(str(loss), names, targets, store))
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
    # Lettered dimensions broadcast as numpy's do too: size 1 against n in another operand
    # (never within one operand: a repeated label there is a diagonal).
    letter_sizes: dict[str, tuple[int, int, int]] = {}  # label -> (size, operand, axis)
    for pos, (term, shape) in enumerate(zip(parsed, shapes)):
        here: dict[str, int] = {}  # this operand's sizes: a repeated label's must be equal
        for axis, (c, n) in enumerate(zip(term, shape)):
            if c in slots:
                continue
            if here.setdefault(c, n) != n:
                raise BinderError(f"einsum '{spec}': label '{c}' has size {here[c]} in "
                                  f"one place but {n} in operand {pos} axis {axis}")
            seen = letter_sizes.get(c)
            if seen is not None and seen[0] != n and (seen[1] == pos or 1 not in (seen[0], n)):
                raise BinderError(f"einsum '{spec}': label '{c}' has size {seen[0]} in "
                                  f"one place but {n} in operand {pos} axis {axis}")
            if seen is None or seen[0] == 1:
                letter_sizes[c] = (n, pos, axis)
    unique = iter(f"…b{n}" for n in range(10**6))
    labels: list[list[str]] = []
    sizes: dict[str, int] = {}
    for pos, (term, shape) in enumerate(zip(parsed, shapes)):
        out: list[str] = []
        for c, n in zip(term, shape):
            if c in slots:
                lab = _ellipsis_label(slots[c]) if n == ell_sizes[slots[c]] else next(unique)
            else:
                lab = c if n == letter_sizes[c][0] else next(unique)  # a broadcast size 1
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
    def words():  # what the errors show (rendered only for one: a bind asks often)
        return (scalar.render(join, list(names) if names else None),
                ", ".join(np.dtype(d).name for d in dtypes))
    try:
        dt = scalar.dtype_of(join, dtypes)
    except OverflowError as exc:
        shown, on = words()
        raise DataError(f"{shown} on {on}: {exc}",
                        hint="NumPy refuses an integer literal that its array's dtype cannot hold; "
                             "write it as a float (e.g. 1e12) or store the tensor as int64") from None
    except (TypeError, ValueError) as exc:
        shown, on = words()
        # NumPy's own text suggests operators (^, ~) that the dialect does not have.
        why = str(exc).split(",")[0].split(".")[0]
        hint = "make the base a float first: POW(x * 1.0, -1)" if "negative integer powers" in \
            why else "convert first: multiply a bool by 1 for int64, by 1.0 for float64"
        raise BinderError(f"type error: NumPy refuses {shown} on {on} ({why})",
                          hint=hint) from None
    if dt.name not in SUPPORTED_DTYPES:
        shown, on = words()
        raise DataError(f"{shown} on {on} gives {dt.name} in NumPy, which tensordb does not store",
                        hint="convert first, e.g. multiply by 1.0 for float64 or by 1 for int64")
    return dt.name
