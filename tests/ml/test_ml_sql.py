"""LETs read by plain SQL (session/letsql.py), checked against DuckDB over the same values
stored as a tensor; EXPLAIN ANALYZE of a training step whose gradients are LETs."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb

RNG = np.random.default_rng(4)
A = np.where(RNG.random((5, 3)) < 0.3, 0.0, RNG.normal(size=(5, 3)))


@pytest.fixture
def con(disk_con):
    disk_con.load("A", A)
    return disk_con


def test_a_let_is_a_relation_like_a_tensor(con):
    """The same rows as the tensor the LET's statement would store: its labels as columns,
    one row per nonzero (A holds zeros), the same types."""
    got = con.execute("LET Z[i,k] = A[i,j] * A[k,j] * (A[i,j] > 0); "
                      "SELECT * FROM Z ORDER BY i, k")
    rows, columns = got.fetchall(), got.columns
    con.execute("Zs[i,k] = A[i,j] * A[k,j] * (A[i,j] > 0)")
    want = con.execute("SELECT * FROM Zs ORDER BY i, k")
    assert columns == want.columns == ["i", "k", "value"]
    assert rows == want.fetchall()
    z = np.einsum("ij,kj->ik", A * (A > 0), A)
    assert len(rows) == np.count_nonzero(z)


def test_a_let_is_seen_by_later_calls_with_the_tensors_current_then(con):
    con.execute("LET s = SUM(A[i,j] * A[i,j])")
    assert con.execute("SELECT value FROM s").fetchall() == [(pytest.approx(np.sum(A * A)),)]
    con.execute("A[i,j] = A[i,j] * 2")
    assert con.execute("SELECT value FROM s").fetchall() == [(pytest.approx(4 * np.sum(A * A)),)]
    # a join of a LET with a table, by DuckDB
    con.execute("CREATE TABLE w AS SELECT range AS i, range * 1.5 AS weight FROM range(5)")
    con.execute("LET r[i] = SUM(A[i,j])")
    got = con.execute("SELECT sum(weight * value) FROM r JOIN w USING (i)").fetchall()[0][0]
    np.testing.assert_allclose(got, np.sum((2 * A).sum(1) * np.arange(5) * 1.5))


def test_no_view_is_left_behind(con):
    before = con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall()
    con.execute("LET Z[i,j] = A[i,j] + 1; SELECT count(*) FROM Z")
    con.execute("CREATE TABLE t AS SELECT * FROM Z")  # a copy of its values is fine
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(A.size,)]
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal"
                       ).fetchall() == before
    assert "Z" not in [r[0] for r in con.execute("SHOW TABLES").fetchall()]
    assert not con.store.has("Z")
    with pytest.raises(tensordb.ProgrammingError, match="a view over the LET 'Z' would outlive it"):
        con.execute("CREATE VIEW v AS SELECT * FROM Z")
    con.execute("DROP TENSOR Z")  # forgets the LET: SQL no longer sees it
    with pytest.raises(tensordb.Error, match="Z"):
        con.execute("SELECT * FROM Z")


def test_a_table_of_the_name_hides_the_let(con):
    con.execute("CREATE TABLE q AS SELECT 7 AS value")
    con.execute("LET Q[i] = SUM(A[i,j])")
    assert con.execute("SELECT value FROM q").fetchall() == [(7,)]


def test_explain_analyze_of_a_step_whose_gradients_are_lets(con):
    w = RNG.normal(size=3)
    con.load("W", w)
    text = ("L = SUM(TANH(SUM(A[b,d] * W[d]))); LET g = GRAD(L, W); "
            "W[d] = W[d] - 0.1 * g[d]")
    out = con.explain(text, analyze=True)
    assert out.startswith("EXPLAIN ANALYZE") and "backward g[d]" in out and "measured:" in out
    grad = (1 - np.tanh(A @ w) ** 2) @ A
    np.testing.assert_allclose(con.tensor("W"), w - 0.1 * grad, rtol=1e-12)
    assert "g" not in con.session.lets  # EXPLAIN defines nothing
    # in the dialect: the loss and the gradient LETs, the update explained and run
    out = con.execute("LET L2 = SUM(TANH(SUM(A[b,d] * W[d]))); LET g2 = GRAD(L2, W); "
                      "EXPLAIN ANALYZE W[d] = W[d] - 0.1 * g2[d]").fetchall()[0][0]
    assert out.startswith("EXPLAIN ANALYZE") and "backward g2[d]" in out
    with pytest.raises(tensordb.ProgrammingError, match="EXPLAIN ANALYZE of a LET"):
        con.explain("LET h = GRAD(L, W)", analyze=True)
