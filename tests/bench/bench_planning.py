"""Planning benchmark (run by hand): EXPLAIN of a deep MLP script, end to end, with each stage.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_planning.py
    ... bench_planning.py --layers 500 --workers 64 --profile   # cProfile of one EXPLAIN

The script has one statement per layer, ``H{k}[b,f] = RELU(SUM(H{k-1}[b,d] * W{k}[d,f]) +
c{k}[f])``, which binds to two operations (the product, then the bias and RELU): 50 layers are
100 operations, 500 layers 1,000. X is 8192 x 256 float32 and every W{k} 256 x 256, all stored
(a real catalog in a temporary directory, made once per layer count). Each figure is the median
of ``--runs`` EXPLAINs of the whole script; the stages are TENSORDB_DEBUG=1's stage timings
(parse, bind, optimize, lower, place), "other" the rest of the wall time (the session, opening
the inputs, rendering the EXPLAIN text). Each EXPLAIN plans afresh: the plan cache is emptied
and the parsed statements forgotten before each one; the bound statements stay cached (as the
code before the one engine kept them: ``_forget_plans``) unless ``--rebind``. Then the fixed
cost of a small statement (``small_query``).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import re
import statistics
import sys
import tempfile
import time

import numpy as np

import tensordb
from tensordb.dialect import parser

STAGES = ("parse", "bind", "optimize", "lower", "place")


def mlp_script(layers: int) -> str:
    lines, prev = [], "X"
    for k in range(layers):
        lines.append(f"H{k}[b,f] = RELU(SUM({prev}[b,d] * W{k}[d,f]) + c{k}[f]);")
        prev = f"H{k}"
    return "\n".join(lines)


def make_db(path: str, layers: int, batch: int = 8192, width: int = 256) -> None:
    rng = np.random.default_rng(0)
    with tensordb.connect(path) as con:
        con.load("X", rng.standard_normal((batch, width), dtype=np.float32))
        for k in range(layers):
            con.load(f"W{k}", rng.standard_normal((width, width), dtype=np.float32))
            con.load(f"c{k}", rng.standard_normal((width,), dtype=np.float32))


def _forget_plans(con, rebind: bool = False) -> None:
    """Empty the plan cache and forget the statements parsed (where the version measured has
    them: the script also measures older versions). The bound statement groups stay cached
    unless ``rebind``, as in the code before the one engine (0ffefdc), whose plan cache held
    only plans (its bound groups were kept apart, and its runs of this script bound once): a
    side-by-side run compares the same work."""
    cache = getattr(con, "_plan_cache", None)
    if cache is not None:
        try:
            cache.clear(bound=rebind)
        except TypeError:  # an older PlanCache: plans only (its BoundCache is con._bound)
            cache.clear()
    if rebind and hasattr(con, "_bound"):
        con._bound = type(con._bound)()
    forget = getattr(parser, "forget_parsed", None)
    if forget is not None:
        forget()


def staged(fn) -> tuple[float, float, dict[str, float]]:
    """(wall seconds, process CPU seconds, {stage: seconds}) of one call of ``fn``, its stages
    read from the lines ``TENSORDB_DEBUG=1`` prints (a stage seen twice is summed)."""
    err = io.StringIO()
    old = os.environ.get("TENSORDB_DEBUG")
    os.environ["TENSORDB_DEBUG"] = "1"
    try:
        with contextlib.redirect_stderr(err):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        if old is None:
            del os.environ["TENSORDB_DEBUG"]
        else:
            os.environ["TENSORDB_DEBUG"] = old
    stages: dict[str, float] = {}
    for name, ms in re.findall(r"\[tensordb\] (\w+)\s+([\d.]+) ms", err.getvalue()):
        stages[name] = stages.get(name, 0.0) + float(ms) / 1e3
    return total, cpu, stages


def timed_explain(con, sql: str, rebind: bool = False) -> tuple[float, dict[str, float]]:
    """(seconds end to end, {stage: seconds}) of one EXPLAIN of ``sql``; ``stages["cpu"]`` is
    the process's CPU time for it (less sensitive than wall time to a shared machine)."""
    total, cpu, seen = staged(lambda: con.explain(sql))
    _forget_plans(con, rebind)  # the next EXPLAIN plans again
    stages = {name: seen.get(name, 0.0) for name in STAGES}
    stages["cpu"] = cpu
    return total, stages


def measure(path: str, layers: int, workers: int, runs: int,
            rebind: bool = False) -> dict[str, float]:
    sql = mlp_script(layers)
    with tensordb.connect(path) as con:
        con.set("workers", workers)
        con.explain(mlp_script(1))  # the grammar and the first connection's warm-up
        samples = []
        for _ in range(runs):
            # each EXPLAIN starts from a collected heap: where the cyclic collector's full
            # collections fall (one every few EXPLAINs, 30-160 ms each) is otherwise a matter
            # of what ran before, not of the code measured
            gc.collect()
            samples.append(timed_explain(con, sql, rebind))
    out = {"total": statistics.median(t for t, _ in samples),
           "cpu": statistics.median(st["cpu"] for _, st in samples)}
    for s in STAGES:
        out[s] = statistics.median(st[s] for _, st in samples)
    out["other"] = max(0.0, out["total"] - sum(out[s] for s in STAGES))
    return out


def small_query(root: str, runs: int) -> None:
    """The fixed cost of one small statement, parse to stored result: a 64 x 64 float32 matmul,
    planned every time (the plan cache emptied) and with its plan cached, in memory and on disk
    (where the payload and the catalog are fsynced at commit); and the cost per operation of a
    script of 60 small ones (a softmax-like chain over 512 x 16, one stored result), its
    plan cached."""
    print("\n| 64x64 matmul, parse to stored result | median | CPU (median) | fastest tenth | "
          "stages (median) |")
    print("|---|---:|---:|---:|---|")
    rng = np.random.default_rng(0)
    for where in (None, os.path.join(root, "small.tdb")):
        with tensordb.connect(where, workers=2) as con:
            for name in "AB":
                con.load(name, rng.standard_normal((64, 64), dtype=np.float32), replace=True)
            sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
            for cached in (False, True):
                samples = []
                for _ in range(runs):
                    if not cached:
                        _forget_plans(con)
                    total, cpu, stages = staged(lambda: con.execute(sql))
                    samples.append((total, cpu, {n: 1e3 * t for n, t in stages.items()}))
                names = sorted({n for _, _, st in samples for n in st},
                               key=lambda n: ("parse bind optimize lower place run commit".split() + [n]).index(n))
                split = ", ".join(f"{n} {statistics.median(st.get(n, 0.0) for _, _, st in samples):.2f}"
                                  for n in names)
                label = f"{'on disk' if where else 'in memory'}, {'plan cached' if cached else 'planned'}"
                _row(label, samples, split)
    chain_script = " ".join(
        f"LET M{k}[b] = MAX(A{k - 1}[b,c]); LET A{k}[b,c] = EXP(A{k - 1}[b,c] - M{k}[b]) * Y[b,c];"
        for k in range(1, 30))
    chain_script = "LET A0[b,c] = Z[b,c] * Y[b,c]; " + chain_script + " OUT[b,c] = A29[b,c] + 1;"
    for where in (None, os.path.join(root, "chain.tdb")):
        with tensordb.connect(where, workers=2) as con:
            for name in "ZY":
                con.load(name, rng.standard_normal((512, 16), dtype=np.float32), replace=True)
            con.execute(chain_script)  # planned once: the runs below reuse the plan
            samples = [staged(lambda: con.execute(chain_script)) for _ in range(runs)]
            split = ", ".join(f"{n} {statistics.median(1e3 * st.get(n, 0.0) for _, _, st in samples):.2f}"
                              for n in ("bind", "run", "commit"))
            _row(f"a chain of 60 small operations (512 x 16), "
                 f"{'on disk' if where else 'in memory'}, plan cached", samples, split)


def _row(label: str, samples, split: str) -> None:
    walls = sorted(t for t, _, _ in samples)
    print(f"| {label} | {1e3 * statistics.median(walls):.2f} ms | "
          f"{1e3 * statistics.median(c for _, c, _ in samples):.2f} ms | "
          f"{1e3 * walls[len(walls) // 10]:.2f} ms | {split} (ms) |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="*", default=[50, 500])
    ap.add_argument("--workers", type=int, nargs="*", default=[4, 16, 64])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile one EXPLAIN per case")
    ap.add_argument("--dir", default=None, help="keep the catalogs here (made when missing)")
    ap.add_argument("--rebind", action="store_true",
                    help="bind the script again for every EXPLAIN (the bound groups forgotten too)")
    ap.add_argument("--small-runs", type=int, default=101, help="runs of the small query")
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="tensordb-bench-planning-")
    print(f"| ops | workers | total | CPU | {' | '.join(STAGES)} | other |")
    print("|---:|---:|---:|---:|" + "---:|" * (len(STAGES) + 1))
    for layers in args.layers:
        path = os.path.join(root, f"mlp{layers}.tdb")
        if not os.path.exists(path):
            make_db(path, layers)
        for workers in args.workers:
            if args.profile:
                import cProfile
                import pstats
                with tensordb.connect(path) as con:
                    con.set("workers", workers)
                    con.explain(mlp_script(1))
                    prof = cProfile.Profile()
                    prof.runcall(con.explain, mlp_script(layers))
                pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
                continue
            m = measure(path, layers, workers, args.runs, args.rebind)
            cells = " | ".join(f"{1e3 * m[s]:.0f} ms" for s in STAGES + ("other",))
            print(f"| {2 * layers} | {workers} | {1e3 * m['total']:.0f} ms | {1e3 * m['cpu']:.0f} ms "
                  f"| {cells} |", flush=True)
    if not args.profile and args.small_runs:
        small_query(root, args.small_runs)


if __name__ == "__main__":
    main()
