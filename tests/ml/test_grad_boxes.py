"""GRAD through slices and gathers, and slices of LETs and earlier results (plan/select.py): the
gradient of a box scatters into zeros of the source's shape, that of a gather scatter-adds over
the index values. Values against numpy, gradients against autograd, a mini-batch training loop
with an embedding lookup against the same loop in numpy."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.plan.builder import Graph

autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")


@pytest.fixture
def con(disk_con):
    return disk_con


RNG = np.random.default_rng(29)
X = RNG.normal(size=(13, 6))
W = RNG.normal(size=(6, 4))
E = RNG.normal(size=(9, 3))
TOK = np.array([[1, 3, -1, 1], [8, 1, 1, 0], [-9, 4, 4, 4]])  # repeated and negative rows


@pytest.mark.parametrize("text, f", [
    # a box of X, and X read whole as well: the two gradients add up
    ("Y[i,f] = SUM(X[i 3:11, d] * W[d,f]); L = SUM(Y[i,f] * Y[i,f]) + SUM(X[k,d] * X[k,d])",
     lambda x, w: anp.sum((x[3:11] @ w) ** 2) + anp.sum(x * x)),
    # two boxes of X that overlap, one cut on both axes
    ("L = SUM(X[i :7, d] * X[i 2:9, d]) + SUM(EXP(X[k -3:, e 1:4]))",
     lambda x, w: anp.sum(x[:7] * x[2:9]) + anp.sum(anp.exp(x[-3:, 1:4]))),
    # a box of the weights
    ("Y[i,f] = RELU(SUM(X[i,d 0:3] * W[d 1:4, f])); L = SUM(Y[i,f] * Y[i,f])",
     lambda x, w: anp.sum(anp.maximum(x[:, 0:3] @ w[1:4], 0) ** 2)),
])
def test_grad_through_slices_matches_autograd(con, text, f):
    con.load("X", X, tile=(4, 4))  # boxes that cut the stored tiles
    con.load("W", W, tile=(4, 3))
    con.execute(text + "; dX = GRAD(L, X); dW = GRAD(L, W)")
    np.testing.assert_allclose(con.tensor("L"), f(X, W), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("dX"), autograd.grad(f, 0)(X, W), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(con.tensor("dW"), autograd.grad(f, 1)(X, W), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("idtype", ["int32", "int64"])
@pytest.mark.parametrize("edtype", ["float64", "float32"])
def test_grad_through_a_gather_scatter_adds_over_the_index(con, idtype, edtype):
    e = E.astype(edtype)
    con.load("E", e, tile=(4, 2))
    con.load("tok", TOK.astype(idtype), tile=(2, 3))
    con.load("V", W[:3])
    con.execute("H[b,t,d] = E[tok[b,t], d]; T[b,t,f] = SUM(H[b,t,d] * V[d,f]); L = SUM(TANH(T[b,t,f])); "
                "dE = GRAD(L, E); dV = GRAD(L, V)")
    f = lambda m, v: anp.sum(anp.tanh(m[TOK] @ v))
    de = con.tensor("dE")
    assert de.dtype == np.dtype(edtype) and de.shape == E.shape
    tol = 1e-5 if edtype == "float32" else 1e-12
    np.testing.assert_allclose(de, autograd.grad(f, 0)(e.astype(float), W[:3]), rtol=tol,
                               atol=tol)
    np.testing.assert_allclose(con.tensor("dV"), autograd.grad(f, 1)(e.astype(float), W[:3]),
                               rtol=tol, atol=tol)
    assert not de[[2, 5, 6, 7]].any()  # rows no token names: zeros


@pytest.mark.parametrize("text, want", [
    ("LET Z[b,c] = SUM(X[b,d] * W[d,c]); P = SUM(Z[b 0:10, c])", lambda: (X @ W)[:10].sum()),
    ("Z[b,c] = SUM(X[b,d] * W[d,c]); P[b,c] = Z[b 2:-3, c 1:3]", lambda: (X @ W)[2:-3, 1:3]),
    ("LET Z[b,d] = X[b,d] * 2; LET Q[b,d] = Z[b 1:9, d]; P[b,d] = Q[b 2:, d :2]",
     lambda: (X * 2)[1:9][2:, :2]),
])
def test_slice_of_a_let_or_an_earlier_result(con, text, want):
    con.load("X", X, tile=(4, 4))
    con.load("W", W)
    con.execute(text)
    got = con.tensor("P")
    assert got.shape == np.shape(want())
    np.testing.assert_allclose(got, want(), rtol=1e-12, atol=1e-12)
    assert not any(str(t["name"]).startswith(("Z.", "iota")) for t in con.tensors())


@pytest.mark.parametrize("dtype", ["int32", "bool", "float32"])
def test_slice_of_a_let_keeps_numpy_dtypes(con, dtype):
    a = (np.arange(60).reshape(10, 6) % 3).astype(dtype)
    con.load("A", a, tile=(4, 4))
    con.execute("LET Q[i,j] = A[i,j]; B[i,j] = Q[i 2:5, j -2:]")
    got = con.tensor("B")
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got, a[2:5, -2:])


def test_grad_through_a_slice_of_a_let(con):
    con.load("X", X)
    con.load("W", W)
    con.execute("LET Z[b,c] = SUM(X[b,d] * W[d,c]); L = SUM(EXP(Z[b 2:-3, c 1:3])); "
                "dW = GRAD(L, W)")
    f = lambda w: anp.sum(anp.exp((X @ w)[2:-3, 1:3]))
    np.testing.assert_allclose(con.tensor("dW"), autograd.grad(f)(W), rtol=1e-12)


def test_python_api_grad_through_a_gather_and_a_slice_of_a_result(con):
    con.load("E", E)
    con.load("tok", TOK)
    con.load("V", W[:3])
    g = (Graph().einsum("btd,df->btf", "E[tok]", "V", into="H")
         .einsum("btf->", "H[1:, :, 2:]", into="L"))
    con.run(g.grad("L", ["E", "V"]))
    f = lambda m, v: anp.sum((m[TOK] @ v)[1:, :, 2:])
    np.testing.assert_allclose(con.tensor("L"), f(E, W[:3]), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("dE"), autograd.grad(f, 0)(E, W[:3]), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(con.tensor("dV"), autograd.grad(f, 1)(E, W[:3]), rtol=1e-12,
                               atol=1e-12)


def test_gather_index_is_refused_with_a_caret_and_a_gathered_let_has_a_gradient(con):
    con.load("E", E)
    con.load("tok", TOK)
    with pytest.raises(tensordb.BinderError, match="an index has no gradient") as info:
        con.execute("L = SUM(E[tok[b,t], d]); dt = GRAD(L, tok)")
    assert "^" in str(info.value)
    with pytest.raises(tensordb.BinderError, match="cannot gather with 'F': it is a LET"):
        con.execute("LET F[b,t] = tok[b,t]; Y[b,t,d] = E[F[b,t], d]")
    # a LET gathered from (an equality join with the index's one-hot rows): numpy's value,
    # autograd's gradient (the scatter-add, rows read twice counted twice)
    con.execute("LET F[r,d] = TANH(E[r,d]) * 2; Y[b,t,d] = F[tok[b,t], d]; "
                "L = SUM(Y[b,t,d] * Y[b,t,d]); LET dE = GRAD(L, E); G[r,d] = dE[r,d];")

    def f(e):
        return anp.sum((anp.tanh(e) * 2)[TOK] ** 2)
    np.testing.assert_allclose(con.tensor("Y"), (np.tanh(E) * 2)[TOK], rtol=1e-15)
    np.testing.assert_allclose(con.tensor("G"), autograd.grad(f)(E), rtol=1e-12, atol=1e-12)


def test_mini_batch_sgd_with_an_embedding_matches_numpy(con):
    """A slice of the data per batch, an embedding lookup of every row's tokens (a LET, sliced
    per batch), a softmax classifier on both, trained with GRAD; the same loop in numpy
    (its gradients by autograd) gives the same losses and weights."""
    n, t, v, d, f, c = 12, 3, 8, 2, 4, 3
    rng = np.random.default_rng(5)
    x, tok = rng.normal(size=(n, f)), rng.integers(0, v, size=(n, t))
    y = np.eye(c)[rng.integers(0, c, size=n)]
    e0, w0, u0 = rng.normal(size=(v, d)) * 0.5, rng.normal(size=(f, c)) * 0.5, rng.normal(size=(d, c))
    for name, a in (("X", x), ("tok", tok), ("Y", y), ("E", e0), ("W", w0), ("U", u0)):
        con.load(name, a, tile=(5,) + a.shape[1:] if name in ("X", "tok", "Y") else None)

    def loss(e, w, u, lo, hi):
        z = x[lo:hi] @ w + e[tok].sum(1)[lo:hi] @ u
        m = z.max(1, keepdims=True)
        lse = anp.log(anp.sum(anp.exp(z - m), 1)) + m[:, 0]
        return anp.mean(lse - anp.sum(y[lo:hi] * z, 1))

    grads = autograd.grad(loss, (0, 1, 2))
    e, w, u = e0, w0, u0
    lr = 0.3
    for epoch in range(2):
        for lo, hi in ((0, 5), (5, 10), (10, 12)):
            con.execute(f"""
                LET H[m,k] = SUM(E[tok[m,s], k]);
                LET Z[b,j] = SUM(X[b {lo}:{hi}, q] * W[q,j]) + SUM(H[b {lo}:{hi}, k] * U[k,j]);
                L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b {lo}:{hi}, j] * Z[b,j]));
                LET dE = GRAD(L, E); LET dW = GRAD(L, W); LET dU = GRAD(L, U);
                E[r,k] = E[r,k] - $lr * dE[r,k];
                W[q,j] = W[q,j] - $lr * dW[q,j];
                U[k,j] = U[k,j] - $lr * dU[k,j]""", {"lr": lr})
            np.testing.assert_allclose(con.tensor("L"), loss(e, w, u, lo, hi), rtol=1e-12)
            ge, gw, gu = grads(e, w, u, lo, hi)
            e, w, u = e - lr * ge, w - lr * gw, u - lr * gu
            np.testing.assert_allclose(con.tensor("E"), e, rtol=1e-11, atol=1e-13)
            np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-11, atol=1e-13)
            np.testing.assert_allclose(con.tensor("U"), u, rtol=1e-11, atol=1e-13)


def test_alternating_mini_batches_are_planned_once_each(con):
    """A plan that reads boxes, a gather and positions is kept by the plan cache (they exist
    while the tensors they read do): each batch's step is planned once, then reused."""
    con.load("X", X)
    con.load("W", W)
    con.load("E", E)
    con.load("tok", TOK)
    for epoch in range(3):
        for lo in (0, 5, 10):
            con.execute(f"LET Z[b,f] = SUM(X[b {lo}:{lo + 3}, d] * W[d,f]); "
                        "L = SUM(Z[b 0:2, f] * Z[b 0:2, f]) + SUM(E[tok[a,t], e]); "
                        "LET gW = GRAD(L, W); LET gE = GRAD(L, E); "
                        "W[d,f] = W[d,f] - 0.001 * gW[d,f]; E[r,d] = E[r,d] - 0.001 * gE[r,d]")
    stats = con.plan_cache_stats
    assert stats["misses"] == 3 and stats["hits"] == 6, stats


def test_a_gathers_gradient_is_a_matrix_product_with_one_hot_rows(con):
    con.load("E", E)
    con.load("tok", TOK)
    text = con.explain("L = SUM(TANH(E[tok[b,t], d])); dE = GRAD(L, E)")
    line = next(l for l in text.splitlines() if "onehot(tok,9)" in l)
    assert "backward dE[" in line and "matmul" in line
