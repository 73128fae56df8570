"""Parameters in einsum statements (``?``, ``$1``, ``$name``): bound as Python scalars (a
literal's semantics, numpy's dtypes) each time a statement runs, and not part of the plan cache's
key: a learning-rate schedule plans once."""
from __future__ import annotations

import numpy as np
import pytest

from tensordb.errors import ProgrammingError


@pytest.fixture
def con(disk_con):
    """The tests here run on an on-disk database (conftest's ``disk_con``)."""
    return disk_con


def test_a_learning_rate_schedule_plans_once(con):
    rng = np.random.default_rng(0)
    w, g = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    con.load("W", w, tile=(3, 2))
    con.load("G", g)
    misses = None
    for step in range(5):
        lr = 0.5 / (step + 1)
        con.execute("W[i,j] = W[i,j] - $lr * G[i,j]", {"lr": lr})
        w = w - lr * g
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-15)
        stats = con.plan_cache_stats
        if step == 1:  # the first step stored W in the result's tiling: its layout is new
            misses = stats["misses"]
        elif misses is not None:
            assert stats["misses"] == misses, "a new value planned again"
    assert con.plan_cache_stats["hits"] >= 3


def test_positional_parameters_and_dtypes(con):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    con.load("A", a)
    con.execute("B[i,j] = A[i,j] * ? + ?; C[i,j] = A[i,j] * $1 + $2", [3, 2])
    for name in "BC":
        assert con.tensor(name).dtype == np.int32  # a Python int is weak, as a literal
        np.testing.assert_array_equal(con.tensor(name), a * 3 + 2)
    con.execute("D[i,j] = A[i,j] * ?", [np.float32(0.5)])
    assert con.tensor("D").dtype == np.float64  # numpy scalars are used as Python's
    np.testing.assert_array_equal(con.tensor("D"), a * 0.5)
    con.execute("E[i] = SUM(CASE WHEN A[i,j] > $t THEN 1.0 ELSE 0.0 END)", {"t": 2})
    np.testing.assert_array_equal(con.tensor("E"), (a > 2).sum(axis=1) * 1.0)
    con.execute("E[i] = SUM(CASE WHEN A[i,j] > $t THEN 1.0 ELSE 0.0 END)", {"t": 4})
    np.testing.assert_array_equal(con.tensor("E"), (a > 4).sum(axis=1) * 1.0)


def test_parameters_on_absent_tiles(con):
    """A parameter is not known when planning: a call on absent tiles is not skipped for it."""
    a = np.zeros((4, 4))
    a[:2, :2] = 1.0
    con.load("A", a, tile=(2, 2))
    for v in (0.0, 5.0):
        con.execute("B[i,j] = A[i,j] * 2 + $v", {"v": v})
        np.testing.assert_array_equal(con.tensor("B"), a * 2 + v)


def test_parameters_in_a_training_step_with_grad(con):
    rng = np.random.default_rng(1)
    x, y, w = rng.normal(size=(8, 3)), rng.normal(size=8), rng.normal(size=3)
    con.load("X", x)
    con.load("Y", y)
    con.load("W", w)
    step = ("L = MEAN(SQUARE(SUM(X[b,f] * W[f]) - Y[b])) * $scale; g = GRAD(L, W); "
            "W[f] = W[f] - $lr * g[f]")
    for lr in (0.1, 0.2):
        con.execute(step, {"lr": lr, "scale": 2.0})
        grad = 2.0 * 2 * x.T @ (x @ w - y) / 8
        w = w - lr * grad
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12)


def test_parameters_in_a_block(con):
    con.load("A", np.ones(3))
    con.execute("BEGIN")
    con.execute("B[i] = A[i] * ?", [4.0])
    con.execute("COMMIT")
    np.testing.assert_array_equal(con.tensor("B"), np.full(3, 4.0))


@pytest.mark.parametrize("sql, params, message", [
    ("B[i] = A[i] * $lr", None, "parameter \\$lr has no value"),
    ("B[i] = A[i] * $lr", [1], "takes its value from a dict"),
    ("B[i] = A[i] * ?", {"x": 1}, "takes its value from a list"),
    ("B[i] = A[i] * ?", [1, 2], "2 parameter values given for 1"),
    ("B[i] = A[i] * ? * ?", [1], "no value for parameter \\?"),
    ("B[i] = A[i] * ?", ["a"], "parameter \\? is str"),
    ("B[i] = A[i] * 2", [1], "the statements have none"),
])
def test_errors_change_nothing(con, sql, params, message):
    con.load("A", np.ones(3))
    with pytest.raises(ProgrammingError, match=message) as e:
        con.execute(sql, params)
    assert "^" in str(e.value)
    assert "B" not in [t["name"] for t in con.tensors()]


def test_a_parameter_inside_a_factor_the_binder_splits_off(con):
    """``SUM(RELU($s * H[b,f]) * W[f,o])``: the RELU factor becomes a step of its own
    (bind/hoist.py), carrying the parameter with it."""
    rng = np.random.default_rng(3)
    h, w = rng.normal(size=(5, 4)), rng.normal(size=(4, 3))
    con.load("H", h)
    con.load("W", w)
    for s in (0.5, -2.0):
        con.execute("Y[b,o] = SUM(RELU($s * H[b,f]) * W[f,o])", {"s": s})
        np.testing.assert_allclose(con.tensor("Y"), np.maximum(s * h, 0) @ w, rtol=1e-13)
