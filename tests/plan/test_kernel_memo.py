"""plan.kernel keeps what the extents and the budget do not steer of each kernel choice, per
operation (by identity): a kept decision gives the very choice a fresh one gives, for every
tile extent and budget, and new facts decide again."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tensordb
from tensordb.plan import kernel
from tensordb.plan.ir import EinOp, Operand
from tensordb.plan.scalar import parse_join

SIZES = {"i": 6, "j": 5, "k": 4}


def _op(join: str, agg="sum", out="ik", dtype="float64"):
    return EinOp("C", tuple(out), (Operand("A", ("i", "j")), Operand("B", ("j", "k"))),
                 tuple(SIZES.items()), parse_join(join), agg, dtype)


OPS = [
    _op("x0 * x1"),                    # matmul
    _op("x0 * x1", out="ki"),          # matmul, operands swapped
    _op("(x0 * x1) * 3"),              # a trailing literal: the 'result' test and its variant
    _op("x0 * x1", out="i"),           # contract
    _op("x0 + x1", agg="min"),         # broadcast by j
    _op("x0 * x1", agg="argmax", out="ik", dtype="int64"),   # a whole label in one call
]
FACTS = [((), (), ()), ((), (True, True), ()), ((), (False, True), ()), ((0,), (True, True), (0.0, 0.0))]
EXTENTS = [None, {"i": 3, "j": 5, "k": 2}, {"i": 1, "j": 1, "k": 4}]
BUDGETS = [None, 1 << 20, 4096]


def _fresh(op, ext, budget, facts):
    kernel._DECIDED.clear()
    return kernel.choose_kernel(op, ext, budget, *facts)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.describe())
def test_a_kept_decision_chooses_as_a_fresh_one(op):
    for facts in FACTS:
        kernel._DECIDED.clear()
        kernel.choose_kernel(op, None, None, *facts)  # kept now
        for ext in EXTENTS:
            for budget in BUDGETS:
                kept = kernel.choose_kernel(op, ext, budget, *facts)
                assert kept == _fresh(op, ext, budget, facts)
                kernel.choose_kernel(op, None, None, *facts)  # kept again for the next


def test_decided_once_per_operation_and_facts(monkeypatch):
    calls = []
    anew = kernel._decide_anew
    monkeypatch.setattr(kernel, "_decide_anew", lambda *a: calls.append(a[0]) or anew(*a))
    kernel._DECIDED.clear()
    op = _op("(x0 * x1) * 3")
    first = kernel.choose_kernel(op, None, None)
    tiled = kernel.choose_kernel(op, {"i": 3, "j": 5, "k": 2}, 4096)
    assert len(calls) == 1
    # the budget still sizes the variant's chunks: 4096 // share // 16 bytes per element
    assert first.fallback.chunk_elements == kernel.CHUNK_ELEMENTS
    assert tiled.fallback.chunk_elements == max(1, 4096 // kernel.TEMPORARY_SHARE
                                                // kernel.element_bytes(op))
    kernel.choose_kernel(op, None, None, (), (True, True))  # other facts: decided again
    assert len(calls) == 2
    same = _op("(x0 * x1) * 3")  # equal, another object: by identity, decided again
    assert same == op and kernel.choose_kernel(same) == first and len(calls) == 3


def test_the_memo_stays_bounded(monkeypatch):
    monkeypatch.setattr(kernel, "_DECIDED_MAX", 4)
    kernel._DECIDED.clear()
    ops = [_op("x0 * x1") for _ in range(10)]
    for op in ops:
        kernel.choose_kernel(op)
        assert len(kernel._DECIDED) <= 4


def _untimed(tree):
    """EXPLAIN's JSON less the optimizer's measured seconds."""
    if isinstance(tree, dict):
        return {k: _untimed(v) for k, v in tree.items() if "seconds" not in k}
    if isinstance(tree, list):
        return [_untimed(v) for v in tree]
    return tree


def test_repeated_plans_compute_as_numpy():
    """Planned twice (the second time from kept decisions, the plan cache emptied), the
    statements give NumPy's answers and the same EXPLAIN."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    sql = ("C[i,k] = SUM(A[i,j] * B[j,k]) * 3; D[i,k] = MIN(A[i,j] + B[j,k]); "
           "E[i] = SUM(A[i,j] * B[j,k])")
    with tensordb.connect(workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        con.set("memory_limit", "64MB")
        texts = []
        for _ in range(2):
            texts.append(_untimed(json.loads(con.explain(sql, format="json"))))
            con.execute(sql)
            np.testing.assert_allclose(con.tensor("C"), 3 * (a @ b), rtol=1e-12)
            np.testing.assert_array_equal(con.tensor("D"), (a[:, :, None] + b[None]).min(axis=1))
            np.testing.assert_allclose(con.tensor("E"), (a @ b).sum(axis=1), rtol=1e-12)
            con._plan_cache.clear(bound=False)
        assert texts[0] == texts[1]
        assert math.isfinite(float(con.tensor("C").sum()))
