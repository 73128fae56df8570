"""The replay of a sparse kernel's group that replaces none of its inputs (driver/replay.py): a
reload of its matrix in another format (dense, CSR, COO, much denser or sparser) between calls,
a script whose second statement reads the first's output, EXPLAIN between replays, a GRAD of a
sparse quadratic form, another connection's replace: every call's answer is numpy's on the
densified inputs, and the replay goes on once the inputs settle."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tests.sparse.test_spmv_view_cache import _empty_cache  # noqa: F401 (an autouse fixture)

N = 200


def _graph(seed: int, density: float = 0.05):
    return sp.random_array((N, N), density=density, format="csr",
                           rng=np.random.default_rng(seed))


def _dense(x) -> np.ndarray:
    return x.toarray() if hasattr(x, "toarray") else np.asarray(x)


@pytest.fixture(params=["memory", "disk"])
def con(request, tmp_path):
    c = tensordb.connect(None if request.param == "memory" else tmp_path / "g.tdb", workers=2)
    yield c
    c.close()


def _replays(con) -> int:
    return con.engine.cache.replay.replays


def test_a_reload_in_another_format_is_read_by_the_next_call(con):
    v = np.random.default_rng(0).standard_normal(N)
    con.load("v", v)
    for G in (_graph(1), _dense(_graph(2)), _graph(3, 0.5), _graph(4).tocoo(), _graph(5, 0.001)):
        con.load("G", G, replace=True)
        before = _replays(con)
        for _ in range(3):
            con.execute("w[i] = SUM(G[i,j] * v[j])")
            np.testing.assert_allclose(con.tensor("w"), _dense(G) @ v, rtol=1e-12, atol=1e-12)
        assert _replays(con) >= before + 1  # replayed once the matrix settled
    assert con.execute("CHECK DATABASE").fetchall() == [(None, None, None, None, "ok")]


def test_a_script_whose_second_statement_reads_the_first_output(con):
    G, v = _graph(6), np.random.default_rng(1).standard_normal(N)
    con.load("G", G)
    con.load("v", v)
    for _ in range(3):
        con.execute("w[i] = SUM(G[i,j] * v[j]); u[i] = SUM(G[i,j] * w[j]);")
        w = _dense(G) @ v
        np.testing.assert_allclose(con.tensor("w"), w, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(con.tensor("u"), _dense(G) @ w, rtol=1e-12, atol=1e-12)
    assert _replays(con) >= 1
    for _ in range(3):  # an SpGEMM into C, C then read by another statement
        con.execute("C[i,k] = SUM(G[i,j] * G[j,k])")
        con.execute("z[i] = SUM(C[i,k] * v[k])")
        D = _dense(G)
        np.testing.assert_allclose(_dense(con.tensor("C")), D @ D, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(con.tensor("z"), D @ D @ v, rtol=1e-12, atol=1e-12)


def test_explain_between_replays_changes_nothing(con):
    G, v = _graph(7), np.random.default_rng(2).standard_normal(N)
    con.load("G", G)
    con.load("v", v)
    mv = "w[i] = SUM(G[i,j] * v[j])"
    for _ in range(2):
        con.execute(mv)
    (text,) = con.execute("EXPLAIN " + mv).fetchall()[0]
    assert "EXPLAIN" in text
    (text,) = con.execute("EXPLAIN ANALYZE " + mv).fetchall()[0]
    assert "EXPLAIN ANALYZE" in text
    np.testing.assert_allclose(con.tensor("w"), _dense(G) @ v, rtol=1e-12, atol=1e-12)
    before = _replays(con)
    for _ in range(3):
        con.execute(mv)
        np.testing.assert_allclose(con.tensor("w"), _dense(G) @ v, rtol=1e-12, atol=1e-12)
    assert _replays(con) >= before + 1


def test_a_grad_of_a_sparse_form_follows_its_matrix(con):
    """``L = x' G x`` and its gradient ``(G + G') x``, G reloaded dense then sparse again."""
    x = np.random.default_rng(3).standard_normal(N)
    con.load("x", x)
    for G in (_graph(8), _dense(_graph(9)), _graph(10)):
        con.load("G", G, replace=True)
        D = _dense(G)
        for _ in range(3):
            con.execute("L = SUM(G[i,j] * x[i] * x[j]); gx = GRAD(L, x)")
            np.testing.assert_allclose(float(con.tensor("L")), x @ D @ x, rtol=1e-12)
            np.testing.assert_allclose(con.tensor("gx"), (D + D.T) @ x, rtol=1e-12, atol=1e-12)
    assert _replays(con) >= 3


def test_another_connection_s_replace_ends_the_replay(tmp_path):
    path = tmp_path / "g.tdb"
    v = np.random.default_rng(4).standard_normal(N)
    with tensordb.connect(path, workers=2) as a, tensordb.connect(path, workers=1) as b:
        a.load("G", _graph(11))
        a.load("v", v)
        for k in range(4):
            G = _graph(12 + k, 0.02 * (k + 1))
            if k % 2:
                b.execute("DROP TENSOR G")
                b.load("G", G)
            else:
                b.load("G", G, replace=True)
            for _ in range(3):
                a.execute("w[i] = SUM(G[i,j] * v[j])")
                np.testing.assert_allclose(a.tensor("w"), _dense(G) @ v, rtol=1e-12,
                                           atol=1e-12)
