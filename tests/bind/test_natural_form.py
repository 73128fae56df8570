"""The natural form (one statement with nested aggregates) binds to the plan of its hand split
(LETs): a function of tensors under a summed product is an elementwise step of its own, so the
product runs as a contraction, not as a broadcast over the summed label; equal temporaries of a
statement are computed once. Checked on an MLP, a masked attention block and a layer norm: the
same operations and kernels as the LET form, and numpy's answers."""
from __future__ import annotations

import json

import numpy as np
import pytest

MLP_ONE = "Y[b,o] = SUM(RELU(SUM(X[b,h] * W1[h,f])) * W2[f,o])"
MLP_LET = "LET H[b,f] = RELU(SUM(X[b,h] * W1[h,f])); Y[b,o] = SUM(H[b,f] * W2[f,o])"
ATT_ONE = ("O[i,d] = SUM(EXP(SUM(Q[i,e] * K[j,e]) + M[i,j] - MAX(SUM(Q[i,e] * K[k,e]) + M[i,k]))"
           " * V[j,d]) / SUM(EXP(SUM(Q[i,e] * K[m,e]) + M[i,m] - MAX(SUM(Q[i,e] * K[n,e]) + M[i,n])))")
ATT_LET = ("LET S[i,j] = SUM(Q[i,e] * K[j,e]); LET mx[i] = MAX(S[i,k] + M[i,k]); "
           "LET P[i,j] = EXP(S[i,j] + M[i,j] - mx[i]); O[i,d] = SUM(P[i,j] * V[j,d]) / SUM(P[i,m])")
UNMASKED_ONE = ("O[i,d] = SUM(EXP(SUM(Q[i,e] * K[j,e]) - MAX(SUM(Q[i,e] * K[k,e]))) * V[j,d])"
                " / SUM(EXP(SUM(Q[i,e] * K[m,e]) - MAX(SUM(Q[i,e] * K[n,e]))))")
UNMASKED_LET = ("LET S[i,j] = SUM(Q[i,e] * K[j,e]); LET mx[i] = MAX(S[i,k]); "
                "LET P[i,j] = EXP(S[i,j] - mx[i]); O[i,d] = SUM(P[i,j] * V[j,d]) / SUM(P[i,m])")
LN_ONE = ("N[i,j] = (C[i,j] - SUM(C[i,k]) / 7) / "
          "SQRT(SUM(SQUARE(C[i,k] - SUM(C[i,m]) / 7)) / 7 + 1e-5)")
LN_LET = ("LET s[i] = SUM(C[i,k]); LET var[i] = SUM(SQUARE(C[i,k] - s[i] / 7)); "
          "N[i,j] = (C[i,j] - s[i] / 7) / SQRT(var[i] / 7 + 1e-5)")


@pytest.fixture
def db(disk_con):
    rng = np.random.default_rng(7)
    disk_con.load("X", rng.standard_normal((24, 10)), tile=(8, 5))
    disk_con.load("W1", rng.standard_normal((10, 20)), tile=(5, 8))
    disk_con.load("W2", rng.standard_normal((20, 6)), tile=(8, 6))
    for name, shape in (("Q", (12, 4)), ("K", (12, 4)), ("V", (12, 5))):
        disk_con.load(name, rng.standard_normal(shape))
    disk_con.load("M", np.where(np.tril(np.ones((12, 12))) > 0, 0.0, -1e9))  # causal
    disk_con.load("C", rng.standard_normal((9, 7)) * 3 + 1)
    return disk_con


def shape_of(con, sql):
    """Per operation: its kernel method, labels kept and aggregated, flops and kernel calls."""
    plan = json.loads(con.explain(sql, format="json"))
    return [(n["kernel"]["method"], len(n["out_labels"]), len(n["aggregated_labels"]), n["flops"],
             n["kernel_calls"]) for n in plan["nodes"]]


def mlp(db):
    X, W1, W2 = (db.tensor(n) for n in ("X", "W1", "W2"))
    return np.maximum(X @ W1, 0) @ W2


def attention(db):
    Q, K, V, M = (db.tensor(n) for n in ("Q", "K", "V", "M"))
    s = Q @ K.T + M
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ V


def unmasked(db):
    Q, K, V = (db.tensor(n) for n in ("Q", "K", "V"))
    s = Q @ K.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ V


def layer_norm(db):
    C = db.tensor("C")
    return (C - C.mean(axis=1, keepdims=True)) / np.sqrt(C.var(axis=1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("one, let, name, oracle", [
    (MLP_ONE, MLP_LET, "Y", mlp), (ATT_ONE, ATT_LET, "O", attention),
    (UNMASKED_ONE, UNMASKED_LET, "O", unmasked),
    (LN_ONE, LN_LET, "N", layer_norm)], ids=["mlp", "attention", "unmasked", "layer-norm"])
def test_one_statement_binds_to_the_let_plan_and_equals_numpy(db, one, let, name, oracle):
    assert shape_of(db, one) == shape_of(db, let)
    want = oracle(db)
    np.testing.assert_allclose(db.execute(one).tensor(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db.execute(let).tensor(), want, rtol=1e-10, atol=1e-12)
    assert {t["name"] for t in db.tensors()} == {"X", "W1", "W2", "Q", "K", "V", "M", "C", name}


def test_mlp_second_product_is_a_matrix_product(db):
    kernels = [n["kernel"]["method"] for n in json.loads(db.explain(MLP_ONE, format="json"))["nodes"]]
    assert kernels == ["matmul", "broadcast", "matmul"]  # X W1, RELU, H W2: no broadcast over f


def test_scores_of_attention_computed_once(db):
    nodes = json.loads(db.explain(ATT_ONE, format="json"))["nodes"]
    assert sum(1 for n in nodes if n["kernel"]["method"] == "matmul") == 2  # Q K^T and P V


def test_grad_through_the_one_statement_mlp(db):
    X, W1, W2 = (db.tensor(n) for n in ("X", "W1", "W2"))
    db.execute(f"{MLP_ONE}; L = SUM(Y[b,o] * Y[b,o]); dW1 = GRAD(L, W1); dW2 = GRAD(L, W2)")
    a = X @ W1
    h = np.maximum(a, 0)
    dy = 2 * (h @ W2)
    np.testing.assert_allclose(db.tensor("dW2"), h.T @ dy, rtol=1e-10)
    np.testing.assert_allclose(db.tensor("dW1"), X.T @ ((dy @ W2.T) * (a > 0)), rtol=1e-10)


def test_signed_product_stays_one_contraction(db):
    # -A B is a product the planner folds the sign of: no elementwise step for -A
    plan = json.loads(db.explain("Z[b,f] = SUM(-X[b,h] * W1[h,f])", format="json"))
    assert [n["kernel"]["method"] for n in plan["nodes"]] == ["matmul"]
    np.testing.assert_allclose(db.execute("Z[b,f] = SUM(-X[b,h] * W1[h,f])").tensor(),
                               -(db.tensor("X") @ db.tensor("W1")), rtol=1e-12)


def test_factor_over_more_labels_than_a_tensor_is_not_split(db):
    # (X[b,h] + W1[h,f]) spans b, h and f: a step of its own would be larger than any input
    sql = "Z[b,o] = SUM((X[b,h] + W1[h,f]) * W2[f,o])"
    assert len(json.loads(db.explain(sql, format="json"))["nodes"]) == 1
    X, W1, W2 = (db.tensor(n) for n in ("X", "W1", "W2"))
    want = np.einsum("bhf,fo->bo", X[:, :, None] + W1[None], W2)
    np.testing.assert_allclose(db.execute(sql).tensor(), want, rtol=1e-10)


def test_integer_dtypes_are_those_of_the_join(con):
    rng = np.random.default_rng(3)
    con.load("A", rng.integers(-5, 5, (4, 6)).astype(np.int32))
    con.load("B", rng.integers(-5, 5, (6, 3)).astype(np.int64))
    r = con.execute("Z[i,k] = SUM(RELU(A[i,j]) * B[j,k])").tensor()
    want = np.einsum("ij,jk->ik", np.maximum(con.tensor("A"), 0), con.tensor("B"))
    assert r.dtype == want.dtype
    np.testing.assert_array_equal(r, want)
    assert len(json.loads(con.explain("Z[i,k] = SUM(RELU(A[i,j]) * B[j,k])",
                                      format="json"))["nodes"]) == 2


def test_grad_through_the_one_statement_layer_norm_with_its_mean_computed_once(db):
    # the mean SUM(C[i,k]) is written twice and computed once: its gradient sums both uses
    agnp = pytest.importorskip("autograd.numpy")
    from autograd import grad
    rng = np.random.default_rng(11)
    db.load("G", rng.standard_normal((9, 7)))
    G = db.tensor("G")
    db.execute(f"{LN_ONE}; L = SUM(N[i,j] * G[i,j]); dC = GRAD(L, C)")

    def loss(c):
        mu = agnp.sum(c, axis=1, keepdims=True) / 7
        var = agnp.sum((c - mu) ** 2, axis=1, keepdims=True) / 7
        return agnp.sum((c - mu) / agnp.sqrt(var + 1e-5) * G)
    np.testing.assert_allclose(db.tensor("dC"), grad(loss)(db.tensor("C")), rtol=1e-9, atol=1e-12)


def test_the_row_max_of_a_product_is_over_its_free_label_in_either_order(db):
    Q, K = db.tensor("Q"), db.tensor("K")
    db.execute("R1[i] = MAX(SUM(Q[i,e] * K[k,e])); R2[i] = MAX(SUM(K[k,e] * Q[i,e]))")
    for name in ("R1", "R2"):
        np.testing.assert_allclose(db.tensor(name), (Q @ K.T).max(axis=1), rtol=1e-12)
    # the denominator of a softmax of a product: the outer SUM takes m from the product
    db.execute("Z[i] = SUM(EXP(SUM(Q[i,e] * K[m,e]) - MAX(SUM(Q[i,e] * K[n,e]))))")
    s = Q @ K.T
    np.testing.assert_allclose(db.tensor("Z"), np.exp(s - s.max(1, keepdims=True)).sum(1),
                               rtol=1e-12)
