"""The dynamic program against brute force over every combination of candidate tilings.

On trees (every intermediate consumed once) the DP must find the exact minimum. On DAGs with shared
intermediates it fixes shared producers greedily: it can only be worse than the optimum, and the
gap is measured and reported (``GAPS`` is printed with ``pytest -s``).
"""
from __future__ import annotations

import itertools
import math
import random

import pytest

from tensordb.optimizer import decompose, evaluate
from tensordb.optimizer.candidates import candidates, pieces_per_op
from tensordb.optimizer.cost import as_dict, models_of
from tensordb.plan import scalar
from tensordb.plan.ir import EinGraph, EinOp, Operand, TensorInfo

SIZES = {"a": 4, "b": 96, "c": 2, "d": 512, "e": 64, "f": 1024, "g": 256}
JOINS = ["x0", "relu(x0)", "exp(x0)"]
MAX_COMBOS = 6000


def random_graph(rng: random.Random, n_ops: int, share: bool) -> EinGraph:
    """A random graph of contractions and maps. ``share``: intermediates may be used twice."""
    inputs: dict[str, TensorInfo] = {}
    ops: list[EinOp] = []
    free: list[tuple[str, tuple[str, ...]]] = []       # intermediates not yet consumed
    used: dict[str, int] = {}

    def stored() -> tuple[str, tuple[str, ...]]:
        labels = tuple(rng.sample(sorted(SIZES), rng.randint(1, 2)))
        name = f"S{len(inputs)}"
        inputs[name] = TensorInfo(name, tuple(SIZES[l] for l in labels), "float64")
        return name, labels

    for n in range(n_ops):
        operands = []
        pool = [t for t in free if share or used.get(t[0], 0) == 0]
        for _ in range(rng.choice((1, 2, 2))):
            if pool and rng.random() < 0.7:
                t = rng.choice(pool)
                pool.remove(t)
                operands.append(t)
            else:
                operands.append(stored())
        labels = sorted({l for _, ls in operands for l in ls})
        out = tuple(l for l in labels if rng.random() < 0.6) or (labels[0],)
        name = f"T{n}"
        sizes = {l: SIZES[l] for l in labels}
        if len(operands) == 1:
            join = scalar.parse_join(rng.choice(JOINS))
        else:
            join = scalar.product(2)
        agg = rng.choice(("sum", "max")) if set(labels) - set(out) else "sum"
        ops.append(EinOp(name, out, tuple(Operand(t, ls) for t, ls in operands),
                         tuple(sizes.items()), join, agg, "float64"))
        for t, _ in operands:
            used[t] = used.get(t, 0) + 1
            if not share:
                free[:] = [f for f in free if f[0] != t]
        free.append((name, out))
    sinks = [op.output for op in ops if used.get(op.output, 0) == 0]
    return EinGraph(tuple(inputs.values()), tuple(ops), tuple(sinks))


def brute_force(graph: EinGraph, workers: int) -> float | None:
    models = models_of(graph, workers)
    pins = pieces_per_op(graph, None)
    cands = [candidates(models[op.output], pins.get(op.output)) for op in graph.ops]
    if math.prod(len(c) for c in cands) > MAX_COMBOS:
        return None
    best = math.inf
    for combo in itertools.product(*cands):
        tilings = {op.output: as_dict(models[op.output], d) for op, d in zip(graph.ops, combo)}
        best = min(best, evaluate(graph, tilings, workers, models=models).total)
    return best


def is_tree(graph: EinGraph) -> bool:
    uses: dict[str, int] = {}
    for op in graph.ops:
        for o in op.inputs:
            uses[o.tensor] = uses.get(o.tensor, 0) + 1
    return all(uses.get(op.output, 0) <= 1 for op in graph.ops)


def _graphs(share: bool, count: int, seed: int):
    rng = random.Random(seed)
    made = 0
    while made < count:
        g = random_graph(rng, rng.randint(2, 4), share)
        if share and is_tree(g):
            continue
        if not share:
            assert is_tree(g)
        yield made, g
        made += 1


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_dp_equals_brute_force_on_trees(workers):
    checked = 0
    for n, g in _graphs(False, 40, seed=workers):
        best = brute_force(g, workers)
        if best is None:
            continue
        d = decompose(g, workers)
        got = evaluate(g, d.pieces_by_op, workers).total
        assert got == pytest.approx(best, rel=1e-9), f"graph {n}: {[op.describe() for op in g.ops]}"
        assert d.details["dp_cost"] == pytest.approx(got, rel=1e-9)   # the table is the true cost
        checked += 1
    assert checked >= 20


GAPS: list[float] = []


@pytest.mark.parametrize("workers", [2, 4])
def test_dp_gap_on_dags_with_shared_intermediates(workers):
    gaps = []
    for n, g in _graphs(True, 30, seed=100 + workers):
        best = brute_force(g, workers)
        if best is None:
            continue
        d = decompose(g, workers)
        got = evaluate(g, d.pieces_by_op, workers).total
        assert got >= best * (1 - 1e-9)
        assert d.details["dp_cost"] == pytest.approx(got, rel=1e-9)  # shared ops counted once
        gaps.append(got / best - 1)
    GAPS.extend(gaps)
    assert len(gaps) >= 10
    mean = sum(gaps) / len(gaps)
    print(f"\nshared-intermediate DAGs, p={workers}: {len(gaps)} graphs, "
          f"optimal on {sum(g < 1e-9 for g in gaps)}, mean gap {mean:.2%}, worst {max(gaps):.2%}")
    assert mean < 0.10 and max(gaps) < 0.5


def test_hinted_dp_equals_brute_force_over_hinted_candidates():
    rng = random.Random(7)
    for _ in range(10):
        g = random_graph(rng, 3, False)
        op = g.ops[-1]
        hints = {op.output: {op.labels[0]: 2}}
        d = decompose(g, 4, pieces=hints)
        assert d.pieces(op.output)[op.labels[0]] == min(2, op.size[op.labels[0]])
        models = models_of(g, 4)
        pins = pieces_per_op(g, hints)
        cands = [candidates(models[o.output], pins.get(o.output)) for o in g.ops]
        best = min(evaluate(g, {o.output: as_dict(models[o.output], c) for o, c in zip(g.ops, combo)},
                            4, models=models).total for combo in itertools.product(*cands))
        assert evaluate(g, d.pieces_by_op, 4).total == pytest.approx(best, rel=1e-9)
