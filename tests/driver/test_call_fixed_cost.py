"""A repeated call pays only for its work (issue 29): what a call keeps from the last one, and
that everything it keeps is dropped when what it was made from changes.

- the store keeps the reader of a current version (and of a slice of it) between calls, and
  lets it go when the version is replaced, dropped or rolled back: a replaced payload file is
  not held mapped by it (the spare files stay reusable, tests/storage/test_spares.py);
- a bound group is recognised by the very catalog entries it read; an entry replaced by a new
  version of another shape or dtype binds again;
- parameters: where they sit is found once per text, and the same values give the statements
  bound before; other values (0.0 against -0.0 too) give their own results;
- the planning target is made once per settings; SET makes it again.
Every result is checked against numpy.
"""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import tensordb
from tensordb.storage.payloads import payload_in_use

STEP = ("LET Z[b,c] = SUM(X[b 0:40, d] * W[d,c]); "
        "L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b 0:40, c] * Z[b,c])); "
        "LET dW = GRAD(L, W); W[d,c] = W[d,c] - $lr * dW[d,c];")


def _data(seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((50, 6))
    y = np.eye(4)[rng.integers(0, 4, 50)]
    return x, y, rng.standard_normal((6, 4)) * 0.1


def _numpy_step(x, y, w, lr):
    x, y = x[:40], y[:40]
    z = x @ w
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(1, keepdims=True)
    loss = np.mean(np.log(s[:, 0]) + m[:, 0] - np.sum(y * z, 1))
    return loss, w - lr * (x.T @ ((e / s - y) / len(z)))


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_training_loop_keeps_its_unchanged_readers_and_lets_the_replaced_go(tmp_path, where):
    x, y, w = _data()
    con = tensordb.connect(None if where == "memory" else tmp_path / "t.tdb", workers=2)
    con.load("X", x)
    con.load("Y", y)
    con.load("W", w)
    store = con.store
    old_paths = []
    for k, lr in enumerate([0.5, 0.5, 0.25, 0.25, 0.5]):
        before = store.open_many(["X", "W"])
        con.execute(STEP, {"lr": lr})
        loss, w = _numpy_step(x, y, w, lr)
        assert float(con.tensor("L")) == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12, atol=1e-15)
        after = store.open_many(["X", "W"])
        assert after["X"] is before["X"]  # X kept its version: its reader is kept
        assert after["W"] is not before["W"]  # W is a new version: a new reader
        assert after["W"].meta.version != before["W"].meta.version
        old_paths.append(before["W"].path)
        del before, after
    # the replaced versions' readers are not kept: no payload file of theirs stays mapped
    con.engine.last_plan = con.engine.last_run = None
    gc.collect()
    assert not [p for p in old_paths if p is not None and payload_in_use(p)]
    con.close()


def test_a_kept_reader_is_let_go_by_a_drop_and_by_a_rollback(tmp_path):
    con = tensordb.connect(tmp_path / "t.tdb", workers=1)
    con.load("A", np.arange(12.0).reshape(3, 4))
    first = con.store.open_many(["A"])["A"]
    assert con.store.open_many(["A"])["A"] is first
    np.testing.assert_array_equal(first.to_numpy(), np.arange(12.0).reshape(3, 4))
    path = first.path
    con.execute("DROP TENSOR A;")
    del first
    gc.collect()
    assert not os.path.exists(path) and not payload_in_use(path)
    con.load("A", np.ones((3, 4)))
    kept = con.store.open_many(["A"])["A"]
    with pytest.raises(tensordb.Error):
        con.execute("BEGIN; B[i,j] = A[i,j] * 2; C[i] = SUM(B[i,j] * Q[i,j]); COMMIT;")
    assert not con.store.has("B")
    again = con.store.open_many(["A"])["A"]  # the rollback cleared what was kept
    assert again is not kept and again.meta == kept.meta
    np.testing.assert_array_equal(again.to_numpy(), np.ones((3, 4)))
    con.close()


def test_a_slice_reader_follows_its_base_version():
    con = tensordb.connect(None, workers=1)
    a = np.arange(20.0).reshape(5, 4)
    con.load("A", a)
    con.execute("S[i] = SUM(A[i 1:4, j]);")
    np.testing.assert_array_equal(con.tensor("S"), a[1:4].sum(1))
    a = a * 3 - 1
    con.load("A", a, replace=True)
    con.execute("S[i] = SUM(A[i 1:4, j]);")
    np.testing.assert_array_equal(con.tensor("S"), a[1:4].sum(1))
    con.close()


def test_a_repeated_group_binds_again_when_an_input_changes_shape_or_dtype():
    con = tensordb.connect(None, workers=1)
    text = "B[i] = SUM(A[i,j] * A[i,j]);"
    a = np.arange(6.0).reshape(2, 3)
    for a in (a, a + 1, np.arange(12.0).reshape(4, 3), np.arange(12, dtype=np.float32).reshape(3, 4)):
        con.load("A", a, replace=True)
        con.execute(text)
        got = con.tensor("B")
        assert got.dtype == a.dtype and got.shape == (a.shape[0],)
        np.testing.assert_allclose(got, (a * a).sum(1), rtol=1e-6)
    con.execute("DROP TENSOR A;")
    with pytest.raises(tensordb.ProgrammingError, match="A"):
        con.execute(text)
    con.close()


def test_parameters_each_call_their_own_values():
    con = tensordb.connect(None, workers=1)
    x = np.array([1.5, -2.0, 3.0])
    con.load("x", x)
    text = "y[i] = x[i] * $1 + $2;"
    for a, b in [(2.0, 1.0), (2.0, 1.0), (0.5, -1.0), (0.0, 0.0), (-0.0, 0.0), (3, 4)]:
        con.execute(text, [a, b])
        want = x * a + b
        got = con.tensor("y")
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    con.execute("z[i] = x[i] * $s;", {"s": -0.0})
    np.testing.assert_array_equal(np.signbit(con.tensor("z")), np.signbit(x * -0.0))
    con.execute("z[i] = x[i] * $s;", {"s": 0.0})
    np.testing.assert_array_equal(np.signbit(con.tensor("z")), np.signbit(x * 0.0))
    # the errors are those of a first call, every time
    for _ in range(2):
        with pytest.raises(tensordb.ProgrammingError, match="takes its value from a dict"):
            con.execute("z[i] = x[i] * $s;", [1.0])
        with pytest.raises(tensordb.ProgrammingError, match="no value for parameter"):
            con.execute(text, [1.0])
        with pytest.raises(tensordb.ProgrammingError, match="ints or floats"):
            con.execute(text, [1.0, "2"])
    con.close()


def test_the_target_is_made_again_when_a_setting_changes():
    con = tensordb.connect(None, workers=2)
    con.load("A", np.ones((64, 64)))
    first = con.engine.target()
    assert con.engine.target() is first and first.workers == 2
    con.execute("SET workers = 1;")
    assert con.engine.target().workers == 1
    con.execute("B[i,k] = SUM(A[i,j] * A[j,k]);")
    np.testing.assert_array_equal(con.tensor("B"), np.full((64, 64), 64.0))
    con.close()


def test_a_failed_unit_of_einsum_statements_restores_the_lets_and_leaves_the_settings():
    con = tensordb.connect(None, workers=2)
    con.load("A", np.arange(4.0))
    con.execute("LET T[i] = A[i] * 2;")
    with pytest.raises(tensordb.Error):
        con.execute("LET U[i] = A[i] + 1; B[i] = T[i] + U[i]; C[i] = B[i] * Q[i];")
    assert "u" not in con.session.lets and "t" in con.session.lets
    assert not con.store.has("B") and con.settings.workers == 2
    con.execute("B[i] = T[i] + 1;")
    np.testing.assert_array_equal(con.tensor("B"), np.arange(4.0) * 2 + 1)
    con.close()
