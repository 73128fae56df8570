"""Element-sparse tensors on a GPU (``executor="gpu"``: CSR tiles as cupyx.scipy.sparse) against
cupyx itself and scipy on the host.

Run on a machine with an NVIDIA GPU and CuPy (tests/bench/gpu_device.sh, part ``spbench``):

    python -m tests.bench.bench_gpu_sparse --json gpu_sparse.json

An R-MAT graph (tests/bench/bench_sparse_graph.py's ``rmat``: ``--scale`` 20, 1,048,576 nodes,
``--edge-factor`` 10, repeats summed, float32 weights) in an in-memory database. Each figure is
the median of ``--repeat`` runs after one warm-up, the peers alternated with tensordb:

- ``Y[i,k] = SUM(G[i,j] * X[j,k])`` (SpMM, X of ``--cols`` columns) and ``w[i] = SUM(G[i,j] *
  v[j])`` (SpMV), and ``C[i,k] = SUM(H[i,j] * H[j,k])`` (SpGEMM, H an R-MAT graph of
  ``--spgemm-scale`` 14, edge factor 8, float64);
- tensordb ``stored``: stored inputs to a stored result, ``con.execute`` (plan cached; the
  device cache holds G and X from the last run; the result copied back and written);
  ``run``: its executor's part (``con.last_run.seconds``);
- cupyx ``device``: the same product on device-resident arrays, synchronised;
  ``device->host``: the same with the result copied back to the host (what a stored result
  needs at the least);
- scipy: host arrays to a host result (one thread).

Every tensordb answer is checked against scipy's. ``--dry-run`` checks this script without a
GPU: small sizes, tensordb on ``executor="local"``, numpy/scipy standing in for CuPy/cupyx.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402
from tests.bench.bench_sparse_graph import rmat  # noqa: E402


def _modules(dry: bool):
    """(cupy, cupyx.scipy.sparse, synchronise) or numpy/scipy's stand-ins in a dry run."""
    if dry:
        import scipy.sparse as xsp
        return np, xsp, lambda: None
    import cupy
    import cupyx.scipy.sparse as xsp
    return cupy, xsp, lambda: cupy.cuda.Device().synchronize()


def _graph(scale: int, edge_factor: int, dtype, rng):
    import scipy.sparse as sp
    n = 1 << scale
    i, j = rmat(scale, edge_factor, rng)
    G = sp.csr_matrix((np.ones(i.size, dtype), (i.astype(np.int32), j.astype(np.int32))),
                      shape=(n, n))
    G.sum_duplicates()
    return G


def _alternate(fns: dict, sync, repeat: int) -> dict:
    """Median seconds of each function, one warm-up each, then run in turn ``repeat`` times."""
    for fn in fns.values():
        fn()
        sync()
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _row(name, t, run, extra, rows, out):
    row = {"workload": name, "tensordb_stored_ms": 1e3 * t["td"], "tensordb_run_ms": 1e3 * run,
           "cupyx_device_ms": 1e3 * t["dev"], "cupyx_device_to_host_ms": 1e3 * t["d2h"],
           "scipy_ms": 1e3 * t["sp"], **extra}
    rows.append(row)
    print(f"{name}: tensordb stored {row['tensordb_stored_ms']:.2f} ms (run "
          f"{row['tensordb_run_ms']:.2f}), cupyx device {row['cupyx_device_ms']:.2f} ms, with the "
          f"result to the host {row['cupyx_device_to_host_ms']:.2f} ms, scipy "
          f"{row['scipy_ms']:.2f} ms; stored / device->host "
          f"{t['td'] / t['d2h']:.2f}x, stored / scipy {t['td'] / t['sp']:.2f}x", flush=True)
    if out:
        Path(out).write_text(json.dumps(rows, indent=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=int, default=20)
    p.add_argument("--edge-factor", type=int, default=10)
    p.add_argument("--cols", type=int, default=64)
    p.add_argument("--spgemm-scale", type=int, default=14)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", default="")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.dry_run:
        args.scale, args.spgemm_scale, args.repeat = min(args.scale, 12), min(args.spgemm_scale, 9), 2
    xp, xsp, sync = _modules(args.dry_run)
    executor = "local" if args.dry_run else "gpu"
    rng = np.random.default_rng(0)
    G = _graph(args.scale, args.edge_factor, np.float32, rng)
    n = G.shape[0]
    X = rng.standard_normal((n, args.cols), dtype=np.float32)
    x = X[:, 0].copy()
    print(f"R-MAT scale {args.scale}: {n:,} nodes, {G.nnz:,} stored entries; SpGEMM on scale "
          f"{args.spgemm_scale}; executor {executor}; medians of {args.repeat}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    rows: list = []
    Gd, Xd, xd = xsp.csr_matrix(G), xp.asarray(X), xp.asarray(x)
    host = (lambda a: a) if args.dry_run else (lambda a: a.get())
    with tensordb.connect(executor=executor) as con:
        con.load("G", G)
        con.load("X", X)
        con.load("v", x)
        for name, sql, out, dev, ref in (
                (f"SpMM x{args.cols}", "Y[i,k] = SUM(G[i,j] * X[j,k])", "Y", lambda: Gd @ Xd,
                 lambda: G @ X),
                ("SpMV", "w[i] = SUM(G[i,j] * v[j])", "w", lambda: Gd @ xd, lambda: G @ x)):
            con.execute(sql)
            np.testing.assert_allclose(con.tensor(out), ref(), rtol=1e-4, atol=1e-3)
            runs = []

            def td(sql=sql):
                con.execute(sql)
                runs.append(con.last_run.seconds)
            t = _alternate({"td": td, "dev": dev, "d2h": lambda dev=dev: host(dev()), "sp": ref},
                           sync, args.repeat)
            plan = [ln.strip() for ln in con.explain(sql).splitlines() if "spm" in ln][:1]
            _row(name, t, statistics.median(runs), {"kernel": plan[0] if plan else ""}, rows,
                 args.json)
    H = _graph(args.spgemm_scale, 8, np.float64, rng)
    Hd = xsp.csr_matrix(H)
    with tensordb.connect(executor=executor) as con:
        con.load("H", H)
        sql = "C[i,k] = SUM(H[i,j] * H[j,k])"
        con.execute(sql)
        want = H @ H
        got = con.sparse("C")
        assert abs(got - want).max() <= 1e-9 * max(1.0, abs(want).max()), "SpGEMM differs"
        runs = []

        def td():
            con.execute(sql)
            runs.append(con.last_run.seconds)

        def d2h():
            c = Hd @ Hd
            return (c.data, c.indices, c.indptr) if args.dry_run else (c.data.get(), c.indices.get(),
                                                                      c.indptr.get())
        t = _alternate({"td": td, "dev": lambda: Hd @ Hd, "d2h": d2h, "sp": lambda: H @ H}, sync,
                       args.repeat)
        _row(f"SpGEMM H @ H ({H.shape[0]:,} nodes, {H.nnz:,} entries, {want.nnz:,} out)", t,
             statistics.median(runs), {}, rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
