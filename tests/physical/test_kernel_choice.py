"""The kernel choice is data in the plan (physical/choice.py): lowering decides, EXPLAIN shows it,
and the executor's kernels follow it. Answers are checked against NumPy."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import tensordb
from tensordb.errors import InternalError
from tensordb.exec.kernels import KernelSpec
from tensordb.physical.choice import KernelChoice, MatmulLayout, choose_kernel
from tensordb.bind import bind_graph as bind
from tensordb.plan.ir import EinOp, Operand
from tensordb.plan.scalar import parse_join

RNG = np.random.default_rng(11)
A, B = RNG.standard_normal((6, 5)), RNG.standard_normal((5, 4))


@pytest.fixture
def con():
    with tensordb.connect(workers=2) as c:
        c.load("A", A)
        c.load("B", B)
        yield c


# statement, the kernel EXPLAIN shows for its (one) operation, numpy's answer
CASES = [
    ("C[i,k] = SUM(A[i,j] * B[j,k])", "matmul x0@x1", lambda: A @ B),
    ("C[k,i] = SUM(A[i,j] * B[j,k])", "matmul x1@x0", lambda: (A @ B).T),
    ("C[i,k] = SUM(2 * A[i,j] * B[j,k])", "matmul x0@x1", lambda: 2 * A @ B),
    ("C[i] = SUM(A[i,j] * B[j,k])", "contract", lambda: (A @ B).sum(axis=1)),
    ("C[i,k] = MIN(A[i,j] + B[j,k])", "broadcast by j", lambda: (A[:, :, None] + B[None]).min(axis=1)),
    ("C[i,j] = RELU(A[i,j]) * 2", "broadcast by rows", lambda: np.maximum(A, 0) * 2),
]


@pytest.mark.parametrize("statement, kernel, numpy", CASES)
def test_explain_shows_the_kernel_the_run_uses(con, statement, kernel, numpy):
    data = json.loads(con.explain(statement, format="json"))
    [node] = data["nodes"]
    assert node["kernel"]["text"] == kernel
    assert node["kernel"]["method"] == kernel.split()[0]
    text = con.explain(statement)
    row = next(line for line in text.splitlines() if node["expression"] in line)
    assert row.rstrip().endswith(kernel)
    con.execute(statement)
    assert con.last_plan.kernels[0].describe() == kernel  # the very plan that ran
    np.testing.assert_allclose(con.tensor("C"), numpy(), rtol=1e-12)


def test_the_chunk_label_is_the_largest_aggregated_label_of_a_tile():
    a, b = RNG.standard_normal((4, 64)), RNG.standard_normal((4, 32))
    with tensordb.connect(workers=1) as con:
        con.load("A", a)
        con.load("B", b)
        stmt = "P[i] = MAX(A[i,j] + B[i,k])"
        assert con.explain(stmt, format="json").count('"chunk": "j"') == 1    # j (64) > k (32)
        # four pieces of j leave 16 per tile: k (32) is now the largest in a tile
        assert con.explain(stmt + " WITH (PIECES j 4)", format="json").count('"chunk": "k"') == 1
        con.execute(stmt + " WITH (PIECES j 4)")
        np.testing.assert_allclose(con.tensor("P"), (a[:, :, None] + b[:, None, :]).max(axis=(1, 2)))


def test_the_kernel_follows_the_choice_it_is_given():
    """A product the plan would send to BLAS, run as the broadcast the choice says: NumPy's
    answer, computed in chunks (check is called between them; one BLAS call would not be)."""
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 6, "j": 5, "k": 4})
    assert choose_kernel(op).method == "matmul"
    spec = KernelSpec(op, choice=KernelChoice("broadcast", chunk="j", chunk_elements=24))
    calls = []
    out = spec([A, B], [A.shape, B.shape], (6, 4), check=lambda done=None: calls.append(done))
    np.testing.assert_allclose(out, A @ B, rtol=1e-12)
    assert [d for d in calls if d is not None] == [0, 1 / 5, 2 / 5, 3 / 5, 4 / 5]  # one j a chunk



@pytest.mark.parametrize("join, dtypes, want", [
    ("relu(x0 + x1)", ("float32", "float32"), lambda x, c: np.maximum(x + c, 0)),
    ("x0 * 2 + x1", ("float32", "float32"), lambda x, c: x * 2 + c),
    ("relu(x0)", ("bool", "float32"), lambda x, c: np.maximum(x, 0)),
    ("x0", ("float32", "float32"), lambda x, c: x),
])
def test_an_elementwise_join_in_slabs_lands_in_the_output_buffer(join, dtypes, want):
    """A large elementwise tile is computed in slabs of its first axis, each written into the
    caller's output buffer (in place where the join's outermost function is a ufunc or RELU,
    copied otherwise): NumPy's values and dtype, whichever way."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((10, 6)).astype(np.float32)
    x = x > 0 if dtypes[0] == "bool" else x
    c = rng.standard_normal(6).astype(np.float32)
    expect = want(x, c)
    op = EinOp("O", ("b", "f"), (Operand("X", ("b", "f")), Operand("c", ("f",))),
               (("b", 10), ("f", 6)), parse_join(join), None, str(expect.dtype), in_dtypes=dtypes)
    spec = KernelSpec(op, choice=KernelChoice("broadcast", chunk="rows", chunk_elements=12))
    out = np.full((10, 6), -7, dtype=expect.dtype)
    checks = []
    got = spec([x, c], [x.shape, c.shape], (10, 6), out=out, check=lambda done=None: checks.append(done))
    assert got is out and [d for d in checks if d is not None] == [0, 0.2, 0.4, 0.6, 0.8]  # slabs of 2 rows
    np.testing.assert_array_equal(out, expect)

def test_a_plan_runs_with_the_kernels_it_carries(con):
    graph = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C")
    bound = bind(graph, con.store)
    decomp, plan = con.plan(bound)
    forced = dataclasses.replace(plan, kernels=(KernelChoice("broadcast", chunk="j", chunk_elements=8),))
    con._run_graph(bound, replace=True, planned=(decomp, forced))
    np.testing.assert_allclose(con.tensor("C"), A @ B, rtol=1e-12)


@pytest.mark.parametrize("make, message", [
    (lambda: KernelChoice("blas"), "unknown kernel method"),
    (lambda: KernelChoice("matmul"), "layout"),
    (lambda: KernelChoice("broadcast"), "chunking"),
    (lambda: KernelChoice("contract", chunk="j"), "chunking"),
    (lambda: KernelChoice("broadcast", chunk="j", chunk_elements=0), "chunks of 0"),
    (lambda: MatmulLayout(0, 0, (0,), (0,), (), ("i",), (), ()), "operands 0 and 1"),
    (lambda: MatmulLayout(0, 1, (0,), (0,), (), ("i",), ("j",), ()), "permutations"),
])
def test_choices_validate_themselves(make, message):
    with pytest.raises(InternalError, match=message):
        make()


def test_a_join_numpy_computes_in_another_dtype_is_not_sent_to_blas():
    """int32 * int32 * 0.5: NumPy multiplies in int32 (wrapping) before the constant, so BLAS in
    float64 would differ (scalar.uniform_dtype): the choice is a broadcast, and NumPy's answer."""
    a = np.array([[2**20, 3], [5, 7]], dtype=np.int32)
    with tensordb.connect(workers=1) as con:
        con.load("I", a)
        stmt = "P[i,k] = SUM(I[i,j] * I[j,k] * 0.5)"
        assert '"method": "broadcast"' in con.explain(stmt, format="json")
        con.execute(stmt)
        with np.errstate(over="ignore"):
            want = (a[:, :, None] * a[None, :, :] * 0.5).sum(axis=1)
        np.testing.assert_array_equal(con.tensor("P"), want)


def _sgd_op(shape, dtype="float32"):
    return EinOp("O", ("f", "h"), (Operand("W", ("f", "h")), Operand("D", ("f", "h"))),
                 (("f", shape[0]), ("h", shape[1])), parse_join("x0 - 0.01 * x1"), None, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_large_elementwise_tile_is_computed_in_cache_slabs_each_handed_to_the_sink(dtype):
    """An elementwise tile larger than SLAB_BYTES (an SGD update ``W - 0.01 * D``) is
    computed in slabs of rows of about that size, each written into the output buffer and
    handed to ``sink`` in order, covering the buffer once: NumPy's values, NaN and inf
    included."""
    from tensordb.exec import kernels
    rng = np.random.default_rng(11)
    shape = (700, 1000)  # 2.7 MiB in float32: three slabs (262 rows of 4000 bytes)
    w = rng.standard_normal(shape).astype(dtype)
    d = rng.standard_normal(shape).astype(dtype)
    w[3, 4], d[699, 999], w[350, 0] = np.nan, np.inf, -np.inf
    spec = KernelSpec(_sgd_op(shape, dtype))
    out = np.empty(shape, dtype)
    slabs = []
    got = spec([w, d], [shape, shape], shape, out=out, sink=slabs.append)
    assert got is out
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out, w - np.asarray(0.01, dtype) * d)
    rows = kernels.SLAB_BYTES // (shape[1] * np.dtype(dtype).itemsize)
    assert len(slabs) == -(-shape[0] // rows) > 1
    starts = [s.ctypes.data - out.ctypes.data for s in slabs]
    assert starts == [k * rows * shape[1] * out.itemsize for k in range(len(slabs))]
    assert sum(s.shape[0] for s in slabs) == shape[0]


def test_no_slab_reaches_the_sink_unless_the_kernel_writes_into_the_callers_buffer():
    """Without an output buffer, with one of another dtype, or a strided one, the kernel's
    result is not the buffer: no slab is handed over (the caller takes its own statistics).
    A tile under SLAB_BYTES is computed whole, with no slabs either."""
    rng = np.random.default_rng(12)
    shape = (600, 1000)
    w, d = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    want = w - np.float32(0.01) * d
    spec = KernelSpec(_sgd_op(shape))
    for out in (None, np.empty(shape, np.float64), np.empty((600, 2000), np.float32)[:, ::2]):
        slabs = []
        got = spec([w, d], [shape, shape], shape, out=out, sink=slabs.append)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert slabs == []
    small = (64, 100)
    slabs = []
    got = KernelSpec(_sgd_op(small))([w[:64, :100], d[:64, :100]], [small, small], small,
                                     out=np.empty(small, np.float32), sink=slabs.append)
    np.testing.assert_array_equal(got, want[:64, :100])
    assert slabs == []


def test_the_nan_inf_variant_is_chosen_at_planning():
    """A BLAS kernel's variant next to a NaN or inf is the plan's (a chunked broadcast, with what
    the kernel tests): opt_einsum sums B over k before multiplying, which next to A's inf is not
    NumPy's NaN; a stored input the catalog knows finite is not tested at all."""
    a = A.copy()
    a[1, 2] = np.inf
    with tensordb.connect(workers=1) as con:
        con.load("A", a)
        con.load("B", B)
        con.load("F", A)
        con.execute("C[i] = SUM(A[i,j] * B[j,k])")
        choice = con.last_plan.kernels[0]
        assert choice.method == "contract" and choice.fallback_on == ("inputs",)
        assert choice.fallback.method == "broadcast" and choice.fallback.chunk in ("j", "k")
        with np.errstate(all="ignore"):
            expect = (a[:, :, None] * B[None]).sum(axis=(1, 2))
        assert np.isnan(expect[1])
        np.testing.assert_allclose(con.tensor("C"), expect, rtol=1e-12)
        data = json.loads(con.explain("C[i] = SUM(A[i,j] * B[j,k])", format="json"))
        assert data["nodes"][0]["kernel"]["nonfinite"]["test"] == ["inputs"]
        con.execute("D[i] = SUM(F[i,j] * B[j,k])")   # F is finite: nothing to test
        assert con.last_plan.kernels[0].fallback is None
        np.testing.assert_allclose(con.tensor("D"), (A @ B).sum(axis=1), rtol=1e-12)
        con.execute("E[i,k] = SUM(F[i,j] * B[j,k] * 1e308)")   # a trailing constant: the result
        choice = con.last_plan.kernels[0]
        assert choice.method == "matmul" and choice.fallback_on == ("result",)
        with np.errstate(all="ignore"):
            expect = (A[:, :, None] * B[None] * 1e308).sum(axis=1)
        assert not np.isfinite(expect).all()
        np.testing.assert_allclose(con.tensor("E"), expect, rtol=1e-12)


def test_kernel_temporaries_are_what_the_plan_reserves_and_the_ledger_counts():
    """One figure for a kernel call's temporaries (plan.memory.kernel_temporaries): the pool
    reserves it with the call (exec/budget.py) and the run's ledger counts it while the call runs,
    so a MIN over a long join peaks above its output tile."""
    from tensordb.exec.budget import temporary_bytes, working_bytes
    from tensordb.physical.plan import Kernel
    from tensordb.plan.kernel import element_bytes, live_arrays
    p, q = RNG.standard_normal((32, 64)), RNG.standard_normal((64, 32))
    with tensordb.connect(workers=1) as con:
        con.load("P", p)
        con.load("Q", q)
        con.execute("M[i,k] = MIN(EXP(P[i,j]) * 2 + SIN(Q[j,k]) - COS(P[i,j]) * Q[j,k])")
        plan, run = con.last_plan, con.last_run
        [task] = [t for t in plan.tasks if isinstance(t, Kernel)]
        op = plan.ops[0]
        assert live_arrays(op.join) == 3 and element_bytes(op) == 24
        temps = temporary_bytes(plan, task)
        assert temps == 32 * 64 * 32 * 24 + 32 * 32 * 8   # the whole join space, + the reduction
        assert working_bytes(plan, task) == 32 * 32 * 8 + temps
        assert run.peak_bytes >= temps
    e = np.exp(p)[:, :, None] * 2 + np.sin(q)[None] - np.cos(p)[:, :, None] * q[None]
    with tensordb.connect(workers=1) as con:
        con.load("P", p)
        con.load("Q", q)
        con.execute("M[i,k] = MIN(EXP(P[i,j]) * 2 + SIN(Q[j,k]) - COS(P[i,j]) * Q[j,k])")
        np.testing.assert_allclose(con.tensor("M"), e.min(axis=1), rtol=1e-12)
