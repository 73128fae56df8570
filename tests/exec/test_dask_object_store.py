"""The Dask executor with the payloads in an object store (a real S3 server on 127.0.0.1: moto,
tests/s3server.py): every worker process reads its Load tiles from the store by byte range
itself (nothing scattered from the client), checking the prefix's database id first; results
match numpy and the local pool's."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tests.corpus.test_engine_corpus import assert_matches, make_case, oracle
from tests.s3server import s3, s3_storage  # noqa: F401 - fixtures

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")


def test_workers_read_the_object_store(cluster, tmp_path, s3_storage):
    url, options = s3_storage
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((96, 64)), rng.standard_normal((64, 80))
    with tensordb.connect(tmp_path / "db", workers=2, storage=url, storage_options=options,
                          executor=f"dask://{cluster.scheduler_address}") as con:
        con.load("A", a, tile=(48, 32))
        con.load("B", b, tile=(32, 40))
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
        run = con._get_executor().last_run
        assert run["scattered_bytes"] == 0
        loads = {t.key for t in con.last_plan.tasks if type(t).__name__ == "Load"}
        assert loads and loads <= set(run["loads_on"])  # every Load was read on a worker
        client = con._get_executor().client
        pids = client.run(lambda: __import__("os").getpid())
        assert __import__("os").getpid() not in pids.values()
        # a corpus case or two, against the oracle
        for seed in (1, 5, 9):
            operands, out, arrays, join, agg, pins, _ = make_case(seed)
            names = []
            for k, (arr, tile) in enumerate(arrays):
                names.append(f"x{seed}_{k}")
                con.load(names[-1], arr, tile=tile or None, replace=True)
            g = tensordb.Graph().op(f"o{seed}", out, list(zip(names, operands)), join=join,
                                    agg=agg, pieces=pins)
            con.run(g, replace=True)
            assert_matches(con.tensor(f"o{seed}"), oracle(operands, out, arrays, join, agg))


def test_a_worker_refuses_another_database_at_the_prefix(cluster, tmp_path, s3_storage):
    url, options = s3_storage
    with tensordb.connect(tmp_path / "db", workers=2, storage=url, storage_options=options,
                          executor=f"dask://{cluster.scheduler_address}") as con:
        con.load("A", np.ones((8, 8)), tile=(4, 8))
        from tensordb.storage.objects import ObjectStore
        store = ObjectStore(url, options)
        with store.fs.open_output_stream(f"{store.bucket}/{store.prefix}/database.id") as out:
            out.write(b"1" * 32)
        with pytest.raises(tensordb.OperationalError, match="Dask worker .*another database"):
            con.execute("B[i,j] = A[i,j] * 2")
        assert not con.store.has("B")


# -- the workers write their own outputs (storage/objparts.py) ---------------------------------
def _objects(storage):
    from tensordb.storage.objects import ObjectStore
    return ObjectStore(*storage)


def _files(con, name) -> set:
    """The objects tensor ``name``'s tiles lie in: its payload, or the part objects Dask's
    workers put (storage/objparts.py)."""
    r = con.store.open(name)
    return {e.file or r.file for e in r.entries.values()}


def _object_bytes(storage, con, name):
    """The payload's bytes, put together from its part objects where workers wrote parts."""
    from tensordb.storage.objects import part_start
    store = _objects(storage)
    out = bytearray()
    for file in sorted(_files(con, name), key=part_start):
        assert part_start(file) == len(out)  # the parts cover the layout, back to back
        with store.fs.open_input_stream(store.key(file)) as f:
            out += f.read()
    return bytes(out)


def _rows(con, name):
    r = con.store.open(name)
    return {c: (e.offset, e.nbytes, e.nnz, e.crc32, e.nonfinite, e.format)
            for c, e in r.entries.items()}


def test_workers_upload_their_outputs_as_the_local_pool_does(cluster, tmp_path, s3):
    pytest.importorskip("boto3")
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((1024, 48)), rng.standard_normal((48, 2048))
    ds, ls = (s3.prefix(), dict(s3.options)), (s3.prefix(), dict(s3.options))
    sql = "C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 4, k 2)"
    with tensordb.connect(tmp_path / "d", workers=2, storage=ds[0], storage_options=ds[1],
                          executor=f"dask://{cluster.scheduler_address}") as d, \
            tensordb.connect(tmp_path / "l", workers=2, storage=ls[0],
                             storage_options=ls[1]) as local:
        for con in (d, local):
            con.load("A", a, tile=(256, 48))
            con.load("B", b, tile=(48, 1024))
            con.execute(sql)
        run = d._get_executor().last_run
        assert run["written_by_workers"] == 8 and run["gathered_bytes"] == 0
        assert len(set(run["ran_on"].values())) == 2  # both workers computed and uploaded
        np.testing.assert_allclose(d.tensor("C"), a @ b, atol=1e-12)
        # the same plan laid out the same way: the objects are equal byte for byte
        assert _rows(d, "C") == _rows(local, "C")
        assert _object_bytes(ds, d, "C") == _object_bytes(ls, local, "C")
        # each worker put its part as an object of its own: no multipart upload, no object
        # that no row names
        assert len(_files(d, "C")) == 2 and _objects(ds).uploads() == []
        assert {n for n, _ in _objects(ds).list()} == \
            {f for m in d.store.list() for f in _files(d, m.name)}
        assert d.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"


def test_a_worker_refuses_to_write_to_another_databases_prefix(cluster, s3):
    """The worker's side of a write (storage/objparts.write_object_slot): the prefix's
    database.id is checked before the tile goes anywhere; the error names the worker and the
    object's URL."""
    pytest.importorskip("boto3")
    from distributed import Client
    from tensordb.storage.objects import ObjectStore
    from tensordb.storage.objparts import ObjectSlot, write_object_slot
    store = ObjectStore(s3.prefix(), dict(s3.options))
    store.claim("f" * 32)  # the prefix is another database's
    file = f"5-{'a' * 16}.bin"
    upload = store.create_upload(file, "a" * 32)
    try:
        slot = ObjectSlot(store, file, upload, 1, 0, 64, (0,), 0, (8,), "<f8", "a" * 32, "T")
        with Client(cluster.scheduler_address, timeout=30) as client:
            fut = client.submit(write_object_slot, "run-x", slot, np.ones(8), pure=False)
            with pytest.raises(tensordb.OperationalError) as err:
                fut.result(timeout=60)
        message = str(err.value)
        assert "Dask worker tcp://127.0.0.1:" in message and store.url_of(file) in message
        assert "another database" in message
    finally:
        store.abort_upload(file, upload)
    assert store.uploads() == [] and store.list() == []


@pytest.mark.slow
def test_a_worker_killed_mid_query_leaves_no_object_behind(tmp_path, s3):
    """``dask worker`` processes started by hand (tests/exec/dask_deploy.py) uploading the
    parts of a 24 MiB output; one SIGKILLed mid-query: with retries=0 the old state and no
    object or open upload left; with retries=1 the new state, run again on the others."""
    pytest.importorskip("boto3")
    import threading
    import time
    from tests.exec.dask_deploy import Deployment
    storage = (s3.prefix(), dict(s3.options))
    store = _objects(storage)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((1536, 512)), rng.standard_normal((512, 2048))
    old = np.full((1536, 2048), 7.0)
    sql = "C[i,k] = SUM(EXP(A[i,j] * 0.001) * B[j,k]) WITH (PIECES i 8, j 8, k 8)"

    def kill_mid_query(dep, con, alive):
        """Run the query, kill one of ``alive`` (names) that is running one of its tasks, and
        wait for the query; the killed name leaves ``alive``. A worker whose tasks are all done
        holds nothing the query still needs (the results came straight to the client), so
        the victim is picked among the busy ones."""
        box = {}

        def go():
            try:
                con.execute(sql)
            except BaseException as exc:  # noqa: BLE001 - looked at below
                box["error"] = exc
        from distributed import Client
        with Client(dep.address, timeout=30) as watch:
            th = threading.Thread(target=go)
            th.start()
            deadline = time.time() + 60
            # until the workers run the query's tasks (each part object goes up with its
            # last tile: there is no upload to see opened before)
            while not any(watch.processing().values()) and th.is_alive() and \
                    time.time() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            names = {a: w.get("name") for a, w in
                     watch.scheduler_info(n_workers=-1)["workers"].items()}
            busy = {names.get(a) for a, keys in watch.processing().items() if keys}
            victim = next((n for n in sorted(alive) if n in busy), None)
        assert th.is_alive() and victim is not None, \
            "the query ended before a worker could be killed"
        dep.kill(victim)
        alive.discard(victim)
        th.join(180)
        assert not th.is_alive()
        return box

    def nothing_orphaned(con):
        assert store.uploads() == []
        assert {n for n, _ in store.list()} == {f for m in con.store.list()
                                               for f in _files(con, m.name)}

    with Deployment(tmp_path / "cluster") as dep:
        for name in ("k1", "k2", "k3"):
            dep.worker(name)
        dep.wait(3)
        db = tmp_path / "db"
        with tensordb.connect(db, executor=f"dask://{dep.address}?retries=0",
                              storage=storage[0], storage_options=storage[1]) as con:
            con.load("A", a, tile=(192, 64))
            con.load("B", b, tile=(64, 256))
            con.load("C", old, tile=(768, 1024))
            con.execute("W[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 8, k 8)")  # warm-up
            assert con._get_executor().last_run["gathered_bytes"] == 0  # uploaded by workers
            alive = {"k1", "k2", "k3"}
            box = kill_mid_query(dep, con, alive)
            assert isinstance(box.get("error"), tensordb.OperationalError), box
            assert "nothing was stored" in str(box["error"])
            np.testing.assert_array_equal(con.tensor("C"), old)  # the old state
            nothing_orphaned(con)  # the parts put deleted already
        with tensordb.connect(db, executor=f"dask://{dep.address}?retries=1",
                              storage=storage[0], storage_options=storage[1]) as con:
            nothing_orphaned(con)
            box = kill_mid_query(dep, con, alive)
            assert "error" not in box, box.get("error")
            run = con._get_executor().last_run
            # a second attempt, or none needed: the victim's task may finish in the moment
            # between the look at what runs and the kill (its result is then the client's)
            assert run["attempts"] in (1, 2) and run["gathered_bytes"] == 0
        with tensordb.connect(db, storage=storage[0], storage_options=storage[1]) as con:
            want = np.exp(a * 0.001) @ b
            np.testing.assert_allclose(con.tensor("C"), want, rtol=1e-9, atol=1e-9)
            nothing_orphaned(con)
            assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"
