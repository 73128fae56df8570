"""A second read of the tail cut (exec/tail.py) and the BLAS limits' own calls (exec/pool.py):
the cut is off under a memory budget's admission and for integer products (their answers
numpy's); the BLAS limits set and put back the thread count through threadpoolctl's public
calls where its private names are missing, and put it back when the run raises."""
from __future__ import annotations

import _thread
import threading
import time
import types

import numpy as np
import pytest
import threadpoolctl

import tensordb
from tensordb.exec import pool, pool_run, tail

RNG = np.random.default_rng(38)
T = 256
N = 4 * T
PRODUCT = "C[i,k] = SUM(A[i,j] * B[j,k])"


@pytest.fixture(autouse=True)
def _tail_cut_on(monkeypatch):
    """The cut is off by default (pool.TAIL_CUT); these tests turn it on, and the pre-cut
    (pool.PRE_CUT, tests/exec/test_pre_cut.py) off: it would cut their last call first."""
    monkeypatch.setattr(pool, "TAIL_CUT", True)
    monkeypatch.setattr(pool, "PRE_CUT", False)


def _block_sparse(dtype) -> np.ndarray:
    a = np.zeros((N, N), dtype)
    for r, c in ((0, 0), (1, 2), (2, 3)):
        a[r * T:(r + 1) * T, c * T:(c + 1) * T] = RNG.integers(-3, 4, (T, T))
    return a


def _connect(a, b, **kw) -> tensordb.Connection:
    con = tensordb.connect(None, workers=2, **kw)
    ex = con.engine.executor()
    ex.fast_path = False
    ex.cores = max(ex.cores, 2)
    con.load("A", a, tile=(T, T))
    con.load("B", b, tile=(T, T))
    return con


def test_no_cut_under_a_memory_budget(monkeypatch):
    """A memory_limit the run cannot cross makes no budget (no admission): the cut stays on
    there. Where the run could cross it (``may_cross``: here forced, the plan being small) the
    tasks are admitted one by one and nothing is cut."""
    a = _block_sparse(np.float32)
    b = RNG.standard_normal((N, T)).astype(np.float32)
    with _connect(a, b, memory_limit="1GB") as con:
        ex = con.engine.executor()
        cuts = 0
        for _ in range(8):
            con.execute(PRODUCT)
            cuts += ex.last_tail_cuts
            np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-4, atol=1e-3)
        assert cuts >= 1  # no budget made: cut as without a limit
        monkeypatch.setattr(pool_run, "may_cross", lambda *args, **kw: True)
        for _ in range(5):
            con.execute(PRODUCT)
            assert ex.last_tail_cuts == 0
            np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_products_are_not_cut_and_are_numpys(dtype):
    a = _block_sparse(dtype)
    b = RNG.integers(-3, 4, (N, T)).astype(dtype)
    with _connect(a, b) as con:
        ex = con.engine.executor()
        for _ in range(3):
            con.execute(PRODUCT)
            assert ex.last_tail_cuts == 0
            assert np.array_equal(con.tensor("C"), a @ b)  # small integers: exact


def test_no_cut_where_the_blas_is_not_known_exact(monkeypatch):
    """Where numpy's BLAS is not OpenBLAS on x86-64 the cut could change the last bits (MKL
    picks kernels by the call's rows): nothing is cut, the answer is numpy's."""
    monkeypatch.setattr(tail, "EXACT_BLAS", False)
    a = _block_sparse(np.float32)
    b = RNG.standard_normal((N, T)).astype(np.float32)
    with _connect(a, b) as con:
        ex = con.engine.executor()
        for _ in range(5):
            con.execute(PRODUCT)
            assert ex.last_tail_cuts == 0
            np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("block", [0, 1])
def test_a_failed_block_names_the_operation_as_the_uncut_call_does(monkeypatch, block):
    """A block that fails (this worker's, 0, or the other's, 1) fails the statement with the
    uncut call's error: the same class and the operation named."""
    a = _block_sparse(np.float32)
    b = RNG.standard_normal((N, T)).astype(np.float32)
    real = tail.RowSplit.run

    def run(self, i):
        if i == block:
            raise MemoryError("no room for block")
        return real(self, i)

    with _connect(a, b) as con:
        con.execute(PRODUCT)
        before = con.tensor("C").copy()
        monkeypatch.setattr(tail.RowSplit, "run", run)
        cut = None
        for _ in range(20):
            try:
                con.execute(PRODUCT)
            except tensordb.Error as exc:
                cut = exc
                break
        assert cut is not None, "no run was cut"
        assert isinstance(cut, tensordb.OperationalError)
        assert "of C[i,k] = SUM(A[i,j] * B[j,k])" in str(cut).splitlines()[0], str(cut)
        assert np.array_equal(con.tensor("C"), before)  # the failed statement changed nothing


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def _openblas_libs():
    ctl = threadpoolctl.ThreadpoolController()
    return [lib for lib in ctl.lib_controllers if getattr(lib, "internal_api", "") == "openblas"]


def test_blas_limits_without_threadpoolctls_private_names(monkeypatch):
    """A threadpoolctl without ``_get_symbol`` or ``_SHARED_STATE`` (another version): no own
    calls are kept for its controller, and threadpoolctl's public calls set and put back the
    count. (Its own properties need those names in this version, so the controllers are kept
    as found with no own calls, as ``_openblas_calls`` keeps them where they are missing.)"""
    libs = _openblas_libs()
    if not libs:
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    for names in ({"internal_api": "openblas", "threading_layer": "pthreads"},
                  {"internal_api": "openblas", "threading_layer": "pthreads",
                   "_get_symbol": lambda name: None}):
        assert pool._openblas_calls(types.SimpleNamespace(**names)) is None
    monkeypatch.setattr(pool, "_controller", None)
    pool._blas_limits(1)  # finds the controllers
    kept = {id(lib): (lib, None) for lib in pool._controller[1]}
    monkeypatch.setattr(pool, "_OPENBLAS_CALLS", kept)
    before = _blas_threads()
    want = 1 if max(before) > 1 else 2
    with pool._limits(want):
        assert set(_blas_threads()) == {want}
        assert all(v[1] is None for v in pool._OPENBLAS_CALLS.values())  # the public calls
        assert pool._OPENBLAS_CALLS is kept
    assert _blas_threads() == before


def test_blas_limits_put_back_after_an_exception():
    pool._OPENBLAS_CALLS.clear()
    before = _blas_threads()
    if not before:
        pytest.skip("no BLAS found by threadpoolctl")
    want = 1 if max(before) > 1 else 2
    with pytest.raises(KeyboardInterrupt):
        with pool._limits(want):
            assert set(_blas_threads()) == {want}
            raise KeyboardInterrupt
    assert _blas_threads() == before


def test_two_connections_cutting_at_once_in_two_threads():
    """Two pools (two connections) on two threads at once, each run's last call cut where its
    other worker is idle: every answer numpy's, no run hangs."""
    a = _block_sparse(np.float32)
    b = RNG.standard_normal((N, T)).astype(np.float32)
    want = a @ b
    cons = [_connect(a, b), _connect(a, b)]
    cuts, bad, errors = [0, 0], [], []

    def work(k: int) -> None:
        try:
            con = cons[k]
            for _ in range(10):
                con.execute(PRODUCT)
                cuts[k] += con.engine.executor().last_tail_cuts
                if not np.allclose(con.tensor("C"), want, rtol=1e-4, atol=1e-3):
                    bad.append(k)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a run hung"
    finally:
        for con in cons:
            con.close()
    assert not errors and not bad
    assert sum(cuts) >= 1


def test_ctrl_c_during_a_cut_call_stops_soon_and_leaves_nothing_running(monkeypatch):
    """Ctrl-C (``interrupt_main``) while the blocks of a cut call run: the statement raises
    KeyboardInterrupt within a second of the blocks' end, no block runs after it returns, the
    stored tensor is the one before, and the next statement runs."""
    a = _block_sparse(np.float32)
    b = RNG.standard_normal((N, T)).astype(np.float32)
    real = tail.RowSplit.run
    running, started = [0], threading.Event()
    lock = threading.Lock()

    def slow(self, i):
        with lock:
            running[0] += 1
        started.set()
        try:
            time.sleep(0.3)
            return real(self, i)
        finally:
            with lock:
                running[0] -= 1

    with _connect(a, b) as con:
        con.execute(PRODUCT)
        before = con.tensor("C").copy()
        monkeypatch.setattr(tail.RowSplit, "run", slow)
        interrupted = False
        for _ in range(10):
            started.clear()

            def interrupt():
                if started.wait(5):
                    _thread.interrupt_main()

            timer = threading.Thread(target=interrupt)
            timer.start()
            t0 = time.perf_counter()
            try:
                con.execute(PRODUCT)
            except KeyboardInterrupt:
                interrupted = True
                assert time.perf_counter() - t0 < 1.5
                assert running[0] == 0  # no block left running behind the caller's back
            finally:
                timer.join()
            if interrupted:
                break
        assert interrupted, "no run was cut"
        assert np.array_equal(con.tensor("C"), before)
        monkeypatch.setattr(tail.RowSplit, "run", real)
        con.execute(PRODUCT)
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-4, atol=1e-3)
