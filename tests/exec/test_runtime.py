"""The shared runtime under the executors (exec/runtime.py): its byte accounting on hand-built
plans, error translation, and the array-module / tile-movement seam the GPU
executor plugs into (run here with NumPy under another name)."""
from __future__ import annotations

import threading
import types
from contextlib import contextmanager

import numpy as np
import pytest

import tensordb
from tensordb.exec import LocalExecutor
from tensordb.exec.gpu import DeviceTiles
from tensordb.exec.pool import HostTiles
from tensordb.exec.runtime import Cancelled, planned_bytes, translate
from tensordb.physical.placement import transfers
from tensordb.physical.plan import Aggregate, Kernel, Load, OutputTiles, TilePlan
from tensordb.bind import bind_graph as bind

RNG = np.random.default_rng(7)
A = RNG.standard_normal((4, 6))   # stored as two 4x3 tiles (j split in two)
B = RNG.standard_normal((6, 5))   # stored as two 3x5 tiles
C_TILE = 4 * 5 * 8                # one partial / the output tile, float64
A_TILE, B_TILE = 4 * 3 * 8, 3 * 5 * 8


@pytest.fixture
def matmul(con):
    """(con, the matmul's EinOp, its readers): the operation and the stored inputs a hand-built
    plan runs (the planner is not used: every task and worker below is chosen by the test)."""
    con.load("A", A, tile=(4, 3))
    con.load("B", B, tile=(3, 5))
    g = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C")
    _, plan = con.plan(bind(g, con.store), g.pieces)
    return con, plan.ops[0], dict(plan.readers)


def _hand_plan(op, readers, *, kernel_workers=(0, 0), load_workers=(0, 0)) -> TilePlan:
    """C = A @ B as two partial products (one per half of j) summed by one aggregation on
    worker 0: Loads 0-3, Kernels 4-5, Aggregate 6 (the stored output tile)."""
    w0, w1 = load_workers
    k0, k1 = kernel_workers
    tasks = [Load(0, "A", (0, 0), (4, 3), w0), Load(1, "B", (0, 0), (3, 5), w0),
             Load(2, "A", (0, 3), (4, 6), w1), Load(3, "B", (3, 0), (6, 5), w1),
             Kernel(4, 0, (0, 1), ((4, 3), (3, 5)), (4, 5), (0, 0, 0), worker=k0),
             Kernel(5, 0, (2, 3), ((4, 3), (3, 5)), (4, 5), (0, 1, 0), worker=k1),
             Aggregate(6, "sum", (4, 5), (4, 5), "float64", worker=0)]
    out = OutputTiles("C", (4, 5), "float64", None, {(0, 0): 6}, stored=True)
    return TilePlan((op,), tasks, {"C": out}, [], 2, {t.key: 0 for t in tasks}, readers)


def _run(plan, workers, tiles=None):
    ex = LocalExecutor(workers, tiles=tiles)
    try:
        return ex.run(plan)
    finally:
        ex.close()


def test_peak_bytes_of_a_hand_built_plan(matmul):
    _, op, readers = matmul
    result = _run(_hand_plan(op, readers), workers=1)
    np.testing.assert_allclose(result.tiles[6], A @ B, rtol=1e-12)
    # One worker runs its ready tasks in the plan's order, folds first (physical/order.py):
    # Loads 0 and 1 (views of stored tiles: no bytes of their own), kernel 4 (one tile alive),
    # the aggregation starts its accumulator while partial 4 is still held (two) and releases
    # it (one); Loads 2 and 3, kernel 5 (two), its fold (one): the output is the tile left.
    # (Queued first-in first-out, both partials and the accumulator were alive at once.)
    assert result.peak_bytes == 2 * C_TILE
    assert result.bytes_moved == 0 and result.ops[0].bytes_moved == 0
    assert result.kernel_calls == result.ops[0].kernel_calls == 2
    assert result.ops[0].peak_tile_bytes == C_TILE  # the largest tile: a partial or the output
    assert len(result.worker_busy) == 1


def test_bytes_moved_of_a_hand_built_plan(matmul):
    _, op, readers = matmul
    # Kernel 5 runs on worker 1 but reads the Loads of worker 0 (one A and one B tile), and the
    # aggregation on worker 0 reads kernel 5's partial back.
    plan = _hand_plan(op, readers, kernel_workers=(0, 1))
    result = _run(plan, workers=2)
    np.testing.assert_allclose(result.tiles[6], A @ B, rtol=1e-12)
    assert result.bytes_moved == A_TILE + B_TILE + C_TILE
    assert [m.bytes_moved for m in result.ops] == [A_TILE + B_TILE + C_TILE]
    assert result.bytes_moved == transfers(plan)[0]  # the placement's count of the same plan
    assert [planned_bytes(plan, plan.task(k)) for k in range(7)] == \
        [A_TILE, B_TILE, A_TILE, B_TILE, C_TILE, C_TILE, C_TILE]
    # Whatever the order of the two workers, at least the output and at most both partials,
    # the accumulator and nothing else are alive at once.
    assert C_TILE <= result.peak_bytes <= 3 * C_TILE


def test_loads_on_the_kernel_worker_move_only_the_partial(matmul):
    _, op, readers = matmul
    plan = _hand_plan(op, readers, kernel_workers=(0, 1), load_workers=(0, 1))
    result = _run(plan, workers=2)
    np.testing.assert_allclose(result.tiles[6], A @ B, rtol=1e-12)
    assert result.bytes_moved == C_TILE == transfers(plan)[0]


def test_a_kernel_failure_names_the_operation(con, snapshot):
    con.load("A", np.array([[1, -2], [3, 4]]))
    before = snapshot(con)
    g = tensordb.Graph().op("P", "ij", [("A", "ij"), ("A", "ij")], join="x0 ** x1")
    _, plan = con.plan(bind(g, con.store), g.pieces)
    with pytest.raises(tensordb.DataError) as info:
        con.run(g)
    assert f"of {plan.ops[0].describe()} failed on the data" in str(info.value)
    with pytest.raises(ValueError) as numpy_says:  # numpy's own reason follows
        np.array([[1, -2], [3, 4]]) ** np.array([[1, -2], [3, 4]])
    assert str(info.value).endswith(str(numpy_says.value))
    assert snapshot(con) == before


def test_translation_of_each_kind_of_failure(matmul):
    _, op, _ = matmul
    name = op.describe()
    oom = translate(MemoryError("no room"), op)
    assert isinstance(oom, tensordb.OutOfMemoryError) and name in str(oom) and "no room" in str(oom)
    data = translate(ZeroDivisionError("division by zero"), op)
    assert isinstance(data, tensordb.DataError) and name in str(data)
    gone = translate(FileNotFoundError(2, "No such file", "/db/tiles/A.bin"), op)
    assert isinstance(gone, tensordb.OperationalError)
    assert name in str(gone) and "A.bin" in str(gone)
    bug = KeyError("k")
    internal = translate(bug, op)
    assert isinstance(internal, tensordb.InternalError) and internal.__cause__ is bug
    assert "KeyError" in str(internal) and name in str(internal)
    for unchanged in (tensordb.CatalogError("x"), Cancelled(), KeyboardInterrupt()):
        assert translate(unchanged, op) is unchanged


# -- the seam: an array module and tile movement -------------------------------------------------

class _ArrayModule(types.ModuleType):
    """NumPy under another name, with the part of CuPy's ``cuda`` namespace that DeviceTiles
    uses: the current device per thread, streams, synchronisation, and copies back to host."""

    def __init__(self) -> None:
        super().__init__("xp")
        self.current = threading.local()
        self.entered: dict[str, set[int]] = {}   # worker thread name -> devices it entered
        self.synchronized = 0
        self.lock = threading.Lock()
        self.cuda = types.SimpleNamespace(Device=self._device, Stream=self._stream,
                                          get_current_stream=lambda: self)

    def __getattr__(self, name):
        return getattr(np, name)

    @contextmanager
    def _device(self, d: int):
        with self.lock:
            self.entered.setdefault(threading.current_thread().name, set()).add(d)
        self.current.device = d
        yield

    @contextmanager
    def _stream(self, non_blocking: bool = False):
        assert non_blocking  # each worker queues on its own non-blocking stream
        yield

    def synchronize(self) -> None:
        with self.lock:
            self.synchronized += 1

    def asnumpy(self, a):
        return np.asarray(a)


def test_host_tiles_under_another_array_module(matmul):
    _, op, readers = matmul
    xp = _ArrayModule()
    plan = _hand_plan(op, readers, kernel_workers=(0, 1))
    result = _run(plan, 2, HostTiles(xp))
    np.testing.assert_allclose(result.tiles[6], A @ B, rtol=1e-12)
    assert result.bytes_moved == A_TILE + B_TILE + C_TILE


def test_device_tiles_run_each_worker_on_its_device(matmul):
    _, op, readers = matmul
    xp = _ArrayModule()
    plan = _hand_plan(op, readers, kernel_workers=(0, 1))
    ex = LocalExecutor(2, tiles=DeviceTiles([3, 5], xp=xp))
    try:
        assert ex.name == "gpu" and ex.devices == [3, 5] and ex.workers == 2
        result = ex.run(plan, destinations={6: np.zeros((4, 5))})
    finally:
        ex.close()
    assert isinstance(result.tiles[6], np.ndarray)  # back on the host
    np.testing.assert_allclose(result.tiles[6], A @ B, rtol=1e-12)
    # Worker w entered device devices[w] and no other; host destinations are not written.
    assert xp.entered == {"tensordb-gpu-worker-0": {3}, "tensordb-gpu-worker-1": {5}}
    # Every published tile waited for its stream, and so did each of the 3 cross-device copies.
    assert xp.synchronized == len(plan.tasks) + 3
    assert result.bytes_moved == A_TILE + B_TILE + C_TILE
    assert not result.nnz  # no destination buffer was used
