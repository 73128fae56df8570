"""An oracle for extended einsums written with plain numpy, independently of tensordb.

It imports nothing from tensordb. A case is the description the fuzzer generates (tests/corpus/test_fuzz.py):
output labels, operands (an array and one label per axis, repeated labels are diagonals), a join
expression tree over the operands and an aggregate. The answer is numpy's, as docs/sql.md promises:

* the join space is every label of the operands; each operand is broadcast over the labels it
  does not have (``np.einsum`` takes its diagonals first);
* the join is evaluated with numpy ufuncs and numpy's own dtype rules: literals are Python scalars
  (weak, NEP 50), operators between two literals are Python's, functions are numpy's;
* a join that is a plain product of every operand, each once, under SUM, is ``np.einsum``: the
  operands are cast to the result dtype first;
* the aggregate reduces the labels not on the left in the join's dtype (``np.add.reduce(...,
  dtype=)``, as ``np.einsum`` keeps the dtype): SUM over nothing is 0, PROD 1, MAX and MIN over a
  label of size 0 are an error (``DataError`` in the engine).

Beside the answer the oracle bounds the rounding error of each float element (a forward error
analysis of the join and the aggregate), so a comparison can be strict without depending on the
order in which the engine adds.

Expression trees are tuples: ``("in", k)``, ``("lit", value)`` (a Python int or float), ``(fn,
arg, ...)`` with fn one of ``FUNCTIONS``.
"""
from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass

import numpy as np

__all__ = ["FUNCTIONS", "BINARY", "COMPARISONS", "UNARY", "Operand", "Case", "Answer", "answer", "compare",
           "render_sql", "render_python", "STORED_DTYPES"]

STORED_DTYPES = ("bool", "int32", "int64", "float32", "float64")


def _relu(x):
    # RELU(x) is MAX(x, 0) of the dialect: np.maximum with a weak 0.
    return np.maximum(x, 0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
          "max": np.maximum, "min": np.minimum, "pow": np.power}
# Comparisons give numpy's bool (the dialect's =, <>, <, <=, >, >=; the Python API's ==, ...).
COMPARISONS = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
               ">": np.greater, ">=": np.greater_equal}
BINARY.update(COMPARISONS)
UNARY = {"neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs,
         "relu": _relu, "tanh": np.tanh, "sigmoid": _sigmoid, "sin": np.sin, "cos": np.cos,
         "square": np.square}
FUNCTIONS = {**BINARY, **UNARY}
_PYTHON = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
           "neg": operator.neg}


@dataclass
class Operand:
    name: str
    labels: tuple[str, ...]
    array: np.ndarray                          # what the operand reads (a box's, a gather's)
    box: tuple | None = None                   # a slice of the stored ``name``: (start, stop)s
    gather: str | None = None                  # a gather: name[gather[labels[:k]], ...]
    gather_rank: int = 0                       # the index tensor's dimensions


@dataclass
class Case:
    out: tuple[str, ...]
    operands: list[Operand]
    join: tuple
    agg: str                                   # sum, prod, max, min, mean, argmax, argmin,
                                               # logsumexp, softmax (out: every label)
    over: str | None = None                    # softmax: the label it normalizes over


@dataclass
class Answer:
    """numpy's answer: ``value`` (an array of numpy's dtype) and ``err`` (an absolute rounding
    bound per element, for float results), or ``error`` ('data': a DataError; 'any': some
    tensordb error) with ``why``."""

    value: np.ndarray | None = None
    err: np.ndarray | None = None
    error: str | None = None
    why: str = ""


# -- the join space ---------------------------------------------------------------------------

def _space(case: Case) -> tuple[list[str], dict[str, int]]:
    labels: list[str] = []
    sizes: dict[str, int] = {}
    for op in case.operands:
        for lab, n in zip(op.labels, op.array.shape):
            if lab in sizes and sizes[lab] != n:
                raise ValueError(f"label {lab} has sizes {sizes[lab]} and {n}")
            sizes[lab] = n
            if lab not in labels:
                labels.append(lab)
    return labels, sizes


def _broadcast(op: Operand, labels: list[str], dtype=None) -> np.ndarray:
    """The operand as an array over the join space's axes (size 1 where it has no label)."""
    mine = [l for l in labels if l in op.labels]
    letters = {l: chr(ord("a") + i) for i, l in enumerate(labels)}
    arr = op.array if dtype is None else op.array.astype(dtype)
    if op.labels:
        spec = "".join(letters[l] for l in op.labels) + "->" + "".join(letters[l] for l in mine)
        arr = np.einsum(spec, arr)
    shape = [arr.shape[mine.index(l)] if l in mine else 1 for l in labels]
    return np.asarray(arr).reshape(shape)


def is_plain_product(join: tuple, n: int) -> bool:
    """x_a * x_b * ... with every operand exactly once and nothing else (np.einsum's case)."""
    seen: list[int] = []

    def walk(e) -> bool:
        if e[0] == "in":
            seen.append(e[1])
            return True
        return e[0] == "*" and walk(e[1]) and walk(e[2])
    return walk(join) and sorted(seen) == list(range(n))


# -- values and their rounding error ----------------------------------------------------------

def _eps(x) -> float:
    dt = np.asarray(x).dtype
    return float(np.finfo(dt).eps) if dt.kind == "f" else 0.0


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64) if not isinstance(x, (int, float)) else np.float64(x)


def _clean(e):
    """An error bound: NaN (0 * inf in the propagation, where the value itself is special and
    exact) counts as 0; inf stays inf (anything goes)."""
    return np.where(np.isnan(e), 0.0, e)


def _eval(expr, values: list, errs: list):
    """(value, absolute error bound as float64) of ``expr`` the numpy way."""
    kind = expr[0]
    if kind == "in":
        return values[expr[1]], errs[expr[1]]
    if kind == "lit":
        return expr[1], 0.0
    parts = [_eval(a, values, errs) for a in expr[1:]]
    args = [p[0] for p in parts]
    if kind in _PYTHON and all(type(a) in (int, float) for a in args):
        try:
            return _PYTHON[kind](*args), 0.0
        except (ZeroDivisionError, OverflowError):
            pass  # Python refuses 1 / 0.0: numpy's answer (inf), as docs/sql.md says
    out = FUNCTIONS[kind](*args)
    fa = [np.abs(_f64(a)) for a in args]
    ea = [p[1] for p in parts]
    r = np.abs(_f64(out))
    if kind in ("+", "-"):
        e = ea[0] + ea[1]
    elif kind == "*":
        e = fa[1] * ea[0] + fa[0] * ea[1]
    elif kind == "/":
        e = ea[0] / fa[1] + fa[0] * ea[1] / (fa[1] * fa[1])
    elif kind in ("max", "min"):
        e = np.maximum(ea[0], ea[1])
    elif kind in COMPARISONS:  # exact: the generator compares stored values and literals
        return out, 0.0
    elif kind == "pow":
        b = _f64(args[1])
        e = np.abs(b * np.power(fa[0], b - 1)) * ea[0] + r * np.abs(np.log(fa[0])) * ea[1]
    else:
        slope = {"neg": 1.0, "abs": 1.0, "relu": 1.0, "tanh": 1.0, "sin": 1.0, "cos": 1.0,
                 "sigmoid": 0.25, "exp": r, "log": 1.0 / fa[0], "sqrt": 0.5 / np.sqrt(fa[0]),
                 "square": 2.0 * fa[0]}[kind]
        e = slope * ea[0]
    # A few ulps for the function itself (numpy's SIMD and scalar loops may differ by some).
    e = _clean(e + 4.0 * _eps(out) * r)
    return out, e


def answer(case: Case) -> Answer:
    """numpy's answer to ``case``."""
    labels, sizes = _space(case)
    agg_labels = [l for l in labels if l not in case.out]
    shape = tuple(sizes[l] for l in labels)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # What numpy refuses whatever the values (- of a bool, an int to a negative literal
        # power, a literal too large for the dtype) is refused on an empty join space too.
        probes = [np.ones(1, op.array.dtype) for op in case.operands]
        try:
            _eval(case.join, probes, [np.zeros(1)] * len(probes))
        except (TypeError, ValueError, OverflowError) as exc:
            return Answer(error="any", why=f"numpy refuses the join: {exc}")
        if case.agg in ("max", "min", "argmax", "argmin") and \
                any(sizes[l] == 0 for l in agg_labels):
            return Answer(error="data", why=f"{case.agg.upper()} over an empty label")
        try:
            # Every operand is broadcast over the whole join space: the join is evaluated at
            # each of its points (and at none when it is empty).
            plain = case.agg == "sum" and is_plain_product(case.join, len(case.operands))
            dtype = np.result_type(*[op.array.dtype for op in case.operands]) if plain else None
            values = [np.broadcast_to(_broadcast(op, labels, dtype), shape)
                      for op in case.operands]
            errs = [np.zeros(shape)] * len(values)
            joined, jerr = _eval(case.join, values, errs)
        except (TypeError, ValueError, OverflowError) as exc:
            return Answer(error="any", why=f"numpy refuses the join: {exc}")
        joined = np.asarray(joined)
        dtype = joined.dtype
        if dtype.name not in STORED_DTYPES:
            return Answer(error="data", why=f"the join's dtype is {dtype.name}")
        joined = np.broadcast_to(joined, shape)
        jerr = np.broadcast_to(np.asarray(jerr, dtype=np.float64), shape)
        axes = tuple(labels.index(l) for l in agg_labels)
        if case.agg == "softmax":
            if dtype == np.bool_:  # x - MAX(x): numpy refuses bools
                return Answer(error="any", why="numpy refuses the subtraction of bools")
            value, err = _softmax(joined, jerr, labels.index(case.over))
        else:
            value, err = _reduce(case.agg, joined, jerr, axes, dtype)
        value = np.asarray(value, dtype=_result_dtype(case.agg, dtype))
        err = np.broadcast_to(np.asarray(err, dtype=np.float64), value.shape)
        kept = [l for l in labels if l in case.out]
        order = [kept.index(l) for l in case.out]
    return Answer(value=np.transpose(value, order), err=np.transpose(err, order))


def _result_dtype(agg: str, dtype) -> np.dtype:
    """numpy's: an index is int64; a mean and a logsumexp are floats (x * 1.0)."""
    if agg in ("argmax", "argmin"):
        return np.dtype(np.int64)
    if agg in ("mean", "logsumexp"):
        return (np.ones(1, dtype) * 1.0).dtype
    if agg == "softmax":
        return np.exp(np.ones(1, dtype) - np.ones(1, dtype)).dtype
    return np.dtype(dtype)


def _softmax(joined, jerr, axis: int):
    """scipy.special.softmax as docs/sql.md writes it: EXP(x - m) / SUM(EXP(x - m)), m the MAX
    along the axis (NaN along a line holding +inf or only -inf)."""
    if joined.size == 0:  # an empty result (a label of size 0)
        out = np.exp(joined - joined)
        return out, np.zeros(out.shape)
    m = np.max(joined, axis=axis, keepdims=True)
    e = np.exp(joined - m)
    value = e / np.sum(e, axis=axis, keepdims=True)
    eps = float(np.finfo(value.dtype).eps)
    count = joined.shape[axis]
    err = np.abs(_f64(value)) * (2 * np.max(jerr, axis=axis, keepdims=True) + eps * (count + 8))
    return value, _clean(err)


def _reduce(agg: str, joined, jerr, axes, dtype):
    if not axes:
        if agg in ("mean", "logsumexp"):  # nothing aggregated: the join, as a float
            return joined * 1.0, jerr
        return joined, jerr
    if agg in ("argmax", "argmin"):  # one label: numpy's first extreme (the first NaN)
        (axis,) = axes
        value = (np.argmax if agg == "argmax" else np.argmin)(joined, axis=axis)
        return value, np.zeros(value.shape)
    if agg == "mean":
        x = joined * 1.0
        total, err = _reduce("sum", x, jerr, axes, x.dtype)
        count = math.prod(joined.shape[a] for a in axes)
        return np.true_divide(total, count, dtype=x.dtype), \
            err / max(count, 1) + 2 * float(np.finfo(x.dtype).eps) * np.abs(_f64(total)) / max(count, 1)
    if agg == "logsumexp":  # scipy.special.logsumexp's algorithm, written out
        x = joined * 1.0
        count = math.prod(joined.shape[a] for a in axes)
        if count == 0:
            return np.full(np.delete(np.array(joined.shape), axes), -np.inf, x.dtype), 0.0
        m = np.max(x, axis=axes, keepdims=True)
        shift = np.where(np.isfinite(m), m, 0).astype(x.dtype)
        total = np.add.reduce(np.exp(x - shift), axis=axes, dtype=x.dtype)
        value = (np.log(total) + np.squeeze(shift, axis=axes)).astype(x.dtype)
        eps = float(np.finfo(x.dtype).eps)
        err = np.max(jerr, axis=axes) + eps * (count + 8) * \
            (np.abs(_f64(value)) + np.abs(_f64(np.squeeze(shift, axis=axes))) + 1)
        return value, _clean(err)
    count = math.prod(joined.shape[a] for a in axes)
    eps = float(np.finfo(dtype).eps) if dtype.kind == "f" else 0.0
    mag = np.abs(joined.astype(np.float64))
    if agg == "sum":
        value = np.add.reduce(joined, axis=axes, dtype=dtype)
        fin = np.where(np.isfinite(mag), mag, 0.0)
        err = np.add.reduce(jerr, axis=axes) + eps * count * np.add.reduce(fin, axis=axes)
    elif agg == "prod":
        value = np.multiply.reduce(joined, axis=axes, dtype=dtype)
        big = np.multiply.reduce(np.maximum(np.where(np.isfinite(mag), mag, 0.0), 1.0), axis=axes)
        err = np.add.reduce(jerr, axis=axes) * big + \
            eps * count * np.abs(np.asarray(value, dtype=np.float64))
    elif agg == "max":
        value = np.maximum.reduce(joined, axis=axes)
        err = np.maximum.reduce(jerr, axis=axes)
    elif agg == "min":
        value = np.minimum.reduce(joined, axis=axes)
        err = np.maximum.reduce(jerr, axis=axes)
    else:
        raise ValueError(f"unknown aggregate {agg}")
    return value, _clean(err)


# -- comparing ------------------------------------------------------------------------------

def compare(got: np.ndarray, want: Answer, *, slack: float = 4.0) -> str | None:
    """None when ``got`` is numpy's answer, else what differs. Ints and bools exactly; floats
    with NaN at the same places, infinities of the same sign, finite values within ``slack``
    times the rounding bound (plus a few of the smallest normals for underflow)."""
    value = want.value
    got = np.asarray(got)
    if got.dtype != value.dtype:
        return f"dtype {got.dtype} but numpy gives {value.dtype}"
    if got.shape != value.shape:
        return f"shape {got.shape} but numpy gives {value.shape}"
    if value.dtype.kind != "f":
        bad = got != value
        if bad.any():
            return _first(bad, got, value, "exact")
        return None
    fin = np.finfo(value.dtype)
    gnan, wnan = np.isnan(got), np.isnan(value)
    if (gnan != wnan).any():
        return _first(gnan != wnan, got, value, "NaN positions")
    g = got.astype(np.float64)
    w = value.astype(np.float64)
    tol = slack * want.err + 64 * float(fin.tiny)
    ginf, winf = np.isinf(g), np.isinf(w)
    # Whether a sum that overflows becomes inf depends on the order of additions (docs/sql.md):
    # an inf where numpy's finite answer is within reach of the largest float, of its sign, is
    # accepted (and the other way round).
    finite_one = np.where(winf, g, w)
    near = (ginf != winf) & (np.abs(finite_one) + tol >= 0.5 * float(fin.max)) & \
        (np.sign(g) == np.sign(w))
    bad = (ginf | winf) & (g != w) & ~near
    if bad.any():
        return _first(bad, got, value, "infinities")
    both = ~gnan & ~ginf & ~winf
    with np.errstate(all="ignore"):
        diff = np.abs(np.where(both, g - w, 0.0))
    bad = both & (diff > tol)
    if bad.any():
        return _first(bad, got, value, f"tolerance (bound {tol[bad].flat[0]:.3g})")
    return None


def _first(bad, got, value, what) -> str:
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} element(s) differ ({what}); first at {idx}: "
            f"got {got[idx]!r}, numpy gives {value[idx]!r}")


# -- rendering a join -----------------------------------------------------------------------

_INFIX = ("+", "-", "*", "/")
_SQL_COMPARISON = {"==": "=", "!=": "<>"}


def _literal(v) -> str:
    return repr(v)  # 2, 2.5, 1e-05, 1e+20: the dialect and Python read them alike


def render_sql(expr, refs: list[str]) -> str:
    """The join in the dialect, operand k written as refs[k] (``A[i,j]`` or a bare name)."""
    kind = expr[0]
    if kind == "in":
        return refs[expr[1]]
    if kind == "lit":
        return _literal(expr[1]) if expr[1] >= 0 else f"(-{_literal(-expr[1])})"
    args = [render_sql(a, refs) for a in expr[1:]]
    if kind in _INFIX:
        return f"({args[0]} {kind} {args[1]})"
    if kind in COMPARISONS:
        return f"({args[0]} {_SQL_COMPARISON.get(kind, kind)} {args[1]})"
    if kind == "neg":
        return f"(-{args[0]})"
    return f"{kind.upper()}({', '.join(args)})"


def _has_input(expr) -> bool:
    return expr[0] == "in" or expr[0] != "lit" and any(_has_input(a) for a in expr[1:])


def render_python(expr) -> str:
    """The join in the Python API's syntax, over x0, x1, ..."""
    kind = expr[0]
    if kind == "in":
        return f"x{expr[1]}"
    if kind == "lit":
        return _literal(expr[1]) if expr[1] >= 0 else f"(-{_literal(-expr[1])})"
    args = [render_python(a) for a in expr[1:]]
    if kind in _INFIX or kind in COMPARISONS:
        return f"({args[0]} {kind} {args[1]})"
    if kind == "pow" and _has_input(expr[1]):  # else ** would be Python's power of literals
        return f"({args[0]} ** {args[1]})"
    if kind == "neg":
        return f"(-{args[0]})"
    return f"{kind}({', '.join(args)})"
