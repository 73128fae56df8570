"""GPU workers (CuPy). Without CuPy or a GPU: a clear NotSupportedError, and the rest is skipped
(conftest.py skips tests marked gpu). tests/bench/gpu_device.sh runs them on a lent GPU, with the
random corpora on ``executor="gpu"`` (TENSORDB_TEST_EXECUTOR)."""
from __future__ import annotations

import contextlib
import json
import types

import numpy as np
import pytest

import tensordb
from conftest import gpu_available
from tensordb.exec import make_executor


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_asking_for_a_gpu_without_one_says_so():
    with pytest.raises(tensordb.NotSupportedError, match="CuPy|GPU") as info:
        make_executor("gpu", 1)
    assert "GPU" in str(info.value)


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_gpu_query_without_a_gpu_fails_and_changes_nothing():
    with tensordb.connect(executor="gpu") as con:
        con.load("A", np.eye(4))
        with pytest.raises(tensordb.NotSupportedError, match="CuPy|GPU"):
            con.einsum("ij,jk->ik", "A", "A", into="B")
        assert not con.store.has("B")
        con.set("executor", "local")  # the same connection goes on without a GPU
        con.einsum("ij,jk->ik", "A", "A", into="B")
        np.testing.assert_array_equal(con.tensor("B"), np.eye(4))


def _block_sparse(rng, n, tile, density, dtype=np.float64):
    """An n x n array whose tile x tile blocks are zero but for about ``density`` of them."""
    a = rng.standard_normal((n, n)).astype(dtype)
    for i in range(0, n, tile):
        for j in range(0, n, tile):
            if rng.random() >= density:
                a[i:i + tile, j:j + tile] = 0
    return a


def _cases():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
    d = rng.uniform(1, 9, (64, 64))
    p = rng.uniform(0.5, 1.5, (40, 30))
    s1, s2 = _block_sparse(rng, 128, 16, 0.2), _block_sparse(rng, 128, 16, 0.2)
    i32 = rng.integers(-50, 50, (70, 40)).astype(np.int32)
    f32 = rng.standard_normal((256, 96)).astype(np.float32)
    return [
        ("matmul", [("A", a), ("B", b)], dict(spec="ij,jk->ik", ops=("A", "B")), a @ b),
        ("min-plus", [("D", d)], dict(spec="ik,kj->ij", ops=("D", "D"), join="x0 + x1", agg="min"),
         np.min(d[:, :, None] + d[None, :, :], axis=1)),
        ("row max", [("A", a)], dict(spec="ij->i", ops=("A",), agg="max"), a.max(axis=1)),
        ("row min", [("A", a)], dict(spec="ij->i", ops=("A",), agg="min"), a.min(axis=1)),
        ("column sum of a join", [("A", a)], dict(spec="ij->j", ops=("A",), join="relu(x0) + 1"),
         (np.maximum(a, 0) + 1).sum(axis=0)),
        ("prod", [("P", p)], dict(spec="ij->j", ops=("P",), agg="prod"), p.prod(axis=0)),
        ("max of a product", [("A", a), ("B", b)],
         dict(spec="ij,jk->ik", ops=("A", "B"), agg="max"), (a[:, :, None] * b[None]).max(axis=1)),
        ("block-sparse matmul", [("S1", s1), ("S2", s2)], dict(spec="ij,jk->ik", ops=("S1", "S2")),
         s1 @ s2),
        ("int32 sum", [("I", i32)], dict(spec="ij->i", ops=("I",)), i32.sum(axis=1, dtype=np.int32)),
        ("float32 Gram", [("F", f32)], dict(spec="ij,ik->jk", ops=("F", "F")), f32.T @ f32),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_gpu_executor_matches_numpy(case):
    _, inputs, q, want = case
    with tensordb.connect(executor="gpu") as con:
        for name, arr in inputs:
            con.load(name, arr, tile=tuple(max(1, s // 2) for s in arr.shape))
        ex = con._get_executor()
        pieces = {l: 2 for l in q["spec"].split("->")[0].replace(",", "")}
        con.einsum(q["spec"], *q["ops"], into="OUT", join=q.get("join"), agg=q.get("agg", "sum"),
                   pieces=pieces)
        got = con.tensor("OUT")
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        _close(got, want)
        assert ex.workers == len(ex.devices)
        assert con.last_run.kernel_calls > 0


def _close(got, want):
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        tol = 1e-4 if want.dtype == np.float32 else 1e-9
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))


@pytest.mark.gpu
def test_block_sparse_product_skips_absent_tiles_on_the_gpu():
    rng = np.random.default_rng(1)
    s1, s2 = _block_sparse(rng, 256, 32, 0.1), _block_sparse(rng, 256, 32, 0.1)
    with tensordb.connect(executor="gpu") as con:
        con.load("S1", s1, tile=(32, 32))
        con.load("S2", s2, tile=(32, 32))
        con.einsum("ij,jk->ik", "S1", "S2", into="OUT", pieces={"i": 8, "j": 8, "k": 8})
        _close(con.tensor("OUT"), s1 @ s2)
        assert con.last_run.kernel_calls < 8 ** 3  # absent tiles are skipped, not multiplied


@pytest.mark.gpu
def test_a_chain_with_intermediates_on_the_device():
    """relu(X W1) W2, the hidden layer not stored: it stays on the device between operations."""
    rng = np.random.default_rng(2)
    x, w1, w2 = (rng.standard_normal(s) for s in ((64, 48), (48, 80), (80, 24)))
    g = (tensordb.Graph().op("H", "bf", [("X", "bh"), ("W1", "hf")], join="relu(x0 * x1)",
                             agg="sum", store=False)
         .einsum("bf,fo->bo", "H", "W2", into="Y"))
    with tensordb.connect(executor="gpu") as con:
        for name, arr in (("X", x), ("W1", w1), ("W2", w2)):
            con.load(name, arr, tile=(16, 16))
        con.run(g, pieces={"H": {"b": 2, "f": 2}, "Y": {"b": 2, "f": 2}})
        assert not con.store.has("H")
        want = np.maximum(x[:, :, None] * w1[None], 0).sum(axis=1) @ w2
        _close(con.tensor("Y"), want)


@pytest.mark.gpu
def test_a_query_larger_than_the_device_budget_waits_for_room():
    """The memory_limit bounds the tiles on the device: a product whose tiles hold more than the
    limit runs with tiles moved to host memory and back (never to disk), and is equal."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((512, 512)), rng.standard_normal((512, 512))
    limit = 1 << 20  # 1 MiB; A, B and the result hold 6 MiB
    with tensordb.connect(executor="gpu", memory_limit=limit) as con:
        con.load("A", a, tile=(64, 64))
        con.load("B", b, tile=(64, 64))
        con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 8, "j": 8, "k": 8})
        run = con.last_run
        con.set("memory_limit", "none")  # to read the whole result back at once
        _close(con.tensor("C"), a @ b)
        assert run.memory_limit == limit and run.spilled_bytes > 0  # moved to host memory
        # An aggregation's fold is always admitted (it frees a partial): the first one holds its
        # accumulator next to the partial for a moment, one tile over the limit at most.
        assert run.over_budget == 0 and 0 < run.peak_bytes <= limit + 64 * 64 * 8


@pytest.mark.gpu
def test_each_gpu_is_a_worker():
    import cupy
    from tensordb.exec.gpu import GpuExecutor
    ex = GpuExecutor("gpu")
    assert ex.workers == cupy.cuda.runtime.getDeviceCount()
    assert GpuExecutor("gpu://0").devices == [0]
    with pytest.raises(tensordb.NotSupportedError, match="no GPU"):
        GpuExecutor(f"gpu://{ex.workers}")


class _NoRefusalXp(types.ModuleType):
    """NumPy under another name whose ``power`` computes an integer to a negative power (as
    CuPy does) instead of refusing it."""

    def __init__(self) -> None:
        super().__init__("xp")

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def power(a, b):
        return np.asarray(np.power(np.asarray(a, dtype=np.float64), b)).astype(np.result_type(a, b))


def test_an_int_to_a_negative_power_is_refused_on_any_array_module():
    """NumPy raises for int ** negative int (a DataError for the user); CuPy does not, so the
    kernel refuses it itself when the array module is not NumPy."""
    from tensordb.plan.scalar import evaluate, parse_join
    xp = _NoRefusalXp()
    base = np.array([[2, 3], [4, 5]], np.int64)
    for exp in (np.array([1, -1], np.int64), -2):
        with pytest.raises(ValueError, match="negative integer powers"):
            np.power(base, exp)  # the oracle: NumPy refuses
        with pytest.raises(ValueError, match="negative integer powers"):
            evaluate(parse_join("pow(x0, x1)"), [base, exp], xp)
    for exp in (np.array([0, 2], np.int64), 3, np.array([-1.0, 0.5])):  # allowed: equal to NumPy
        got = evaluate(parse_join("pow(x0, x1)"), [base, exp], xp)
        np.testing.assert_array_equal(got, np.power(base, exp))
    bools = np.array([True, False])
    with pytest.raises(ValueError):
        evaluate(parse_join("pow(x0, -1)"), [bools], xp)


class _CopyingXp(types.ModuleType):
    """NumPy standing in for CuPy where it matters to the memory budget: ``asarray`` copies (a
    Load is a copy on the device), with the ``cuda`` calls DeviceTiles makes as no-ops."""

    def __init__(self) -> None:
        super().__init__("xp")
        self.to_host = 0
        self.cuda = types.SimpleNamespace(Device=lambda d: contextlib.nullcontext(),
                                          Stream=lambda non_blocking: contextlib.nullcontext(),
                                          get_current_stream=lambda: types.SimpleNamespace(
                                              synchronize=lambda: None))

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def asarray(a, dtype=None):
        return np.array(a, dtype=dtype, copy=True)

    def asnumpy(self, a):
        self.to_host += 1
        return np.array(a, copy=True)


def test_device_tiles_over_the_budget_go_to_host_memory_and_come_back():
    """With one device nothing else runs to wait for: tiles that no running task reads (stored
    outputs too) move to host memory and back, so the run stays within the limit (no spill file,
    nothing run over it) and is equal to NumPy."""
    from tensordb.exec.gpu import DeviceTiles
    from tensordb.exec.pool import LocalExecutor
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((512, 512)), rng.standard_normal((512, 512))
    limit = 1 << 20  # A, B and the result hold 6 MiB
    xp = _CopyingXp()
    with tensordb.connect(memory_limit=limit) as con:
        con.load("A", a, tile=(64, 64))
        con.load("B", b, tile=(64, 64))
        con._executor = LocalExecutor(1, memory_limit=limit, tiles=DeviceTiles([0], xp=xp))
        con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 8, "j": 8, "k": 8})
        run = con.last_run
        con.set("memory_limit", "none")
        _close(con.tensor("C"), a @ b)
    assert run.spilled_bytes > 0 and xp.to_host > 64  # more tiles went to the host than C's 64
    # An aggregation's fold is always admitted (it frees a partial): the first one holds its
    # accumulator next to the partial for a moment, one tile over the limit at most.
    assert run.over_budget == 0 and 0 < run.peak_bytes <= limit + 64 * 64 * 8


# -- sparse tiles (exec/gpu_sparse.py): CSR on the device, cupyx's kernels -----------------------
# Run on an H200 with CuPy 14.2 (2026-11-27); without a GPU, tests/exec/test_gpu_sparse.py runs
# them in a process whose cupy is tests/fakecupy.

def _sparse_cases():
    from tests.exec.test_gpu_sparse import CASES
    return CASES


@pytest.mark.gpu
@pytest.mark.parametrize("case", _sparse_cases(), ids=lambda c: c[0])
def test_sparse_einsums_on_the_gpu_match_numpy(case):
    from tests.exec.test_gpu_sparse import _load
    sql, want, _ = case
    with tensordb.connect(executor="gpu") as con:
        _load(con)
        texts = [n["kernel"]["text"] for n in json.loads(con.explain(sql, format="json"))["nodes"]]
        assert any("(cupyx" in t for t in texts), texts
        con.execute(sql)
        got = con.tensor("C")
        assert got.dtype == want.dtype
        _close(got, want)
        assert con.last_run.copies["csr_loads"] >= 1


@pytest.mark.gpu
def test_sparse_mf_training_step_with_grad_on_the_gpu():
    """tests/sparse/test_sparse_grad.py's MF step over a sparse ratings matrix, two steps on
    the GPU: numpy's factors."""
    from tests.sparse.test_sparse_grad import LAM, LR, STEP, _load_mf, _numpy_steps, _ratings
    R = _ratings(40, 30, 0.1, 3)
    with tensordb.connect(executor="gpu") as con:
        U0, V0 = _load_mf(con, R, 4, 1)
        for _ in range(2):
            con.execute(STEP.format(lam=LAM, lr=LR))
        _, U2, V2 = _numpy_steps(U0, V0, R, 2)
        np.testing.assert_allclose(con.tensor("U"), U2, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(con.tensor("V"), V2, rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
def test_sparse_spgemm_output_is_stored_as_csr_tiles_from_the_gpu(tmp_path):
    from tests.sparse.test_sparse_output_tiles import _assert_sparse_tiles, _dense, _graph
    a, b = _graph(90, 0.03, 1), _graph(90, 0.03, 2)
    with tensordb.connect(tmp_path / "db", executor="gpu") as con:
        con.load("A", a)
        con.load("B", b)
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES j 3)")
        np.testing.assert_array_equal(con.tensor("C"), _dense(a) @ _dense(b))
        _assert_sparse_tiles(con, "C", "float64")
