"""The pre-cut (exec/pool_run.py ``_Run._pre_cut``, ``_Shape.precut_for``): where a plan's
calls leave one worker a call more than another (three equal tile products on two workers: two
and one), the heavier worker's last call is cut by rows in two before the run starts, its second
block queued last on the lighter worker. Oracles: numpy's matmul of each present tile (one
product a row tile, so the bytes are exact), the same run with the pre-cut off (bytes, EXPLAIN
ANALYZE's counts, the tiles' statistics), CHECK DATABASE (each stored tile's checksum and count
against its bytes). Also: a block the lighter worker never takes is taken back; a failed block
fails the statement, stores nothing, and the pool runs on; plans that divide evenly, one worker,
a memory budget's admission and integer products are not cut."""
from __future__ import annotations

import heapq

import numpy as np
import pytest

import tensordb
from tests.harness import tile_products
from tensordb.exec import pool, pool_run, tail
from tensordb.exec.ready import ReadyQueues

RNG = np.random.default_rng(39)
T = 256
N = 4 * T
PRODUCT = "C[i,k] = SUM(A[i,j] * B[j,k])"

@pytest.fixture(autouse=True)
def _pre_cut_on(monkeypatch):
    """On by default (pool.PRE_CUT); set here so these tests hold if the default changes."""
    monkeypatch.setattr(pool, "PRE_CUT", True)


pytestmark = pytest.mark.skipif(not tail.EXACT_BLAS, reason="numpy's BLAS is not OpenBLAS "
                                "on x86-64: nothing is cut")


def _block_sparse(tiles=((0, 1), (2, 3), (3, 0)), dtype=np.float32) -> np.ndarray:
    """N x N with T x T tiles present at ``tiles`` (tile row, tile column)."""
    a = np.zeros((N, N), dtype)
    for i, j in tiles:
        a[i * T:(i + 1) * T, j * T:(j + 1) * T] = RNG.integers(-3, 4, (T, T)) if \
            np.dtype(dtype).kind == "i" else RNG.standard_normal((T, T))
    return a


A = _block_sparse()
B = RNG.standard_normal((N, T)).astype(np.float32)


def _tile_products(a, b):
    return tile_products(a, b, T)


def _connect(a=A, b=B, path=None, workers=2, **kw) -> tensordb.Connection:
    con = tensordb.connect(path, workers=workers, **kw)
    ex = con.engine.executor()
    ex.fast_path = False  # the pool's dataflow, on its workers
    con.load("A", a, tile=(T, T))
    con.load("B", b, tile=(T, T))
    return con


def _runs(con, want, n=6):
    """Calls pre-cut over ``n`` runs of the product, each result's bytes checked."""
    ex, cuts = con.engine.executor(), 0
    for _ in range(n):
        con.execute(PRODUCT)
        cuts += ex.last_pre_cuts
        assert con.tensor("C").tobytes() == want.tobytes()
    return cuts


def _counts(r):
    return (r.kernel_calls, r.bytes_moved, sorted(r.nnz.values()), sorted(r.crc32.values()),
            sorted(r.nonfinite.values()), [(m.kernel_calls, m.bytes_moved) for m in r.ops])


def test_a_new_executor_reads_the_default(monkeypatch):
    for default in (False, True):
        monkeypatch.setattr(pool, "PRE_CUT", default)
        with _connect() as con:
            assert con.engine.executor().pre_cut is default
            assert _runs(con, _tile_products(A, B), 2) == (2 if default else 0)


@pytest.mark.parametrize("on_disk", [False, True])
def test_the_odd_call_is_cut_before_the_run_and_its_answer_kept(tmp_path, on_disk):
    want = _tile_products(A, B)
    with _connect(path=str(tmp_path / "t.tdb") if on_disk else None) as con:
        ex = con.engine.executor()
        con.execute(PRODUCT)
        assert con.last_run.kernel_calls == 3
        assert _runs(con, want) == 6  # every run: the plan decides, not a race
        on = _counts(con.last_run)
        assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"
        assert "measured:" in con.explain(PRODUCT, analyze=True)
        ex.pre_cut = False
        assert _runs(con, want, 2) == 0
        assert _counts(con.last_run) == on  # EXPLAIN ANALYZE's counts, nnz, crc32: the same
        np.testing.assert_allclose(con.tensor("C"), A @ B, rtol=1e-4, atol=1e-3)


def test_a_cached_plan_is_cut_again_after_new_values():
    with _connect() as con:
        assert _runs(con, _tile_products(A, B), 3) == 3
        a2 = _block_sparse()
        con.load("A", a2, tile=(T, T), replace=True)  # new values, the same layout
        assert _runs(con, _tile_products(a2, B), 3) == 3


def test_an_aggregated_call_is_cut_and_the_sum_is_numpys():
    """Two tiles of one row tile: the cut call may be a partial of an aggregation (folded in
    the plan's order as uncut)."""
    a = _block_sparse(((0, 0), (0, 2), (1, 1), (3, 3), (2, 0)))
    with _connect(a) as con:
        ex = con.engine.executor()
        ex.pre_cut = False
        con.execute(PRODUCT)
        uncut = con.tensor("C").tobytes()
        ex.pre_cut = True
        cuts = 0
        for _ in range(4):
            con.execute(PRODUCT)
            cuts += ex.last_pre_cuts
            assert con.tensor("C").tobytes() == uncut
        assert cuts == 4
        np.testing.assert_allclose(con.tensor("C"), a @ B, rtol=1e-4, atol=1e-3)


def test_a_block_not_taken_is_taken_back(monkeypatch):
    """The lighter worker never sees its block (kept out of its heap's reach: put without a
    wake-up, and the worker asleep behind its own empty queue is never told): the heavier
    worker takes it back and runs it, the answer the same."""
    real_put, real_take = ReadyQueues.put_many, ReadyQueues.take_back
    taken_back = []

    def put_many(self, items):
        items = list(items)
        parts = [x for x in items if x[2][1] == "part"]
        real_put(self, [x for x in items if x[2][1] != "part"])
        with self.lock:  # into the heap, but only after the worker's other items: see get()
            for w, priority, item in parts:
                hidden.append((self, w, item))

    def take_back(self, w, item):
        for n, (q, v, it) in enumerate(hidden):
            if it is item:
                del hidden[n]
                taken_back.append(True)
                return True
        return real_take(self, w, item)

    hidden: list = []
    monkeypatch.setattr(ReadyQueues, "put_many", put_many)
    monkeypatch.setattr(ReadyQueues, "take_back", take_back)
    want = _tile_products(A, B)
    with _connect() as con:
        assert _runs(con, want, 4) == 4
    assert taken_back == [True] * 4 and not hidden


@pytest.mark.parametrize("block", [0, 1])
def test_a_failed_block_fails_the_statement_and_the_pool_runs_on(monkeypatch, block):
    real = tail.RowSplit.run

    def run(self, i):
        if i == block:
            raise MemoryError(f"no room for block {i}")
        return real(self, i)

    with _connect() as con:
        con.execute(PRODUCT)
        before = con.tensor("C").copy()
        a2 = _block_sparse()
        con.load("A", a2, tile=(T, T), replace=True)
        monkeypatch.setattr(tail.RowSplit, "run", run)
        with pytest.raises(tensordb.OperationalError) as info:
            con.execute(PRODUCT)
        assert "of C[i,k] = SUM(A[i,j] * B[j,k])" in str(info.value).splitlines()[0]
        assert con.tensor("C").tobytes() == before.tobytes()  # nothing stored
        monkeypatch.setattr(tail.RowSplit, "run", real)
        assert _runs(con, _tile_products(a2, B), 2) == 2  # the pool runs the next statements


def test_plans_that_divide_evenly_and_one_worker_are_not_cut():
    even = _block_sparse(((0, 1), (1, 3), (2, 2), (3, 0)))  # four products on two workers
    with _connect(even) as con:
        assert _runs(con, _tile_products(even, B), 3) == 0
    with _connect(workers=1) as con:
        assert _runs(con, _tile_products(A, B), 2) == 0


def test_no_cut_under_a_memory_budgets_admission(monkeypatch):
    monkeypatch.setattr(pool_run, "may_cross", lambda *args, **kw: True)
    with _connect(memory_limit="1GB") as con:
        assert _runs(con, _tile_products(A, B), 2) == 0


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_other_dtypes(dtype):
    """Integer products are numpy's own loop, not BLAS: not cut (``row_split``), and exact;
    float64 products are cut, their bits the uncut call's."""
    a = _block_sparse(dtype=dtype)
    b = (RNG.integers(-3, 4, (N, T)) if np.dtype(dtype).kind == "i"
         else RNG.standard_normal((N, T))).astype(dtype)
    with _connect(a, b) as con:
        cuts = _runs(con, _tile_products(a, b), 3)
        assert cuts == (0 if np.dtype(dtype).kind == "i" else 3)
        if np.dtype(dtype).kind == "i":
            assert np.array_equal(con.tensor("C"), a @ b)


def test_the_shape_finds_the_heaviest_workers_last_call():
    """``precut_for`` on the three-product plan: the call is the last (by the plan's rank)
    of the worker with two, the block goes to the worker with one."""
    with _connect() as con:
        con.execute(PRODUCT)
        plan = con.engine.last_plan
        shape = pool_run._Shape.of(plan)
        key, heavy, light = shape.precut_for(2)
        kernels = [t for t in plan.tasks if type(t).__name__ == "Kernel"]
        mine = [t for t in kernels if t.worker == heavy]
        assert len(mine) == 2 and len(kernels) - len(mine) == 1 and light != heavy
        rank = plan.rank or {}
        assert key == max(mine, key=lambda t: rank.get(t.key, 0)).key
        assert shape.precut_for(2) is shape.precut_for(2)  # once a plan and worker count
