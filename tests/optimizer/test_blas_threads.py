"""The plan-level choice of one BLAS call with every core against split pieces with one BLAS
thread each (optimizer/threads.py): which plan is chosen (asserted on the plan, never on times),
that answers equal numpy's, and that the local pool sets the BLAS thread count the plan records,
as threadpoolctl reports it from inside the run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import tensordb
from tensordb import optimizer
from tensordb.optimizer.cost import blas_efficiency
from tensordb.physical.plan import Kernel
from tensordb.plan.memory import BLAS_FLOPS_PER_THREAD
from tensordb.plan.ir import EinGraph, EinOp, TensorInfo

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
# The count a 2-worker connection can give one call on this machine (1 core: no one-call plan).
THREADS = min(2, CORES) if CORES >= 2 else 0


def _matmul(m, k, n, spec=("ij", "jk", "ik")):
    sizes = dict(zip(spec[0], (m, k)))
    sizes.update(zip(spec[1], (k, n) if spec[1][0] == "j" else (m, n)))
    op = EinOp.contraction("C", spec[2], [("A", spec[0]), ("B", spec[1])], sizes)
    a = TensorInfo("A", tuple(sizes[l] for l in spec[0]), "float64")
    b = TensorInfo("B", tuple(sizes[l] for l in spec[1]), "float64")
    return EinGraph((a, b), (op,), ("C",))


def _gram(m, n):
    op = EinOp.contraction("G", "jk", [("X", "ij"), ("X", "ik")], {"i": m, "j": n, "k": n})
    return EinGraph((TensorInfo("X", (m, n), "float64"),), (op,), ("G",))


def test_square_matmul_is_one_call_with_every_thread():
    d = optimizer.decompose(_matmul(512, 512, 512), 2, blas_threads=2)
    assert d.details["blas_threads"] == 2
    assert set(d.pieces("C").values()) == {1}
    assert d.details["one_call_cost"] < d.details["split_cost"]
    assert d.details["cost"].total == d.details["one_call_cost"]


def test_gram_is_split_with_one_thread_each():
    # a 64 x 64 output: two OpenBLAS threads keep no more than one core busy
    assert blas_efficiency(64 * 64, 2) == 0.5
    d = optimizer.decompose(_gram(32768, 64), 2, blas_threads=2)
    assert d.details["blas_threads"] == 0
    assert d.pieces("G")["i"] > 1
    assert d.details["split_cost"] < d.details["one_call_cost"]


def test_no_one_call_plan_without_threads_or_with_fixed_pieces():
    g = _matmul(512, 512, 512)
    assert optimizer.decompose(g, 2).details["blas_threads"] == 0          # Dask, GPU: 1 thread
    assert "one_call_cost" not in optimizer.decompose(g, 2).details
    fixed = optimizer.decompose(g, 2, blas_threads=2, pieces={"C": {"k": 2}})
    assert fixed.details["blas_threads"] == 0 and fixed.pieces("C")["k"] == 2  # a user's pieces win
    # too small a call for two threads (under BLAS_FLOPS_PER_THREAD flops each): none offered
    small = optimizer.decompose(_matmul(128, 128, 128), 2, blas_threads=2)
    assert small.details["blas_threads"] == 0 and "one_call_cost" not in small.details


def test_one_call_plan_that_does_not_fit_the_memory_limit_is_not_chosen():
    g = _matmul(512, 512, 512)
    d = optimizer.decompose(g, 2, blas_threads=2, memory_limit=4 << 20)
    assert d.details["blas_threads"] == 0
    assert d.details["memory"].fits


def _run_recording_threads(con, graph):
    seen = []

    def progress(done, total):  # called on the worker threads while the run's limit is set
        seen.append({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})

    con.progress_callback = progress
    con.run(graph, replace=True)
    return seen


@pytest.mark.parametrize("case", ["square", "gram"])
def test_pool_sets_the_threads_the_plan_records(tmp_path, case):
    rng = np.random.default_rng(7)
    with tensordb.connect(str(tmp_path / "c.db"), workers=2) as con:
        con.set("blas_one_call", "on")
        if case == "square":
            arrays = {"A": rng.standard_normal((512, 512)), "B": rng.standard_normal((512, 512))}
            graph = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT")
            want = arrays["A"] @ arrays["B"]
        else:
            arrays = {"X": rng.standard_normal((32768, 64))}
            graph = tensordb.Graph().einsum("ij,ik->jk", "X", "X", into="OUT")
            want = arrays["X"].T @ arrays["X"]
        for name, a in arrays.items():
            con.load(name, a)
        seen = _run_recording_threads(con, graph)
        plan = con.last_plan
        assert plan.blas_threads == (THREADS if case == "square" else 0)
        if case == "square":
            assert plan.kernel_calls == 1
        else:
            assert plan.kernel_calls > 1
        set_to = con._get_executor().last_blas_threads
        # the plan's count, or for a split plan the executor's rule: cores / busy workers, at
        # most one thread per BLAS_FLOPS_PER_THREAD of the largest call
        kernels = [t for t in plan.tasks if isinstance(t, Kernel)]
        rule = max(1, min(CORES // len({t.worker for t in kernels}),
                          max(t.flops for t in kernels) // BLAS_FLOPS_PER_THREAD))
        assert set_to == (plan.blas_threads or rule)
        assert seen and all(s == {set_to} for s in seen)
        np.testing.assert_allclose(con.tensor("OUT"), want, rtol=1e-10, atol=1e-9)
        text = con.explain(graph)
        line = next(l for l in text.splitlines() if "blas threads:" in l)
        data = json.loads(con.explain(graph, format="json"))
        assert data["blas"]["threads"] == plan.blas_threads
        assert data["blas"]["one_call_threads"] == (THREADS or None)
        assert (f"blas threads: {THREADS}, one call" in line) == (case == "square" and THREADS > 0)
        assert ("the executor's, split" in line) == (case == "gram" and THREADS > 0)


def test_mlp_layer_one_call_matmul_split_elementwise(tmp_path):
    rng = np.random.default_rng(3)
    x, w, c = rng.standard_normal((1024, 512)), rng.standard_normal((512, 1024)), \
        rng.standard_normal(1024)
    with tensordb.connect(str(tmp_path / "c.db"), workers=2) as con:
        con.set("blas_one_call", "on")
        for name, a in {"X": x, "W": w, "c": c}.items():
            con.load(name, a)
        con.run(tensordb.Graph().einsum("bh,hf->bf", "X", "W", into="Z", store=False)
                .op("H", "bf", [("Z", "bf"), ("c", "f")], join="relu(x0 + x1)"))
        plan = con.last_plan
        np.testing.assert_allclose(con.tensor("H"), np.maximum(x @ w + c, 0), rtol=1e-10,
                                   atol=1e-9)
        if THREADS:
            assert plan.blas_threads == THREADS
            calls = [(k.method, s.kernel_calls) for s, k in zip(plan.stats, plan.kernels)]
            assert calls[0] == ("matmul", 1)      # one BLAS call on every core
            assert calls[1][0] == "broadcast"     # relu(Z + c): NumPy on one thread per call
            assert calls[1][1] >= 2               # ...split across the workers


def test_one_call_plans_are_off_by_default_and_the_setting_is_checked(tmp_path):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((512, 512)), rng.standard_normal((512, 512))
    graph = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT")
    with tensordb.connect(str(tmp_path / "c.db"), workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        con.run(graph, replace=True)
        assert con.settings.blas_one_call is False
        assert con.last_plan.blas_threads == 0  # split: no one-call plan offered
        np.testing.assert_allclose(con.tensor("OUT"), a @ b, rtol=1e-10, atol=1e-9)
        with pytest.raises(tensordb.ProgrammingError, match="blas_one_call must be on or off"):
            con.execute("SET blas_one_call = 'maybe'")
        assert con.settings.blas_one_call is False  # a refused SET changes nothing
        con.execute("SET blas_one_call = on")
        con.run(graph, replace=True)
        assert con.last_plan.blas_threads == THREADS
        np.testing.assert_allclose(con.tensor("OUT"), a @ b, rtol=1e-10, atol=1e-9)


def test_a_blas_library_loaded_after_the_first_run_is_capped_too():
    """The pool's limit covers a BLAS library loaded after its first run (scipy's OpenBLAS,
    loaded by the first sparse or linalg import): in a fresh process, every BLAS library
    threadpoolctl sees has the limit's thread count inside it."""
    code = (
        "import json\n"
        "from threadpoolctl import threadpool_info\n"
        "from tensordb.exec import pool\n"
        "with pool._blas_limits(1):\n"
        "    pass\n"
        "import scipy.linalg  # noqa: F401 - loads scipy's own BLAS\n"
        "with pool._blas_limits(1):\n"
        "    inside = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
        "print(json.dumps(inside))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout
    inside = json.loads(out.strip().splitlines()[-1])
    assert inside and all(n == 1 for n in inside)
