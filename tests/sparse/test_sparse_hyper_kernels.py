"""Seeded property tests of the hypersparse and rank-3+ sparse kernels (AUDIT26 R3-R5), each
statement through SQL against numpy (tests/fuzz_oracle.py) on the densified inputs:

- rank-3 and rank-4 sparse tensors (COO tiles, one or several), every dtype, NaN and infinities
  among the entries, a zero extent now and then: SUM/MAX/MIN over any labels (``reduce_nd``,
  ``reduce_nd_csr`` where the plan keeps a matrix output sparse) and contractions with a finite
  dense operand (``contract_nd``);
- hypersparse matrices (far more rows than entries: COO tiles) through every kernel that takes
  a sparse matrix: SpMM/SpMV, SpGEMM, the reductions, the elementwise join, min-plus with fill
  +inf, SDDMM, the masked SpGEMM, and read back (``SELECT *``, ``con.sparse``).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import tensordb
from tests import fuzz_oracle as fo

DTYPES = ["bool", "int32", "int64", "float32", "float64"]


def _kernels(con, sql):
    plan = json.loads(con.explain(sql, format="json"))
    return [n["kernel"]["method"] if isinstance(n.get("kernel"), dict) else n.get("kernel")
            for n in plan["nodes"]]


def _sparse_array(rng, shape, nse, dtype, special):
    """A dense array of ``shape`` with about ``nse`` entries (small integers, a NaN, +inf or
    -inf among them where ``special`` and floating)."""
    dtype = np.dtype(dtype)
    a = np.zeros(shape, dtype)
    size = int(np.prod(shape))
    if not size:
        return a
    lin = rng.choice(size, min(nse, size), replace=False)
    if dtype.kind == "b":
        a.reshape(-1)[lin] = True
        return a
    a.reshape(-1)[lin] = (rng.integers(1, 9, lin.size) * rng.choice([-1, 1], lin.size)).astype(dtype)
    if special and dtype.kind == "f" and lin.size >= 2:
        a.reshape(-1)[lin[:2]] = rng.choice([np.nan, np.inf, -np.inf], 2)
    return a


def _check(con, sql, case, expect=None):
    oracle = fo.answer(case)
    if expect is not None:
        assert _kernels(con, sql) == [expect], (sql, _kernels(con, sql))
    if oracle.error is not None:
        with pytest.raises(tensordb.Error):
            con.execute(sql)
        return
    con.execute(sql)
    got = con.tensor(case_out_name(sql))
    problem = fo.compare(got, oracle)
    assert problem is None, f"{sql}: {problem}"


def case_out_name(sql):
    return sql.split("=")[0].split("[")[0].strip()


@pytest.mark.parametrize("seed", range(3))
def test_rank_3_and_4_reductions_and_contractions_against_numpy(seed, tmp_path):
    rng = np.random.default_rng(4000 + seed)
    with tensordb.connect(tmp_path / "db", workers=int(rng.integers(1, 3))) as con:
        for case in range(10):
            dtype = DTYPES[(case + seed) % len(DTYPES)]
            rank = 3 + case % 2
            labels = "abcd"[:rank]
            shape = [int(rng.integers(2, 9)) for _ in range(rank)]
            if case % 5 == 4:
                shape[int(rng.integers(rank))] = 0  # an empty tensor
            nse = max(1, int(np.prod(shape)) // int(rng.integers(8, 30)))
            a = _sparse_array(rng, tuple(shape), nse, dtype, special=rng.random() < 0.6)
            tile = tuple(int(rng.integers(1, max(s, 1) + 1)) for s in shape) \
                if rng.random() < 0.5 else None
            name = f"T{case}"
            con.load(name, a, tile=tile) if tile else con.load(name, a)
            ref = f"{name}[{','.join(labels)}]"
            # reductions: each aggregate over a random subset of the labels, a random order
            for agg in ("SUM", "MAX", "MIN"):
                k = int(rng.integers(0, rank))
                out = "".join(rng.permutation(list(labels))[:k])
                sql = f"R{case}{'[' + ','.join(out) + ']' if out else ''} = {agg}({ref})"
                fc = fo.Case(tuple(out), [fo.Operand(name, tuple(labels), a)], ("in", 0),
                             agg.lower())
                sparse_stored = con.store.open(name).has_sparse
                _check(con, sql, fc, "spreduce" if sparse_stored else None)
            # a contraction with a finite dense operand: some of T's labels shared (contracted),
            # the rest kept, the dense operand's own label kept
            if np.dtype(dtype).kind == "b":
                continue
            shared = list(rng.permutation(list(labels))[:int(rng.integers(1, rank))])
            d_labels = shared + ["k"]
            rng.shuffle(d_labels)
            kept = [l for l in labels if l not in shared]
            out = [l for l in kept if rng.random() < 0.7] + ["k"]
            rng.shuffle(out)
            sizes = dict(zip(labels, shape), k=int(rng.integers(1, 4)))
            d = rng.integers(-4, 5, tuple(sizes[l] for l in d_labels)).astype(dtype)
            con.load(f"D{case}", d)
            sql = f"C{case}[{','.join(out)}] = SUM({ref} * D{case}[{','.join(d_labels)}])"
            fc = fo.Case(tuple(out), [fo.Operand(name, tuple(labels), a),
                                      fo.Operand(f"D{case}", tuple(d_labels), d)],
                         ("*", ("in", 0), ("in", 1)), "sum")
            _check(con, sql, fc, "spmm" if con.store.open(name).has_sparse else None)
        assert con.check()[-1]["problem"] == "ok"


HYPER_KINDS = ("spmm", "spmv", "spgemm", "reduce", "spjoin", "min_plus", "sddmm", "masked")


def _hyper_case(rng, kind, dtype):
    """(operands: name -> (labels, dense, sparse?, fill), join, agg, output labels, method)."""
    rows = int(rng.integers(200, 1500))  # far more rows than entries: COO tiles
    n = {"j": int(rng.integers(3, 12)), "k": int(rng.integers(2, 6)), "r": 3, "i": rows}
    fdt = np.dtype(dtype)

    def hyper(shape, fill=0.0):
        a = _sparse_array(rng, shape, int(rng.integers(0, 12)), fdt, special=kind != "masked"
                          and kind != "sddmm")
        if fill:
            a = np.where(a == 0, fill, a).astype(fdt)
        return a

    def dense(labels):
        return rng.integers(-3, 4, tuple(n[l] for l in labels)).astype(fdt)

    prod = ("*", ("in", 0), ("in", 1))
    if kind == "spmm":
        ops = {"H": ("ij", hyper((rows, n["j"])), True, 0.0), "X": ("jk", dense("jk"), False, 0.0)}
        return ops, prod, "sum", str(rng.choice(["ik", "ki"])), "spmm"
    if kind == "spmv":  # the transpose too: H's rows contracted
        if rng.random() < 0.5:
            ops = {"H": ("ij", hyper((rows, n["j"])), True, 0.0), "V": ("j", dense("j"), False, 0.0)}
            return ops, prod, "sum", "i", "spmm"
        ops = {"H": ("ij", hyper((rows, n["j"])), True, 0.0), "Y": ("ik", dense("ik"), False, 0.0)}
        return ops, prod, "sum", "jk", "spmm"
    if kind == "spgemm":
        other = int(rng.integers(100, 400))  # hypersparse too: COO x COO
        ops = {"H": ("ij", hyper((rows, n["j"])), True, 0.0),
               "G": ("kj", hyper((other, n["j"])), True, 0.0)}
        return ops, prod, "sum", "ik", None
    if kind == "reduce":
        ops = {"H": ("ij", hyper((rows, n["j"])), True, 0.0)}
        return ops, ("in", 0), str(rng.choice(["sum", "max", "min"])), \
            str(rng.choice(["i", "j", ""])), "spreduce"
    if kind == "spjoin":
        ops = {"H": ("ij", hyper((rows, n["j"])), True, 0.0),
               "G": ("ij", hyper((rows, n["j"])), True, 0.0)}
        fn = str(rng.choice(["*", "+", "-"]))
        return ops, (fn, ("in", 0), ("in", 1)), "sum", "ij", "spjoin"
    if kind == "min_plus":
        ops = {"H": ("ij", hyper((rows, n["j"]), np.inf), True, np.inf),
               "X": ("jk", dense("jk"), False, 0.0)}
        return ops, ("+", ("in", 0), ("in", 1)), "min", "ik", "semiring"
    if kind == "sddmm":
        ops = {"H": ("ij", hyper((rows, n["j"])), True, 0.0), "U": ("ir", dense("ir"), False, 0.0),
               "W": ("jr", dense("jr"), False, 0.0)}
        return ops, ("*", ("in", 0), ("*", ("in", 1), ("in", 2))), "sum", "ij", "sddmm"
    # masked: SUM(U[i,j] * W[j,k] * H[k,i]) with H hypersparse (k its rows)
    n["k"] = rows
    n["i"] = int(rng.integers(3, 10))
    ops = {"U": ("ij", dense("ij"), False, 0.0), "W": ("jk", dense("jk"), False, 0.0),
           "H": ("ki", hyper((rows, n["i"])), True, 0.0)}
    return ops, ("*", ("*", ("in", 0), ("in", 1)), ("in", 2)), "sum", "", "masked"


@pytest.mark.parametrize("seed", range(3))
def test_hypersparse_matrices_through_every_sparse_kernel_against_numpy(seed, tmp_path):
    import scipy.sparse as sp
    rng = np.random.default_rng(4100 + seed)
    picked = set()
    with tensordb.connect(tmp_path / "db", workers=int(rng.integers(1, 3))) as con:
        for case in range(2 * len(HYPER_KINDS)):
            kind = HYPER_KINDS[case % len(HYPER_KINDS)]
            dtype = str(rng.choice(["float32", "float64"] if kind in ("min_plus",) else
                                   ["float32", "float64", "int32", "int64"]))
            ops, join, agg, out, method = _hyper_case(rng, kind, dtype)
            names = {}
            for name, (labels, a, sparse, fill) in ops.items():
                names[name] = f"{name}{case}"
                if sparse:
                    keep = a != fill if fill else (a != 0) | np.isnan(a) if a.dtype.kind == "f" \
                        else a != 0
                    coo = sp.coo_array((a[keep], np.nonzero(keep)), shape=a.shape)
                    tile = (int(rng.integers(60, a.shape[0] + 1)), a.shape[1]) \
                        if rng.random() < 0.5 else None
                    con.load(names[name], coo, fill_value=fill, **({"tile": tile} if tile else {}))
                    fmts = {r[0] for r in con.execute(
                        "SELECT format FROM tensordb.tiles WHERE tensor = ?", [names[name]]
                    ).fetchall()}
                    assert fmts <= {"coo"}, (names[name], fmts)
                    got = con.execute(f"SELECT * FROM {names[name]}").fetchall()
                    want = {tuple(int(x) for x in ix): a[ix] for ix in zip(*np.nonzero(keep))}
                    assert len(got) == len(want)
                    for *ix, v in got:
                        w = want[tuple(int(x) for x in ix)]
                        assert v == w or (np.isnan(v) and np.isnan(w)), (names[name], ix, v, w)
                    s = con.sparse(names[name])
                    np.testing.assert_array_equal(
                        np.where(keep, a, 0), s.toarray() if fill == 0 else np.where(keep, a, 0))
                else:
                    con.load(names[name], a)
            refs = [f"{names[k]}[{','.join(v[0])}]" for k, v in ops.items()]
            body = fo.render_sql(join, refs)
            if agg != "sum" or any(l not in out for v in ops.values() for l in v[0]):
                body = f"{agg.upper()}({body})"
            sql = f"O{case}[{','.join(out)}] = {body}" if out else f"O{case} = {body}"
            fc = fo.Case(tuple(out), [fo.Operand(names[k], tuple(v[0]), v[1])
                                      for k, v in ops.items()], join, agg)
            has_entries = all(con.store.open(names[k]).has_sparse for k, v in ops.items() if v[2])
            if method is not None and has_entries:
                kernels = _kernels(con, sql)
                assert kernels == [method], (sql, kernels)
                picked.add(method)
            _check(con, sql, fc)
        assert con.check()[-1]["problem"] == "ok"
    assert {"spmm", "spreduce", "spjoin"} <= picked, picked


def test_an_absent_sparse_operand_times_an_infinity_is_nan(tmp_path):
    """A SpGEMM whose one operand has no stored tile (all zeros) and whose other holds -inf:
    NumPy's 0 * -inf is NaN along that column (the kernel returned zeros)."""
    import scipy.sparse as sp
    for rows in (10, 800):  # CSR, then hypersparse COO
        a = np.zeros((rows, 5))
        b = np.zeros((rows, 5))
        b[4, 2], b[1, 1] = -np.inf, 1.0
        with tensordb.connect(tmp_path / f"db{rows}") as con:
            con.load("A", sp.coo_array(a))
            con.load("B", sp.coo_array(b))
            A, B = fo.Operand("A", ("i", "j"), a), fo.Operand("B", ("k", "j"), b)
            for sql, out, ops in [("R[i,k] = SUM(A[i,j] * B[k,j])", "ik", [A, B]),
                                  ("R[k,i] = SUM(B[k,j] * A[i,j])", "ki", [B, A])]:
                assert _kernels(con, sql) == ["spmm"]
                _check(con, sql, fo.Case(tuple(out), ops, ("*", ("in", 0), ("in", 1)), "sum"))
                assert np.isnan(con.tensor("R")).sum() == rows


DEGREES = r"""
import json, resource, sys, tempfile, os
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np, tensordb
d = tempfile.mkdtemp(dir=sys.argv[1])
out = {}
with tensordb.connect(os.path.join(d, "db"), memory_limit="1GB") as con:
    n = 10**10
    con.execute(f"CREATE TENSOR G FROM (SELECT r * 1000000007 AS a, (r % 3) * 999999937 AS b,"
                f" 1.5 - r AS v FROM range(5) t(r)) INDEX (a, b) VALUE v SHAPE ({n}, {n})")
    for name, q in [("deg", "deg[i] = SUM(G[i,j])"), ("col", "col[j] = SUM(G[i,j])"),
                    ("mx", "mx[i] = MAX(G[i,j])"), ("mn", "mn[j] = MIN(G[i,j])")]:
        con.execute(q)
        out[name] = [con.execute(f"SELECT * FROM {name}").fetchall(),
                     sorted({r[0] for r in con.execute(
                         "SELECT format FROM tensordb.tiles WHERE tensor = ?", [name]).fetchall()}),
                     next(t["shape"] for t in con.tensors() if t["name"] == name)]
    out["check"] = con.check()[-1]["problem"]
print(json.dumps(out))
"""


def test_a_vector_over_a_hypersparse_matrix_s_rows_is_sparse(tmp_path):
    """``deg[i] = SUM(G[i,j])`` of a 10^10 x 10^10 matrix of 5 entries: its output is planned
    sparse (a COO vector of its occupied rows), not an 80 GB dense vector computed in 4.7 GiB
    calls (it ran out of memory under the 3 GiB limit)."""
    from tests.harness import run_script
    proc = run_script(DEGREES, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    n = 10**10
    r = np.arange(5)
    rows, cols, vals = r * 1000000007, (r % 3) * 999999937, 1.5 - r
    want = {"deg": {(int(a),): float(v) for a, v in zip(rows, vals)},
            "mx": {(int(a),): max(float(v), 0.0) for a, v in zip(rows, vals)}}
    col, mn = {}, {}
    for c, v in zip(cols, vals):
        col[(int(c),)] = col.get((int(c),), 0.0) + float(v)
        mn[(int(c),)] = min(mn.get((int(c),), 0.0), float(v))  # each column has absent zeros
    want.update(col=col, mn=mn)
    for name, expect in want.items():
        got, fmts, shape = out[name]
        assert list(shape) == [n] and fmts == ["coo"], (name, fmts, shape)
        got = {tuple(int(x) for x in g[:-1]): g[-1] for g in got if g[-1] != 0}
        assert got == {k: v for k, v in expect.items() if v != 0}, name
    assert out["check"] == "ok"


@pytest.mark.parametrize("executor", ["dask", "pool"])
def test_hypersparse_kernels_and_sparse_vectors_on_each_executor_and_a_second_reader(
        executor, tmp_path):
    """A hypersparse matrix (COO tiles, several) through SpMM, the reductions into a sparse
    vector and a join on the Dask executor and the pool, read back from a second connection
    (the snapshot reader) equal to numpy."""
    import scipy.sparse as sp
    rng = np.random.default_rng(4200)
    g = _sparse_array(rng, (3000, 20), 9, "float64", special=False)
    g[5, 3] = -0.0  # a stored -0.0 (an entry, not a zero)
    x = rng.integers(-3, 4, (20, 2)).astype("float64")
    db = tmp_path / "db"
    kw = {"executor": "dask"} if executor == "dask" else {}
    with np.errstate(all="ignore"):
        cases = [("deg[i] = SUM(G[i,j])", "deg", g.sum(1)),
                 ("mx[i] = MAX(G[i,j])", "mx", g.max(1)),
                 ("mn[j] = MIN(G[i,j])", "mn", g.min(0)),
                 ("P[i,k] = SUM(G[i,j] * X[j,k])", "P", g @ x),
                 ("J[i,j] = G[i,j] * G[i,j]", "J", g * g)]
    with tensordb.connect(db, workers=2, **kw) as con:
        keep = (g != 0) | np.signbit(g)
        con.load("G", sp.coo_array((g[keep], np.nonzero(keep)), shape=g.shape), tile=(700, 20))
        con.load("X", x)
        assert {r[0] for r in con.execute(
            "SELECT format FROM tensordb.tiles WHERE tensor = 'G'").fetchall()} == {"coo"}
        for q, name, want in cases:
            con.execute(q)
            np.testing.assert_array_equal(con.tensor(name), want, err_msg=q)
        assert {r[0] for r in con.execute(
            "SELECT format FROM tensordb.tiles WHERE tensor = 'deg'").fetchall()} == {"coo"}
        # a reader in another process while this connection holds the database open
        from tests.harness import run_script
        proc = run_script(READER, db, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        got = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        for _, name, want in cases:
            np.testing.assert_array_equal(np.array(got[name], dtype=float), want, err_msg=name)
        assert con.check()[-1]["problem"] == "ok"


READER = r"""
import json, sys, tensordb
with tensordb.connect(sys.argv[1], read_only=True) as con:
    print(json.dumps({n: con.tensor(n).tolist() for n in ("deg", "mx", "mn", "P", "J")}))
"""


GRAM = r"""
import json, resource, sys, tempfile, os
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np, tensordb
d = tempfile.mkdtemp(dir=sys.argv[1])
out = {}
with tensordb.connect(os.path.join(d, "db"), memory_limit="1GB") as con:
    n = 10**10
    con.execute(f"CREATE TENSOR G FROM (SELECT (r // 2) * 1000000007 AS a, (r * 7) % 40 AS b,"
                f" 1.5 - r AS v FROM range(7) t(r)) INDEX (a, b) VALUE v SHAPE ({n}, 40)")
    for name, q in [("T", "T[j,k] = SUM(G[i,j] * G[i,k])"), ("U", "U[k,j] = SUM(G[i,k] * G[i,j])")]:
        con.execute(q)
        out[name] = con.tensor(name).tolist()
    out["check"] = con.check()[-1]["problem"]
print(json.dumps(out))
"""


def test_the_gram_matrix_of_a_hypersparse_matrix_builds_no_row_pointers(tmp_path):
    """``T[j,k] = SUM(G[i,j] * G[i,k])`` of a 10^10 x 40 matrix of 7 entries (COO tiles): the
    plan projects kilobytes and the SpGEMM made CSR over G's 10^10 rows (a 74.5 GiB indptr);
    it runs on the occupied rows now, under a 3 GiB address-space limit, equal to numpy."""
    from tests.harness import run_script
    proc = run_script(GRAM, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    r = np.arange(7)
    g = np.zeros((4, 40))  # the occupied rows only: (r // 2) * 1000000007 -> r // 2
    np.add.at(g, (r // 2, (r * 7) % 40), 1.5 - r)
    np.testing.assert_array_equal(np.array(out["T"]), g.T @ g)
    np.testing.assert_array_equal(np.array(out["U"]), g.T @ g)
    assert out["check"] == "ok"
