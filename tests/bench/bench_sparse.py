"""Block-sparse benchmark (run by hand): a block-sparse A times a dense B, stored to stored.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_sparse.py

A is n x n float32 on 256 x 256 tiles with 0.1%, 1% or 10% of its tiles present (the others are
absent: zeros, never stored), B is n x m dense. ``C[i,k] = SUM(A[i,j] * B[j,k])`` runs as a
statement (parse to committed result); next to it the same product in numpy on the dense A
(``A @ B``, the fastest numpy formulation of a plain matmul) and the kernel time alone (the
run's summed task seconds). "tensordb" plans every run afresh (the plan cache emptied), "plan
cached" is the same statement repeated; CPU columns are process CPU time (all threads), which
a machine shared with other work disturbs less than wall time. Every figure is the median of ``--runs``; the result is checked
against numpy once per density.

``tile loop`` (the issue's goal: stored to stored within 1.5x of the same tile products done
directly in numpy) is a numpy loop over exactly A's present tiles, each a contiguous 256 x 256
array as stored, ``C[rows of i] += A_ij @ B[rows of j]`` into a zeroed C (in memory, nothing
written; the faster median of numpy's BLAS threads and of one BLAS thread): timed in turn with tensordb in each run, its ratios to tensordb planned and plan
cached in the next columns, then the same in process CPU seconds against the one-thread loop's
(which a loaded machine disturbs less). ``--memory`` gives the in-memory database, the default one on disk:

Those columns take each plan cached run right after a planned one and within a few ms of
numpy's two-thread loop, whose idle OpenBLAS thread keeps spinning for about 0.1 s after it: a
core taken from tensordb's two workers (a cached run measured 1.7x its CPU and 2-3x its wall
time right after such a loop). The "back to back" columns time each side as a repeated
statement or loop runs, in blocks of ``BLOCK`` calls alternated (the loop on one BLAS
thread, on two, then ``SPIN`` seconds and tensordb plan cached), medians of the blocks' medians: tensordb on two
workers of one BLAS thread each against numpy's loop on two BLAS threads is like with like
(two cores each); the one-thread loop is there for a machine whose second core is busy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_sparse.py --densities 0.01 --runs 15 --memory
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
from tests.bench.bench_planning import staged  # noqa: E402

TILE = 256
BLOCK = 10  # calls a block of the back-to-back columns
SPIN = 0.3  # seconds OpenBLAS's idle threads may spin after numpy's two-thread loop


def block_sparse(rng, n: int, density: float) -> np.ndarray:
    t = n // TILE
    mask = rng.random((t, t)) < density
    if not mask.any():
        mask[0, 0] = True
    a = np.zeros((n, n), np.float32)
    for i, j in zip(*np.nonzero(mask)):
        a[i * TILE:(i + 1) * TILE, j * TILE:(j + 1) * TILE] = rng.standard_normal((TILE, TILE),
                                                                                 dtype=np.float32)
    return a


def present_tiles(a: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(tile row, tile column, a contiguous copy of the tile) of each tile of ``a`` not all zero."""
    t = a.shape[0] // TILE
    out = []
    for i in range(t):
        for j in range(t):
            blk = a[i * TILE:(i + 1) * TILE, j * TILE:(j + 1) * TILE]
            if blk.any():
                out.append((i, j, np.ascontiguousarray(blk)))
    return out


def tile_loop(tiles, b: np.ndarray) -> np.ndarray:
    """C = A @ B from A's present tiles only: each tile's product added into C's row tile."""
    c = np.zeros(b.shape, b.dtype)  # A is square: C has B's shape
    for i, j, blk in tiles:
        c[i * TILE:(i + 1) * TILE] += blk @ b[j * TILE:(j + 1) * TILE]
    return c


def tile_loop_1(tiles, b: np.ndarray) -> np.ndarray:
    """``tile_loop`` with one BLAS thread (threadpoolctl's limit timed with it)."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1, user_api="blas"):
        return tile_loop(tiles, b)


def timed(con, sql: str, cached: bool) -> tuple[float, dict[str, float]]:
    """(wall seconds, {stage: seconds, "cpu": process CPU seconds}) of one run of ``sql``,
    planned afresh unless ``cached`` (its plan from the plan cache)."""
    cache = getattr(con, "_plan_cache", None)  # older versions have none
    if not cached and cache is not None:
        cache.clear()
    total, cpu, stages = staged(lambda: con.execute(sql))
    return total, {**stages, "cpu": cpu}


def _block(fn) -> tuple[float, float]:
    """(median wall seconds, median process CPU seconds) of ``BLOCK`` calls of ``fn`` in a row."""
    wall, cpu = [], []
    for _ in range(BLOCK):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--densities", type=float, nargs="*", default=[0.001, 0.01, 0.1])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--memory", action="store_true",
                    help="an in-memory database (nothing fsynced) instead of one on disk")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    b = rng.standard_normal((args.n, args.m), dtype=np.float32)
    print(f"A {args.n}x{args.n} float32 on {TILE}x{TILE} tiles, B {args.n}x{args.m}, "
          + ("in memory" if args.memory else "on disk"))
    print("| tile density | tiles | tensordb | plan cached | kernels | lower | run | commit | "
          "numpy A @ B | speed-up | CPU: tensordb | CPU: numpy | CPU speed-up | tile loop | "
          "tensordb / tile loop | plan cached / tile loop | CPU: plan cached | "
          "CPU: tile loop, 1 thread | CPU: tensordb / loop | CPU: plan cached / loop | "
          "back to back: plan cached | loop, 2 threads | loop, 1 thread | "
          "cached / 2-thread loop | CPU: cached / 1-thread loop |")
    print("|---:|" * 1 + "---:|" * 24)
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-sparse-") as root:
        for density in args.densities:
            a = block_sparse(rng, args.n, density)
            np_times, np_cpu = [], []
            for _ in range(args.runs):
                t0, c0 = time.perf_counter(), time.process_time()
                ref = a @ b
                np_times.append(time.perf_counter() - t0)
                np_cpu.append(time.process_time() - c0)
            path = None if args.memory else os.path.join(root, f"d{density}")
            with tensordb.connect(path, workers=args.workers) as con:
                con.load("A", a, tile=(TILE, TILE))
                con.load("B", b, tile=(TILE, args.m))
                sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
                con.execute(sql)  # warm-up
                present = present_tiles(a)
                np.testing.assert_allclose(tile_loop(present, b), ref, rtol=1e-3, atol=1e-3)
                samples, kernels, cached, loop, loop1 = [], [], [], [], []
                cached_cpu, loop1_cpu = [], []
                for _ in range(args.runs):
                    samples.append(timed(con, sql, cached=False))
                    kernels.append(sum(m.seconds for m in con.last_run.ops))
                    w, st_ = timed(con, sql, cached=True)
                    cached.append(w)
                    cached_cpu.append(st_["cpu"])
                    t0 = time.perf_counter()
                    tile_loop(present, b)
                    loop.append(time.perf_counter() - t0)
                    t0, c0 = time.perf_counter(), time.process_time()
                    tile_loop_1(present, b)
                    loop1.append(time.perf_counter() - t0)
                    loop1_cpu.append(time.process_time() - c0)
                back = {"td": [], "l2": [], "l1": []}
                for _ in range(max(3, args.runs // 3)):
                    back["l1"].append(_block(lambda: tile_loop_1(present, b)))
                    back["l2"].append(_block(lambda: tile_loop(present, b)))
                    time.sleep(SPIN)  # numpy's idle BLAS thread stops spinning
                    con.execute(sql)  # the workers awake again
                    back["td"].append(_block(lambda: con.execute(sql)))
                np.testing.assert_allclose(con.tensor("C"), ref, rtol=1e-3, atol=1e-3)
                tiles = con.store.meta("A").tile_count
            total = statistics.median(t for t, _ in samples)

            def st(name):
                return statistics.median(s.get(name, 0.0) for _, s in samples)
            bk = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
                  for k, v in back.items()}
            npt, npc, cpu = statistics.median(np_times), statistics.median(np_cpu), st("cpu")
            lp = min(statistics.median(loop), statistics.median(loop1))
            cc = statistics.median(cached)
            ccpu, lcpu = statistics.median(cached_cpu), statistics.median(loop1_cpu)
            print(f"| {100 * density:g}% | {tiles} | {1e3 * total:.1f} ms | "
                  f"{1e3 * statistics.median(cached):.1f} ms | "
                  f"{1e3 * statistics.median(kernels):.1f} ms | {1e3 * st('lower'):.1f} ms | "
                  f"{1e3 * st('run'):.1f} ms | {1e3 * st('commit'):.1f} ms | {1e3 * npt:.0f} ms | "
                  f"{npt / total:.0f}x | {1e3 * cpu:.1f} ms | {1e3 * npc:.0f} ms | {npc / cpu:.0f}x | "
                  f"{1e3 * lp:.2f} ms | {total / lp:.1f}x | {cc / lp:.1f}x | {1e3 * ccpu:.1f} ms | "
                  f"{1e3 * lcpu:.2f} ms | {cpu / lcpu:.1f}x | {ccpu / lcpu:.1f}x | "
                  f"{1e3 * bk['td'][0]:.2f} ms | {1e3 * bk['l2'][0]:.2f} ms | "
                  f"{1e3 * bk['l1'][0]:.2f} ms | {bk['td'][0] / bk['l2'][0]:.2f}x | "
                  f"{bk['td'][1] / bk['l1'][1]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
