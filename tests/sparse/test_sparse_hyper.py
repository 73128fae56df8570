"""Hypersparse and high-rank sparse tensors (issue 26 items 1-3; AUDIT26 R3-R5): extents whose
dense size passes int64 load, read back, export and compute; a matrix with far more rows than
entries is stored COO, in proportion to its entries; reductions of sparse tensors of rank 3 and
more run on their entries (exec/sparse_nd.py). The big ones run in a child process under an
RLIMIT_AS, so a regression fails the test instead of exhausting the machine's memory."""
from __future__ import annotations

import itertools
import json

import duckdb
import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec.sparse_nd import group_ids, reduce_nd
from tensordb.sparsity import choose_format, fit_elements, sparse_nbytes
from tensordb.storage.sparse import CooTile
from tests.harness import run_script

DTYPES = ["float64", "float32", "int64", "int32", "bool"]


def _entries(con, name, ndim):
    cols = ", ".join(f"#{d + 1}" for d in range(ndim))
    rows = con.execute(f"SELECT * FROM {name}").fetchall()
    return {tuple(int(x) for x in r[:ndim]): r[ndim] for r in rows}, cols


# -- the format rule and the tile bound ------------------------------------------------------
def test_the_format_never_takes_more_than_csr_and_tiles_fit_int64():
    rng = np.random.default_rng(0)
    for _ in range(300):
        shape = (int(rng.integers(1, 10**9)), int(rng.integers(1, 10**6)))
        nse = int(rng.integers(0, 10**6))
        fmt = choose_format(shape, nse, "float64")
        if fmt != "dense":
            assert sparse_nbytes(shape, nse, "float64", fmt) <= \
                sparse_nbytes(shape, nse, "float64", "csr")
        if fmt == "coo":  # only where row pointers would be most of CSR's bytes
            assert shape[0] + 1 > 3 * nse - 1
    assert choose_format((10**8, 10**8), 5, "float64") == "coo"
    assert choose_format((1000, 1000), 5000, "float64") == "csr"
    for shape in [(10**10, 10**10), (10**7,) * 3, (3, 10**10, 10**10), (10**19,), (5, 7)]:
        tile = fit_elements(shape)
        assert all(1 <= t <= n for t, n in zip(tile, shape))
        assert np.prod([float(t) for t in tile]) <= 2.0**62


def test_group_ids_compress_where_the_extents_pass_int64():
    c = [np.array([9, 0, 9, 4]), np.array([1, 2, 1, 0])]
    ids, n = group_ids(c, (10**10, 10**10))
    assert n == 3 and ids.tolist() == [2, 0, 2, 1]  # C order of the occupied pairs
    ids, n = group_ids(c, (10, 3))
    assert n == 30 and ids.tolist() == [28, 2, 28, 12]
    ids, n = group_ids([], (), 4)
    assert n == 1 and ids.tolist() == [0, 0, 0, 0]


# -- R5: extents whose dense size passes int64 -----------------------------------------------
BIG = r"""
import json, resource, sys, tempfile, os
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np, duckdb, tensordb
d = tempfile.mkdtemp(dir=sys.argv[1])
out = {}
with tensordb.connect(os.path.join(d, "db"), memory_limit="1GB") as con:
    n = 10**10
    con.execute(f"CREATE TENSOR M FROM (SELECT r * 1000000007 AS a, r * 999999937 AS b, 1.5 + r AS v"
                f" FROM range(5) t(r)) INDEX (a, b) VALUE v SHAPE ({n}, {n})")
    info = next(t for t in con.tensors() if t["name"] == "M")
    out["m_info"] = [info["nnz"], info["bytes"], list(info["shape"])]
    out["m_rows"] = con.execute("SELECT * FROM M").fetchall()
    s = con.sparse("M")
    out["m_sparse"] = [type(s).__name__, s.coords[0].tolist(), s.coords[1].tolist(), s.data.tolist()]
    con.export("M", os.path.join(d, "m.parquet"))
    out["m_parquet"] = duckdb.sql(f"SELECT * FROM '{d}/m.parquet' ORDER BY 1").fetchall()
    con.load("M2", os.path.join(d, "m.parquet"))
    out["m2_rows"] = con.execute("SELECT * FROM M2").fetchall()
    for agg in ["SUM", "MAX", "MIN"]:
        con.execute(f"S = {agg}(M[a,b])")
        out["m_" + agg] = float(con.tensor("S"))
    ext = 10**7
    con.execute(f"CREATE TENSOR T FROM (SELECT (r * 7919) % {ext} AS a, (r * 104729) % {ext} AS b,"
                f" (r * 31) % {ext} AS c, 1.0 + r AS v FROM range(40) t(r))"
                f" INDEX (a, b, c) VALUE v SHAPE ({ext}, {ext}, {ext})")
    out["t_rows"] = con.execute("SELECT * FROM T").fetchall()
    con.execute("U[a] = SUM(T[a,b,c])")
    u = con.tensor("U")
    out["t_u"] = [list(u.shape), np.flatnonzero(u).tolist(), u[np.flatnonzero(u)].tolist()]
    con.execute("V = MAX(T[a,b,c])")
    out["t_max"] = float(con.tensor("V"))
    con.export("T", os.path.join(d, "t.parquet"))
    out["t_parquet"] = duckdb.sql(f"SELECT count(*), sum(value) FROM '{d}/t.parquet'").fetchall()
    try:
        con.sparse("T")
        out["t_sparse"] = "ran"
    except tensordb.Error as e:
        out["t_sparse"] = type(e).__name__
print(json.dumps(out))
"""


def test_extents_past_int64_load_read_export_and_reduce(tmp_path):
    proc = run_script(BIG, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    r = np.arange(5)
    want = {(int(k * 1000000007), int(k * 999999937)): 1.5 + k for k in r}
    assert out["m_info"] == [5, out["m_info"][1], [10**10, 10**10]] and out["m_info"][1] < 4096
    assert {(a, b): v for a, b, v in out["m_rows"]} == want
    kind, rows, cols, vals = out["m_sparse"]
    assert kind == "coo_array" and dict(zip(zip(rows, cols), vals)) == want
    assert {(a, b): v for a, b, v in out["m_parquet"]} == want
    assert {(a, b): v for a, b, v in out["m2_rows"]} == want
    vals = np.array(list(want.values()))
    # absent entries are zeros: the MIN of 10^20 elements, 5 of them positive, is 0
    assert (out["m_SUM"], out["m_MAX"], out["m_MIN"]) == (vals.sum(), vals.max(), 0.0)
    ext, k = 10**7, np.arange(40)
    a, b, c = (k * 7919) % ext, (k * 104729) % ext, (k * 31) % ext
    assert sorted(map(tuple, out["t_rows"])) == sorted(
        (int(x), int(y), int(z), float(v)) for x, y, z, v in zip(a, b, c, 1.0 + k))
    u = {}
    for x, v in zip(a, 1.0 + k):
        u[int(x)] = u.get(int(x), 0.0) + v
    assert out["t_u"][0] == [ext] and dict(zip(out["t_u"][1], out["t_u"][2])) == u
    assert out["t_max"] == 40.0
    assert out["t_parquet"] == [[40, float((1.0 + k).sum())]]
    assert out["t_sparse"] == "NotSupportedError"


# -- R3: a hypersparse matrix ----------------------------------------------------------------
HYPER = r"""
import json, resource, sys, tempfile, os
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]) << 20, int(sys.argv[2]) << 20))
import numpy as np, tensordb
d = tempfile.mkdtemp(dir=sys.argv[1])
rows = 10**8
with tensordb.connect(os.path.join(d, "db"), memory_limit="256MB") as con:
    con.execute(f"CREATE TENSOR M FROM (SELECT r * 7 AS a, r * 11 AS b, 1.0 + r AS v FROM range(5) t(r)) "
                f"INDEX (a, b) VALUE v SHAPE ({rows}, {rows})")
    info = next(t for t in con.tensors() if t["name"] == "M")
    fmts = [r[0] for r in con.execute("SELECT format FROM tensordb.tiles WHERE tensor = 'M'").fetchall()]
    got = con.execute("SELECT * FROM M").fetchall()
    con.execute("S = SUM(M[a,b])")
    total = float(con.tensor("S"))
print(json.dumps({"bytes": info["bytes"], "nnz": info["nnz"], "formats": fmts, "rows": got,
                  "sum": total}))
"""


def test_a_hypersparse_matrix_is_stored_coo_and_read_in_bounded_memory(tmp_path):
    # before: one CSR tile of 381.5 MiB and 2.5 GB RSS; an address-space limit of 2 GB
    # (the interpreter, numpy, DuckDB's threads and scipy take over 1 GB of it) holds it now
    proc = run_script(HYPER, tmp_path, 2000, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    rows, nse = 10**8, 5
    csr = sparse_nbytes((rows, rows), nse, "float64", "csr")
    assert out["formats"] == ["coo"] and out["nnz"] == nse
    assert out["bytes"] <= 1.5 * csr and out["bytes"] < 1024
    r = np.arange(5)
    assert sorted(map(tuple, out["rows"])) == [(int(7 * k), int(11 * k), 1.0 + k) for k in r]
    assert out["sum"] == float((1.0 + r).sum())


def _hyper(rng, shape, nse, dtype="float64"):
    lin = rng.choice(shape[0] * shape[1], nse, replace=False)
    a = np.zeros(shape, dtype)
    a.reshape(-1)[lin] = rng.integers(1, 9, nse) * rng.choice([-1, 1], nse)
    return a


def test_hypersparse_matrix_tiles_in_every_kernel_equal_numpy(tmp_path):
    rng = np.random.default_rng(3)
    A = _hyper(rng, (3000, 40), 12)        # 3,000 rows, 12 entries: COO
    B = _hyper(rng, (3000, 40), 15)
    X = rng.standard_normal((40, 3))
    Y = rng.standard_normal((3000, 2))
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("A", sp.csr_array(A))
        con.load("B", sp.csr_array(B), tile=(700, 40))  # several COO tiles
        con.load("X", X)
        con.load("Y", Y)
        fmts = {r[0] for r in con.execute(
            "SELECT format FROM tensordb.tiles WHERE tensor IN ('A', 'B')").fetchall()}
        assert fmts == {"coo"}
        cases = [
            ("R[i,k] = SUM(A[i,j] * X[j,k])", A @ X),
            ("R[j,k] = SUM(A[i,j] * Y[i,k])", A.T @ Y),
            ("R[i] = SUM(B[i,j])", B.sum(1)),
            ("R[j] = MAX(B[i,j])", B.max(0)),
            ("R[i] = MIN(A[i,j])", A.min(1)),
            ("R = SUM(B[i,j])", B.sum()),
            ("R[i,j] = A[i,j] * B[i,j]", A * B),
            ("R[i,j] = A[i,j] + B[i,j]", A + B),
            ("R[i,k] = SUM(A[i,j] * B[k,j])", A @ B.T),
            ("R[i,j] = EXP(A[i,j])", np.exp(A)),
        ]
        for q, want in cases:
            con.execute(q)
            np.testing.assert_allclose(con.tensor("R"), want, rtol=1e-12, atol=1e-12, err_msg=q)
        got = con.sparse("A")
        np.testing.assert_array_equal(got.toarray(), A)
        np.testing.assert_array_equal(con.tensor("B"), B)
        assert con.check()[-1]["problem"] == "ok"


# -- R4: reductions of sparse tensors of rank 3 and more -------------------------------------
def _tensor(rng, shape, nse, dtype, special=False):
    size = int(np.prod(shape))
    a = np.zeros(shape, dtype)
    lin = rng.choice(size, min(nse, size), replace=False) if size else np.zeros(0, int)
    if np.dtype(dtype).kind == "b":
        a.reshape(-1)[lin] = True
    else:
        a.reshape(-1)[lin] = (rng.integers(1, 50, lin.size) * rng.choice([-1, 1], lin.size)
                              ).astype(dtype)
        if special and lin.size >= 3 and np.dtype(dtype).kind == "f":
            a.reshape(-1)[lin[:3]] = [np.nan, np.inf, -np.inf]
    return a


def _numpy(agg, a, labels, out):
    with np.errstate(all="ignore"):
        return _numpy_ok(agg, a, labels, out)


def _numpy_ok(agg, a, labels, out):
    axes = tuple(d for d, l in enumerate(labels) if l not in out)
    kept = [l for l in labels if l in out]
    if agg == "SUM":
        res = np.einsum(f"{labels}->{''.join(kept)}", a)
    else:
        res = (np.max if agg == "MAX" else np.min)(a, axis=axes)
    res = np.asarray(res)
    return res.transpose([kept.index(l) for l in out]) if kept else res


@pytest.mark.parametrize("dtype", DTYPES)
def test_rank_3_and_4_reductions_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(DTYPES.index(dtype))
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        for name, shape, nse, tile in [("T", (9, 7, 11), 25, None), ("W", (6, 5, 4, 7), 30, (2, 5, 4, 7)),
                                       ("T2", (12, 5, 6), 20, (5, 5, 6))]:
            a = _tensor(rng, shape, nse, dtype, special=True)
            con.load(name, a, tile=tile) if tile else con.load(name, a)
            assert {r[0] for r in con.execute(
                "SELECT format FROM tensordb.tiles WHERE tensor = ?", [name]).fetchall()} >= \
                ({"coo"} if dtype != "bool" else set())  # a bool tile is dense sooner
            labels = "abcd"[:len(shape)]
            outs = [""] + [l for l in labels] + ["".join(p) for n in (2, len(shape) - 1)
                                                 for p in itertools.permutations(labels, n)][:8]
            for agg in ["SUM", "MAX", "MIN"]:
                for out in outs:
                    q = f"R{'[' + ','.join(out) + ']' if out else ''} = {agg}({name}[{','.join(labels)}])"
                    con.execute(q)
                    want = _numpy(agg, a, labels, out)
                    got = con.tensor("R")
                    assert got.dtype == want.dtype, q
                    if np.dtype(dtype).kind == "f" and agg == "SUM":
                        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=q)
                    else:
                        np.testing.assert_array_equal(got, want, err_msg=q)
        text = con.explain("R[a] = SUM(T[a,b,c])")
        assert "spreduce x0 sparse" in text


def test_empty_and_all_absent_rank_3_reductions(tmp_path):
    with tensordb.connect(str(tmp_path / "db")) as con:
        a = np.zeros((6, 0, 5))
        con.load("E", a)
        con.execute("R[a,c] = SUM(E[a,b,c])")
        np.testing.assert_array_equal(con.tensor("R"), np.zeros((6, 5)))
        z = np.zeros((40, 30, 20))
        z[3, 4, 5] = -2.0
        con.load("Z", z)
        for agg, fn in [("MAX", np.max), ("MIN", np.min)]:
            con.execute(f"R[c] = {agg}(Z[a,b,c])")
            np.testing.assert_array_equal(con.tensor("R"), fn(z, axis=(0, 1)))
        con.execute("R[b,a] = SUM(Z[a,b,c])")
        np.testing.assert_array_equal(con.tensor("R"), z.sum(2).T)


def test_reduce_nd_directly_against_numpy():
    rng = np.random.default_rng(7)
    for dtype in DTYPES:
        a = _tensor(rng, (4, 6, 5, 3), 20, dtype, special=True)
        idx = np.nonzero(a)
        t = CooTile(a.shape, np.stack(idx), a[idx])
        for agg in ["sum", "max", "min"]:
            for out in ["", "b", "db", "abcd", "cad"]:
                want = _numpy(agg.upper(), a, "abcd", out)
                got = reduce_nd(t, "abcd", out, agg, want.dtype)
                np.testing.assert_array_equal(got, want) if agg != "sum" or dtype[0] != "f" \
                    else np.testing.assert_allclose(got, want, rtol=1e-6)


# -- R4: contractions of sparse tensors of rank 3 and more with a dense operand ---------------
CONTRACTIONS = [
    ("R[a,k] = SUM(T[a,b,c] * X[c,k])", "abc,ck->ak"),
    ("R[k,a] = SUM(T[a,b,c] * X[c,k])", "abc,ck->ka"),
    ("R[a,b,k] = SUM(T[a,b,c] * X[c,k])", "abc,ck->abk"),
    ("R[k] = SUM(T[a,b,c] * Y[a,c,k])", "abc,ack->k"),
    ("R[b] = SUM(X[c,k] * T[a,b,c] * 1)", None),  # a constant: not the sparse kernel's form
    ("R[c,a] = SUM(V[b] * T[a,b,c])", "b,abc->ca"),
    ("R = SUM(T[a,b,c] * Y[a,c,b])", None),
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int32"])
def test_rank_3_contractions_with_a_dense_operand_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(11 + DTYPES.index(dtype))
    t = _tensor(rng, (9, 6, 8), 30, dtype, special=True)
    x = rng.integers(-4, 5, (8, 3)).astype(dtype)
    y = rng.integers(-4, 5, (9, 8, 3)).astype(dtype)
    y2 = rng.integers(-4, 5, (9, 8, 6)).astype(dtype)
    v = rng.integers(-4, 5, 6).astype(dtype)
    with tensordb.connect(str(tmp_path / "db"), workers=2) as con:
        con.load("T", t, tile=(4, 6, 8))  # three COO tiles
        for name, a in [("X", x), ("V", v)]:
            con.load(name, a)
        con.load("Y", y if True else None)
        for q, eq in CONTRACTIONS:
            if q.startswith("R = SUM(T[a,b,c] * Y[a,c,b])"):
                con.load("Y", y2, replace=True)
                want = np.einsum("abc,acb->", t, y2)
            elif eq is None:
                want = np.einsum("ck,abc->b", x, t)
            else:
                ops = {"X": x, "Y": y, "V": v}
                first, second = eq.split("->")[0].split(",")
                dense = [ops[n] for n in ("X", "Y", "V") if f"{n}[" in q][0]
                args = (t, dense) if first == "abc" else (dense, t)
                with np.errstate(all="ignore"):
                    want = np.einsum(eq, *args)
            text = con.explain(q)
            if eq is not None:
                assert "spmm x" in text and "sparse" in text, (q, text)
            con.execute(q)
            got = con.tensor("R")
            assert got.dtype == want.dtype, q
            if dtype.startswith("float"):
                np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=q)
            else:
                np.testing.assert_array_equal(got, want, err_msg=q)


def test_a_contraction_of_a_large_rank_3_sparse_tensor_runs_in_memory_of_its_entries(tmp_path):
    ext = 10**6
    with tensordb.connect(str(tmp_path / "db"), memory_limit="512MB") as con:
        con.execute(f"CREATE TENSOR T FROM (SELECT (r * 7919) % {ext} AS a, (r * 104729) % 50 AS b,"
                    f" (r * 31) % {ext} AS c, 1.0 + r AS v FROM range(200) t(r))"
                    f" INDEX (a, b, c) VALUE v SHAPE ({ext}, 50, {ext})")
        x = np.arange(50.0 * 2).reshape(50, 2)
        con.load("X", x)
        con.execute("R[a,k] = SUM(T[a,b,c] * X[b,k])")  # 4 x 10^13 elements dense
        r = np.arange(200)
        want = np.zeros((ext, 2))
        np.add.at(want, (r * 7919) % ext, (1.0 + r)[:, None] * x[(r * 104729) % 50])
        np.testing.assert_allclose(con.tensor("R"), want, rtol=1e-12)


def test_a_tile_past_2_to_the_62_elements_is_refused_and_stores_nothing(tmp_path):
    n = 10**10
    with tensordb.connect(str(tmp_path / "db")) as con:
        with pytest.raises(tensordb.ProgrammingError, match="more than a tile can"):
            con.execute(f"CREATE TENSOR M FROM (SELECT 1 AS a, 2 AS b, 1.0 AS v) INDEX (a, b) "
                        f"VALUE v SHAPE ({n}, {n}) TILE ({n}, {n})")
        assert not any(t["name"] == "M" for t in con.tensors())
        con.execute(f"CREATE TENSOR M FROM (SELECT 1 AS a, 2 AS b, 1.0 AS v) INDEX (a, b) "
                    f"VALUE v SHAPE ({n}, {n}) TILE (100000000, {n})")
        assert con.execute("SELECT * FROM M").fetchall() == [(1, 2, 1.0)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rank_3_reductions_into_a_sparse_matrix_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(21 + DTYPES.index(dtype))
    t = _tensor(rng, (60, 50, 4), 40, dtype, special=True)
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("T", t)
        for agg in ["SUM", "MAX", "MIN"]:
            for out in ["ab", "ba", "ca"]:
                q = f"R[{','.join(out)}] = {agg}(T[a,b,c])"
                if out != "ca":  # 3,000 elements, at most 40 entries: CSR tiles from the kernel
                    assert "csr tiles from the kernel" in con.explain(q), q
                con.execute(q)
                want = _numpy(agg, t, "abc", out)
                got = con.tensor("R")
                assert got.dtype == want.dtype, q
                np.testing.assert_array_equal(got, want, err_msg=q) if dtype[0] != "f" or \
                    agg != "SUM" else np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=q)


def test_a_large_rank_3_tensor_reduces_into_a_sparse_matrix(tmp_path):
    ext = 10**6
    with tensordb.connect(str(tmp_path / "db"), memory_limit="512MB") as con:
        con.execute(f"CREATE TENSOR T FROM (SELECT (r * 7919) % {ext} AS a, (r * 104729) % {ext} AS b,"
                    f" r % 3 AS c, 1.0 + r AS v FROM range(300) t(r))"
                    f" INDEX (a, b, c) VALUE v SHAPE ({ext}, {ext}, 3)")
        con.execute("S[b,a] = SUM(T[a,b,c])")  # 8 TB dense
        r = np.arange(300)
        want = {}
        for k in r:
            key = (int((k * 104729) % ext), int((k * 7919) % ext))
            want[key] = want.get(key, 0.0) + 1.0 + k
        got = {(b, a): v for b, a, v in con.execute("SELECT * FROM S").fetchall()}
        assert got == want
        info = next(t for t in con.tensors() if t["name"] == "S")
        assert info["nnz"] == len(want) and info["bytes"] < 64 * 1024


def test_rank_3_sparse_kernels_on_the_dask_executor(tmp_path):
    rng = np.random.default_rng(5)
    t = _tensor(rng, (20, 9, 30), 40, "float64")
    x = rng.integers(-3, 4, (30, 2)).astype("float64")
    with tensordb.connect(str(tmp_path / "db"), workers=2, executor="dask") as con:
        con.load("T", t, tile=(10, 9, 30))
        con.load("X", x)
        for q, want in [("R[a] = SUM(T[a,b,c])", t.sum((1, 2))),
                        ("R[c,b] = MAX(T[a,b,c])", t.max(0).T),
                        ("R[a,b] = MIN(T[a,b,c])", t.min(2)),
                        ("R[a,k] = SUM(T[a,b,c] * X[c,k])", np.einsum("abc,ck->ak", t, x))]:
            con.execute(q)
            np.testing.assert_allclose(con.tensor("R"), want, rtol=1e-12, err_msg=q)
