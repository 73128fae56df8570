"""The GPU executor's device cache (exec/devcache.py), run without a GPU: NumPy under another
name stands in for CuPy (tests/fakecupy: device arrays of their own type, tagged with the
device they were made on, and every copy recorded, host -> device, device -> host and between
devices). The answers are checked against NumPy; the copies against the stand-in's own record."""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

import tensordb
from tensordb.exec.gpu import DeviceTiles
from tensordb.exec.pool import LocalExecutor
from tensordb.physical.plan import Aggregate, Kernel, Load, OutputTiles, TilePlan
from tests.fakecupy.cupy import DeviceXp


def _gpu(con, xp, devices=(0,), memory_limit=None, cache=True):
    """Give ``con`` a GPU executor on the stand-in (what executor='gpu' makes, with CuPy)."""
    con._executor = LocalExecutor(len(devices), memory_limit=memory_limit,
                                  tiles=DeviceTiles(list(devices), xp=xp, cache=cache))
    return con._executor.tiles


@contextlib.contextmanager
def _on_standin(**gpu):
    """A connection holding A and B, its executor a GPU one on a fresh stand-in (``_gpu``'s
    options): yields the connection, the stand-in and the executor's device tiles."""
    xp = DeviceXp()
    with tensordb.connect() as con:
        _loaded(con)
        yield con, xp, _gpu(con, xp, **gpu)


def _keys(tiles) -> list[tuple]:
    return sorted((key[0], key[1], key[2], key[3], d) for key, d in tiles.cache.entries)


RNG = np.random.default_rng(11)
A = RNG.standard_normal((64, 48))
B = RNG.standard_normal((48, 32))


def _loaded(con):
    con.load("A", A, tile=(32, 24))
    con.load("B", B, tile=(24, 32))


def test_a_repeated_query_copies_nothing_host_to_device():
    with _on_standin() as (con, xp, tiles):
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        first = list(xp.h2d)
        np.testing.assert_allclose(con.tensor("C"), A @ B, rtol=1e-12)
        # the first run copies A and B onto the device, once each, and C back once
        assert sum(first) == A.nbytes + B.nbytes
        assert con.last_run.copies["host_to_device"] == A.nbytes + B.nbytes
        assert xp.d2h == [(A @ B).nbytes] == [con.last_run.copies["device_to_host"]]
        loads = con.last_run.copies["misses"]
        for _ in range(2):
            xp.clear()
            con.execute("C[i,k] = A[i,j] * B[j,k]")
            np.testing.assert_allclose(con.tensor("C"), A @ B, rtol=1e-12)
            assert xp.h2d == []  # every input tile was on the device already
            copies = con.last_run.copies
            assert copies.get("host_to_device", 0) == 0 and copies["hits"] == loads
            assert xp.d2h == [(A @ B).nbytes]  # the result still goes to its payload file
        assert ("a", con.store.meta("A").version) in {k[:2] for k in _keys(tiles)}


def test_without_the_cache_every_query_copies_its_inputs():
    with _on_standin(cache=False) as (con, xp, tiles):
        for _ in range(2):
            xp.clear()
            con.execute("C[i,k] = A[i,j] * B[j,k]")
            np.testing.assert_allclose(con.tensor("C"), A @ B, rtol=1e-12)
            assert sum(xp.h2d) == A.nbytes + B.nbytes
        assert tiles.cache is None and con.last_run.copies.get("hits", 0) == 0


def test_a_stored_result_is_read_from_the_device_by_the_next_query():
    """A result's tiles stay on the device as its committed version: the next statement,
    reading it, copies nothing host -> device (a training step's weights, read by the next)."""
    with _on_standin() as (con, xp, _):
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        xp.clear()
        con.execute("D[i,k] = RELU(C[i,k])")
        assert xp.h2d == []
        xp.clear()
        con.execute("E[i,k] = RELU(D[i,k]) + C[i,k]")
        assert xp.h2d == []
        c = A @ B
        np.testing.assert_allclose(con.tensor("E"), np.maximum(c, 0) + c, rtol=1e-12)
        # a result replaced by itself (W = W - x): its new version is the cached one
        for step in range(3):
            xp.clear()
            con.execute("C[i,k] = C[i,k] - RELU(D[i,k])")
            assert xp.h2d == []
            c = c - np.maximum(A @ B, 0)
            np.testing.assert_allclose(con.tensor("C"), c, rtol=1e-12)


def test_a_replaced_tensor_leaves_the_cache_at_its_commit():
    with _on_standin() as (con, xp, tiles):
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        old = con.store.meta("A").version
        assert ("a", old) in {k[:2] for k in _keys(tiles)}
        a2 = RNG.standard_normal(A.shape)
        con.load("A", a2, tile=(32, 24), replace=True)
        # gone at the commit, before any query runs
        assert "a" not in {k[0] for k in _keys(tiles)}
        xp.clear()
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        np.testing.assert_allclose(con.tensor("C"), a2 @ B, rtol=1e-12)
        assert sum(xp.h2d) == A.nbytes  # the new A copied; B was on the device
        # replaced by a statement of the dialect too
        con.execute("A[i,j] = A[i,j] * A[i,j]")
        np.testing.assert_allclose(con.tensor("A"), a2 * a2, rtol=1e-12)
        versions = {k[1] for k in _keys(tiles) if k[0] == "a"}
        assert versions == {con.store.meta("A").version}
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        np.testing.assert_allclose(con.tensor("C"), (a2 * a2) @ B, rtol=1e-10)


def test_a_dropped_tensor_leaves_the_cache():
    with _on_standin() as (con, xp, tiles):
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        assert {"a", "b", "c"} <= {k[0] for k in _keys(tiles)}
        con.execute("DROP TENSOR B")
        assert "b" not in {k[0] for k in _keys(tiles)}
        con.drop("C")
        assert {k[0] for k in _keys(tiles)} == {"a"}
        # a new B of the same name is read afresh
        b2 = RNG.standard_normal(B.shape)
        con.load("B", b2, tile=(24, 32))
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        np.testing.assert_allclose(con.tensor("C"), A @ b2, rtol=1e-12)


def test_a_result_that_was_not_committed_never_becomes_a_cached_tile():
    """A unit that fails after one of its statements ran: that result's tiles were held for
    its version, which never landed; a later tensor of the same name and shape, stored some
    other way, is read from its own file."""
    with _on_standin() as (con, xp, tiles):
        con.load("I", np.array([2, 3], np.int64))
        con.load("J", np.array([1, -1], np.int64))
        con.execute("C[i,k] = A[i,j] * B[j,k]")
        with pytest.raises(tensordb.DataError, match="negative integer powers"):
            con.execute("D[i,k] = RELU(C[i,k]); SELECT 1; "
                        "K[i] = POW(I[i], J[i])")  # fails in the second run
        assert not con.store.has("D")
        held = [k for k in tiles.cache.entries if k[0][0] == "d"]
        assert held and all(k[0][1] is None for k in held)  # held, never committed
        other = RNG.standard_normal((64, 32))  # same name, shape and dtype as the lost D
        con.load("D", other, tile=(64, 32))
        assert "d" not in {k[0] for k in _keys(tiles)}  # that commit dropped the held tiles
        con.execute("E[i,k] = RELU(D[i,k])")
        np.testing.assert_allclose(con.tensor("E"), np.maximum(other, 0), rtol=1e-12)


def test_least_recently_used_tiles_leave_first_within_the_budget():
    """Under a memory_limit the cache and the run's tiles fit it together: tiles of tensors
    read long ago leave before those of the last query, and answers stay equal."""
    xp = DeviceXp()
    rng = np.random.default_rng(3)
    mats = {n: rng.standard_normal((64, 64)) for n in "PQRS"}  # 32 KiB each
    limit = 5 * 32 << 10  # room for five of the six tiles of two products
    with tensordb.connect() as con:
        for n, m in mats.items():
            con.load(n, m, tile=(64, 64))
        tiles = _gpu(con, xp, memory_limit=limit)
        con.execute("X1[i,k] = P[i,j] * Q[j,k]")
        con.execute("X2[i,k] = R[i,j] * S[j,k]")
        assert tiles.cache.bytes <= limit
        names = {k[0] for k in _keys(tiles)}
        assert {"r", "s", "x2"} <= names  # the last query's tiles stayed...
        assert "p" not in names and {"q", "x1"} <= names  # ...and the oldest one left
        xp.clear()
        con.execute("X2[i,k] = R[i,j] * S[j,k]")
        assert xp.h2d == []  # R and S are still there
        np.testing.assert_allclose(con.tensor("X2"), mats["R"] @ mats["S"], rtol=1e-12)
        con.execute("X1[i,k] = P[i,j] * Q[j,k]")
        np.testing.assert_allclose(con.tensor("X1"), mats["P"] @ mats["Q"], rtol=1e-12)
        assert tiles.cache.bytes <= limit and tiles.cache.evicted > 0


def test_a_query_over_the_budget_drops_cached_tiles_before_moving_its_own():
    """The device budget test with the cache on: a product whose tiles exceed the limit, run
    twice; cached tiles count against the limit and go first, and the run stays within it."""
    xp = DeviceXp()
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((256, 256)), rng.standard_normal((256, 256))
    limit = 1 << 19  # A, B and the result hold 1.5 MiB
    with tensordb.connect(memory_limit=limit) as con:
        con.load("A", a, tile=(32, 32))
        con.load("B", b, tile=(32, 32))
        tiles = _gpu(con, xp, memory_limit=limit)
        for _ in range(2):
            con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 8, "j": 8, "k": 8})
            run = con.last_run
            assert run.over_budget == 0 and run.peak_bytes <= limit + 32 * 32 * 8
            assert tiles.cache.bytes <= limit
        con.set("memory_limit", "none")
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-10)


_QUERIES = [
    ("matmul", "C[i,k] = A[i,j] * B[j,k]", lambda a, b: a @ b),
    ("min-plus", "C[i,k] = MIN(A[i,j] + B[j,k])", lambda a, b: (a[:, :, None] + b[None]).min(1)),
    ("row max", "C[i] = MAX(A[i,j])", lambda a, b: a.max(1)),
    ("mlp", "LET H[i,j] = RELU(A[i,j]); C[i,k] = SUM(H[i,j] * B[j,k])",
     lambda a, b: np.maximum(a, 0) @ b),
]


@pytest.mark.parametrize("query", _QUERIES, ids=lambda q: q[0])
@pytest.mark.parametrize("workers", [1, 2])
def test_answers_equal_numpy_with_and_without_the_cache(query, workers):
    _, sql, want = query
    got = {}
    for cache in (False, True):
        xp = DeviceXp()
        with tensordb.connect(workers=workers) as con:
            _loaded(con)
            _gpu(con, xp, devices=range(workers), cache=cache)
            for _ in range(3):  # the second and third read cached tiles
                con.execute(sql)
                got[cache] = con.tensor("C")
                np.testing.assert_allclose(got[cache], want(A, B), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(got[True], got[False])


# -- several devices: a tile cached on one is copied from there to another ---------------------

def _hand_plan(op, readers, load_worker: int) -> TilePlan:
    """C = A @ B as two partial products (the halves of j) summed on worker 0, every Load on
    ``load_worker`` (A and B stored as two tiles each)."""
    w = load_worker
    tasks = [Load(0, "A", (0, 0), (64, 24), w), Load(1, "B", (0, 0), (24, 32), w),
             Load(2, "A", (0, 24), (64, 48), w), Load(3, "B", (24, 0), (48, 32), w),
             Kernel(4, 0, (0, 1), ((64, 24), (24, 32)), (64, 32), (0, 0, 0), worker=w),
             Kernel(5, 0, (2, 3), ((64, 24), (24, 32)), (64, 32), (0, 1, 0), worker=w),
             Aggregate(6, "sum", (4, 5), (64, 32), "float64", worker=0)]
    out = OutputTiles("C", (64, 32), "float64", None, {(0, 0): 6}, stored=True)
    return TilePlan((op,), tasks, {"C": out}, [], 2, {t.key: 0 for t in tasks}, readers)


def test_a_tile_cached_on_one_device_is_copied_from_it_to_another():
    from tensordb.bind import bind_graph
    xp = DeviceXp()
    with tensordb.connect() as con:
        _loaded(con)
        g = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C")
        _, planned = con.plan(bind_graph(g, con.store), g.pieces)
        op, readers = planned.ops[0], dict(planned.readers)
        ex = LocalExecutor(2, tiles=DeviceTiles([3, 5], xp=xp))
        try:
            first = ex.run(_hand_plan(op, readers, 0), con.store)  # every Load on device 3
            assert first.copies["host_to_device"] == A.nbytes + B.nbytes
            xp.clear()
            second = ex.run(_hand_plan(op, readers, 1), con.store)  # now on device 5
            cache = ex.tiles.cache
            entries = dict(cache.entries)
        finally:
            ex.close()
    np.testing.assert_allclose(second.tiles[6], A @ B, rtol=1e-12)
    assert xp.h2d == []  # nothing from the host: each tile came from device 3
    assert second.copies["peer_hits"] == 4
    # the four tiles, and the two partials made on device 5 summed on device 3 (worker 0)
    assert second.copies["peer"] == A.nbytes + B.nbytes + 2 * (A @ B).nbytes
    # each tile is now cached on both devices, each copy made on its own device
    for (key, device), e in entries.items():
        assert e.array.dev == device
    assert sorted(d for (key, d) in entries if key[0] == "a") == [3, 3, 5, 5]
    assert len(cache) == 0  # closing the executor frees the devices


def test_explain_shows_resident_inputs_and_analyze_the_copies():
    with _on_standin() as (con, xp, _):
        q = "C[i,k] = A[i,j] * B[j,k]"
        before = con.explain(q, format="json")
        import json
        data = json.loads(before)
        assert {r["resident"] for r in data["device_resident"].values()} == {0}
        text = con.explain(q, analyze=True)
        assert "device-resident inputs: A 0/" in text
        assert f"copied: {tensordb.config.format_bytes(A.nbytes + B.nbytes)} host->device" in text
        text = con.explain(q, analyze=True)
        loads = json.loads(con.explain(q, format="json"))["device_resident"]
        assert all(r["resident"] == r["loads"] > 0 for r in loads.values())
        assert loads["A"]["bytes"] == A.nbytes and loads["B"]["bytes"] == B.nbytes
        assert "copied: 0 B host->device" in text and "miss" in text
    with tensordb.connect() as con:  # the local executor has nothing on a device
        _loaded(con)
        assert "device-resident" not in con.explain("C[i,k] = A[i,j] * B[j,k]", analyze=True)


# -- Dask workers with a device backend keep their own cache -----------------------------------

def test_a_dask_worker_on_a_device_backend_keeps_loaded_tiles(monkeypatch):
    """What a dask-cuda worker runs for a Load (exec/dask_worker.py), here in-process with the
    stand-in as its backend: the second query's Load of the same version copies nothing; a
    new version is copied and the old one's tile leaves."""
    from tensordb.exec import dask_worker, kernels
    xp = DeviceXp()
    monkeypatch.setitem(kernels.BACKENDS, "standin", lambda: xp)
    monkeypatch.setattr(dask_worker, "_CACHE", [])
    dask_worker._xp.cache_clear()
    try:
        with tensordb.connect() as con:
            _loaded(con)

            def load(run):
                reader = con.store.open("A")
                task = Load(0, "A", (0, 0), (64, 24))
                # a Load whose tile another group reads: it stays on the device
                step = dask_worker.Step(task, None, reader, None, (), (), None, True, False, 0)
                out = dask_worker.run_group(run, "standin", dask_worker.Group(f"{run}-0", [step]))
                return out.values[0]

            first = load("r1")
            assert xp.h2d == [A[:, :24].nbytes]
            xp.clear()
            second = load("r2")
            assert xp.h2d == [] and second is first
            np.testing.assert_array_equal(second, A[:, :24])
            a2 = RNG.standard_normal(A.shape)
            con.load("A", a2, tile=(32, 24), replace=True)
            third = load("r3")
            np.testing.assert_array_equal(third, a2[:, :24])
            assert xp.h2d == [A[:, :24].nbytes]
            assert dask_worker.cache_figures() == {"tiles": 1, "bytes": A[:, :24].nbytes}
    finally:
        dask_worker._xp.cache_clear()


@pytest.fixture
def standin_contractions(monkeypatch):
    """opt_einsum's 'cupy' backend (the kernels' contractions on a GPU) as the stand-in's
    functions, for one test: its function cache is restored afterwards."""
    return as_opt_einsum_cupy(monkeypatch, DeviceXp())


def as_opt_einsum_cupy(monkeypatch, xp):
    """Make ``xp``'s functions opt_einsum's 'cupy' backend until ``monkeypatch`` undoes it."""
    from opt_einsum.backends import dispatch
    for fn in ("tensordot", "transpose", "einsum"):
        monkeypatch.setitem(dispatch._cached_funcs, (fn, "cupy"), getattr(xp, fn))
    monkeypatch.setitem(dispatch._has_einsum, "cupy", True)
    monkeypatch.setitem(dispatch._has_tensordot, "cupy", True)
    return xp


def test_training_steps_read_the_weights_the_last_step_stored_on_the_device(
        standin_contractions):
    """sql/train_mlp.sql's step repeated: after the first step no input and no weight is
    copied host -> device (the new weights are the cached tiles of their new versions), and
    the weights equal the same steps in NumPy."""
    from tests.bench.bench_train import _arrays, numpy_step, step_sql
    xp = standin_contractions
    x, y, w1, w2 = _arrays(64, 16, 32, 4)
    with tensordb.connect() as con:
        for name, a in (("X", x), ("Y", y), ("W1", w1), ("W2", w2)):
            con.load(name, a)
        tiles = _gpu(con, xp)
        for step in range(3):
            xp.clear()
            con.execute(step_sql(64))
            loss, w1, w2 = numpy_step(x, y, w1, w2)
            assert (sum(xp.h2d) > 0) == (step == 0)
            np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(con.tensor("L"), loss, rtol=1e-4)
        cached = {(k[0], k[1]) for k in _keys(tiles)}
        assert ("w1", con.store.meta("W1").version) in cached
        assert len({v for n, v in cached if n == "w1"}) == 1  # the older versions left




def test_stored_output_tiles_go_to_their_files_from_the_worker_that_finished_them():
    """Each stored output tile is copied into its writer's buffer, its statistics taken and
    handed to its writer on the worker that finished it (while other tiles are computed), not
    one after another once the run is over: the run returns every tile's statistics, and the
    stored tensor is equal and passes CHECK (its checksums)."""
    landed: list[str] = []
    with _on_standin(devices=(0, 1)) as (con, xp, tiles):
        copy_out = tiles.copy_out

        def recording(value, buffer, key=None):
            landed.append(threading.current_thread().name)
            copy_out(value, buffer, key)

        tiles.copy_out = recording
        con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 2, "k": 2})
        run = con.last_run
        np.testing.assert_allclose(con.tensor("C"), A @ B, rtol=1e-12)
        assert len(landed) == 4 and all("gpu-worker" in name for name in landed)
        assert len(run.nnz) == len(run.crc32) == 4
        assert run.copies["device_to_host"] == (A @ B).nbytes
        con.execute("CHECK TENSOR C")


def test_random_statements_on_the_gpu_executor_over_a_fake_cupy():
    """Two seeds of the random corpus (tests/corpus/test_fuzz.py: 60 statements each, stored tensors
    replaced and read again, 1 to 3 workers) on executor="gpu", in a process where CuPy is
    tests/fakecupy (NumPy with device arrays of their own, two devices): the device cache,
    the outputs copied out on the workers and the copies between devices, all against the
    NumPy oracle."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # before the rest of the path (a GPU machine's wheels), and so before a real CuPy
    path = [root, os.path.join(root, "tests", "fakecupy"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, TENSORDB_TEST_EXECUTOR="gpu",
               PYTHONPATH=os.pathsep.join(p for p in path if p))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/corpus/test_fuzz.py",
         "-k", "test_fuzz_einsums and (seed0] or seed1])"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:]


def test_the_cache_is_an_option_of_the_executor_spec(monkeypatch):
    from tensordb.exec import kernels, make_executor
    xp = DeviceXp()  # two devices
    monkeypatch.setitem(kernels.BACKENDS, "cupy", lambda: xp)
    for spec, cached, devices in (("gpu", True, [0, 1]), ("gpu://?cache=off", False, [0, 1]),
                                  ("gpu://1?cache=on", True, [1])):
        ex = make_executor(spec, 1)
        try:
            assert (ex.tiles.cache is not None) == cached and ex.devices == devices
        finally:
            ex.close()
    for bad in ("gpu://?cache=maybe", "gpu://0?pool=big"):
        with pytest.raises(tensordb.NotSupportedError, match="cache=on|off"):
            make_executor(bad, 1)
