"""Deployments that look like real ones (issue 27, item 5): ``dask scheduler`` and ``dask worker``
started as separate processes on 127.0.0.1 (tests/exec/dask_deploy.py); a worker killed with SIGKILL
mid-query; workers in a mount namespace of their own that see the storage only through the
declared location (root only: skipped elsewhere). The oracles: numpy, the local pool's bytes,
and the catalog's list of payload files against the directory's."""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

import tensordb
from tests.exec.dask_deploy import Deployment, can_unshare
from tests.exec.test_dask_sink import catalog_files, on_disk, stored

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")


def _load_pair(*cons, seed=3, n=256):
    """A and B, the same in every connection given."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    for con in cons:
        con.load("A", a, tile=(64, 64), replace=True)
        con.load("B", b, tile=(64, 64), replace=True)
    return a, b


@pytest.mark.slow  # (the namespace test below does the same where it may run, root)
def test_hand_started_workers_write_the_local_pools_tiles(tmp_path):
    with Deployment(tmp_path / "cluster") as dep:
        dep.worker("a")
        dep.worker("b")
        dep.wait(2)
        with tensordb.connect(tmp_path / "db", executor=f"dask://{dep.address}",
                              storage="shared") as d, tensordb.connect(tmp_path / "l",
                                                                       workers=2) as local:
            a, b = _load_pair(d, local)
            for con in (d, local):
                con.execute("C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 2, k 2)")
            np.testing.assert_allclose(d.tensor("C"), a @ b, rtol=1e-4, atol=1e-4)
            run = d._get_executor().last_run
            assert run["written_by_workers"] == 4 and run["gathered_bytes"] == 0
            assert set(run["ran_on"].values()) == set(run["addresses"])  # both worked
            assert stored(d, "C") == stored(local, "C")
            assert on_disk(d) == catalog_files(d)


def _run_in_thread(con, sql):
    box = {}

    def go():
        try:
            box["result"] = con.execute(sql)
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            box["error"] = exc
    th = threading.Thread(target=go)
    th.start()
    return th, box


def _kill_mid_query(dep, con, sql, alive: set[str]) -> dict:
    """Run ``sql``, SIGKILL one of the workers ``alive`` (names) while it runs one of the
    query's tasks, and wait for the query: {"error": exc} or {}; the killed name leaves
    ``alive``. A worker whose tasks are all done holds nothing the query still needs (the
    results came straight to the client), so the victim is picked among the busy ones, seen
    in the scheduler's list of what each worker is processing (the output file is no sign:
    it may appear only as the tasks end)."""
    from distributed import Client
    with Client(dep.address, timeout=30) as watch:
        th, box = _run_in_thread(con, sql)
        deadline = time.time() + 120

        def busy() -> set[str]:
            names = {a: w.get("name") for a, w in
                     watch.scheduler_info(n_workers=-1)["workers"].items()}
            return {names.get(a) for a, keys in watch.processing().items()
                    if any(str(k).startswith("tdb-") for k in keys)}
        while not busy() and th.is_alive() and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # some of its tasks ran
        victim = next((n for n in sorted(alive) if n in busy()), None)
        assert th.is_alive() and victim is not None, \
            "the query ended before a worker could be killed"
        dep.kill(victim)
    alive.discard(victim)
    th.join(180)
    assert not th.is_alive()
    return box


@pytest.mark.slow
def test_a_worker_killed_mid_query_leaves_the_old_or_the_new_state(tmp_path):
    # 1.5 s to 8 s of the workers' kernels (fused into a Dask task or two per worker), so that
    # the kill lands while they run
    n = 1024
    sql = "C[i,k] = SUM(EXP(A[i,j] * 0.001) * B[j,k]) WITH (PIECES i 8, j 8, k 8)"
    with Deployment(tmp_path / "cluster") as dep:
        for name in ("k1", "k2", "k3"):
            dep.worker(name)
        dep.wait(3)
        rng = np.random.default_rng(5)
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        old = np.full((n, n), 7.0, np.float32)
        new = np.exp(a.astype(np.float64) * 0.001) @ b
        db = tmp_path / "db"
        alive = {"k1", "k2", "k3"}
        with tensordb.connect(db, executor=f"dask://{dep.address}?retries=0",
                              storage="shared") as con:
            con.load("A", a, tile=(16, 16))
            con.load("B", b, tile=(16, 16))
            con.execute("W[i,k] = SUM(A[i,j] * B[j,k])")  # the workers import tensordb
            con.load("C", old, tile=(64, 64))
            box = _kill_mid_query(dep, con, sql, alive)
            if "error" in box:  # the victim's task was lost: the old state, no file left
                assert isinstance(box["error"], tensordb.OperationalError), box
                assert "nothing was stored" in str(box["error"])
                np.testing.assert_array_equal(con.tensor("C"), old)
            else:  # its last task ended between the look and the kill: the new state
                np.testing.assert_allclose(con.tensor("C"), new, rtol=1e-3, atol=1e-3)
            assert on_disk(con) == catalog_files(con)  # the query's file is gone already
            print("retries=0:", repr(box.get("error", "the new state")))
        # retries=1: the lost worker's tasks move to the worker left (the scheduler is a
        # `dask scheduler` process: re-pinned there), or a second attempt runs there; the new
        # state lands
        with tensordb.connect(db, executor=f"dask://{dep.address}?retries=1",
                              storage="shared") as con:
            assert on_disk(con) == catalog_files(con)  # nothing orphaned after the open
            box = _kill_mid_query(dep, con, sql, alive)
            assert "error" not in box, box.get("error")
            run = con._get_executor().last_run
            print("retries=1:", {k: run[k] for k in ("attempts", "workers_lost", "relocated")})
            assert run["attempts"] in (1, 2) and run["workers_lost"] <= 1, run
            if run["attempts"] == 1 and run["workers_lost"] == 1:  # moved, not run again
                assert run["relocated"] and run["relocated"][0][1] > 0, run
        with tensordb.connect(db) as con:
            np.testing.assert_allclose(con.tensor("C"), new, rtol=1e-3, atol=1e-3)
            assert on_disk(con) == catalog_files(con)
            assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"


needs_root = pytest.mark.skipif(not can_unshare(), reason="needs root and unshare(1): workers "
                                                          "in a mount namespace of their own")


@needs_root
def test_a_worker_that_sees_the_storage_only_where_declared(tmp_path):
    """The worker's namespace hides everything under ``base`` (the client's directory of
    databases) behind an empty tmpfs and mounts the database back at its own path: it reads
    the inputs and writes the outputs there, and the bytes are the local pool's."""
    base = tmp_path / "base"
    db = base / "db"
    with tensordb.connect(db, storage="shared") as seed:
        seed.load("seeded", np.ones(3))  # the directory exists before the worker mounts it
    with Deployment(tmp_path / "cluster") as dep:
        dep.worker("ns", hide=base, show=db)
        dep.wait(1)
        with tensordb.connect(db, executor=f"dask://{dep.address}", storage="shared") as d, \
                tensordb.connect(tmp_path / "l", workers=1) as local:
            (base / "client-only").mkdir()  # the worker cannot see this
            a, b = _load_pair(d, local)
            for con in (d, local):
                con.execute("C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 2, k 2)")
            np.testing.assert_allclose(d.tensor("C"), a @ b, rtol=1e-4, atol=1e-4)
            assert d._get_executor().last_run["written_by_workers"] == 4
            assert stored(d, "C") == stored(local, "C")
            assert on_disk(d) == catalog_files(d)
            ex = d._get_executor()
            seen = ex.client.run(os.path.isdir, str(base / "client-only"))
            assert list(seen.values()) == [False]  # it sees the database, and nothing else


@needs_root
def test_workers_that_see_no_database_or_another_one(tmp_path):
    base = tmp_path / "base"
    db = base / "db"
    base.mkdir()
    other = (f"{sys.executable} -c \"import tensordb, numpy; c = tensordb.connect('%s'); "
             "c.load('A', numpy.zeros(2)); c.close()\"" % db)
    with Deployment(tmp_path / "cluster") as dep:
        dep.worker("none", hide=base)
        dep.worker("other", hide=base, setup=other)
        dep.wait(2)
        none, other_addr = dep.address_of("none"), dep.address_of("other")
        with tensordb.connect(db, executor=f"dask://{dep.address}", storage="shared") as d:
            a, b = _load_pair(d)
            before = on_disk(d)
            with pytest.raises(tensordb.OperationalError) as info:
                d.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
            msg = str(info.value)
            assert "storage='shared'" in msg and str(db) in msg and "nothing was run" in msg
            assert "Dask worker tcp://127.0.0.1:" in msg and "1 more worker" in msg
            assert not d.store.has("C") and on_disk(d) == before  # nothing stored, no file
            why = d._get_executor().probe(str(db), d.store.database, [none, other_addr])
            assert f"Dask worker {none}" in why[none] and "no directory" in why[none]
            assert f"Dask worker {other_addr}" in why[other_addr]
            assert "another database" in why[other_addr]
        # storage='local' declares the opposite: the client sends those workers the tiles
        with tensordb.connect(db, executor=f"dask://{dep.address}", storage="local") as d:
            d.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
            np.testing.assert_allclose(d.tensor("C"), a @ b, rtol=1e-4, atol=1e-4)
            run = d._get_executor().last_run
            assert run["scattered_bytes"] > 0 and run["written_by_workers"] == 0
