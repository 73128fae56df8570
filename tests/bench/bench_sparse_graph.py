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

Then (``--rmat-scale``, default 17: an R-MAT graph of 131,072 nodes and 8 edges a node, Graph500's
parameters a, b, c = 0.57, 0.19, 0.19; weights 1-10), against python-graphblas
(SuiteSparse:GraphBLAS) at the same thread count as tensordb's workers, and scipy.sparse
(one thread): single-source shortest paths by repeated min-plus (``dist[k] = MIN(dist[j] +
D[j,k])`` over D of fill +inf, with 0-weight self loops, as many steps as GraphBLAS needs to
converge, the answer checked against scipy.sparse.csgraph's Dijkstra), and the triangle count
``SUM(A[i,j] * A[j,k] * A[k,i])`` of the undirected graph (a masked SpGEMM; checked against
GraphBLAS and scipy) on an R-MAT graph of ``--triangle-scale`` (default 13: 8,192 nodes; a
power-law graph's hubs make the count's work grow with the square of their degree, and scipy's
unmasked A @ A with it). Then min-plus ``MIN(D[i,j] + D[j,k])`` and SpGEMM ``SUM(G[i,j] *
G[j,k])`` of whole R-MAT graphs (``--product-scales``, default 11 and 14: 2,048 and 16,384
nodes), whose output tiles the kernels return as CSR (never dense), alternated with GraphBLAS
and scipy; every entry checked against theirs, read from the stored tiles.

The R-MAT section's database is on disk, each statement a durable commit (its payload and
DuckDB's WAL fsynced), unless ``--memory``; SSSP is timed also with its steps in one
``BEGIN ... COMMIT`` (one commit for all the steps), which is how a loop of small steps avoids
paying a durable commit a step.
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


def _done(result):
    """A GraphBLAS result with its pending work finished: python-graphblas runs non-blocking, and
    ``.new()`` may return before the product's last phase (measured: a 300,000-node SpGEMM's
    ``new()`` in 631 ms, then ``wait()`` 433 ms more), where tensordb's timing includes a usable
    stored result."""
    result.wait()
    return result

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
    ap.add_argument("--rmat-scale", type=int, default=17)
    ap.add_argument("--product-scales", default="11,14",
                    help="R-MAT scales of the whole-graph min-plus and SpGEMM, comma-separated "
                         "(17, the 131,072-node graph: 184M output entries, 42 s in GraphBLAS "
                         "on the shared machine)")
    ap.add_argument("--triangle-scale", type=int, default=13)
    ap.add_argument("--edge-factor", type=int, default=8,
                    help="R-MAT edges drawn a node for SSSP and triangles (8; Graph500 uses 16; "
                         "10 gives the issue's 10M edges at --rmat-scale 20)")
    ap.add_argument("--parts", default="sssp,triangles,products",
                    help="which of the R-MAT section's parts run, comma-separated")
    ap.add_argument("--scipy-max-work", type=float, default=2e9,
                    help="skip scipy's unmasked (A @ A) .* A triangle count when its products "
                         "(the sum of the squared degrees) exceed this (2e9: R-MAT scale 20 has "
                         "2.1e10, and A @ A billions of entries); GraphBLAS's masked count is "
                         "the check then")
    ap.add_argument("--uniform", default="",
                    help="NODES,EDGES: also min-plus and SpGEMM of a whole uniform random graph "
                         "of that size (1000000,10000000: ~100M output entries, feasible where "
                         "R-MAT scale 20's 3.1e9 are not)")
    ap.add_argument("--graph-only", action="store_true", help="only the R-MAT section")
    ap.add_argument("--memory", action="store_true",
                    help="the R-MAT section's database in memory (no fsync at each commit)")
    ap.add_argument("--products-only", action="store_true",
                    help="only the whole-graph min-plus and SpGEMM (graphs of their own seed)")
    args = ap.parse_args(argv)
    if args.products_only:
        import graphblas as gb
        import scipy.sparse as sp
        W = args.workers or 2
        gb.ss.config["nthreads"] = W
        for scale in [int(x) for x in str(args.product_scales).split(",") if x]:
            whole_graph_products(scale, W, args.runs, np.random.default_rng(2), gb, sp,
                                 args.memory)
        if args.uniform:
            nodes, edges = (int(x) for x in args.uniform.split(","))
            whole_graph_products(None, W, args.runs, np.random.default_rng(2), gb, sp,
                                 args.memory, uniform=(nodes, edges))
        return
    if args.graph_only:
        graph_section(args)
        return
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
    graph_section(args)


def rmat(scale: int, edge_factor: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Graph500's R-MAT edges (a, b, c = 0.57, 0.19, 0.19): 2**scale nodes, edge_factor edges
    a node, self loops and repeats kept (the caller drops or sums them), nodes permuted."""
    n, m = 1 << scale, edge_factor << scale
    i = np.zeros(m, np.int64)
    j = np.zeros(m, np.int64)
    for bit in range(scale):
        r = rng.random(m)
        down = r >= 0.57 + 0.19          # quadrants c or d: the row bit is set
        right = ((r >= 0.57) & (r < 0.76)) | (r >= 0.95)  # quadrants b or d: the column bit
        i |= down.astype(np.int64) << bit
        j |= right.astype(np.int64) << bit
    perm = rng.permutation(n)
    return perm[i], perm[j]


def graph_section(args) -> None:
    import graphblas as gb
    import scipy.sparse as sp
    from scipy.sparse.csgraph import shortest_path
    W = args.workers or 2
    gb.ss.config["nthreads"] = W
    parts = set(args.parts.split(","))
    rng = np.random.default_rng(1)
    i, j = rmat(args.rmat_scale, args.edge_factor, rng)
    n = 1 << args.rmat_scale
    keep = i != j
    i, j = i[keep], j[keep]
    w = rng.integers(1, 11, i.size).astype(np.float64)
    D = sp.csr_array(sp.coo_array((w, (i, j)), shape=(n, n)))
    D.sum_duplicates()
    loops = D.tocoo()
    loops = sp.coo_array((np.r_[loops.data, np.zeros(n)], (np.r_[loops.row, np.arange(n)],
                                                            np.r_[loops.col, np.arange(n)])),
                         shape=(n, n))
    if "sssp" in parts:
        sssp(args, W, n, D, loops, gb, sp)
    if "triangles" in parts:
        triangles(args, W, rng, gb, sp)
    # the whole-graph products: their output tiles come back from the kernels as CSR
    if "products" in parts:
        for scale in [int(x) for x in str(args.product_scales).split(",") if x]:
            whole_graph_products(scale, W, args.runs, rng, gb, sp, args.memory)
        if args.uniform:
            nodes, edges = (int(x) for x in args.uniform.split(","))
            whole_graph_products(None, W, args.runs, rng, gb, sp, args.memory,
                                 uniform=(nodes, edges))


def sssp(args, W, n, D, loops, gb, sp) -> None:
    """Single-source shortest paths by min-plus steps, a statement a step, against GraphBLAS
    ``vxm`` steps; the answer checked against scipy.sparse.csgraph's Dijkstra."""
    from scipy.sparse.csgraph import shortest_path
    print(f"\nR-MAT scale {args.rmat_scale} (edge factor {args.edge_factor}): {n} nodes, {D.nnz} "
          f"weighted edges; tensordb {W} workers, GraphBLAS {W} threads, scipy 1 thread; medians "
          f"of {args.runs}; database {'in memory' if args.memory else 'on disk'}; load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    src = int(np.argmax(np.diff(D.indptr)))  # a hub: most of the graph is reachable
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-rmat-") as root:
        with tensordb.connect(_database(root, args.memory), workers=W) as con:
            con.load("D", loops, fill_value=np.inf)
            d0 = np.full(n, np.inf)
            d0[src] = 0.0
            # GraphBLAS: steps of v min.+ D until v stops changing
            G = gb.io.from_scipy_sparse(sp.csr_array(loops))
            def gb_sssp():
                v = gb.Vector.from_dense(d0, missing_value=np.inf)
                steps = 0
                while True:
                    nxt = v.vxm(G, gb.semiring.min_plus).new()
                    steps += 1
                    if nxt.isequal(v):
                        return nxt, steps
                    v = nxt
            gbv, steps = gb_sssp()
            t_gb = median_time(gb_sssp, args.runs)
            step = "CREATE OR REPLACE TENSOR dist[k] AS MIN(dist[j] + D[j,k])"

            def td_sssp():
                con.load("dist", d0, replace=True)
                for _ in range(steps):
                    con.execute(step)
            td_sssp()
            want = shortest_path(sp.csr_array(D), method="D", directed=True, indices=src)
            np.testing.assert_array_equal(con.tensor("dist"), want)
            np.testing.assert_array_equal(gbv.to_dense(fill_value=np.inf), want)
            t_td = median_time(td_sssp, args.runs)

            def td_sssp_block():  # the steps in one transaction: one commit, not one a step
                con.load("dist", d0, replace=True)
                con.execute("BEGIN; " + f"{step}; " * steps + "COMMIT;")
            td_sssp_block()
            np.testing.assert_array_equal(con.tensor("dist"), want)
            t_block = median_time(td_sssp_block, args.runs)
            t_dij = median_time(lambda: shortest_path(sp.csr_array(D), method="D", directed=True,
                                                      indices=src), args.runs)
            kernel = [k for k in con.explain(step.replace("CREATE OR REPLACE TENSOR dist[k] AS",
                                                          "x[k] ="))
                      .splitlines() if "MIN(dist" in k][0].split("  ")[-1].strip()
            print(f"SSSP, {steps} min-plus steps ({kernel}): tensordb {1e3 * t_td:.0f} ms "
                  f"({1e3 * t_td / steps:.1f} ms a step), GraphBLAS {1e3 * t_gb:.0f} ms "
                  f"({1e3 * t_gb / steps:.1f} ms a step); scipy csgraph Dijkstra "
                  f"{1e3 * t_dij:.0f} ms; answers equal")
            print(f"  the same {steps} steps in one BEGIN ... COMMIT: tensordb {1e3 * t_block:.0f} "
                  f"ms ({1e3 * t_block / steps:.1f} ms a step, {t_block / t_gb:.2f}x GraphBLAS); "
                  f"each statement alone {t_td / t_gb:.2f}x; database "
                  f"{'in memory' if args.memory else 'on disk'}")


def triangles(args, W, rng, gb, sp) -> None:
    """The triangle count of an undirected R-MAT graph (a masked SpGEMM), against GraphBLAS's
    masked ``mxm`` and, where its unmasked product is small enough, scipy's (A @ A) .* A."""
    ti, tj = rmat(args.triangle_scale, args.edge_factor, rng)
    tn = 1 << args.triangle_scale
    keep = ti != tj
    A = sp.csr_array(sp.coo_array((np.ones(int(keep.sum())), (ti[keep], tj[keep])), shape=(tn, tn)))
    del ti, tj, keep
    A = sp.csr_array(((A + A.T) > 0).astype(np.float64))
    deg = np.diff(A.indptr).astype(np.int64)
    work = int((deg ** 2).sum())
    use_scipy = work <= args.scipy_max_work
    print(f"\nR-MAT scale {args.triangle_scale} (edge factor {args.edge_factor}): {tn} nodes, "
          f"{A.nnz // 2} undirected edges, largest degree {int(deg.max())}; unmasked A @ A "
          f"{work:.3g} products ({'scipy timed' if use_scipy else 'over --scipy-max-work: scipy not run, GraphBLAS the check'}); "
          f"database {'in memory' if args.memory else 'on disk'}; load {os.getloadavg()[0]:.1f}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-rmat-") as root:
        with tensordb.connect(_database(root, args.memory), workers=W) as con:
            con.load("A", A)
            tri = "t = SUM(A[i,j] * A[j,k] * A[k,i])"
            M = gb.io.from_scipy_sparse(A)
            res = {}

            def gb_count():
                res["gb"] = M.mxm(M, gb.semiring.plus_pair).new(mask=M.S).reduce_scalar().new()

            t = alternate({"td": lambda: con.execute(tri), "gb": gb_count}, args.runs)
            got = float(con.tensor("t"))
            gb_count = res["gb"].value
            assert got == gb_count, (got, gb_count)
            t_sp = None
            if use_scipy:
                t_sp = median_time(lambda: (A @ A).multiply(A).sum(), args.runs)
                assert got == (A @ A).multiply(A).sum()
            kernel = [k for k in con.explain(tri).splitlines() if "SUM(A" in k][0].split("  ")[-1]
            print(f"triangles ({int(got) // 6} of them; {kernel.strip()}): tensordb "
                  f"{1e3 * t['td']:.0f} ms, GraphBLAS masked mxm {1e3 * t['gb']:.0f} ms "
                  f"({t['td'] / t['gb']:.2f}x; CPU {CPU['td']:.2f} s against {CPU['gb']:.2f} s)"
                  + ("" if t_sp is None else f", scipy (A @ A) .* A {1e3 * t_sp:.0f} ms")
                  + f"; answers equal; load {os.getloadavg()[0]:.1f}", flush=True)


CPU: dict = {}  # the last ``alternate``'s median process CPU seconds (every thread's)


def alternate(fns: dict, runs: int) -> dict:
    """The median seconds of each of ``fns``, called in turn ``runs`` times (so each sees the
    machine's load of the same moments); their median process CPU seconds in ``CPU``."""
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


def stored_csr(con, name: str, sp):
    """A stored matrix as one scipy CSR array of its stored entries (its CSR tiles as they
    are): the answer checked without a dense array."""
    reader = con.store.open(name)
    rows, cols, vals = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for e in reader.entries.values():
        assert e.format == "csr", (name, e.coords, e.format)
        t = reader.stored_tile(e.coords).tocoo()
        rows.append(t.row.astype(np.int64) + e.starts[0])
        cols.append(t.col.astype(np.int64) + e.starts[1])
        vals.append(t.data)
    return sp.csr_array(sp.coo_array((np.concatenate(vals), (np.concatenate(rows),
                                                             np.concatenate(cols))),
                                     shape=reader.meta.shape))


def _database(root: str, memory: bool):
    """The benchmark's database: a file under ``root``, or in memory (``--memory``)."""
    return None if memory else os.path.join(root, "g.tdb")


def whole_graph_products(scale, W: int, runs: int, rng, gb, sp, memory=False,
                         uniform=None) -> None:
    """min-plus ``MIN(D[i,j] + D[j,k])`` (D of fill +inf) and SpGEMM ``SUM(G[i,j] * G[j,k])``
    of a whole R-MAT graph of 2**scale nodes (or, with ``uniform=(nodes, edges)``, of a uniform
    random graph), against GraphBLAS (``W`` threads) and scipy (one), alternated; the answers
    (every entry, read from the stored CSR tiles) equal theirs."""
    if uniform is None:
        i, j = rmat(scale, 8, rng)
        n = 1 << scale
        label = f"R-MAT scale {scale}"
    else:
        n, m = uniform
        i, j = rng.integers(0, n, m), rng.integers(0, n, m)
        label = "uniform random graph"
    w = rng.integers(1, 11, i.size).astype(np.float64)
    S = sp.csr_array(sp.coo_array((w, (i, j)), shape=(n, n)))
    S.sum_duplicates()
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-rmat-") as root:
        with tensordb.connect(_database(root, memory), workers=W) as con:
            con.load("D", S, fill_value=np.inf)
            con.load("G", S)
            G = gb.io.from_scipy_sparse(S)
            mp = "P[i,k] = MIN(D[i,j] + D[j,k])"
            sg = "C[i,k] = SUM(G[i,j] * G[j,k])"
            con.execute(mp)
            want = gb.io.to_scipy_sparse(G.mxm(G, gb.semiring.min_plus).new(), format="csr")
            got = stored_csr(con, "P", sp)
            assert (got.indptr == want.indptr).all() and (got.indices == want.indices).all() \
                and (got.data == want.data).all()
            con.execute(sg)
            ref = S @ S
            assert abs(stored_csr(con, "C", sp) - ref).max() == 0
            print(f"\n{label}: {n} nodes, {S.nnz} edges; medians of {runs}, alternated "
                  f"(load {os.getloadavg()[0]:.1f}; database "
                  f"{'in memory' if memory else 'on disk'})", flush=True)
            kern = {q: [k for k in con.explain(q).splitlines() if q in k][0]
                    .split("  ")[-1].strip() for q in (mp, sg)}
            out = {q: next(line.strip() for line in con.explain(q).splitlines()
                           if "output nnz" in line) for q in (mp, sg)}
            t = alternate({"td": lambda: con.execute(mp),
                           "gb": lambda: _done(G.mxm(G, gb.semiring.min_plus).new())}, runs)
            print(f"min-plus D (x) D ({want.nnz} entries, stored {con.store.meta('P').nbytes / MiB:.1f}"
                  f" MiB; {kern[mp]}; {out[mp]}): tensordb {1e3 * t['td']:.1f} ms, GraphBLAS "
                  f"{1e3 * t['gb']:.1f} ms ({t['td'] / t['gb']:.2f}x; CPU {CPU['td']:.3f} s "
                  f"against {CPU['gb']:.3f} s: {CPU['td'] / CPU['gb']:.2f}x)", flush=True)
            t = alternate({"td": lambda: con.execute(sg), "sp": lambda: S @ S,
                           "gb": lambda: _done(G.mxm(G, gb.semiring.plus_times).new())}, runs)
            print(f"SpGEMM G @ G ({ref.nnz} entries, stored {con.store.meta('C').nbytes / MiB:.1f}"
                  f" MiB; {kern[sg]}; {out[sg]}): tensordb {1e3 * t['td']:.1f} ms, scipy "
                  f"{1e3 * t['sp']:.1f} ms, GraphBLAS {1e3 * t['gb']:.1f} ms "
                  f"({t['td'] / t['gb']:.2f}x GraphBLAS; CPU {CPU['td']:.3f} s, scipy "
                  f"{CPU['sp']:.3f} s, GraphBLAS {CPU['gb']:.3f} s: "
                  f"{CPU['td'] / CPU['gb']:.2f}x GraphBLAS); load {os.getloadavg()[0]:.1f}",
                  flush=True)

if __name__ == "__main__":
    main()
