"""Comparisons, CASE / IF / WHERE (numpy.where), in the dialect and the Python API, against
numpy: values, dtypes (numpy's: a comparison is bool), tiled and with absent tiles; their
gradients against autograd; a random corpus of joins that mix them with arithmetic."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tensordb
from tensordb.errors import BinderError, ParserError
from tensordb.plan import scalar
from tensordb.plan.builder import Graph
from tensordb.plan.skip import zero_when_absent

autograd = pytest.importorskip("autograd")
anp = pytest.importorskip("autograd.numpy")

OPS = {"=": np.equal, "<>": np.not_equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
       ">": np.greater, ">=": np.greater_equal}


@pytest.fixture
def con(disk_con):
    """The tests here run on an on-disk database (conftest's ``disk_con``)."""
    return disk_con


def _arrays(dtype, rng):
    a = rng.integers(-2, 3, size=(6, 5)).astype(dtype)
    b = rng.integers(-2, 3, size=(6, 5)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        a[1, 2] = np.nan
        b[3, 1] = np.nan
        a[0, 0] = np.inf
    return a, b


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
@pytest.mark.parametrize("op", list(OPS))
def test_comparison_matches_numpy(con, dtype, op):
    rng = np.random.default_rng(7)
    a, b = _arrays(dtype, rng)
    con.load("A", a, tile=(3, 5))
    con.load("B", b, tile=(2, 5))
    con.execute(f"C[i,j] = A[i,j] {op} B[i,j] WITH (PIECES i 2)")
    want = OPS[op](a, b)
    got = con.tensor("C")
    assert got.dtype == want.dtype == np.bool_
    np.testing.assert_array_equal(got, want)
    # with a literal and a broadcast operand (B's row 0)
    con.load("b0", b[0])
    con.execute(f"D[i,j] = A[i,j] {op} b0[j] * 0 + 1")
    np.testing.assert_array_equal(con.tensor("D"), OPS[op](a, b[0] * 0 + 1))


def test_comparison_on_absent_tiles(con):
    """Absent tiles are zeros: 0 = 0 is true there (the call is not skipped), 0 < 0 false."""
    a = np.zeros((8, 4))
    a[:4] = np.arange(16.0).reshape(4, 4) - 5
    con.load("A", a, tile=(4, 4))
    [info] = [t for t in con.tensors() if t["name"] == "A"]
    assert (info["tile_count"], info["total_tiles"]) == (1, 2)  # the zero tile is absent
    for text, want in [("A[i,j] = 0", a == 0), ("A[i,j] < 0", a < 0), ("A[i,j] >= 0", a >= 0),
                       ("CASE WHEN A[i,j] > 0 THEN A[i,j] ELSE 0 END", np.where(a > 0, a, 0)),
                       ("CASE WHEN A[i,j] > 0 THEN 1 ELSE 2 END", np.where(a > 0, 1, 2))]:
        con.execute(f"C[i,j] = {text}")
        got = con.tensor("C")
        assert got.dtype == want.dtype, text
        np.testing.assert_array_equal(got, want, err_msg=text)


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "bool"])
def test_case_if_where_match_numpy_where(con, dtype):
    rng = np.random.default_rng(3)
    a, b = _arrays(dtype, rng)
    con.load("A", a)
    con.load("B", b)
    cases = [
        ("CASE WHEN A[i,j] > B[i,j] THEN A[i,j] ELSE B[i,j] END", np.where(a > b, a, b)),
        ("CASE WHEN A[i,j] > 0 THEN A[i,j] WHEN B[i,j] > 0 THEN 2 ELSE 7 END",
         np.where(a > 0, a, np.where(b > 0, 2, 7))),
        ("IF(A[i,j] <> B[i,j], 1.5, A[i,j])", np.where(a != b, 1.5, a)),
        ("WHERE(B[i,j], A[i,j], B[i,j])", np.where(b, a, b)),
        ("(A[i,j] <= B[i,j]) + (A[i,j] = B[i,j]) * 2", (a <= b) + (a == b) * 2),
    ]
    for text, want in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            con.execute(f"C[i,j] = {text} WITH (PIECES j 2)")
        got = con.tensor("C")
        assert got.dtype == want.dtype, (text, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=text)


def test_comparisons_inside_aggregates(con):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(7, 6))
    con.load("X", x, tile=(4, 3))
    # a sum of bools is their OR (np.einsum's rule); count by making them numbers first
    con.execute("anypos[i] = SUM(X[i,j] > 1); npos[i] = SUM(1 * (X[i,j] > 0)); "
                "big[i] = MAX(CASE WHEN X[i,j] < 0 THEN -X[i,j] ELSE 0 END)")
    np.testing.assert_array_equal(con.tensor("anypos"), (x > 1).any(axis=1))
    np.testing.assert_array_equal(con.tensor("npos"), (x > 0).sum(axis=1))
    assert con.tensor("npos").dtype == np.int64
    np.testing.assert_array_equal(con.tensor("big"), np.where(x < 0, -x, 0).max(axis=1))
    # the accuracy of a classifier: the label's score is the row maximum
    y = (x == x.max(axis=1, keepdims=True)) * 1.0
    y[0] = np.roll(y[0], 1)
    con.load("Y", y)
    con.execute("acc = SUM(Y[i,j] * (X[i,j] = MAX(X[i,k]))) / 7")
    np.testing.assert_allclose(con.tensor("acc"),
                               np.sum(y * (x == x.max(axis=1, keepdims=True))) / 7)


def test_python_api_joins(con):
    rng = np.random.default_rng(11)
    a, b = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    con.load("A", a)
    con.load("B", b)
    con.einsum("ij,ij->ij", "A", "B", into="C", join="where(x0 > x1, x0, x1 * 2)")
    np.testing.assert_array_equal(con.tensor("C"), np.where(a > b, a, b * 2))
    con.einsum("ij,ij->ij", "A", "B", into="D", join="x0 <= x1")
    assert con.tensor("D").dtype == np.bool_
    np.testing.assert_array_equal(con.tensor("D"), a <= b)
    g = Graph()
    g.op("E", "i", [("A", "ij"), ("B", "ij")], join="(x0 != x1) * x0", agg="max")
    con.run(g)
    np.testing.assert_array_equal(con.tensor("E"), ((a != b) * a).max(axis=1))
    with pytest.raises(BinderError, match="unsupported syntax"):
        scalar.parse_join("x0 < x1 < 2")


def test_render_parses_back():
    for text in ["x0 > x1", "(x0 > x1) * 2", "where(x0 >= 1, x0, -x1)", "(x0 == x1) != (x1 < 2)",
                 "x0 + (x1 <= 2)", "x0 * 2 < x1 + 1"]:
        e = scalar.parse_join(text)
        assert scalar.parse_join(scalar.render(e)) == e, text


def test_skip_analysis_of_comparisons():
    pj = scalar.parse_join
    assert zero_when_absent(pj("x0 > x1"), {0, 1})
    assert zero_when_absent(pj("x0 != 0"), {0})
    assert not zero_when_absent(pj("x0 == 0"), {0})          # true where x0 is absent
    assert not zero_when_absent(pj("x0 >= x1"), {0, 1})
    assert not zero_when_absent(pj("x0 < 1"), {0})
    assert zero_when_absent(pj("where(x1, x0, 0)"), {0})     # both branches 0
    assert zero_when_absent(pj("where(x0 > 0, 5, x1)"), {0, 1})  # condition false, ELSE 0
    assert not zero_when_absent(pj("where(x0 > 0, 5, x1)"), {1})
    assert zero_when_absent(pj("(x0 > 1) * x1"), {1})        # a bool is finite
    assert zero_when_absent(pj("where(x0 > 1, x1, -x1) * x0"), {0}, {1})
    assert not zero_when_absent(pj("where(x0 > 1, x1, x1 * 2) * x0"), {0}, {1})  # may overflow


def test_errors(con):
    con.load("A", np.ones((2, 3)))
    with pytest.raises(ParserError) as e:
        con.execute("C[i,j] = A[i,j] < A[i,j] < 2")
    assert "^" in str(e.value)
    with pytest.raises(ParserError, match="ELSE"):
        con.execute("C[i,j] = CASE WHEN A[i,j] > 0 THEN 1 END")
    with pytest.raises(BinderError, match="IF takes 3 argument"):
        con.execute("C[i,j] = IF(A[i,j] > 0, 1)")
    with pytest.raises(BinderError, match="refuses"):
        con.execute("C[i,j] = -(A[i,j] > 0)")  # numpy refuses - on bool
    assert "C" not in [t["name"] for t in con.tensors()]  # a failed statement stores nothing


# -- gradients -----------------------------------------------------------------------------------

def test_gradient_through_case_and_masks(con):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 4))
    x = np.where(np.abs(x) < 0.1, 0.5, x)
    w = rng.normal(size=(4, 3))
    con.load("X", x)
    con.load("W", w)
    v = x[:, 0].copy()  # a tensor of its own: its gradient is not X's
    con.load("v", v)
    con.execute("""
        H[b,f] = SUM(X[b,h] * W[h,f]);
        L = SUM(CASE WHEN H[b,f] > 0 THEN H[b,f] * H[b,f] WHEN H[b,f] < -1 THEN 3 * H[b,f]
                ELSE (H[b,f] >= -0.5) * v[b] END);
        gX = GRAD(L, X); gW = GRAD(L, W)""")

    def loss(x, w):
        h = anp.dot(x, w)
        inner = anp.where(h < -1, 3 * h, (h >= -0.5) * v[:, None])
        return anp.sum(anp.where(h > 0, h * h, inner))

    np.testing.assert_allclose(con.tensor("L"), loss(x, w), rtol=1e-12)
    np.testing.assert_allclose(con.tensor("gX"), autograd.grad(loss, 0)(x, w), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(con.tensor("gW"), autograd.grad(loss, 1)(x, w), rtol=1e-10,
                               atol=1e-12)


def test_gradient_of_comparison_is_zero(con):
    x = np.array([[0.5, -1.0], [2.0, 3.0]])
    con.load("X", x)
    con.execute("L = SUM((X[i,j] > 1) * 1.0 + 0 * X[i,j]); g = GRAD(L, X)")
    np.testing.assert_array_equal(con.tensor("g"), np.zeros_like(x))


# -- a random corpus -------------------------------------------------------------------------------

_CMP = ["==", "!=", "<", "<=", ">", ">="]
_SQL_CMP = {"==": "=", "!=": "<>"}


def _random_join(rng, depth=0):
    """(python text over x0, x1, x2, dialect text over A, B, C): comparisons and WHEREs mixed
    with arithmetic, on small integers (every comparison exact)."""
    r = rng.random()
    if depth >= 3 or r < 0.25:
        k = int(rng.integers(4))
        if k == 3:
            v = int(rng.integers(-2, 3))
            return str(v), f"({v})" if v < 0 else str(v)
        return f"x{k}", ["A[i,j]", "B[j]", "C[i,j]"][k]
    if r < 0.5:
        op = _CMP[int(rng.integers(len(_CMP)))]
        (pa, sa), (pb, sb) = _random_join(rng, depth + 1), _random_join(rng, depth + 1)
        return f"({pa} {op} {pb})", f"({sa} {_SQL_CMP.get(op, op)} {sb})"
    if r < 0.75:
        parts = [_random_join(rng, depth + 1) for _ in range(3)]
        py = f"where({parts[0][0]}, {parts[1][0]}, {parts[2][0]})"
        sql = f"CASE WHEN {parts[0][1]} THEN {parts[1][1]} ELSE {parts[2][1]} END" \
            if rng.random() < 0.5 else f"IF({parts[0][1]}, {parts[1][1]}, {parts[2][1]})"
        return py, sql
    op = ["+", "*", "-"][int(rng.integers(3))]
    (pa, sa), (pb, sb) = _random_join(rng, depth + 1), _random_join(rng, depth + 1)
    return f"({pa} {op} {pb})", f"({sa} {op} {sb})"


@pytest.mark.parametrize("seed", range(30))
def test_random_comparison_corpus(tmp_path, seed):
    rng = np.random.default_rng(seed)
    dtype = ["float64", "float32", "int64", "int32"][seed % 4]
    a = rng.integers(-2, 3, size=(6, 4)).astype(dtype)
    b = rng.integers(-2, 3, size=4).astype(dtype)
    c = rng.integers(-2, 3, size=(6, 4)).astype(dtype)
    a[:3] = 0  # an all-zero tile: absent when stored
    py, sql = _random_join(rng)
    while "x0" not in py and "x2" not in py:
        py, sql = _random_join(rng)
    env = {"x0": a, "x1": b[None, :], "x2": c, "where": np.where}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            want = np.asarray(eval(py, {"__builtins__": {}}, env))  # noqa: S307 - ours
            want = want + np.zeros((6, 4), dtype=want.dtype)
        except TypeError:  # numpy refuses (- on bools): so must tensordb
            want = None
    agg = ["sum", "max", None][seed % 3]
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a, tile=(3, 4))
        con.load("B", b)
        con.load("C", c, tile=(2, 2))
        text = f"R[i,j] = {sql}" if agg is None else f"R[i] = {agg.upper()}({sql})"
        if want is None:
            with pytest.raises(tensordb.Error):
                con.execute(text)
            return
        if agg is not None:
            want = getattr(np, agg)(want, axis=1) if agg != "sum" else \
                np.einsum("ij->i", want)
        if want.dtype.name not in ("bool", "int32", "int64", "float32", "float64"):
            return
        con.execute(text + " WITH (PIECES i 2)")
        got = con.tensor("R")
        assert got.dtype == want.dtype, (text, py)
        np.testing.assert_array_equal(got, want, err_msg=f"{text}\n{py}")
        # the same join from the Python API
        con.einsum("ij,j,ij->" + ("ij" if agg is None else "i"), "A", "B", "C", into="R2",
                   join=py, agg=agg or "sum")
        np.testing.assert_array_equal(con.tensor("R2"), want, err_msg=py)


@pytest.mark.parametrize("name", ["case", "when", "then", "else"])
def test_a_tensor_named_by_a_case_word_is_read_and_assigned(con, name):
    con.load("A", np.arange(3.0))
    con.execute(f"{name}[i] = A[i] * 2; B[i] = {name}[i] + 1; "
                f"C[i] = CASE WHEN {name}[i] > 1 THEN {name}[i] ELSE -1 END")
    np.testing.assert_array_equal(con.tensor("B"), np.arange(3.0) * 2 + 1)
    np.testing.assert_array_equal(con.tensor("C"), np.where(np.arange(3.0) * 2 > 1,
                                                            np.arange(3.0) * 2, -1))


def test_syntax_errors_say_why(con):
    con.load("A", np.ones(2))
    with pytest.raises(ParserError, match="(?s)not associative"):
        con.execute("C[i] = A[i] < 1 <= 2")
    with pytest.raises(ParserError, match="(?s)CASE needs an ELSE"):
        con.execute("C[i] = CASE WHEN A[i] > 1 THEN 1 END")
    with pytest.raises(ParserError) as e:
        con.execute("C[i] = A[i] = = 2")
    assert "not associative" not in str(e.value) and "expected one of" in str(e.value)
