"""GRAD: gradients of a scalar loss, computed by backward extended einsums (plan/grad.py).

Every gradient is checked against two independent oracles: the autograd package (reverse-mode
automatic differentiation of the same loss written with numpy) and central finite differences of
that numpy loss in float64. The loss tensordb computes is checked against the numpy loss too.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import tensordb
from tensordb.errors import BinderError, Error
from tensordb.plan.builder import Graph

autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")


@pytest.fixture
def con(disk_con):
    """The tests here run on an on-disk database (conftest's ``disk_con``)."""
    return disk_con


def _sigmoid(x):
    return 1.0 / (1.0 + anp.exp(-x))


def finite_differences(f, arrays: dict, name: str, h: float = 1e-6) -> np.ndarray:
    """Central differences of the float64 numpy loss ``f`` along every element of ``name``."""
    base = {k: np.array(v, dtype=np.float64) for k, v in arrays.items()}
    x = base[name]
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        keep = x[idx]
        x[idx] = keep + h
        up = float(f(**base))
        x[idx] = keep - h
        down = float(f(**base))
        x[idx] = keep
        out[idx] = (up - down) / (2 * h)
    return out


def check(con, arrays: dict, script: str, f, wrt, *, fd: bool = True, loss: str = "L"):
    """Load ``arrays``, run ``script`` (which computes the scalar ``loss``) with one GRAD per
    tensor of ``wrt``, and compare the loss and the gradients with numpy's loss ``f``, autograd
    and finite differences."""
    for k, v in arrays.items():
        con.load(k, v, replace=True)
    grads = "; ".join(f"g_{w} = GRAD({loss}, {w})" for w in wrt)
    with warnings.catch_warnings(record=True) as seen:  # numpy's warnings are errors
        warnings.simplefilter("error")
        warnings.simplefilter("always", tensordb.GradientWarning)
        con.execute(f"{script}; {grads};")
    # the one warning expected: a GRAD with respect to a tensor the loss does not read
    unread = [w for w in wrt if not re.search(rf"\b{w}\b", script)]
    assert sorted(re.findall(r"GRAD\(\w+, (\w+)\) is zeros", " ".join(
        str(x.message) for x in seen))) == sorted(unread)
    expected_loss = float(f(**arrays))
    assert con.tensor(loss).shape == ()
    np.testing.assert_allclose(con.tensor(loss), expected_loss, rtol=1e-12, atol=1e-12)
    names = list(arrays)
    for w in wrt:
        got = con.tensor(f"g_{w}")
        assert got.shape == np.shape(arrays[w])
        assert got.dtype == np.asarray(arrays[w]).dtype
        with warnings.catch_warnings():  # autograd warns when the loss does not read w
            warnings.simplefilter("ignore")
            oracle = autograd.grad(lambda x, w=w: f(**{**arrays, w: x}))(arrays[w])
        np.testing.assert_allclose(got, oracle, rtol=1e-10, atol=1e-12, err_msg=f"d{loss}/d{w}")
        if fd:
            np.testing.assert_allclose(got, finite_differences(f, arrays, w), rtol=1e-5,
                                       atol=1e-6, err_msg=f"d{loss}/d{w} (finite differences)")
    return names


RNG = np.random.default_rng(13)
A = RNG.normal(size=(3, 4))
A = np.where(np.abs(A) < 0.2, 0.5, A)           # no value near 0 (RELU, ABS)
POS = RNG.uniform(0.5, 2.0, size=(3, 4))        # LOG, SQRT, POW of a positive base
B = RNG.normal(size=4)
B = np.where(np.abs(B) < 0.2, -0.7, B)
C = RNG.normal(size=3)

UNARY = {  # dialect function -> numpy function, input
    "EXP": (anp.exp, A), "LOG": (anp.log, POS), "RELU": (lambda x: anp.maximum(x, 0), A),
    "TANH": (anp.tanh, A), "SIGMOID": (_sigmoid, A), "SQRT": (anp.sqrt, POS),
    "ABS": (anp.abs, A), "SIN": (anp.sin, A), "COS": (anp.cos, A),
    "SQUARE": (lambda x: x * x, A),
}


@pytest.mark.parametrize("fn", sorted(UNARY))
def test_unary_functions(con, fn):
    npf, a = UNARY[fn]
    check(con, {"A": a, "B": B}, f"L = SUM({fn}(A[i,j]) * B[j])",
          lambda A, B: anp.sum(npf(A) * B), ["A", "B"])


def test_every_function_of_the_dialect_is_tested():
    from tensordb.bind import SCALAR_FUNCTIONS
    covered = {f.lower() for f in UNARY} | {"max", "min", "pow"} | set(CONDITIONAL) | \
        {"softmax"}  # tests/ml/test_ml_aggregates.py: test_logsumexp_softmax_gradients
    assert set(SCALAR_FUNCTIONS) <= covered


CONDITIONAL = {  # the branch chosen gets the gradient; the condition (a comparison) none
    "where": "WHERE(A[i,j] > B[j], A[i,j] * B[j], EXP(A[i,j]))",
    "if": "IF(B[j] <= 0, SQUARE(A[i,j]), A[i,j] * (A[i,j] <> 0.25))",
}


@pytest.mark.parametrize("fn", sorted(CONDITIONAL))
def test_conditional_functions(con, fn):
    def f(A, B):
        if fn == "where":
            return anp.sum(anp.where(A > B, A * B, anp.exp(A)))
        return anp.sum(anp.where(B <= 0, A * A, A * (A != 0.25)))
    check(con, {"A": A, "B": B}, f"L = SUM({CONDITIONAL[fn]})", f, ["A", "B"])


BINARY = {
    "+": ("A[i,j] + B[j]", lambda A, B: A + B, A),
    "-": ("A[i,j] - B[j]", lambda A, B: A - B, A),
    "-neg": ("-A[i,j] * B[j]", lambda A, B: -A * B, A),
    "*": ("A[i,j] * B[j]", lambda A, B: A * B, A),
    "/": ("A[i,j] / B[j]", lambda A, B: A / B, A),
    "/2": ("B[j] / A[i,j]", lambda A, B: B / A, A),
    "pow-const": ("POW(A[i,j], 3)", lambda A, B: A ** 3, A),
    "pow-half": ("POW(A[i,j], 0.5) * B[j]", lambda A, B: A ** 0.5 * B, POS),
    "pow-both": ("POW(A[i,j], B[j])", lambda A, B: A ** B, POS),
    "pow-base": ("POW(2, A[i,j] * B[j])", lambda A, B: 2.0 ** (A * B), A),
    "max": ("MAX(A[i,j], B[j])", lambda A, B: anp.maximum(A, B), A),
    "min": ("MIN(A[i,j], B[j] * 2)", lambda A, B: anp.minimum(A, B * 2), A),
    "nested": ("TANH(A[i,j] * B[j] + 1) / (1 + EXP(-A[i,j]))",
               lambda A, B: anp.tanh(A * B + 1) / (1 + anp.exp(-A)), A),
}


@pytest.mark.parametrize("case", sorted(BINARY))
def test_binary_operators(con, case):
    text, npf, a = BINARY[case]
    check(con, {"A": a, "B": B}, f"L = SUM({text})", lambda A, B: anp.sum(npf(A, B)), ["A", "B"])


def test_max_min_of_equal_values_split_the_gradient(con):
    """MAX(a, b) with a == b passes half of the gradient to each (autograd's convention)."""
    a = np.array([[1.0, 2.0], [3.0, -1.0]])
    b = np.array([1.0, 5.0])
    check(con, {"A": a, "B": b}, "L = SUM(MAX(A[i,j], B[j]) * 3)",
          lambda A, B: anp.sum(anp.maximum(A, B) * 3), ["A", "B"], fd=False)
    np.testing.assert_array_equal(con.tensor("g_A"), [[1.5, 0.0], [3.0, 0.0]])


@pytest.mark.parametrize("agg", ["MAX", "MIN"])
def test_max_min_aggregates(con, agg):
    npf = anp.max if agg == "MAX" else anp.min
    check(con, {"A": A, "B": B, "C": C}, f"M[i] = {agg}(A[i,j] * B[j]); L = SUM(M[i] * C[i])",
          lambda A, B, C: anp.sum(npf(A * B, axis=1) * C), ["A", "B", "C"])


@pytest.mark.parametrize("agg", ["MAX", "MIN"])
def test_ties_split_the_gradient_evenly(con, agg):
    """Tied elements of a MAX/MIN share the gradient evenly (docs/sql.md, "Training")."""
    a = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, 4.0, 0.5, -1.0]])
    npf = anp.max if agg == "MAX" else anp.min
    check(con, {"A": a, "C": C}, f"M[i] = {agg}(A[i,j]); L = SUM(M[i] * C[i])",
          lambda A, C: anp.sum(npf(A, axis=1) * C), ["A", "C"], fd=False)
    got = con.tensor("g_A")
    share = (a == (a.max(1) if agg == "MAX" else a.min(1))[:, None])
    np.testing.assert_allclose(got, share / share.sum(1, keepdims=True) * C[:, None])


def test_prod_aggregate(con):
    check(con, {"A": POS, "B": B, "C": C}, "P[i] = PROD(A[i,j] + B[j]); L = SUM(P[i] * C[i])",
          lambda A, B, C: anp.sum(anp.prod(A + B, axis=1) * C), ["A", "B", "C"])


def test_prod_with_zeros(con):
    """A PROD is the product of the other elements' derivative at a 0 (one 0 in the group),
    0 with two or more: exact, where out / x would be NaN. Checked against finite differences
    (a product is linear in each element) and against the product of the others by hand."""
    a = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.5, -2.0, 0.5]])
    con.load("A", a)
    con.execute("P[i] = PROD(A[i,j]); L = SUM(P[i] * P[i]); g = GRAD(L, A)")
    f = lambda A: np.sum(np.prod(A, axis=1) ** 2)
    got = con.tensor("g")
    np.testing.assert_allclose(got, finite_differences(f, {"A": a}, "A"), rtol=1e-6, atol=1e-6)
    p = a.prod(1)
    others = np.array([[np.prod(np.delete(a[i], j)) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(got, 2 * p[:, None] * others)
    assert np.isfinite(got).all()


def test_sum_aggregate_nested_and_logsumexp(con):
    check(con, {"A": A, "B": B}, "LSE[i] = LOG(SUM(EXP(A[i,j] * B[j]))); L = SUM(LSE[i])",
          lambda A, B: anp.sum(anp.log(anp.sum(anp.exp(A * B), axis=1))), ["A", "B"])


def test_multi_operand_einsum(con):
    """A product of three and four stored tensors is split pairwise by the binder: the gradient
    flows through the pairwise steps."""
    rng = np.random.default_rng(1)
    arrays = {"P": rng.normal(size=(3, 4)), "Q": rng.normal(size=(4, 5)),
              "R": rng.normal(size=(5, 2)), "S": rng.normal(size=(2, 3))}
    check(con, arrays, "L = SUM(P[i,j] * Q[j,k] * R[k,l] * S[l,i])",
          lambda P, Q, R, S: anp.einsum("ij,jk,kl,li->", P, Q, R, S), list(arrays))
    check(con, {"P": arrays["P"], "Q": arrays["Q"], "R": arrays["R"]},
          "T[i,l] = SUM(P[i,j] * Q[j,k] * R[k,l]); L = SUM(T[i,l] * T[i,l])",
          lambda P, Q, R: anp.sum(anp.einsum("ij,jk,kl->il", P, Q, R) ** 2), ["P", "Q", "R"])


def test_tensor_used_several_times_accumulates(con):
    rng = np.random.default_rng(2)
    m = rng.normal(size=(4, 4))
    check(con, {"M": m, "B": B}, "T[i] = SUM(M[i,j] * M[j,k] * B[k]); "
          "L = SUM(T[i] * M[i,k] * B[k]) + SUM(EXP(M[i,j]) * M[j,i])",
          lambda M, B: anp.sum((M @ M @ B) * (M @ B)) + anp.sum(anp.exp(M) * M.T), ["M", "B"])


def test_broadcasts_sum_over_the_labels_an_input_lacks(con):
    """B[j] is broadcast over i (its gradient sums over i); in SUM(A[i] + B[j]) each A[i] is
    counted once per j (a label no operand of A's gradient has: its size)."""
    a, b = RNG.normal(size=5), RNG.normal(size=3)
    check(con, {"A": a, "B": b}, "L = SUM(A[i] + B[j] * B[j])",
          lambda A, B: anp.sum(A[:, None] + B[None, :] ** 2), ["A", "B"])
    np.testing.assert_allclose(con.tensor("g_A"), np.full(5, 3.0))
    check(con, {"A": A}, "L = SUM(A[i,j])", lambda A: anp.sum(A), ["A"])
    np.testing.assert_array_equal(con.tensor("g_A"), np.ones_like(A))
    check(con, {"A": A, "C": C}, "L = SUM(C[i] * C[i]) * 2", lambda A, C: anp.sum(C * C) * 2,
          ["C"])


def test_repeated_labels(con):
    """A tensor read twice with its labels swapped, or with a label repeated across operands;
    the diagonal of a tensor that is not differentiated."""
    rng = np.random.default_rng(3)
    m = rng.normal(size=(4, 4))
    check(con, {"M": m, "B": B}, "L = SUM(M[i,j] * M[j,i] * B[i] * B[j])",
          lambda M, B: anp.einsum("ij,ji,i,j->", M, M, B, B), ["M", "B"])
    check(con, {"M": m, "B": B}, "L = SUM(M[i,i] * B[i] * B[i])",
          lambda M, B: anp.sum(anp.diag(M) * B * B), ["B"])


def _diag(a, axes=(0, 1)):
    """The diagonal of two axes of ``a``, on the last axis (as numpy's diagonal), by a mask
    that autograd differentiates."""
    rest = [d for d in range(a.ndim) if d not in axes]
    moved = anp.transpose(a, rest + list(axes))
    return anp.sum(moved * np.eye(a.shape[axes[0]]), axis=-1)


DIAGONALS = {  # script, numpy loss, arrays, tensors to differentiate
    "one operand": ("L = SUM(M[i,i] * B[i])", lambda M, B: anp.sum(_diag(M) * B), ["M", "B"]),
    "alone": ("L = SUM(EXP(M[i,i]))", lambda M, B: anp.sum(anp.exp(_diag(M))), ["M"]),
    "twice in one operand": ("L = SUM(M[i,i] * M[i,i] * B[i])",
                             lambda M, B: anp.sum(_diag(M) ** 2 * B), ["M", "B"]),
    "several operands": ("L = SUM(M[i,i] * N[j,j] * M[i,j] * N[j,i])",
                         lambda M, N: anp.einsum("i,j,ij,ji->", _diag(M), _diag(N), M, N),
                         ["M", "N"]),
    "broadcast": ("L = SUM(TANH(M[i,i]) * B[j] + SIGMOID(M[j,j]))",
                  lambda M, B: anp.sum(anp.tanh(_diag(M))[:, None] * B[None, :]
                                       + 1 / (1 + anp.exp(-_diag(M)))[None, :]), ["M", "B"]),
    "three axes": ("T[i,k] = SUM(A3[i,i,j] * W[j,k]); L = SUM(TANH(T[i,k]) * C[k])",
                   lambda A3, W, C: anp.sum(anp.tanh(_diag(A3, (0, 1)).T @ W) * C),
                   ["A3", "W", "C"]),
    "outer axes": ("L = SUM(A3[i,j,i] * W[j,k] * C[i])",
                   lambda A3, W, C: anp.sum((_diag(A3, (0, 2)).T @ W) * C[:, None]),
                   ["A3", "W", "C"]),
    "all three": ("L = SUM(LOG(Q[i,i,i]) * B[i])",
                  lambda Q, B: anp.sum(anp.log(_diag(_diag(Q))) * B), ["Q", "B"]),
    "max of a diagonal": ("Mx[j] = MAX(A3[i,i,j] * C[i]); L = SUM(Mx[j] * Mx[j])",
                          lambda A3, C: anp.sum(anp.max(_diag(A3).T * C[:, None], axis=0) ** 2),
                          ["A3", "C"]),
    "prod of a diagonal": ("P = PROD(M[i,i] + 2); L = P * P",
                           lambda M, B: anp.prod(_diag(M) + 2) ** 2, ["M"]),
    "of an intermediate": ("P[i,j] = SUM(M[i,k] * N[k,j]); L = SUM(SQUARE(P[i,i]))",
                           lambda M, N: anp.sum(_diag(M @ N) ** 2), ["M", "N"]),
    # the derivative is a constant: on the diagonal only, not on every element
    "trace": ("L = SUM(M[i,i])", lambda M, B: anp.sum(_diag(M)), ["M"]),
    "trace by EINSUM": ("L = EINSUM('ii', M)", lambda M, B: anp.sum(_diag(M)), ["M"]),
    "scaled trace": ("L = SUM(M[i,i] * 2.0)", lambda M, B: anp.sum(_diag(M) * 2.0), ["M"]),
    "trace through a result": ("D[i] = M[i,i] * 3; L = SUM(D[i])",
                               lambda M, B: anp.sum(_diag(M) * 3), ["M"]),
    "trace and a product": ("L = SUM(M[i,i]) + SUM(M[i,j] * B[j])",
                            lambda M, B: anp.sum(_diag(M)) + anp.sum(M @ B), ["M", "B"]),
}


@pytest.mark.parametrize("case", sorted(DIAGONALS))
def test_gradient_through_a_diagonal(con, case):
    """The gradient of a diagonal read M[i,i] is written on the diagonal (an extended einsum
    whose output repeats the label), 0 elsewhere: against autograd and finite differences."""
    script, f, wrt = DIAGONALS[case]
    rng = np.random.default_rng(20)
    pool = {"M": rng.normal(size=(4, 4)), "N": rng.normal(size=(4, 4)), "B": B,
            "A3": rng.normal(size=(3, 3, 4)), "W": rng.normal(size=(4, 3)),
            "C": np.array([0.7, -1.3, 0.4]), "Q": rng.uniform(0.5, 2.0, size=(4, 4, 4))}
    if case == "outer axes":
        pool["A3"] = rng.normal(size=(3, 4, 3))
    names = [n for n in pool if n in f.__code__.co_varnames[:f.__code__.co_argcount]]
    arrays = {n: pool[n] for n in names}
    check(con, arrays, script, f, wrt)
    for w in wrt:  # the gradient is a tensor of its own shape, 0 off the read diagonal
        assert con.tensor(f"g_{w}").shape == arrays[w].shape


def test_diagonal_gradients_with_odd_pieces_and_absent_tiles(con):
    """A diagonal read of a block-sparse tensor with odd stored tiles, planned with pieces that
    do not divide the size: the gradient's tiles off the diagonal are absent (zeros)."""
    rng = np.random.default_rng(21)
    m = rng.normal(size=(7, 7))
    m[:3, 3:] = 0
    m[3:, :3] = 0   # two of the four 3x3-tiled blocks (and their neighbours) absent
    x = rng.normal(size=(7, 5))
    con.load("M", m, tile=(3, 3))
    assert con.store.meta("M").tile_count < con.store.meta("M").total_tiles
    con.load("X", x, tile=(2, 5))
    con.set("workers", 3)
    con.execute("D[i,k] = SUM(M[i,i] * M[i,j] * X[j,k]) WITH (PIECES i 3, j 2, k 2); "
                "L = SUM(TANH(D[i,k])) + SUM(M[i,i] * M[i,i]) WITH (PIECES i 4); "
                "gM = GRAD(L, M); gX = GRAD(L, X)")
    f = lambda M, X: anp.sum(anp.tanh(_diag(M)[:, None] * (M @ X))) + anp.sum(_diag(M) ** 2)
    arrays = {"M": m, "X": x}
    np.testing.assert_allclose(con.tensor("L"), f(**arrays), rtol=1e-12)
    for k, name in (("M", "gM"), ("X", "gX")):
        oracle = autograd.grad(lambda v, k=k: f(**{**arrays, k: v}))(arrays[k])
        np.testing.assert_allclose(con.tensor(name), oracle, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor(name), finite_differences(f, arrays, k),
                                   rtol=1e-5, atol=1e-6)
    # the backward operation that writes the diagonal shows it, and EXPLAIN plans it
    text = con.explain("L2 = SUM(M[i,i] * X[i,k]); g2 = GRAD(L2, M)")
    row = next(line for line in text.splitlines() if "backward g2[i,i] = " in line)
    assert len(re.findall(r"\bi=\d+", row)) == 1  # the label's pieces are shown once


def test_block_sparse_inputs_and_odd_tilings(con):
    """Absent tiles (zero blocks) and pieces that do not divide the sizes."""
    rng = np.random.default_rng(4)
    s = rng.normal(size=(7, 6))
    s[:4, :3] = 0
    s[4:, 3:] = 0
    w = rng.normal(size=(6, 5))
    v = rng.normal(size=5)
    con.load("S", s, tile=(4, 3))
    assert con.store.meta("S").tile_count < con.store.meta("S").total_tiles
    con.load("W", w, tile=(5, 2))
    con.load("V", v, tile=(3,))
    con.set("workers", 3)
    f = lambda S, W, V: anp.sum(anp.tanh(S @ W) * V) + anp.sum(anp.max(S @ W, axis=1))
    script = ("P[i,k] = SUM(S[i,j] * W[j,k]) WITH (PIECES i 3, k 2, j 2); "
              "M[i] = MAX(P[i,k]) WITH (PIECES i 2); "
              "L = SUM(TANH(P[i,k]) * V[k]) + SUM(M[i]); "
              "g_S = GRAD(L, S); g_W = GRAD(L, W); g_V = GRAD(L, V)")
    con.execute(script)
    arrays = {"S": s, "W": w, "V": v}
    np.testing.assert_allclose(con.tensor("L"), f(**arrays), rtol=1e-12)
    for k in arrays:
        oracle = autograd.grad(lambda x, k=k: f(**{**arrays, k: x}))(arrays[k])
        np.testing.assert_allclose(con.tensor(f"g_{k}"), oracle, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(con.tensor(f"g_{k}"), finite_differences(f, arrays, k),
                                   rtol=1e-5, atol=1e-6)


def test_diagonal_writes_in_pieces(con):
    """An extended einsum whose output repeats a label (what a diagonal's gradient is), planned
    in odd pieces: its tiles on the diagonal are computed (by BLAS where the distinct labels make
    a matmul), those off it are absent, and a later operation re-tiles it as zeros there."""
    from tensordb.plan.ir import EinGraph, EinOp, TensorInfo
    rng = np.random.default_rng(22)
    v, w = rng.normal(size=(7, 4)), rng.normal(size=(4, 5))
    con.load("V", v, tile=(3, 4))
    con.load("W", w, tile=(4, 2))
    sizes = {"i": 7, "k": 4, "j": 5, "m": 7}
    write = EinOp.contraction("Dg", "iij", [("V", "ik"), ("W", "kj")], sizes)
    assert write.writes_diagonal and write.out_shape == (7, 7, 5)
    read = EinOp.contraction("S", "mj", [("Dg", "imj")], sizes)
    graph = EinGraph((TensorInfo("V", (7, 4), "float64"), TensorInfo("W", (4, 5), "float64")),
                     (write, read), ("Dg", "S"))
    con.run(graph, pieces={"Dg": {"i": 3, "j": 2, "k": 2}, "S": {"m": 2, "i": 2}})
    expected = np.zeros((7, 7, 5))
    expected[np.arange(7), np.arange(7)] = v @ w
    np.testing.assert_allclose(con.tensor("Dg"), expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(con.tensor("S"), v @ w, rtol=1e-12, atol=1e-14)
    meta = con.store.meta("Dg")
    assert meta.tile_count == 3 * 2  # the 3 diagonal tiles of i, times 2 pieces of j
    assert meta.dims == ("d0", "d1", "d2")
    # the gradient itself, in pieces: GRAD of a numpy-form diagonal read through Graph
    m = rng.normal(size=(7, 7))
    con.load("M", m, tile=(2, 3))
    con.load("B", v[:, 0].copy())
    con.run(Graph().einsum("ii,i->", "M", "B", into="L").grad("L", ["M", "B"], into=["gM", "gB"]),
            pieces={"gM": {"i": 3}})
    np.testing.assert_array_equal(con.tensor("gM"), np.diag(v[:, 0]))
    np.testing.assert_array_equal(con.tensor("gB"), np.diag(m))
    assert con.store.meta("gM").tile_count == 3


def test_unused_tensor_gets_zeros_and_a_gradient_warning(con):
    """Zeros (also where U holds NaN or inf), with a tensordb.GradientWarning naming the
    statement, and no numpy warning."""
    con.load("A", A)
    con.load("U", np.array([[np.nan, np.inf], [1.0, -np.inf]]))
    text = "L = SUM(A[i,j] * A[i,j]); gU = GRAD(L, U); gA = GRAD(L, A)"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error")
        warnings.simplefilter("always", tensordb.Warning)
        con.execute(text)
    assert [type(w.message) for w in seen] == [tensordb.GradientWarning]
    message = str(seen[0].message)
    assert "GRAD(L, U) is zeros: 'L' does not read 'U'" in message
    caret = message.splitlines()[2].index("^") - len("LINE 1: ")
    assert text[caret:].startswith("U); gA")
    np.testing.assert_array_equal(con.tensor("gU"), np.zeros((2, 2)))
    np.testing.assert_allclose(con.tensor("gA"), 2 * A)


def test_gradient_of_the_loss_itself_is_one(con):
    con.load("A", A)
    con.execute("L = SUM(A[i,j]); gL = GRAD(L, L)")
    assert float(con.tensor("gL")) == 1.0


def test_non_scalar_loss_is_a_binder_error_with_caret(con):
    con.load("A", A)
    con.load("B", B)
    script = "V[i] = SUM(A[i,j] * B[j]); g = GRAD(V, A)"
    with pytest.raises(BinderError) as info:
        con.execute(script)
    err = info.value
    assert "not a scalar" in err.message and "(3,)" in err.message
    assert script[err.span.start:err.span.end] == "V"
    assert "^" in str(err)
    assert not con.store.has("V") and not con.store.has("g")


@pytest.mark.parametrize("script, message, at", [
    ("g = GRAD(A, B)", "stored tensor", "A"),
    ("g = GRAD(Nope, B)", "unknown", "Nope"),
    ("L = SUM(A[i,j]); g = GRAD(L)", "two tensor names", "GRAD(L)"),
    ("L = SUM(A[i,j]); g = GRAD(L, A[i,j])", "two tensor names", "A[i,j]"),
    ("L = SUM(A[i,j]); g = GRAD(L, Nope)", "unknown tensor", "Nope"),
    ("L = SUM(A[i,j]); g[i] = GRAD(L, A)", "2 label(s), not 1", "g[i]"),
    ("L = SUM(A[i,j]); g[i,j] = 2 * GRAD(L, A)", "whole right side", "GRAD"),
    ("LET g = GRAD(A, B)", "stored tensor", "A"),
])
def test_grad_errors_point_at_the_source(con, script, message, at):
    con.load("A", A)
    con.load("B", B)
    with pytest.raises(Error) as info:
        con.execute(script)
    err = info.value
    assert message in err.message
    assert script[err.span.start:err.span.end] == at
    assert not con.store.has("L") and not con.store.has("g")


def test_grad_of_a_let_and_through_a_let(con):
    """The loss may read a LET; GRAD of the LET itself is the gradient at that intermediate."""
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=(3, 2))
    con.load("X", x)
    con.load("W", w)
    con.execute("LET H[b,f] = TANH(SUM(X[b,d] * W[d,f])); L = SUM(H[b,f] * H[b,f]); "
                "gW = GRAD(L, W); gH = GRAD(L, H)")
    h = np.tanh(x @ w)
    np.testing.assert_allclose(con.tensor("gH"), 2 * h)
    np.testing.assert_allclose(con.tensor("gW"), x.T @ (2 * h * (1 - h * h)))


def test_let_grad_is_computed_where_used_and_never_stored(con):
    """LET dW = GRAD(L, W): the gradient is an intermediate of the statements that use it."""
    rng = np.random.default_rng(11)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=3)
    con.load("X", x)
    con.load("W", w)
    r = con.execute("P[b] = SUM(X[b,d] * W[d]); L = SUM(SQUARE(P[b])); LET dW = GRAD(L, W); "
                    "W[d] = W[d] - 0.1 * dW[d]")
    assert r.name == "W"
    assert not con.store.has("dW")
    np.testing.assert_allclose(con.tensor("W"), w - 0.1 * (2 * x.T @ (x @ w)), rtol=1e-12)
    assert con.execute("DESCRIBE dW").fetchall()[2] == ("shape", (3,))


def test_a_let_is_computed_again_after_what_it_reads_changes(con):
    """In one group, a LET used after a tensor it reads was reassigned (or after the LET was
    redefined, or a LET it reads was) sees the new values: a training step's LETs follow the
    weights."""
    con.load("W", np.array([1.0, 2.0]))
    con.execute("LET H[i] = W[i] * 2; LET G[i] = H[i] + 1; A[i] = G[i]; W[i] = W[i] + 1; "
                "B[i] = G[i]; LET H[i] = W[i] * 10; C[i] = G[i]; D[i] = H[i] + A[i]")
    w = np.array([1.0, 2.0])
    np.testing.assert_array_equal(con.tensor("A"), 2 * w + 1)
    np.testing.assert_array_equal(con.tensor("B"), 2 * (w + 1) + 1)
    np.testing.assert_array_equal(con.tensor("C"), 10 * (w + 1) + 1)
    np.testing.assert_array_equal(con.tensor("D"), 10 * (w + 1) + 2 * w + 1)
    np.testing.assert_array_equal(con.tensor("W"), w + 1)


def test_float32_gradient_keeps_the_dtype(con):
    rng = np.random.default_rng(6)
    x, w = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)
    con.load("X", x)
    con.load("W", w)
    con.execute("P[b,f] = SUM(X[b,d] * W[d,f]); L = SUM(P[b,f] * P[b,f]); gW = GRAD(L, W)")
    got = con.tensor("gW")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x.T.astype(np.float64) @ (2 * (x.astype(np.float64) @ w)),
                               rtol=1e-5)


def _mlp_step(lr=0.1):
    return (f"H[b,h] = RELU(SUM(X[b,d] * W1[d,h])); "
            f"Z[b,o] = SUM(H[b,h] * W2[h,o]); "
            f"M[b] = MAX(Z[b,o]); "
            f"L = SUM(LOG(SUM(EXP(Z[b,o] - M[b]))) + M[b] - SUM(Y[b,o] * Z[b,o])) / 8; "
            f"dW1 = GRAD(L, W1); dW2 = GRAD(L, W2); "
            f"W1[d,h] = W1[d,h] - {lr} * dW1[d,h]; W2[h,o] = W2[h,o] - {lr} * dW2[h,o];")


def _numpy_step(x, y, w1, w2, lr=0.1):
    """One SGD step of the same MLP written by hand in numpy (float64)."""
    pre = x @ w1
    h = np.maximum(pre, 0)
    z = h @ w2
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    p = e / e.sum(1, keepdims=True)
    loss = np.sum(np.log(e.sum(1)) + m[:, 0] - np.sum(y * z, 1)) / len(x)
    dz = (p - y) / len(x)
    dw2 = h.T @ dz
    dh = dz @ w2.T
    dw1 = x.T @ (dh * (pre > 0))
    return loss, w1 - lr * dw1, w2 - lr * dw2


def test_sgd_steps_track_numpy(con):
    """SGD steps of a 2-layer MLP with softmax cross-entropy, in SQL (three steps in one execute
    call, then two more in calls of their own) track the same steps in numpy in float64."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(8, 5))
    y = np.eye(3)[rng.integers(0, 3, size=8)]
    w1, w2 = rng.normal(size=(5, 6)) * 0.5, rng.normal(size=(6, 3)) * 0.5
    for k, v in {"X": x, "Y": y, "W1": w1, "W2": w2}.items():
        con.load(k, v)
    con.execute(_mlp_step() * 3)
    losses = []
    for _ in range(3):
        loss, w1, w2 = _numpy_step(x, y, w1, w2)
        losses.append(loss)
    np.testing.assert_allclose(con.tensor("L"), losses[-1], rtol=1e-12)
    np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-12, atol=1e-14)
    for _ in range(2):
        con.execute(_mlp_step())
        loss, w1, w2 = _numpy_step(x, y, w1, w2)
        np.testing.assert_allclose(con.tensor("L"), loss, rtol=1e-12)
        losses.append(loss)
    np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-12, atol=1e-14)
    assert losses[-1] < losses[0]


def test_several_grads_share_one_backward_pass_and_explain_marks_it(con):
    rng = np.random.default_rng(8)
    for k, shape in {"X": (8, 5), "Y": (8, 3), "W1": (5, 6), "W2": (6, 3)}.items():
        con.load(k, rng.normal(size=shape))
    fwd = _mlp_step().split("dW1 =")[0]

    def ops(script):
        text = con.explain(script)
        return [line for line in text.splitlines() if line.strip()[:1].isdigit()], text
    both, text = ops(fwd + "dW1 = GRAD(L, W1); dW2 = GRAD(L, W2)")
    one, _ = ops(fwd + "dW1 = GRAD(L, W1)")
    two, _ = ops(fwd + "dW2 = GRAD(L, W2)")
    forward, _ = ops(fwd.rstrip("; "))
    assert len(both) - len(forward) < (len(one) - len(forward)) + (len(two) - len(forward))
    backward = [line for line in both if "backward" in line]
    assert len(backward) == len(both) - len(forward)
    assert any("backward dW1[" in line for line in backward)
    assert not con.store.has("dW1")  # EXPLAIN runs nothing


def test_graph_grad(con):
    rng = np.random.default_rng(9)
    a, b, u = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=2)
    for k, v in {"A": a, "B": b, "U": u}.items():
        con.load(k, v)
    g = (Graph().einsum("ij,j->i", "A", "B", into="v", store=False)
         .op("L", "", [("v", "i")], join="exp(x0)", agg="max")
         .grad("L", ["A", "B", "U"]))
    con.run(g)
    f = lambda A, B: anp.max(anp.exp(A @ B))
    np.testing.assert_allclose(con.tensor("dA"), autograd.grad(lambda x: f(x, b))(a))
    np.testing.assert_allclose(con.tensor("dB"), autograd.grad(lambda x: f(a, x))(b))
    np.testing.assert_array_equal(con.tensor("dU"), np.zeros(2))
    con.run(Graph().einsum("ij,ij->", "A", "A", into="S").grad("S", "A", into="gA"))
    np.testing.assert_allclose(con.tensor("gA"), 2 * a)
    with pytest.raises(BinderError) as info:
        con.run(Graph().einsum("ij,j->i", "A", "B", into="w").grad("w", "A"))
    assert "not a scalar" in info.value.message and "^" in str(info.value)
    with pytest.raises(BinderError) as info:
        con.run(Graph().grad("A", "B"))
    assert "not computed" in info.value.message


def test_finite_differences_through_tensordb(con):
    """The gradient against central differences of tensordb's own forward pass (tiny sizes)."""
    rng = np.random.default_rng(10)
    a, b = rng.normal(size=(2, 3)), rng.normal(size=3)
    con.load("A", a)
    con.load("B", b)
    forward = "L = SUM(SIGMOID(A[i,j] * B[j]) * TANH(A[i,j]))"
    con.execute(forward + "; gA = GRAD(L, A)")
    got = con.tensor("gA")
    fd = np.zeros_like(a)
    for idx in np.ndindex(*a.shape):
        vals = []
        for step in (1e-6, -1e-6):
            x = a.copy()
            x[idx] += step
            con.load("A", x, replace=True)
            con.execute(forward)
            vals.append(float(con.tensor("L")))
        fd[idx] = (vals[0] - vals[1]) / 2e-6
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-7)


def test_int_tensor_gets_a_float64_gradient_and_empty_tensors_work(con):
    k = np.array([1, -2, 3], dtype=np.int64)
    con.load("A", A[:, :3].copy())
    con.load("K", k)
    con.execute("L = SUM(A[i,j] * K[j] * K[j]); gK = GRAD(L, K); gA = GRAD(L, A)")
    assert con.tensor("gK").dtype == np.float64
    np.testing.assert_allclose(con.tensor("gK"), 2 * k * A[:, :3].sum(0))
    np.testing.assert_allclose(con.tensor("gA"), np.broadcast_to(k * k, (3, 3)))
    con.load("E", np.zeros((0, 2)))
    con.load("v", np.array([1.5, 2.0]))
    con.execute("L = SUM(E[i,j] * v[j]); gE = GRAD(L, E); gv = GRAD(L, v)")
    assert con.tensor("gE").shape == (0, 2)
    np.testing.assert_array_equal(con.tensor("gv"), np.zeros(2))


@pytest.mark.gpu
def test_sgd_step_on_the_gpu_executor(tmp_path):
    """The backward pass's internal functions (_eq, _gt, _sign) run on CuPy too."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=(8, 5))
    y = np.eye(3)[rng.integers(0, 3, size=8)]
    w1, w2 = rng.normal(size=(5, 6)) * 0.5, rng.normal(size=(6, 3)) * 0.5
    with tensordb.connect(tmp_path / "db", executor="gpu") as con:
        for k, v in {"X": x, "Y": y, "W1": w1, "W2": w2}.items():
            con.load(k, v)
        con.execute(_mlp_step() + "A1 = SUM(ABS(W1[d,h])); gA = GRAD(A1, W1);")
        loss, w1n, w2n = _numpy_step(x, y, w1, w2)
        np.testing.assert_allclose(con.tensor("L"), loss, rtol=1e-12)
        np.testing.assert_allclose(con.tensor("W1"), w1n, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(con.tensor("W2"), w2n, rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(con.tensor("gA"), np.sign(w1n))
        # a diagonal's gradient: written onto the diagonal by index arrays on the device
        m = rng.normal(size=(5, 5))
        con.load("M", m, tile=(2, 2))
        con.run(Graph().einsum("ii,ij->", "M", "M", into="T").grad("T", "M", into="gM"),
                pieces={"gM": {"d0": 3, "d1": 2}})
        expected = np.broadcast_to(np.diag(m)[:, None], (5, 5)).copy()
        expected[np.arange(5), np.arange(5)] += m.sum(1)
        np.testing.assert_allclose(con.tensor("gM"), expected, rtol=1e-12)


def test_grad_in_a_block_and_of_a_result_computed_in_the_group(con):
    """BEGIN ... COMMIT is one group; GRAD of a result the group computed (P) is the gradient at
    that intermediate, and the tensors it was computed from still get theirs."""
    rng = np.random.default_rng(13)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=(3, 2))
    con.load("X", x)
    con.load("W", w)
    con.execute("BEGIN")
    con.execute("P[b,f] = SUM(X[b,d] * W[d,f])")
    con.execute("L = SUM(EXP(P[b,f]))")
    con.execute("gP = GRAD(L, P); gW = GRAD(L, W)")
    assert not con.store.has("gP")
    con.execute("COMMIT")
    p = x @ w
    np.testing.assert_allclose(con.tensor("gP"), np.exp(p))
    np.testing.assert_allclose(con.tensor("gW"), x.T @ np.exp(p))


POW_AT_ZERO = {  # script, numpy loss, tensor to differentiate: where a^b's derivative is 0
    "exponent 0, base 0": ("L = SUM(POW(A[i], 0) * W[i])", lambda A, W: anp.sum(A ** 0.0 * W),
                           "A"),
    "tensor exponent 0 at base 0": ("L = SUM(POW(A[i], E[i]))", lambda A, E: anp.sum(A ** E),
                                    "A"),
    "base 0, in the exponent": ("L = SUM(POW(A[i], E[i]))", lambda A, E: anp.sum(A ** E), "E"),
    "constant base 0": ("L = SUM(POW(0.0, E[i]) * W[i])", lambda E, W: anp.sum(0.0 ** E * W),
                        "E"),
}


@pytest.mark.parametrize("case", sorted(POW_AT_ZERO))
def test_pow_gradient_where_the_derivative_is_zero(con, case):
    """d(a^b)/da is 0 where b = 0 (a^0 is 1) and d(a^b)/db is 0 where a = 0 (0^b is 0 for
    b > 0), as autograd gives them: once NaN (0 * inf, 0 * log 0). Finite differences do not
    apply at a = 0 (a^b is not differentiable from both sides there)."""
    script, f, wrt = POW_AT_ZERO[case]
    pool = {"A": np.array([0.0, 2.0, 0.0, 1.5]), "E": np.array([0.0, 3.0, 2.0, 0.0]),
            "W": np.array([1.0, -2.0, 0.5, 3.0])}
    names = f.__code__.co_varnames[:f.__code__.co_argcount]
    arrays = {n: pool[n] for n in names}
    check(con, arrays, script, f, [wrt], fd=False)
    assert np.isfinite(con.tensor(f"g_{wrt}")).all()


def test_pow_gradient_of_an_integer_base_to_the_power_0(con):
    """An integer base to the power 0 (a constant, or an integer exponent holding 0) has the
    derivative 0: once an error (an integer to the power -1)."""
    con.load("X", np.array([0, 2, 3], np.int64))
    con.load("K", np.array([0, 2, 0], np.int64))
    con.load("W", np.array([1.0, 1.0, 2.0]))
    con.execute("L = SUM(POW(X[i], 0) * W[i]); g = GRAD(L, X)")
    np.testing.assert_array_equal(con.tensor("g"), np.zeros(3))
    con.execute("L = SUM(POW(X[i], K[i]) * W[i]); g = GRAD(L, X)")
    x, k, w = np.array([0.0, 2.0, 3.0]), np.array([0.0, 2.0, 0.0]), np.array([1.0, 1.0, 2.0])
    np.testing.assert_allclose(con.tensor("g"), autograd.grad(
        lambda x: anp.sum(x ** k * w))(x))


def test_a_grad_after_its_tensor_is_reassigned_differentiates_the_new_one(con):
    """GRAD(L, W) after W was assigned means the new W, which L (computed before) does not
    depend on: zeros, whatever other GRADs of L the group has (once it depended on them: an
    earlier GRAD of L made it the old W's gradient)."""
    con.load("W", np.array([1.0, 2.0, 3.0]))
    con.load("V", np.array([4.0, 5.0, 6.0]))
    for script in ["L = SUM(W[i] * V[i]); W[i] = W[i] + 1; gW = GRAD(L, W)",
                   "L = SUM(W[i] * V[i]); gV = GRAD(L, V); W[i] = W[i] + 1; gW = GRAD(L, W)",
                   "L = SUM(W[i] * V[i]); gV = GRAD(L, V); W[i] = W[i] + 1; gW = GRAD(L, W); "
                   "W[i] = W[i] + 0"]:
        con.load("W", np.array([1.0, 2.0, 3.0]), replace=True)
        con.execute(script)
        np.testing.assert_array_equal(con.tensor("gW"), np.zeros(3))
        np.testing.assert_array_equal(con.tensor("W"), [2.0, 3.0, 4.0])


def test_a_stored_gradient_read_after_the_update_is_the_one_the_update_used(con):
    """The gradient's norm after an SGD step, one and two steps in one call, against numpy."""
    x = np.array([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]])
    y = np.array([1.0, 0.0, 2.0])
    w0 = np.array([0.3, -0.2])
    step = ("P[b] = SUM(X[b,d] * W[d]); L = SUM(SQUARE(P[b] - y[b])); gW = GRAD(L, W); "
            "W[d] = W[d] - 0.01 * gW[d]; N = SUM(gW[d] * gW[d]);")
    for k in (1, 2):
        for name, a in {"X": x, "y": y, "W": w0}.items():
            con.load(name, a, replace=True)
        con.execute(step * k)
        w = w0
        for _ in range(k):
            g = 2 * x.T @ (x @ w - y)
            w, n = w - 0.01 * g, g @ g
        np.testing.assert_allclose(float(con.tensor("N")), n, rtol=1e-12)
        np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-12)


def test_a_grad_into_the_name_it_differentiates_then_another(con):
    """W = GRAD(L, W) stores the gradient as W; a later GRAD(L, W) is then with respect to
    that gradient (zeros). Once an InternalError (KeyError)."""
    x, w = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[0.5, -1.0], [2.0, 0.25]])
    con.load("X", x)
    con.load("W", w)
    con.execute("L = SUM(X[i,j] * W[j,k]); W = GRAD(L, W); g = GRAD(L, W)")
    np.testing.assert_allclose(con.tensor("W"), autograd.grad(lambda W: anp.sum(x @ W))(w))
    np.testing.assert_array_equal(con.tensor("g"), np.zeros((2, 2)))


@pytest.mark.parametrize("agg,fn", [("MAX", lambda a: anp.max(a, axis=1)),
                                    ("MIN", lambda a: anp.min(a, axis=1)),
                                    ("PROD", lambda a: anp.prod(a, axis=1))])
def test_two_losses_sharing_an_aggregate_each_get_their_grad(con, agg, fn):
    """MAX, MIN and PROD's backward needs helper tensors (the count of maxima, the zeros):
    named for their pass, two losses of one group no longer define them twice."""
    a = np.array([[0.5, 2.0, -1.0], [1.5, 0.25, 3.0]])
    u = np.array([0.7, -1.3])
    con.load("A", a)
    con.load("u", u)
    con.execute(f"M[i] = {agg}(A[i,j]); L1 = SUM(M[i] * u[i]); L2 = SUM(M[i] * M[i]); "
                "g1 = GRAD(L1, A); g2 = GRAD(L2, A)")
    np.testing.assert_allclose(con.tensor("g1"), autograd.grad(lambda A: anp.sum(fn(A) * u))(a))
    np.testing.assert_allclose(con.tensor("g2"), autograd.grad(lambda A: anp.sum(fn(A) ** 2))(a))


def test_graph_grad_called_twice_for_one_loss(con):
    """Graph.grad(L, A).grad(L, B): two backward passes of L in one graph, their tensors
    named apart (once 'dL/dv#1' was defined twice); each against autograd."""
    rng = np.random.default_rng(11)
    a, b = rng.normal(size=(4, 3)), rng.normal(size=3)
    con.load("A", a)
    con.load("B", b)
    g = (Graph().einsum("ij,j->i", "A", "B", into="v", store=False)
         .op("M", "", [("v", "i")], join="exp(x0)", agg="max", store=False)
         .op("S", "", [("v", "i")], join="x0 * x0", store=False)
         .op("L", "", [("M", ""), ("S", "")], join="x0 + x1"))
    con.run(g.grad("L", "A").grad("L", "B"))

    def f(A, B):
        return anp.max(anp.exp(A @ B)) + anp.sum((A @ B) ** 2)
    np.testing.assert_allclose(con.tensor("dA"), autograd.grad(f, 0)(a, b), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("dB"), autograd.grad(f, 1)(a, b), rtol=1e-12)


@pytest.mark.parametrize("fn,np_fn", [("RELU", lambda z: anp.maximum(z, 0.0)),
                                      ("ABS", anp.abs), ("TANH", anp.tanh)])
def test_a_gradient_of_a_gradient(con, fn, np_fn):
    """GRAD of a loss written with a gradient: the backward's masks (RELU's z > 0, MAX's
    x == max) are steps, whose derivative is 0 where it exists (once: 'the function _GT has
    no derivative'). Pre-activations away from 0, where RELU and ABS have derivatives."""
    x = np.array([[1.0, 2.0], [0.5, -1.0], [2.0, 0.3]])
    w = np.array([[0.3, -0.2], [0.1, 0.4]])
    con.load("X", x)
    con.load("W", w)
    con.execute(f"P[b,h] = {fn}(SUM(X[b,d] * W[d,h])); L = SUM(P[b,h] * P[b,h]); "
                "gW = GRAD(L, W); L2 = SUM(gW[d,h] * gW[d,h]); hW = GRAD(L2, W)")

    def f(W):
        p = np_fn(x @ W)
        return anp.sum(p * p)
    np.testing.assert_allclose(con.tensor("hW"),
                               autograd.grad(lambda W: anp.sum(autograd.grad(f)(W) ** 2))(w),
                               rtol=1e-12)
