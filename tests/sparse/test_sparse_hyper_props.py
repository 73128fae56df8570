"""Seeded random properties of the entry-wise sparse kernels (exec/sparse_nd.py) and of
hypersparse matrices (COO tiles, storage/sparse_coo.py), through SQL, against NumPy's answer on
the densified inputs (numpy.einsum, max, min; scipy.sparse for the exports):

- rank-3 and rank-4 sparse tensors, every dtype, NaN and +-inf among the entries, extents of 0:
  SUM, MAX and MIN into every kind of output (a scalar, a dense vector, a matrix the plan makes
  CSR: ``reduce_nd``/``reduce_nd_csr``), and SUM contractions with a dense operand
  (``contract_nd``; the operand finite, as the kernel requires);
- a hypersparse matrix (every tile COO) through SpMM and SpMV, SpGEMM, spreduce, spjoin,
  min-plus with fill +inf, SDDMM, masked SpGEMM, GRAD, the Dask executor, the exports (scipy,
  pydata, Parquet), ``SELECT *``, CHECK DATABASE and a read-only connection beside the writer.
A few seconds in all."""
from __future__ import annotations

import itertools

import duckdb
import numpy as np
import pytest
import scipy.sparse as sp

import tensordb

DTYPES = ["bool", "int32", "int64", "float32", "float64"]


def _random_sparse(rng, shape, dtype, special):
    size = int(np.prod(shape))
    a = np.zeros(shape, dtype)
    nse = int(rng.integers(0, max(1, size // 8) + 1)) if size else 0
    lin = rng.choice(size, nse, replace=False) if nse else np.zeros(0, np.int64)
    if np.dtype(dtype).kind == "b":
        a.reshape(-1)[lin] = True
    else:
        v = rng.integers(1, 40, lin.size) * rng.choice([-1, 1], lin.size)
        a.reshape(-1)[lin] = v.astype(dtype)
        if special and np.dtype(dtype).kind == "f" and lin.size:
            k = min(lin.size, 3)
            a.reshape(-1)[lin[:k]] = rng.choice([np.nan, np.inf, -np.inf], k)
    return a


def _want(agg, a, labels, out):
    with np.errstate(all="ignore"):
        kept = [l for l in labels if l in out]
        if agg == "SUM":
            res = np.asarray(np.einsum(f"{labels}->{''.join(kept)}", a))
        else:
            axes = tuple(d for d, l in enumerate(labels) if l not in out)
            res = np.asarray((np.max if agg == "MAX" else np.min)(a, axis=axes))
        return res.transpose([kept.index(l) for l in out]) if kept else res


def _same(got, want, what, rtol=1e-5):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.dtype, want.dtype)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-4, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _saw(seen, text):
    for k in seen:
        seen[k] += k in text


def test_rank_3_and_4_reductions_and_contractions_equal_numpy(tmp_path):
    rng = np.random.default_rng(40)
    seen = {"spreduce x0 sparse": 0, "csr tiles from the kernel": 0, "spmm x": 0}
    with tensordb.connect(str(tmp_path / "db")) as con:
        for case in range(14):
            dtype = DTYPES[case % len(DTYPES)]
            ndim = 3 + case % 2
            shape = tuple(int(n) for n in rng.integers(2, 7, ndim))
            if case % 7 == 6:  # an empty tensor: an extent of 0
                shape = shape[:1] + (0,) + shape[2:]
            a = _random_sparse(rng, shape, dtype, special=True)
            labels = "abcd"[:ndim]
            tile = tuple(int(rng.integers(1, n + 1)) if n else 1 for n in shape)
            con.load("T", a, tile=tile, replace=True)
            outs = ["", labels[int(rng.integers(ndim))]] + \
                ["".join(p) for p in rng.permutation(list(itertools.permutations(labels, 2)))[:3]] + \
                ["".join(rng.permutation(list(labels))[:ndim - 1])]
            for agg in ["SUM", "MAX", "MIN"]:
                for out in outs:
                    if agg != "SUM" and any(shape[labels.index(l)] == 0
                                            for l in labels if l not in out):
                        continue  # NumPy has no MAX of nothing
                    q = f"R{'[' + ','.join(out) + ']' if out else ''} = {agg}(T[{','.join(labels)}])"
                    _saw(seen, con.explain(q))
                    con.execute(q)
                    _same(np.asarray(con.tensor("R")), _want(agg, a, labels, out), (q, shape, dtype))
            if dtype == "bool":
                continue  # the dense operand of a contraction: numbers
            # contractions with a finite dense operand: one or two shared labels, one free one
            shared = list(rng.permutation(list(labels))[:1 + case % 2])
            d_labels = "".join(shared) + "k"
            d = rng.integers(-3, 4, [shape[labels.index(l)] for l in shared] + [3]).astype(dtype)
            con.load("D", d, replace=True)
            rest = [l for l in labels if l not in shared]
            for out in ["k", "".join(rest[:1]) + "k", "k" + "".join(rest[::-1])]:
                q = f"R[{','.join(out)}] = SUM(T[{','.join(labels)}] * D[{','.join(d_labels)}])"
                _saw(seen, con.explain(q))
                con.execute(q)
                with np.errstate(all="ignore"):
                    want = np.einsum(f"{labels},{d_labels}->{out}", a, d)
                _same(np.asarray(con.tensor("R")), want, (q, shape, dtype))
    assert all(n >= 5 for n in seen.values()), seen  # the entry-wise kernels ran


# -- hypersparse matrices: every tile COO --------------------------------------------------------
def _hyper(rng, shape, nse, dtype):
    a = np.zeros(shape, dtype)
    lin = rng.choice(shape[0] * shape[1], nse, replace=False)
    if np.dtype(dtype).kind == "b":
        a.reshape(-1)[lin] = True
    else:
        a.reshape(-1)[lin] = (rng.integers(1, 9, nse) * rng.choice([-1, 1], nse)).astype(dtype)
    return a


def _spgemm(a, b):
    """scipy's product of the matrices (counted in int64 for bool, then OR: einsum's answer)."""
    a = sp.csr_array(a.astype(np.int64) if a.dtype == bool else a)
    return a if b is None else a @ sp.csr_array(b.astype(np.int64) if b.dtype == bool else b)


def _formats(con, *names):
    return {r[0] for r in con.execute("SELECT format FROM tensordb.tiles WHERE tensor IN "
                                      f"({', '.join('?' for _ in names)})", list(names)).fetchall()}


@pytest.mark.parametrize("dtype", DTYPES)
def test_hypersparse_matrices_through_every_sparse_kernel_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(400 + DTYPES.index(dtype))
    n = int(rng.integers(600, 900))
    A, B = _hyper(rng, (n, n), 14, dtype), _hyper(rng, (n, n), 17, dtype)
    A[5, :] = 0
    A[5, 7], B[7, 9] = 1, 1  # a path i -> j -> k: SpGEMM, masked SpGEMM and min-plus meet
    A[9, 5] = 1  # and a triangle 5 -> 7 -> 9 -> 5 (A, B, A)
    num = "float64" if dtype == "bool" else dtype
    X = rng.integers(-3, 4, (n, 3)).astype(num)
    v = rng.integers(-3, 4, n).astype(num)
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("A", sp.csr_array(A))
        con.load("B", sp.csr_array(B), tile=(int(rng.integers(200, 900)), n))  # several tiles
        assert _formats(con, "A", "B") == {"coo"}
        for name, arr in [("X", X), ("vec", v)]:
            con.load(name, arr)
        with np.errstate(all="ignore"):
            cases = [
                ("R[i,k] = SUM(A[i,j] * X[j,k])", np.einsum("ij,jk->ik", A, X)),      # SpMM
                ("R[j,k] = SUM(B[i,j] * X[i,k])", np.einsum("ij,ik->jk", B, X)),
                ("R[i] = SUM(B[i,j] * vec[j])", np.einsum("ij,j->i", B, v)),            # SpMV
                ("R[i,k] = SUM(A[i,j] * B[j,k])", _spgemm(A, B).toarray().astype(dtype)),  # SpGEMM
                ("R[i] = SUM(B[i,j])", np.einsum("ij->i", B)),                        # spreduce
                ("R[j] = MAX(B[i,j])", B.max(0)),
                ("R[i] = MIN(A[i,j])", A.min(1)),
                ("R = SUM(A[i,j])", np.einsum("ij->", A)),
                ("R[i,j] = A[i,j] * B[i,j]", A * B),                                  # spjoin
                ("R[i,j] = A[i,j] + B[j,i]", (A + B.T) if dtype != "bool" else A | B.T),
                ("R = SUM(A[i,j] * B[j,k] * A[k,i])",                                    # masked
                 np.asarray(_spgemm(A, B).multiply(_spgemm(A.T, None)).sum()).astype(dtype)),
            ]
        for q, want in cases:
            con.execute(q)
            _same(np.asarray(con.tensor("R")), np.asarray(want), (q, dtype))
        if dtype != "bool":
            U = rng.integers(-2, 3, (n, 4)).astype(dtype)
            V = rng.integers(-2, 3, (n, 4)).astype(dtype)
            con.load("U", U)
            con.load("V", V)
            q = "R[i,j] = SUM(A[i,j] * U[i,r] * V[j,r])"                            # SDDMM
            assert "sddmm x" in con.explain(q), con.explain(q)
            con.execute(q)
            _same(np.asarray(con.tensor("R")), A * (U @ V.T), (q, dtype))
        got = con.sparse("A")                                                          # exports
        np.testing.assert_array_equal(sp.coo_array(got).toarray(), A)
        con.export("B", str(tmp_path / "b.parquet"))
        rows = duckdb.sql(f"SELECT * FROM '{tmp_path / 'b.parquet'}'").fetchall()
        nz = np.nonzero(B)
        assert sorted((int(i), int(j), v) for i, j, v in rows) == \
            sorted(zip(nz[0].tolist(), nz[1].tolist(), B[nz].tolist()))
        assert sorted(con.execute("SELECT * FROM A").fetchall()) == \
            sorted(zip(*(x.tolist() for x in np.nonzero(A)), A[np.nonzero(A)].tolist()))
        assert con.check()[-1]["problem"] == "ok"
        if dtype.startswith("float"):                                                  # GRAD
            W = rng.standard_normal((n, 3)).astype(dtype)
            con.load("W", W)
            con.execute("L = SUM(A[i,j] * X[j,k] * W[i,k]); dX = GRAD(L, X)")
            _same(np.asarray(con.tensor("dX")), A.T @ W, ("GRAD", dtype), rtol=1e-4)
    with tensordb.connect(str(tmp_path / "db"), executor="dask", workers=2) as con:     # Dask
        for q, want in cases[:6]:
            con.execute(q)
            _same(np.asarray(con.tensor("R")), np.asarray(want), ("dask", q, dtype))


def test_min_plus_of_a_hypersparse_matrix_of_fill_inf_equals_numpy(tmp_path):
    rng = np.random.default_rng(41)
    n = 3000
    e = [(int(a), int(b), float(w)) for a, b, w in
         zip(rng.integers(0, n, 12), rng.integers(0, n, 12), rng.integers(1, 9, 12))]
    e += [(10, 20, 1.0), (20, 30, 2.0), (20, 40, 0.0)]  # paths, and a 0-weight edge
    d = {}
    for a, b, w in e:
        d[(a, b)] = min(d.get((a, b), np.inf), w)
    K = np.full((n, n), np.inf)
    for (a, b), w in d.items():
        K[a, b] = w
    want = np.full((n, n), np.inf)  # min over j of K[i,j] + K[j,k]: only entries meet
    for (a, b), w in d.items():
        for (c, f), w2 in d.items():
            if b == c:
                want[a, f] = min(want[a, f], w + w2)
    rows = ", ".join(f"({a}, {b}, {w})" for (a, b), w in d.items())
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.execute(f"CREATE TENSOR K FROM (SELECT * FROM (VALUES {rows}) t(a, b, w)) INDEX (a, b) "
                    f"VALUE w SHAPE ({n}, {n}) FILL +inf")
        assert _formats(con, "K") == {"coo"}
        q = "T[i,k] = MIN(K[i,j] + K[j,k])"
        assert "min_plus" in con.explain(q)
        con.execute(q)
        np.testing.assert_array_equal(con.tensor("T"), want)
        np.testing.assert_array_equal(con.tensor("K"), K)
        s = con.sparse("K")  # pydata: it carries the fill
        assert s.fill_value == np.inf
        np.testing.assert_array_equal(s.todense(), K)
        with tensordb.connect(str(tmp_path / "db")) as ro:  # a second connection: its own snapshot
            np.testing.assert_array_equal(ro.tensor("T"), want)
            np.testing.assert_array_equal(ro.tensor("K"), K)
        assert con.check()[-1]["problem"] == "ok"
