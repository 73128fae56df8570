"""GPU workers (CuPy). Without CuPy or a GPU: a clear NotSupportedError, and the rest is skipped
(conftest.py skips tests marked gpu)."""
from __future__ import annotations


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


def _cases():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
    d = rng.uniform(1, 9, (64, 64))
    return [
        ("matmul", [("A", a), ("B", b)], dict(spec="ij,jk->ik", ops=("A", "B")), a @ b),
        ("min-plus", [("D", d)], dict(spec="ik,kj->ij", ops=("D", "D"), join="x0 + x1", agg="min"),
         np.min(d[:, :, None] + d[None, :, :], axis=1)),
        ("row max", [("A", a)], dict(spec="ij->i", ops=("A",), agg="max"), a.max(axis=1)),
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
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
        assert ex.workers == len(ex.devices)


@pytest.mark.gpu
def test_each_gpu_is_a_worker():
    import cupy
    from tensordb.exec.gpu import GpuExecutor
    ex = GpuExecutor("gpu")
    assert ex.workers == cupy.cuda.runtime.getDeviceCount()
    assert GpuExecutor("gpu://0").devices == [0]
    with pytest.raises(tensordb.NotSupportedError, match="no GPU"):
        GpuExecutor(f"gpu://{ex.workers}")
