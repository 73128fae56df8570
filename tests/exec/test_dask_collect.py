"""The Dask executor's round trips (issue 27): a run's results come straight from the workers
that made them (exec/dask_collect.py: no gather through the scheduler), the workers' set and
facts are asked of the scheduler only when a worker joined or left, and every way off the
direct path (a worker without the handler, a failed task) still ends as Dask's futures say.
Real LocalCluster on 127.0.0.1, a database every worker sees; the oracle is numpy."""
from __future__ import annotations

import time

import numpy as np
import pytest

import tensordb

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")


@pytest.fixture
def con(cluster, tmp_path):
    with tensordb.connect(tmp_path / "db", workers=2, storage="shared",
                          executor=f"dask://{cluster.scheduler_address}") as c:
        yield c


def _calls(client, monkeypatch) -> list[str]:
    """What the executor asks of the scheduler through this client, in order (Dask's own
    periodic requests, such as its scheduler-info refresh, are not ours and not counted)."""
    seen: list[str] = []
    for name in ("scheduler_info", "ncores", "who_has", "gather", "run"):
        real = getattr(client, name)

        def spy(*args, _name=name, _real=real, **kwargs):
            seen.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(client, name, spy)
    return seen


def _matmul(con, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((64, 48)), rng.standard_normal((48, 32))
    con.load("A", a, tile=(32, 16), replace=True)
    con.load("B", b, tile=(16, 32), replace=True)
    return a, b


def test_results_come_from_the_workers_not_through_the_scheduler(con, monkeypatch):
    a, b = _matmul(con)
    con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 2})  # handlers installed
    ex = con._get_executor()
    assert ex.collectors(ex.addresses()) == set(ex.addresses())
    calls = _calls(ex.client, monkeypatch)

    def no_gather(*args, **kwargs):
        raise AssertionError("a result was gathered through the scheduler")
    monkeypatch.setattr(ex.client, "_gather", no_gather)
    for _ in range(3):
        con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 2}, replace=True)
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
    assert ex.last_run["written_by_workers"] == 2
    # nor asked for the workers' facts: the cluster did not change (a query longer than
    # dask_run.POLL_SECONDS asks for the worker list, to notice one gone)
    assert "scheduler_info" not in calls and "gather" not in calls and "who_has" not in calls
    assert "run" not in calls, calls  # the handlers are there already
    monkeypatch.undo()
    # the futures were let go (in one hop to the client's loop): the scheduler forgets the keys
    deadline = time.monotonic() + 10
    while ex.client.run_on_scheduler(_tdb_keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ex.client.run_on_scheduler(_tdb_keys) == []


def _tdb_keys(dask_scheduler=None) -> list:
    return [k for k in dask_scheduler.tasks if str(k).startswith("tdb-")]


def test_a_worker_without_the_handler_hands_its_results_through_the_scheduler(con):
    a, b = _matmul(con, 1)
    con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 2})
    ex = con._get_executor()

    def drop(dask_worker=None):
        dask_worker.handlers.pop("tdb_collect", None)
        return True
    try:
        ex.client.run(drop)  # the client still takes both for collectors
        con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 2}, replace=True)
        np.testing.assert_allclose(con.tensor("C"), a @ b, atol=1e-12)
    finally:
        from tensordb.exec.dask_collect import PLUGIN

        def again(dask_worker=None):
            plugin = dask_worker.plugins.get(PLUGIN)
            if plugin is not None:
                dask_worker.handlers["tdb_collect"] = plugin.collect
            return True
        ex.client.run(again)


def test_a_failed_task_fails_the_query_as_before_and_stores_nothing(con):
    """A task that fails on its worker: the direct request finds no result, and the futures
    raise the task's own error (translated on the worker: a DataError naming the tensor)."""
    a = np.arange(16.0).reshape(4, 4)
    con.load("A", a, tile=(2, 2))
    r = con.store.open("A")
    with open(r.path, "r+b") as f:  # damage one tile's bytes: its checksum no longer holds
        e = next(iter(r.entries.values()))
        f.seek(e.offset)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(tensordb.DataError, match="A"):
        con.execute("S[i,k] = SUM(A[i,j] * A[j,k])")
    assert [t["name"] for t in con.tensors()] == ["A"]


def test_the_worker_set_is_asked_for_again_when_a_worker_joins(cluster, con, monkeypatch):
    _matmul(con)
    ex = con._get_executor()
    assert ex.listening
    assert ex.capabilities().workers == 2 and len(ex.addresses()) == 2
    calls = _calls(ex.client, monkeypatch)
    ex.capabilities()
    ex.addresses()
    assert calls == []  # cached: nothing changed
    cluster.scale(3)
    try:
        ex.client.wait_for_workers(3, timeout=120)
        deadline = time.monotonic() + 30
        while len(ex.addresses()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the scheduler's event reaches the client's loop
        assert len(ex.addresses()) == 3 and ex.capabilities().workers == 3
        assert "scheduler_info" in calls and "ncores" in calls
    finally:
        cluster.scale(2)
        deadline = time.monotonic() + 60
        while len(cluster.scheduler_info["workers"]) > 2 and time.monotonic() < deadline:
            time.sleep(0.1)
