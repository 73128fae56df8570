"""Sparse tensors on a Dask cluster (issue 26, item 6): a LocalCluster of 2 worker processes over
a database directory declared shared. The workers read the sparse payloads themselves (no tile
is scattered from the client) and the answers are scipy's / numpy's on the dense arrays: SpMM,
SpGEMM, a min-plus step over a graph of fill +inf, the triangle count."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.physical.plan import Load

pytestmark = pytest.mark.distributed
distributed = pytest.importorskip("distributed")

N = 240  # nodes; tiles of 80: a 3 x 3 grid of sparse tiles, spread over both workers


@pytest.fixture
def con(cluster, tmp_path):
    with tensordb.connect(tmp_path / "db", workers=2, storage="shared",
                          executor=f"dask://{cluster.scheduler_address}") as c:
        yield c


def graph(seed: int, density: float = 0.03) -> sp.csr_matrix:
    g = sp.random(N, N, density=density, random_state=seed, format="csr")
    g.data = np.random.default_rng(seed).uniform(1, 5, g.nnz)
    return g


def read_on_workers(con, name: str) -> None:
    """Every Load of ``name`` ran on a worker, reading the sparse payload itself."""
    ex = con._get_executor()
    run, plan = ex.last_run, con.last_plan
    loads = [t.key for t in plan.tasks if isinstance(t, Load)
             and plan.readers[t.tensor].meta.name == name]
    assert loads and all(run["loads_on"].get(k) for k in loads)
    assert run["scattered_bytes"] == 0
    assert set().union(*(run["loads_on"][k] for k in loads)) <= set(run["addresses"])


def test_spmm_reads_sparse_payloads_on_the_workers(con):
    g = graph(1)
    x = np.random.default_rng(2).standard_normal((N, 16))
    con.load("G", g, tile=(80, 80))
    con.load("X", x, tile=(80, 16))
    assert {e.format for e in con.store.open("G").entries.values()} != {"dense"}
    con.execute("Y[i,k] = SUM(G[i,j] * X[j,k]) WITH (PIECES i 3)")
    np.testing.assert_allclose(con.tensor("Y"), g @ x, rtol=1e-12, atol=1e-12)
    read_on_workers(con, "G")
    run = con._get_executor().last_run
    assert run["gathered_bytes"] == 0 and run["written_by_workers"] == 3  # dense Y: by workers
    assert len(set(run["ran_on"].values())) == 2
    assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"


def test_spgemm_and_explain_analyze(con):
    g = graph(3)
    con.load("G", g, tile=(80, 80))
    text = con.explain("Z[i,k] = SUM(G[i,j] * G[j,k])", analyze=True)
    assert "sparse inputs: G" in text
    np.testing.assert_allclose(con.tensor("Z"), (g @ g).toarray(), rtol=1e-12, atol=1e-12)
    read_on_workers(con, "G")
    data = json.loads(con.explain("Z2[i,k] = SUM(G[i,j] * G[j,k])", format="json"))
    assert data["target"]["executor"] == "dask"


def test_min_plus_with_fill_inf(con):
    """One relaxation step of shortest paths: absent edges are +inf (the fill), kept so."""
    g = graph(5, density=0.05)
    con.load("D", g, tile=(80, 80), fill_value=float("inf"))
    con.execute("P[i,k] = MIN(D[i,j] + D[j,k])")
    d = np.full((N, N), np.inf)
    d[g.nonzero()] = g.data
    want = np.full((N, N), np.inf)
    for j in range(0, N, 40):
        want = np.minimum(want, np.min(d[:, j:j + 40, None] + d[None, j:j + 40, :], axis=1))
    np.testing.assert_array_equal(con.tensor("P"), want)
    read_on_workers(con, "D")
    assert con.execute("CHECK DATABASE").fetchall()[0][-1] == "ok"


def test_triangle_count(con):
    a = graph(7, density=0.08)
    a = ((a + a.T) > 0).astype(np.float64).tolil()
    a.setdiag(0)
    a = sp.csr_matrix(a)
    a.eliminate_zeros()
    con.load("A", a, tile=(80, 80))
    con.execute("T = SUM(A[i,j] * A[j,k] * A[k,i])")
    want = (a @ a).multiply(a).sum()
    assert float(con.tensor("T")) == want > 0
    read_on_workers(con, "A")


def test_an_mf_step_with_gathers_on_the_cluster_is_numpys(con, tmp_path):
    """The gathers' Loads are RowGathers on the Dask workers too (storage/boxes.py), read by
    the sparse scatter-add and the row products there: the local pool's step and numpy's, to
    rounding (partials may arrive in another order)."""
    from tests.sparse.test_gather_rows import STEP, _load, _peer_step, _problem
    problem = _problem(users=200, items=90, nnz=1500, rank=4, seed=2)
    _load(con, *problem)
    con.execute(STEP)
    with tensordb.connect(tmp_path / "local", workers=2) as local:
        _load(local, *problem)
        local.execute(STEP)
        np.testing.assert_allclose(con.tensor("U"), local.tensor("U"), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(con.tensor("V"), local.tensor("V"), rtol=1e-13, atol=1e-15)
    U, V = _peer_step(*problem)
    np.testing.assert_allclose(con.tensor("U"), U, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(con.tensor("V"), V, rtol=1e-13, atol=1e-15)
