"""Dtypes follow NumPy 2 (issue 9, items 7-10): literals are weak Python scalars (NEP 50), products
of several tensors compute in the promoted dtype (np.einsum), bool tensors store and compute, and
zero-size dimensions work everywhere.

The oracle is written here, independently of the engine: each case carries the NumPy expression
it means, with the tensors as arrays and the literals as Python scalars, evaluated in the
statement's order; an aggregate reduces in the join's dtype, as np.einsum does
(``np.add.reduce(v, axis, dtype=v.dtype)``). Both the dtype and the values must match.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tensordb
from tensordb import cli

# -- the oracle --------------------------------------------------------------------------------


def red(ufunc, v, axis):
    """An aggregate as np.einsum computes it: in the join's own dtype."""
    return ufunc.reduce(v, axis=axis, dtype=v.dtype)


def bx(X, Y):
    """X[i,j], Y[j,k] broadcast over the join space (i, j, k)."""
    return X[:, :, None], Y[None, :, :]


# statement, the NumPy expression it means, the labels it uses (for a tiling hint)
CASES = [
    ("C[i,k] = SUM(X[i,j] * Y[j,k])", lambda X, Y: np.einsum("ij,jk->ik", X, Y), "ijk"),
    ("C = EINSUM('ij,jk->ik', X, Y)", lambda X, Y: np.einsum("ij,jk->ik", X, Y), None),
    ("C[i,k] = SUM(2.5 * X[i,j] * Y[j,k])",
     lambda X, Y: red(np.add, 2.5 * bx(X, Y)[0] * bx(X, Y)[1], 1), "ijk"),
    ("C[i,k] = SUM(X[i,j] * Y[j,k] * 3)", lambda X, Y: red(np.add, bx(X, Y)[0] * bx(X, Y)[1] * 3, 1),
     "ijk"),
    ("C[i,k] = SUM(3 * X[i,j] * Y[j,k])", lambda X, Y: red(np.add, 3 * bx(X, Y)[0] * bx(X, Y)[1], 1),
     "ijk"),
    ("C[i,k] = SUM(X[i,j] * Y[j,k] / 2)", lambda X, Y: red(np.add, bx(X, Y)[0] * bx(X, Y)[1] / 2, 1),
     "ijk"),
    ("C[i,k] = MAX(X[i,j] * Y[j,k])", lambda X, Y: red(np.maximum, bx(X, Y)[0] * bx(X, Y)[1], 1),
     "ijk"),
    ("C[i,k] = MIN(X[i,j] + Y[j,k])", lambda X, Y: red(np.minimum, bx(X, Y)[0] + bx(X, Y)[1], 1),
     "ijk"),
    ("C[i,k] = PROD(X[i,j] * Y[j,k] + 1)",
     lambda X, Y: red(np.multiply, bx(X, Y)[0] * bx(X, Y)[1] + 1, 1), "ijk"),
    ("E[i,j] = X[i,j] * 2", lambda X, Y: X * 2, "ij"),
    ("E[i,j] = X[i,j] * 2.0", lambda X, Y: X * 2.0, "ij"),
    ("E[i,j] = 2 * 3 * X[i,j]", lambda X, Y: 2 * 3 * X, "ij"),
    ("E[i,j] = X[i,j] - 1", lambda X, Y: X - 1, "ij"),
    ("E[i,j] = X[i,j] - X[i,j]", lambda X, Y: X - X, "ij"),
    ("E[i,j] = -X[i,j]", lambda X, Y: -X, "ij"),
    ("E[i,j] = MAX(X[i,j], 1) * 2", lambda X, Y: np.maximum(X, 1) * 2, "ij"),
    ("E[i,j] = EXP(1) * X[i,j]", lambda X, Y: np.exp(1) * X, "ij"),
    ("E[i,j] = X[i,j] / 4", lambda X, Y: X / 4, "ij"),
    ("E[i,j] = SQRT(X[i,j] * X[i,j])", lambda X, Y: np.sqrt(X * X), "ij"),
]

DTYPE_PAIRS = [(d, d) for d in ("int32", "int64", "float32", "float64", "bool")] + [
    ("int32", "float32"), ("int32", "int64"), ("bool", "int32"), ("bool", "float64"),
    ("float32", "float64"), ("int64", "float32"), ("float32", "bool")]


def sample(rng, shape, dtype, zero_block):
    """Small values (no overflow in a product of six), with one all-zero tile-sized block so that
    a tiled load stores fewer tiles (absent tiles)."""
    if dtype == "bool":
        a = rng.random(shape) < 0.5
    elif dtype.startswith("int"):
        a = rng.integers(-3, 4, shape).astype(dtype)
    else:
        a = (rng.standard_normal(shape) * 2).astype(dtype)
    a[zero_block] = 0
    return a


def check(got: np.ndarray, want, what: str) -> None:
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, numpy gives {want.dtype}"
    assert got.shape == want.shape, what
    if want.dtype.kind == "f":
        tol = 1e-5 if want.dtype == np.float32 else 1e-12
        # the scale of the finite values: an inf in ``want`` must not make every value pass
        scale = np.abs(want[np.isfinite(want)]).max(initial=0)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * (1 + scale), err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def numpy_answer(fn, X, Y):
    """NumPy's answer, or the exception class NumPy raises (the engine must refuse the same)."""
    with np.errstate(all="ignore"):
        try:
            return fn(X, Y)
        except (TypeError, OverflowError) as exc:
            return type(exc)


@pytest.mark.parametrize("tiled", [False, True], ids=["one-tile", "tiled"])
@pytest.mark.parametrize("dx,dy", DTYPE_PAIRS, ids=[f"{a}-{b}" for a, b in DTYPE_PAIRS])
def test_statements_match_numpy_dtype_and_values(dx, dy, tiled):
    rng = np.random.default_rng(hash((dx, dy)) % 2**32)
    X = sample(rng, (4, 6), dx, (slice(0, 2), slice(0, 2)))
    Y = sample(rng, (6, 5), dy, (slice(2, 4), slice(0, 2)))
    with tensordb.connect(workers=2) as con:
        con.load("X", X, tile=(2, 2) if tiled else None)
        con.load("Y", Y, tile=(2, 2) if tiled else None)
        for stmt, fn, labels in CASES:
            want = numpy_answer(fn, X, Y)
            hint = ""
            if tiled and labels:
                hint = " WITH (PIECES " + ", ".join(f"{l} {p}" for l, p in zip(labels, (2, 3, 1))) + ")"
            what = f"{stmt}{hint} on X {dx}, Y {dy}"
            if want is TypeError:
                with pytest.raises(tensordb.ProgrammingError, match="type error"):
                    con.execute(stmt + hint)
                continue
            if want.dtype.name == "float16":  # NumPy's answer for SQRT of a bool: not stored
                with pytest.raises(tensordb.DataError, match="float16"):
                    con.execute(stmt + hint)
                continue
            got = con.execute(stmt + hint).tensor()
            check(got, want, what)


# -- item 7: literals are weak scalars -----------------------------------------------------------

def test_int64_times_an_int_literal_stays_int64_and_exact(con):
    big = np.array([[2**53 + 1, -(2**62) + 3], [7, -5]], dtype=np.int64)
    con.load("I", big)
    got = con.execute("Q[i,j] = I[i,j] * 2").tensor()
    check(got, big * 2, "I * 2")
    assert got[0, 0] == 2**54 + 2  # float64 would have lost the last bit
    got = con.execute("S[i] = SUM(I[i,j] * 2)").tensor()
    check(got, red(np.add, big * 2, 1), "SUM(I * 2)")


def test_float_literal_first_is_applied_as_numpy_orders_it(con):
    x0 = np.array([[100000, 2], [-3, 4]], dtype=np.int32)
    x1 = np.array([[110000, 1], [1, -1]], dtype=np.int32)
    con.load("X0", x0)
    con.load("X1", x1)
    got = con.execute("Q[i,j] = 2.5 * X0[i,j] * X1[i,j]").tensor()
    check(got, 2.5 * x0 * x1, "2.5 * x0 * x1 elementwise")
    assert got[0, 0] == 2.75e10  # the int32 product would have overflowed first
    got = con.execute("Q[i,k] = SUM(2.5 * X0[i,j] * X1[j,k])").tensor()
    check(got, np.einsum("ij,jk->ik", 2.5 * x0, x1), "SUM(2.5 * x0 * x1)")
    con.einsum("ij,jk->ik", "X0", "X1", into="P", join="2.5 * x0 * x1")
    check(con.tensor("P"), np.einsum("ij,jk->ik", 2.5 * x0, x1), "Python API join")
    # Written last, the literal comes after NumPy's int32 product, which wraps: so must ours.
    got = con.execute("Q[i,k] = SUM(X0[i,j] * X1[j,k] * 2.5)").tensor()
    check(got, red(np.add, x0[:, :, None] * x1[None] * 2.5, 1), "SUM(x0 * x1 * 2.5)")
    # An integer constant folded past int32 wraps as NumPy's two int32 products do.
    with np.errstate(over="ignore"):
        want = red(np.add, 1048576 * x0[:, :, None] * x1[None] * 1048573, 1)
    got = con.execute("Q[i,k] = SUM(1048576 * X0[i,j] * X1[j,k] * 1048573)").tensor()
    check(got, want, "SUM(2**20 * x0 * x1 * c)")


def test_integer_literal_and_float_literal_differ(con):
    x = np.array([1, -2, 3], dtype=np.int32)
    f = np.array([0.5, 1.5, -2.25], dtype=np.float32)
    con.load("X", x)
    con.load("F", f)
    check(con.execute("Q[i] = X[i] * 2").tensor(), x * 2, "int32 * 2")
    check(con.execute("Q[i] = X[i] * 2.0").tensor(), x * 2.0, "int32 * 2.0")
    check(con.execute("Q[i] = X[i] * 1e3").tensor(), x * 1e3, "int32 * 1e3")
    check(con.execute("Q[i] = F[i] * 2.5").tensor(), f * 2.5, "float32 * 2.5")
    check(con.execute("Q[i] = EXP(2) * F[i]").tensor(), np.exp(2) * f, "np.exp(2) is strong")
    check(con.execute("Q[i] = X[i] / 2").tensor(), x / 2, "true division")
    check(con.execute("Q[i] = POW(X[i], 2)").tensor(), np.power(x, 2), "POW keeps int32")
    # The Python API's join is a Python expression: 2**3 is a weak int, 0.5 a weak float.
    con.einsum("i->i", "X", into="P", join="x0 * 2**3")
    check(con.tensor("P"), x * 2**3, "join x0 * 2**3")
    con.einsum("i->i", "F", into="P", join="x0 * 0.5 - 1", replace=True)
    check(con.tensor("P"), f * 0.5 - 1, "join on float32")


def test_a_literal_that_does_not_fit_the_dtype_is_refused_and_nothing_changes(con, snapshot):
    con.load("X", np.array([1, 2], dtype=np.int32))
    before = snapshot(con)
    with pytest.raises(tensordb.DataError, match="10000000000.*int32") as info:
        con.execute("Q[i] = X[i] * 10000000000")
    assert "LINE 1" in str(info.value)
    assert snapshot(con) == before
    check(con.execute("Q[i] = X[i] * 1e10").tensor(), np.array([1, 2], np.int32) * 1e10, "float")


def test_aggregates_keep_the_join_dtype_like_np_einsum(con):
    """The documented reference: np.einsum, which sums int32 in int32 (np.sum would give int64)."""
    x = np.array([[2**30, 2**30, 5], [1, 2, 3]], dtype=np.int32)
    con.load("X", x)
    for agg, ufunc in (("SUM", np.add), ("PROD", np.multiply), ("MAX", np.maximum),
                       ("MIN", np.minimum)):
        with np.errstate(over="ignore"):
            want = red(ufunc, x, 1)
        check(con.execute(f"S[i] = {agg}(X[i,j])").tensor(), want, agg)
    check(con.execute("S[i] = SUM(X[i,j])").tensor(), np.einsum("ij->i", x), "np.einsum")
    check(con.execute("S = EINSUM('ij->i', X)").tensor(), np.einsum("ij->i", x), "EINSUM")


# -- item 8: intermediates of a product of several tensors -----------------------------------------

def test_three_operand_mixed_float_product_computes_in_float64(con):
    rng = np.random.default_rng(8)
    # Shapes that make opt_einsum's path multiply the two float32 operands first.
    a = rng.random((10, 40)).astype(np.float32)
    b = rng.random((40, 10)).astype(np.float32)
    c = rng.random((10, 40))
    for n, v in (("A", a), ("B", b), ("C", c)):
        con.load(n, v)
    want = np.einsum("ij,jk,kl->il", a, b, c)  # np.einsum casts every operand to float64
    for stmt in ("D = EINSUM('ij,jk,kl->il', A, B, C)", "D[i,l] = A[i,j] * B[j,k] * C[k,l]"):
        got = con.execute(stmt).tensor()
        assert got.dtype == np.float64
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-13, stmt


def test_three_operand_int_product_does_not_overflow_int32_intermediates(con):
    a = np.full((2, 3), 70000, dtype=np.int32)
    b = np.full((3, 2), 70000, dtype=np.int32)
    c = np.arange(4, dtype=np.int64).reshape(2, 2)
    for n, v in (("A", a), ("B", b), ("C", c)):
        con.load(n, v)
    got = con.execute("D = EINSUM('ij,jk,kl->il', A, B, C)").tensor()
    check(got, np.einsum("ij,jk,kl->il", a, b, c), "int32 x int32 x int64")
    got = con.execute("D = EINSUM('ij,jk,kl->il', C, C, A)").tensor()
    check(got, np.einsum("ij,jk,kl->il", c, c, a), "int64 x int64 x int32")


# -- item 9: bool tensors ---------------------------------------------------------------------------

B = np.array([[True, False, True, False], [True, True, False, False], [False, False, False, False]])


def test_a_product_of_tensors_is_an_einsum_in_any_order_and_next_to_an_inf(con):
    # np.einsum casts every operand to the result dtype first: int32 * int32 * float64 does not
    # wrap in int32. That holds for a product written in any order (a Python join
    # "x1 * (x2 * x0)"), and for a product that is not split into pairs because an operand
    # holds an inf. Found by tests/corpus/test_fuzz.py (both computed the int32 or float32 product).
    x = np.array([2**20, 3, -7], np.int32)
    y = np.array([2**20, 5, 2**30], np.int32)
    z = np.array([1.0, np.inf, 3.0])
    f = np.array([1.1, 2.2, 3.3], np.float32)
    for name, arr in (("X", x), ("Y", y), ("Z", z), ("F", f)):
        con.load(name, arr)
    want = np.einsum("i,i,i->i", x, y, z)
    check(con.execute("P[i] = X[i] * Y[i] * Z[i]").tensor(), want, "dialect, Z holds an inf")
    check(con.execute("P = SUM(X[i] * (Y[i] * Z[i]))").tensor(), np.einsum("i,i,i->", x, y, z),
          "dialect, summed")
    con.einsum("i,i,i->i", "X", "Y", "Z", into="Q", join="x1 * (x2 * x0)")
    check(con.tensor("Q"), want, "join x1 * (x2 * x0)")
    con.einsum("i,i,i->i", "F", "Z", "F", into="R", join="x1 * (x2 * x0)")
    check(con.tensor("R"), np.einsum("i,i,i->i", f, z, f), "float32 squared in float64")
    # A tensor used twice is two operands of the einsum (the dialect reads it once).
    check(con.execute("S[i] = (X[i] * X[i]) * F[i]").tensor(), np.einsum("i,i,i->i", x, x, f),
          "X twice")
    check(con.execute("S = SUM(X[i] * F[j] * X[i])").tensor(), np.einsum("i,j,i->", x, f, x),
          "X twice, summed")


def test_bool_loads_from_every_source(tmp_path, con):
    np.save(tmp_path / "b.npy", B)
    np.savez(tmp_path / "b.npz", b=B)
    rows = [(i, j, bool(B[i, j])) for i in range(3) for j in range(4)]
    pq.write_table(pa.table({"i": [r[0] for r in rows], "j": [r[1] for r in rows],
                             "v": [r[2] for r in rows]}), tmp_path / "b.parquet")
    (tmp_path / "b.csv").write_text("i,j,v\n" + "".join(f"{i},{j},{str(v).lower()}\n"
                                                          for i, j, v in rows))
    (tmp_path / "dense.csv").write_text("a,b\ntrue,false\nfalse,false\n")
    con.load("B0", B)
    con.load("B1", str(tmp_path / "b.npy"))
    con.load("B2", str(tmp_path / "b.npz"))
    con.load("B3", str(tmp_path / "b.parquet"), index=["i", "j"], value="v", shape=(3, 4))
    con.execute(f"LOAD TENSOR B4 FROM '{tmp_path / 'b.csv'}' INDEX (i, j) VALUE v SHAPE (3, 4)")
    con.execute("CREATE TENSOR B5 FROM (SELECT i, j, (i + j) % 3 = 0 AS v FROM range(3) a(i), "
                "range(4) b(j)) INDEX (i, j) VALUE v")
    con.execute("CREATE TENSOR B6 FROM (SELECT true AS a, false AS b UNION ALL SELECT false, false)")
    con.load("B7", str(tmp_path / "dense.csv"))
    con.execute("CREATE TENSOR B8 (3, 4) BOOLEAN")
    for name in ("B0", "B1", "B2", "B3", "B4"):
        check(con.tensor(name), B, name)
    ii, jj = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    check(con.tensor("B5"), (ii + jj) % 3 == 0, "B5")
    check(con.tensor("B6"), np.array([[True, False], [False, False]]), "B6")
    check(con.tensor("B7"), np.array([[True, False], [False, False]]), "B7")
    check(con.tensor("B8"), np.zeros((3, 4), bool), "B8")


def test_bool_round_trips_and_is_boolean_in_sql(tmp_path):
    path = tmp_path / "w.tdb"
    with tensordb.connect(path) as con:
        con.load("B", B, tile=(2, 2))  # the last row of tiles is all False: absent
        for fmt in ("npy", "parquet", "csv"):
            con.execute(f"COPY B TO '{tmp_path / ('b.' + fmt)}'")
        con.export("B", tmp_path / "e.npy")
    assert np.load(tmp_path / "e.npy").dtype == bool
    check(np.load(tmp_path / "b.npy"), B, "COPY npy")
    with tensordb.connect(path) as con:  # reopened: the stored dtype survives
        check(con.tensor("B"), B, "reopened")
        con.load("R1", str(tmp_path / "b.npy"))
        con.execute(f"LOAD TENSOR R2 FROM '{tmp_path / 'b.parquet'}' INDEX (i, j) VALUE value "
                    "SHAPE (3, 4)")
        con.execute(f"LOAD TENSOR R3 FROM '{tmp_path / 'b.csv'}' INDEX (i, j) VALUE value "
                    "SHAPE (3, 4)")
        for name in ("R1", "R2", "R3"):
            check(con.tensor(name), B, name)
        rel = con.sql("SELECT i, j, value, typeof(value) FROM B ORDER BY i, j").fetchall()
        want = [(int(i), int(j), True, "BOOLEAN") for i, j in zip(*np.nonzero(B))]
        assert rel == want
        assert con.describe("B")["dtype"] == "bool"
        res = con.execute("Q[i,j] = B[i,j] * B[i,j]")
        assert str(res).startswith("Q: bool (3, 4)\n") and str(B) in str(res)


@pytest.mark.parametrize("tile", [None, (2, 2), (1, 3)])
def test_bool_computes_like_numpy(con, tile):
    C = np.array([[True, True, False], [False, True, True], [False, False, False], [True, False, True]])
    con.load("B", B, tile=tile)
    con.load("C", C, tile=tile)
    f = np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)
    con.load("F", f, tile=tile)
    cases = [
        ("S[i] = SUM(B[i,j])", np.einsum("ij->i", B)),                  # np.einsum: logical or
        ("S[i] = SUM(B[i,j] * 1)", red(np.add, B * 1, 1)),              # counting: int64
        ("S[i] = PROD(B[i,j])", red(np.multiply, B, 1)),
        ("S[i] = MAX(B[i,j])", B.max(axis=1)),
        ("S[j] = MIN(B[i,j])", B.min(axis=0)),
        ("S[i,k] = SUM(B[i,j] * C[j,k])", np.einsum("ij,jk->ik", B, C)),
        ("S = EINSUM('ij,jk->ik', B, C)", np.einsum("ij,jk->ik", B, C)),
        ("S[i,k] = SUM(B[i,j] * C[j,k] * 1)", red(np.add, B[:, :, None] * C[None] * 1, 1)),
        ("S[i,j] = B[i,j] * B[i,j]", B * B),
        ("S[i,j] = B[i,j] + B[i,j]", B + B),
        ("S[i,j] = B[i,j] * 2.5", B * 2.5),
        ("S[i,j] = B[i,j] * F[i,j]", B * f),
        ("S[i] = SUM(B[i,j] * F[i,j])", np.einsum("ij,ij->i", B, f)),
        ("S[i,j] = MAX(B[i,j], B[i,j])", np.maximum(B, B)),
    ]
    for stmt, want in cases:
        check(con.execute(stmt).tensor(), want, f"{stmt} tile {tile}")


def test_relu_is_max_with_a_weak_zero(con):
    # RELU(x) is MAX(x, 0), as NumPy computes np.maximum(x, 0): int and float tensors keep their
    # dtype, a bool becomes int64, and RELU of a literal is a NumPy scalar (strong) like EXP(1).
    # Found by tests/corpus/test_fuzz.py: RELU kept bool, and RELU(1.0) was a weak Python float.
    f = np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)
    n = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    con.load("B", B)
    con.load("F", f)
    con.load("N", n)
    cases = [
        ("S[i,j] = RELU(B[i,j])", np.maximum(B, 0)),                       # int64
        ("S[i,j] = RELU(B[i,j]) - MAX(B[i,j], 0)", np.maximum(B, 0) - np.maximum(B, 0)),
        ("S[i,j] = RELU(F[i,j])", np.maximum(f, 0)),                       # float32
        ("S[i,j] = RELU(N[i,j])", np.maximum(n, 0)),                       # int32
        ("S[i,j] = F[i,j] + RELU(1.0)", f + np.maximum(1.0, 0)),           # float64
        ("S[i,j] = N[i,j] * RELU(2)", n * np.maximum(2, 0)),               # int64
        ("S[i] = SUM(RELU(B[i,j]))", red(np.add, np.maximum(B, 0), 1)),
    ]
    for stmt, want in cases:
        check(con.execute(stmt).tensor(), want, stmt)
    con.einsum("ij->ij", "B", into="R", join="relu(x0)")
    check(con.tensor("R"), np.maximum(B, 0), "con.einsum relu(x0) on bool")


def test_bool_operations_numpy_refuses_are_refused_with_the_statement(con, snapshot):
    con.load("B", B)
    before = snapshot(con)
    for stmt in ("S[i,j] = B[i,j] - B[i,j]", "S[i,j] = -B[i,j]"):
        with pytest.raises(tensordb.ProgrammingError, match="type error.*bool") as info:
            con.execute(stmt)
        assert "LINE 1" in str(info.value)
    with pytest.raises(tensordb.DataError, match="float16"):  # np.exp of a bool is float16
        con.execute("S[i,j] = EXP(B[i,j])")
    assert snapshot(con) == before
    check(con.execute("S[i,j] = EXP(B[i,j] * 1.0)").tensor(), np.exp(B * 1.0), "converted")


# -- item 10: zero-size dimensions ------------------------------------------------------------------

def test_create_tensor_with_a_zero_size_dimension(con):
    con.execute("CREATE TENSOR Z (0, 3)")
    con.execute("CREATE TENSOR Z2 (i 0, j 3) INT64 TILE (i 2, j 1)")
    con.execute("CREATE TENSOR Z3 (0, 0) BOOL")
    check(con.tensor("Z"), np.zeros((0, 3)), "Z")
    check(con.tensor("Z2"), np.zeros((0, 3), np.int64), "Z2")
    check(con.tensor("Z3"), np.zeros((0, 0), bool), "Z3")
    rows = {r[0]: r for r in con.execute("SHOW TENSORS").fetchall()}
    assert rows["Z"][1] == (0, 3) and rows["Z2"][2] == "int64"
    desc = dict(con.execute("DESCRIBE Z2").fetchall())
    assert desc["shape"] == (0, 3) and desc["dtype"] == "int64" and desc["nnz"] == 0
    assert con.sql("SELECT count(*) FROM Z2").fetchall() == [(0,)]
    assert con.sql("SELECT typeof(value) FROM Z2").fetchall() == []


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_einsums_over_zero_size_tensors(con, dtype):
    e = np.zeros((3, 0), dtype)
    f = np.zeros((0, 4), dtype)
    a = np.arange(12).reshape(3, 4).astype(dtype)
    con.load("E", e)
    con.load("F", f, tile=(1, 2))
    con.load("A", a)
    cases = [
        ("C[i,k] = SUM(E[i,j] * F[j,k])", np.einsum("ij,jk->ik", e, f)),
        ("C[i,k] = SUM(E[i,j] * F[j,k]) WITH (PIECES i 3, k 2)", np.einsum("ij,jk->ik", e, f)),
        ("C = EINSUM('ij,jk->ik', E, F)", np.einsum("ij,jk->ik", e, f)),
        ("C = EINSUM('ij,jk,lk->il', E, F, A)", np.einsum("ij,jk,lk->il", e, f, a)),
        ("C[j,k] = SUM(F[j,k] * A[i,k])", np.einsum("jk,ik->jk", f, a)),
        ("C[j,k] = F[j,k] * 2", f * 2),
        ("C[j] = MAX(F[j,k])", red(np.maximum, f, 1)),
        ("C[i] = SUM(E[i,j] * 1.5)", red(np.add, e * 1.5, 1)),
        ("C = SUM(F[j,k])", np.einsum("jk->", f)),
    ]
    for stmt, want in cases:
        check(con.execute(stmt).tensor(), want, f"{stmt} ({dtype})")


def test_zero_size_tensors_export_import_and_print(tmp_path, capsys):
    path = tmp_path / "w.tdb"
    f = np.zeros((0, 4), np.float32)
    with tensordb.connect(path) as con:
        con.load("F", f)
        con.execute("CREATE TENSOR Z (i 0, j 3) BOOL")
        for fmt in ("npy", "parquet", "csv"):
            con.execute(f"COPY F TO '{tmp_path / ('f.' + fmt)}'")
        con.export("Z", tmp_path / "z.npy")
        con.load("F1", str(tmp_path / "f.npy"))
        con.execute(f"LOAD TENSOR F2 FROM '{tmp_path / 'f.parquet'}' INDEX (i, j) VALUE value "
                    "SHAPE (0, 4)")
        con.execute(f"LOAD TENSOR F3 FROM '{tmp_path / 'f.csv'}' INDEX (i, j) VALUE value "
                    "SHAPE (0, 4)")
        check(con.tensor("F1"), f, "npy")
        check(con.tensor("F2"), f, "parquet")
        # An empty CSV file carries no types: its values read back as float64.
        check(con.tensor("F3"), np.zeros((0, 4)), "csv")
        assert str(con.execute("Q[i,j] = Z[i,j] * 2")) == "Q: int64 (0, 3)\n[]"
    check(np.load(tmp_path / "z.npy"), np.zeros((0, 3), bool), "export")
    rc = cli.main([str(path), "-c", "SELECT * FROM Z", "-c", "DESCRIBE Z",
                   "-c", "Y[j] = SUM(Z[i,j])"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert "(0 rows)" in out and "size 0, tile 0" in out
    assert "Y: bool (3,)\n[False False False]" in out


@pytest.mark.parametrize("given", ["float32", np.float64, np.dtype("int32"), "bool", "i8",
                                   "complex128", "float16", "no such dtype", ["float32"]])
def test_check_dtype_answers_as_numpy_does_asked_once_or_again(given):
    """check_dtype keeps the names it computed: asked twice, or with an unhashable value, it
    gives NumPy's dtype for a supported one and a DataError naming the tensor otherwise."""
    from tensordb.dtypes import SUPPORTED_DTYPES, check_dtype
    try:
        expected = np.dtype(given)
    except TypeError:
        expected = None
    for _ in range(2):
        if expected is not None and expected.name in SUPPORTED_DTYPES:
            assert check_dtype(given, "T") == expected
            assert check_dtype(given, "T").name == expected.name
        else:
            with pytest.raises(tensordb.DataError, match="^T: (unknown|unsupported) dtype"):
                check_dtype(given, "T")
