"""Sparse products against every peer the sparse issue names (run by hand), side by side in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/main/.venv/bin/python -m tests.bench.bench_sparse_peers

Peers: scipy.sparse (one thread), python-graphblas (SuiteSparse:GraphBLAS, ``nthreads`` = the
workers), pydata ``sparse`` (``sparse.COO``; numba, one thread) and plain DuckDB SQL over COO
tables (``SET threads`` = the workers): the einsum written as SQL, ``CREATE OR REPLACE TABLE Y AS
SELECT i, k, SUM(v * x) AS y FROM G JOIN X USING (j) GROUP BY ALL``, from DuckDB tables to a
DuckDB table. tensordb runs the statement plan cached, from stored tensors to a stored result,
on 1 and on 2 workers; every peer is timed in turn with it in each round (medians of
``--runs``; process CPU seconds beside wall time) and every answer is checked against scipy's.
``--peers`` names the peers run beside scipy (default all three; ``--peers`` with no name: scipy
alone, the quickest way to the issue's 1.5x figures; a peer left out reads ``-``).

Sections (``--sections``):

- ``issue``: the issue's first table's graph: ``--nodes`` 50,000 nodes, ``--edges`` 500,000
  random edges (float32 weights; repeats summed). SpMV ``w[i] = SUM(G[i,j] * v[j])`` and SpMM
  ``Y[i,k] = SUM(G[i,j] * X[j,k])`` with X of ``--cols`` (64) columns.
- ``rmat``: bench_sparse_scale's R-MAT graph (``--scale`` 20: 1,048,576 nodes, ~10.2M stored
  entries), the same two products.
- ``bow``: a bag-of-words matrix: ``--docs`` documents x ``--terms`` terms, each document
  ``--doc-len`` tokens drawn from a Zipf law over the terms (p ~ 1/rank^``--zipf``), a term's
  count the number of its tokens (float32). Loaded from Parquet through SQL (``CREATE TENSOR D
  FROM (SELECT d, t, c FROM read_parquet(...)) INDEX (d, t) VALUE c``), stored bytes against CSR
  bytes (int32 indices); SpMM with a dense term embedding ``Y[d,k] = SUM(D[d,t] * E[t,k])``;
  and the term-term co-occurrence ``C[s,t] = SUM(D[d,s] * D[d,t])`` (SpGEMM; scipy ``D.T @ D``,
  GraphBLAS ``D.T.mxm(D)``, pydata ``D.T @ D``) over the first ``--cooc-docs`` documents (the
  whole matrix's co-occurrence has hundreds of millions of entries: the products it needs are
  printed), its output nnz printed.

DuckDB's SpMM makes nnz x cols joined rows before it sums them; where that exceeds
``--duck-max`` (default 40M rows, ~10-30 s on this machine) DuckDB runs on the first rows of G
only (as many as keep nnz x cols under it), scipy is timed on the same rows beside it, and the
table says so (the ratio to scipy is the figure to read there).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402
from tests.bench.bench_sparse_graph import CPU, rmat  # noqa: E402
from tests.bench.bench_sparse_graph import alternate as graph_alternate  # noqa: E402


def _done(result):
    """A GraphBLAS result with its pending work finished: python-graphblas runs non-blocking, and
    ``.new()`` may return before the product's last phase (measured: a 300,000-node SpGEMM's
    ``new()`` in 631 ms, then ``wait()`` 433 ms more), where tensordb's timing includes a usable
    stored result."""
    result.wait()
    return result

def alternate(fns: dict, runs: int) -> dict:
    """bench_sparse_graph's ``alternate`` (medians of wall seconds; CPU seconds in ``CPU``)
    after one warm-up call of each function."""
    for fn in fns.values():
        fn()
    return graph_alternate(fns, runs)


def fmt(s: float) -> str:
    return f"{1e3 * s:,.1f} ms" if s < 1 else f"{s:,.2f} s"


class Duck:
    """A DuckDB database of COO tables: G(i, j, v) and the dense operand as X(j, k, x)."""

    def __init__(self, threads: int):
        import duckdb
        self.con = duckdb.connect()
        self.con.execute(f"SET threads = {int(threads)}")

    def put(self, name: str, **cols) -> None:
        import pyarrow as pa
        self.con.register("_src", pa.table(cols))
        self.con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM _src")
        self.con.unregister("_src")

    def put_sparse(self, name: str, M) -> None:
        c = M.tocoo()
        self.put(name, i=c.row.astype(np.int32), j=c.col.astype(np.int32), v=c.data)

    def put_dense(self, name: str, X: np.ndarray) -> None:
        if X.ndim == 1:
            self.put(name, j=np.arange(X.size, dtype=np.int32), x=X)
        else:
            r, k = np.indices(X.shape, dtype=np.int32)
            self.put(name, j=r.ravel(), k=k.ravel(), x=X.ravel())

    def spmm(self) -> None:
        self.con.execute("CREATE OR REPLACE TABLE Y AS SELECT i, k, SUM(v * x) AS y "
                         "FROM G JOIN X USING (j) GROUP BY ALL")

    def spmv(self) -> None:
        self.con.execute("CREATE OR REPLACE TABLE w AS SELECT i, SUM(v * x) AS y "
                         "FROM G JOIN X1 USING (j) GROUP BY ALL")

    def result(self, shape) -> np.ndarray:
        out = np.zeros(shape)
        if len(shape) == 1:
            i, y = self.con.execute("SELECT i, y FROM w").fetchnumpy().values()
            out[i] = y
        else:
            i, k, y = self.con.execute("SELECT i, k, y FROM Y").fetchnumpy().values()
            out[i, k] = y
        return out


def products(G, X: np.ndarray, x: np.ndarray, runs: int, duck_max: int, label: str,
             names=("G", "X", "v"), rows=None, peers=("graphblas", "pydata", "duckdb")) -> None:
    """SpMV and SpMM of ``G`` (scipy CSR) by tensordb on 1 and 2 workers and every peer (scipy
    always; the others of ``peers``; a peer left out reads ``-``); prints a markdown table."""
    import graphblas as gb
    import scipy.sparse as sp
    import sparse as pydata
    g, X_, v_ = names
    mm = f"Y[i,k] = SUM({g}[i,j] * {X_}[j,k])"
    mv = f"w[i] = SUM({g}[i,j] * {v_}[j])"
    cols = X.shape[1]
    want_mm, want_mv = G @ X, G @ x
    if "pydata" in peers:
        Gp = pydata.COO.from_scipy_sparse(G)
        np.testing.assert_allclose(Gp @ X, want_mm, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(Gp @ x, want_mv, rtol=1e-4, atol=1e-3)
    # DuckDB's SpMM on as many of G's first rows as keep nnz x cols under duck_max
    if G.nnz * cols <= duck_max:
        r = G.shape[0]
    else:
        r = max(1, int(np.searchsorted(G.indptr, duck_max // cols, side="right")) - 1)
    Gd = G[:r] if r < G.shape[0] else G
    # X restricted to the columns of G's first rows that are used (all of them, in general)
    want_duck = Gd @ X
    print(f"\n{label}: {G.shape[0]:,} x {G.shape[1]:,}, {G.nnz:,} stored, X of {cols} columns; "
          f"DuckDB's SpMM on " + ("all rows" if r == G.shape[0] else
                                  f"the first {r:,} rows ({Gd.nnz:,} stored: {Gd.nnz * cols:,} "
                                  f"joined rows, against {G.nnz * cols:,} for all)")
          + f"; load average {os.getloadavg()[0]:.1f}, medians of {runs}", flush=True)
    print("| workers | product | tensordb | scipy | GraphBLAS | pydata sparse | DuckDB SQL | "
          "tensordb / scipy (CPU) | GraphBLAS / scipy | pydata / scipy | DuckDB / scipy |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workers in (1, 2):
        mv_fns, mm_fns = {}, {}
        if "graphblas" in peers:
            gb.ss.config["nthreads"] = workers
            Gg = gb.io.from_scipy_sparse(G)
            Xg = gb.Matrix.from_dense(X)
            xg = gb.Vector.from_dense(x)
            np.testing.assert_allclose(Gg.mxm(Xg).new().to_dense(fill_value=0), want_mm,
                                       rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(Gg.mxv(xg).new().to_dense(fill_value=0), want_mv,
                                       rtol=1e-4, atol=1e-3)
            mv_fns["gb"] = lambda: Gg.mxv(xg).new()
            mm_fns["gb"] = lambda: _done(Gg.mxm(Xg).new())
        if "pydata" in peers:
            mv_fns["pd"] = lambda: Gp @ x
            mm_fns["pd"] = lambda: Gp @ X
        duck = None
        if "duckdb" in peers:
            duck = Duck(workers)
            duck.put_sparse("G", G)
            duck.put_dense("X1", x)
            duck.spmv()
            np.testing.assert_allclose(duck.result((G.shape[0],)), want_mv, rtol=1e-4, atol=1e-3)
            duck.put_sparse("G", Gd)   # SpMM's G: all of it, or its first rows
            duck.put_dense("X", X)
            duck.spmm()
            np.testing.assert_allclose(duck.result(want_duck.shape), want_duck, rtol=1e-4,
                                       atol=1e-3)
            duck.put_sparse("G", G)    # SpMV's runs need all of G again
            mv_fns["duck"] = duck.spmv
            mm_fns["duck"] = duck.spmm
            mm_fns["sp_duck"] = lambda: Gd @ X
        with tensordb.connect(None, workers=workers) as con:
            con.load(g, G)
            con.load(X_, X)
            con.load(v_, x)
            con.execute(mm)
            con.execute(mv)
            np.testing.assert_allclose(con.tensor("Y"), want_mm, rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(con.tensor("w"), want_mv, rtol=1e-4, atol=1e-3)
            t = alternate({"td": lambda: con.execute(mv), "sp": lambda: G @ x, **mv_fns}, runs)
            c = dict(CPU)
            print(f"| {workers} | SpMV | {fmt(t['td'])} | {fmt(t['sp'])} | {_f(t, 'gb')} | "
                  f"{_f(t, 'pd')} | {_f(t, 'duck')} | {t['td'] / t['sp']:.2f}x "
                  f"({c['td'] / c['sp']:.2f}x) | {_r(t, 'gb', 'sp')} | "
                  f"{_r(t, 'pd', 'sp')} | {_r(t, 'duck', 'sp', 1)} |", flush=True)
            if duck is not None:
                duck.put_sparse("G", Gd)
            t = alternate({"td": lambda: con.execute(mm), "sp": lambda: G @ X, **mm_fns}, runs)
            c = dict(CPU)
            part = "" if r == G.shape[0] or duck is None else \
                f" (first {r:,} rows; scipy on them {fmt(t['sp_duck'])})"
            print(f"| {workers} | SpMM x{cols} | {fmt(t['td'])} | {fmt(t['sp'])} | {_f(t, 'gb')} | "
                  f"{_f(t, 'pd')} | {_f(t, 'duck')}{part} | {t['td'] / t['sp']:.2f}x "
                  f"({c['td'] / c['sp']:.2f}x) | {_r(t, 'gb', 'sp')} | "
                  f"{_r(t, 'pd', 'sp')} | {_r(t, 'duck', 'sp_duck', 1)} |", flush=True)
        if duck is not None:
            duck.con.close()


def _f(t: dict, k: str) -> str:
    """A peer's time, or ``-`` where it was left out (``--peers``)."""
    return fmt(t[k]) if k in t else "-"


def _r(t: dict, k: str, base: str, digits: int = 2) -> str:
    """A peer's time over ``base``'s, or ``-`` where it was left out."""
    return f"{t[k] / t[base]:.{digits}f}x" if k in t else "-"


def zipf_bow(rng, docs: int, terms: int, doc_len: int, s: float):
    """A documents x terms count matrix (scipy CSR, float32): each document ``doc_len`` tokens
    drawn from p(rank) ~ 1/rank^s over the terms (term ids permuted), repeats counted."""
    import scipy.sparse as sp
    p = 1.0 / np.arange(1, terms + 1) ** s
    cdf = np.cumsum(p / p.sum())
    perm = rng.permutation(terms).astype(np.int32)
    d = np.repeat(np.arange(docs, dtype=np.int32), doc_len)
    t = perm[np.minimum(np.searchsorted(cdf, rng.random(d.size)), terms - 1)]
    D = sp.csr_array(sp.coo_array((np.ones(d.size, np.float32), (d, t)), shape=(docs, terms)))
    D.sum_duplicates()
    return D


def bag_of_words(args) -> None:
    import graphblas as gb
    import pyarrow as pa
    import pyarrow.parquet as pq
    import scipy.sparse as sp
    import sparse as pydata
    rng = np.random.default_rng(2)
    t0 = time.perf_counter()
    D = zipf_bow(rng, args.docs, args.terms, args.doc_len, args.zipf)
    per_doc = np.diff(D.indptr)
    csr_bytes = D.data.nbytes + D.indices.nbytes + D.indptr.nbytes
    print(f"\nbag of words: {args.docs:,} documents x {args.terms:,} terms, {args.doc_len} tokens "
          f"a document (Zipf s={args.zipf}), {D.nnz:,} stored ({per_doc.mean():.0f} terms a "
          f"document, the most frequent term in {np.bincount(D.indices).max():,} documents); "
          f"made in {time.perf_counter() - t0:.1f} s; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-peers-") as root:
        path = os.path.join(root, "bow.parquet")
        c = D.tocoo()
        pq.write_table(pa.table({"d": c.row.astype(np.int32), "t": c.col.astype(np.int32),
                                 "c": c.data}), path)
        del c
        with tensordb.connect(os.path.join(root, "bow.tdb")) as con:
            sql = (f"CREATE OR REPLACE TENSOR D FROM (SELECT d, t, c FROM read_parquet('{path}')) "
                   f"INDEX (d, t) VALUE c SHAPE ({args.docs}, {args.terms})")
            t = alternate({"sql": lambda: con.execute(sql)}, args.load_runs)
            d = con.describe("D")
            assert (con.sparse("D") != D).nnz == 0
        print(f"load from Parquet through SQL, on disk: {fmt(t['sql'])} ({D.nnz / t['sql'] / 1e6:.1f}M "
              f"nonzeros/s; CPU {CPU['sql']:.2f} s: {D.nnz / CPU['sql'] / 1e6:.1f}M/s); stored "
              f"{d['bytes'] / 2**20:.1f} MiB in {d['tile_count']} tiles against CSR "
              f"{csr_bytes / 2**20:.1f} MiB ({d['bytes'] / csr_bytes:.2f}x)", flush=True)
    E = rng.standard_normal((args.terms, args.cols), dtype=np.float32)
    e = E[:, 0].copy()
    products(D, E, e, args.runs, args.duck_max, "bag of words, SpMM with a term embedding",
             names=("D", "E", "u"))
    # co-occurrence over the first cooc_docs documents
    Dc = D[:args.cooc_docs] if args.cooc_docs < D.shape[0] else D
    work = int((np.diff(Dc.indptr).astype(np.int64) ** 2).sum())
    want = sp.csr_array(Dc.T @ Dc)
    want.sum_duplicates()
    print(f"\nco-occurrence C[s,t] = SUM(D[d,s] * D[d,t]) over the first {Dc.shape[0]:,} documents "
          f"({Dc.nnz:,} stored): {work:,} products, output {want.nnz:,} stored "
          f"({want.nnz / args.terms ** 2:.2%} of {args.terms:,}^2); whole matrix: "
          f"{int((per_doc.astype(np.int64) ** 2).sum()):,} products; load average "
          f"{os.getloadavg()[0]:.1f}, medians of {args.runs}", flush=True)
    Dp = pydata.COO.from_scipy_sparse(Dc)
    print("| workers | tensordb | scipy | GraphBLAS | pydata sparse | tensordb / scipy (CPU) | "
          "tensordb / GraphBLAS | pydata / scipy |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    got_pd = (Dp.T @ Dp).tocsr()
    assert abs(got_pd - want).max() == 0
    for workers in (1, 2):
        gb.ss.config["nthreads"] = workers
        Dg = gb.io.from_scipy_sparse(Dc)
        got = gb.io.to_scipy_sparse(Dg.T.mxm(Dg).new(), format="csr")
        assert got.nnz == want.nnz and abs(got - want).max() == 0
        with tensordb.connect(None, workers=workers) as con:
            con.load("D", Dc)
            q = "C[s,t] = SUM(D[d,s] * D[d,t])"
            con.execute(q)
            got = con.sparse("C")
            assert got.nnz == want.nnz and abs(got - want).max() == 0
            t = alternate({"td": lambda: con.execute(q), "sp": lambda: Dc.T @ Dc,
                           "gb": lambda: _done(Dg.T.mxm(Dg).new()), "pd": lambda: Dp.T @ Dp}, args.runs)
            c = dict(CPU)
        print(f"| {workers} | {fmt(t['td'])} | {fmt(t['sp'])} | {fmt(t['gb'])} | {fmt(t['pd'])} | "
              f"{t['td'] / t['sp']:.2f}x ({c['td'] / c['sp']:.2f}x) | {t['td'] / t['gb']:.2f}x | "
              f"{t['pd'] / t['sp']:.2f}x |", flush=True)


def main(argv=None) -> None:
    import scipy.sparse as sp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", nargs="*", default=["issue", "rmat", "bow"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--edges", type=int, default=500_000)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--edge-factor", type=int, default=10)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--terms", type=int, default=50_000)
    ap.add_argument("--doc-len", type=int, default=130)
    ap.add_argument("--zipf", type=float, default=1.07)
    ap.add_argument("--cooc-docs", type=int, default=5_000)
    ap.add_argument("--load-runs", type=int, default=1)
    ap.add_argument("--duck-max", type=int, default=40_000_000)
    ap.add_argument("--peers", nargs="*", default=["graphblas", "pydata", "duckdb"],
                    help="the peers beside scipy (always run) in the issue and rmat sections: "
                         "any of graphblas, pydata, duckdb (none: tensordb against scipy alone, "
                         "the quickest way to the 1.5x figures)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    print(f"load average {os.getloadavg()}", flush=True)
    rng = np.random.default_rng(0)
    if "issue" in args.sections:
        n = args.nodes
        i = rng.integers(0, n, args.edges, dtype=np.int32)
        j = rng.integers(0, n, args.edges, dtype=np.int32)
        G = sp.csr_array(sp.coo_array((rng.random(args.edges, dtype=np.float32) + 0.5, (i, j)),
                                      shape=(n, n)))
        G.sum_duplicates()
        X = rng.standard_normal((n, args.cols), dtype=np.float32)
        products(G, X, X[:, 0].copy(), args.runs, args.duck_max,
                 f"the issue's random graph ({args.edges:,} edges drawn)", peers=args.peers)
    if "rmat" in args.sections:
        n = 1 << args.scale
        i, j = rmat(args.scale, args.edge_factor, rng)
        G = sp.csr_array(sp.coo_array((np.ones(i.size, np.float32),
                                       (i.astype(np.int32), j.astype(np.int32))), shape=(n, n)))
        G.sum_duplicates()
        del i, j
        X = rng.standard_normal((n, args.cols), dtype=np.float32)
        products(G, X, X[:, 0].copy(), args.runs, args.duck_max, f"R-MAT scale {args.scale}",
                 peers=args.peers)
    if "bow" in args.sections:
        bag_of_words(args)
    print(f"\nload average after: {os.getloadavg()}; {time.perf_counter() - t_start:.0f} s in all")


if __name__ == "__main__":
    main()
