"""Joins compiled once into one function of NumPy calls (exec/fused.py), against the expression
interpreter they replace (plan/scalar.evaluate, the oracle): the same bytes and dtypes on
NaN, inf, -0.0, empty and 0-d operands, with and without an ``out`` buffer; and the kernels
that use them (exec/kernels.py) against numpy."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tensordb.exec.fused import compile_join
from tensordb.exec.kernels import KernelSpec
from tensordb.plan import scalar
from tensordb.plan.ir import EinOp

RNG = np.random.default_rng(2029)

JOINS = [
    "x0 * 1", "1 * x0", "x0 * 1.0", "x0 * 1 + x1", "exp(x0 * 1 - _stop(where(x1 - x1 == 0, x1, 0)))",
    "x2 * exp(x0 * 1 - _stop(where(x1 - x1 == 0, x1, 0)))",
    "(log(x1) + _stop(where(x0 - x0 == 0, x0, 0)) - x2) * 1", "x0 / 1347", "0.5 * (1 / x0)",
    "x0 - 0.25 * x1", "relu(x0 - 2)", "relu(x0 * x1)", "sigmoid(x0)", "tanh(sqrt(abs(x0)))",
    "neg(exp(x0))", "_stop(x0)", "pow(x0, 2)", "x0 > x1", "where(x0 > 0, x0, x1)",
    "_gt(x0, 0) * x1", "_sign(x0) * 1", "exp(2) * x0", "max(x0, x1) - min(x0, x1)",
    "square(x0 + x1) * 1", "log(exp(x0))", "cos(sin(x0 * 1))",
    "x0 - x0 == 0", "where(x0 - x0 == 0.0, x0, 0) * x1", "x0 - x1 == 0", "x0 - x0 == 1",
]
DTYPES = ["float64", "float32", "int64", "int32", "bool"]


def _operands(dtype, shapes):
    out = []
    for shape in shapes:
        if np.dtype(dtype).kind == "f":
            a = RNG.standard_normal(shape).astype(dtype)
            flat = a.reshape(-1)
            flat[:4] = [np.nan, np.inf, -np.inf, -0.0][:flat.size][:4] if flat.size else []
        elif dtype == "bool":
            a = RNG.integers(0, 2, shape).astype(bool)
        else:
            a = RNG.integers(-5, 6, shape).astype(dtype)
        out.append(a)
    return out


def _same(a, b, kind=True):
    if kind:
        assert type(a) is type(b) or (np.isscalar(a) and np.isscalar(b)), (type(a), type(b))
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def _oracle(expr, values, out=None):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return scalar.evaluate(expr, values, np, out=out), None
        except Exception as exc:  # noqa: BLE001 - what the interpreter raises, compared
            return None, type(exc)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("text", JOINS)
@pytest.mark.parametrize("shapes", [((5, 4), (1, 4), (5, 4)), ((0, 3), (1, 3), (0, 3)),
                                    ((), (), ())])
def test_a_compiled_join_gives_the_interpreters_bytes(text, dtype, shapes):
    expr = scalar.parse_join(text)
    values = _operands(dtype, shapes)
    want, raised = _oracle(expr, values)
    for reduced in (False, True):
        fn = compile_join(expr, [dtype] * 3, reduced=reduced)
        if fn is None:  # NumPy refuses it: left to the interpreter, which raises
            assert raised is not None or dtype == "bool", text
            continue
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if raised is not None:
                with pytest.raises(raised):
                    fn(values)
                continue
            got = fn(values)
        _same(got, want, not reduced)  # a reduced value is taken by np.asarray
        if not reduced and got is not None:
            assert all(got is not v for v in values if text != "_stop(x0)")
        # into an output buffer, as the kernels call it
        if isinstance(want, np.ndarray) and want.ndim:
            ref = np.empty(want.shape, dtype=want.dtype)
            mine = np.empty(want.shape, dtype=want.dtype)
            r, _ = _oracle(expr, values, out=ref)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = fn(values, mine)
            _same(np.asarray(m), np.asarray(r))
            if not reduced:  # a reduced value may be the operand itself, not written in out
                assert (m is mine) == (r is ref)


def test_times_one_is_left_out_only_where_it_changes_nothing():
    x = np.array([1.5, -0.0, np.nan])
    # inside a reduction the operand itself; as a tile, a new array
    assert compile_join(scalar.parse_join("x0 * 1"), ["float64"], reduced=True)([x]) is x
    tile = compile_join(scalar.parse_join("x0 * 1"), ["float64"])([x])
    assert tile is not x and tile.tobytes() == x.tobytes()
    # a bool times 1 is an int64: kept
    b = np.array([True, False])
    got = compile_join(scalar.parse_join("x0 * 1"), ["bool"], reduced=True)([b])
    assert got.dtype == np.int64 and got.tolist() == [1, 0]
    # an int times 1.0 is a float64: kept
    i = np.array([3, 4], dtype=np.int32)
    got = compile_join(scalar.parse_join("exp(x0 * 0 + x0) * 1.0"), ["int32"])([i])
    assert got.dtype == np.float64
    src = compile_join(scalar.parse_join("exp(x0 - x1) * 1"), ["float64"] * 2).source
    assert " 1" not in src.replace("t1", "")  # the product is gone


def test_no_literal_is_spelled_in_the_generated_text():
    fn = compile_join(scalar.parse_join("x0 * 2.718281828 + 31337"), ["float64"])
    assert "2.718" not in fn.source and "31337" not in fn.source
    np.testing.assert_array_equal(fn([np.array([1.0])]), [1.0 * 2.718281828 + 31337])


def test_a_unary_function_of_a_new_array_reuses_it():
    fn = compile_join(scalar.parse_join("exp(x0 - x1) * 2"), ["float64"] * 2)
    assert "out=t0" in fn.source
    x, y = RNG.standard_normal(6), RNG.standard_normal(6)
    assert fn([x, y]).tobytes() == (np.exp(x - y) * 2).tobytes()
    fn32 = compile_join(scalar.parse_join("exp(x0 - x1) * 2"), ["int32"] * 2)  # int -> float
    assert "out=t0" not in fn32.source
    a, b = np.arange(4, dtype=np.int32), np.ones(4, dtype=np.int32)
    np.testing.assert_array_equal(fn32([a, b]), np.exp(a - b) * 2)


def _spec(out, out_labels, inputs, sizes, join, agg="sum"):
    op = EinOp.contraction(out, out_labels, inputs, sizes, join=scalar.parse_join(join), agg=agg)
    return KernelSpec(op)


@pytest.mark.parametrize("agg", ["max", "min", "sum"])
def test_a_row_reduction_of_a_strided_chunk_matches_numpy(agg):
    z = RNG.standard_normal((1347, 10))
    z[3, 4], z[7] = np.nan, -np.inf
    spec = _spec("m", "b", [("Z", "bc")], {"b": 1347, "c": 10}, "x0 * 1", agg)
    with np.errstate(all="ignore"):
        got = spec([z], [z.shape], (1347,))
    want = getattr(np, {"max": "max", "min": "min", "sum": "sum"}[agg])(z, axis=1)
    if agg == "sum":  # the sum's order is unchanged: numpy's own bytes
        assert got.tobytes() == want.tobytes()
    else:
        np.testing.assert_array_equal(got, want)
    assert got.dtype == z.dtype and got.flags.c_contiguous


def test_a_scaled_one_operand_contract_is_the_product():
    y = RNG.standard_normal((20, 10))
    y[0, 0] = np.inf
    spec = _spec("d", "bc", [("Y", "bc")], {"b": 20, "c": 10}, "-0.0007423904974016332 * x0")
    assert spec.choice.method == "contract" and spec.copy_only
    got = spec([y], [y.shape], y.shape)
    want = -0.0007423904974016332 * y
    assert got.tobytes() == want.tobytes() and got is not y


def test_a_reduced_joins_outer_unary_function_reuses_its_new_argument():
    """Only reduced (a LOGSUMEXP's SUM of EXP): the outermost EXP writes over the new array
    it reads when no ``out`` is given, into ``out`` when one is, with the interpreter's bytes
    either way; a kept tile (not reduced) never takes its argument's buffer."""
    expr = scalar.parse_join("exp(x0 - x1)")
    fn = compile_join(expr, ["float64"] * 2, reduced=True)
    kept = compile_join(expr, ["float64"] * 2)
    assert "out=t0" in fn.source and "out=t0" not in kept.source
    x, y = RNG.standard_normal((4, 3)), RNG.standard_normal((1, 3))
    x[0, 0], x[1, 1] = np.inf, np.nan
    want = scalar.evaluate(expr, [x, y], np)
    with np.errstate(all="ignore"):
        assert fn([x, y]).tobytes() == want.tobytes()
        into = np.empty((4, 3))
        assert fn([x, y], into) is into and into.tobytes() == want.tobytes()
    assert x[0, 0] == np.inf and np.isnan(x[1, 1])  # the operands are left as they were



LONG = "exp(x0) * 2.0 + sin(x1) - cos(x0) * x1 + x0 * x0 - x1 / 3.0 + tanh(x0 * x1)"


@pytest.mark.parametrize("join", [LONG, "exp(x0 - x1) * 2 + x0 * x1", "relu(x0 * x1) - x1"])
def test_a_compiled_join_holds_no_more_arrays_than_the_interpreter(join):
    """Each intermediate is freed after its last use, as ``evaluate`` frees a call's
    arguments: the arrays alive at once are ``live_arrays``, what the memory budget reserves
    for a chunk (held until the function returned, LONG's 13 calls held 7 chunk-sized arrays,
    not 3). Measured with tracemalloc, which sees NumPy's buffers."""
    import tracemalloc
    from tensordb.plan.kernel import live_arrays
    expr = scalar.parse_join(join)
    p = RNG.standard_normal((8, 128, 1)).astype(np.float32)  # a chunk of P[i,j] * Q[j,k]
    q = RNG.standard_normal((8, 1, 128)).astype(np.float32)
    chunk = 8 * 128 * 128 * 4
    fn = compile_join(expr, ["float32"] * 2, reduced=True)

    def peak(call):
        call()  # NumPy's small-buffer cache warmed up
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            result = call()
            return tracemalloc.get_traced_memory()[1], result
        finally:
            tracemalloc.stop()

    with np.errstate(all="ignore"):
        got_peak, got = peak(lambda: fn([p, q]))
        want_peak, want = peak(lambda: scalar.evaluate(expr, [p, q], np))
    _same(got, want)
    assert got_peak <= want_peak + chunk // 8, (got_peak / chunk, want_peak / chunk)
    assert got_peak <= live_arrays(expr) * chunk + chunk // 8, (got_peak / chunk, fn.source)


def test_a_guard_of_finite_values_is_one_isfinite_call():
    """A LOGSUMEXP's guard ``where(m - m == 0, m, 0)`` tests finiteness in one call (the bytes
    against the interpreter: the JOINS above), for integer and float operands, not for bool
    ones (``x - x`` of a bool raises, in the interpreter as before)."""
    def finite_test(text, dtypes):
        fn = compile_join(scalar.parse_join(text), dtypes)
        return fn is not None and any(v is np.isfinite for v in fn.__globals__.values())
    guard = "exp(x0 * 1 - _stop(where(x1 - x1 == 0, x1, 0)))"
    for dtype in ("float64", "float32", "int64"):
        assert finite_test(guard, [dtype] * 2)
    assert not finite_test("x0 - x1 == 0", ["float64"] * 2)
    assert not finite_test("x0 - x0 == 1", ["float64"])
    assert not finite_test("x0 - x0 == 0", ["bool"])
