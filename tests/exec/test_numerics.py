"""Numerics that must be numpy's whatever the tiling: aggregates over empty labels, and absent
(all-zero) tiles next to NaN and inf.

Every case is checked against numpy on the dense arrays, for several stored tilings (odd, size-1,
whole, block-sparse) and several operation tilings (pinned pieces), so a difference between two
tilings shows up as a difference from numpy.
"""
from __future__ import annotations

import itertools

import duckdb
import numpy as np
import pytest

import tensordb

INF, NAN = np.inf, np.nan


def np_(fn):
    """Run a numpy oracle without its RuntimeWarnings (0/0, 0*inf are the point here)."""
    with np.errstate(all="ignore"):
        return fn()


def same(got, want):
    """Equal to numpy: NaN where numpy has NaN, the same infinities, values to rounding."""
    got = np.asarray(got)
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)


def block_sparse(rng, shape, tile, present):
    """A float64 array on a grid of ``tile`` blocks: blocks whose grid coordinates are in
    ``present`` hold random values, the others are zero (absent when stored with ``tile``)."""
    a = np.zeros(shape)
    for c in present:
        box = tuple(slice(x * t, (x + 1) * t) for x, t in zip(c, tile))
        a[box] = rng.uniform(0.5, 2.0, a[box].shape) * rng.choice([-1, 1], a[box].shape)
    return a


# Stored tilings of a 6 x 6 block-sparse matrix: the tiles its blocks are (block-sparse), odd
# tiles that cut across blocks, size-1 tiles and one whole tile.
STORED = [(2, 2), (3, 5), (1, 1), (6, 6)]
# Pieces per label of the operation (clamped to the sizes): whole, odd, every element.
PIECES = [1, 3, 6]
# For the many parametrized cases: pairs that still cover every stored tiling and piece count,
# the block-sparse tiling with all three.
SOME = [((2, 2), 1), ((2, 2), 3), ((2, 2), 6), ((3, 5), 3), ((1, 1), 1), ((6, 6), 6)]


def run_einsum(con, spec, operands, pieces, **kw):
    labels = set(spec.replace(",", "").replace("->", ""))
    con.einsum(spec, *operands, into="R", pieces={l: pieces for l in labels}, replace=True, **kw)
    return con.tensor("R")


# -- item 6: absent tiles next to NaN and inf ------------------------------------------------------

def test_division_by_itself_does_not_depend_on_the_tiling():
    # The example: X / X is NaN wherever X is 0 (0/0), absent tiles included.
    rng = np.random.default_rng(1)
    x = block_sparse(rng, (6, 6), (2, 2), [(0, 0), (1, 2), (2, 1)])
    want = np_(lambda: x / x)
    assert np.isnan(want).sum() == 36 - 12
    for stored, pieces in itertools.product(STORED, PIECES):
        with tensordb.connect() as con:
            con.load("X", x, tile=stored)
            con.execute(f"Q[i,j] = X[i,j] / X[i,j] WITH (PIECES i {pieces}, j {pieces});")
            same(con.tensor("Q"), want)


def test_product_with_infinite_partner_is_nan_like_numpy():
    # SUM(A[i,j] * Y[j,k]) with Y all inf: numpy gives NaN wherever a 0 of A meets an inf.
    rng = np.random.default_rng(2)
    a = block_sparse(rng, (6, 6), (2, 2), [(0, 0), (2, 2)])
    y = np.full((6, 5), INF)
    want = np_(lambda: (a[:, :, None] * y[None]).sum(axis=1))
    for stored, pieces in itertools.product(STORED, PIECES):
        with tensordb.connect() as con:
            con.load("A", a, tile=stored)
            con.load("Y", y, tile=(2, 2))
            same(run_einsum(con, "ij,jk->ik", ["A", "Y"], pieces), want)
            con.execute(f"S[i,k] = SUM(A[i,j] * Y[j,k]) WITH (PIECES i {pieces}, j {pieces}, "
                        f"k {pieces});")
            same(con.tensor("S"), want)


@pytest.mark.parametrize("where", ["left", "right"])
def test_nan_and_inf_in_some_tiles_of_a_block_sparse_product(where):
    # One inf and one NaN, each in one tile of the dense partner: only the rows/columns they
    # reach become NaN, as in numpy; the sparse side's absent tiles are zeros that meet them.
    rng = np.random.default_rng(3)
    sparse = block_sparse(rng, (6, 6), (2, 2), [(0, 1), (1, 1), (2, 0)])
    dense = rng.standard_normal((6, 6))
    dense[1, 4] = INF
    dense[5, 0] = -INF
    dense[3, 3] = NAN
    a, b = (dense, sparse) if where == "left" else (sparse, dense)
    want = np_(lambda: (a[:, :, None] * b[None]).sum(axis=1))
    assert np.isnan(want).any() and not np.isnan(want).all()
    for stored, pieces in itertools.product(STORED, PIECES):
        with tensordb.connect() as con:
            con.load("A", a, tile=stored if where == "right" else (3, 3))
            con.load("B", b, tile=stored if where == "left" else (3, 3))
            same(run_einsum(con, "ij,jk->ik", ["A", "B"], pieces), want)


@pytest.mark.parametrize("agg", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("join", ["x0 * x1", "x0 / x1", "relu(x0 * x1)", "x0 * x1 - x0"])
def test_every_aggregate_and_join_over_absent_tiles_and_nonfinite_values(agg, join):
    rng = np.random.default_rng(4)
    x = block_sparse(rng, (6, 6), (2, 2), [(0, 0), (1, 1), (2, 1)])
    y = rng.uniform(0.5, 2.0, 6)
    y[1] = INF        # meets absent tiles of x in rows 2..5
    y[4] = 0.0        # x / 0
    fns = {"x0 * x1": lambda a, b: a * b, "x0 / x1": lambda a, b: a / b,
           "relu(x0 * x1)": lambda a, b: np.maximum(a * b, 0), "x0 * x1 - x0": lambda a, b: a * b - a}
    red = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[agg]
    want = np_(lambda: red(fns[join](x, y[None, :]), axis=1))
    for stored, pieces in SOME:
        with tensordb.connect() as con:
            con.load("X", x, tile=stored)
            con.load("Y", y, tile=(2,))
            same(run_einsum(con, "ij,j->i", ["X", "Y"], pieces, join=join, agg=agg), want)


@pytest.mark.parametrize("pieces", [1, 2])
def test_sums_of_products_next_to_an_inf_are_not_regrouped(pieces):
    # The answer is the sum of every product the statement names. Summing a label that one
    # operand alone has first (opt_einsum, np.einsum), or a pair of a product of three first
    # (the pairwise split), is the same for finite values but not next to an inf:
    # (2 - 1) * inf is inf, 2 * inf - 1 * inf is NaN. Found by tests/corpus/test_fuzz.py.
    a, b = np.array([2.0, -1.0, 0.5, -0.5]), np.array([1.0, 1.0, 1.0, 1.0])
    inf = np.array([-INF, 3.0])
    space2 = np_(lambda: a[:, None] * inf[None, :])                        # (i, k)
    space3 = np_(lambda: (a * b)[:, None] * inf[None, :])
    with tensordb.connect() as con:
        con.load("A", a, tile=(2,))
        con.load("B", b)
        con.load("I", inf, tile=(1,))
        hint = f" WITH (TILE (i {pieces}))"
        same(con.execute("O = SUM(A[i] * I[k])" + hint).tensor(), np_(lambda: space2.sum()))
        same(con.execute("O[k] = SUM(A[i] * I[k])" + hint).tensor(), np_(lambda: space2.sum(0)))
        same(con.execute("O = SUM(A[i] * B[i] * I[k])" + hint).tensor(), np_(lambda: space3.sum()))
        same(con.execute("O[k] = SUM(I[k] * A[i] * B[i])" + hint).tensor(),
             np_(lambda: space3.sum(0)))
        same(con.execute("O = EINSUM('i,i,k->', A, B, I)").tensor(), np_(lambda: space3.sum()))
        con.einsum("i,k->", "A", "I", into="P", pieces={"i": pieces})
        same(con.tensor("P"), np_(lambda: space2.sum()))
        # Finite operands are still split into pairs (the catalog knows they are finite).
        con.load("F", np.ones(2))
        con.execute("O = SUM(A[i] * B[i] * F[k])")
        assert len(con.last_plan.ops) == 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_literal_that_is_inf_or_zero_in_float32_does_not_skip_absent_tiles(dtype):
    # A weak literal takes the tensor's dtype: next to float32, 1e300 is inf (0 * inf is NaN)
    # and 1e-50 is 0 (0 / 0 is NaN), so an absent tile's call is not certainly 0. Found by
    # tests/corpus/test_fuzz.py (the calls were skipped and the answer was 0).
    z = np.zeros(4, dtype)
    y = np.array([1, 0, 0, 0], dtype)
    with tensordb.connect() as con:
        con.load("Z", z, tile=(2,))
        con.load("Y", y, tile=(2,))
        for stmt, want in [("A[j] = Z[j] * 0.1 * 1e+300", lambda: z * 0.1 * 1e300),
                           ("B[j] = Y[j] / 1e-50", lambda: y / 1e-50),
                           ("C = SUM(Z[j] * 1e+300)", lambda: np.add.reduce(z * 1e300))]:
            got = con.execute(stmt).tensor()
            assert got.dtype == np.dtype(dtype), stmt
            same(got, np_(want))


def test_an_output_tile_whose_calls_are_all_skipped_is_the_join_of_zeros():
    # exp(0) is 1 and cos(0) is 1: an absent input tile does not make an absent output tile.
    rng = np.random.default_rng(5)
    x = block_sparse(rng, (6, 6), (2, 2), [(1, 1)])
    for stored, pieces in itertools.product(STORED, PIECES):
        with tensordb.connect() as con:
            con.load("X", x, tile=stored)
            same(run_einsum(con, "ij->ij", ["X"], pieces, join="exp(x0)"), np.exp(x))
            same(run_einsum(con, "ij->i", ["X"], pieces, join="cos(x0) * 2", agg="sum"),
                 (np.cos(x) * 2).sum(axis=1))
            same(run_einsum(con, "ij->i", ["X"], pieces, join="x0 - 1", agg="max"),
                 (x - 1).max(axis=1))


def test_prod_over_a_skipped_zero_next_to_an_infinity_is_nan():
    # PROD over j of X[i,j] * Y[j]: a 0 of an absent tile times an inf is NaN, not 0.
    rng = np.random.default_rng(6)
    x = block_sparse(rng, (6, 6), (2, 2), [(0, 0), (0, 1), (0, 2), (1, 0), (2, 2)])
    y = rng.uniform(0.5, 2.0, 6)
    y[3] = INF
    want = np_(lambda: np.prod(x * y[None, :], axis=1))
    assert np.isnan(want).any()
    for stored, pieces in itertools.product(STORED, PIECES):
        with tensordb.connect() as con:
            con.load("X", x, tile=stored)
            con.load("Y", y)
            con.execute(f"P[i] = PROD(X[i,j] * Y[j]) WITH (PIECES i {pieces}, j {pieces});")
            same(con.tensor("P"), want)


def test_nan_in_a_chain_reaches_through_skipped_tiles_of_an_intermediate():
    # T = A B is an intermediate with absent tiles; T C with C holding a NaN must see them as
    # zeros that meet the NaN (0 * NaN), whatever the tilings.
    rng = np.random.default_rng(7)
    a = block_sparse(rng, (6, 6), (2, 2), [(0, 0), (2, 2)])
    b = block_sparse(rng, (6, 6), (2, 2), [(0, 0), (2, 2)])
    c = rng.standard_normal((6, 4))
    c[2, 1] = NAN
    want = np_(lambda: ((a @ b)[:, :, None] * c[None]).sum(axis=1))
    for stored, pieces in itertools.product(STORED[:2], PIECES):
        with tensordb.connect() as con:
            con.load("A", a, tile=stored)
            con.load("B", b, tile=stored)
            con.load("C", c, tile=(3, 3))
            same(run_einsum(con, "ij,jk,kl->il", ["A", "B", "C"], pieces), want)


# -- item 6: the block-sparse speed is kept ---------------------------------------------------------

def _present_calls(mask_a, mask_b):
    """Kernel calls (i, j, k) of a tile matmul whose two input tiles are both stored."""
    return int(np.einsum("ij,jk->", mask_a.astype(np.int64), mask_b.astype(np.int64)))


def test_block_sparse_product_runs_only_present_tiles_when_partners_are_finite():
    rng = np.random.default_rng(8)
    g, t = 16, 4                                   # a 16 x 16 grid of 4 x 4 tiles, ~6% dense
    ma, mb = rng.random((g, g)) < 0.06, rng.random((g, g)) < 0.06
    ma[0, 0] = mb[0, 0] = True
    a = block_sparse(rng, (g * t, g * t), (t, t), list(zip(*np.nonzero(ma))))
    b = block_sparse(rng, (g * t, g * t), (t, t), list(zip(*np.nonzero(mb))))
    with tensordb.connect() as con:
        con.load("A", a, tile=(t, t))
        con.load("B", b, tile=(t, t))
        con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": g, "j": g, "k": g})
        same(con.tensor("C"), a @ b)
        assert con.last_plan.kernel_calls == _present_calls(ma, mb)
        # The optimizer counts the same calls (its block-sparse cost) when left to choose.
        con.einsum("ij,jk->ik", "A", "B", into="C2")
        same(con.tensor("C2"), a @ b)
        assert con.last_plan.kernel_calls <= _present_calls(np.ones_like(ma), np.ones_like(mb))
        # A division by a finite tensor with no zeros skips the numerator's absent tiles too.
        d = rng.uniform(1.0, 2.0, (g * t, g * t))
        con.load("D", d, tile=(t, t))
        con.einsum("ij,ij->ij", "A", "D", into="Q", join="x0 / x1", pieces={"i": g, "j": g})
        same(con.tensor("Q"), a / d)
        assert con.last_plan.kernel_calls == int(ma.sum())


def test_one_infinite_tile_adds_only_the_calls_it_reaches():
    rng = np.random.default_rng(9)
    g, t = 8, 3
    ma, mb = rng.random((g, g)) < 0.15, rng.random((g, g)) < 0.15
    ma[0, 0] = mb[0, 0] = True
    mb[5, 2] = True
    a = block_sparse(rng, (g * t, g * t), (t, t), list(zip(*np.nonzero(ma))))
    b = block_sparse(rng, (g * t, g * t), (t, t), list(zip(*np.nonzero(mb))))
    b[5 * t + 1, 2 * t] = INF                      # tile (5, 2) of B is not finite
    with tensordb.connect() as con:
        con.load("A", a, tile=(t, t))
        con.load("B", b, tile=(t, t))
        con.einsum("ij,jk->ik", "A", "B", into="C", pieces={"i": g, "j": g, "k": g})
        same(con.tensor("C"), np_(lambda: (a[:, :, None] * b[None]).sum(axis=1)))
        # Every (i, 5, 2) call runs (absent A tiles meet the inf); nothing else is added.
        extra = int((~ma[:, 5]).sum())
        assert con.last_plan.kernel_calls == _present_calls(ma, mb) + extra


# -- item 6: the catalog's nonfinite flag ------------------------------------------------------------

def _flags(con, name):
    rows = con.store.query("SELECT coords, nonfinite FROM tensordb.tiles t JOIN tensordb.tensors "
                           "s ON t.tensor = s.name AND t.version = s.version "
                           f"WHERE lower(s.name) = lower('{name}') ORDER BY coords")
    return {tuple(c): f for c, f in rows}


def test_every_tile_writer_records_nonfinite(tmp_path):
    x = np.arange(1.0, 17.0).reshape(4, 4)
    x[0, 1], x[3, 3] = INF, NAN
    want = {(0, 0): True, (0, 1): False, (1, 0): False, (1, 1): True}
    np.save(tmp_path / "x.npy", x)
    with tensordb.connect() as con:
        con.load("A", x, tile=(2, 2))                                    # an array
        con.load("B", str(tmp_path / "x.npy"), tile=(2, 2))              # a .npy file
        con.execute("CREATE TABLE coo AS SELECT i, j, "
                    "CASE WHEN i = 0 AND j = 1 THEN 'inf'::DOUBLE WHEN i = 3 AND j = 3 "
                    "THEN 'nan'::DOUBLE ELSE 1.0 + i * 4 + j END AS v "
                    "FROM range(4) a(i), range(4) b(j)")
        con.execute("CREATE TENSOR C FROM coo INDEX (i, j) VALUE v TILE (2, 2);")   # COO
        con.execute("CREATE TENSOR D FROM (SELECT CASE WHEN range = 1 THEN 'inf'::DOUBLE "
                    "ELSE 1.0 END AS a, 2.0 AS b FROM range(4)) TILE (2, 1);")     # dense table
        con.execute("E[i,j] = A[i,j] * 2 WITH (PIECES i 2, j 2);")                # an einsum
        for name in "ABCE":
            assert _flags(con, name) == want, name
        assert _flags(con, "D") == {(0, 0): True, (0, 1): False, (1, 0): False, (1, 1): False}
        same(con.tensor("C"), x)


def test_a_catalog_without_the_column_opens_and_is_treated_as_unknown(tmp_path):
    path = tmp_path / "old.tdb"
    rng = np.random.default_rng(10)
    a = block_sparse(rng, (6, 6), (2, 2), [(0, 0), (2, 2)])
    y = np.full((6, 4), INF)
    with tensordb.connect(path) as con:
        con.load("A", a, tile=(2, 2))
        con.load("Y", y, tile=(2, 2))
    with duckdb.connect(str(path / "catalog.duckdb")) as duck:   # the previous version's schema
        duck.execute("ALTER TABLE tensordb.tiles DROP COLUMN nonfinite")
    want = np_(lambda: (a[:, :, None] * y[None]).sum(axis=1))
    with tensordb.connect(path, read_only=True) as con:          # read-only: the column stays out
        same(con.tensor("Y"), y)
        assert "kernel" in con.explain("C[i,k] = SUM(A[i,j] * Y[j,k]);").lower()
    for _ in range(2):                                           # adding the column is idempotent
        with tensordb.connect(path) as con:
            assert set(_flags(con, "Y").values()) == {None}      # NULL: not known
            con.einsum("ij,jk->ik", "A", "Y", into="C", pieces={"i": 3, "j": 3, "k": 2},
                       replace=True)
            same(con.tensor("C"), want)
            assert set(_flags(con, "C").values()) == {True}


# -- item 5: aggregates over an empty label ----------------------------------------------------------

EMPTY_JOINS = [None, "x0", "exp(x0)", "x0 + 1", "x0 * x0", "relu(x0) - 2"]


def _join_fn(join):
    return {None: lambda x: x, "x0": lambda x: x, "exp(x0)": np.exp, "x0 + 1": lambda x: x + 1,
            "x0 * x0": lambda x: x * x, "relu(x0) - 2": lambda x: np.maximum(x, 0) - 2}[join]


def _check_empty_error(exc, agg):
    assert isinstance(exc, tensordb.DataError)
    text = str(exc)
    assert f"{agg.upper()} over label 'j' of size 0" in text


@pytest.mark.parametrize("agg", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("join", EMPTY_JOINS)
def test_aggregate_over_an_empty_label_python_api(agg, join):
    e = np.zeros((5, 0))
    red = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[agg]
    for stored, pieces in [((2, 1), 2), ((5, 1), 1), ((1, 1), 5)]:
        with tensordb.connect() as con:
            con.load("E", e, tile=stored)
            graph = tensordb.Graph().op("G", "i", [("E", "ij")], join=join, agg=agg,
                                        pieces={"i": pieces})
            if agg in ("max", "min"):
                with pytest.raises(ValueError):
                    red(_join_fn(join)(e), axis=1)               # numpy refuses too
                for call in (lambda: con.einsum("ij->i", "E", into="R", join=join, agg=agg,
                                                pieces={"i": pieces}),
                             lambda: con.run(graph)):
                    with pytest.raises(tensordb.DataError) as info:
                        call()
                    _check_empty_error(info.value, agg)
                    assert "E[i,j]" in str(info.value)           # names the operation
                assert [t["name"] for t in con.tensors()] == ["E"]   # nothing stored
                continue
            want = red(_join_fn(join)(e), axis=1)
            same(run_einsum(con, "ij->i", ["E"], pieces, join=join, agg=agg), want)
            con.run(graph)
            same(con.tensor("G"), want)


@pytest.mark.parametrize("agg", ["max", "min"])
@pytest.mark.parametrize("statement", ["R[i] = {AGG}(E[i,j]);", "R[i] = {AGG}(EXP(E[i,j]) + 1);",
                                       "R[i] = RELU({AGG}(E[i,j] * E[i,j])) + 2;",
                                       "R = {AGG}(E[i,j] * W[j]);"])
def test_max_min_over_an_empty_label_in_the_dialect(agg, statement):
    sql = statement.replace("{AGG}", agg.upper())
    with tensordb.connect() as con:
        con.load("E", np.zeros((3, 0)))
        con.load("W", np.zeros((0,)))
        with pytest.raises(tensordb.DataError) as info:
            con.execute(sql)
        _check_empty_error(info.value, agg)
        assert info.value.statement == sql                     # the statement, with a caret
        assert info.value.span.start == sql.index(agg.upper() + "(")
        assert not con.store.has("R")


@pytest.mark.parametrize("join", [None, "x0 + x1", "exp(x0 - x1)"])
def test_contraction_over_an_empty_label_gives_a_full_result(join):
    # X (4, 0) and Y (0, 5): the output (4, 5) is not empty; SUM is 0 and PROD is 1 everywhere.
    x, y = np.zeros((4, 0)), np.zeros((0, 5))
    fn = {None: lambda a, b: a * b, "x0 + x1": np.add, "exp(x0 - x1)": lambda a, b: np.exp(a - b)}[join]
    space = fn(x[:, :, None], y[None])
    for pieces in PIECES:
        with tensordb.connect() as con:
            con.load("X", x)
            con.load("Y", y)
            same(run_einsum(con, "ij,jk->ik", ["X", "Y"], pieces, join=join), space.sum(axis=1))
            same(run_einsum(con, "ij,jk->ik", ["X", "Y"], pieces, join=join, agg="prod"),
                 space.prod(axis=1))
            with pytest.raises(tensordb.DataError) as info:
                run_einsum(con, "ij,jk->ik", ["X", "Y"], pieces, join=join, agg="max")
            _check_empty_error(info.value, "max")
            con.execute(f"S[i,k] = SUM(X[i,j] * Y[j,k]) WITH (PIECES i {pieces}, k {pieces});")
            con.execute(f"P[i,k] = PROD(X[i,j] + Y[j,k]) WITH (PIECES i {pieces}, k {pieces});")
            same(con.tensor("S"), np.zeros((4, 5)))
            same(con.tensor("P"), np.ones((4, 5)))


@pytest.mark.parametrize("pieces", [1, 2, 4])
@pytest.mark.parametrize("join", ["x0 + x1", "x0 * x1"])
def test_prod_over_an_empty_label_next_to_a_cut_one_is_one(pieces, join):
    # PROD over k (4 elements, cut into pieces) and l (size 0): a product over no element is 1.
    # Found by tests/corpus/test_fuzz.py: with k cut, the one call per output tile was taken for a
    # skipped call and a 0 joined the product.
    m, e = np.arange(1.0, 13.0).reshape(3, 4), np.zeros((0,))
    fn = np.add if join == "x0 + x1" else np.multiply
    want = np.multiply.reduce(fn(m[:, :, None], e[None, None, :]), axis=(1, 2))
    with tensordb.connect() as con:
        con.load("M", m, tile=(1, 3))
        con.load("E", e)
        op = "+" if join == "x0 + x1" else "*"
        same(con.execute(f"P[i] = PROD(M[i,k] {op} E[l]) WITH (TILE (k {pieces}))").tensor(), want)
        con.einsum("ik,l->i", "M", "E", into="Q", join=join, agg="prod", pieces={"k": pieces})
        same(con.tensor("Q"), want)


@pytest.mark.parametrize("agg", ["SUM", "PROD", "MIN"])
def test_a_join_over_an_empty_space_is_evaluated_nowhere(agg):
    # POW(1, N[k,k]) fails on N's negative ints, but with l of size 0 the join space is empty:
    # the join is evaluated at no point and the answer is numpy's on that space (an empty
    # result, or 0 / 1 for SUM / PROD over the empty label). Found by tests/corpus/test_fuzz.py.
    n = np.array([[2, -5, 4], [2, -3, -1], [0, 3, 5]], np.int64)
    e = np.zeros((0, 3), np.int64)
    with tensordb.connect() as con:
        con.load("N", n, tile=(3, 2))
        con.load("E", e)
        with pytest.raises(tensordb.DataError, match="negative integer powers"):
            con.execute("Bad[k] = POW(1, N[k,k])")
        got = con.execute(f"R[l,k] = {agg}(E[l,k] - POW(1, N[k,k]) + N[k,j])").tensor()
        assert got.shape == (0, 3) and got.dtype == np.int64
        got = con.execute("S[k] = SUM(E[l,k] - POW(1, N[k,k]))").tensor()
        assert got.dtype == np.int64 and np.array_equal(got, np.zeros(3, np.int64))
        if agg == "PROD":
            got = con.execute("P[k] = PROD(E[l,k] - POW(1, N[k,k]))").tensor()
            assert np.array_equal(got, np.ones(3, np.int64))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("agg", ["sum", "prod", "max", "min"])
def test_empty_output_labels_give_an_empty_result(dtype, agg):
    # X (0, 3): aggregating the non-empty j leaves an empty i; numpy gives shape (0,) with no
    # error even for MAX, and so must we; the output keeps the input's dtype.
    x = np.zeros((0, 3), dtype)
    red = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[agg]
    want = red(x, axis=1)
    for pieces in PIECES:
        with tensordb.connect() as con:
            con.load("X", x)
            got = run_einsum(con, "ij->i", ["X"], pieces, agg=agg)
            assert got.shape == (0,) and got.dtype == want.dtype
            got = run_einsum(con, "ij->ji", ["X"], pieces, join="exp(x0)")
            assert got.shape == (3, 0) and got.dtype == np.dtype(dtype)
            con.execute(f"R2[i] = {agg.upper()}(X[i,j]);")
            assert con.tensor("R2").shape == (0,) and con.tensor("R2").dtype == want.dtype


# -- the skipping rules themselves, against numpy ------------------------------------------------

RULE_JOINS = ["x0 * x1", "x1 * x0", "x0 / x1", "x1 / x0", "x0 + x1", "x0 - x1", "max(x0, x1)",
              "min(x0, x1)", "relu(x0) * x1", "exp(x0) * x1", "x0 * x1 * x1", "0.5 * x0 * x1",
              "3 * x0 * x1", "x0 * x1 / 8", "pow(x0, 2) * x1", "pow(x0, 0)", "pow(x0, -1)",
              "sqrt(x0)", "cos(x0)", "sigmoid(x0)", "tanh(x0) - sin(x1)", "abs(x0) / -x1",
              "square(x0)", "log(x0)", "x0 * sigmoid(x1)", "x0 * exp(x1)", "x0 * (x1 + x1)"]
NUMPY = {"max": np.maximum, "min": np.minimum, "relu": lambda x: np.maximum(x, 0), "exp": np.exp,
         "pow": np.power, "sqrt": np.sqrt, "cos": np.cos, "sin": np.sin, "tanh": np.tanh,
         "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "abs": np.abs, "square": np.square,
         "log": np.log}


@pytest.mark.parametrize("join", RULE_JOINS)
def test_a_call_is_skipped_only_where_numpy_gives_zero(join):
    # For every case the rules call "certainly 0", numpy must give exactly 0 on values that
    # satisfy the facts, including values whose sums and products overflow.
    from tensordb.plan.scalar import parse_join
    from tensordb.plan.skip import zero_when_absent
    expr = parse_join(join)
    def values(dtype):  # (finite, nonzero and finite, anything), all representable in dtype
        big, tiny = (np.finfo(dtype).max / 1.5, np.finfo(dtype).tiny)  # big + big overflows
        nonzero = np.array([1.0, -2.5, tiny, big, -big, 7.0], dtype)
        return (np.concatenate([nonzero, np.array([0.0, -0.0], dtype)]), nonzero,
                np.array([0.0, 1.0, INF, -INF, NAN, big], dtype))
    said_zero = 0
    for absent, finite, nonzero in itertools.product(
            [{0}, {1}, {0, 1}], [set(), {0}, {1}, {0, 1}], [set(), {0}, {1}, {0, 1}]):
        if not zero_when_absent(expr, absent, finite, nonzero):
            continue
        said_zero += 1
        for dtype in ("float64", "float32"):
            finite_vals, nonzero_vals, wild = values(dtype)
            pools = [np.zeros(1, dtype) if k in absent else nonzero_vals if k in nonzero
                     else finite_vals if k in finite else wild for k in (0, 1)]
            x0, x1 = np.meshgrid(*pools, indexing="ij")
            got = np_(lambda: eval(join, {**NUMPY, "x0": x0, "x1": x1}))  # noqa: S307
            assert np.all(np.asarray(got) == 0), (join, absent, finite, nonzero, dtype, got)
    # The rules are not vacuous: a plain product of finite partners is skipped.
    if join in ("x0 * x1", "x0 / x1", "x0 * x1 / 8", "0.5 * x0 * x1", "relu(x0) * x1"):
        assert said_zero


def test_the_optimizer_counts_absent_tiles_only_next_to_finite_partners():
    from tensordb.optimizer.cost import OpModel, Presence
    from tensordb.plan.ir import EinOp
    op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 8, "j": 8, "k": 8})
    grid = ((0, 4, 8), (0, 4, 8))
    presence = {"A": Presence(grid, [(0, 0)])}
    dt = {"A": "float64", "B": "float64"}
    finite = OpModel.of(op, dt, 4, presence=presence, facts={"A": (True, False), "B": (True, False)})
    inf = OpModel.of(op, dt, 4, presence=presence, facts={"A": (True, False), "B": (False, False)})
    assert finite.inputs[0].inner and finite.present((2, 2, 2)) == 0.25
    assert not inf.inputs[0].inner and inf.present((2, 2, 2)) == 1.0


# -- literals are applied where NumPy applies them (found by review) --------------------------------

LITERAL_CASES = [
    ("R[i] = X[i] * 1e300 * 1e10", lambda X, Y, A: X * 1e300 * 1e10),       # two literals
    ("R[i] = (X[i] * 1e300) * 1e10", lambda X, Y, A: (X * 1e300) * 1e10),
    ("R[i] = X[i] * (Y[i] * 1e300)", lambda X, Y, A: X * (Y * 1e300)),      # inside the product
    ("R[i] = 1e300 * X[i] * Y[i]", lambda X, Y, A: 1e300 * X * Y),          # leading
    ("R[i] = X[i] * Y[i] * 1e300", lambda X, Y, A: X * Y * 1e300),          # trailing
    ("R[i,k] = SUM(A[i,j] * (A[j,k] * 1e300 * 1e10))",
     lambda X, Y, A: np.einsum("ij,jk->ik", A, A * 1e300 * 1e10)),
    ("R[i,k] = SUM(1e300 * A[i,j] * A[j,k])",
     lambda X, Y, A: np.einsum("ij,jk->ik", 1e300 * A, A)),
    ("R[i] = X[i] / 3", lambda X, Y, A: X / 3),                             # not * (1/3)
]


@pytest.mark.parametrize("tile", [None, (1,)])
@pytest.mark.parametrize("query,oracle", LITERAL_CASES, ids=[c[0] for c in LITERAL_CASES])
def test_literals_overflow_where_numpy_overflows(query, oracle, tile):
    X = np.array([0.0, 1.0, 3.0, 1e-300])
    Y = np.array([1e10, 1e10, 1.0, 0.0])
    A = np.array([[0.0, 1.0], [1.0, 0.0]])
    with tensordb.connect() as con, np.errstate(all="ignore"):
        con.load("X", X, tile=tile)
        con.load("Y", Y, tile=tile)
        con.load("A", A, tile=None if tile is None else (1, 1))
        con.execute(query)
        want = oracle(X, Y, A)
        got = con.tensor("R")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # exact: NaN and inf in the same places


@pytest.mark.parametrize("agg,fn", [("MAX", np.max), ("MIN", np.min), ("SUM", np.sum),
                                    ("PROD", np.prod)])
def test_an_aggregate_over_every_label_in_many_chunks_is_numpys(agg, fn, monkeypatch):
    # every label aggregated: each chunk reduces to a scalar, which the accumulator folds, and
    # the two calls' partials (pieces along j) are folded again. The plan's chunks of 4,096
    # elements give each call ~41 chunks, as 600x700x800 did at the default CHUNK_ELEMENTS
    # (the numpy oracle's 2.7 GB join space then took most of the time).
    from tensordb.plan import kernel as plan_kernel
    monkeypatch.setattr(plan_kernel, "CHUNK_ELEMENTS", 4096)  # the plan chooses chunks
    rng = np.random.default_rng(5)
    a = rng.uniform(0.999, 1.001, (60, 70))
    b = rng.uniform(0.999, 1.001, (70, 80)) if agg != "PROD" else rng.uniform(0.9999, 1.0001, (70, 80))
    with tensordb.connect(workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        con.execute(f"C[] = {agg}(A[i,j] * B[j,k]) WITH (PIECES j 2);")
        np.testing.assert_allclose(float(con.tensor("C")), fn(a[:, :, None] * b[None, :, :]),
                                   rtol=1e-9)


TRAILING_CASES = [  # a literal after the product, inside the sum: NumPy scales each product
    ("S = SUM(X[i] * Y[i] * 0.0)", lambda X, Y, A: np.sum(X * Y * 0.0)),
    ("S = SUM(X[i] * Y[i] * 0.5)", lambda X, Y, A: np.sum(X * Y * 0.5)),
    ("S = SUM(X[i] * Y[i] / 2)", lambda X, Y, A: np.sum(X * Y / 2)),
    ("S = SUM(X[i] * Y[i] * 1e-300)", lambda X, Y, A: np.sum(X * Y * 1e-300)),
    ("S[i] = SUM(X[i] * Y[j] * 1e-300)", lambda X, Y, A: np.sum(X[:, None] * Y[None, :] * 1e-300,
                                                               axis=1)),
    ("S[i,k] = SUM(A[i,j] * A[j,k] * 0.25)", lambda X, Y, A: np.sum(
        A[:, :, None] * A[None, :, :] * 0.25, axis=1)),
    ("S[i,k] = SUM(A[i,j] * A[j,k] * 0.0)", lambda X, Y, A: np.sum(
        A[:, :, None] * A[None, :, :] * 0.0, axis=1)),
]


@pytest.mark.parametrize("tile", [None, (1,), (3,)])
@pytest.mark.parametrize("query,oracle", TRAILING_CASES, ids=[c[0] for c in TRAILING_CASES])
def test_a_trailing_literal_in_a_sum_overflows_where_numpy_does(query, oracle, tile):
    """BLAS multiplies the sum of the products by a trailing literal; where that sum is not
    finite (it overflowed, or met 0 * inf) the kernel computes the join as NumPy does, each
    product times the literal. Once: NaN for 0.0 and inf for 0.5 where NumPy gives 0 and
    1e308."""
    X = np.array([1e308, 1e308, 1.0, -3.0])
    Y = np.array([1.0, 1.0, 2.0, 0.5])
    A = np.array([[1e308, 1e308, 2.0, 1.0], [1.0, 0.0, 3.0, 1.0], [2.0, 1.0, 0.0, 1.0],
                  [1.0, 1.0, 1.0, 1.0]])
    with tensordb.connect() as con, np.errstate(all="ignore"):
        con.load("X", X, tile=tile)
        con.load("Y", Y, tile=tile)
        con.load("A", A, tile=None if tile is None else tile * 2)
        con.execute(query)
        want = oracle(X, Y, A)
        got = con.tensor("S")
    same(got, want)
