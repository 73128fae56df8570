"""The output-nonzeros estimate of SpGEMM on R-MAT graphs against the product's real nonzeros.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_sparse_estimate

For each ``--scales`` (Graph500 R-MAT, a, b, c = 0.57, 0.19, 0.19, 8 edges a node drawn, self
loops dropped, repeats summed; tests/bench/bench_sparse_graph.py's generator), G is loaded into an
in-memory database and ``EXPLAIN C[i,k] = SUM(G[i,j] * G[j,k])`` gives the planner's estimate of
C's nonzeros (optimizer/sparse_cost.py ``reach_nnz``) and the time EXPLAIN took (the estimate
reads every row of G's CSR tiles once). Beside it: the earlier estimate (entries independent and
uniform), the products (``sum_j colcount(j) * rowcount(j)``, the upper bound) and the real
nonzeros: counted exactly by scipy where the product fits a minute (``--exact-up-to`` scale), else
from ``--sample`` rows drawn at random, each row's output counted exactly by scipy and scaled by
n / rows (with the standard error of that mean).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402
from tests.bench.bench_sparse_graph import rmat  # noqa: E402


def graph(scale: int, seed: int = 1) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    i, j = rmat(scale, 8, rng)
    keep = i != j
    n = 1 << scale
    g = sp.csr_array(sp.coo_array((np.ones(int(keep.sum()), np.float32), (i[keep], j[keep])),
                                  shape=(n, n)))
    g.sum_duplicates()
    return g


def real_nnz(g: sp.csr_array, exact: bool, sample: int, seed: int = 2):
    """(nonzeros, standard error or 0 where counted exactly)."""
    p = g.copy()
    p.data[:] = 1
    if exact:
        return (p @ p).nnz, 0.0
    n = g.shape[0]
    rows = np.random.default_rng(seed).choice(n, size=min(sample, n), replace=False)
    per = np.diff((p[rows] @ p).indptr).astype(np.float64)
    return per.mean() * n, per.std(ddof=1) / math.sqrt(per.size) * n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="11,14,16,20")
    ap.add_argument("--exact-up-to", type=int, default=16)
    ap.add_argument("--sample", type=int, default=4096)
    args = ap.parse_args()
    print("| R-MAT scale | nodes | stored edges | products (upper bound) | uniform estimate | "
          "estimate (now) | real nonzeros | estimate / real | uniform / real | EXPLAIN |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scale in (int(s) for s in args.scales.split(",")):
        g = graph(scale)
        n = g.shape[0]
        products = int(np.diff(g.indptr).astype(np.int64) @ np.bincount(g.indices, minlength=n))
        ps = g.nnz / n / n
        uniform = n * n * -math.expm1(n * math.log1p(-ps * ps))
        with tensordb.connect(workers=2) as con:
            con.load("G", g)
            t = time.perf_counter()
            node = json.loads(con.explain("C[i,k] = SUM(G[i,j] * G[j,k])", format="json"))["nodes"][0]
            took = time.perf_counter() - t
        est = node["output_nnz"]["estimated"]
        exact = scale <= args.exact_up_to
        real, se = real_nnz(g, exact, args.sample)
        shown = f"{real:,.0f}" if exact else f"{real:,.0f} +- {se:,.0f} (sample of {args.sample:,} rows)"
        print(f"| {scale} | {n:,} | {g.nnz:,} | {products:,} | {uniform:,.0f} | {est:,} | {shown} | "
              f"{est / real:.2f} | {uniform / real:.3f} | {took * 1e3:,.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
