"""The driver's fixed costs, side by side with another checkout (run by hand):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_driver.py \\
        --against /path/to/other/checkout

Each round runs one child process per checkout (alternating which goes first), each child
importing tensordb from its checkout (PYTHONPATH) and timing, per call: a 64 x 64 float32
matmul stored to a stored tensor (its plan cached, and planned afresh: the plan cache emptied,
the binding kept), in memory and on disk; a small SGD step of bench_train.py (b=64, f=256,
h=64, c=16, GRAD of both weights, plan reused), in memory and on disk; EXPLAIN of a 50-layer
MLP script planned afresh (bench_planning.py's script over a 512-row X); and the fixed cost of
a trivial one-element statement ``A = SUM(x[i])`` in an in-memory database (issue 29: under
1 ms). Figures are medians over every call of every round; the ratio is this checkout's over
the other's. ``--breakdown`` prints where the trivial statement's time goes (this checkout).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = ("matmul 64, in memory, plan cached", "matmul 64, on disk, plan cached",
         "matmul 64, in memory, planned", "train step, in memory", "train step, on disk",
         "EXPLAIN 50-layer MLP, planned", "A = SUM(x[i]), in memory")


def _timed(fn, n: int) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of ``n`` calls after a warm-up; the CPU time (of every
    thread of the process) is the figure a machine shared with other work disturbs least."""
    fn()  # warm-up
    out = []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    return out


def child(scale: int, only: str = "") -> dict[str, list[float]]:
    import tensordb
    from tensordb.dialect import parser
    sys.path.insert(0, str(HERE))
    from bench_planning import mlp_script
    from bench_train import step_sql

    def forget(con):  # the plans only: both versions keep them in a ``_plans`` dict
        con._plan_cache._plans.clear()

    out = {}
    rng = np.random.default_rng(0)

    def wanted(*cases):
        return any(only in c for c in cases)
    with tempfile.TemporaryDirectory() as tmp:
        for where, label in ((None, "in memory"), (os.path.join(tmp, "m.tdb"), "on disk")):
            with tensordb.connect(where, workers=2) as con:
                for name in "AB":
                    con.load(name, rng.standard_normal((64, 64), dtype=np.float32))
                sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
                if wanted(f"matmul 64, {label}, plan cached"):
                    out[f"matmul 64, {label}, plan cached"] = _timed(lambda: con.execute(sql),
                                                                     20 * scale)
                if where is None and wanted(f"matmul 64, {label}, planned"):
                    out[f"matmul 64, {label}, planned"] = _timed(
                        lambda: (forget(con), con.execute(sql)), 10 * scale)
                b, f, h, c = 64, 256, 64, 16
                for name, shape in (("X", (b, f)), ("W1", (f, h)), ("W2", (h, c))):
                    con.load(name, rng.standard_normal(shape, dtype=np.float32) * 0.1)
                y = np.zeros((b, c), np.float32)
                y[np.arange(b), rng.integers(0, c, b)] = 1
                con.load("Y", y)
                step = step_sql(b)
                if wanted(f"train step, {label}"):
                    out[f"train step, {label}"] = _timed(lambda: con.execute(step), 5 * scale)
        if wanted("EXPLAIN 50-layer MLP, planned"):
            with tensordb.connect(os.path.join(tmp, "mlp.tdb"), workers=4) as con:
                con.load("X", rng.standard_normal((512, 256), dtype=np.float32))
                for k in range(50):
                    con.load(f"W{k}", rng.standard_normal((256, 256), dtype=np.float32))
                    con.load(f"c{k}", rng.standard_normal((256,), dtype=np.float32))
                script = mlp_script(50)

                def explain():
                    forget(con)
                    parser.forget_parsed()
                    con.explain(script)
                out["EXPLAIN 50-layer MLP, planned"] = _timed(explain, max(2, scale))
    if wanted("A = SUM(x[i]), in memory"):
        with tensordb.connect(workers=2) as con:
            con.load("x", np.ones(1))
            out["A = SUM(x[i]), in memory"] = _timed(lambda: con.execute("A = SUM(x[i])"),
                                                     40 * scale)
            assert float(con.tensor("A")) == 1.0
    return out


def breakdown(runs: int = 300) -> None:
    """Where ``A = SUM(x[i])`` spends its time in this checkout: the driver's stages wrapped
    and timed (medians), and the statements it sends to DuckDB."""
    import tensordb
    from tensordb import connection
    from tensordb.driver import pipeline
    from tensordb.driver.pipeline import Prepared
    parts: dict[str, list[float]] = {}

    def wrap(owner, name, key):
        fn = getattr(owner, name)

        def timed(*a, **k):
            t0 = time.thread_time()  # this thread's CPU: least disturbed by other work
            try:
                return fn(*a, **k)
            finally:
                parts.setdefault(key, []).append(time.thread_time() - t0)
        setattr(owner, name, timed)
    with tensordb.connect(workers=2) as con:
        con.load("x", np.ones(1))
        ex = con._get_executor()
        for owner, name, key in ((connection, "parse", "parse"), (pipeline, "bind", "bind"),
                                 (pipeline, "plan_graph", "plan (cache hit)"),
                                 (Prepared, "run", "run + commit"), (ex, "run", "executor run"),
                                 (con, "execute", "execute (whole)")):
            wrap(owner, name, key)
        for _ in range(runs):
            con.execute("A = SUM(x[i])")
        duck = con.store.duck
        duck.execute("CALL enable_logging('QueryLog')")
        duck.execute("CALL truncate_duckdb_logs()")
        con.execute("A = SUM(x[i])")
        duck.execute("CALL disable_logging()")
        log = [m for (m,) in duck.execute("SELECT message FROM duckdb_logs() WHERE type = "
                                          "'QueryLog' ORDER BY context_id").fetchall()][:-1]
    med = {k: 1e3 * statistics.median(v[len(v) // 10:]) for k, v in parts.items()}
    med["commit (run + commit - executor run)"] = med["run + commit"] - med["executor run"]
    med["session and the rest"] = med["execute (whole)"] - med["parse"] - med["bind"] - \
        med["plan (cache hit)"] - med["run + commit"]
    print("| part of `A = SUM(x[i])` in memory | ms of CPU, calling thread (median) |\n|---|---:|")
    for k in ("execute (whole)", "parse", "bind", "plan (cache hit)", "executor run",
              "commit (run + commit - executor run)", "session and the rest"):
        print(f"| {k} | {med[k]:.3f} |")
    print(f"\nDuckDB statements per call: {len(log)}: " + "; ".join(m.split()[0] for m in log))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None, help="the other checkout's root")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=int, default=1, help="more calls per case")
    ap.add_argument("--only", default="", help="the cases whose name contains this text")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--breakdown", action="store_true")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.scale, args.only)))
        return
    if args.breakdown:
        breakdown()
        return
    roots = {"this": ROOT} | ({"other": Path(args.against).resolve()} if args.against else {})
    cases = [c for c in CASES if args.only in c]
    samples: dict[str, dict[str, list[float]]] = {k: {c: [] for c in cases} for k in roots}
    for r in range(args.rounds):
        for key in (list(roots) if r % 2 == 0 else list(roots)[::-1]):
            env = {**os.environ, "PYTHONPATH": str(roots[key])}
            env.pop("TENSORDB_DEBUG", None)
            run = subprocess.run([sys.executable, __file__, "--child", "--scale", str(args.scale),
                                  "--only", args.only],
                                 env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(),
                                 timeout=600)
            assert run.returncode == 0, run.stderr
            for case, values in json.loads(run.stdout.strip().splitlines()[-1]).items():
                samples[key][case].extend(values)
    head = "| case | this: wall, CPU (ms) |" + \
        (" other: wall, CPU (ms) | this / other: wall, CPU |" if args.against else "")
    print(head + "\n|---|---:|" + ("---:|---:|" if args.against else ""))
    for case in cases:
        this = [1e3 * statistics.median(s[k] for s in samples["this"][case]) for k in (0, 1)]
        row = f"| {case} | {this[0]:.2f}, {this[1]:.2f} |"
        if args.against:
            other = [1e3 * statistics.median(s[k] for s in samples["other"][case]) for k in (0, 1)]
            row += (f" {other[0]:.2f}, {other[1]:.2f} | {this[0] / other[0]:.3f}, "
                    f"{this[1] / other[1]:.3f} |")
        print(row)


if __name__ == "__main__":
    main()
