"""Planning from what a Dask cluster's workers report of themselves (issue 27, item 4): each
worker's memory limit and thread count, not the client's settings. Real LocalClusters of worker
processes with their own ``memory_limit`` and ``threads_per_worker``; the oracle is numpy, and
the plans are compared with each other (a tighter worker splits more, a worker of 2 threads is
2 plan workers)."""
from __future__ import annotations

import json
import math
from contextlib import contextmanager

import numpy as np
import pytest

import tensordb
from tensordb.driver.engine import cluster_target
from tensordb.exec.contract import Capabilities

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")

Q = "C[i,k] = SUM(A[i,j] * B[j,k])"


@contextmanager
def cluster_db(tmp_path, name, cluster=None, **options):
    """A connection to ``cluster``, or to a LocalCluster of 2 workers made with ``options``."""
    from tensordb.exec.dask import local_cluster
    if cluster is not None:
        with tensordb.connect(tmp_path / name, memory_limit="8GB",
                              executor=f"dask://{cluster.scheduler_address}") as con:
            yield con
        return
    with local_cluster(2, local_directory=str(tmp_path / f"dask-{name}"), **options) as c:
        with cluster_db(tmp_path, name, c) as con:
            yield con


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    """2 workers of 1 thread whose limit leaves 3.5 GiB for tiles (shared by two tests)."""
    from tensordb.exec.dask import local_cluster
    with local_cluster(2, local_directory=str(tmp_path_factory.mktemp("dask-roomy")),
                       memory_limit="4GiB") as c:
        yield c


def explain_json(con, q=Q) -> dict:
    return json.loads(con.explain(q, format="json"))


def calls(data) -> int:
    return math.prod(data["nodes"][0]["pieces"].values())


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(27)
    return rng.standard_normal((512, 384)), rng.standard_normal((384, 512))


def load(con, arrays):
    a, b = arrays
    con.load("A", a, tile=(512, 384))
    con.load("B", b, tile=(384, 512))


def test_the_target_is_what_the_workers_report():
    """The arithmetic: a plan worker per worker thread, each its thread's share of the
    smallest worker's tile memory; without a per-worker limit the connection's is shared."""
    limit, workers, report = cluster_target(Capabilities(3, 8, 600, 2), 10**9)
    assert (workers, limit) == (6, 300 * 6)
    assert dict(report) == {"executor": "dask", "workers": 3, "threads": 2,
                            "memory_per_worker": 600, "plan_workers": 6}
    limit, workers, _ = cluster_target(Capabilities(2, 8, None, 1), 12345)
    assert (workers, limit) == (2, 12345)


def test_a_worker_with_little_memory_gets_smaller_tiles(tmp_path, arrays, roomy):
    """Two workers whose Dask memory limit leaves 512 KiB for tiles, against two that leave
    plenty: the tight cluster's plan has more kernel calls, each within its worker's share
    (EXPLAIN's target and memory projection say so), and both answers are numpy's."""
    from tensordb.exec.dask import PROCESS_ALLOWANCE
    a, b = arrays
    plans = {}
    for name, cluster in [("tight", None), ("roomy", roomy)]:
        with cluster_db(tmp_path, name, cluster,
                        memory_limit=PROCESS_ALLOWANCE + (512 << 10)) as con:
            load(con, arrays)
            data = explain_json(con)
            text = con.explain(Q)
            con.execute(Q)
            np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-10, atol=1e-10)
            caps = con._get_executor().capabilities()
            plans[name] = data, text, caps, con.last_plan
            if name == "tight":  # pieces fixed too few for a worker: refused, naming its limit
                with pytest.raises(tensordb.OutOfMemoryError) as err:
                    con.execute("D[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 1, k 1, j 1)")
                assert "(512.0 KiB: its Dask memory limit less" in str(err.value)
                assert "Dask cluster" in str(err.value) and "--memory-limit" in str(err.value)
                assert not con.store.has("D")
    (tight, ttext, tcaps, tplan), (roomy, _, rcaps, _) = plans["tight"], plans["roomy"]
    assert tcaps.memory_per_worker == 512 << 10
    assert rcaps.memory_per_worker == 4 * 2**30 - PROCESS_ALLOWANCE
    assert tight["target"] == {"executor": "dask", "workers": 2, "threads": 1,
                               "memory_per_worker": 512 << 10, "plan_workers": 2}
    assert "target: dask, 2 workers x 1 thread (2 plan workers), 512.0 KiB of tiles per worker" \
        in ttext
    mem = tight["total"]["memory"]
    assert mem["budget"] == 512 << 10 and mem["fits"] and mem["peak"] <= 512 << 10
    assert calls(tight) > calls(roomy)
    # the output tiles the tight plan made each fit a worker's share
    assert math.prod(tight["nodes"][0]["tile_shape"][l] for l in "ik") * 8 <= 512 << 10
    assert len(tplan.outputs["C"].tiles) == calls(tight)


def test_threads_per_worker_are_plan_workers(tmp_path, arrays, roomy):
    """Workers of 2 threads run 2 tasks at once: the plan is made for 4 workers (EXPLAIN says
    so) and has at least 4 kernel calls, 2 on each worker; with 1 thread, for 2."""
    a, b = arrays
    seen = {}
    for threads in (1, 2):
        with cluster_db(tmp_path, f"t{threads}", roomy if threads == 1 else None,
                        memory_limit="4GiB", threads_per_worker=threads) as con:
            load(con, arrays)
            data = explain_json(con)
            assert data["workers"] == 2 * threads
            assert data["target"]["threads"] == threads
            assert data["target"]["plan_workers"] == 2 * threads
            # each thread's share of its worker's memory
            assert data["total"]["memory"]["budget"] == \
                con._get_executor().capabilities().memory_per_worker // threads
            con.execute(Q)
            np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-10, atol=1e-10)
            run = con._get_executor().last_run
            plan = con.last_plan
            kernels = {t.key for t in plan.tasks if type(t).__name__ == "Kernel"}
            on = {}
            for k in kernels:  # plan worker w runs on addresses[w % 2]
                on.setdefault(run["ran_on"][k], set()).add(plan.task(k).worker)
            seen[threads] = (calls(data), on)
    assert seen[2][0] >= 4 and seen[2][0] > seen[1][0]
    assert all(len(ws) == 2 for ws in seen[2][1].values()) and len(seen[2][1]) == 2
