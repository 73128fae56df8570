"""Sparse and mixed sparse/dense extended einsums against the independent numpy oracle.

1. The random corpus of tests/corpus/test_fuzz.py (every join, AGG, dtype, NaN and inf, pieces, routes)
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

from tests import fuzz_gen
from tests.corpus.test_fuzz import run_batch

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


# -- semirings, masked SpGEMM, SDDMM and fill values ------------------------------------------
# Each case: stored matrices with sparse tiles (some with a fill of +inf or -inf), an operation
# whose kernel a rule of plan/sparse_rules.py picks (or that keeps or refuses a fill), checked
# by fuzz_oracle on the densified arrays; where the rule should pick its kernel, EXPLAIN must say
# so. Values are small integers (exact sums), with a NaN or an infinity now and then, which the
# kernels must compute as numpy does (falling back to numpy on such a tile).
KINDS = ("min_plus", "max_plus", "max_times", "min_times", "masked", "sddmm", "spjoin",
         "elementwise", "reduce")
_FILL = {"min_plus": np.inf, "max_plus": -np.inf}


def _entries(rng, shape, dtype, density, fill):
    """A dense array with ``fill`` where no entry is stored, and its stored entries as COO."""
    keep = rng.random(shape) < density
    vals = rng.integers(-4, 5, shape).astype(dtype)
    if dtype.kind == "f" and rng.random() < 0.25 and keep.any():
        at = tuple(a[0] for a in np.nonzero(keep))
        vals[at] = rng.choice([np.nan, np.inf, -np.inf])
    dense = np.where(keep, vals, np.asarray(fill).astype(dtype) if fill else 0).astype(dtype)
    coo = sp.coo_array((vals[keep], np.nonzero(keep)), shape=shape)
    return dense, coo


def _case(rng, kind):
    """(operands: name -> (labels, dense, COO or None, fill), join, agg, output labels, method
    the rule should pick or None)."""
    fdt = np.dtype(str(rng.choice(["float32", "float64"])))
    anydt = np.dtype(str(rng.choice(["float32", "float64", "int32", "int64"])))
    n = {l: int(rng.integers(6, 30)) for l in "ijkr"}
    dens = float(rng.choice([0.05, 0.1, 0.3]))
    if kind in ("min_plus", "max_plus"):
        fill = _FILL[kind]
        a, ac = _entries(rng, (n["i"], n["j"]), fdt, dens, fill)
        if rng.random() < 0.5:   # sparse x sparse, both with the fill
            b, bc = _entries(rng, (n["j"], n["k"]), fdt, dens, fill)
            ops = {"A": ("ij", a, ac, fill), "B": ("jk", b, bc, fill)}
        else:                    # sparse x dense (a vector or a matrix)
            lab = str(rng.choice(["j", "jk", "kj"]))
            b = rng.integers(-4, 5, tuple(n[l] for l in lab)).astype(fdt)
            ops = {"A": ("ij", a, ac, fill), "B": (lab, b, None, 0.0)}
        out = "i" + "".join(l for l in ops["B"][0] if l != "j")
        return ops, ("+", ("in", 0), ("in", 1)), kind.split("_")[0], out, "semiring"
    if kind in ("max_times", "min_times"):
        a, ac = _entries(rng, (n["i"], n["j"]), anydt, dens, 0)
        b, bc = _entries(rng, (n["j"], n["k"]), anydt, dens, 0)
        ops = {"A": ("ij", a, ac, 0.0), "B": ("jk", b, bc if rng.random() < 0.6 else None, 0.0)}
        return ops, ("*", ("in", 0), ("in", 1)), kind.split("_")[0], "ik", "semiring"
    if kind == "masked":
        m, mc = _entries(rng, (n["k"], n["i"]), anydt, min(dens, 0.1), 0)
        a = rng.integers(-3, 4, (n["i"], n["j"])).astype(anydt)
        b = rng.integers(-3, 4, (n["j"], n["k"])).astype(anydt)
        ops = {"A": ("ij", a, None, 0.0), "B": ("jk", b, None, 0.0), "M": ("ki", m, mc, 0.0)}
        join = ("*", ("*", ("in", 0), ("in", 1)), ("in", 2))
        return ops, join, "sum", "", "masked"
    if kind == "sddmm":
        m, mc = _entries(rng, (n["i"], n["j"]), anydt, min(dens, 0.1), 0)
        u = rng.integers(-3, 4, (n["i"], n["r"])).astype(anydt)
        v = rng.integers(-3, 4, (n["j"], n["r"])).astype(anydt)
        ops = {"M": ("ij", m, mc, 0.0), "U": ("ir", u, None, 0.0), "V": ("jr", v, None, 0.0)}
        join = ("*", ("in", 0), ("*", ("in", 1), ("in", 2)))
        return ops, join, "sum", str(rng.choice(["ij", "ji"])), "sddmm"
    if kind == "spjoin":
        a, ac = _entries(rng, (n["i"], n["j"]), anydt, min(dens, 0.1), 0)
        lab = str(rng.choice(["ij", "ji"]))
        b, bc = _entries(rng, tuple(n[l] for l in lab), anydt, min(dens, 0.1), 0)
        ops = {"A": ("ij", a, ac, 0.0), "B": (lab, b, bc, 0.0)}
        fn = str(rng.choice(["*", "+", "-"]))
        return ops, (fn, ("in", 0), ("in", 1)), "sum", str(rng.choice(["ij", "ji"])), "spjoin"
    fill = float(rng.choice([np.inf, -np.inf, 2.0]))
    a, ac = _entries(rng, (n["i"], n["j"]), fdt, dens, fill)
    ops = {"A": ("ij", a, ac, fill)}
    if kind == "reduce":
        return ops, ("in", 0), str(rng.choice(["min", "max", "sum"])), \
            str(rng.choice(["i", "j", ""])), None
    join = [("+", ("*", ("in", 0), ("lit", 2)), ("lit", 1)), ("neg", ("in", 0)),
            ("exp", ("neg", ("in", 0))), ("*", ("in", 0), ("lit", 0))][int(rng.integers(4))]
    return ops, join, "sum", "ij", None


@pytest.mark.parametrize("seed", range(4))
def test_semirings_masks_and_fills_against_the_oracle(seed, tmp_path):
    from tests import fuzz_oracle as fo
    rng = np.random.default_rng(500 + seed)
    picked = set()
    with tensordb.connect(tmp_path / "db", workers=int(rng.integers(1, 3))) as con:
        for case in range(3 * len(KINDS)):
            kind = KINDS[case % len(KINDS)]
            ops, join, agg, out, method = _case(rng, kind)
            names = {}
            for name, (labels, dense, coo, fill) in ops.items():
                names[name] = f"{name}{case}"
                tile = tuple(int(rng.integers(1, s + 1)) for s in dense.shape) \
                    if rng.random() < 0.4 else None
                extra = {"tile": tile} if tile else {}
                if coo is not None:
                    con.load(names[name], coo, fill_value=fill, **extra)
                else:
                    con.load(names[name], dense, **extra)
            refs = [f"{names[k]}[{','.join(v[0])}]" for k, v in ops.items()]
            body = fo.render_sql(join, refs)
            if agg != "sum" or any(l not in out for v in ops.values() for l in v[0]):
                body = f"{agg.upper()}({body})"
            pieces = " WITH (PIECES i 2)" if "i" in out and rng.random() < 0.3 else ""
            sql = f"O{case}[{','.join(out)}] = {body}{pieces}"
            oracle = fo.answer(fo.Case(tuple(out), [fo.Operand(names[k], tuple(v[0]), v[1])
                                                    for k, v in ops.items()], join, agg))
            # the join at the inputs' fills: NaN (with some fill not 0) is refused
            with np.errstate(all="ignore"):
                at_fills = fo.answer(fo.Case((), [fo.Operand(k, (), np.asarray(v[3], v[1].dtype))
                                                  for k, v in ops.items()], join, agg))
            if any(v[3] for v in ops.values()) and at_fills.error is None and \
                    np.isnan(np.asarray(at_fills.value, np.float64)).any():
                with pytest.raises(tensordb.ProgrammingError, match="cannot keep a fill"):
                    con.execute(sql)
                assert not con.store.has(f"O{case}")
                continue
            if oracle.error is not None:
                with pytest.raises(tensordb.Error):
                    con.execute(sql)
                continue
            sparse_ops = [names[k] for k, v in ops.items() if v[2] is not None]
            # masked and sampled products need every operand finite (the grouping of an inf
            # with a 0 would differ); the others check their tiles' values as they run
            finite = all(np.isfinite(v[1]).all() for v in ops.values() if v[1].dtype.kind == "f")
            if method is not None and sparse_ops and all(
                    con.store.open(t).has_sparse for t in sparse_ops) and \
                    (finite or method not in ("masked", "sddmm")):
                kernels = _kernels(con, sql)
                assert kernels == [method], f"{sql}: {kernels}"
                picked.add(method)
            con.execute(sql)
            problem = fo.compare(con.tensor(f"O{case}"), oracle)
            assert problem is None, f"{sql}: {problem}"
    assert picked == {"semiring", "masked", "sddmm", "spjoin"}, picked  # every rule exercised
