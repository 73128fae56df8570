"""Kernel calls bound once to their operands (exec/bound.py) against the KernelSpec call they
stand for (exec/kernels.py, the oracle): the same bytes, dtype, shape and ``out`` identity, no
warning either way, on float64/float32/int/bool operands holding NaN, inf and -0.0, contiguous
or not, with and without an ``out`` buffer; and the calls that are not bound."""
from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from tensordb.exec.bound import bind, signature
from tensordb.exec.kernels import KernelSpec
from tensordb.plan import scalar
from tensordb.plan.ir import EinOp

RNG = np.random.default_rng(1729)

# (output labels, inputs (tensor, labels), sizes, join or None (the product), aggregate)
OPS = [
    ("bc", [("Z", "bc"), ("m", "b")], {"b": 13, "c": 5},
     "exp(x0 * 1 - _stop(where(x1 - x1 == 0, x1, 0)))", "sum"),  # LOGSUMEXP's SUM, over c
    ("b", [("Z", "bc"), ("m", "b")], {"b": 13, "c": 5},
     "exp(x0 * 1 - _stop(where(x1 - x1 == 0, x1, 0)))", "sum"),
    ("b", [("Z", "bc")], {"b": 13, "c": 5}, "x0 * 1", "max"),
    ("b", [("Z", "bc")], {"b": 13, "c": 5}, "x0 * 1", "min"),
    ("c", [("Z", "bc")], {"b": 13, "c": 5}, "x0 * x0", "prod"),
    ("", [("a", "b"), ("m", "b"), ("t", "b")], {"b": 13},
     "(log(x1) + _stop(where(x0 - x0 == 0, x0, 0)) - x2) * 1", "sum"),
    ("", [("s", "")], {}, "x0 / 1347", "sum"),
    ("b", [("s", "b")], {"b": 13}, "0.5 * (1 / x0)", "sum"),
    ("bc", [("Z", "bc"), ("m", "b"), ("g", "b")], {"b": 13, "c": 5},
     "x2 * exp(x0 * 1 - _stop(where(x1 - x1 == 0, x1, 0)))", "sum"),
    ("dc", [("W", "dc"), ("D", "dc")], {"d": 6, "c": 5}, "x0 - 0.5 * x1", "sum"),
    ("cd", [("W", "dc")], {"d": 6, "c": 5}, "relu(x0 - 0.1)", "sum"),  # a transposed output
    ("ik", [("A", "ij"), ("B", "jk")], {"i": 7, "j": 4, "k": 3}, None, "sum"),  # matmul
    ("ki", [("A", "ij"), ("B", "jk")], {"i": 7, "j": 4, "k": 3}, None, "sum"),
    ("jk", [("A", "ij"), ("B", "ik")], {"i": 7, "j": 4, "k": 3}, None, "sum"),  # X.T @ dZ
    ("b", [("Y", "bc"), ("Z", "bc")], {"b": 13, "c": 5}, None, "sum"),  # batched
    ("ik", [("A", "ij"), ("B", "jk")], {"i": 7, "j": 4, "k": 3}, "2.5 * (x0 * x1)", "sum"),
    ("ik", [("A", "ij"), ("B", "jk")], {"i": 7, "j": 4, "k": 3}, "(x0 * x1) * 3", "sum"),
    ("bc", [("Y", "bc")], {"b": 13, "c": 5}, "-0.0007423904974016332 * x0", "sum"),
]
DTYPES = ["float64", "float32", "int64", "bool"]


def _operands(op, dtype, transposed=False):
    out = []
    size = op.size
    for o in op.inputs:
        shape = tuple(size[l] for l in o.labels)
        if transposed and len(shape) == 2:  # a view laid across memory
            a = _values(shape[::-1], dtype).T
        else:
            a = _values(shape, dtype)
        out.append(a)
    return out


def _values(shape, dtype):
    if np.dtype(dtype).kind == "f":
        a = RNG.standard_normal(shape).astype(dtype)
        flat = a.reshape(-1)
        for n, v in enumerate([np.nan, np.inf, -np.inf, -0.0][:flat.size]):
            flat[(n * 7) % flat.size] = v
        return a
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    return RNG.integers(-5, 6, shape).astype(dtype)


def _op(spec_row, dtype):
    out_labels, inputs, sizes, join, agg = spec_row
    op = EinOp.contraction("R", out_labels, inputs, sizes,
                           join=None if join is None else scalar.parse_join(join), agg=agg)
    try:
        want = scalar.dtype_of(op.join, [dtype] * len(inputs))
    except Exception:  # noqa: BLE001 - a join NumPy refuses on these dtypes: not a case
        return None
    return replace(op, dtype=str(np.dtype(want)), in_dtypes=(dtype,) * len(inputs))


def _call(fn):
    with np.errstate(all="ignore"), warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        try:
            return fn(), None, [str(w.message) for w in got]
        except Exception as exc:  # noqa: BLE001 - what the spec raises, compared
            return None, type(exc), [str(w.message) for w in got]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", OPS, ids=[f"{r[4]}:{r[3]}:{r[0]}" for r in OPS])
def test_a_bound_call_gives_the_specs_bytes(row, dtype, with_out, transposed):
    op = _op(row, dtype)
    if op is None:
        return
    spec = KernelSpec(op)
    args = _operands(op, dtype, transposed)
    shapes = [a.shape for a in args]
    out_shape = op.out_shape
    fresh = (lambda: np.full(out_shape, 7, dtype=op.dtype)) if with_out else (lambda: None)
    with np.errstate(all="ignore"):
        fn = bind(spec, args, out_shape, fresh())
    c = spec.choice
    if (c.method in ("matmul", "broadcast") or spec.copy_only) and not c.fallback_on and \
            (not spec.blas or all(a.dtype == spec.dtype for a in args)):
        assert fn is not None, c.describe()  # a BLAS call tested for NaN/inf, or cast: not
    if fn is None:
        return
    assert signature(args) == tuple((a.shape, a.dtype, a.flags.c_contiguous) for a in args)
    out_a, out_b = fresh(), fresh()
    want, want_exc, want_warned = _call(lambda: spec(list(args), shapes, out_shape, out_a))
    got, got_exc, got_warned = _call(lambda: fn(list(args), out_b))
    assert got_exc == want_exc and got_warned == want_warned == []
    if want_exc is not None:
        return
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert (got is out_b) == (want is out_a)
    assert got.flags.c_contiguous == want.flags.c_contiguous
    for a, b in zip(args, _operands(op, dtype, transposed)):  # the operands are untouched
        assert a.dtype == b.dtype and a.shape == b.shape


def test_calls_that_are_not_bound():
    sizes = {"b": 13, "c": 5}
    z = RNG.standard_normal((13, 5))
    argmax = EinOp.contraction("R", "b", [("Z", "bc")], sizes, join=scalar.parse_join("x0 * 1"),
                               agg="argmax", dtype="int64")
    assert bind(KernelSpec(argmax), [z], (13,)) is None  # ARGMAX: the spec's
    op = EinOp.contraction("R", "b", [("Z", "bc")], sizes, join=scalar.parse_join("x0 * 1"),
                           agg="max")
    spec = KernelSpec(op)
    spec.choice = replace(spec.choice, chunk_elements=13)  # chunks of one c: the spec's
    assert bind(spec, [z], (13,)) is None
    ew = EinOp.contraction("R", "bc", [("Z", "bc")], sizes, join=scalar.parse_join("x0 + 1"))
    spec = KernelSpec(ew)
    spec.choice = replace(spec.choice, chunk_elements=10)  # in slabs of rows: the spec's
    assert bind(spec, [z], (13, 5)) is None
    assert bind(KernelSpec(ew), [None], (13, 5)) is None  # an absent operand
    assert signature([z, None]) is None
    three = EinOp.contraction("R", "i", [("A", "ij"), ("B", "jk"), ("C", "k")],
                              {"i": 3, "j": 4, "k": 2})
    spec = KernelSpec(three)
    if spec.choice.method == "contract":  # opt_einsum's contract: the spec's
        assert bind(spec, [RNG.standard_normal(s) for s in ((3, 4), (4, 2), (2,))],
                    (3,)) is None


def test_a_join_over_integers_still_ignores_warnings():
    """NumPy may warn of more than floating-point errors off floating dtypes: the bound call
    ignores warnings as the spec does (its ``catch_warnings``)."""
    op = _op(("i", [("a", "i"), ("b", "i")], {"i": 6}, "x0 / x1", "sum"), "int64")
    spec = KernelSpec(op)
    a, b = np.arange(6), np.array([1, 0, 2, 0, 3, 1])
    with np.errstate(all="ignore"):
        fn = bind(spec, [a, b], (6,))
    assert fn is not None and fn.__name__ == "quiet"
    got, exc, warned = _call(lambda: fn([a, b], None))
    want, _, _ = _call(lambda: spec([a, b], [(6,), (6,)], (6,)))
    assert exc is None and warned == [] and got.tobytes() == want.tobytes()
