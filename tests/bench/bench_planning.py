"""Planning benchmark (run by hand): EXPLAIN of a deep MLP script, end to end, with each stage.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_planning.py
    ... bench_planning.py --layers 500 --workers 64 --profile   # cProfile of one EXPLAIN

The script has one statement per layer, ``H{k}[b,f] = RELU(SUM(H{k-1}[b,d] * W{k}[d,f]) +
c{k}[f])``, which binds to two operations (the product, then the bias and RELU): 50 layers are
100 operations, 500 layers 1,000. X is 8192 x 256 float32 and every W{k} 256 x 256, all stored
(a real catalog in a temporary directory, made once per layer count). Each figure is the median
of ``--runs`` EXPLAINs of the whole script; the stages are TENSORDB_DEBUG=1's stage timings
(parse, bind, optimize, lower, place), "other" the rest of the wall time (the session, opening
the inputs, rendering the EXPLAIN text).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import statistics
import sys
import tempfile
import time

import numpy as np

import tensordb

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


def timed_explain(con, sql: str) -> tuple[float, dict[str, float]]:
    """(seconds end to end, {stage: seconds}) of one EXPLAIN of ``sql``."""
    err = io.StringIO()
    old = os.environ.get("TENSORDB_DEBUG")
    os.environ["TENSORDB_DEBUG"] = "1"
    try:
        with contextlib.redirect_stderr(err):
            t0 = time.perf_counter()
            con.explain(sql)
            total = time.perf_counter() - t0
    finally:
        if old is None:
            del os.environ["TENSORDB_DEBUG"]
        else:
            os.environ["TENSORDB_DEBUG"] = old
    stages = dict.fromkeys(STAGES, 0.0)
    for name, ms in re.findall(r"\[tensordb\] (\w+)\s+([\d.]+) ms", err.getvalue()):
        if name in stages:
            stages[name] += float(ms) / 1e3
    return total, stages


def measure(path: str, layers: int, workers: int, runs: int) -> dict[str, float]:
    sql = mlp_script(layers)
    with tensordb.connect(path) as con:
        con.set("workers", workers)
        con.explain(mlp_script(1))  # the grammar and the first connection's warm-up
        samples = [timed_explain(con, sql) for _ in range(runs)]
    out = {"total": statistics.median(t for t, _ in samples)}
    for s in STAGES:
        out[s] = statistics.median(st[s] for _, st in samples)
    out["other"] = max(0.0, out["total"] - sum(out[s] for s in STAGES))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="*", default=[50, 500])
    ap.add_argument("--workers", type=int, nargs="*", default=[4, 16, 64])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile one EXPLAIN per case")
    ap.add_argument("--dir", default=None, help="keep the catalogs here (made when missing)")
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="tensordb-bench-planning-")
    print(f"| ops | workers | total | {' | '.join(STAGES)} | other |")
    print("|---:|---:|---:|" + "---:|" * (len(STAGES) + 1))
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
            m = measure(path, layers, workers, args.runs)
            cells = " | ".join(f"{1e3 * m[s]:.0f} ms" for s in STAGES + ("other",))
            print(f"| {2 * layers} | {workers} | {1e3 * m['total']:.0f} ms | {cells} |", flush=True)


if __name__ == "__main__":
    main()
