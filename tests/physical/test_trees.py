"""Aggregation trees (physical/trees.py): made when planning, at the fan-in the executor states
(``executor.max_fan_in``); the local pool states none and its plans keep one aggregation per
output tile. Results are checked against numpy; the Dask side is in tests/exec/test_dask.py."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tensordb
from tensordb.exec import EXECUTORS, LocalExecutor
from tensordb.physical import aggregation_trees
from tensordb.physical.plan import Aggregate
from tensordb.bind import bind_graph as bind

RNG = np.random.default_rng(11)


def _run(plan, workers):
    ex = LocalExecutor(workers)
    try:
        return ex.run(plan)
    finally:
        ex.close()


def _wide_matmul(con, parts=20):
    """Y = X @ W with j in ``parts`` pieces: one aggregation of ``parts`` partials per tile."""
    x, w = RNG.standard_normal((8, 2 * parts)), RNG.standard_normal((2 * parts, 6))
    con.load("X", x, tile=(8, 2), replace=True)
    con.load("W", w, tile=(2, 6), replace=True)
    g = tensordb.Graph().einsum("ij,jk->ik", "X", "W", into="Y",
                                pieces={"i": 1, "j": parts, "k": 1})
    return x, w, g


def _inner(tree, plan) -> set[int]:
    return {t.key for t in tree.tasks} - {t.key for t in plan.tasks}


def test_aggregation_trees_keep_the_result_and_the_root(con):
    x, w, g = _wide_matmul(con)
    _, plan = con.plan(bind(g, con.store), g.pieces)
    (root,) = [t for t in plan.tasks if isinstance(t, Aggregate)]
    assert len(root.parts) == 20 and plan.stats[0].agg_levels == 1
    tree = aggregation_trees(plan, 8)
    inner = _inner(tree, plan)
    aggs = [t for t in tree.tasks if isinstance(t, Aggregate)]
    # 20 partials -> 3 nodes of at most 8 -> the root combines those 3
    assert len(inner) == 3 and {len(tree.task(k).parts) for k in inner} == {8, 4}
    assert tree.task(root.key).parts == tuple(sorted(inner))
    assert all(len(t.parts) <= 8 and t.worker == root.worker for t in aggs)
    assert all(tree.owner[k] == plan.owner[root.key] for k in inner)
    assert not any(tree.task(k).fill_zero for k in inner)
    assert sorted(p for k in inner for p in tree.task(k).parts) == sorted(root.parts)
    pos = {t.key: i for i, t in enumerate(tree.tasks)}
    assert all(pos[k] < pos[t.key] for t in tree.tasks for k in t.inputs)  # still topological
    # The plan's statistics say what the tree is; the plan it came from is unchanged.
    assert (tree.stats[0].max_fan_in, tree.stats[0].agg_levels) == (8, 2)
    assert (plan.stats[0].max_fan_in, plan.stats[0].agg_levels) == (20, 1)
    assert tree.stats[0].kernel_calls == plan.stats[0].kernel_calls
    assert aggregation_trees(plan, 20) is plan and aggregation_trees(plan, None) is plan
    for p in (plan, tree):
        got = _run(p, workers=2)
        np.testing.assert_allclose(got.tiles[root.key], x @ w, rtol=1e-10)
        assert got.kernel_calls == 20


@pytest.mark.parametrize("fan_in", [2, 3, 5])
def test_deep_trees_combine_every_partial_once(con, fan_in):
    x, w, g = _wide_matmul(con, parts=23)
    _, plan = con.plan(bind(g, con.store), g.pieces)
    (root,) = [t for t in plan.tasks if isinstance(t, Aggregate)]
    tree = aggregation_trees(plan, fan_in)
    levels = math.ceil(math.log(23) / math.log(fan_in) - 1e-9)  # fan_in ** levels >= 23
    assert tree.stats[0].agg_levels == levels and tree.stats[0].max_fan_in == fan_in
    aggs = {t.key: t for t in tree.tasks if isinstance(t, Aggregate)}
    assert all(len(a.parts) <= fan_in for a in aggs.values())
    # Every kernel call's partial reaches the root through exactly one path.
    read = [k for a in aggs.values() for k in a.parts if k not in aggs]
    assert sorted(read) == sorted(root.parts)
    got = _run(tree, workers=2)
    np.testing.assert_allclose(got.tiles[root.key], x @ w, rtol=1e-10)


def test_aggregation_trees_keep_the_plans_kernel_choices_and_skipped_zeros(con):
    """MIN over partials some of which were skipped: the root (only) takes the 0 in."""
    a = RNG.standard_normal((8, 64)) + 5.0
    b = RNG.standard_normal((64, 32)) + 5.0
    a[:, 16:] = 0.0  # absent tiles: those calls are skipped, their partials are certainly 0
    con.load("A", a, tile=(8, 4))
    con.load("B", b, tile=(4, 32))
    g = tensordb.Graph().einsum("ij,jl->i", "A", "B", into="P", agg="min",
                                pieces={"i": 1, "j": 16, "l": 1})
    _, plan = con.plan(bind(g, con.store), g.pieces)
    (root,) = [t for t in plan.tasks if isinstance(t, Aggregate)]
    assert root.fill_zero and len(root.parts) == 4
    tree = aggregation_trees(plan, 2)
    assert _inner(tree, plan) and tree.kernels == plan.kernels
    assert [k for k in _inner(tree, plan) if tree.task(k).fill_zero] == []
    assert tree.task(root.key).fill_zero
    got = _run(tree, workers=2)
    want = (a[:, :, None] * b[None, :, :]).min(axis=(1, 2))  # numpy over the whole join
    np.testing.assert_allclose(got.tiles[root.key], want, rtol=1e-12)


def test_a_fan_in_below_two_is_refused(con):
    _, _, g = _wide_matmul(con, parts=4)
    _, plan = con.plan(bind(g, con.store), g.pieces)
    with pytest.raises(ValueError, match="at least 2"):
        aggregation_trees(plan, 1)


class _NarrowPool(LocalExecutor):
    """The local pool, stating a fan-in as an executor whose tasks combine all inputs does."""

    name = "narrow"
    max_fan_in = 4


@pytest.fixture
def narrow(monkeypatch):
    monkeypatch.setitem(EXECUTORS, "narrow", lambda spec, workers, **kw: _NarrowPool(workers, **kw))
    with tensordb.connect(workers=2, executor="narrow") as c:
        yield c


def test_the_executors_fan_in_shapes_the_plan(narrow, con, capsys, monkeypatch):
    x, w, g = _wide_matmul(narrow)
    _wide_matmul(con)
    _, local = con.plan(bind(g, con.store), g.pieces)  # the local pool states no fan-in
    assert getattr(con._get_executor(), "max_fan_in", None) is None
    assert max(len(t.parts) for t in local.tasks if isinstance(t, Aggregate)) == 20
    monkeypatch.setenv("TENSORDB_DEBUG", "3")
    _, plan = narrow.plan(bind(g, narrow.store), g.pieces)
    monkeypatch.delenv("TENSORDB_DEBUG")
    aggs = [t for t in plan.tasks if isinstance(t, Aggregate)]
    # 20 partials -> 5 nodes -> one node of 4 and the lone fifth -> the root of those 2
    assert len(aggs) == 5 + 1 + 1 and all(len(t.parts) <= 4 for t in aggs)
    # The debug task list (=3) shows every node of the tree, on the root's worker.
    listed = capsys.readouterr().err
    for t in aggs:
        assert any(line.split()[:2] == [str(t.key), f"w{t.worker}"] and "Aggregate(" in line
                   for line in listed.splitlines()), t
    data = json.loads(narrow.explain(g, format="json"))
    assert data["nodes"][0]["fan_in"] == 4 and data["nodes"][0]["aggregation_levels"] == 3
    assert data["total"]["tasks"] == len(plan.tasks)
    assert "4 (3 levels)" in narrow.explain(g)
    local_data = json.loads(con.explain(g, format="json"))
    assert local_data["nodes"][0]["fan_in"] == 20
    assert local_data["nodes"][0]["aggregation_levels"] == 1
    narrow.run(g)
    assert narrow.last_plan.stats[0].agg_levels == 3
    np.testing.assert_allclose(narrow.tensor("Y"), x @ w, rtol=1e-10)


def test_planning_reads_the_fan_in_without_making_an_executor(con, narrow):
    """The local pool's fan-in and the Dask executor's are their classes': planning (EXPLAIN,
    con.plan) makes no executor to learn it. One registered by others is asked itself."""
    from tensordb.exec import max_fan_in
    from tensordb.exec.dask import DaskExecutor
    _, _, g = _wide_matmul(con)
    assert con._executor is None
    _, plan = con.plan(bind(g, con.store), g.pieces)
    assert "20 kernel calls" in con.explain(g)
    assert con._executor is None
    assert max(len(t.parts) for t in plan.tasks if isinstance(t, Aggregate)) == 20
    made = []
    assert max_fan_in("local", made.append) is None and max_fan_in("gpu", made.append) is None
    assert max_fan_in("dask://10.0.0.5:8786", made.append) == DaskExecutor.max_fan_in == 8
    assert made == []
    assert max_fan_in("narrow", lambda: _NarrowPool(2)) == 4
