"""SpMV on 1 worker (run by hand): the kernel's direct call of scipy's ``csr_matvec`` into the
output's rows (exec/sparse_kernels._direct) against the path before it (scipy's product per slab
of rows, copied in) and scipy's own ``G @ x``, alternating in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_sparse_spmv_ab

The R-MAT graph of bench_sparse_scale (``--scale`` 20: 1,048,576 nodes, 10.2M stored entries,
float32), an in-memory database; the minimum and median wall and process CPU milliseconds of
``--runs`` calls each; the answers checked against scipy's bytes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402
import tensordb.exec.sparse_kernels as kernels  # noqa: E402
from tests.bench.bench_sparse_graph import rmat  # noqa: E402


def main(argv=None) -> None:
    import scipy.sparse as sp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    n = 1 << args.scale
    i, j = rmat(args.scale, 10, rng)
    v = np.ones(i.size, np.float32)
    G = sp.csr_array(sp.coo_array((v, (i.astype(np.int32), j.astype(np.int32))), shape=(n, n)))
    G.sum_duplicates()
    x = rng.standard_normal(n, dtype=np.float32)
    direct = kernels._direct
    mv = "w[i] = SUM(G[i,j] * v[j])"
    with tensordb.connect(None, workers=1) as con:
        con.load("G", G)
        con.load("v", x)
        con.execute(mv)
        assert con.tensor("w").tobytes() == (G @ x).tobytes()

        def before():
            kernels._direct = lambda *a: None
            try:
                con.execute(mv)
            finally:
                kernels._direct = direct
        fns = {"direct": lambda: con.execute(mv), "before": before, "scipy": lambda: G @ x}
        wall = {k: [] for k in fns}
        cpu = {k: [] for k in fns}
        for _ in range(args.runs):
            for k, fn in fns.items():
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
        assert con.tensor("w").tobytes() == (G @ x).tobytes()
    print(f"R-MAT scale {args.scale}, SpMV on 1 worker, {args.runs} runs alternated; load average "
          f"{os.getloadavg()[0]:.1f}")
    for k in fns:
        print(f"  {k}: wall min {1e3 * min(wall[k]):.1f} ms, median "
              f"{1e3 * statistics.median(wall[k]):.1f} ms; CPU min {1e3 * min(cpu[k]):.1f} ms, "
              f"median {1e3 * statistics.median(cpu[k]):.1f} ms")


if __name__ == "__main__":
    main()
