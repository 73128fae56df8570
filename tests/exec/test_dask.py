"""The Dask executor on a real LocalCluster (2 worker processes on 127.0.0.1): the correctness
corpus against the local pool, placement checked on the workers, scatter, clean-up."""
from __future__ import annotations

import time

import numpy as np
import pytest

import tensordb
from tensordb.physical.plan import Load
from tests.corpus.test_engine_corpus import assert_matches, make_case, oracle

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")

N_SEEDS = 40


@pytest.fixture(scope="module")
def dcon(cluster):
    with tensordb.connect(workers=2, executor=f"dask://{cluster.scheduler_address}") as c:
        yield c


@pytest.fixture(scope="module")
def lcon():
    with tensordb.connect(workers=2) as c:
        yield c


def _run_case(con, seed):
    operands, out, arrays, join, agg, pins, _ = make_case(seed)
    names = []
    for k, (a, tile) in enumerate(arrays):
        names.append(f"in{seed}_{k}")
        con.load(names[-1], a, tile=tile or None, replace=True)
    g = tensordb.Graph().op(f"out{seed}", out, list(zip(names, operands)), join=join, agg=agg,
                            pieces=pins)
    try:
        con.run(g, replace=True)
        return con.tensor(f"out{seed}")
    finally:
        for name in names + [f"out{seed}"]:
            con.drop(name, if_exists=True)


def _outcome(con, seed):
    try:
        return _run_case(con, seed), None
    except tensordb.Error as exc:
        return None, exc


@pytest.mark.parametrize("seed", range(N_SEEDS))
def test_corpus_on_dask_equals_local_pool(dcon, lcon, seed):
    (got, err), (want, local_err) = _outcome(dcon, seed), _outcome(lcon, seed)
    if local_err is not None:  # the executor's contract: the pool's outcome, errors included
        assert type(err) is type(local_err) and str(err) == str(local_err)
        return
    assert err is None, err
    assert got.dtype == want.dtype and got.shape == want.shape
    if np.issubdtype(got.dtype, np.floating):
        # Same plan, same tile functions; only the order partials are summed in may differ.
        tol = 1e-5 if got.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))))
    else:
        np.testing.assert_array_equal(got, want)
    operands, out, arrays, join, agg, _, _ = make_case(seed)
    assert_matches(got, oracle(operands, out, arrays, join, agg), rtol32=1e-4, rtol64=1e-4)


def test_executor_reports_cluster_workers(dcon):
    ex = dcon._get_executor()
    assert ex.workers == 2
    assert ex.addresses() == sorted(ex.client.scheduler_info()["workers"])


def _matmul(con, into="C", pieces=None, **load):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((256, 192)), rng.standard_normal((192, 128))
    con.load("A", a, tile=(64, 64), replace=True, **load)
    con.load("B", b, tile=(64, 64), replace=True, **load)
    result = con.einsum("ij,jk->ik", "A", "B", into=into, replace=True,
                        pieces=pieces or {"i": 4, "j": 3, "k": 2})
    return a @ b, result


def test_every_task_ran_on_its_planned_worker(dcon):
    want, result = _matmul(dcon)
    np.testing.assert_allclose(dcon.tensor("C"), want, atol=1e-9)
    run = dcon._get_executor().last_run
    # ran_on is what each worker process recorded about the tasks it executed itself; a
    # stored tile is read by each worker whose tasks need it (loads_on), from the storage.
    plan = dcon.last_plan
    loads = {t.key for t in plan.tasks if isinstance(t, Load)}
    assert set(run["ran_on"]) | set(run["loads_on"]) == {t.key for t in plan.tasks}
    assert run["ran_on"] == {k: a for k, a in run["planned_on"].items() if k not in loads}
    for k, addrs in run["loads_on"].items():
        readers = {run["planned_on"][t.key] for t in plan.tasks if k in t.inputs}
        assert set(addrs) == readers
    assert set(run["ran_on"].values()) == set(run["addresses"])  # both workers had work
    planned = {t.key: run["addresses"][t.worker % 2] for t in dcon.last_plan.tasks}
    assert run["planned_on"] == planned
    assert result.kernel_calls == dcon.last_plan.kernel_calls
    measured = result.ops[0]  # the run's statistics, returned (the plan is not written into)
    assert measured.kernel_calls == dcon.last_plan.kernel_calls and measured.seconds > 0


def test_plan_for_more_workers_than_the_cluster_has(cluster, lcon):
    from tensordb.exec.dask import DaskExecutor
    from tensordb.bind import bind_graph as bind
    with tensordb.connect(workers=3) as con:  # a plan for 3 workers, run on a 2-worker cluster
        want, _ = _matmul(con, pieces={"i": 3, "j": 1, "k": 1})
        g = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C2", pieces={"i": 3, "j": 1, "k": 1})
        _, plan = con.plan(bind(g, con.store), g.pieces)
        ex = DaskExecutor(f"dask://{cluster.scheduler_address}")
        try:
            result = ex.run(plan, con.store)
        finally:
            ex.close()
        assert {t.worker for t in plan.tasks} == {0, 1, 2}
        run = ex.last_run
        assert run["ran_on"] == {t.key: run["addresses"][t.worker % 2] for t in plan.tasks
                                 if not isinstance(t, Load)}
        tiles = plan.outputs["C2"].tiles
        got = np.concatenate([result.tiles[tiles[c]] for c in sorted(tiles)], axis=0)
        np.testing.assert_allclose(got, want, atol=1e-9)


def test_connection_plans_for_the_cluster_workers(cluster):
    with tensordb.connect(workers=5, executor=f"dask://{cluster.scheduler_address}") as con:
        _matmul(con, pieces={})
        assert con.last_plan.workers == 2


def _moved_reads(plan, stored_too: bool) -> int:
    """The oracle of bytes_moved: every input a task reads that a task on another worker made
    (a Load's tile too, where the worker that loaded it is the only one to hold it)."""
    from tensordb.exec.runtime import planned_bytes
    task = {t.key: t for t in plan.tasks}
    return sum(planned_bytes(plan, task[k]) for t in plan.tasks for k in t.inputs
               if task[k].worker % 2 != t.worker % 2 and
               (stored_too or not isinstance(task[k], Load)))


def test_bytes_moved_mean_the_same_as_on_the_local_pool(dcon, lcon):
    """Measured on both, by one rule: the bytes of tiles a task read that another worker made.
    On the pool a stored tile is loaded by one worker and read by the others; Dask's workers
    each read it from the storage, so only computed tiles move."""
    _, on_dask = _matmul(dcon, pieces={"i": 1, "j": 4, "k": 1})
    _, local = _matmul(lcon, pieces={"i": 1, "j": 4, "k": 1})
    assert local.bytes_moved == _moved_reads(lcon.last_plan, True) > 0
    assert on_dask.bytes_moved == _moved_reads(dcon.last_plan, False) > 0
    assert on_dask.ops[0].bytes_moved == on_dask.bytes_moved


def test_nothing_stays_on_the_workers(dcon):
    _matmul(dcon)
    client = dcon._get_executor().client
    deadline = time.monotonic() + 5
    while True:
        held = client.run(lambda dask_worker: [k for k in dask_worker.data if "tdb-" in str(k)])
        if not any(held.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not any(held.values())


def test_scatter_from_the_client(cluster, lcon):
    spec = f"dask://{cluster.scheduler_address}?scatter=always"
    with tensordb.connect(workers=2, executor=spec) as con:
        want, _ = _matmul(con)
        np.testing.assert_allclose(con.tensor("C"), want, atol=1e-9)
        run = con._get_executor().last_run
        assert run["scattered_bytes"] > 0
        loads = {t.key for t in con.last_plan.tasks if type(t).__name__ == "Load"}
        assert loads and not loads & set(run["ran_on"])  # no Load ran on a worker


@pytest.mark.parametrize("seed", range(0, 40, 8))
def test_corpus_with_scattered_inputs(cluster, lcon, seed):
    spec = f"dask://{cluster.scheduler_address}?scatter=always"
    with tensordb.connect(workers=2, executor=spec) as con:
        (got, err), (want, local_err) = _outcome(con, seed), _outcome(lcon, seed)
    assert (err is None) == (local_err is None), (err, local_err)
    if err is None:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max(initial=0))))


def test_graph_with_temporaries_and_aggregation_tree(dcon, lcon):
    rng = np.random.default_rng(3)
    x, w1, w2 = rng.standard_normal((64, 512)), rng.standard_normal((512, 32)), rng.standard_normal((32, 16))
    for con in (dcon, lcon):
        con.load("X", x, replace=True)
        con.load("W1", w1, replace=True)
        con.load("W2", w2, replace=True)
        g = (tensordb.Graph()
             .einsum("bh,hf->bf", "X", "W1", into="Z", store=False, pieces={"h": 16})
             .einsum("bf,fo->bo", "Z", "W2", into="Y"))
        con.run(g, replace=True)
        assert not con.store.has("Z")
    # 16 partials per output tile: the plan made for Dask combines them as trees of 8.
    stats = dcon.last_plan.stats[0]
    assert (stats.max_fan_in, stats.agg_levels) == (8, 2)
    run = dcon._get_executor().last_run  # every node of the trees ran where it was planned
    tasks = dcon.last_plan.tasks
    assert set(run["ran_on"]) | set(run["loads_on"]) == {t.key for t in tasks}
    assert run["ran_on"] == {t.key: run["planned_on"][t.key] for t in tasks
                             if not isinstance(t, Load)}
    np.testing.assert_allclose(dcon.tensor("Y"), lcon.tensor("Y"), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dcon.tensor("Y"), x @ w1 @ w2, atol=1e-9)


def test_unreachable_scheduler_is_an_operational_error():
    with tensordb.connect(executor="dask://127.0.0.1:1?timeout=1") as con:
        con.load("A", np.eye(2))
        with pytest.raises(tensordb.OperationalError, match="cannot reach the Dask scheduler"):
            con.einsum("ij,jk->ik", "A", "A", into="B")
        assert not con.store.has("B")


def test_cupy_backend_on_workers_without_gpus_says_so(cluster):
    spec = f"dask://{cluster.scheduler_address}?backend=cupy"
    with tensordb.connect(executor=spec) as con:
        con.load("A", np.eye(2))
        with pytest.raises(tensordb.NotSupportedError, match="GPU on every Dask worker"):
            con.einsum("ij,jk->ik", "A", "A", into="B")
        assert not con.store.has("B")


def _golden_files():
    from tests.dialect import test_golden
    return test_golden.FILES


@pytest.mark.parametrize("path", _golden_files(), ids=lambda p: p.stem)
def test_golden_queries_on_dask(cluster, path, tmp_path, monkeypatch):
    """The dialect's golden files (tests/sql/*.test) with every connection on the cluster."""
    from tests.dialect import test_golden
    monkeypatch.chdir(tmp_path)
    spec = f"dask://{cluster.scheduler_address}"
    real = tensordb.connect
    monkeypatch.setattr(tensordb, "connect",
                        lambda *a, **kw: real(*a, **{"workers": 2, "executor": spec, **kw}))
    try:
        test_golden.run_file(path)
    except (Exception, pytest.fail.Exception):
        monkeypatch.setattr(tensordb, "connect", real)
        try:
            test_golden.run_file(path)
        except (Exception, pytest.fail.Exception) as local:
            pytest.skip(f"fails on the local pool too: {str(local).splitlines()[0]}")
        raise


def test_set_executor_and_explain_analyze_in_sql(cluster):
    with tensordb.connect(workers=2) as con:
        con.load("A", np.arange(12.0).reshape(4, 3))
        con.load("B", np.arange(6.0).reshape(3, 2))
        con.execute(f"SET executor = 'dask://{cluster.scheduler_address}'")
        text = con.explain("C[i,k] = SUM(A[i,j] * B[j,k])", analyze=True)
        assert "measured:" in text
        assert con._get_executor().name == "dask" and con._get_executor().last_run["ran_on"]
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_array_equal(con.tensor("C"), np.arange(12.0).reshape(4, 3) @ np.arange(6.0).reshape(3, 2))


def test_progress_is_reported_on_dask(dcon):
    """The CLI's progress with the Dask executor: outputs counted as they finish (and repeated
    while the caller waits, so a plan of a few long tasks shows its bar too), up to the total."""
    A = np.random.default_rng(7).standard_normal((64, 48))
    dcon.load("prog_A", A, tile=(16, 48), replace=True)
    seen = []
    dcon.progress_callback = lambda done, total: seen.append((done, total))
    try:
        dcon.execute("prog_R[i] = SUM(EXP(prog_A[i,j]))")
        np.testing.assert_allclose(dcon.tensor("prog_R"), np.exp(A).sum(axis=1), rtol=1e-12)
    finally:
        dcon.progress_callback = None
        dcon.drop("prog_A")
        dcon.drop("prog_R", if_exists=True)
    total = seen[-1][1]
    assert total >= 1 and seen[-1][0] == total and all(t == total for _, t in seen)
    assert all(0 <= d <= total for d, _ in seen)


def test_a_kernel_failure_is_the_local_pools_error(dcon, lcon):
    """The task's exception is translated on its worker by the shared runtime: the same error
    class and message as the local pool, naming the operation, and nothing stored."""
    errors = []
    for con in (dcon, lcon):
        con.load("PA", np.array([[1, -2], [3, 4]]), replace=True)
        with pytest.raises(tensordb.DataError) as info:
            con.run(tensordb.Graph().op("PP", "ij", [("PA", "ij"), ("PA", "ij")], join="x0 ** x1"))
        assert not con.store.has("PP")
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "of PP[i,j] = " in errors[0]


def _worker_records(dask_worker):
    """What a run of ours left on a worker: its tiles, results or tasks in the worker's state
    (exec/dask_worker.py keeps nothing of a run itself)."""
    return sorted(str(k) for k in [*dask_worker.data, *dask_worker.state.tasks]
                  if str(k).startswith("tdb-"))


def test_failed_runs_leave_no_records_on_the_workers(dcon):
    """A failing kernel's run leaves nothing on any worker: its tiles and tasks go."""
    dcon.load("NegBase", np.arange(1, 7, dtype=np.int64).reshape(2, 3), replace=True)
    dcon.load("NegExp", -np.ones((2, 3), dtype=np.int64), replace=True)
    client = dcon._get_executor().client
    for _ in range(3):
        with pytest.raises(tensordb.Error, match="POW"):
            dcon.execute("NegPow[i,j] = POW(NegBase[i,j], NegExp[i,j])")  # int ** -1
    deadline = time.monotonic() + 5
    while any(left := client.run(_worker_records).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(left), left
    assert not dcon.store.has("NegPow")


def test_payload_files_are_not_recycled_once_workers_map_them(dcon, lcon):
    """A Dask worker process may still map a retired payload file: a connection that runs on a
    cluster deletes retired files (as before) instead of writing new versions into them."""
    for con in (dcon, lcon):
        con.load("R", np.ones((64, 64), np.float32), replace=True)
        for _ in range(3):
            con.execute("R[i,j] = R[i,j] * 2")
        np.testing.assert_array_equal(con.tensor("R"), np.full((64, 64), 8, np.float32))
    assert not dcon.store.spares.enabled and not dcon.store.spares._files
    assert lcon.store.spares.enabled and lcon.store.spares._files


def test_a_result_the_group_replaces_runs_on_dask_as_on_the_pool(dcon, lcon):
    """Dask runs only what the keys it is asked for need: a statement whose result the same
    group replaces (nothing stored reads it) was skipped there, so its error went unseen and
    X was stored, where the local pool refuses the group. Both refuse it now; a group whose
    dead result computes fine stores the same X on both."""
    a = np.arange(1, 7, dtype=np.int64).reshape(2, 3)
    for con in (dcon, lcon):
        con.load("A", a, replace=True)
        con.load("E", -np.ones((2, 3), dtype=np.int64), replace=True)
        con.execute("DROP TENSOR IF EXISTS X")
        with pytest.raises(tensordb.DataError, match="Integers to negative integer powers"):
            con.execute("X[i,j] = POW(A[i,j], E[i,j]); X[i,j] = A[i,j] * 2")
        assert not con.store.has("X")
        con.execute("X[i,j] = A[i,j] + 1; X[i,j] = A[i,j] * 2")
        np.testing.assert_array_equal(con.tensor("X"), a * 2)


def test_sparse_tiles_on_dask_workers(dcon):
    """A sparse matrix's tiles read on the workers (CSR boxes, pickled between them): the
    sparse kernel and the densifying path give the local pool's and numpy's answers."""
    import scipy.sparse as sp
    rng = np.random.default_rng(3)
    m = sp.random(300, 200, density=0.02, random_state=3, format="csr")
    x = rng.standard_normal((200, 5))
    dcon.load("SpG", m, replace=True, tile=(100, 200))
    dcon.load("SpX", x, replace=True)
    dcon.execute("SpY[i,k] = SUM(SpG[i,j] * SpX[j,k]) WITH (PIECES i 2, j 2)")
    assert "spmm" in dcon.explain("SpY[i,k] = SUM(SpG[i,j] * SpX[j,k])")
    np.testing.assert_allclose(dcon.tensor("SpY"), m @ x, rtol=1e-10, atol=1e-12)
    dcon.execute("SpM[i] = MAX(SpG[i,j])")  # densified on the workers
    np.testing.assert_array_equal(dcon.tensor("SpM"), m.toarray().max(axis=1))
