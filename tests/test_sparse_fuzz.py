"""Sparse and mixed sparse/dense extended einsums against the independent numpy oracle.

1. The random corpus of tests/test_fuzz.py (every join, AGG, dtype, NaN and inf, pieces, routes)
   over stored tensors that are mostly zeros, so their tiles are stored sparse (and, where a tile
   is dense enough, dense: mixed), checked by tests/fuzz_oracle.py on the dense arrays.
2. A corpus of products a sparse kernel computes (SpMM, SpMV, SpGEMM): a stored sparse matrix in
   either orientation times a dense or sparse operand of 1-3 dimensions, output labels in any
   order, every stored dtype, random pieces; checked against ``np.einsum`` on the dense arrays,
   and the kernel choice checked: ``spmm`` exactly when the partner is known finite.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec import sparse_kernels

from . import fuzz_gen
from .test_fuzz import run_batch

SEEDS = 10
CASES = 40


def _sparse_values(original):
    def values(rng, shape, dtype):
        arr = original(rng, shape, dtype)
        if arr.size and rng.random() < 0.85:  # most tensors mostly zeros: sparse tiles
            keep = rng.random(shape) < rng.choice([0.01, 0.05, 0.2])
            arr = np.where(keep, arr, np.zeros((), arr.dtype)).astype(arr.dtype)
        return arr
    return values


@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed{s}")
def test_sparse_fuzz_einsums(seed, tmp_path, monkeypatch):
    monkeypatch.setattr(fuzz_gen, "_values", _sparse_values(fuzz_gen._values))
    failures = run_batch(1000 + seed, cases=CASES, directory=tmp_path)
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:5])


def test_the_sparse_corpus_stores_sparse_tiles(tmp_path, monkeypatch):
    """The corpus above is not vacuous: its stored tensors have sparse tiles (and dense ones)."""
    from tensordb.storage.writer import TensorWriter
    monkeypatch.setattr(fuzz_gen, "_values", _sparse_values(fuzz_gen._values))
    formats = []
    append = TensorWriter._append
    monkeypatch.setattr(TensorWriter, "_append",
                        lambda self, *a: formats.append(a[-1]) or append(self, *a))
    for seed in range(3):
        assert not run_batch(1000 + seed, cases=CASES, directory=tmp_path)
    assert formats.count("csr") + formats.count("coo") >= 10 and "dense" in formats


# -- the sparse kernel ------------------------------------------------------------------------
DTYPES = ("float32", "float64", "int32", "int64", "bool")


def _sparse_matrix(rng, shape, dtype, density):
    m = sp.random(*shape, density=density, random_state=int(rng.integers(1 << 30)), format="coo")
    m.data = (np.round(m.data * 8) + 1).astype(dtype) if dtype != "bool" else \
        np.ones(m.nnz, bool)
    return m.toarray()


def _dense(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return (rng.standard_normal(shape) * 3).round().astype(dtype)


def _kernels(con, sql):
    plan = json.loads(con.explain(sql, format="json"))
    return [n["kernel"]["method"] if isinstance(n.get("kernel"), dict) else n.get("kernel")
            for n in plan["nodes"]]


@pytest.mark.parametrize("seed", range(6))
def test_sparse_products_against_numpy(seed, monkeypatch):
    calls = []
    real = sparse_kernels.spmm
    monkeypatch.setattr(sparse_kernels, "spmm", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(seed)
    with tensordb.connect(workers=int(rng.integers(1, 3))) as con:
        for case in range(12):
            ni, nj = int(rng.integers(1, 90)), int(rng.integers(1, 90))
            dt_s, dt_d = (str(rng.choice(DTYPES)) for _ in range(2))
            S = _sparse_matrix(rng, (ni, nj), dt_s, float(rng.choice([0.01, 0.03, 0.1])))
            s_labels = "ij" if rng.random() < 0.5 else "ji"
            if s_labels == "ji":
                S = np.ascontiguousarray(S.T)
            rest = "".join(rng.permutation(list("kl"))[:int(rng.integers(0, 3))])
            d_labels = "".join(rng.permutation(list("j" + rest)))
            sizes = {"i": ni, "j": nj, "k": int(rng.integers(1, 6)), "l": int(rng.integers(1, 4))}
            partner = str(rng.choice(["dense", "sparse", "nan"])) if len(d_labels) == 2 else \
                str(rng.choice(["dense", "nan"]))
            if partner == "sparse":
                D = _sparse_matrix(rng, tuple(sizes[l] for l in d_labels), dt_d, 0.1)
            else:
                D = _dense(rng, tuple(sizes[l] for l in d_labels), dt_d)
                if partner == "nan":
                    D = D.astype("float64")
                    D.reshape(-1)[int(rng.integers(D.size))] = rng.choice([np.nan, np.inf])
            out = "".join(rng.permutation(list("i" + rest)))
            tile = (int(rng.integers(1, S.shape[0] + 1)), S.shape[1]) if rng.random() < 0.3 \
                else None
            con.load(f"S{case}", S, replace=True, **({"tile": tile} if tile else {}))
            con.load(f"D{case}", sp.coo_array(D) if partner == "sparse" else D, replace=True)
            pieces = ""
            if rng.random() < 0.4:
                pieces = " WITH (PIECES i 2, j 2)"
            sql = (f"O{case}[{','.join(out)}] = SUM(S{case}[{','.join(s_labels)}] * "
                   f"D{case}[{','.join(d_labels)}]){pieces}")
            if con.execute("SELECT count(*) FROM tensordb.tiles WHERE tensor = ? AND "
                           "format = 'csr'", [f"S{case}"]).fetchall()[0][0]:
                want_kernel = "spmm" if partner != "nan" and np.result_type(S, D) != bool \
                    else None
                got_kernel = _kernels(con, sql)[0]
                if want_kernel:
                    assert got_kernel == "spmm", sql
                else:
                    assert got_kernel != "spmm", sql
            con.execute(sql)
            with np.errstate(all="ignore"):
                want = np.einsum(f"{s_labels},{d_labels}->{out}", S, D)
            got = con.tensor(f"O{case}")
            assert got.dtype == want.dtype, sql
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=sql)
            else:
                np.testing.assert_array_equal(got, want, err_msg=sql)
    assert calls, "no product went to the sparse kernel"


def test_spmm_of_a_graph_uses_the_sparse_kernel_and_the_relation_of_nonzeros():
    rng = np.random.default_rng(7)
    n = 5000
    m = sp.random(n, n, density=0.0005, random_state=1, format="csr", dtype=np.float32)
    X = rng.standard_normal((n, 16)).astype(np.float32)
    with tensordb.connect() as con:
        con.load("G", m)
        con.load("X", X)
        assert con.describe("G")["tile_count"] == 1
        sql = "Y[i,k] = SUM(G[i,j] * X[j,k])"
        assert _kernels(con, sql) == ["spmm"]
        assert "spmm x0 sparse" in con.explain(sql)
        con.execute(sql)
        np.testing.assert_allclose(con.tensor("Y"), m @ X, rtol=1e-4, atol=1e-4)
        con.execute("y[i] = SUM(G[i,j] * X[j,k])")  # k summed inside X: not a sparse kernel
        np.testing.assert_allclose(con.tensor("y"), m @ X.sum(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_reductions_against_numpy(dtype):
    """SUM, MAX, MIN of a sparse matrix over a label or both (the spreduce kernel), with NaN and
    inf among the stored entries, int32 sums that wrap, bool sums: numpy's answers."""
    rng = np.random.default_rng(11)
    with tensordb.connect(workers=2) as con:
        for case in range(6):
            shape = (int(rng.integers(1, 80)), int(rng.integers(1, 80)))
            a = _sparse_matrix(rng, shape, dtype, float(rng.choice([0.0, 0.02, 0.1])))
            if dtype == "int32" and a.any():
                a[np.nonzero(a)[0][0], np.nonzero(a)[1][0]] = 2**31 - 1  # sums wrap
            if dtype.startswith("float") and a.any() and case % 2:
                nz = np.nonzero(a)
                a[nz[0][0], nz[1][0]] = rng.choice([np.nan, np.inf, -np.inf])
            tile = (int(rng.integers(1, shape[0] + 1)), shape[1])
            con.load("S", a, tile=tile, replace=True)
            for agg in ("SUM", "MAX", "MIN"):
                for out, axes in (("i", 1), ("j", 0), ("", None)):
                    target = f"R[{out}]" if out else "R"
                    sql = f"{target} = {agg}(S[i,j])"
                    if "csr" in {r[0] for r in con.execute(
                            "SELECT format FROM tensordb.tiles WHERE tensor = 'S'").fetchall()}:
                        assert _kernels(con, sql)[0] == "spreduce", sql
                    con.execute(sql)
                    got = con.tensor("R")
                    with np.errstate(all="ignore"):
                        want = np.einsum("ij->" + out, a) if agg == "SUM" else \
                            getattr(np, agg.lower())(a, axis=axes)
                    assert got.dtype == want.dtype, sql
                    np.testing.assert_array_equal(got, want, err_msg=sql) if dtype[0] != "f" \
                        else np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=sql)
