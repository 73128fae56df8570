"""Sparse intermediates (issue 26, items 3 and 5): a result that a sparse kernel returns as CSR
tiles is planned as a sparse input of the operations that read it (its estimated nonzeros in the
cost model and memory projection, the sparse kernels chosen for it) and handed to them as CSR
tiles by the pool, the fast path and Dask. The matrix form of the matrix-factorisation loss and
its GRADs against autograd and numpy on the densified inputs; chains of SpGEMM results feeding
sparse joins; every dtype of the sparse corpus; empty patterns; EXPLAIN's formats and nnz."""
from __future__ import annotations

import json

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
import scipy.sparse as sp

import tensordb

MF = """LET E[u,i] = M[u,i] * SUM(U[u,r] * V[i,r]) - R[u,i];
L = SUM(E[u,i] * E[u,i]) + 0.01 * (SUM(U[u,r]*U[u,r]) + SUM(V[i,r]*V[i,r]));
dU = GRAD(L, U); dV = GRAD(L, V)"""


def _ratings(users, items, density, seed, dtype="float64"):
    R = sp.random(users, items, density=density, format="csr", random_state=seed)
    R.data = 1.0 + np.floor(R.data * 5)
    R = R.astype(dtype)
    M = R.copy()
    M.data[:] = 1
    return R, M


def _mf_loss(U, V, Rd, Md):
    E = Md * anp.dot(U, V.T) - Rd
    return anp.sum(E * E) + 0.01 * (anp.sum(U * U) + anp.sum(V * V))


def _load_mf(con, R, M, rank, seed, dtype="float64"):
    rng = np.random.default_rng(seed)
    U = (0.5 + 0.1 * rng.standard_normal((R.shape[0], rank))).astype(dtype)
    V = (0.5 + 0.1 * rng.standard_normal((R.shape[1], rank))).astype(dtype)
    for name, value in (("R", R), ("M", M), ("U", U), ("V", V)):
        con.load(name, value)
    return U, V


def _nodes(con, sql):
    return {n["output"]: n for n in json.loads(con.explain(sql, format="json"))["nodes"]}


@pytest.mark.parametrize("fast", [False, True], ids=["pool", "fastpath"])
def test_mf_loss_and_gradients_stay_sparse_and_equal_autograd(fast):
    R, M = _ratings(60, 40, 0.05, 1)
    with tensordb.connect(workers=2) as con:
        con.engine.executor().fast_path = fast
        U, V = _load_mf(con, R, M, 5, 2)
        nodes = _nodes(con, MF)
        con.execute(MF)
        Rd, Md = R.toarray(), M.toarray()
        np.testing.assert_allclose(con.tensor("L"), _mf_loss(U, V, Rd, Md), rtol=1e-12)
        np.testing.assert_allclose(con.tensor("dU"), autograd.grad(_mf_loss, 0)(U, V, Rd, Md),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("dV"), autograd.grad(_mf_loss, 1)(U, V, Rd, Md),
                                   rtol=1e-10, atol=1e-12)
        # the closed form: dU = 2 E V + 0.02 U, E = M .* (U V^T) - R (numpy, not autograd)
        E = Md * (U @ V.T) - Rd
        np.testing.assert_allclose(con.tensor("dU"), 2 * E @ V + 0.02 * U, rtol=1e-10)
        if fast:
            assert "fastpath" in con.engine.last_plan.memo
    # every users x items operation runs a sparse kernel on CSR tiles; none is dense
    # (E.1: M .* (U V^T), the SDDMM; L.t1.1: E .* E; dL/dE: E + E; dL/dE.t1: dL/dE .* M)
    square = {name: nodes[name] for name in ("E.1", "E", "L.t1.1", "dL/dE", "dL/dE.t1")}
    for name, n in square.items():
        assert n["kernel"]["method"] in ("sddmm", "spjoin"), (name, n["kernel"])
        assert n["output_nnz"]["format"] == "csr", name
        assert n["output_nnz"]["estimated"] <= 2 * R.nnz, name
    methods = {n["kernel"]["method"] for n in nodes.values()}
    assert {"sddmm", "spjoin", "spreduce", "spmm"} <= methods
    # the gradients' products read the sparse residual: SpMM with the dense factor
    grads = [n for name, n in nodes.items() if "#2" in name]
    assert grads and all(n["kernel"]["method"] == "spmm" for n in grads)


def test_mf_projected_memory_holds_no_dense_users_by_items_intermediate():
    R, M = _ratings(400, 300, 0.01, 3)
    with tensordb.connect(workers=2) as con:
        _load_mf(con, R, M, 4, 4)
        plan = json.loads(con.explain(MF, format="json"))
        dense_ui = 400 * 300 * 8
        for n in plan["nodes"]:
            assert n["memory"]["total"] < dense_ui / 4, (n["output"], n["memory"])
        text = con.explain(MF)
        assert "E estimated" in text and "csr tiles from the kernel" in text


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_spgemm_result_feeds_sparse_joins_in_every_dtype(dtype):
    rng = np.random.default_rng(7)
    mats = {}
    for k, name in enumerate("ABC"):
        m = sp.random(90, 90, density=0.03, format="csr", random_state=10 + k)
        m.data = np.round(m.data * 8) + 1
        mats[name] = m.astype(dtype)
    sql = ("LET T[i,k] = SUM(A[i,j] * B[j,k]); D[i,k] = T[i,k] * C[i,k]; "
           "F[i,k] = T[i,k] + C[i,k]; G[i,k] = T[i,k] - A[i,k]")
    with tensordb.connect(workers=2) as con:
        for name, m in mats.items():
            con.load(name, m)
        nodes = _nodes(con, sql)
        con.execute(sql)
        a, b, c = (mats[n].toarray() for n in "ABC")
        t = a @ b
        for name, want in (("D", t * c), ("F", t + c), ("G", t - a)):
            got = con.tensor(name)
            assert got.dtype == want.dtype, name
            np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-12,
                                       err_msg=name)
        # T is SpGEMM's CSR output; each join reads it as a sparse operand
        assert nodes["T"]["output_nnz"]["format"] == "csr"
        for name in "DFG":
            assert nodes[name]["kernel"]["method"] == "spjoin", nodes[name]["kernel"]
        del rng


def test_explain_analyze_shows_sparse_intermediates_estimated_and_measured():
    R, M = _ratings(80, 50, 0.04, 5)
    with tensordb.connect(workers=2) as con:
        _load_mf(con, R, M, 3, 6)
        data = json.loads(con.explain(MF, format="json", analyze=True))
        nodes = {n["output"]: n for n in data["nodes"]}
        # E = M .* (U V^T) - R: its entries are R's (M is R's pattern)
        assert nodes["E"]["output_nnz"]["format"] == "csr"
        assert nodes["E"]["output_nnz"]["measured"] == R.nnz
        assert nodes["E"]["output_nnz"]["estimated"] >= R.nnz  # the union: errs high
        assert nodes["E.1"]["output_nnz"]["measured"] == R.nnz
        text = con.explain(MF, analyze=True)
        assert f"E estimated" in text and f"measured {R.nnz}" in text


def test_empty_patterns_give_numpys_answers():
    R = sp.csr_array((30, 20))
    M = sp.csr_array((30, 20))
    with tensordb.connect(workers=2) as con:
        U, V = _load_mf(con, R, M, 3, 8)
        con.execute(MF)
        Rd, Md = R.toarray(), M.toarray()
        np.testing.assert_allclose(con.tensor("L"), _mf_loss(U, V, Rd, Md), rtol=1e-12)
        np.testing.assert_allclose(con.tensor("dU"), 0.02 * U, rtol=1e-12)
        np.testing.assert_allclose(con.tensor("dV"), 0.02 * V, rtol=1e-12)
        A = sp.random(40, 40, density=0.05, format="csr", random_state=1)
        con.load("A", A)
        con.load("Z", sp.csr_array((40, 40)))
        con.execute("LET T[i,k] = SUM(A[i,j] * Z[j,k]); D[i,k] = T[i,k] + A[i,k]; "
                    "P[i,k] = T[i,k] * A[i,k]")
        np.testing.assert_array_equal(con.tensor("D"), A.toarray())
        np.testing.assert_array_equal(con.tensor("P"), np.zeros((40, 40)))


def test_a_dense_statement_plans_as_before():
    """Nothing is split or made sparse where no operand is sparse."""
    rng = np.random.default_rng(9)
    with tensordb.connect(workers=2) as con:
        for name, shape in (("M", (30, 20)), ("R", (30, 20)), ("U", (30, 3)), ("V", (20, 3))):
            con.load(name, rng.standard_normal(shape))
        nodes = _nodes(con, MF)
        assert not any("output_nnz" in n for n in nodes.values())
        assert "E.1" not in nodes
        con.execute(MF)
        U, V = con.tensor("U"), con.tensor("V")
        Md, Rd = con.tensor("M"), con.tensor("R")
        np.testing.assert_allclose(con.tensor("dU"), autograd.grad(_mf_loss, 0)(U, V, Rd, Md),
                                   rtol=1e-10)


@pytest.mark.distributed
def test_dask_hands_csr_intermediates_between_operations(tmp_path):
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    R, M = _ratings(60, 40, 0.05, 11)
    with local_cluster(2, local_directory=str(tmp_path / "dask")) as cluster, \
            tensordb.connect(tmp_path / "db", workers=2, storage="shared",
                             executor=f"dask://{cluster.scheduler_address}") as con:
        U, V = _load_mf(con, R, M, 4, 12)
        con.execute(MF)
        Rd, Md = R.toarray(), M.toarray()
        np.testing.assert_allclose(con.tensor("dU"), autograd.grad(_mf_loss, 0)(U, V, Rd, Md),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("dV"), autograd.grad(_mf_loss, 1)(U, V, Rd, Md),
                                   rtol=1e-10, atol=1e-12)


def test_a_re_cut_sparse_intermediate_stays_csr():
    """An Assemble of CSR pieces (a sparse intermediate re-tiled for its consumer) is CSR, equal
    to the dense assembly of the same pieces."""
    from tensordb.exec.tasks import run_assemble
    from tensordb.physical.plan import Assemble
    from tensordb.storage.sparse import is_sparse
    a = sp.random(6, 8, density=0.4, format="csr", random_state=1, dtype=np.float32)
    b = sp.random(6, 8, density=0.4, format="csr", random_state=2, dtype=np.float32)
    # rows 3..6 of tile a at the top, rows 0..2 of tile b below, columns 2..7 of each
    task = Assemble(0, (5, 5), "float32", ((1, ((3, 6), (2, 7)), ((0, 3), (0, 5))),
                                           (2, ((0, 2), (2, 7)), ((3, 5), (0, 5)))))
    got = run_assemble(task, [a, b])
    assert is_sparse(got) and got.format == "csr" and got.has_canonical_format
    want = run_assemble(task, [a.toarray(), b.toarray()])
    np.testing.assert_array_equal(got.toarray(), want)
    assert got.dtype == want.dtype


def test_min_plus_steps_read_an_earlier_min_plus_result_sparse_with_its_fill():
    """A min-plus product's CSR output (fill +inf) is a sparse operand of fill +inf for the
    min-plus products after it: the semiring kernel, numpy's answer on the dense arrays."""
    pytest.importorskip("graphblas")
    import pandas as pd
    n = 120
    G = sp.random(n, n, density=0.03, format="csr", random_state=1)
    D = np.full((n, n), np.inf)
    D[G.nonzero()] = 1 + 4 * G.data
    np.fill_diagonal(D, 0)
    r, c = np.nonzero(np.isfinite(D))
    edges = pd.DataFrame({"i": r, "j": c, "w": D[r, c]})
    sql = ("LET D2[i,j] = MIN(D[i,k] + D[k,j]); D4[i,j] = MIN(D2[i,k] + D2[k,j]); "
           "D3[i,j] = MIN(D2[i,k] + D[k,j])")
    with tensordb.connect(workers=2) as con:
        con.execute("CREATE TABLE e AS SELECT * FROM edges")
        con.execute(f"CREATE TENSOR D FROM (SELECT i, j, w FROM e) INDEX (i, j) VALUE w "
                    f"SHAPE ({n}, {n}) FILL +inf")
        nodes = _nodes(con, sql)
        con.execute(sql)
        d2 = np.min(D[:, :, None] + D[None, :, :], axis=1)
        np.testing.assert_array_equal(con.tensor("D4"), np.min(d2[:, :, None] + d2[None], axis=1))
        np.testing.assert_array_equal(con.tensor("D3"), np.min(d2[:, :, None] + D[None], axis=1))
    assert nodes["D2"]["output_nnz"]["format"] == "csr"
    for name in ("D3", "D4"):
        assert nodes[name]["kernel"]["method"] == "semiring", nodes[name]["kernel"]


def test_pool_and_fast_path_store_the_same_bytes_for_sparse_intermediates():
    R, M = _ratings(50, 30, 0.06, 13, "float32")
    stored = []
    for fast in (True, False):
        with tensordb.connect(workers=2) as con:
            con.engine.executor().fast_path = fast
            U, V = _load_mf(con, R, M, 4, 14, "float32")
            assert _nodes(con, MF)["E"]["output_nnz"]["format"] == "csr"  # float32 too
            con.execute(MF)
            assert ("fastpath" in con.engine.last_plan.memo) == fast
            stored.append({n: con.tensor(n).tobytes() for n in ("L", "dU", "dV")})
            assert con.tensor("dU").dtype == np.float32
            Rd, Md = R.toarray(), M.toarray()
            E = Md * (U @ V.T) - Rd
            np.testing.assert_allclose(con.tensor("dU"), 2 * E @ V + np.float32(0.02) * U,
                                       rtol=2e-5, atol=1e-5)
    assert stored[0] == stored[1]


def test_an_overflowed_sparse_intermediate_meets_zeros_as_numpy_does():
    """A sparse intermediate is not known finite when planned: finite stored entries whose
    products overflow (1e200 squared) give it inf, and a sparse x sparse product of it then
    takes NumPy's dense product, whose 0 * inf is NaN (SpGEMM would skip those zeros)."""
    n = 60
    G = sp.random(n, n, density=0.05, format="csr", random_state=1)
    G.data[:] = 1e200
    S = sp.random(n, n, density=0.05, format="csr", random_state=2)
    with np.errstate(all="ignore"):
        want = S.toarray() @ (G.toarray() @ G.toarray())
    assert np.isnan(want).any()
    with tensordb.connect(workers=2) as con:
        con.load("G", G)
        con.load("S", S)
        con.execute("LET C[i,k] = SUM(G[i,j] * G[j,k]); Y[i,k] = SUM(S[i,j] * C[j,k]);")
        got = con.tensor("Y")
        got = got.toarray() if sp.issparse(got) else np.asarray(got)
    np.testing.assert_array_equal(got, want)
