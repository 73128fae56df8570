"""Planning that scales (issue 12): lowering keeps an operation's kernel calls as arrays
(``physical.plan.CallBlock``), placement chooses workers on them, and the task objects are made
only when the plan's tasks are read (the executor). EXPLAIN reads placement's totals instead.

The oracles: the call-by-call placement (the greedy that the array placement must equal), the
totals computed from the made tasks (``transfers``, ``worker_flops``, ``len(tasks)``), the
structure of every made task (boxes, shapes, keys), and numpy for every result."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import tensordb
from tensordb import physical
from tensordb.bind import bind_statements
from tensordb.dialect import parse
from tensordb.explain import render
from tensordb.geometry import even_bounds
from tensordb.physical import placement
from tensordb.physical.plan import Aggregate, Assemble, Kernel, Load
from tensordb.plan.scalar import Call, Const, Input, dtype_of

LAYERS = 6


def _mlp(layers: int, pieces: str = "") -> str:
    return "\n".join(f"H{k}[b,f] = RELU(SUM({'X' if k == 0 else f'H{k - 1}'}[b,d] * W{k}[d,f]) "
                     f"+ c{k}[f]){pieces};" for k in range(layers))


@pytest.fixture(scope="module")
def db():
    rng = np.random.default_rng(12)
    con = tensordb.connect()
    con.load("X", rng.standard_normal((512, 16)).astype(np.float32), tile=(8, 16))
    for k in range(LAYERS):
        con.load(f"W{k}", rng.standard_normal((16, 16)).astype(np.float32))
        con.load(f"c{k}", rng.standard_normal((16,)).astype(np.float32))
    a = rng.standard_normal((64, 64))
    keep = np.kron(rng.random((8, 8)) < 0.3, np.ones((8, 8)))
    con.load("A", a, tile=(8, 8))
    con.load("S", a * keep, tile=(8, 8))  # block-sparse: 30% of its tiles stored
    con.load("B", rng.standard_normal((64, 32)), tile=(16, 16))
    yield con
    con.close()


QUERIES = {
    "mlp": _mlp(LAYERS),
    "mlp in pieces": _mlp(LAYERS, " WITH (PIECES b 32)"),  # 32 calls per operation
    "mlp in pieces, d split": _mlp(LAYERS, " WITH (PIECES b 16, d 2)"),
    "aggregated": "C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES j 4, i 2)",
    "sparse": "C[i,k] = SUM(S[i,j] * B[j,k]) WITH (PIECES j 8, i 8)",
    "sparse max": "C[i,k] = MAX(S[i,j] * B[j,k]) WITH (PIECES j 8, i 8)",
    "sparse plus": "C[i,j] = S[i,j] + A[i,j]",
    "re-tiled": "T[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 8, k 2); "
                "D[i] = SUM(T[i,k]) WITH (PIECES i 3, k 3)",
    "scalar": "total[] = SUM(A[i,j]); U[i,j] = A[i,j] * total[]",
}
WORKERS = (1, 3, 16, 64)


def _graph(con, sql):
    binder = bind_statements(con.store, con.session.lets, [(sql, s) for s in parse(sql)])
    return binder.eingraph(), dict(binder.pieces)


def _planned(con, sql, workers):
    con.set("workers", workers)
    graph, pieces = _graph(con, sql)
    con._plan_cache.clear()
    return con.plan(graph, pieces)


def _placed_call_by_call(plan):
    """The same lowered plan placed with every operation's calls one by one (the greedy)."""
    original = placement._Placer._place_where_held
    placement._Placer._place_where_held = lambda *a: False
    try:
        return physical.order(physical.place(plan))
    finally:
        placement._Placer._place_where_held = original


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_placing_on_arrays_is_placing_call_by_call(db, name, workers):
    # One lowered plan placed both ways (DuckDB may give a sparse join's rows in another order
    # each time it runs the join, and with them other keys).
    decomp, _ = _planned(db, QUERIES[name], workers)
    graph, _ = _graph(db, QUERIES[name])
    lowered = physical.lower(graph, decomp, db.store)
    plan = physical.order(physical.place(lowered))
    by_call = _placed_call_by_call(lowered)
    assert [(t.key, t.worker, t) for t in plan.tasks] == [(t.key, t.worker, t) for t in by_call.tasks]
    assert plan.rank == by_call.rank and plan.owner == by_call.owner


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_explains_totals_are_the_made_tasks_totals(db, name, workers):
    """What EXPLAIN reads (placement's counts on the arrays) equals what the tasks say."""
    _, plan = _planned(db, QUERIES[name], workers)
    assert "tasks" not in vars(plan)  # nothing made yet
    counted = (physical.transfers(plan), physical.worker_flops(plan), plan.task_count)
    assert "tasks" not in vars(plan)
    made = dataclasses.replace(plan)  # the same tasks, without placement's counts
    assert "facts" not in vars(made)
    assert counted == (physical.transfers(made), physical.worker_flops(made), len(made.tasks))
    assert sum(counted[1]) == sum(s.flops for s in plan.stats)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_made_tasks_read_the_boxes_of_their_pieces(db, name):
    """Every made task, checked against the operation's pieces: keys are positions in a
    topological order, a Kernel's coords give its tile shapes and the boxes its Loads read,
    an output tile is its one call or the Aggregate of all its calls."""
    decomp, plan = _planned(db, QUERIES[name], 3)
    graph, _ = _graph(db, QUERIES[name])
    lowered = physical.lower(graph, decomp, db.store)
    tasks = lowered.tasks
    assert [t.key for t in tasks] == list(range(len(tasks)))
    by_key = {t.key: t for t in tasks}
    for t in tasks:
        assert all(k < t.key for k in t.inputs)
    calls_of: dict[tuple, list[int]] = {}
    for t in tasks:
        if not isinstance(t, Kernel):
            continue
        op = lowered.ops[t.op]
        assert lowered.owner[t.key] == t.op
        bounds = {l: even_bounds(op.size[l], decomp.pieces(op.output).get(l, 1)) for l in op.labels}
        box = {l: (bounds[l][c], bounds[l][c + 1]) for l, c in zip(op.labels, t.coords)}
        assert t.out_shape == tuple(box[l][1] - box[l][0] for l in op.out_labels)
        extent = math.prod(b - a for a, b in box.values())
        assert t.flops == max(1, op.flops // max(1, math.prod(op.size.values()))) * extent
        for o, arg, shape in zip(op.inputs, t.args, t.arg_shapes):
            assert shape == tuple(box[l][1] - box[l][0] for l in o.labels)
            src = by_key.get(arg)
            if isinstance(src, Load):
                assert src.tensor == o.tensor
                assert (src.starts, src.stops) == (tuple(box[l][0] for l in o.labels),
                                                   tuple(box[l][1] for l in o.labels))
            elif isinstance(src, Assemble):
                assert src.shape == shape
        calls_of.setdefault((t.op, tuple(t.coords[:len(op.out_labels)])), []).append(t.key)
    for index, op in enumerate(lowered.ops):
        out = lowered.outputs[op.output]
        for coords, key in out.tiles.items():
            calls = calls_of[(index, coords)]
            task = by_key[key]
            assert (task.parts == tuple(calls)) if isinstance(task, Aggregate) else [key] == calls


@pytest.mark.parametrize("workers", (1, 16))
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_results_equal_numpy(db, name, workers):
    db.set("workers", workers)
    db.execute(QUERIES[name])
    t = {n: db.tensor(n).astype(np.float64) for n in ("A", "S", "B", "X")}
    if name.startswith("mlp"):
        h = t["X"]
        for k in range(LAYERS):
            h = np.maximum(h @ db.tensor(f"W{k}") + db.tensor(f"c{k}"), 0)
        # float32 through six layers: rounding relative to the largest value
        np.testing.assert_allclose(db.tensor(f"H{LAYERS - 1}"), h, rtol=1e-4,
                                   atol=1e-5 * np.abs(h).max())
        return
    want = {"aggregated": ("C", t["A"] @ t["B"]), "sparse": ("C", t["S"] @ t["B"]),
            "sparse max": ("C", (t["S"][:, :, None] * t["B"][None]).max(1)),
            "sparse plus": ("C", t["S"] + t["A"]), "re-tiled": ("D", (t["A"] @ t["B"]).sum(1)),
            "scalar": ("U", t["A"] * t["A"].sum())}[name]
    np.testing.assert_allclose(db.tensor(want[0]), want[1], rtol=1e-10, atol=1e-10)


def test_explain_of_a_deep_script_makes_no_task(db):
    """EXPLAIN renders from the arrays; running the same plan makes its tasks."""
    decomp, plan = _planned(db, _mlp(LAYERS), 64)
    text = render(decomp, plan)
    assert "tasks" not in vars(plan) and "rank" not in vars(plan)
    assert f"{sum(s.kernel_calls for s in plan.stats)} kernel calls" in text
    assert sum(isinstance(t, Kernel) for t in plan.tasks) == sum(s.kernel_calls for s in plan.stats)
    assert set(plan.rank) == {t.key for t in plan.tasks}


def test_alike_layers_share_one_layout(db):
    decomp, _ = _planned(db, _mlp(LAYERS), 16)
    graph, _ = _graph(db, _mlp(LAYERS))
    blocks = physical.lower(graph, decomp, db.store).columns.blocks
    products = [b for b in blocks[2::2]]  # the products of layers 1.. (layer 0 reads X's tiles)
    assert all(b.coords is products[0].coords for b in products)
    assert not products[0].coords.flags.writeable
    assert len({id(b.args) for b in blocks}) == len(blocks)  # each reads its own tiles


@pytest.mark.parametrize("first", (1, 1.0))
def test_dtype_of_keeps_literals_of_each_type_apart(first):
    """dtype_of is kept per expression text: 1 and 1.0 (equal, and of one hash) differ."""
    for value in (first, 1.0 if first == 1 and isinstance(first, int) else 1):
        expr = Call("*", (Input(0), Const(value)))
        want = (np.ones(1, np.int32) * value).dtype
        assert dtype_of(expr, ["int32"]) == want
        assert dtype_of(expr, ["int32"]) == want
    big = Call("*", (Input(0), Const(2 ** 40)))
    for _ in range(2):  # the refusal NumPy made is raised again when asked again
        with pytest.raises(OverflowError):
            dtype_of(big, ["int32"])
