"""Review of the row bands of large sparse kernel calls (exec/sparse_bands.py, band41): the banded
result is the one call's, bit for bit (bands forced through ``FORCE_ROWS``: 1, 2, 3, 7 and
rows - 1 rows), and numpy's on the densified operands; for every banded kernel and dtype, NaN,
inf and -0.0, empty rows and an empty band, the fills of min-plus and max-plus, a matrix on
both sides, row-tile boxes and a gather's rows; the outputs (a caller's ``out``, ``sink``, CSR
bands concatenated); a cancel between bands; a replaced input between statements; the Dask
executor; a hypersparse (COO) box, which is never banded."""
from __future__ import annotations

import _thread
import json
import os
import time

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec import sparse_bands
from tensordb.exec.sparse_kernels import sparse_call
from tensordb.physical.choice import choose_kernel
from tensordb.plan.ir import EinOp
from tensordb.plan.kernel import with_output
from tensordb.plan.scalar import parse_join
from tensordb.storage.boxes import RowGather
from tensordb.storage.sparse import Filled, RowSlabs, densify

N = 40
EMPTY = [0, 5, 6, 7, 8] + list(range(33, N))  # rows 35-39 all empty: an empty band of 7
FORCES = (1, 2, 3, 7, N - 1)
INF = np.inf


@pytest.fixture
def bands(monkeypatch):
    """``bands.force(rows)`` bands every call by ``rows``; ``bands.one()`` makes every call one
    call; ``bands.count`` lists the bands made (r0, r1)."""
    made = []
    rows = sparse_bands._rows

    def counted(a, ax, r0, r1):
        made.append((r0, r1))
        return rows(a, ax, r0, r1)
    monkeypatch.setattr(sparse_bands, "_rows", counted)

    class Bands:
        count = made

        @staticmethod
        def force(n):
            monkeypatch.setattr(sparse_bands, "FORCE_ROWS", n)

        @staticmethod
        def one():
            monkeypatch.setattr(sparse_bands, "FORCE_ROWS", None)
            monkeypatch.setattr(sparse_bands, "SMALL_WORK", 1 << 62)
    return Bands


def _graph(n, density, seed, dtype, m=None, special=False):
    """Integral values (exact sums in any order), negatives for floats, rows ``EMPTY`` empty;
    ``special``: a NaN, an inf and a -inf among the entries."""
    rng = np.random.default_rng(seed)
    d = sp.random_array((n, m or n), density=density, rng=rng, format="csr").toarray()
    d = np.where(d != 0, np.round(d * 8) + 1, 0)
    if np.dtype(dtype).kind == "f":
        d = np.where(rng.random(d.shape) < 0.3, -d, d)
    d[[r for r in EMPTY if r < n]] = 0
    d = d.astype(dtype)
    if special:
        nz = np.argwhere(d != 0)
        d[tuple(nz[1])], d[tuple(nz[4])], d[tuple(nz[7])] = np.nan, INF, -INF
    return sp.csr_array(d)


def _method(con, sql):
    out = con.explain(sql, format="json")
    out = out if isinstance(out, dict) else json.loads(out)
    return out["nodes"][0]["kernel"]["method"]


def _bits(a):
    a = np.ascontiguousarray(a.toarray() if hasattr(a, "toarray") else a)
    return a.dtype, a.shape, a.tobytes()


def _same(got, want):
    """Equal to numpy's answer, NaN where it is NaN (the sign of a zero: by ``_bits``)."""
    got = np.asarray(got.toarray() if hasattr(got, "toarray") else got)
    np.testing.assert_array_equal(got.astype(np.float64), np.asarray(want, np.float64))


def _each_force(con, bands, sql, forces=FORCES):
    """The statement as one call, then banded by each of ``forces``: (the one call's tensor, the
    bands made by the last force); each banded tensor bit for bit the one call's."""
    name = sql.split("[")[0].split(" ")[0]
    bands.one()
    del bands.count[:]
    con.execute(sql)
    assert not bands.count, sql
    one, nnz = con.tensor(name), con.store.meta(name).nnz
    made = {}
    for rows in forces:
        bands.force(rows)
        del bands.count[:]
        con.execute(sql)
        made[rows] = list(bands.count)
        assert _bits(con.tensor(name)) == _bits(one), (sql, rows)
        assert con.store.meta(name).nnz == nnz, (sql, rows)
    return one, made


def _row_cases(dtype):
    rng = np.random.default_rng(3)
    A, B = _graph(N, 0.08, 1, dtype), _graph(N, 0.08, 2, dtype)
    Ad, Bd = A.toarray(), B.toarray()

    def small(shape):
        return (np.round(rng.random(shape) * 8) - (3 if np.dtype(dtype).kind != "b" else 0)
                ).astype(dtype)
    M, x, U, V = small((N, 5)), small(N), small((N, 3)), small((N, 3))
    ops = {"A": A, "B": B, "M": M, "x": x, "U": U, "V": V}
    with np.errstate(all="ignore"):
        cases = [
            ("Y[i,k] = SUM(A[i,j] * M[j,k])", "spmm", Ad @ M),
            ("w[i] = SUM(A[i,j] * x[j])", "spmm", Ad @ x),
            ("C[i,k] = SUM(A[i,j] * B[j,k])", "spmm", Ad @ Bd),
            ("T[k,i] = SUM(A[i,j] * B[j,k])", "spmm", (Ad @ Bd).T),
            ("GG[i,k] = SUM(A[i,j] * A[j,k])", "spmm", Ad @ Ad),
            ("X[i,k] = MAX(A[i,j] * B[j,k])", "semiring", (Ad[:, :, None] * Bd[None]).max(1)),
            ("XT[k,i] = MIN(A[i,j] * B[j,k])", "semiring", (Ad[:, :, None] * Bd[None]).min(1).T),
            ("t = SUM(A[i,j] * A[j,k] * A[k,i])", "masked", np.einsum("ij,jk,ki->", Ad, Ad, Ad)),
            ("S[i,j] = SUM(A[i,j] * U[i,r] * V[j,r])", "sddmm", Ad * (U @ V.T)),
            ("ST[j,i] = SUM(A[i,j] * U[i,r] * V[j,r])", "sddmm", (Ad * (U @ V.T)).T),
            ("J[i,j] = A[i,j] * B[i,j]", "spjoin", Ad * Bd),
            ("AA[i,j] = A[i,j] * A[i,j]", "spjoin", Ad * Ad),
            ("K[i,j] = A[i,j] + B[j,i]", "spjoin", Ad + Bd.T),
            ("DT[j,i] = A[i,j] - B[i,j]", "spjoin", (Ad - Bd).T),
            ("r[i] = SUM(A[i,j])", "spreduce", Ad.sum(1)),
            ("m[i] = MAX(A[i,j])", "spreduce", Ad.max(1)),
        ]
    return ops, cases


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
@pytest.mark.parametrize("tile", [None, (9, N)])
def test_every_banded_kernel_equals_the_one_call_and_numpy(tmp_path, bands, dtype, tile):
    """Each kernel the module bands (``_ROW_METHODS`` and the masked product) on a matrix with
    empty rows (a band of only empty rows with 7-row bands; bands of one row; a last band
    shorter; rows - 1 rows: two bands), and on a box of 9-row stored tiles (``RowSlabs``)."""
    ops, cases = _row_cases(dtype)
    seen = set()
    with tensordb.connect(tmp_path / "b.tdb", workers=2) as con:
        for name, a in ops.items():
            con.load(name, a, **({"tile": tile} if tile and sp.issparse(a) else {}))
        for sql, method, expect in cases:
            assert _method(con, sql) == method, sql
            seen.add(method)
            one, made = _each_force(con, bands, sql)
            assert len(made[1]) >= N, sql  # banded: one band a row (per banded operand)
            assert any(r1 - r0 == N - 1 for r0, r1 in made[N - 1]), sql
            _same(one, np.asarray(expect).astype(dtype))
    assert seen == {"spmm", "semiring", "masked", "sddmm", "spjoin", "spreduce"}


def test_bool_operands_take_no_banded_kernel_and_equal_numpy(tmp_path, bands):
    """bool matrices are not given a sparse kernel: no band is made, numpy's answer."""
    A, B = _graph(N, 0.1, 1, bool), _graph(N, 0.1, 2, bool)
    with tensordb.connect(tmp_path / "b.tdb") as con:
        con.load("A", A)
        con.load("B", B)
        for sql, want in (("J[i,j] = A[i,j] * B[i,j]", A.toarray() & B.toarray()),
                          ("C[i,k] = SUM(A[i,j] * B[j,k])", A.toarray() @ B.toarray())):
            one, made = _each_force(con, bands, sql, forces=(1, 7))
            assert made == {1: [], 7: []}, sql
            _same(one, want)


NONFINITE = [
    ("X[i,k] = MAX(A[i,j] * B[j,k])", "semiring", lambda a, b: (a[:, :, None] * b[None]).max(1)),
    ("XN[i,k] = MIN(A[i,j] * B[j,k])", "semiring", lambda a, b: (a[:, :, None] * b[None]).min(1)),
    ("J[i,j] = A[i,j] * B[i,j]", "spjoin", lambda a, b: a * b),
    ("C[i,k] = SUM(A[i,j] * B[j,k])", "spmm", lambda a, b: a @ b),
    ("T[k,i] = SUM(A[i,j] * B[j,k])", "spmm", lambda a, b: (a @ b).T),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sql,method,expect", NONFINITE, ids=[c[0].split("[")[0]
                                                              for c in NONFINITE])
def test_a_nan_or_inf_in_some_rows_gives_the_one_calls_zeros_and_nans(tmp_path, bands, dtype,
                                                                      sql, method, expect):
    """Found here: a kernel that tests its operands' values (a NaN or inf: numpy's dense
    product) took its sparse path in the bands of finite rows and the dense one in the others:
    banded max-times, min-times and ``A * B`` gave 0.0 where the one call (and numpy: ``-6 *
    0``) gives -0.0, a banded SpGEMM a NaN of the other sign. Such a call is now one call."""
    A, B = _graph(N, 0.1, 1, dtype, special=True), _graph(N, 0.1, 2, dtype)
    with tensordb.connect(tmp_path / "n.tdb") as con:
        con.load("A", A)
        con.load("B", B)
        assert _method(con, sql) == method
        one, made = _each_force(con, bands, sql)
        assert made[1] == []  # one call
        with np.errstate(all="ignore"):
            want = expect(A.toarray(), B.toarray()).astype(dtype)
        _same(one, want)
        if method == "semiring":  # numpy's -0.0s too (a join holding NaN/inf runs on its
            assert _bits(one) == _bits(want)  # entries since nd41: an absent -0.0 reads 0.0)
    # a finite matrix is still banded
    A = _graph(N, 0.1, 1, dtype)
    with tensordb.connect(tmp_path / "f.tdb") as con:
        con.load("A", A)
        con.load("B", B)
        one, made = _each_force(con, bands, sql.replace("B[", "A["), forces=(3,))
        assert len(made[3]) >= N // 3


@pytest.mark.parametrize("masked", [False, True])
def test_overflowing_dot_products_in_some_rows_band_as_one_call(tmp_path, bands, masked):
    """Finite values whose dot products may overflow in some rows only (U's row 20): sddmm and
    the masked product compute those densely (numpy's NaN where M is 0); a band of the other
    rows passed the test and took the sparse path. Now the one call's, bit for bit."""
    rng = np.random.default_rng(8)
    A = _graph(N, 0.1, 4, np.float64)
    U, V = rng.integers(-3, 4, (N, 3)).astype(float), rng.integers(-3, 4, (N, 3)).astype(float)
    U[20] = 1e300
    V[3] = 1e10
    sql = ("t = SUM(A[i,j] * U[i,r] * V[j,r])" if masked else
           "S[i,j] = SUM(A[i,j] * U[i,r] * V[j,r])")
    with tensordb.connect(tmp_path / "o.tdb") as con:
        con.load("A", A)
        con.load("U", U)
        con.load("V", V)
        assert _method(con, sql) == ("masked" if masked else "sddmm")
        one, made = _each_force(con, bands, sql)
        assert made[1] == []
    with np.errstate(all="ignore"):
        want = (A.toarray()[:, :, None] * U[:, None, :] * V[None, :, :]).sum(2)
    np.testing.assert_allclose(np.asarray(one), want.sum() if masked else want, rtol=1e-12)


@pytest.mark.parametrize("fill,agg", [(INF, "MIN"), (-INF, "MAX")], ids=["min_plus", "max_plus"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_min_plus_and_max_plus_bands_keep_the_fill(tmp_path, bands, fill, agg, dtype):
    """A semiring over ``+inf`` (``-inf``) fills, banded: the fill kept, empty rows all fill,
    the same matrix on both sides, the output transposed (CSR bands side by side)."""
    A, B = _graph(N, 0.08, 5, dtype), _graph(N, 0.08, 6, dtype)

    def dense(a):
        d = np.full(a.shape, fill, dtype)
        coo = a.tocoo()
        d[coo.row, coo.col] = coo.data
        return d
    Ad, Bd = dense(A), dense(B)
    red = np.min if agg == "MIN" else np.max
    with tensordb.connect(tmp_path / "m.tdb") as con:
        con.load("A", A, fill_value=fill)
        con.load("B", B, fill_value=fill)
        for sql, want in ((f"P[i,k] = {agg}(A[i,j] + B[j,k])", red(Ad[:, :, None] + Bd[None], 1)),
                          (f"PT[k,i] = {agg}(A[i,j] + B[j,k])",
                           red(Ad[:, :, None] + Bd[None], 1).T),
                          (f"PP[i,k] = {agg}(A[i,j] + A[j,k])", red(Ad[:, :, None] + Ad[None], 1))):
            assert f"semiring {agg.lower()}_plus" in con.explain(sql), sql
            one, made = _each_force(con, bands, sql)
            assert len(made[1]) >= N
            _same(one, want)
            name = sql.split("[")[0]
            assert con.store.meta(name).fill == fill
            assert con.store.meta(name).nnz == np.count_nonzero(want != fill)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_min_plus_over_a_whole_operand_holding_inf_is_still_banded(tmp_path, bands, dtype):
    """The value test is the kernel's own and only on what is banded: min-plus of a sparse
    ``+inf``-fill matrix and a dense distance matrix holding ``+inf`` (unreached: read whole by
    every band) is banded, the one call's bit for bit and numpy's; a NaN in the banded matrix
    (the kernel's dense path) makes it one call."""
    rng = np.random.default_rng(12)
    D = _graph(N, 0.1, 13, dtype)
    X = np.round(rng.random((N, 6)) * 8).astype(dtype)
    X[rng.random(X.shape) < 0.3] = INF
    Dd = np.where(D.toarray() != 0, D.toarray(), INF).astype(dtype)
    with tensordb.connect(tmp_path / "d.tdb") as con:
        con.load("D", D, fill_value=INF)
        con.load("X", X)
        for sql, want in (("P[i,k] = MIN(D[i,j] + X[j,k])", (Dd[:, :, None] + X[None]).min(1)),
                          ("Q[k,i] = MIN(X[j,k] + D[i,j])", (Dd[:, :, None] + X[None]).min(1).T)):
            assert "semiring min_plus" in con.explain(sql)
            one, made = _each_force(con, bands, sql)
            assert len(made[1]) >= N, sql
            _same(one, want)
        Dn = D.copy()
        Dn.data[3] = np.nan
        con.load("D", Dn, fill_value=INF, replace=True)
        Dd = np.where(Dn.toarray() != 0, Dn.toarray(), INF).astype(dtype)
        one, made = _each_force(con, bands, "P[i,k] = MIN(D[i,j] + X[j,k])")
        assert made[1] == []
        _same(one, (Dd[:, :, None] + X[None]).min(1))


# -- the kernel call itself: outputs -------------------------------------------------------------

def _op(out, out_labels, inputs, n, dtype, join=None, agg="sum"):
    sizes = {l: n for _, ls in inputs for l in ls}
    sizes.update({"r": 4})
    return EinOp.contraction(out, out_labels, inputs, sizes, dtype=np.dtype(dtype),
                             **({"join": parse_join(join), "agg": agg} if join else {}))


def _calls(bands, op, choice, args, shapes, out_shape, forces, **kw):
    """The one call, then per force (the banded result, its fractions)."""
    bands.one()
    one = sparse_call(op, choice, args, shapes, out_shape, check=lambda f=None: None)
    res = {}
    for rows in forces:
        fractions = []
        bands.force(rows)
        del bands.count[:]
        got = sparse_call(op, choice, args, shapes, out_shape, check=fractions.append, **kw)
        res[rows] = (got, fractions, list(bands.count))
    return one, res


def _csr_equal(x, y):
    x, y = (getattr(m, "csr", m) for m in (x, y))
    assert x.format == y.format == "csr" and x.shape == y.shape
    assert x.has_canonical_format
    for r in range(x.shape[0]):  # sorted, no duplicates
        assert (np.diff(x.indices[x.indptr[r]:x.indptr[r + 1]]) > 0).all()
    assert (x.indptr.dtype, x.indices.dtype) == (y.indptr.dtype, y.indices.dtype)
    np.testing.assert_array_equal(x.indptr, y.indptr)
    np.testing.assert_array_equal(x.indices, y.indices)
    assert _bits(x.data) == _bits(y.data)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
@pytest.mark.parametrize("transposed", [False, True])
def test_csr_bands_are_concatenated_as_the_one_calls_tile(bands, dtype, transposed):
    """SpGEMM and min-plus whose plan says CSR: the bands' entry arrays, one after the other
    (the output's rows) or side by side (its columns: transposed), are the one call's tile: row
    pointers, column indices, values, sorted and without duplicates; fractions rise within
    (0, 1), one between two bands; numpy's answer."""
    n = 60
    A, B = _graph(n, 0.05, 7, dtype), _graph(n, 0.05, 8, dtype)
    out = "ki" if transposed else "ik"
    op = _op("C", out, [("A", "ij"), ("B", "jk")], n, dtype)
    spgemm = with_output(choose_kernel(op, sparse=(0, 1), finite=(True, True)), op, 200)
    cases = [(op, spgemm, [A, B], A.toarray() @ B.toarray())]
    if np.dtype(dtype).kind == "f":
        mp = _op("P", out, [("A", "ij"), ("B", "jk")], n, dtype, join="x0 + x1", agg="min")
        semi = with_output(choose_kernel(mp, sparse=(0, 1), finite=(False, False),
                                         fills=(INF, INF)), mp, 200)
        assert semi.semiring == "min_plus"
        Fa, Fb = (np.where(m.toarray() != 0, m.toarray(), INF) for m in (A, B))
        cases.append((mp, semi, [Filled(A, INF), Filled(B, INF)],
                      (Fa[:, :, None] + Fb[None]).min(1)))
    for o, c, args, want in cases:
        assert c.out_format == "csr"
        one, res = _calls(bands, o, c, args, [(n, n)] * 2, (n, n), (1, 2, 3, 7, n - 1))
        for rows, (got, fractions, made) in res.items():
            assert type(got) is type(one), rows
            assert getattr(got, "fill", 0) == getattr(one, "fill", 0)
            _csr_equal(got, one)
            assert fractions == sorted(fractions) and 0 <= fractions[0] and fractions[-1] < 1
            assert len(fractions) == -(-n // rows) - 1
        dense = densify(one)
        _same(dense.T if transposed else dense, want.astype(dtype))


def test_spmm_bands_write_the_callers_out_and_sink_its_rows_in_order(bands):
    """SpMM given the output's buffer: each band computes into its rows of ``out`` (the result
    is ``out``), ``sink`` gets every row once, in order; from a CSR tile and from a box of row
    tiles (``RowSlabs``, banded across its tiles' edges); an ``out`` of another dtype is not
    written and the result is still numpy's."""
    n = 50
    A = _graph(n, 0.1, 9, np.float64)
    M = np.random.default_rng(2).integers(-3, 4, (n, 6)).astype(np.float64)
    op = _op("Y", "ik", [("A", "ij"), ("M", "jk")], n, np.float64)
    c = choose_kernel(op, sparse=(0,), finite=(True, True))
    slabs = RowSlabs((n, n), np.dtype(np.float64), tuple(
        (r0, A[r0:r0 + 12].tocsr()) for r0 in range(0, n, 12)))
    want = A.toarray() @ M
    for S in (A, slabs):
        for rows in (1, 3, 7, n - 1):
            out = np.full((n, 6), np.nan)
            sunk = []

            def sink(slab):
                assert slab.base is out or slab.base is out.base or np.shares_memory(slab, out)
                sunk.append(slab.copy())
            bands.force(rows)
            got = sparse_call(op, c, [S, M], [(n, n), (n, 6)], (n, 6), out=out, sink=sink,
                              check=lambda f=None: None)
            assert got is out
            np.testing.assert_array_equal(out, want)
            np.testing.assert_array_equal(np.concatenate(sunk), want)
    out = np.zeros((n, 6), np.float32)
    bands.force(7)
    got = sparse_call(op, c, [A, M], [(n, n), (n, 6)], (n, 6), out=out,
                      check=lambda f=None: None)
    assert got is not out and got.dtype == np.float64 and not out.any()
    np.testing.assert_array_equal(got, want)
    # a semiring's dense bands: copied into ``out``'s rows, each band's rows sunk after it
    mt = _op("X", "ik", [("A", "ij"), ("M", "jk")], n, np.float64, join="x0 * x1", agg="max")
    c = choose_kernel(mt, sparse=(0,), finite=(True, True))
    assert c.method == "semiring"
    bands.one()
    one = sparse_call(mt, c, [A, M], [(n, n), (n, 6)], (n, 6), check=lambda f=None: None)
    for rows in (1, 7, n - 1):
        out, sunk = np.full((n, 6), np.nan), []
        bands.force(rows)
        got = sparse_call(mt, c, [A, M], [(n, n), (n, 6)], (n, 6), out=out,
                          sink=lambda slab: sunk.append(slab.copy()), check=lambda f=None: None)
        want = (A.toarray()[:, :, None] * M[None]).max(1)
        assert got is out
        assert _bits(out) == _bits(one)  # (numpy's MAX of 0.0 and -0.0 keeps the first one)
        np.testing.assert_array_equal(out, want)
        assert _bits(np.concatenate(sunk)) == _bits(one)


def test_a_gathers_rows_banded_as_the_one_call(bands):
    """sddmm whose U is a gather's rows (``RowGather``, taken once) banded with the mask's
    rows: the one call's values and numpy's."""
    n = 40
    A = _graph(n, 0.1, 10, np.float64)
    rng = np.random.default_rng(4)
    base = rng.integers(-3, 4, (7, 4)).astype(np.float64)
    rows = rng.integers(0, 7, n)
    V = rng.integers(-3, 4, (n, 4)).astype(np.float64)
    op = _op("S", "ij", [("A", "ij"), ("U", "ir"), ("V", "jr")], n, np.float64)
    c = choose_kernel(op, sparse=(0,), finite=(True, True, True))
    assert c.method == "sddmm"
    args = [A, RowGather(base, rows), V]
    one, res = _calls(bands, op, c, args, [(n, n), (n, 4), (n, 4)], (n, n), FORCES)
    for got, _, made in res.values():
        assert made
        assert _bits(got) == _bits(one)
    _same(one, A.toarray() * (base[rows] @ V.T))


# -- between statements, cancel, executors, hypersparse ------------------------------------------

def test_a_replaced_input_is_read_afresh_by_the_banded_products(tmp_path, bands):
    """What the bands of one call share is made per call (the SpGEMM memo, a semiring's kept
    operand) or per stored version (the graph cache): after the other operand is replaced (the
    same matrix on both sides too; B, B2, then B again) each statement reads the new values."""
    A = _graph(N, 0.1, 11, np.float64)
    versions = [_graph(N, 0.1, 12, np.float64), _graph(N, 0.1, 13, np.float64)]
    versions.append(versions[0])
    with tensordb.connect(tmp_path / "r.tdb") as con:
        con.load("A", A)
        bands.force(3)
        for new in versions:
            con.load("B", new, replace=True)
            con.load("D", new, fill_value=INF, replace=True)
            con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
            _same(con.tensor("C"), A.toarray() @ new.toarray())
            con.execute("G[i,k] = SUM(B[i,j] * B[j,k])")
            _same(con.tensor("G"), new.toarray() @ new.toarray())
            Dd = np.where(new.toarray() != 0, new.toarray(), INF)
            con.execute("Q[i,k] = MIN(D[i,j] + D[j,k])")
            _same(con.tensor("Q"), (Dd[:, :, None] + Dd[None]).min(1))
        assert len(bands.count) >= 3 * 3 * (N // 3)


def test_the_spgemm_memo_is_the_calls_own(bands):
    """A SpGEMM's right operand that no stored box is (an intermediate: the memo, not the graph
    cache, keeps its GraphBLAS copy for the bands): a second call with another matrix sharing
    the first's index arrays (new values only) gives the second's product."""
    n = 60
    A, B = _graph(n, 0.08, 15, np.float64), _graph(n, 0.08, 16, np.float64)
    B2 = sp.csr_array((B.data * -3 + 1, B.indices, B.indptr), shape=B.shape)
    op = _op("C", "ik", [("A", "ij"), ("B", "jk")], n, np.float64)
    c = with_output(choose_kernel(op, sparse=(0, 1), finite=(True, True)), op, 300)
    assert c.describe() == "spmm x0 sparse (GraphBLAS plus_times)"
    bands.force(7)
    for b in (B, B2, B):
        got = sparse_call(op, c, [A, b], [(n, n)] * 2, (n, n), check=lambda f=None: None)
        _same(got, A.toarray() @ b.toarray())


@pytest.mark.parametrize("workers", [1, 2])
def test_a_cancel_between_bands_stores_nothing(tmp_path, bands, monkeypatch, workers):
    """A Ctrl-C landing in the third band: the statement stops at the next band (a few more
    bands at most, not the call's 40), stores nothing, leaves the files as they were, and the
    connection runs the statement again to numpy's answer."""
    A = _graph(N, 0.1, 14, np.float64)
    M = np.random.default_rng(1).integers(-3, 4, (N, 5)).astype(np.float64)
    rows = sparse_bands._rows
    fired = []

    def interrupting(a, ax, r0, r1):
        if r0 == 2 and not fired:
            fired.append(time.perf_counter())
            _thread.interrupt_main()
            time.sleep(0.2)  # the main thread takes the interrupt while this band runs
        return rows(a, ax, r0, r1)
    db = tmp_path / "c.tdb"
    with tensordb.connect(db, workers=workers) as con:
        con.load("A", A)
        con.load("M", M)
        files = sorted(os.listdir(db / "tiles"))
        for sql in ("Y[i,k] = SUM(A[i,j] * M[j,k])", "C[i,k] = SUM(A[i,j] * A[j,k])",
                    "S[i,j] = A[i,j] * A[i,j]"):
            name = sql.split("[")[0]
            bands.force(1)
            monkeypatch.setattr(sparse_bands, "_rows", interrupting)
            del fired[:]
            with pytest.raises(KeyboardInterrupt):
                con.execute(sql)
                time.sleep(5)  # (where the interrupt lands if the statement was not banded)
            monkeypatch.setattr(sparse_bands, "_rows", rows)
            assert fired, sql
            assert not con.store.has(name), sql
            assert sorted(os.listdir(db / "tiles")) == files, sql
            con.execute(sql)
            want = {"Y": A.toarray() @ M, "C": A.toarray() @ A.toarray(),
                    "S": A.toarray() * A.toarray()}[name]
            _same(con.tensor(name), want)
            files = sorted(os.listdir(db / "tiles"))
        assert all(r[-1] == "ok" for r in con.execute("CHECK DATABASE").fetchall())


def test_the_dask_executor_bands_to_the_same_answer(tmp_path, bands):
    """The Dask executor's workers (threads here) band with the module's settings: each
    statement's tensor bit for bit the local executor's one call."""
    ops, cases = _row_cases(np.float64)
    got = {}
    for executor in ("local", "dask"):
        with tensordb.connect(tmp_path / f"{executor}.tdb", workers=2, executor=executor) as con:
            for name, a in ops.items():
                con.load(name, a)
            for sql, _, expect in cases:
                name = sql.split("[")[0].split(" ")[0]
                if executor == "local":
                    bands.one()
                else:
                    bands.force(3)
                con.execute(sql)
                got.setdefault(sql, []).append(_bits(con.tensor(name)))
                _same(con.tensor(name), expect)
    for sql, (local, dask) in got.items():
        assert local == dask, sql


def test_a_hypersparse_box_is_never_banded(tmp_path, bands):
    """A 10^8-row matrix of six entries is read as COO boxes: with bands forced, no per-row
    array is built (it would be 800 MB) and no band made; the kernels' answers are numpy's on
    the entries."""
    import tracemalloc
    n = 10 ** 8
    rng = np.random.default_rng(1)
    r = np.sort(rng.choice(n, 6, replace=False))
    c = rng.integers(0, 8, 6)
    v = np.array([3.0, -2.0, 5.0, -1.0, 4.0, 7.0])
    H = sp.coo_array((v, (r, c)), shape=(n, 8))
    dense_rows = np.zeros((6, 8))
    dense_rows[np.arange(6), c] = v  # H's occupied rows, in order
    with tensordb.connect(tmp_path / "h.tdb") as con:
        con.load("H", H)
        assert {f for (f,) in con.execute(
            "SELECT format FROM tensordb.tiles WHERE tensor = 'H'").fetchall()} == {"coo"}
        bands.force(1)
        tracemalloc.start()
        try:
            con.execute("Q[j,k] = SUM(H[i,j] * H[i,k])")
            con.execute("R[j] = SUM(H[i,j])")
            con.execute("X[i] = MAX(H[i,j])")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert bands.count == []
        assert peak < 100e6, peak
        _same(con.tensor("Q"), dense_rows.T @ dense_rows)
        _same(con.tensor("R"), dense_rows.sum(0))
        x = con.sparse("X")
        np.testing.assert_array_equal(x.tocoo().coords[0] if hasattr(x, "tocoo") else x.coords[0],
                                      r[dense_rows.max(1) != 0])


def test_a_banded_calls_peak_is_the_one_calls_and_a_band(bands):
    """tracemalloc on an SpMM (dense output) and scipy's SpGEMM (CSR output) of 4,000 rows in
    bands of 500 and 50 rows: the peak is the one call's (the output, SpGEMM's sorted copy of
    it) and at most a few bands' rows more; the bands' CSR parts and their concatenation are
    never more than the one call's two copies. (GraphBLAS's product allocates outside
    tracemalloc's view: scipy's here.)"""
    import dataclasses
    import tracemalloc
    n = 4000
    A = sp.random_array((n, n), density=0.004, rng=np.random.default_rng(3), format="csr")
    M = np.random.default_rng(1).random((n, 64))
    op = _op("Y", "ik", [("A", "ij"), ("M", "jk")], n, np.float64)
    spmm = choose_kernel(op, sparse=(0,), finite=(True, True))
    op2 = _op("C", "ik", [("A", "ij"), ("B", "jk")], n, np.float64)
    spgemm = dataclasses.replace(with_output(choose_kernel(op2, sparse=(0, 1), finite=(
        True, True)), op2, 1e6), semiring=None)
    assert spgemm.out_format == "csr" and spgemm.describe() == "spmm x0 sparse"
    for o, c, args, shape, band_bytes in ((op, spmm, [A, M], (n, 64), 64 * 8),
                                          (op2, spgemm, [A, A], (n, n), 16 * 16 * 12)):
        peaks = {}
        for rows in (None, 500, 50):
            bands.one() if rows is None else bands.force(rows)
            for _ in range(2):  # the second: nothing imported or cached on the way
                tracemalloc.start()
                try:
                    res = sparse_call(o, c, args, [a.shape for a in args], shape,
                                      check=lambda f=None: None)
                    peaks[rows] = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
            np.testing.assert_allclose(densify(res), A.toarray() @ (M if o is op else
                                                                    A.toarray()), rtol=1e-12)
        for rows in (500, 50):
            assert peaks[rows] <= 1.05 * peaks[None] + 4 * rows * band_bytes + (1 << 18), \
                (o.output, peaks)


def test_the_gpu_stand_in_makes_one_device_call_with_numpys_answer(tmp_path, bands):
    """On the GPU executor (tests/fakecupy standing in for CuPy) a sparse kernel is a device
    call, never banded (``sparse_bands`` is the CPU's): with bands forced no band is made, the
    answers are numpy's and the CPU's banded ones; without CuPy, ``executor='gpu'`` is a
    NotSupportedError naming the statement, and the connection stays usable."""
    from tests.exec.test_gpu_sparse import _gpu
    from tests.fakecupy.cupy import DeviceXp
    ops, cases = _row_cases(np.float64)
    cases = [c for c in cases if c[1] in ("spmm", "spjoin", "sddmm")]
    with tensordb.connect(tmp_path / "g.tdb") as con:
        for name, a in ops.items():
            con.load(name, a)
        cpu = {}
        bands.force(3)
        for sql, _, _ in cases:
            con.execute(sql)
            cpu[sql] = con.tensor(sql.split("[")[0])
        _gpu(con, DeviceXp())
        del bands.count[:]
        for sql, _, expect in cases:
            con.execute(sql)
            got = con.tensor(sql.split("[")[0])
            _same(got, expect)
            _same(got, cpu[sql])
        assert bands.count == []
    try:
        import cupy  # noqa: F401
    except ImportError:
        with tensordb.connect(tmp_path / "n.tdb", executor="gpu") as con:
            con.load("A", ops["A"])
            with pytest.raises(tensordb.NotSupportedError, match="CuPy") as err:
                con.execute("C[i,k] = SUM(A[i,j] * A[j,k])")
            assert "C[i,k]" in str(err.value)
            assert not con.store.has("C")
            con.execute("SET executor = 'local'")
            con.execute("C[i,k] = SUM(A[i,j] * A[j,k])")
            _same(con.tensor("C"), ops["A"].toarray() @ ops["A"].toarray())


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_rises_band_by_band_and_ends_at_the_total(tmp_path, bands, workers):
    """The connection's progress callback during a SpGEMM banded a row at a time: one report a
    band at least, never falling, the last ``done == total``."""
    A = sp.random_array((200, 200), density=0.03, rng=np.random.default_rng(1), format="csr")
    with tensordb.connect(tmp_path / "p.tdb", workers=workers) as con:
        con.load("A", A)
        seen = []
        bands.force(1)
        con.progress_callback = lambda done, total: seen.append((done, total))
        try:
            con.execute("C[i,k] = SUM(A[i,j] * A[j,k])")
        finally:
            con.progress_callback = None
        np.testing.assert_allclose(densify(con.tensor("C")), A.toarray() @ A.toarray(),
                                   rtol=1e-12)
    fractions = [d / t for d, t in seen]
    assert len(seen) >= 200
    assert fractions == sorted(fractions)
    assert seen[-1][0] == seen[-1][1]


def test_int32_sums_that_wrap_band_as_numpy_wraps(tmp_path, bands):
    """int32 products past 2^31 (a triangle count summed over the bands, a SpGEMM): the bands'
    sums wrap as the one call's and numpy's do (modular, so in any order)."""
    a = sp.random_array((N, N), density=0.15, rng=np.random.default_rng(2), format="csr")
    a.data = np.round(a.data * 3000) + 1000
    a = a.astype(np.int32)
    d = a.toarray()
    with np.errstate(all="ignore"):
        tri = np.einsum("ij,jk,ki->", d, d, d, dtype=np.int32)
    assert not -(1 << 31) <= int(np.einsum("ij,jk,ki->", d, d, d, dtype=np.int64)) < 1 << 31
    with tensordb.connect(tmp_path / "w.tdb") as con:
        con.load("A", a)
        for sql, want in (("t = SUM(A[i,j] * A[j,k] * A[k,i])", tri),
                          ("C[i,k] = SUM(A[i,j] * A[j,k])", d @ d)):
            one, made = _each_force(con, bands, sql, forces=(1, 7))
            assert made[1]
            assert np.asarray(one).dtype == np.int32
            _same(one, want)
