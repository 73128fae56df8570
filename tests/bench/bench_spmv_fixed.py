"""The small SpMV's fixed cost (run by hand): tensordb's plan-cached ``w[i] = SUM(G[i,j] * v[j])``
and ``Y[i,k] = SUM(G[i,j] * X[j,k])`` alternated with scipy's ``G @ x`` in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_spmv_fixed \
        [--workers 1 2] [--n 300] [--profile]

The issue's graph (``--nodes`` 50,000, ``--edges`` 500,000 random float32 edges, as
bench_sparse_peers ``--sections issue``), in memory; medians and minimums of ``--n`` calls each,
wall and process CPU, the answers checked against scipy's. ``--profile``: cProfile of ``--n``
SpMV statements on the first worker count, the top functions by own time. ``--rmat`` SCALE:
bench_sparse_scale's R-MAT graph of that scale instead.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402


def graph(nodes: int, edges: int, cols: int):
    import scipy.sparse as sp
    rng = np.random.default_rng(0)
    i = rng.integers(0, nodes, edges, dtype=np.int32)
    j = rng.integers(0, nodes, edges, dtype=np.int32)
    G = sp.csr_array(sp.coo_array((rng.random(edges, dtype=np.float32) + 0.5, (i, j)),
                                  shape=(nodes, nodes)))
    G.sum_duplicates()
    X = rng.standard_normal((nodes, cols), dtype=np.float32)
    return G, X, X[:, 0].copy()


def rmat_graph(scale: int, cols: int):
    import scipy.sparse as sp
    from tests.bench.bench_sparse_graph import rmat
    rng = np.random.default_rng(0)
    n = 1 << scale
    i, j = rmat(scale, 10, rng)
    G = sp.csr_array(sp.coo_array((np.ones(i.size, np.float32), (i.astype(np.int32),
                                                                 j.astype(np.int32))), shape=(n, n)))
    G.sum_duplicates()
    X = rng.standard_normal((n, cols), dtype=np.float32)
    return G, X, X[:, 0].copy()


def ab(fns: dict, n: int) -> dict:
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(n):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {k: (statistics.median(wall[k]), min(wall[k]), statistics.median(cpu[k])) for k in fns}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--edges", type=int, default=500_000)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--mm-n", type=int, default=40)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rmat", type=int, default=0,
                    help="bench_sparse_scale's R-MAT graph of this scale instead (edge factor 10)")
    args = ap.parse_args(argv)
    G, X, x = graph(args.nodes, args.edges, args.cols) if not args.rmat else rmat_graph(
        args.rmat, args.cols)
    mv, mm = "w[i] = SUM(G[i,j] * v[j])", "Y[i,k] = SUM(G[i,j] * X[j,k])"
    print(f"{args.nodes:,} nodes, {G.nnz:,} stored; load {os.getloadavg()}", flush=True)
    for workers in args.workers:
        with tensordb.connect(None, workers=workers) as con:
            con.load("G", G)
            con.load("v", x)
            con.load("X", X)
            con.execute(mv)
            con.execute(mm)
            np.testing.assert_allclose(con.tensor("w"), G @ x, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(con.tensor("Y"), G @ X, rtol=1e-5, atol=1e-4)
            if args.profile and workers == args.workers[0]:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.n):
                    con.execute(mv)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                pstats.Stats(prof).sort_stats("cumtime").print_stats(40)
            t = ab({"td": lambda: con.execute(mv), "sp": lambda: G @ x}, args.n)
            print(f"{workers} worker(s) SpMV: tensordb median {1e3 * t['td'][0]:.3f} ms (min "
                  f"{1e3 * t['td'][1]:.3f}, CPU {1e3 * t['td'][2]:.3f}); scipy {1e3 * t['sp'][0]:.3f}"
                  f" ms (min {1e3 * t['sp'][1]:.3f}, CPU {1e3 * t['sp'][2]:.3f}); ratio {t['td'][0] / t['sp'][0]:.2f}x "
                  f"(min {t['td'][1] / t['sp'][1]:.2f}x); load {os.getloadavg()[0]:.2f}", flush=True)
            if args.mm_n:
                t = ab({"td": lambda: con.execute(mm), "sp": lambda: G @ X}, args.mm_n)
                print(f"{workers} worker(s) SpMM x{args.cols}: tensordb median "
                      f"{1e3 * t['td'][0]:.2f} ms (CPU {1e3 * t['td'][2]:.2f}); scipy "
                      f"{1e3 * t['sp'][0]:.2f} ms (CPU {1e3 * t['sp'][2]:.2f}); ratio {t['td'][0] / t['sp'][0]:.2f}x (min "
                      f"{t['td'][1] / t['sp'][1]:.2f}x); load {os.getloadavg()[0]:.2f}", flush=True)
            np.testing.assert_allclose(con.tensor("w"), G @ x, rtol=1e-5, atol=1e-4)


if __name__ == "__main__":
    main()
