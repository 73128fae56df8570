"""Placement: balanced flops, owner computes, aggregation where the partials are, free Loads."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.optimizer import STRATEGIES
from tensordb.physical.placement import place, transfers, worker_flops
from tensordb.physical.plan import Aggregate, Assemble, Kernel, Load, TilePlan
from tensordb.plan.ir import EinOp


def _plan(ops, tasks, workers):
    owner = {}
    for t in tasks:
        if isinstance(t, Kernel):
            owner[t.key] = t.op
    for t in tasks:
        if t.key not in owner:
            owner[t.key] = 0
    return TilePlan(tuple(ops), list(tasks), {}, [], workers, owner)


def _check_well_formed(plan):
    seen = set()
    for t in plan.tasks:
        assert 0 <= t.worker < plan.workers
        assert t.key not in seen
        assert all(k in seen for k in t.inputs), "tasks stay in a topological order"
        seen.add(t.key)


def test_partials_of_one_tile_spread_then_aggregate_where_one_is():
    op = EinOp.contraction("Y", "i", [("A", "ij"), ("B", "j")], {"i": 16, "j": 64})
    loads = [Load(n, "A", (0, 16 * n), (16, 16 * n + 16)) for n in range(4)]
    loads += [Load(4 + n, "B", (16 * n,), (16 * n + 16,)) for n in range(4)]
    kernels = [Kernel(8 + n, 0, (n, 4 + n), ((16, 16), (16,)), (16,), (0, n), 512) for n in range(4)]
    agg = Aggregate(12, "sum", tuple(k.key for k in kernels), (16,), "float64")
    plan = place(_plan([op], loads + kernels + [agg], 4))
    _check_well_formed(plan)
    placed = {t.key: t.worker for t in plan.tasks}
    assert sorted(placed[k.key] for k in kernels) == [0, 1, 2, 3]          # balanced
    assert placed[12] in {placed[k.key] for k in kernels}                   # next to a partial
    moved, per_op = transfers(plan)
    assert moved == 3 * 16 * 8 and per_op == [moved]                        # three partials move
    assert worker_flops(plan) == [512] * 4


def test_owner_computes_along_a_chain():
    """Row tiles of the second operation run where the first produced them: nothing moves."""
    a = EinOp.contraction("H", "ij", [("X", "ij")], {"i": 64, "j": 8})
    b = EinOp.contraction("Y", "i", [("H", "ij")], {"i": 64, "j": 8})
    tasks = [Load(n, "X", (16 * n, 0), (16 * n + 16, 8)) for n in range(4)]
    tasks += [Kernel(4 + n, 0, (n,), ((16, 8),), (16, 8), (n, 0), 128) for n in range(4)]
    # the consumer's kernels are listed in reverse, so plain round-robin would cross workers
    tasks += [Kernel(8 + n, 1, (4 + 3 - n,), ((16, 8),), (16,), (3 - n, 0), 128) for n in range(4)]
    plan = place(_plan([a, b], tasks, 4))
    _check_well_formed(plan)
    assert transfers(plan)[0] == 0
    assert sorted(worker_flops(plan)) == [256] * 4


def test_loads_are_copied_to_each_consuming_worker():
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 32, "j": 8, "k": 8})
    tasks = [Load(0, "B", (0, 0), (8, 8))]
    tasks += [Load(1 + n, "A", (8 * n, 0), (8 * n + 8, 8)) for n in range(4)]
    tasks += [Kernel(5 + n, 0, (1 + n, 0), ((8, 8), (8, 8)), (8, 8), (n, 0, 0), 1024)
              for n in range(4)]
    plan = place(_plan([op], tasks, 4))
    _check_well_formed(plan)
    b_loads = [t for t in plan.tasks if isinstance(t, Load) and t.tensor == "B"]
    assert sorted(t.worker for t in b_loads) == [0, 1, 2, 3]
    assert len({t.key for t in b_loads}) == 4
    assert all(plan.owner[t.key] == 0 for t in b_loads)
    on = {t.key: t.worker for t in plan.tasks}
    for k in plan.tasks:
        if isinstance(k, Kernel):
            assert all(on[a] == k.worker for a in k.inputs)
    assert transfers(plan)[0] == 0


def test_assemble_is_built_where_it_is_consumed():
    a = EinOp.contraction("H", "ij", [("X", "ij")], {"i": 16, "j": 16})
    b = EinOp.contraction("Y", "j", [("H", "ij")], {"i": 16, "j": 16})
    tasks = [Load(n, "X", (8 * n, 0), (8 * n + 8, 16)) for n in range(2)]
    tasks += [Kernel(2 + n, 0, (n,), ((8, 16),), (8, 16), (n, 0), 256) for n in range(2)]
    # re-tile H from row halves to column halves
    tasks += [Assemble(4 + c, (16, 8), "float64",
                       tuple((2 + r, ((0, 8), (8 * c, 8 * c + 8)), ((8 * r, 8 * r + 8), (0, 8)))
                             for r in range(2))) for c in range(2)]
    tasks += [Kernel(6 + c, 1, (4 + c,), ((16, 8),), (8,), (c, 0), 128) for c in range(2)]
    plan = place(_plan([a, b], tasks, 2))
    _check_well_formed(plan)
    on = {t.key: t.worker for t in plan.tasks}
    assert on[4] == on[6] and on[5] == on[7]
    assert transfers(plan)[0] == 2 * 8 * 16 * 8       # each assemble fetches one remote half


def test_balance_beats_locality_when_one_worker_holds_everything():
    op0 = EinOp.contraction("H", "ij", [("X", "ij")], {"i": 8, "j": 8})
    op1 = EinOp.contraction("Y", "ik", [("H", "ij"), ("W", "jk")], {"i": 8, "j": 8, "k": 64})
    tasks = [Load(0, "X", (0, 0), (8, 8)), Kernel(1, 0, (0,), ((8, 8),), (8, 8), (0, 0), 64)]
    tasks += [Load(2 + n, "W", (0, 16 * n), (8, 16 * n + 16)) for n in range(4)]
    tasks += [Kernel(6 + n, 1, (1, 2 + n), ((8, 8), (8, 16)), (8, 16), (0, n, 0), 2048)
              for n in range(4)]
    plan = place(_plan([op0, op1], tasks, 4))
    assert sorted(t.worker for t in plan.tasks if isinstance(t, Kernel) and t.op == 1) == [0, 1, 2, 3]


# -- on the engine -------------------------------------------------------------------------------

@pytest.fixture
def con4():
    with tensordb.connect(workers=4) as c:
        yield c


QUERIES = [
    ("ij,jk->ik", {"A": (96, 64), "B": (64, 80)}),
    ("bij,bjk->bik", {"A": (8, 32, 16), "B": (8, 16, 24)}),
    ("ij,j->i", {"A": (2048, 512), "B": (512,)}),
    ("ij,jk,kl->il", {"A": (64, 256), "B": (256, 32), "C": (32, 128)}),
]


@pytest.mark.parametrize("spec,shapes", QUERIES)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_measured_transfers_equal_the_plan(con4, spec, shapes, strategy):
    rng = np.random.default_rng(1)
    arrays = {n: rng.standard_normal(s) for n, s in shapes.items()}
    for n, a in arrays.items():
        con4.load(n, a)
    con4.set("tiling", strategy)
    res = con4.einsum(spec, *arrays, into="OUT")
    np.testing.assert_allclose(con4.tensor("OUT"), np.einsum(spec, *arrays.values()), rtol=1e-10)
    plan = con4.last_plan
    _check_well_formed(plan)
    planned, per_op = transfers(plan)
    assert res.bytes_moved == planned
    assert [m.bytes_moved for m in res.ops] == per_op  # the run's own statistics, per operation


def test_engine_flops_are_balanced(con4):
    rng = np.random.default_rng(2)
    con4.load("A", rng.standard_normal((512, 256)))
    con4.load("B", rng.standard_normal((256, 512)))
    con4.einsum("ij,jk->ik", "A", "B", into="C")
    per = worker_flops(con4.last_plan)
    assert max(per) <= 1.05 * (sum(per) / len(per))
