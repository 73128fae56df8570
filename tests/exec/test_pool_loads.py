"""The pool's Loads run by their consumer (exec/pool_run.py ``_Shape.lazy``), the first ready
tasks queued at once (exec/ready.py ``put_many``) and a Load of one whole stored tile read as
that tile's view (exec/tasks.py ``_whole_tile``): a block-sparse product on two workers, on
disk and in memory, against numpy; the same run with every Load a task of its own (the
measured counts equal); a Load read on two workers, a memory budget, a damaged tile, Ctrl-C
inside a Load, and the plan cache over new values and a new layout."""
from __future__ import annotations

import _thread
import threading

import numpy as np
import pytest

import tensordb
from tensordb.driver import Snapshot
from tensordb.exec import pool_run, tasks
from tensordb.exec.ready import ReadyQueues
from tensordb.physical.plan import Load
from tensordb.storage import verify

T = 128  # tile edge
N = 8 * T


def _block_sparse(seed: int, present: float = 0.3) -> np.ndarray:
    """An N x N float64 matrix of T x T tiles, about ``present`` of them nonzero (the others
    zeros: absent once stored), two tiles in one tile column (read by two kernels)."""
    rng = np.random.default_rng(seed)
    mask = rng.random((N // T, N // T)) < present
    mask[0, 3] = mask[5, 3] = True
    a = np.zeros((N, N))
    for i, j in zip(*np.nonzero(mask)):
        a[i * T:(i + 1) * T, j * T:(j + 1) * T] = rng.standard_normal((T, T))
    return a


A = _block_sparse(1)
B = np.random.default_rng(2).standard_normal((N, T))
PRODUCT = "C[i,k] = SUM(A[i,j] * B[j,k])"


def _tile_loop(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The oracle: numpy's products of the present tiles, summed per row tile."""
    c = np.zeros((a.shape[0], b.shape[1]))
    for i in range(0, a.shape[0], T):
        for j in range(0, a.shape[1], T):
            if a[i:i + T, j:j + T].any():
                c[i:i + T] += a[i:i + T, j:j + T] @ b[j:j + T]
    return c


def _connect(path=None, **kw) -> tensordb.Connection:
    con = tensordb.connect(path, workers=2, **kw)
    con.engine.executor().fast_path = False  # the pool's dataflow, on its workers
    con.load("A", A, tile=(T, T))
    con.load("B", B, tile=(T, T))
    return con


@pytest.fixture
def runs(monkeypatch):
    """Every ``_Run`` made, and the keys of the tasks it queued."""
    made, queued = [], []
    real_init, real_queue, real_first = pool_run._Run.__init__, pool_run._Run._queue, \
        pool_run._Run._queue_first

    def init(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)

    def queue(self, worker, item):
        queued.append(item[1].key)
        return real_queue(self, worker, item)

    def first(self):
        lazy, waiting = self.lazy, self.waiting
        queued.extend(t.key for t in self.plan.tasks
                      if waiting.get(t.key) == 0 and t.key not in lazy)
        return real_first(self)

    monkeypatch.setattr(pool_run._Run, "__init__", init)
    monkeypatch.setattr(pool_run._Run, "_queue", queue)
    monkeypatch.setattr(pool_run._Run, "_queue_first", first)
    return made, queued


def _every_load_queued(monkeypatch):
    """Runs after this one queue every Load as a task of its own (the pool before the change)."""
    real_init = pool_run._Run.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        self.lazy = frozenset()
        self.waiting = dict(self.shape.waiting)

    monkeypatch.setattr(pool_run._Run, "__init__", init)


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_block_sparse_product_runs_its_loads_in_their_kernels(tmp_path, runs, on_disk):
    made, queued = runs
    with _connect(str(tmp_path / "w.tdb") if on_disk else None) as con:
        con.execute(PRODUCT)
        np.testing.assert_allclose(con.tensor("C"), _tile_loop(A, B), rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(con.tensor("C"), A @ B, rtol=1e-12, atol=1e-11)
    run = made[-1]
    assert run._inline is None, "the plan ran on the calling thread, not on the workers"
    plan = run.plan
    on = {t.key: t.worker for t in plan.tasks}
    loads = [t for t in plan.tasks if isinstance(t, Load)]
    consumers = plan.consumers()
    # lazy exactly where every consumer runs on the Load's own worker
    for t in loads:
        assert (t.key in run.lazy) == all(on[c] == t.worker for c in consumers[t.key]), t
    assert run.lazy
    assert not run.lazy & set(queued), "a lazy Load was queued"
    assert set(queued) >= {t.key for t in loads if t.key not in run.lazy}


def test_the_measured_counts_are_those_of_every_load_queued(monkeypatch, runs):
    made, _ = runs
    measured = []
    for lazy in (True, False):
        if not lazy:
            _every_load_queued(monkeypatch)
        with _connect() as con:
            con.execute(PRODUCT)
            r = con.last_run
            # (the peak of tiles alive depends on how the two workers' tasks interleave)
            measured.append((con.tensor("C").tobytes(), r.kernel_calls, r.bytes_moved,
                             sorted(r.nnz.values()), sorted(r.crc32.values()),
                             [(m.kernel_calls, m.bytes_moved, m.peak_tile_bytes)
                              for m in r.ops]))
            text = con.explain(PRODUCT, analyze=True)
            assert "measured:" in text
        assert bool(made[-1].lazy) is lazy
    assert measured[0] == measured[1]
    assert measured[0][1] == sum(bool(A[i:i + T, j:j + T].any())
                                 for i in range(0, N, T) for j in range(0, N, T))


def test_under_a_memory_budget_every_load_is_a_task(runs):
    made, queued = runs
    with _connect(memory_limit="2MB") as con:
        con.execute(PRODUCT)
        np.testing.assert_allclose(con.tensor("C"), _tile_loop(A, B), rtol=1e-13, atol=1e-12)
    run = made[-1]
    assert run.budget is not None and not run.lazy
    assert {t.key for t in run.plan.tasks if isinstance(t, Load)} <= set(queued)


def test_a_damaged_tile_read_by_its_kernel_is_a_data_error_and_changes_nothing(tmp_path, runs):
    made, _ = runs
    root = str(tmp_path / "w.tdb")
    with _connect(root) as con:
        con.execute(PRODUCT)
        before = con.tensor("C")
        entries = Snapshot(con.store).readers(["A"])["A"].entries
        e = entries[(5, 3)]  # a present tile of A, read by a lazy Load
        path = Snapshot(con.store).readers(["A"])["A"].path
    with open(path, "r+b") as f:
        f.seek(e.offset + 100)
        data = f.read(8)
        f.seek(e.offset + 100)
        f.write(bytes(b ^ 0xFF for b in data))
    verify.forget_verified()
    with tensordb.connect(root, workers=2) as con:
        con.engine.executor().fast_path = False
        with pytest.raises(tensordb.DataError, match=r"tile \(5, 3\)"):
            con.execute(PRODUCT)
        assert made[-1].lazy
        np.testing.assert_array_equal(con.tensor("C"), before)
        con.execute("E[j,k] = B[j,k] * 2")  # the workers live on
        np.testing.assert_array_equal(con.tensor("E"), B * 2)


def test_ctrl_c_inside_a_load_ends_the_run_and_stores_nothing(monkeypatch, runs):
    made, _ = runs
    real = tasks.run_load
    calls = []

    def interrupted(task, reader, xp=np):
        calls.append(threading.current_thread().name)
        if len(calls) == 5:
            _thread.interrupt_main()  # as Ctrl-C does: to the calling thread
        return real(task, reader, xp)

    with _connect() as con:
        # the Loads on the workers' threads (the caller's own: tests/exec/test_serve_caller.py)
        con.engine.executor().serve_caller = False
        con.execute(PRODUCT)
        first = con.tensor("C")
        con.load("A", A * 3, tile=(T, T), replace=True)  # the same layout: the cached plan runs again
        import tensordb.exec.runtime as runtime
        monkeypatch.setattr(runtime, "run_load", interrupted)
        with pytest.raises(KeyboardInterrupt):  # seen by the run's wait, before any commit
            con.execute(PRODUCT)
        assert made[-1].lazy and any("worker" in name for name in calls)
        np.testing.assert_array_equal(con.tensor("C"), first)
        monkeypatch.setattr(runtime, "run_load", real)
        con.execute(PRODUCT)
        np.testing.assert_allclose(con.tensor("C"), _tile_loop(A * 3, B), rtol=1e-13,
                                   atol=1e-12)


def test_the_cached_plan_reads_new_values_and_a_new_layout_plans_again(runs):
    made, _ = runs
    with _connect() as con:
        con.execute(PRODUCT)
        shape = made[-1].shape
        hits = con.plan_cache_stats["hits"]
        a2 = A * -2.5
        con.load("A", a2, tile=(T, T), replace=True)  # new values, the same tiles present
        con.execute(PRODUCT)
        assert con.plan_cache_stats["hits"] == hits + 1
        assert made[-1].shape is shape  # kept with the plan
        np.testing.assert_allclose(con.tensor("C"), _tile_loop(a2, B), rtol=1e-13, atol=1e-12)
        a3 = a2.copy()
        a3[7 * T:, :T] = 1.0  # a tile present that was not: another plan
        assert not A[7 * T:, :T].any()
        con.load("A", a3, tile=(T, T), replace=True)
        con.execute(PRODUCT)
        assert made[-1].shape is not shape
        np.testing.assert_allclose(con.tensor("C"), _tile_loop(a3, B), rtol=1e-13, atol=1e-12)


def test_whole_tile_is_the_stored_tiles_view_and_nothing_else():
    a = A.copy()
    a[T:2 * T, 2 * T:3 * T] = 0.0
    a[T + 3, 2 * T + 5] = 4.0  # a tile of one entry
    with tensordb.connect() as con:
        con.load("A", a, tile=(T, T))
        reader = Snapshot(con.store).readers(["A"])["A"]
        assert reader.entries[(1, 2)].sparse  # its one entry: stored as a sparse tile
        for i, j in [(0, 3), (5, 3)]:
            box = (i * T, j * T), ((i + 1) * T, (j + 1) * T)
            view = tasks._whole_tile(reader, *box)
            assert view is not None and not view.flags.writeable
            np.testing.assert_array_equal(view, a[i * T:(i + 1) * T, j * T:(j + 1) * T])
            np.testing.assert_array_equal(view, reader.read_box(*box))
        absent = next((i, j) for i in range(8) for j in range(8)
                      if not a[i * T:(i + 1) * T, j * T:(j + 1) * T].any())
        for starts, stops in [((T, 2 * T), (2 * T, 3 * T)),   # a sparse tile
                              ((0, 3 * T), (T // 2, 4 * T)),   # part of a tile
                              ((0, 3 * T), (T, 5 * T)),        # two tiles
                              ((absent[0] * T, absent[1] * T),
                               ((absent[0] + 1) * T, (absent[1] + 1) * T))]:
            assert tasks._whole_tile(reader, starts, stops) is None
            load = Load(key=0, tensor="A", starts=starts, stops=stops, worker=0)
            got = tasks.run_load(load, reader)
            np.testing.assert_array_equal(got.toarray() if hasattr(got, "toarray") else got,
                                          a[starts[0]:stops[0], starts[1]:stops[1]])


def test_whole_tile_leaves_a_sparse_tile_to_read_box():
    import scipy.sparse as sp
    m = sp.random(4 * T, 4 * T, density=0.001, format="csr", random_state=3)
    with tensordb.connect() as con:
        con.load("G", m)
        reader = Snapshot(con.store).readers(["G"])["G"]
        assert reader.has_sparse
        (c, e), = list(reader.entries.items())[:1]
        lo = e.starts
        hi = tuple(s + n for s, n in zip(e.starts, e.shape))
        assert tasks._whole_tile(reader, lo, hi) is None


def test_put_many_queues_in_priority_order_and_wakes_the_sleeping_workers():
    q = ReadyQueues(2)
    got = []

    def worker(w):
        for _ in range(3):
            got.append((w, q.get(w)))

    class Run:
        @staticmethod
        def admit(item):
            return True

    run = Run()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    for th in threads:
        th.start()
    for _ in range(1000):  # both asleep on their tokens
        with q.lock:
            if q.sleeping == {0, 1}:
                break
        threading.Event().wait(0.001)
    q.put_many([(1, (1, 5), (run, "b5")), (0, (1, 2), (run, "a2")), (1, (0, 9), (run, "b9")),
                (0, (1, 1), (run, "a1")), (1, (1, 1), (run, "b1")), (0, (1, 3), (run, "a3"))])
    for th in threads:
        th.join(10)
    assert not any(th.is_alive() for th in threads)
    assert [item[1] for w, item in got if w == 0] == ["a1", "a2", "a3"]
    assert [item[1] for w, item in got if w == 1] == ["b9", "b1", "b5"]


@pytest.mark.parametrize("seed", [2, 7, 11])
def test_the_fuzz_corpus_on_the_workers_matches_numpy(seed, tmp_path, monkeypatch):
    """The fuzz test's statements (every dtype, join, aggregate, empty and block-sparse tensor;
    1-3 workers) with every plan on the pool's workers, none on the fast path or the calling
    thread, so that their Loads run in their consumers (40 seeds checked so by hand: 997 of
    1088 runs had such Loads, none failed)."""
    from tensordb.exec import pool
    from tests.corpus.test_fuzz import run_batch
    real_init = pool.LocalExecutor.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        self.fast_path = False

    monkeypatch.setattr(pool.LocalExecutor, "__init__", init)
    monkeypatch.setattr(pool, "_tiny", lambda plan, fast=False: False)
    made = []
    real_run = pool_run._Run.__init__

    def run_init(self, *a, **k):
        real_run(self, *a, **k)
        made.append(bool(self.lazy))

    monkeypatch.setattr(pool_run._Run, "__init__", run_init)
    failures = run_batch(seed, directory=tmp_path)
    assert not failures, "\n".join(failures[:3])
    from conftest import corpus_executor
    # a GPU's Loads copy their boxes to the device: each stays a task of its own
    assert any(made) if corpus_executor() == "local" else not any(made)
