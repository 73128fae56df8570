"""GRAD over sparse data: matrix factorisation on a sparse ratings matrix (the residual only at
the observed entries, the gradients scatter-adds run as SpMM over the lookups, nothing of size
users x items), checked against autograd and numpy on the densified, masked inputs; GRAD with
respect to a tensor whose fill is not 0 (the gradient on its stored entries) or refused."""
from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
import scipy.sparse as sp
import sparse

import tensordb

ROOT = Path(__file__).resolve().parents[2]
LAM, LR = 0.1, 0.02

STEP = """LET Resid[n] = SUM(U[obs_user[n], f] * V[obs_item[n], f]) - obs_rating[n];
L = SUM(Resid[n] * Resid[n]) + {lam} * SUM(U[u,f] * U[u,f]) + {lam} * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - {lr} * dU[u,f];
V[i,f] = V[i,f] - {lr} * dV[i,f]"""


def _ratings(users, items, density, seed):
    R = sp.random(users, items, density=density, format="csr", random_state=seed)
    R.data = 1.0 + np.floor(R.data * 5)
    return R


def _load_mf(con, R, rank, seed):
    """R stored sparse, its observed entries numbered in SQL (from R's nonzeros), the factors."""
    rng = np.random.default_rng(seed)
    U = 0.5 + 0.1 * rng.standard_normal((R.shape[0], rank))
    V = 0.5 + 0.1 * rng.standard_normal((R.shape[1], rank))
    con.load("R", R)
    con.load("U", U)
    con.load("V", V)
    con.execute("CREATE TABLE obs AS SELECT (row_number() OVER (ORDER BY d0, d1) - 1) AS n, "
                "d0 AS u, d1 AS i, value FROM (SELECT * FROM R) t(d0, d1, value)")
    con.execute("CREATE TENSOR obs_user FROM (SELECT n, u FROM obs) INDEX (n) VALUE u")
    con.execute("CREATE TENSOR obs_item FROM (SELECT n, i FROM obs) INDEX (n) VALUE i")
    con.execute("CREATE TENSOR obs_rating FROM (SELECT n, value FROM obs) INDEX (n) VALUE value")
    return U, V


def _masked_loss(U, V, Rd, M, lam):
    """The MF loss on the densified inputs: squared error where M (R's pattern) is 1."""
    E = M * (anp.dot(U, V.T) - Rd)
    return anp.sum(E * E) + lam * anp.sum(U * U) + lam * anp.sum(V * V)


def _numpy_steps(U, V, R, steps, lam=LAM, lr=LR):
    """The same steps with scipy.sparse: SDDMM by gathering rows, SpMM for the gradients."""
    C = R.tocoo()
    rows, cols = C.row, C.col
    losses = []
    for _ in range(steps):
        e = np.einsum("nr,nr->n", U[rows], V[cols]) - C.data
        losses.append(float(e @ e + lam * np.sum(U * U) + lam * np.sum(V * V)))
        E = sp.csr_array((2 * e, (rows, cols)), shape=R.shape)
        dU, dV = E @ V + 2 * lam * U, E.T @ U + 2 * lam * V
        U, V = U - lr * dU, V - lr * dV
    return losses, U, V


def test_mf_gradients_equal_autograd_on_the_densified_masked_loss():
    R = _ratings(60, 40, 0.05, 1)
    with tensordb.connect(workers=2) as con:
        U, V = _load_mf(con, R, 5, 2)
        con.execute(STEP.format(lam=LAM, lr=LR).split("U[u,f] =")[0]
                    .replace("LET dU", "dU").replace("LET dV", "dV"))
        Rd, M = R.toarray(), (R.toarray() != 0).astype(float)
        np.testing.assert_allclose(con.tensor("L"), _masked_loss(U, V, Rd, M, LAM), rtol=1e-12)
        gU, gV = autograd.grad(_masked_loss, (0, 1))(U, V, Rd, M, LAM)
        np.testing.assert_allclose(con.tensor("dU"), gU, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor("dV"), gV, rtol=1e-10, atol=1e-12)


def test_an_mf_step_plan_stays_sparse():
    """No operation of the step has users x items elements; the scatter-adds are SpMM over the
    lookups (the one-hot rows of the index, CSR with one entry per rating)."""
    R = _ratings(3000, 2000, 0.001, 3)
    with tensordb.connect(workers=2) as con:
        _load_mf(con, R, 8, 4)
        data = json.loads(con.explain(STEP.format(lam=LAM, lr=LR), format="json"))
        big = R.shape[0] * R.shape[1] // 10
        for node in data["nodes"]:
            space = math.prod(node["tile_shape"][l] * node["pieces"][l] for l in node["labels"])
            dense_space = math.prod(node["tile_shape"][l] * node["pieces"][l]
                                    for l in node["labels"]
                                    if not any(i["tensor"].startswith("onehot(") and l in i["labels"]
                                               for i in node["inputs"]))
            assert dense_space < big and node["flops"] < 4 * R.nnz * 8, node["expression"]
            assert space < big or node["kernel"]["method"] == "spmm", node["expression"]
            for inp in node["inputs"]:
                if inp["tensor"].startswith("onehot("):
                    assert inp["format"] == "csr" and inp["nnz"] == R.nnz
        scatter = [n for n in data["nodes"] if any(i["tensor"].startswith("onehot(")
                                                   for i in n["inputs"])]
        assert len(scatter) == 2 and all(n["kernel"]["method"] == "spmm" for n in scatter)
        text = con.explain(STEP.format(lam=LAM, lr=LR))
        assert text.count("spmm x1 sparse") + text.count("spmm x0 sparse") == 2


def test_train_mf_script_loss_curve_equals_numpy(tmp_path):
    text = (ROOT / "sql" / "train_mf.sql").read_text()
    steps = len(re.findall(r"^-- step \d+$", text, flags=re.M))
    assert steps >= 5
    with tensordb.connect(tmp_path / "mf.tdb") as con:
        con.execute_script(text.split("\n-- step 1\n")[0])
        U, V = con.tensor("U"), con.tensor("V")
        R = con.sparse("R")
        con.execute_script(text)
        got = [v for _, v in con.sql("SELECT step, loss FROM loss_curve ORDER BY step").fetchall()]
        lam = float(re.search(r"\+ ([0-9.]+) \* SUM\(U", text).group(1))
        lr = float(re.search(r"U\[u,f\] - ([0-9.]+) \* dU", text).group(1))
        want, U2, V2 = _numpy_steps(U, V, sp.csr_array(R), steps, lam, lr)
        np.testing.assert_allclose(got, want, rtol=1e-10)
        assert got[-1] < 0.5 * got[0]
        np.testing.assert_allclose(con.tensor("U"), U2, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(con.tensor("V"), V2, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("tile", [None, 7])
def test_the_scatter_add_of_a_gather_is_np_add_at_also_with_nan_and_inf(tile):
    """The one-hot rows read sparse: each row gets the sum of its lookups' gradients (repeats,
    negative indices counted from the end), and a NaN or inf reaches only the rows that read
    it, as np.add.at; index and table split across tiles too."""
    rng = np.random.default_rng(5)
    E = rng.standard_normal((9, 3))
    idx = np.array([0, 3, 3, -1, 8, 2, 3, -9, 5, 5, 1, 0, 7, 4, 6, 2, 2], dtype=np.int64)
    w = rng.standard_normal((idx.size, 3))
    w[4, 1] = np.nan
    w[6, 2] = np.inf
    with tensordb.connect(workers=2) as con:
        con.load("E", E, tile=None if tile is None else (3, 3))
        con.load("idx", idx, tile=None if tile is None else (tile,))
        con.load("w", w, tile=None if tile is None else (tile, 3))
        sql = "L = SUM(E[idx[n], d] * w[n, d]); dE = GRAD(L, E)"
        with warnings.catch_warnings():  # L is NaN: a NonFiniteWarning where one is given
            warnings.simplefilter("ignore", tensordb.Warning)
            con.execute(sql)
        want = np.zeros_like(E)
        np.add.at(want, idx, w)
        np.testing.assert_array_equal(np.isnan(con.tensor("dE")), np.isnan(want))
        np.testing.assert_allclose(con.tensor("dE"), want, rtol=1e-12)
        assert "spmm" in con.explain(sql)


def _distances():
    inf = np.inf
    D = np.full((4, 5), inf)
    D[0, 1], D[0, 3], D[1, 0], D[2, 2], D[2, 4], D[3, 3] = 1.0, 2.0, 0.5, 3.0, 1.0, 4.0
    D[1, 2] = 0.75  # a tie in row 1 (with x below: 0.5 + 0.25 and 0.75 + 0)
    return D


def test_grad_through_min_plus_is_the_subgradient_on_the_stored_entries(tmp_path):
    """GRAD with respect to a tensor of fill +inf: MIN's subgradient (split evenly between tied
    entries) at its stored entries, 0 at its absent ones (structure, not parameters): the
    gradient has fill 0 and is stored sparse. With respect to a dense x: autograd's answer."""
    D = _distances()
    x = np.array([0.25, 0.1, 0.0, 0.2, 0.4])
    D[3] = np.inf  # a row with no entry: its MIN is inf, its gradient 0 on D
    with tensordb.connect(tmp_path / "g.tdb") as con:
        con.load("D", sparse.COO.from_numpy(D, fill_value=np.inf))
        con.load("x", x)
        con.execute("P[i] = MIN(D[i,j] + x[j]); L = SUM(EXP(-P[i])); "
                    "gD = GRAD(L, D); gx = GRAD(L, x)")

        def loss(D, x):
            return anp.sum(anp.exp(-anp.min(D + x[None, :], axis=1)))
        gD, gx = autograd.grad(loss, (0, 1))(D, x)
        stored = np.isfinite(D)
        np.testing.assert_allclose(con.tensor("gD"), np.where(stored, gD, 0.0), rtol=1e-12)
        np.testing.assert_allclose(con.tensor("gx"), gx, rtol=1e-12)
        assert con.tensor("gD")[1, 0] == con.tensor("gD")[1, 2] != 0  # the tie, split
        meta = next(t for t in con.tensors() if t["name"] == "gD")
        assert meta["fill"] == 0.0 and meta["nnz"] <= stored.sum()


def test_grad_whose_backward_is_nan_at_the_fill_is_refused_and_changes_nothing(tmp_path):
    D = _distances()
    x = np.arange(5.0)
    with tensordb.connect(tmp_path / "r.tdb") as con:
        con.load("D", sparse.COO.from_numpy(D, fill_value=np.inf))
        con.load("x", x)
        sql = "L = SUM(EXP(-D[i,j] * (x[j] + 1)));\ngx = GRAD(L, x)"
        with pytest.raises(tensordb.ProgrammingError) as err:
            con.execute(sql)
        msg = str(err.value)
        assert "GRAD(L, x)" in msg and "D" in msg and "fill value inf" in msg
        assert "LINE 2: gx = GRAD(L, x)" in msg
        assert {t["name"] for t in con.tensors()} == {"D", "x"}
        # the same loss over D stored with fill 0 has a gradient: numpy's
        con.load("D0", np.where(np.isfinite(D), D, 0.0))
        con.execute("L = SUM(EXP(-D0[i,j] * (x[j] + 1))); gx = GRAD(L, x)")
        D0 = np.where(np.isfinite(D), D, 0.0)
        np.testing.assert_allclose(con.tensor("gx"),
                                   (-D0 * np.exp(-D0 * (x + 1))).sum(0), rtol=1e-12)


def test_the_fused_scaled_scatter_add_is_np_add_at_with_a_nan_rating():
    """GRAD of a product of two gathers fuses the row scaling into the scatter-add (one SpMM
    whose entries are scaled, EXPLAIN shows three operands); a NaN residual reaches only the
    rows its rating names, as np.add.at; tiles split across the lookups too."""
    rng = np.random.default_rng(8)
    users, items, n, k = 40, 30, 200, 3
    iu, ii = rng.integers(-users, users, n), rng.integers(0, items, n)
    r = rng.standard_normal(n)
    r[17] = np.nan
    U, V = rng.standard_normal((users, k)), rng.standard_normal((items, k))
    with tensordb.connect(workers=2) as con:
        con.load("U", U, tile=(16, k))
        con.load("V", V)
        con.load("iu", iu, tile=(64,))
        con.load("ii", ii, tile=(64,))
        con.load("r", r, tile=(64,))
        sql = ("LET E[n] = SUM(U[iu[n], f] * V[ii[n], f]) - r[n]; L = SUM(E[n] * E[n]); "
               "dU = GRAD(L, U); dV = GRAD(L, V)")
        text = con.explain(sql)
        assert re.search(r"SUM\(V\[ii\]\[b0,a1\] \* onehot\(iu,40\)\[b0,r\] \* dL/dE[.\w]*\[b0\]\)",
                         text), text
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tensordb.Warning)
            con.execute(sql)
        e = np.einsum("nf,nf->n", U[iu], V[ii]) - r
        want_u, want_v = np.zeros_like(U), np.zeros_like(V)
        np.add.at(want_u, iu, 2 * e[:, None] * V[ii])
        np.add.at(want_v, ii, 2 * e[:, None] * U[iu])
        for got, want in ((con.tensor("dU"), want_u), (con.tensor("dV"), want_v)):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-12)
