"""A Dask worker killed for real (SIGKILL) while a query runs: the query is retried on the workers
left, or fails with OperationalError; never a wrong result, never a half-stored tensor."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import tensordb

pytestmark = pytest.mark.distributed
pytest.importorskip("distributed")

N = 512  # min-plus on N^3: about a second of kernels, so the kill lands mid-query


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tensordb.exec.dask import local_cluster
    with local_cluster(2, local_directory=str(tmp_path_factory.mktemp("dask-kill"))) as c:
        yield c


def _killer(client, stop: threading.Event, killed: list):
    """Kill (SIGKILL) the worker that is busy with a tile task of ours, as soon as there is one."""
    pids = client.run(os.getpid)
    while not stop.is_set():
        busy = {a: ks for a, ks in client.processing().items()
                if any(str(k).startswith("tdb-") for k in ks)}
        if busy:
            addr = sorted(busy)[0]
            os.kill(pids[addr], signal.SIGKILL)
            killed.append(addr)
            return
        time.sleep(0.01)


def _query_with_kill(con, replace=False):
    ex = con._get_executor()
    ex.client.wait_for_workers(2, timeout=30)
    stop, killed = threading.Event(), []
    th = threading.Thread(target=_killer, args=(ex.client, stop, killed), daemon=True)
    th.start()
    try:
        con.einsum("ik,kj->ij", "D", "D", into="P", join="x0 + x1", agg="min",
                   pieces={"i": 2, "k": 2, "j": 2}, replace=replace)
    finally:
        stop.set()
        th.join()
    return killed


def _distances(con):
    d = np.random.default_rng(0).uniform(1, 10, (N, N))
    con.load("D", d, tile=(N // 2, N // 2), replace=True)
    return d


def test_killed_worker_query_is_retried(cluster):
    with tensordb.connect(workers=2, executor=f"dask://{cluster.scheduler_address}") as con:
        d = _distances(con)
        killed = _query_with_kill(con)
        assert killed, "the query ended before a worker could be killed"
        ex = con._get_executor()
        assert ex.last_run["attempts"] == 2
        assert killed[0] not in ex.last_run["addresses"]
        want = np.min(d[:, :, None] + d[None, :, :], axis=1)
        np.testing.assert_array_equal(con.tensor("P"), want)


def test_killed_worker_without_retry_fails_and_stores_nothing(cluster):
    spec = f"dask://{cluster.scheduler_address}?retries=0"
    with tensordb.connect(workers=2, executor=spec) as con:
        _distances(con)
        con.load("P", np.zeros((2, 2)))  # an older P that must survive the failed replace
        with pytest.raises(tensordb.OperationalError, match="worker left while the query ran"):
            _query_with_kill(con, replace=True)
        np.testing.assert_array_equal(con.tensor("P"), np.zeros((2, 2)))
        assert sorted(t["name"] for t in con.tensors()) == ["D", "P"]
