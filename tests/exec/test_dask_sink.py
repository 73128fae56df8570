"""Workers that write their own output tiles (issue 27, item 2), on a real LocalCluster over a
database directory every worker sees (storage='shared'): each worker writes the tiles it
computed into their places in the new payload file, only their facts come back, and the client
commits the catalog. The bytes and catalog rows are those the local pool writes (the oracle:
the local pool on a database of its own, and numpy); a failed query leaves no file."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tensordb.exec.contract import Executor, OutputSink
from tensordb.physical import CatalogSink

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")


@pytest.fixture
def pair(cluster, tmp_path):
    """A database written by the cluster's workers and one written by the local pool."""
    with tensordb.connect(tmp_path / "d", workers=2, storage="shared",
                          executor=f"dask://{cluster.scheduler_address}") as d, \
            tensordb.connect(tmp_path / "l", workers=2) as local:
        yield d, local


def stored(con, name):
    """tile coords -> (offset, nbytes, nnz, crc32, nonfinite, format, the tile's bytes)."""
    r = con.store.open(name)
    if not r.entries:
        return {}
    with open(r.path, "rb") as f:
        data = f.read()
    return {c: (e.offset, e.nbytes, e.nnz, e.crc32, e.nonfinite, e.format,
                data[e.offset:e.offset + e.nbytes]) for c, e in r.entries.items()}


def on_disk(con) -> set[str]:
    return set(os.listdir(con.store.tiles_dir))


def catalog_files(con) -> set[str]:
    readers = [con.store.open(m.name) for m in con.store.list()]
    return {os.path.basename(r.path) for r in readers if r.entries}


def test_executors_keep_the_contract(pair):
    d, local = pair
    assert isinstance(local._get_executor(), Executor)
    assert isinstance(d._get_executor(), Executor)
    caps = d._get_executor().capabilities()
    assert caps.workers == 2 and caps.max_fan_in == 8 and caps.threads_per_worker == 1
    assert local._get_executor().capabilities().max_fan_in is None
    assert issubclass(CatalogSink, OutputSink)


CASES = [
    # (statement, inputs): products, NaN/inf, absent and all-zero tiles, -0.0, an aggregation
    ("C[i,k] = SUM(A[i,j] * B[j,k])", {"A": (96, 80), "B": (80, 64)}),
    ("C[i,j] = A[i,j] * 0", {"A": (96, 80)}),  # -0.0 where A < 0: stored, as numpy says
    ("C[i,j] = A[i,j] / Z[i,j]", {"A": (96, 80), "Z": "zeros"}),
    ("C[i] = MAX(A[i,j])", {"A": (96, 80)}),
    ("C[i,k] = SUM(RELU(A[i,j]) * B[j,k])", {"A": (96, 80), "B": "sparse"}),
]


@pytest.mark.parametrize("stmt, inputs", CASES, ids=[c[0] for c in CASES])
def test_tiles_written_by_workers_are_the_local_pools(pair, stmt, inputs):
    d, local = pair
    rng = np.random.default_rng(len(stmt))
    arrays = {}
    for name, what in inputs.items():
        if what == "zeros":
            arrays[name] = np.zeros((96, 80), np.float32)
        elif what == "sparse":
            b = rng.standard_normal((80, 64)).astype(np.float32)
            b[:40] = 0  # whole tiles absent
            arrays[name] = b
        else:
            arrays[name] = rng.standard_normal(what).astype(np.float32)
    for con in (d, local):
        for name, a in arrays.items():
            con.load(name, a, tile=(32, 32), replace=True)
    got = [con.execute(stmt + " WITH (PIECES i 3)").tensor() for con in (d, local)]
    run = d._get_executor().last_run
    if d.last_plan.tasks:  # (a product with an all-absent operand has no task to run)
        n_out = len(d.last_plan.outputs["C"].tiles)
        assert run["written_by_workers"] == n_out > 0 and run["gathered_bytes"] == 0
    with np.errstate(all="ignore"):
        want = {"C[i,k] = SUM(A[i,j] * B[j,k])": lambda a: a["A"] @ a["B"],
                "C[i,j] = A[i,j] * 0": lambda a: a["A"] * 0,
                "C[i,j] = A[i,j] / Z[i,j]": lambda a: a["A"] / a["Z"],
                "C[i] = MAX(A[i,j])": lambda a: a["A"].max(axis=1),
                "C[i,k] = SUM(RELU(A[i,j]) * B[j,k])":
                    lambda a: np.maximum(a["A"], 0) @ a["B"]}[stmt](arrays)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.signbit(got[0]), np.signbit(got[1]))
    assert stored(d, "C") == stored(local, "C")  # same rows, same bytes at the same offsets
    assert d.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"
    assert on_disk(d) == catalog_files(d)


def test_a_failed_query_leaves_no_file(pair):
    d, _ = pair
    d.load("I", np.arange(-4, 60).reshape(8, 8).astype(np.int64), tile=(4, 4))
    d.load("N", np.full((8, 8), -1, np.int64), tile=(4, 4))
    before = on_disk(d)
    with pytest.raises(tensordb.DataError, match="negative integer powers"):
        # C's tiles are written by the workers; E fails on the data: nothing is stored
        d.execute("C[i,k] = SUM(I[i,j] * I[j,k]); E[i,j] = POW(I[i,j], N[i,j])")
    assert not d.store.has("C") and not d.store.has("E")
    assert on_disk(d) == before == catalog_files(d)


def test_a_dead_writers_file_is_swept_on_the_next_open(pair, tmp_path):
    """A file a worker wrote for a query whose client died (no catalog row names it) goes
    when the database is next opened for writing, by the catalog's proof."""
    from tensordb.storage.slots import TileSlot, write_slot
    d, _ = pair
    d.load("A", np.ones((8, 8)), tile=(4, 4))
    path = os.path.join(d.store.tiles_dir, f"999-{d.store.database[:16]}.bin")
    with open(path, "wb") as f:
        f.truncate(256)
    facts = write_slot(TileSlot(path, 0, (4, 4), "<f8", d.store.database, False, "X"),
                       np.full((4, 4), 2.0))
    assert facts.keep and facts.nnz == 16 and facts.nbytes == 128
    d.close()
    with tensordb.connect(tmp_path / "d") as again:
        assert os.path.basename(path) not in on_disk(again)
        np.testing.assert_array_equal(again.tensor("A"), np.ones((8, 8)))


def test_a_worker_refuses_a_slot_of_another_database(pair):
    from tensordb.storage.slots import TileSlot, write_slot
    d, _ = pair
    d.load("A", np.ones((8, 8)), tile=(4, 4))
    path = d.store.open("A").path
    with pytest.raises(tensordb.OperationalError, match="another database"):
        write_slot(TileSlot(path, 0, (4, 4), "<f8", "f" * 32, False, "X"), np.ones((4, 4)))
    np.testing.assert_array_equal(d.tensor("A"), np.ones((8, 8)))  # nothing was written


def test_outputs_finished_before_a_worker_left_are_not_computed_again(pair, monkeypatch):
    """After a worker is lost, the output tiles already finished on the workers left (written
    into their file, their facts on a worker) are kept: the next attempt computes only the
    rest. Here the loss is pretended once every output finished, so nothing runs again."""
    from tensordb.exec import dask_run
    d, local = pair
    real, lost = dask_run.Attempt._wait, []

    def wait_then_lose_a_worker(self, futures):
        values = real(self, futures)
        if not lost:
            lost.append(len(futures))
            raise dask_run.WorkerLost("a worker is gone (pretended)", self._finished(futures))
        return values
    monkeypatch.setattr(dask_run.Attempt, "_wait", wait_then_lose_a_worker)
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((96, 64)), rng.standard_normal((64, 64))
    for con in (d, local):
        con.load("A", a, tile=(32, 32))
        con.load("B", b, tile=(32, 32))
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 3, k 2)")
    run = d._get_executor().last_run
    n_out = len(d.last_plan.outputs["C"].tiles)
    assert lost and run["attempts"] == 2 and run["kept_from_earlier_attempts"] == n_out == 6
    assert run["ran_on"] == {} and run["loads_on"] == {}  # the second attempt ran no task
    np.testing.assert_allclose(d.tensor("C"), a @ b, atol=1e-12)
    assert stored(d, "C") == stored(local, "C")
    assert on_disk(d) == catalog_files(d)


def test_the_older_arguments_reach_the_same_sink(pair):
    """``run(plan, store, destinations=sink.buffers, finished=sink.finished)`` (the driver's
    call before ``sink=``) hands the executor the sink itself: its workers still write."""
    from tensordb.bind import bind_graph as bind
    d, _ = pair
    rng = np.random.default_rng(4)
    a = rng.standard_normal((64, 64))
    d.load("A", a, tile=(32, 32))
    g = tensordb.Graph().einsum("ij,jk->ik", "A", "A", into="C", pieces={"i": 2, "k": 2})
    _, plan = d.plan(bind(g, d.store), g.pieces)
    sink = CatalogSink(d.store, plan, replace=True)
    ex = d._get_executor()
    result = ex.run(plan, d.store, destinations=sink.buffers, finished=sink.finished)
    sink.commit(result)
    assert ex.last_run["written_by_workers"] == 4 and ex.last_run["gathered_bytes"] == 0
    np.testing.assert_allclose(d.tensor("C"), a @ a, atol=1e-12)


def test_workers_verify_a_tile_once_per_process_not_once_per_query(pair):
    """The checksum of a stored tile is checked on its first read in each worker process
    (storage/verify.py remembers it per process, by the file's identity), not again by each
    query: the second run of a query verifies nothing new on any worker."""
    from tensordb.storage.verify import verified_count
    d, _ = pair
    client = d._get_executor().client
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 64))
    d.load("A", a, tile=(32, 32))
    d.load("B", b, tile=(32, 32))
    counts = [client.run(verified_count)]
    for _ in range(2):
        d.execute("C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 2, k 2)")
        np.testing.assert_allclose(d.tensor("C"), a @ b, atol=1e-12)
        counts.append(client.run(verified_count))
    first = sum(counts[1][w] - counts[0][w] for w in counts[0])
    second = sum(counts[2][w] - counts[1][w] for w in counts[0])
    assert 8 <= first <= 16  # each of the 8 stored tiles checked by each worker that read it
    assert second == 0
