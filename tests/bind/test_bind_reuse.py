"""A repeated group of statements is bound once (tensordb/driver/cache.py): a training step does not derive
its backward pass again. Checked on a real catalog against numpy: the reused binding gives the
same weights as numpy's steps; a tensor that changes shape, dtype or finiteness, a LET defined
anew, a dropped tensor, all bind again (or fail with the binder's error, changing nothing)."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb

STEP = ("LET H[b,h] = RELU(SUM(X[b,f] * W[f,h])); "
        "L = SUM(H[b,h] * H[b,h]) / 8; LET dW = GRAD(L, W); "
        "W[f,h] = W[f,h] - 0.01 * dW[f,h];")


def numpy_step(x, w):
    pre = x @ w
    h = np.maximum(pre, 0)
    loss = np.sum(h * h) / 8
    dw = x.T @ (2 * h / 8 * (pre > 0))
    return loss, w - 0.01 * dw


@pytest.fixture
def con(tmp_path):
    rng = np.random.default_rng(11)
    with tensordb.connect(tmp_path / "db", workers=2) as c:
        c.load("X", rng.standard_normal((8, 6)))
        c.load("W", rng.standard_normal((6, 4)))
        yield c


def test_repeated_steps_reuse_their_binding_and_track_numpy(con):
    x = con.tensor("X")
    for k in range(4):
        w = con.tensor("W")
        hits = con.engine.cache.bound_hits
        con.execute(STEP)
        loss, w_np = numpy_step(x, w)
        np.testing.assert_allclose(con.tensor("W"), w_np, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(con.tensor("L"), loss, rtol=1e-12)
        # the first step defines the LETs, the second binds from them; then every step reuses
        assert con.engine.cache.bound_hits == hits + (k >= 2)
    # the LETs a reused binding defines are the step's own, and usable afterwards
    con.execute("Hv[b,h] = H[b,h]")
    np.testing.assert_allclose(con.tensor("Hv"), np.maximum(x @ con.tensor("W"), 0), rtol=1e-12)


def test_a_tensor_of_another_shape_binds_again(con):
    for _ in range(3):
        con.execute(STEP)
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((8, 5)), rng.standard_normal((5, 3))
    con.load("X", x, replace=True)
    con.load("W", w, replace=True)
    hits = con.engine.cache.bound_hits
    con.execute(STEP)
    assert con.engine.cache.bound_hits == hits
    np.testing.assert_allclose(con.tensor("W"), numpy_step(x, w)[1], rtol=1e-12, atol=1e-12)


def test_a_shape_that_no_longer_fits_is_the_binders_error_and_changes_nothing(con):
    for _ in range(3):
        con.execute(STEP)
    w = con.tensor("W")
    version = con.store.meta("W").version
    con.load("X", np.ones((8, 7)), replace=True)  # f is 7 in X, 6 in W
    with pytest.raises(tensordb.Error, match="f") as info:
        con.execute(STEP)
    assert "^" in str(info.value)
    assert con.store.meta("W").version == version
    np.testing.assert_array_equal(con.tensor("W"), w)


def test_another_dtype_binds_again(con):
    for _ in range(3):
        con.execute(STEP)
    x, w = con.tensor("X").astype(np.float32), con.tensor("W").astype(np.float32)
    con.load("X", x, replace=True)
    con.load("W", w, replace=True)
    con.execute(STEP)
    assert con.tensor("W").dtype == np.float32
    np.testing.assert_allclose(con.tensor("W"), numpy_step(x, w)[1], rtol=1e-5, atol=1e-6)


def test_a_nan_appearing_in_an_input_binds_again(con):
    """Whether a stored tensor may hold NaN or inf is part of what binding reads (how a product
    of several tensors is split): a repeat over an input that gained a NaN binds again."""
    text = "P[i,k] = SUM(X[i,j] * W[j,k] * W[j,k])"
    for _ in range(3):
        con.execute(text)
    hits = con.engine.cache.bound_hits
    x = con.tensor("X")
    x[0, 0] = np.nan
    con.load("X", x, replace=True)
    con.execute(text)
    assert con.engine.cache.bound_hits == hits
    w = con.tensor("W")
    np.testing.assert_allclose(con.tensor("P"), x @ (w * w), rtol=1e-12, equal_nan=True)
    con.execute(text)  # the same facts again: reused
    assert con.engine.cache.bound_hits == hits + 1


def test_a_let_defined_anew_binds_again(con):
    con.execute("LET S[f,h] = W[f,h] * 2")
    text = "Q[f,h] = S[f,h] + 1"
    for _ in range(3):
        con.execute(text)
    con.execute("LET S[f,h] = W[f,h] * 3")
    hits = con.engine.cache.bound_hits
    con.execute(text)
    assert con.engine.cache.bound_hits == hits
    np.testing.assert_allclose(con.tensor("Q"), con.tensor("W") * 3 + 1, rtol=1e-12)


def test_a_dropped_input_is_the_binders_error(con):
    text = "Q[f,h] = W[f,h] + 1"
    for _ in range(3):
        con.execute(text)
    con.drop("W")
    with pytest.raises(tensordb.Error, match="'W'"):
        con.execute(text)
    con.load("W", np.ones((2, 2)))
    con.execute(text)
    np.testing.assert_array_equal(con.tensor("Q"), np.full((2, 2), 2.0))


def test_each_catalog_answer_is_kept_once_and_a_change_in_any_is_seen(con):
    """A script that names the same tensors in many statements keeps one answer per question
    (what a repeat checks again), and a change to one of them still binds it again: W from
    float64 to float32, against numpy."""
    text = " ".join(f"LET A{i}[b,h] = SUM(X[b,f] * W[f,h]) + {i};" for i in range(20)) + \
        " P[b,h] = A19[b,h] * A3[b,h] + SUM(X[b,f] * W[f,h]);"
    con.execute(text)
    con.execute(text)  # P exists now: bound again, with that answer
    answers = list(con.engine.cache._bound.values())[-1].answers  # the binding kept last
    # X and W named 42 times, the 21 names each looked for once: one answer per question
    assert len(answers) == len({(q, name) for q, name, _ in answers}) <= 30
    hits = con.engine.cache.bound_hits
    con.execute(text)
    assert con.engine.cache.bound_hits == hits + 1
    x, w = con.tensor("X"), con.tensor("W").astype(np.float32)
    con.load("W", w, replace=True)
    con.execute(text)
    assert con.engine.cache.bound_hits == hits + 1 and con.tensor("P").dtype == np.float64
    want = (x @ w + 19) * (x @ w + 3) + x @ w
    np.testing.assert_allclose(con.tensor("P"), want, rtol=1e-5)


def test_explaining_a_let_and_running_it_do_not_reuse_each_others_binding():
    """EXPLAIN binds a LET's text as an assignment (it shows how the value would be computed);
    the bound group of one must not stand in for the other. Once: EXPLAIN then the LET raised
    a bare KeyError, and the LET then EXPLAIN an AttributeError."""
    a = np.arange(4.0)
    q = "LET T[i] = A[i] * 2"
    with tensordb.connect(None, workers=2) as con:
        con.load("A", a)
        assert "T[i] = A[i] * 2" in con.explain(q)
        con.execute(q)
        con.execute("C[i] = T[i] + 1")
        np.testing.assert_array_equal(con.tensor("C"), a * 2 + 1)
        assert not con.store.has("T")
    with tensordb.connect(None, workers=2) as con:
        con.load("A", a)
        con.execute(q)
        con.execute("DROP TENSOR T")
        assert "T[i] = A[i] * 2" in con.explain(q)
        con.execute(q)
        con.execute("C[i] = T[i] * 3")
        np.testing.assert_array_equal(con.tensor("C"), a * 6)
