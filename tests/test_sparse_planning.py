"""Planning knows sparsity: the cost model, flops and EXPLAIN read the catalog's nnz and payload
bytes of sparse stored inputs (optimizer/cost.py ``StoredStats``), checked against scipy's own
counts of the matrices loaded and the results against numpy on the dense arrays."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb


def _graph(n=3000, density=1e-3, seed=0, dtype=np.float64):
    return sp.random(n, n, density=density, format="csr", dtype=dtype, random_state=seed)


@pytest.fixture
def con():
    with tensordb.connect(workers=2) as c:
        yield c


def test_spmm_is_priced_by_nnz_and_explain_shows_formats(con):
    G = _graph()
    X = np.random.default_rng(1).standard_normal((G.shape[1], 7))
    con.load("G", G)
    con.load("X", X)
    sql = "Y[i,k] = SUM(G[i,j] * X[j,k])"
    data = json.loads(con.explain(sql, format="json"))
    node = data["nodes"][0]
    assert node["kernel"]["method"] == "spmm"
    ins = {i["tensor"]: i for i in node["inputs"]}
    payload = con.execute("SELECT sum(nbytes) FROM tensordb.tiles WHERE tensor = 'G'").fetchall()[0][0]
    assert ins["G"]["format"] == "csr" and ins["G"]["nnz"] == G.nnz and ins["G"]["bytes"] == payload
    assert ins["X"]["format"] == "dense" and ins["X"]["nnz"] == np.count_nonzero(X)
    assert node["flops"] == 2 * G.nnz * X.shape[1]          # not 2 * n * n * k
    assert data["total"]["flops"] == node["flops"]
    # the join reads G's payload, not its dense bytes
    assert node["cost"]["join"] < G.shape[0] * G.shape[1] * 8 / 10
    assert node["memory"]["inputs"] < G.shape[0] * G.shape[1] * 8 / 10
    text = con.explain(sql)
    assert f"G csr nnz" in text and "spmm" in text
    con.execute(sql)
    np.testing.assert_allclose(con.tensor("Y"), G.toarray() @ X, rtol=1e-10, atol=1e-10)


def test_spreduce_flops_are_the_nonzeros(con):
    G = _graph(2000, 2e-3, 2)
    con.load("G", G)
    sql = "r[i] = SUM(G[i,j])"
    node = json.loads(con.explain(sql, format="json"))["nodes"][0]
    assert node["kernel"]["method"] == "spreduce"
    assert node["flops"] == G.nnz
    con.execute(sql)
    np.testing.assert_allclose(con.tensor("r"), G.toarray().sum(axis=1), rtol=1e-10)


def test_dense_inputs_keep_dense_pricing(con):
    A = np.random.default_rng(3).standard_normal((40, 30))
    B = np.random.default_rng(4).standard_normal((30, 20))
    con.load("A", A)
    con.load("B", B)
    node = json.loads(con.explain("C[i,k] = SUM(A[i,j] * B[j,k])", format="json"))["nodes"][0]
    assert node["flops"] == 40 * 30 * 20   # the join space: one multiply-add per element
    assert [i["format"] for i in node["inputs"]] == ["dense", "dense"]
    assert [i["nnz"] for i in node["inputs"]] == [np.count_nonzero(A), np.count_nonzero(B)]


def _stored(con, name):
    return con.execute("SELECT format, sum(nnz) FROM tensordb.tiles WHERE tensor = ? GROUP BY format",
                       [name]).fetchall()


@pytest.mark.parametrize("seed", range(3))
def test_spgemm_result_is_stored_sparse_with_its_real_nnz(con, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(300, 900))
    A = _graph(n, 2e-3, seed)
    B = _graph(n, 2e-3, seed + 10)
    con.load("A", A, replace=True)
    con.load("B", B, replace=True)
    sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
    data = json.loads(con.explain(sql, format="json", analyze=True))
    node = data["nodes"][0]
    assert node["kernel"]["method"] == "spmm"
    want = A.toarray() @ B.toarray()
    real = int(np.count_nonzero(want))
    assert node["output_nnz"]["measured"] == real
    # the estimator: independent uniform entries (cost._sparse_out_nnz), by hand
    ps, pd = A.nnz / n / n, B.nnz / n / n
    assert node["output_nnz"]["estimated"] == round(n * n * (1 - (1 - ps * pd) ** n))
    rows = _stored(con, "C")
    assert {f for f, _ in rows} == {"csr"} and sum(k for _, k in rows) == real
    np.testing.assert_allclose(con.tensor("C"), want, rtol=1e-10, atol=1e-12)
    assert "output nnz: C estimated" in con.explain(sql, analyze=True)


def test_spmm_with_a_dense_partner_stays_dense(con):
    G = _graph(400, 5e-3, 7)
    X = np.random.default_rng(8).standard_normal((400, 5))
    con.load("G", G)
    con.load("X", X)
    con.execute("Y[i,k] = SUM(G[i,j] * X[j,k])")
    assert {f for f, _ in _stored(con, "Y")} == {"dense"}
    np.testing.assert_allclose(con.tensor("Y"), G.toarray() @ X, rtol=1e-10, atol=1e-12)
