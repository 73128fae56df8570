"""ARGMAX and ARGMIN (numpy.argmax / argmin over one label: first occurrence, the first NaN wins,
int64), in the dialect and the Python API, against numpy, on tiled tensors with absent tiles;
the label they aggregate is one piece whatever the hints say (EXPLAIN shows it)."""
from __future__ import annotations

import json

import warnings

import numpy as np
import pytest

import tensordb
from tensordb.errors import BinderError, DataError
from tensordb.plan.builder import Graph


@pytest.fixture
def con(disk_con):
    """The tests here run on an on-disk database (conftest's ``disk_con``)."""
    return disk_con


def _values(rng, shape, dtype):
    x = rng.integers(-3, 4, size=shape)  # small integers: many ties
    if dtype == "bool":
        return x > 0
    x = x.astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[rng.random(shape) < 0.05] = np.nan
        x[rng.random(shape) < 0.03] = -np.inf
    return x


@pytest.mark.parametrize("seed", range(16))
def test_random_argmax_argmin(tmp_path, seed):
    rng = np.random.default_rng(seed)
    dtype = ["float64", "float32", "int32", "int64", "bool"][seed % 5]
    shape = (int(rng.integers(1, 9)), int(rng.integers(1, 11)))
    x = _values(rng, shape, dtype)
    if seed % 3 == 0:
        x[: shape[0] // 2] = 0  # whole zero tiles: absent when stored
    tile = (int(rng.integers(1, shape[0] + 1)), int(rng.integers(1, shape[1] + 1)))
    fn = "argmax" if seed % 2 else "argmin"
    with tensordb.connect(tmp_path / "db", workers=1 + seed % 2) as con:
        con.load("X", x, tile=tile)
        hint = " WITH (PIECES j 2)" if seed % 4 == 1 and shape[1] > 1 else ""
        con.execute(f"r[i] = {fn.upper()}(X[i,j]){hint}; c[j] = {fn.upper()}(X[i,j])")
        for name, axis in (("r", 1), ("c", 0)):
            got = con.tensor(name)
            want = getattr(np, fn)(x, axis=axis)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, want, err_msg=f"{fn} axis {axis}\n{x}")
        # of an expression, nested under arithmetic
        if dtype != "bool":
            con.execute(f"e[i] = 2 * {fn.upper()}(X[i,j] * X[i,j] - X[i,j]) + 1")
            with np.errstate(all="ignore"):
                np.testing.assert_array_equal(con.tensor("e"),
                                              2 * getattr(np, fn)(x * x - x, axis=1) + 1)


def test_argmax_of_three_labels_and_nan_rule(con):
    x = np.array([[[1.0, 5.0, 5.0], [np.nan, 2.0, np.nan]],
                  [[-np.inf, -np.inf, -np.inf], [0.0, 0.0, 3.0]]])
    con.load("X", x, tile=(1, 1, 2))
    con.execute("a[i,k] = ARGMAX(X[i,k,j]); b[i,j] = ARGMIN(X[i,k,j]); m[k,j] = ARGMAX(X[i,k,j])")
    np.testing.assert_array_equal(con.tensor("a"), x.argmax(axis=2))
    np.testing.assert_array_equal(con.tensor("b"), x.argmin(axis=1))
    np.testing.assert_array_equal(con.tensor("m"), x.argmax(axis=0))


def test_accuracy_of_a_classifier(con):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(12, 5))
    y = np.eye(5)[rng.integers(0, 5, 12)]
    con.load("Z", logits, tile=(4, 2))
    con.load("Y", y)
    con.execute("hit[b] = ARGMAX(Z[b,c]) = ARGMAX(Y[b,k]); acc = SUM(1.0 * hit[b]) / 12")
    assert con.tensor("hit").dtype == np.bool_
    np.testing.assert_allclose(con.tensor("acc"), np.mean(logits.argmax(1) == y.argmax(1)))


def test_python_api(con):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 7))
    con.load("X", x, tile=(3, 3))
    con.einsum("ij->i", "X", into="r", agg="argmax", pieces={"j": 3})
    np.testing.assert_array_equal(con.tensor("r"), x.argmax(1))
    g = Graph()
    g.op("s", "j", [("X", "ij")], join="-x0", agg="argmin")
    con.run(g)
    np.testing.assert_array_equal(con.tensor("s"), (-x).argmin(0))
    with pytest.raises(BinderError, match="exactly one label"):
        con.einsum("ij->", "X", into="t", agg="argmax")


def test_the_label_is_one_piece(con):
    con.load("X", np.arange(64.0).reshape(8, 8), tile=(2, 2))
    plan = json.loads(con.explain("r[i] = ARGMAX(X[i,j]) WITH (PIECES j 4, i 2)", format="json"))
    node = plan["nodes"][0]
    assert node["pieces"]["j"] == 1 and node["pieces"]["i"] == 2
    assert "argmax over j (one piece)" in con.explain("r[i] = ARGMAX(X[i,j])")
    con.execute("r[i] = ARGMAX(X[i,j]) WITH (PIECES j 4, i 2)")
    np.testing.assert_array_equal(con.tensor("r"), np.full(8, 7))


def test_errors(con):
    con.load("X", np.ones((2, 3)))
    con.load("E", np.ones((2, 0)))
    with pytest.raises(BinderError, match="exactly one label.*2: i, j"):
        con.execute("r = ARGMAX(X[i,j])")
    with pytest.raises(BinderError, match="ARGMIN takes one argument"):
        con.execute("r[i] = ARGMIN(X[i,j], 1)")
    with pytest.raises(DataError, match="ARGMAX over label 'j' of size 0"):
        con.execute("r[i] = ARGMAX(E[i,j])")
    with pytest.raises(BinderError, match="ARGMAX aggregates no label"):
        con.execute("r[i,j] = ARGMAX(X[i,j])")
    assert "r" not in [t["name"] for t in con.tensors()]


def test_argmax_has_no_gradient(con):
    rng = np.random.default_rng(4)
    x, z = rng.normal(size=(4, 3)), rng.normal(size=4)
    con.load("X", x)
    con.load("Z", z)
    con.execute("P[i] = 1.0 * ARGMAX(X[i,j]); L = SUM(P[i] * Z[i] * Z[i]); "
                "gX = GRAD(L, X); gZ = GRAD(L, Z)")
    np.testing.assert_array_equal(con.tensor("gX"), np.zeros_like(x))
    np.testing.assert_allclose(con.tensor("gZ"), 2 * x.argmax(1) * z)


# -- MEAN (AVG) and COUNT ------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_random_mean_and_count(tmp_path, seed):
    rng = np.random.default_rng(100 + seed)
    dtype = ["float64", "float32", "int32", "int64", "bool", "float32"][seed % 6]
    shape = (int(rng.integers(1, 7)), int(rng.integers(1, 8)), int(rng.integers(1, 4)))
    x = (rng.normal(size=shape) * 4).astype(dtype)
    if seed % 3 == 0:
        x[: shape[0] // 2] = 0  # absent tiles
    tile = tuple(int(rng.integers(1, n + 1)) for n in shape)
    mean = "MEAN" if seed % 2 else "AVG"
    rtol = 1e-5 if dtype == "float32" else 1e-12
    with tensordb.connect(tmp_path / "db", workers=1 + seed % 2) as con:
        con.load("X", x, tile=tile)
        con.execute(f"m1[i,k] = {mean}(X[i,j,k]); m2[j] = {mean}(X[i,j,k]); m0 = {mean}(X[i,j,k]); "
                    f"c1[i] = COUNT(X[i,j,k]); c0 = COUNT(X[i,j,k]); "
                    f"d[i,j,k] = X[i,j,k] - {mean}(X[i,m,k]); "
                    f"r[i] = SUM(X[i,j,k] * 1.0) / COUNT(X[i,j,k])")
        for name, want in [("m1", x.mean(axis=1)), ("m2", x.mean(axis=(0, 2))), ("m0", x.mean()),
                           ("d", x - x.mean(axis=1, keepdims=True)),
                           ("r", (x * 1.0).sum(axis=(1, 2)) / (shape[1] * shape[2]))]:
            got = con.tensor(name)
            assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 10, err_msg=name)
        np.testing.assert_array_equal(con.tensor("c1"), np.full(shape[0], shape[1] * shape[2]))
        assert con.tensor("c1").dtype == np.int64
        assert con.tensor("c0") == x.size and con.tensor("c0").dtype == np.int64


def test_mean_over_nothing_is_nan(con):
    con.load("E", np.ones((3, 0)))
    con.execute("m[i] = MEAN(E[i,j]); c[i] = COUNT(E[i,j])")
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        want = np.ones((3, 0)).mean(axis=1)
    np.testing.assert_array_equal(con.tensor("m"), want)
    np.testing.assert_array_equal(con.tensor("c"), [0, 0, 0])


def test_mean_errors(con):
    con.load("X", np.ones((2, 3)))
    with pytest.raises(BinderError, match="MEAN takes one argument"):
        con.execute("m[i] = MEAN()")
    with pytest.raises(BinderError, match="MEAN aggregates no label"):
        con.execute("m[i,j] = MEAN(X[i,j])")
    with pytest.raises(BinderError, match="COUNT takes one argument"):
        con.execute("m[i] = COUNT(X[i,j], X[i,j])")


def test_mean_gradient_layer_norm_and_cross_entropy(con):
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")
    rng = np.random.default_rng(9)
    x, w = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    z, y = rng.normal(size=(6, 3)), np.eye(3)[rng.integers(0, 3, 6)]
    for n, a in {"X": x, "W": w, "Z": z, "Y": y}.items():
        con.load(n, a)
    con.execute("""
        LN[i,j] = (X[i,j] - MEAN(X[i,k])) / SQRT(MEAN(SQUARE(X[i,k] - MEAN(X[i,m]))) + 1e-5);
        L1 = MEAN(LN[i,j] * W[i,j]);
        lse[b] = LOG(SUM(EXP(Z[b,c])));
        L2 = MEAN(lse[b] - SUM(Y[b,c] * Z[b,c]));
        gX = GRAD(L1, X); gZ = GRAD(L2, Z)""")

    def l1(x):
        mu = anp.mean(x, axis=1, keepdims=True)
        var = anp.mean((x - anp.mean(x, axis=1, keepdims=True)) ** 2, axis=1, keepdims=True)
        return anp.mean((x - mu) / anp.sqrt(var + 1e-5) * w)

    def l2(z):
        return anp.mean(anp.log(anp.sum(anp.exp(z), axis=1)) - anp.sum(y * z, axis=1))

    np.testing.assert_allclose(con.tensor("L1"), l1(x), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("L2"), l2(z), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("gX"), autograd.grad(l1)(x), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(con.tensor("gZ"), autograd.grad(l2)(z), rtol=1e-9, atol=1e-12)


def test_mean_from_python(con):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 9, size=(4, 6)).astype(np.int32)
    con.load("X", x, tile=(2, 4))
    con.einsum("ij->j", "X", into="m", agg="mean", pieces={"i": 2})
    assert con.tensor("m").dtype == np.float64
    np.testing.assert_allclose(con.tensor("m"), x.mean(axis=0))
    g = Graph()
    g.op("s", "", [("X", "ij")], join="x0 * 0.5", agg="mean")
    con.run(g)
    np.testing.assert_allclose(con.tensor("s"), (x * 0.5).mean())


# -- LOGSUMEXP and SOFTMAX -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(8))
def test_random_logsumexp_softmax(tmp_path, seed):
    from scipy.special import logsumexp, softmax
    rng = np.random.default_rng(200 + seed)
    dtype = ["float64", "float32", "int32", "int64"][seed % 4]
    shape = (int(rng.integers(1, 7)), int(rng.integers(1, 9)))
    x = (rng.normal(size=shape) * [1, 50, 800][seed % 3]).astype(dtype)  # exp overflows
    if dtype.startswith("float") and shape[0] > 1:
        x[0] = -np.inf  # a row of -inf: LOGSUMEXP -inf, SOFTMAX NaN, as scipy's
        x[-1, 0] = np.inf
    tile = (int(rng.integers(1, shape[0] + 1)), int(rng.integers(1, shape[1] + 1)))
    with tensordb.connect(tmp_path / "db", workers=1 + seed % 2) as con:
        con.load("X", x, tile=tile)
        con.execute("l[i] = LOGSUMEXP(X[i,j]); l0 = LOGSUMEXP(X[i,j]); "
                    "s[i,j] = SOFTMAX(X[i,j], j); t[i,j] = SOFTMAX(2 * X[i,j], i)")
        with np.errstate(all="ignore"):
            wants = [("l", logsumexp(x, axis=1)), ("l0", logsumexp(x)),
                     ("s", softmax(x, axis=1)), ("t", softmax(2 * x, axis=0))]
        for name, want in wants:
            got = con.tensor(name)
            assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
            np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12,
                                       atol=1e-30, equal_nan=True, err_msg=name)


def test_logsumexp_softmax_gradients(con):
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")
    from autograd.scipy.special import logsumexp as alse
    rng = np.random.default_rng(12)
    z, w = rng.normal(size=(6, 4)) * 30, rng.normal(size=(6, 4))
    y = np.eye(4)[rng.integers(0, 4, 6)]
    for n, a in {"Z": z, "W": w, "Y": y}.items():
        con.load(n, a)
    con.execute("""
        lse[b] = LOGSUMEXP(Z[b,c]);
        CE = MEAN(lse[b] - SUM(Y[b,c] * Z[b,c]));
        P[b,c] = SOFTMAX(Z[b,c], c);
        Q = SUM(SQUARE(P[b,c] - Y[b,c]) * W[b,c]);
        gCE = GRAD(CE, Z); gQ = GRAD(Q, Z)""")

    def ce(z):
        return anp.mean(alse(z, axis=1) - anp.sum(y * z, axis=1))

    def q(z):
        p = anp.exp(z - alse(z, axis=1, keepdims=True))
        return anp.sum((p - y) ** 2 * w)

    np.testing.assert_allclose(con.tensor("CE"), ce(z), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("Q"), q(z), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("gCE"), autograd.grad(ce)(z), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(con.tensor("gQ"), autograd.grad(q)(z), rtol=1e-9, atol=1e-14)


def test_softmax_errors(con):
    con.load("X", np.ones((2, 3)))
    with pytest.raises(BinderError, match="label to normalize over"):
        con.execute("s[i,j] = SOFTMAX(X[i,j])")
    with pytest.raises(BinderError, match="label 'k', which its argument does not use"):
        con.execute("s[i,j] = SOFTMAX(X[i,j], k)")
    with pytest.raises(BinderError, match="LOGSUMEXP aggregates no label"):
        con.execute("s[i,j] = LOGSUMEXP(X[i,j])")


# -- an aggregate with nothing of its own takes labels from the ones inside it ------------------

def test_cross_entropy_as_on_paper(con):
    autograd = pytest.importorskip("autograd")
    anp = pytest.importorskip("autograd.numpy")
    rng = np.random.default_rng(21)
    z, y = rng.normal(size=(9, 4)), np.eye(4)[rng.integers(0, 4, 9)]
    x, v = rng.normal(size=(5, 3)), rng.normal(size=6)
    for n, a in {"Z": z, "Y": y, "X": x, "V": v}.items():
        con.load(n, a, tile=(4, 2) if n == "Z" else None)
    con.execute("""
        L = SUM(LOG(SUM(EXP(Z[b,c]))) - SUM(Y[b,c] * Z[b,c])) / 9;
        L2 = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b,c] * Z[b,c]));
        acc = MEAN(ARGMAX(Z[b,c]) = ARGMAX(Y[b,k]));
        gZ = GRAD(L, Z)""")

    def ce(z):
        return anp.sum(anp.log(anp.sum(anp.exp(z), axis=1)) - anp.sum(y * z, axis=1)) / 9

    np.testing.assert_allclose(con.tensor("L"), ce(z), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("L2"), ce(z), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("acc"), np.mean(z.argmax(1) == y.argmax(1)))
    with pytest.raises(BinderError, match="SUM aggregates no label"):
        con.execute("P = SUM(SUM(X[b,c]) * SUM(V[d]))")  # no label is used by both
    np.testing.assert_allclose(con.tensor("gZ"), autograd.grad(ce)(z), rtol=1e-10, atol=1e-14)


def test_claimed_labels_keep_the_inner_aggregates_own(con):
    rng = np.random.default_rng(22)
    x = rng.normal(size=(3, 4, 2))
    con.load("X", x)
    # the outer MAX takes b and d, which both SUMs use; each keeps a label of its own
    con.execute("M = MAX(SUM(X[b,c,d]) - SUM(X[b,e,d] * X[b,e,d]))")
    want = np.max(x.sum(axis=1) - (x * x).sum(axis=1))
    np.testing.assert_allclose(con.tensor("M"), want, rtol=1e-12)
    # taking c as well would leave the first SUM nothing: the outer MAX takes b, c is summed
    con.execute("N[d] = MAX(SUM(X[b,c,d]) * SUM(X[b,c,d]))")
    np.testing.assert_allclose(con.tensor("N"), np.max(x.sum(axis=1) ** 2, axis=0), rtol=1e-12)
    # the SUM takes k (the first label both use), MAX and MIN keep d
    con.execute("F[b] = SUM(MAX(X[b,k,d]) + MIN(X[b,k,d]))")
    np.testing.assert_allclose(con.tensor("F"), (x.max(axis=2) + x.min(axis=2)).sum(axis=1),
                               rtol=1e-12)
    # nothing to take: still an error (k would leave MAX and MIN nothing)
    con.load("X2", x[:, :, 0])
    with pytest.raises(BinderError, match="SUM aggregates no label"):
        con.execute("E[b] = SUM(MAX(X2[b,k]) + MIN(X2[b,k]))")


def test_logsumexp_from_python(con):
    autograd = pytest.importorskip("autograd")
    from autograd.scipy.special import logsumexp as alse
    from scipy.special import logsumexp
    rng = np.random.default_rng(23)
    x = rng.normal(size=(5, 6)) * 400
    con.load("X", x, tile=(2, 3))
    con.einsum("ij->i", "X", into="l", agg="logsumexp", pieces={"j": 2})
    np.testing.assert_allclose(con.tensor("l"), logsumexp(x, axis=1), rtol=1e-12)
    g = Graph()
    g.op("s", "", [("X", "ij")], join="x0 * 0.01", agg="logsumexp")
    g.grad("s", "X", into="gX")
    con.run(g)
    np.testing.assert_allclose(con.tensor("s"), logsumexp(x * 0.01), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("gX"), autograd.grad(lambda v: alse(v * 0.01))(x),
                               rtol=1e-10, atol=1e-300)


def test_the_classifier_script_against_numpy(con):
    """sql/classifier.sql: its weights, predictions, accuracy and probabilities, step by step in
    numpy (the gradient of the mean cross-entropy is X^T (softmax - Y) / batch)."""
    from pathlib import Path
    from scipy.special import softmax
    script = (Path(__file__).resolve().parents[2] / "sql" / "classifier.sql").read_text()
    con.execute(script)
    b, d = np.meshgrid(np.arange(48), np.arange(4), indexing="ij")
    x = np.sin(0.9 * b + 1.7 * d) + 0.5 * np.cos(0.4 * b * (d + 1))
    s = x[:, 0] + x[:, 1]
    cls = np.where(s > 0.5, 0, np.where(s > -0.5, 1, 2))
    y = 1.0 * (cls[:, None] == np.arange(3))
    w = np.zeros((4, 3))
    for _ in range(3):
        w = w - 0.5 * x.T @ (softmax(x @ w, axis=1) - y) / 48
    z = x @ w
    np.testing.assert_array_equal(con.tensor("Y"), y)
    np.testing.assert_allclose(con.tensor("W"), w, rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(con.tensor("pred"), z.argmax(axis=1))
    np.testing.assert_allclose(con.tensor("accuracy"), np.mean(z.argmax(1) == y.argmax(1)))
    np.testing.assert_allclose(con.tensor("P"), softmax(z, axis=1), rtol=1e-10)


def test_argmax_memory_is_projected_whole(tmp_path):
    """ARGMAX evaluates its join space whole (its label is one piece): the projection counts it,
    so a small budget splits the kept label instead."""
    x = np.random.default_rng(30).random((400, 1000))
    with tensordb.connect(tmp_path / "db", memory_limit="2MB", workers=2) as con:
        con.load("X", x, tile=(50, 1000))
        node = json.loads(con.explain("r[i] = ARGMAX(X[i,j] * 2)", format="json"))["nodes"][0]
        assert node["pieces"]["j"] == 1 and node["pieces"]["i"] >= 4
        assert node["memory"]["temporaries"] >= 400 * 1000 * 8 // node["pieces"]["i"]
        con.execute("r[i] = ARGMAX(X[i,j] * 2)")
        np.testing.assert_array_equal(con.tensor("r"), x.argmax(axis=1))


@pytest.mark.parametrize("make", [lambda r: r.random((4, 5)) > 0.5,
                                  lambda r: r.integers(-3, 4, (4, 5)),
                                  lambda r: r.random((4, 5)).astype(np.float32)],
                         ids=["bool", "int64", "float32"])
def test_logsumexp_of_bools_and_ints_is_scipys(con, make):
    """scipy reads a bool or int argument as float (float32 stays float32)."""
    from scipy.special import logsumexp
    x = make(np.random.default_rng(5))
    con.load("X", x, tile=(2, 3))
    con.execute("Y[i] = LOGSUMEXP(X[i,j])")
    want = logsumexp(x, axis=1)
    assert con.tensor("Y").dtype == want.dtype
    np.testing.assert_allclose(con.tensor("Y"), want, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_logsumexp_over_nothing_is_minus_inf_as_scipys(con, dtype):
    from scipy.special import logsumexp
    from tensordb.plan.builder import Graph
    e = np.ones((3, 0), dtype)
    con.load("E", e)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy warning, no NonFiniteWarning: no EXP ran
        con.execute("s[i] = LOGSUMEXP(E[i,j]); t = LOGSUMEXP(E[i,j])")
        con.run(Graph().op("u", "i", [("E", "ij")], agg="logsumexp"))
    with np.errstate(all="ignore"):
        want = logsumexp(e, axis=1)
    for name in ("s", "u"):
        got = con.tensor(name)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype or dtype == "int32"  # scipy's int: float64, as ours
    assert con.tensor("t") == -np.inf


@pytest.mark.parametrize("text, want", [
    ("m = MEAN(COUNT(X[i,j]))", lambda x: np.mean(np.full(x.shape[0], x.shape[1]))),
    ("m = MEAN(COUNT(X[i,j] > 0.5))", lambda x: np.mean(np.full(x.shape[0], x.shape[1]))),
    ("m[j] = MEAN(COUNT(X[i,j,k]))", lambda x: np.full(x.shape[1], x.shape[2], float)),
    ("m = SUM(COUNT(X[i,j]) * 2)", lambda x: 2 * x.size),
])
def test_aggregates_of_counts(con, text, want):
    x = np.random.default_rng(3).random((4, 5, 2) if "k]" in text else (4, 5))
    con.load("X", x)
    con.execute(text)
    got = con.tensor("m")
    np.testing.assert_array_equal(got, want(x))
    assert got.dtype == np.asarray(want(x)).dtype


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_softmax_over_an_empty_label_is_empty(con, dtype):
    """Elementwise over no element: an empty result of numpy's dtype for EXP(x - m) (scipy's
    softmax raises on it, its max having no identity)."""
    e = np.ones((3, 0), dtype)
    con.load("E", e)
    con.execute("s[i,j] = SOFTMAX(E[i,j], j)")
    got = con.tensor("s")
    assert got.shape == (3, 0) and got.dtype == np.exp(e - e).dtype
