"""Gaps the acceptance audit of issue 26 (AUDIT26.md) found in the sparse tests, each against an
independent oracle: the scipy.sparse formats and pydata arrays no other test loads (LIL, BSR, DIA,
DOK arrays, GCXS), shortest paths by repeated min-plus against networkx's Dijkstra (the issue
names networkx as the graph oracle; the other SSSP tests use scipy's csgraph), and the whole
sparse path from the command line (`python -m tensordb`): a COO Parquet file loaded, an SpMM,
the result and the graph exported, checked with numpy and DuckDB reading the files; and 26
statements mixing fills 0, +inf and -inf, an int64 and an empty sparse operand and a dense one,
against numpy on the densified arrays (dtype and NaN included)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tests.harness import child_env

INF = np.inf


@pytest.mark.filterwarnings("ignore::scipy.sparse.SparseEfficiencyWarning")  # DIA of random entries
@pytest.mark.parametrize("kind", ["lil_matrix", "lil_array", "bsr_array", "dia_array",
                                  "dok_array", "coo_array_unsummed", "gcxs"])
def test_every_sparse_kind_loads_from_its_entries_and_exports(kind, tmp_path):
    rng = np.random.default_rng(11)
    n, m, k = 90, 70, 300
    rows, cols = rng.integers(0, n, k), rng.integers(0, m, k)
    vals = rng.integers(1, 9, k).astype(np.float64)
    coo = sp.coo_array((vals, (rows, cols)), shape=(n, m))   # repeats: scipy sums them
    want = coo.toarray()
    if kind == "gcxs":
        sparse = pytest.importorskip("sparse")
        obj = sparse.GCXS.from_scipy_sparse(sp.csr_matrix(want))
    elif kind == "coo_array_unsummed":
        obj = coo
    else:
        obj = getattr(sp, kind)(sp.csr_array(want)) if kind != "dia_array" \
            else sp.dia_array(sp.csr_array(want))
    with tensordb.connect(tmp_path / "db") as con:
        con.load("M", obj)
        info = next(t for t in con.tensors() if t["name"] == "M")
        assert info["nnz"] == np.count_nonzero(want)
        assert info["bytes"] < want.nbytes / 2          # stored sparse, not the dense tile
        np.testing.assert_array_equal(con.tensor("M"), want)
        back = con.sparse("M")
        assert isinstance(back, sp.csr_array)
        np.testing.assert_array_equal(back.toarray(), want)
        rows_out = con.execute("SELECT i, j, value FROM M").fetchall()
        assert len(rows_out) == np.count_nonzero(want)
        assert all(want[i, j] == v for i, j, v in rows_out)


def test_shortest_paths_by_min_plus_equal_networkx_dijkstra(tmp_path):
    nx = pytest.importorskip("networkx")
    rng = np.random.default_rng(5)
    n, e = 80, 400
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    w = rng.integers(1, 10, src.size).astype(np.float64)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for a, b, x in zip(src, dst, w):   # a repeated edge keeps its lightest weight
        if not g.has_edge(a, b) or g[a][b]["weight"] > x:
            g.add_edge(int(a), int(b), weight=float(x))
    edges = np.array([(a, b, d["weight"]) for a, b, d in g.edges(data=True)])
    # a 0-weight self loop at every node: a step keeps the distance it had
    i = np.r_[edges[:, 0], np.arange(n)].astype(np.int64)
    j = np.r_[edges[:, 1], np.arange(n)].astype(np.int64)
    v = np.r_[edges[:, 2], np.zeros(n)]
    d0 = np.full(n, INF)
    d0[0] = 0.0
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("D", sp.coo_array((v, (i, j)), shape=(n, n)), fill_value=INF)
        con.load("dist", d0)
        step = "CREATE OR REPLACE TENSOR dist[k] AS MIN(dist[j] + D[j,k])"
        try:
            import graphblas  # noqa: F401
            assert "semiring min_plus" in con.explain(step)
        except ImportError:  # without the graph extra min-plus runs as its dense broadcast
            pass
        for _ in range(n - 1):
            con.execute(step)
        got = con.tensor("dist")
    lengths = nx.single_source_dijkstra_path_length(g, 0)
    want = np.array([lengths.get(k, INF) for k in range(n)])
    np.testing.assert_array_equal(got, want)
    assert np.isinf(want).any() and np.isfinite(want).sum() > 1   # both kinds of node checked


def test_the_command_line_loads_a_coo_parquet_file_multiplies_and_exports(tmp_path):
    rng = np.random.default_rng(3)
    n, k, e = 500, 4, 2000
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    w = rng.integers(1, 5, e).astype(np.float64)
    edges = tmp_path / "edges.parquet"
    duckdb.sql("SELECT * FROM (SELECT unnest($s) AS s, unnest($d) AS d, unnest($w) AS w)",
               params={"s": src.tolist(), "d": dst.tolist(), "w": w.tolist()}).write_parquet(str(edges))
    x = rng.integers(-3, 4, (n, k)).astype(np.float64)
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "q.sql"
    script.write_text(
        f"LOAD TENSOR G FROM '{edges}' INDEX (s, d) VALUE w SHAPE ({n}, {n});\n"
        f"LOAD TENSOR X FROM '{tmp_path / 'x.npy'}';\n"
        "EXPLAIN Y[s, k] = SUM(G[s, d] * X[d, k]);\n"
        "Y[s, k] = SUM(G[s, d] * X[d, k]);\n"
        f"COPY Y TO '{tmp_path / 'y.npy'}';\n"
        f"COPY G TO '{tmp_path / 'g.parquet'}';\n")
    proc = subprocess.run([sys.executable, "-m", "tensordb", str(tmp_path / "db"), "-f", str(script)],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "spmm x0 sparse" in proc.stdout and "sparse inputs: G csr" in proc.stdout
    g = sp.coo_array((w, (src, dst)), shape=(n, n)).toarray()   # repeats summed, as scipy does
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), g @ x)
    rows = duckdb.sql(f"SELECT * FROM '{tmp_path / 'g.parquet'}'").fetchall()
    assert len(rows) == np.count_nonzero(g)             # the nonzeros only
    back = np.zeros((n, n))
    for a, b, val in rows:
        back[a, b] = val
    np.testing.assert_array_equal(back, g)


def _stored(con, name, a, fill, dense):
    """Load scipy ``a`` as ``name`` with ``fill``; ``dense[name]`` is its numpy array."""
    full = np.full(a.shape, fill, dtype=a.dtype)
    coo = a.tocoo()
    full[coo.row, coo.col] = coo.data
    if fill == 0:
        con.load(name, a)
    else:
        con.load(name, a, fill_value=fill)
    dense[name] = full


# statements over sparse operands of fill 0, +inf and -inf, an int64 one, an empty one and a
# dense X, mixed; each against numpy on the densified arrays, dtype and NaN included
MIXED = [
    ("Y[i,k] = SUM(A[i,j] * X[j,k])", lambda D: D["A"] @ D["X"]),
    ("Y[i,k] = MIN(P[i,j] + Q[j,k])", lambda D: (D["P"][:, :, None] + D["Q"][None]).min(1)),
    ("Y[i,k] = MAX(N[i,j] + N[j,k])", lambda D: (D["N"][:, :, None] + D["N"][None]).max(1)),
    ("Y[i,k] = MIN(P[i,j] + X[j,k])", lambda D: (D["P"][:, :, None] + D["X"][None]).min(1)),
    ("Y[i,k] = MAX(A[i,j] * B[j,k])", lambda D: (D["A"][:, :, None] * D["B"][None]).max(1)),
    ("Y[i,k] = MIN(A[i,j] * B[j,k])", lambda D: (D["A"][:, :, None] * D["B"][None]).min(1)),
    ("Y[i,j] = P[i,j] + Q[i,j]", lambda D: D["P"] + D["Q"]),
    ("Y[i,j] = A[i,j] * I[i,j]", lambda D: D["A"] * D["I"]),
    ("Y[i,j] = I[i,j] + I[j,i]", lambda D: D["I"] + D["I"].T),
    ("Y[i,k] = SUM(I[i,j] * I[j,k])", lambda D: D["I"] @ D["I"]),
    ("Y[i] = MAX(I[i,j])", lambda D: D["I"].max(1)),
    ("Y[i] = MIN(P[i,j])", lambda D: D["P"].min(1)),
    ("Y[j] = MAX(P[i,j])", lambda D: D["P"].max(0)),
    ("Y[i] = SUM(P[i,j])", lambda D: D["P"].sum(1)),
    ("Y[i] = PROD(A[i,j])", lambda D: D["A"].prod(1)),
    ("Y[i,k] = SUM(E[i,j] * X[j,k])", lambda D: D["E"] @ D["X"]),
    ("Y[i,k] = SUM(E[i,j] * E[j,k])", lambda D: D["E"] @ D["E"]),
    ("Y[i,k] = MIN(E[i,j] + A[j,k])", lambda D: (D["E"][:, :, None] + D["A"][None]).min(1)),
    ("Y = SUM(A[i,j] * A[j,k] * A[k,i])", lambda D: np.einsum("ij,jk,ki->", D["A"], D["A"], D["A"])),
    ("Y[i,j] = A[i,j] * SUM(X[i,r] * X[j,r])", lambda D: D["A"] * (D["X"] @ D["X"].T)),
    ("Y[i,j] = EXP(0 - P[i,j])", lambda D: np.exp(-D["P"])),
    ("Y[i,j] = P[i,j] - 1", lambda D: D["P"] - 1),
    ("Y[i,j] = A[i,j] - B[j,i]", lambda D: D["A"] - D["B"].T),
    ("Y[i,k] = SUM(A[i,j] * B[j,k]) + A[i,k]", lambda D: D["A"] @ D["B"] + D["A"]),
    ("Y[i,k] = MIN(P[i,j] + P[j,k]) + 1", lambda D: (D["P"][:, :, None] + D["P"][None]).min(1) + 1),
    ("Y[i] = MAX(A[i,j] * X[j,i])", lambda D: (D["A"] * D["X"].T).max(1)),
]


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_fills_dtypes_and_empty_operands_equal_numpy(seed, tmp_path):
    rng = np.random.default_rng(seed)
    n = 24

    def matrix(dtype="float64", density=0.1):
        a = sp.random_array((n, n), density=density, rng=rng, format="csr")
        a.data = np.round(a.data * 8 - 3)
        a.data[a.data == 0] = 1   # no stored zeros: the entries are what numpy sees
        return sp.csr_array(a.astype(dtype))

    dense = {}
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        for name, fill, dtype, density in (("A", 0.0, "float64", 0.1), ("B", 0.0, "float64", 0.1),
                                           ("P", INF, "float64", 0.1), ("Q", INF, "float64", 0.1),
                                           ("N", -INF, "float64", 0.1), ("I", 0, "int64", 0.1),
                                           ("E", 0.0, "float64", 0.0)):
            _stored(con, name, matrix(dtype, density), fill, dense)
        x = np.round(rng.standard_normal((n, n)) * 3)
        con.load("X", x)
        dense["X"] = x
        for sql, oracle in MIXED:
            con.execute(sql)
            got = con.tensor("Y")
            with np.errstate(all="ignore"):
                want = np.asarray(oracle(dense))
            assert got.dtype == want.dtype, sql
            np.testing.assert_array_equal(got, want, err_msg=sql)
        # a product of fill 0 and fill +inf would be NaN wherever both are absent: refused
        with pytest.raises(tensordb.ProgrammingError, match="cannot keep a fill"):
            con.execute("Z[i,j] = A[i,j] * P[i,j]")
        assert not any(t["name"] == "Z" for t in con.tensors())


# -- gaps the audit found in the engine (AUDIT26.md, R3-R5): strict expected failures, so the
# engine change that fixes one makes its test pass and the xfail must then be removed ------------

# AUDIT26 R3 (fixed: a matrix with more rows than entries is stored COO)
def test_a_hypersparse_matrix_is_stored_in_proportion_to_its_nonzeros(tmp_path):
    rows = 2_000_000
    with tensordb.connect(tmp_path / "db") as con:
        con.execute("CREATE TENSOR M FROM (SELECT r * 7 AS a, r * 11 AS b, 1.0 AS v FROM range(5) t(r)) "
                    f"INDEX (a, b) VALUE v SHAPE ({rows}, {rows})")
        info = next(t for t in con.tensors() if t["name"] == "M")
        assert con.execute("SELECT count(*) FROM M").fetchall() == [(5,)]
        # five entries as COO: 5 x (8 + 2 x 4) bytes and a header; CSR stores 2M row pointers
        assert info["bytes"] < 64 * 1024, info["bytes"]


# AUDIT26 R4 (fixed: a reduction of a rank-3 sparse tensor runs on its entries, exec/sparse_nd.py)
def test_a_reduction_of_a_rank_3_sparse_tensor_with_large_extents(tmp_path):
    ext = 10**6
    with tensordb.connect(tmp_path / "db", memory_limit="1GB") as con:
        con.execute(f"CREATE TENSOR T FROM (SELECT (r * 7919) % {ext} AS a, (r * 104729) % {ext} AS b,"
                    f" (r * 31) % {ext} AS c, 1.0 + r AS v FROM range(50) t(r))"
                    f" INDEX (a, b, c) VALUE v SHAPE ({ext}, {ext}, {ext})")
        con.execute("S[a] = SUM(T[a,b,c])")
        r = np.arange(50)
        want = np.zeros(ext)
        np.add.at(want, (r * 7919) % ext, 1.0 + r)
        np.testing.assert_array_equal(con.tensor("S"), want)


# AUDIT26 R5 (fixed: a sparse tile holds at most 2**62 elements, sparsity.fit_elements)
def test_a_sparse_tensor_whose_dense_size_passes_int64_loads_or_is_refused_as_a_user_error(tmp_path):
    n = 10**10
    with tensordb.connect(tmp_path / "db") as con:
        try:
            con.execute("CREATE TENSOR M FROM (SELECT r * 1000000007 AS a, r * 999999937 AS b, 1.0 AS v"
                        f" FROM range(5) t(r)) INDEX (a, b) VALUE v SHAPE ({n}, {n})")
        except (tensordb.DataError, tensordb.ProgrammingError, tensordb.OperationalError):
            assert not any(t["name"] == "M" for t in con.tensors())
            return
        assert con.execute("SELECT count(*) FROM M").fetchall() == [(5,)]
