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
