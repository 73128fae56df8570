"""One workload of the suite alone under several versions of tensordb, CPU time split into user
and system time (run by hand; docs/benchmarks.md, "The attention block against a729ab5").

    git archive a729ab5 tensordb | (mkdir -p /tmp/a729 && tar -x -C /tmp/a729)
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/main/.venv/bin/python \\
        tests/bench/bench_alone_ab.py --only attention --trees /tmp/a729 . --rounds 4 --calls 15

Each round runs, for each tree in turn (the order rotated every round), a fresh process that
imports ``tensordb`` from that tree, loads the workload (tests/bench/workloads.py), runs it once,
then times ``--calls`` calls from stored tensors to a stored result (``con.run(graph,
replace=True)``, as bench_suite does) alternating with the workload's NumPy form, each after a
0.3 s pause: wall (``perf_counter``), CPU (``process_time``: every thread) and the process's
user and system seconds (``getrusage``: the system time is mostly the kernel zeroing fresh
pages of new tiles). The table gives per tree the medians over its processes of the
per-process medians, the per-process CPU medians, and the ratio of each tree's CPU to the
first tree's. Every tensordb result is checked against NumPy in every process. On a machine
shared with others' tests, compare CPU, not wall.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child(args) -> None:
    sys.path.insert(0, str(Path(args.child).resolve()))
    sys.path.insert(1, str(REPO))
    import numpy as np
    import tensordb
    from tests.bench import bench_suite
    from tests.bench.workloads import suite
    assert Path(tensordb.__file__).resolve().parents[1] == Path(args.child).resolve(), \
        tensordb.__file__
    w = next(w for w in suite() if args.only in w.name)
    arrays = w.arrays(np.random.default_rng(0))
    rows = {k: [] for k in ("wall", "cpu", "user", "sys", "numpy_cpu")}
    with tensordb.connect(workers=args.workers) as con:
        for name, a in arrays.items():
            con.load(name, a, tile=w.tile.get(name))
        graph = w.graph()
        con.run(graph, replace=True)
        w.numpy(arrays)
        for _ in range(args.calls):
            time.sleep(0.3)
            r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), \
                time.perf_counter()
            con.run(graph, replace=True)
            t1, c1, r1 = time.perf_counter(), time.process_time(), \
                resource.getrusage(resource.RUSAGE_SELF)
            rows["wall"].append(t1 - t0)
            rows["cpu"].append(c1 - c0)
            rows["user"].append(r1.ru_utime - r0.ru_utime)
            rows["sys"].append(r1.ru_stime - r0.ru_stime)
            time.sleep(0.3)
            c0 = time.process_time()
            w.numpy(arrays)
            rows["numpy_cpu"].append(time.process_time() - c0)
        err = bench_suite.rel_error(con.tensor(w.output), w.numpy(arrays))
    tol = 1e-3 if arrays[next(iter(arrays))].dtype == np.float32 else 1e-9
    assert err <= tol, f"{w.name}: off by {err:.1e}"
    print(json.dumps({k: statistics.median(v) for k, v in rows.items()}), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=["/tmp/a729", str(REPO)],
                    help="folders holding a tensordb/ each (the first: the baseline)")
    ap.add_argument("--only", default="attention", help="the workload whose name has this text")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    trees = [str(Path(t).resolve()) for t in args.trees]
    for t in trees:
        if not (Path(t) / "tensordb").is_dir():
            sys.exit(f"{t}/tensordb is missing: git archive <commit> tensordb | tar -x -C {t}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got: dict = {t: [] for t in trees}
    loads = []
    for r in range(args.rounds):
        for t in trees[r % len(trees):] + trees[:r % len(trees)]:
            loads.append(os.getloadavg()[0])
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", t,
                                  "--only", args.only, "--calls", str(args.calls),
                                  "--workers", str(args.workers)],
                                 env=env, cwd="/", capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{t} failed:\n{out.stderr[-3000:]}")
            got[t].append(json.loads(out.stdout.splitlines()[-1]))
    med = statistics.median
    base = med(x["cpu"] for x in got[trees[0]])
    print(f"{args.only!r} alone, {args.rounds} processes a tree, {args.calls} calls each, "
          f"{args.workers} workers; load average {min(loads):.1f}-{max(loads):.1f}")
    print("| tree | wall ms | CPU ms (per process) | user ms | system ms | numpy CPU ms | "
          "CPU / first tree's |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t in trees:
        rows = got[t]
        cpu = med(x["cpu"] for x in rows)
        per = ", ".join(f"{1e3 * x['cpu']:.1f}" for x in rows)
        print(f"| {t} | {1e3 * med(x['wall'] for x in rows):.1f} | {1e3 * cpu:.1f} ({per}) | "
              f"{1e3 * med(x['user'] for x in rows):.1f} | "
              f"{1e3 * med(x['sys'] for x in rows):.1f} | "
              f"{1e3 * med(x['numpy_cpu'] for x in rows):.1f} | {cpu / base:.3f} |")


if __name__ == "__main__":
    main()
