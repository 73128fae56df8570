"""The Dask executor's fused graph (exec/dask_fuse.py), without a cluster: real plans of real
databases, fused for two pretended workers, then run here task by task as Dask would run them
(each group's function on its inputs' values); the tiles must be numpy's, each plan task must
run exactly once where it was planned (a stored tile read on each worker that needs it), and
the graph must keep the rules the workers rely on: no cycles, one worker per group, a worker
waiting only for what it needs."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.bind import bind_graph as bind
from tensordb.physical.plan import Load

pytest.importorskip("dask")

from tensordb.exec.dask_fuse import Fusion  # noqa: E402
from tensordb.exec.dask_worker import GroupOut  # noqa: E402

ADDRESSES = ["tcp://w0", "tcp://w1"]


def _plan(con, graph):
    _, plan = con.plan(bind(graph, con.store), graph.pieces)
    return plan


def _fuse(plan, scatter: bool = False):
    addr = {t.key: ADDRESSES[t.worker % 2] for t in plan.tasks}
    loads = {t.key for t in plan.tasks if isinstance(t, Load)}
    every = [k for out in plan.outputs.values() if out.stored for k in out.tiles.values()]
    consumed = {k for t in plan.tasks for k in t.inputs} | set(every)
    dead = [t.key for t in plan.tasks if t.key not in consumed]
    scattered = {k: f"scattered-{k}" for k in loads} if scatter else {}
    fused = Fusion(plan, "run0", "numpy", addr, ADDRESSES, set() if scatter else set(ADDRESSES),
                   set() if scatter else loads, scattered, every, {}, dead)
    return fused, addr, scattered


def _execute(fused, plan, scattered):
    """Run the graph here in an order Dask could (a task once all it reads is there)."""
    from tensordb.exec.tasks import run_load
    values = {dk: np.array(run_load(plan.task(k), plan.readers[plan.task(k).tensor]))
              for k, dk in scattered.items()}
    left = dict(fused.graph)
    while left:
        ready = [k for k, t in left.items() if t.dependencies <= values.keys()]
        assert ready, "the graph has a cycle or reads a key it does not have"
        for k in ready:
            values[k] = left.pop(k)(values)
    got = GroupOut()
    for k in fused.gather:
        got.client.update(values[k].client)
        got.take(values[k])
    return got


def _whole(plan, got, name):
    """Output ``name`` put together from the tiles the client gathered."""
    from tensordb.geometry import tile_box
    out = plan.outputs[name]
    whole = np.zeros(out.shape, out.dtype)
    for c, k in out.tiles.items():
        starts, stops = tile_box(out.grid, c)
        whole[tuple(slice(a, b) for a, b in zip(starts, stops))] = got.client[k]
    return whole


def _check_rules(fused, plan, addr, scattered=()):
    """Each group on one worker, its dependencies before it, every plan task run once where it
    was planned (a Load once on each worker whose tasks read it, unless the client scattered
    its tile)."""
    steps = {}
    for dk in fused.groups:
        group = fused.graph[dk].args[2]
        for step in group.steps:
            steps.setdefault(step.task.key, []).append(fused.where[dk])
    for t in plan.tasks:
        if t.key in scattered:
            assert t.key not in steps
        elif isinstance(t, Load):
            readers = {addr[c.key] for c in plan.tasks if t.key in c.inputs}
            assert set(steps[t.key]) == readers and len(steps[t.key]) == len(readers)
        else:
            assert steps[t.key] == [addr[t.key]]
    for dk, task in fused.graph.items():
        for dep in task.dependencies:
            assert dep in fused.graph or dep.startswith("scattered-")


@pytest.fixture
def con():
    with tensordb.connect(workers=2) as c:
        yield c


@pytest.mark.parametrize("scatter", [False, True])
def test_a_split_matmul_fused_gives_numpys_tiles(con, scatter):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((96, 80)), rng.standard_normal((80, 64))
    con.load("A", a, tile=(32, 40))
    con.load("B", b, tile=(40, 32))
    g = tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C",
                                pieces={"i": 3, "j": 2, "k": 2})
    plan = _plan(con, g)
    fused, addr, scattered = _fuse(plan, scatter)
    _check_rules(fused, plan, addr, scattered)
    assert len(fused.groups) < len(plan.tasks) / 3  # a few Dask tasks, not one per tile task
    got = _execute(fused, plan, scattered)
    np.testing.assert_allclose(_whole(plan, got, "C"), a @ b, atol=1e-12)
    # the records: every tile task once, with the bytes another worker made that it read
    rows = {key: (w, moved) for w, records, _, _ in got.records.values()
            for key, _, _, moved in records}
    assert set(rows) == {t.key for t in plan.tasks} - set(scattered)
    task = {t.key: t for t in plan.tasks}
    for key, (w, moved) in rows.items():
        made_elsewhere = [k for k in task[key].inputs
                          if not isinstance(task[k], Load) and addr[k] != addr[key]]
        assert (moved > 0) == bool(made_elsewhere)


def test_a_chain_lets_the_other_worker_start_before_the_stage_ends(con):
    """A 3-matrix chain: the first product's tiles are summed on one worker, which then has a
    second product of its own to compute; the other worker waits only for the sum (a group of
    its own, run first), not for that second product."""
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(s) for s in ((64, 48), (48, 64), (64, 32)))
    for name, x in zip("ABC", (a, b, c)):
        con.load(name, x)
    g = (tensordb.Graph()
         .einsum("ij,jk->ik", "A", "B", into="T", store=False, pieces={"j": 2})
         .einsum("ik,kl->il", "T", "C", into="Y", pieces={"i": 2}))
    plan = _plan(con, g)
    fused, addr, scattered = _fuse(plan)
    _check_rules(fused, plan, addr)
    for dk in fused.groups:
        group = fused.graph[dk].args[2]
        exported = [s for s in group.steps if s.export]
        if fused.priority[dk]:  # waited for by another worker: only what that needs
            needed = {s.task.key for s in exported}
            for s in reversed(group.steps):
                if s.task.key in needed:
                    needed.update(k for i, k in s.args if i < 0)
            assert {s.task.key for s in group.steps} == needed
    assert any(fused.priority.values())
    got = _execute(fused, plan, scattered)
    np.testing.assert_allclose(_whole(plan, got, "Y"), a @ b @ c, atol=1e-10)


def test_a_dead_result_runs_and_outputs_already_finished_are_not_asked_for(con):
    """A statement's result the same group replaces runs (so that its errors are seen); an
    output an earlier attempt finished is left out, with all that only it needed."""
    x = np.arange(12.0).reshape(3, 4)
    con.load("X", x, tile=(1, 4))
    g = (tensordb.Graph().op("D", "ij", [("X", "ij")], join="x0 + 1", store=False,
                             pieces={"i": 3})
         .op("Z", "ij", [("X", "ij")], join="x0 * 2", pieces={"i": 3}))
    plan = _plan(con, g)
    fused, addr, scattered = _fuse(plan)
    got = _execute(fused, plan, scattered)
    ran = {key for _, rows, _, _ in got.records.values() for key, *_ in rows}
    assert ran == {t.key for t in plan.tasks}  # D's tasks ran too: nothing reads them
    np.testing.assert_array_equal(_whole(plan, got, "Z"), x * 2)
    tiles = plan.outputs["Z"].tiles
    assert len(tiles) > 1
    first = next(iter(tiles.values()))
    again = Fusion(plan, "run1", "numpy", addr, ADDRESSES, set(ADDRESSES),
                   {t.key for t in plan.tasks if isinstance(t, Load)}, {},
                   [k for k in tiles.values() if k != first], {}, [])
    steps = {s.task.key for dk in again.groups for s in again.graph[dk].args[2].steps}
    assert first not in steps and steps


def test_a_stored_result_read_again_reaches_the_client_and_the_other_worker(con):
    """C is stored and read by the next statement on both workers: the client gets C's tiles
    by a pick of its own (not the tiles the other worker reads), the other worker only the C
    tiles it reads; both results are numpy's."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((64, 48)), rng.standard_normal((48, 64))
    con.load("A", a)
    con.load("B", b)
    g = (tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": 2})
         .einsum("ik,lk->il", "C", "C", into="G", pieces={"i": 2}))
    plan = _plan(con, g)
    fused, addr, scattered = _fuse(plan)
    _check_rules(fused, plan, addr)
    outs = [k for k in fused.gather if k.endswith("-out")]
    tos = [k for k in fused.graph if "-to" in k]
    assert outs and tos
    for k in outs + tos:  # a pick runs where the group it picks from ran
        (producer,) = fused.graph[k].dependencies
        assert fused.where[k] == fused.where[producer]
    got = _execute(fused, plan, scattered)
    c = a @ b
    np.testing.assert_allclose(_whole(plan, got, "C"), c, atol=1e-12)
    np.testing.assert_allclose(_whole(plan, got, "G"), c @ c.T, atol=1e-10)
