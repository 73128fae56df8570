"""Element-sparse benchmark (run by hand): a random graph stored as sparse tiles, against scipy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_sparse_graph.py

A graph of --nodes nodes and --edges random edges (float32 weights; the few repeated edges are
summed, as scipy sums them) is written to a Parquet file and read into a DuckDB table ``edges``.
Figures, each the median of --runs: the stored bytes of G against scipy's CSR (data, int32
indices and row pointers); ``CREATE TENSOR G FROM (SELECT i, j, v FROM edges) INDEX (i, j) VALUE v``
(the whole statement, on disk: DuckDB's sort by tile, the tiles written and fsynced, the
catalog commit) and ``con.load`` of the scipy CSR matrix; ``Y[i,k] = SUM(G[i,j] * X[j,k])`` for a
dense X of --cols columns, planned afresh and with its plan cached, against scipy's ``G @ X``;
``con.sparse('G')`` (export to scipy). The product is checked against scipy once.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402

MiB = 2 ** 20


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import scipy.sparse as sp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--edges", type=int, default=500_000)
    ap.add_argument("--cols", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    n, m = args.nodes, args.edges
    rng = np.random.default_rng(0)
    i = rng.integers(0, n, m)
    j = rng.integers(0, n, m)
    v = rng.standard_normal(m, dtype=np.float32)
    csr = sp.csr_array(sp.coo_array((v, (i.astype(np.int32), j.astype(np.int32))), shape=(n, n)))
    csr.sum_duplicates()
    csr_bytes = csr.data.nbytes + csr.indices.nbytes + csr.indptr.nbytes
    X = rng.standard_normal((n, args.cols), dtype=np.float32)
    print(f"graph: {n} nodes, {m} edges ({csr.nnz} distinct), density {csr.nnz / n / n:.2e}; "
          f"X {n} x {args.cols} float32; medians of {args.runs}")
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-graph-") as root:
        pq.write_table(pa.table({"i": i, "j": j, "v": v}), os.path.join(root, "edges.parquet"))
        with tensordb.connect(os.path.join(root, "g.tdb"), workers=args.workers) as con:
            con.sql(f"CREATE TABLE edges AS SELECT * FROM read_parquet('{root}/edges.parquet')")
            load_sql = ("CREATE OR REPLACE TENSOR G FROM (SELECT i, j, v FROM edges) INDEX (i, j) "
                        f"VALUE v SHAPE ({n}, {n})")
            t_sql = median_time(lambda: con.execute(load_sql), args.runs)
            t_scipy_load = median_time(lambda: con.load("G2", csr, replace=True), args.runs)
            d = con.describe("G")
            con.load("X", X)
            sql = "Y[i,k] = SUM(G[i,j] * X[j,k])"
            con.execute(sql)
            np.testing.assert_allclose(con.tensor("Y"), csr @ X, rtol=1e-3, atol=1e-3)

            def fresh():
                con._plan_cache.clear()
                con.execute(sql)
            t_fresh = median_time(fresh, args.runs)
            t_cached = median_time(lambda: con.execute(sql), args.runs)
            kernel = [k for k in con.explain(sql).splitlines() if "SUM(G" in k][0].split()[-3:]
            t_scipy = median_time(lambda: csr @ X, args.runs)
            t_export = median_time(lambda: con.sparse("G"), args.runs)
            assert (con.sparse("G") != csr).nnz == 0
    print(f"stored: {d['bytes'] / MiB:.2f} MiB in {d['tile_count']} tile(s) of {d['tile_shape']} "
          f"(scipy CSR {csr_bytes / MiB:.2f} MiB: {d['bytes'] / csr_bytes:.2f}x)")
    print(f"CREATE TENSOR G FROM (SELECT ... edges) INDEX (i, j): {1e3 * t_sql:.0f} ms; "
          f"con.load(scipy CSR): {1e3 * t_scipy_load:.0f} ms")
    print(f"G @ X ({' '.join(kernel)}): {1e3 * t_fresh:.1f} ms planned afresh, "
          f"{1e3 * t_cached:.1f} ms plan cached; scipy G @ X {1e3 * t_scipy:.1f} ms")
    print(f"con.sparse('G'): {1e3 * t_export:.0f} ms")


if __name__ == "__main__":
    main()
