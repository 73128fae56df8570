"""The calling thread serves worker 0's queue while a pool run goes (exec/ready.py ``claim``,
``take``, ``release``; exec/pool_run.py ``_Run.serve``): worker 0's tasks run on the caller,
worker 0's thread sleeps on. Oracles: numpy's matmul of each present tile (the bytes, one
product a row tile), the same run with the caller not serving; which threads ran the Loads
(the caller's and worker 1's, never worker 0's); Ctrl-C in a task the caller runs ends the run
and stores nothing; a failure there fails the statement and leaves the pool able to run the
next (what was left on worker 0's queue is drained by its thread); no serving with a progress
callback, under a memory budget's admission, or for a call over ``SERVE_CALL_FLOPS``."""
from __future__ import annotations

import _thread
import threading

import numpy as np
import pytest

import tensordb
from tests.harness import tile_products
from tensordb.exec import pool, pool_run, runtime

RNG = np.random.default_rng(391)
T = 128
N = 6 * T
PRODUCT = "C[i,k] = SUM(A[i,j] * B[j,k])"


def _block_sparse() -> np.ndarray:
    a = np.zeros((N, N))
    for i, j in ((0, 1), (1, 3), (2, 2), (3, 0), (4, 5), (5, 4)):
        a[i * T:(i + 1) * T, j * T:(j + 1) * T] = RNG.standard_normal((T, T))
    return a


A = _block_sparse()
B = RNG.standard_normal((N, T))


def _tile_products(a, b):
    return tile_products(a, b, T)


WANT = _tile_products(A, B)


def _connect(**kw) -> tensordb.Connection:
    con = tensordb.connect(None, workers=2, **kw)
    ex = con.engine.executor()
    ex.fast_path = False  # the pool's dataflow (not the calling thread's straight line)
    con.load("A", A, tile=(T, T))
    con.load("B", B, tile=(T, T))
    return con


@pytest.fixture(autouse=True)
def _serving_on(monkeypatch):
    """On by default (pool.SERVE_CALLER); set here so these tests hold if the default changes."""
    monkeypatch.setattr(pool, "SERVE_CALLER", True)


@pytest.fixture
def loads(monkeypatch):
    """The names of the threads that ran each Load."""
    names: list[str] = []
    real = runtime.run_load

    def run_load(task, reader, xp=np):
        names.append(threading.current_thread().name)
        return real(task, reader, xp)
    monkeypatch.setattr(runtime, "run_load", run_load)
    return names


def _threads(names) -> set[str]:
    main = threading.main_thread().name
    return {"caller" if n == main else n.rsplit("-", 1)[-1] for n in names}


def test_the_caller_runs_worker_0s_tasks_and_the_answer_is_the_same(loads):
    with _connect() as con:
        ex = con.engine.executor()
        assert ex.serve_caller is True
        for _ in range(4):
            con.execute(PRODUCT)
            assert con.tensor("C").tobytes() == WANT.tobytes()
        served = _threads(loads)
        assert "caller" in served and "0" not in served and "1" in served, served
        counts = (con.last_run.kernel_calls, sorted(con.last_run.crc32.values()))
        ex.serve_caller = False
        del loads[:]
        con.execute(PRODUCT)
        assert con.tensor("C").tobytes() == WANT.tobytes()
        assert _threads(loads) == {"0", "1"}
        assert counts == (con.last_run.kernel_calls, sorted(con.last_run.crc32.values()))


def test_no_serving_with_progress_a_budget_or_a_large_call(loads, monkeypatch):
    with _connect() as con:
        con.engine.progress_callback = lambda done, total: None
        con.execute(PRODUCT)
        assert "caller" not in _threads(loads)
        con.engine.progress_callback = None
        del loads[:]
        monkeypatch.setattr(pool, "SERVE_CALL_FLOPS", 1 << 20)  # a 128^3 call is 2^22
        con.execute(PRODUCT)
        assert "caller" not in _threads(loads)
        assert con.tensor("C").tobytes() == WANT.tobytes()
    monkeypatch.setattr(pool, "SERVE_CALL_FLOPS", 1 << 28)
    monkeypatch.setattr(pool_run, "may_cross", lambda *args, **kw: True)
    del loads[:]
    with _connect(memory_limit="1GB") as con:
        con.execute(PRODUCT)
        assert "caller" not in _threads(loads)
        assert con.tensor("C").tobytes() == WANT.tobytes()


def test_ctrl_c_in_a_task_the_caller_runs_stores_nothing(monkeypatch):
    real = runtime.run_load
    hit = []

    def interrupted(task, reader, xp=np):
        if threading.current_thread() is threading.main_thread() and not hit:
            hit.append(task.key)
            _thread.interrupt_main()  # Ctrl-C: to the calling thread, which runs this task
        return real(task, reader, xp)

    with _connect() as con:
        con.execute(PRODUCT)
        before = con.tensor("C").copy()
        con.load("A", A * 3, tile=(T, T), replace=True)
        monkeypatch.setattr(runtime, "run_load", interrupted)
        with pytest.raises(KeyboardInterrupt):
            con.execute(PRODUCT)
        assert hit  # it did land in a task on the caller
        np.testing.assert_array_equal(con.tensor("C"), before)
        monkeypatch.setattr(runtime, "run_load", real)
        for _ in range(2):  # the pool runs on: worker 0's thread and the caller alike
            con.execute(PRODUCT)
            assert con.tensor("C").tobytes() == _tile_products(A * 3, B).tobytes()


def test_a_failure_on_the_caller_fails_the_statement_and_the_pool_runs_on(monkeypatch):
    real = runtime.run_load

    def failing(task, reader, xp=np):
        if threading.current_thread() is threading.main_thread():
            raise OSError("the disk went away")
        return real(task, reader, xp)

    with _connect() as con:
        con.execute(PRODUCT)
        before = con.tensor("C").copy()
        monkeypatch.setattr(runtime, "run_load", failing)
        with pytest.raises(tensordb.OperationalError, match="the disk went away"):
            con.execute(PRODUCT)
        np.testing.assert_array_equal(con.tensor("C"), before)
        monkeypatch.setattr(runtime, "run_load", real)
        for _ in range(3):
            con.execute(PRODUCT)
            assert con.tensor("C").tobytes() == WANT.tobytes()
        ex = con.engine.executor()
        assert ex.queues.caller is None and not any(ex.queues.heaps)
