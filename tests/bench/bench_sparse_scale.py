"""Sparse at scale (run by hand): an R-MAT graph of a million nodes, against scipy in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_sparse_scale

A Graph500 R-MAT graph (``--scale`` 20: 1,048,576 nodes, ``--edge-factor`` 10 edges a node
drawn, repeats summed, self loops kept; float32 weights 1) is written to Parquet. Figures, each
the median of ``--runs``, tensordb and scipy alternating in the same process:

- load: ``CREATE TENSOR G FROM (SELECT i, j, v FROM read_parquet(...)) INDEX (i, j) VALUE v``
  (the scan load, formats/coo_scan.py), the same through the path before it (DuckDB's ORDER BY,
  tables._fill_coo) and ``con.load`` of the scipy CSR matrix, in stored nonzeros a second; the
  stored bytes against scipy's CSR (int32 indices);
- ``Y[i,k] = SUM(G[i,j] * X[j,k])`` (X of ``--cols`` columns: SpMM) and ``w[i] = SUM(G[i,j] *
  v[j])`` (SpMV), plan cached, on 1 and on 2 workers, against scipy's ``G @ X`` (one thread);
  EXPLAIN's balance line on 2 workers (the row slabs of equal nonzeros);
- PageRank to convergence (networkx's iteration: damping 0.85, dangling mass spread evenly; it
  stops when the l1 change is under ``--pr-tol``, 1e-4: networkx's own test, n * 1e-6, stops a
  million-node graph after one step), one group of statements a step (``sql/pagerank.sql``'s
  step, its plans cached) on 2 workers, against the same iteration in scipy; ranks compared.

Every answer is checked against scipy. An in-memory database unless ``--disk``.
"""
from __future__ import annotations

import argparse
import re
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402
from tensordb.formats import coo_scan  # noqa: E402
from tests.bench.bench_sparse_graph import rmat  # noqa: E402

ALPHA = 0.85


def pagerank_step(n: int) -> str:
    """sql/pagerank.sql's step (a group of four statements), for ``n`` nodes."""
    text = (Path(__file__).resolve().parents[2] / "sql" / "pagerank.sql").read_text()
    one = text[text.index("-- step 1\n") + len("-- step 1\n"):text.index("-- step 2\n")]
    return one.replace("/ 64", f"/ {n}")


def scipy_pagerank(M, dangling: np.ndarray, n: int, tol: float, max_steps: int = 500):
    r = np.full(n, 1.0 / n)
    for step in range(1, max_steps + 1):
        rn = ALPHA * (M @ r + (dangling @ r) / n) + (1 - ALPHA) / n
        err = np.abs(rn - r).sum()
        r = rn
        if err < tol:
            return r, step
    return r, max_steps


CPU: dict = {}  # the last ``alternate``'s median process CPU seconds (all threads) per function


def alternate(fns: dict, runs: int) -> dict:
    """Median seconds of each function, run in turn ``runs`` times; their median CPU seconds
    (the process's, every thread's: what a machine shared with other work disturbs less) in
    ``CPU``."""
    times = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    CPU.clear()
    CPU.update({k: statistics.median(v) for k, v in cpu.items()})
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import scipy.sparse as sp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--edge-factor", type=int, default=10)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--disk", action="store_true")
    ap.add_argument("--pr-tol", type=float, default=1e-4,
                    help="PageRank stops when the l1 change is under this (networkx's n * 1e-6 "
                         "stops a million-node graph after one step)")
    ap.add_argument("--pr-runs", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[], help="sections to skip: load spmm pagerank")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    n = 1 << args.scale
    i, j = rmat(args.scale, args.edge_factor, rng)
    i, j = i.astype(np.int32), j.astype(np.int32)
    v = np.ones(i.size, np.float32)
    G = sp.csr_array(sp.coo_array((v, (i, j)), shape=(n, n)))
    G.sum_duplicates()
    csr_bytes = G.data.nbytes + G.indices.nbytes + G.indptr.nbytes
    deg = np.diff(G.indptr)
    print(f"R-MAT scale {args.scale}: {n:,} nodes, {i.size:,} edges drawn, {G.nnz:,} stored "
          f"(repeats summed), largest row {deg.max():,}, rows with no entry {(deg == 0).sum():,}; "
          f"load average {os.getloadavg()[0]:.1f}; medians of {args.runs}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-scale-") as root:
        path = os.path.join(root, "edges.parquet")
        pq.write_table(pa.table({"i": i, "j": j, "v": v}), path)
        db = (lambda w: os.path.join(root, f"g{w}.tdb")) if args.disk else (lambda w: None)
        if "load" not in args.skip:
            with tensordb.connect(db("load")) as con:
                sql = (f"CREATE OR REPLACE TENSOR G FROM (SELECT i, j, v FROM read_parquet('{path}')) "
                       f"INDEX (i, j) VALUE v SHAPE ({n}, {n})")
                sorted_sql = sql.replace("TENSOR G ", "TENSOR G3 ")

                def by_sort():  # the path before the scan load: DuckDB's ORDER BY
                    applies = coo_scan.applies
                    coo_scan.applies = lambda *a: False
                    try:
                        con.execute(sorted_sql)
                    finally:
                        coo_scan.applies = applies
                t = alternate({"sql": lambda: con.execute(sql), "sorted": by_sort,
                               "scipy": lambda: con.load("G2", G, replace=True)}, args.runs)
                d = con.describe("G")
                assert all((con.sparse(x) != G).nnz == 0 for x in ("G", "G2", "G3"))
            c = dict(CPU)
            print(f"load from Parquet: {t['sql']:.2f} s ({G.nnz / t['sql'] / 1e6:.1f}M nonzeros/s; "
                  f"CPU {c['sql']:.2f} s: {G.nnz / c['sql'] / 1e6:.1f}M/s); "
                  f"by DuckDB's sort (the path before): {t['sorted']:.2f} s "
                  f"({G.nnz / t['sorted'] / 1e6:.1f}M/s; CPU {c['sorted']:.2f} s: "
                  f"{G.nnz / c['sorted'] / 1e6:.1f}M/s; scan/sort {t['sql'] / t['sorted']:.2f}x, "
                  f"CPU {c['sql'] / c['sorted']:.2f}x); "
                  f"con.load(scipy CSR): {t['scipy']:.2f} s ({G.nnz / t['scipy'] / 1e6:.1f}M/s; "
                  f"CPU {c['scipy']:.2f} s: {G.nnz / c['scipy'] / 1e6:.1f}M/s); "
                  f"stored {d['bytes'] / 2**20:.1f} MiB in {d['tile_count']} tiles against CSR "
                  f"{csr_bytes / 2**20:.1f} MiB ({d['bytes'] / csr_bytes:.2f}x)", flush=True)
        X = rng.standard_normal((n, args.cols), dtype=np.float32)
        x = X[:, 0].copy()
        if "spmm" not in args.skip:
            for workers in (1, 2):
                with tensordb.connect(db(workers), workers=workers) as con:
                    con.load("G", G)
                    con.load("X", X)
                    con.load("v", x)
                    mm, mv = "Y[i,k] = SUM(G[i,j] * X[j,k])", "w[i] = SUM(G[i,j] * v[j])"
                    con.execute(mm)
                    con.execute(mv)
                    np.testing.assert_allclose(con.tensor("Y"), G @ X, rtol=1e-4, atol=1e-3)
                    np.testing.assert_allclose(con.tensor("w"), G @ x, rtol=1e-4, atol=1e-3)
                    t = alternate({"mm": lambda: con.execute(mm), "mm_sp": lambda: G @ X,
                                   "mv": lambda: con.execute(mv), "mv_sp": lambda: G @ x},
                                  args.runs)
                    bal = [ln.strip() for ln in con.explain(mm).splitlines() if "balance:" in ln]
                    pieces = [re.split(r"\s{2,}", ln.strip())[2] for ln in
                              con.explain(mm).splitlines() if "SUM(G" in ln][0]
                c = dict(CPU)
                print(f"{workers} worker(s) ({pieces}): SpMM x{args.cols} {1e3 * t['mm']:.0f} ms "
                      f"against scipy {1e3 * t['mm_sp']:.0f} ms ({t['mm'] / t['mm_sp']:.2f}x; "
                      f"CPU {c['mm'] / c['mm_sp']:.2f}x); "
                      f"SpMV {1e3 * t['mv']:.1f} ms against scipy {1e3 * t['mv_sp']:.1f} ms "
                      f"({t['mv'] / t['mv_sp']:.2f}x; CPU {c['mv'] / c['mv_sp']:.2f}x)"
                      + (f"; {bal[0]}" if bal else ""), flush=True)
        if "pagerank" not in args.skip:
            out = np.asarray(G.sum(axis=1)).ravel()   # out-weight: node i's edges are row i
            M = sp.csr_array(G.T.multiply(1.0 / np.maximum(out, 1)).astype(np.float64))
            dangling = (out == 0).astype(np.float64)
            tol = args.pr_tol
            with tensordb.connect(db("pr"), workers=2) as con:
                con.load("pr_M", M)
                con.load("pr_dangling", dangling)
                step = pagerank_step(n)

                def td():
                    con.load("pr_r", np.full(n, 1.0 / n), replace=True)
                    for s in range(1, 501):
                        con.execute(step)
                        if float(con.tensor("pr_err")) < tol:
                            return s
                t = alternate({"td": td, "sp": lambda: scipy_pagerank(M, dangling, n, tol)},
                              args.pr_runs)
                steps = td()
                want, sp_steps = scipy_pagerank(M, dangling, n, tol)
                np.testing.assert_allclose(con.tensor("pr_r"), want, rtol=1e-9, atol=1e-15)
            print(f"PageRank: {steps} steps ({sp_steps} in scipy), tensordb (2 workers) "
                  f"{t['td']:.2f} s ({1e3 * t['td'] / steps:.1f} ms a step) against scipy "
                  f"{t['sp']:.2f} s ({1e3 * t['sp'] / sp_steps:.1f} ms a step): "
                  f"{t['td'] / t['sp']:.2f}x (CPU {CPU['td'] / CPU['sp']:.2f}x)", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
