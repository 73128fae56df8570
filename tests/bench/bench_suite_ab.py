"""The workload suite under two versions of tensordb, alternating round by round (run by hand).

    git archive a729ab5 tensordb | (mkdir -p /tmp/old26 && tar -x -C /tmp/old26)
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/main/.venv/bin/python tests/bench/bench_suite_ab.py --old /tmp/old26

(``a729ab5`` is the code before the first sparse merge: the issue's "dense workloads unchanged:
the workload suite within 5% of today's medians".) Each round runs the suite's workloads
(tests/bench/workloads.py, the same ones bench_suite times) once under each version, each in a
fresh process that imports ``tensordb`` from that version's folder (``--new``: this checkout),
the order of the two swapped every round. In a process each workload is loaded, run once to
warm up, then timed ``--repeat`` times from stored tensors to a stored result
(``con.run(graph, replace=True)``, as bench_suite does), alternating with the workload's NumPy
reference form, with bench_suite's pause before each call; the process reports the medians. The
table gives per workload the median over the rounds of each version's medians, the ratio
new/old, the range of the per-round ratios, NumPy's ratio between the two versions' processes
(the same code: how much the machine moved), and new/old of tensordb's time over NumPy's in its
own process (what a load that moves between processes disturbs less), with the load average.
Every time is taken twice: wall (``perf_counter``) and CPU (``process_time``: all the process's
threads, the pool's workers and OpenBLAS's helpers included). On this 2-core machine shared by
several engineers the wall time of a call is mostly its waits for a core (at a load average of
8-12 a square matmul's 1.4 s of CPU took 6-7 s of wall), which CPU time leaves out; spinning
BLAS threads add to both. The table gives each with its per-round range.

Two more modes (docs/benchmarks.md "The workload suite in sequence and alone"):

- ``--fresh``: one process per workload and version, the versions alternating workload by
  workload and round by round: no workload follows another in its process, so nothing a
  previous workload left behind (caches, kept payloads, threads) can slow it;
- ``--after NAME``: in one process per version, the workload NAME first, then the others
  (those ``--only`` names, default all), then NAME again: its time last over its time first,
  per version; what the new code leaves behind shows as a ratio the old code does not have.

How long it takes: 2 x rounds processes; at a load average of 10-15 (five engineers' tests) one
process took 6 to 14 minutes (2026-11-27); on a quiet machine it is not measured (a fraction of
that: the processes got a fifth of a core).
Every tensordb result is checked against NumPy in every process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cpu_times(fn) -> tuple[float, float]:
    """Wall and CPU seconds of one call (CPU: ``time.process_time``, every thread of the process,
    the pool's workers and OpenBLAS's helpers included: what a busy machine's waits for a core
    leave out, and what spinning threads add)."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def child(args) -> None:
    """One version's pass over the workloads: a JSON line per workload on stdout (with --seq, the
    workloads of that list of suite indices in its order, a workload listed twice timed twice)."""
    sys.path.insert(0, str(Path(args.child)))
    sys.path.insert(1, str(REPO))
    import numpy as np
    import tensordb
    from tests.bench import bench_suite
    from tests.bench.workloads import suite
    assert Path(tensordb.__file__).resolve().parents[1] == Path(args.child).resolve(), \
        tensordb.__file__
    bench_suite.SETTLE_S = args.settle
    ws = suite()
    if args.seq:
        ws = [ws[int(i)] for i in args.seq.split(",")]
    for pos, w in enumerate(ws):
        if args.only and args.only not in w.name:
            continue
        arrays = w.arrays(np.random.default_rng(0))
        with tensordb.connect(workers=args.workers) as con:
            for name, a in arrays.items():
                con.load(name, a, tile=w.tile.get(name))
            graph = w.graph()
            fns = {"tensordb": lambda: con.run(graph, replace=True),
                   "numpy": lambda: w.numpy(arrays)}
            for fn in fns.values():
                fn()  # warm-up
            got: dict = {k: [] for k in fns}
            for _ in range(args.repeat):
                for k, fn in fns.items():
                    time.sleep(args.settle)
                    got[k].append(_cpu_times(fn))
            err = bench_suite.rel_error(con.tensor(w.output), w.numpy(arrays))
        tol = 1e-3 if arrays[next(iter(arrays))].dtype == np.float32 else 1e-9
        assert err <= tol, f"{w.name}: off by {err:.1e}"
        med = statistics.median
        print(json.dumps({"name": w.name, "pos": pos,
                          **{k: med(t for t, _ in v) for k, v in got.items()},
                          **{f"{k}_cpu": med(c for _, c in v) for k, v in got.items()}}),
              flush=True)
        del arrays, con, fns


def table(args, got, loads, t_start, rounds=None) -> None:
    """The markdown table of the rounds so far: per workload the median over the rounds of each
    version's per-process medians, wall and CPU, and the ratios new / old with their spreads.
    ``got[side][name]``: one child row per round."""
    med = statistics.median
    print(f"{rounds or args.rounds} rounds, old {args.old} and new {args.new} alternating "
          f"({'one process per workload and version' if args.fresh else 'one process a version'}"
          f"; medians of {args.repeat} a process), {args.workers} workers; load average "
          f"{min(loads):.1f}-{max(loads):.1f} at the processes' starts; "
          f"{time.perf_counter() - t_start:.0f} s")
    print("| workload | old wall | new wall | new / old wall (per round) | old CPU | new CPU | "
          "new / old CPU (per round) | numpy new / old wall, CPU | new / old over its "
          "process's numpy, wall (per round) | the same, CPU (per round) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    walls, cpus, rels = [], [], []

    def spread(xs):
        return f"{min(xs):.2f}-{max(xs):.2f}"
    for name, old in got["old"].items():
        new = got["new"].get(name, [])
        if not new:
            continue
        n = min(len(old), len(new))
        old, new = old[:n], new[:n]
        col = {k: ([o[k] for o in old], [r[k] for r in new])
               for k in ("tensordb", "numpy", "tensordb_cpu", "numpy_cpu")}
        w_o, w_n = col["tensordb"]
        c_o, c_n = col["tensordb_cpu"]
        wall, cpu = med(w_n) / med(w_o), med(c_n) / med(c_o)
        walls.append(wall)
        cpus.append(cpu)
        # tensordb's time over NumPy's in the same process, each round new against old: what a
        # machine whose load moves between the processes disturbs less
        rel = [(r["tensordb"] / r["numpy"]) / (o["tensordb"] / o["numpy"]) for o, r in zip(old, new)]
        relc = [(r["tensordb_cpu"] / r["numpy_cpu"]) / (o["tensordb_cpu"] / o["numpy_cpu"])
                for o, r in zip(old, new)]
        rels.append(med(relc))
        npw = med(col["numpy"][1]) / med(col["numpy"][0])
        npc = med(col["numpy_cpu"][1]) / med(col["numpy_cpu"][0])
        print(f"| {name} | {1e3 * med(w_o):,.1f} ms | {1e3 * med(w_n):,.1f} ms | {wall:.3f} "
              f"({spread([a / b for a, b in zip(w_n, w_o)])}) | {1e3 * med(c_o):,.1f} ms | "
              f"{1e3 * med(c_n):,.1f} ms | {cpu:.3f} ({spread([a / b for a, b in zip(c_n, c_o)])})"
              f" | {npw:.3f}, {npc:.3f} | {med(rel):.3f} ({spread(rel)}) | "
              f"{med(relc):.3f} ({spread(relc)}) |")
    if walls:
        geo = statistics.geometric_mean
        print(f"geometric means new / old: wall {geo(walls):.3f}, CPU {geo(cpus):.3f}, CPU over "
              f"numpy's {geo(rels):.3f}; over 1.05 in wall: "
              + (", ".join(n for n, x in zip(got["old"], walls) if x > 1.05) or "none")
              + "; in CPU: " + (", ".join(n for n, x in zip(got["old"], cpus) if x > 1.05) or "none"))


def after_table(args, got, loads, t_start) -> None:
    """--after: the workload's time last in the process (after the others) over its time first,
    per version; a state the new code leaves behind shows as a ratio the old code does not have."""
    med = statistics.median
    print(f"{args.after!r} first, then the other workloads (--only), then it again, in one "
          f"process; {len(got['old'])} rounds a version, alternating; load average "
          f"{min(loads):.1f}-{max(loads):.1f}; {time.perf_counter() - t_start:.0f} s")
    print("| version | tensordb wall last / first (per round) | tensordb CPU last / first | "
          "numpy wall last / first | numpy CPU last / first | tensordb/numpy CPU, last over "
          "first |")
    print("|---|---:|---:|---:|---:|---:|")
    for side in ("old", "new"):
        rows = got[side]
        cols = {}
        for k in ("tensordb", "tensordb_cpu", "numpy", "numpy_cpu"):
            cols[k] = [last[k] / first[k] for first, last in rows]
        rel = [(last["tensordb_cpu"] / last["numpy_cpu"]) / (first["tensordb_cpu"] /
                                                             first["numpy_cpu"])
               for first, last in rows]
        cells = " | ".join(f"{med(v):.3f} ({min(v):.2f}-{max(v):.2f})" for v in cols.values())
        print(f"| {side} | {cells} | {med(rel):.3f} ({min(rel):.2f}-{max(rel):.2f}) |")


def _spawn(args, path, seq: list[int] | None, only: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", path,
           "--repeat", str(args.repeat), "--workers", str(args.workers),
           "--settle", str(args.settle), "--only", only]
    if seq:
        cmd += ["--seq", ",".join(map(str, seq))]
    out = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{path} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines()]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="/tmp/old26", help="folder holding the old tensordb/")
    ap.add_argument("--new", default=str(REPO), help="folder holding the new tensordb/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--settle", type=float, default=0.3)
    ap.add_argument("--only", default="", help="only workloads whose name contains this text")
    ap.add_argument("--fresh", action="store_true",
                    help="one process per workload and version (the versions alternating for "
                         "each workload): no workload follows another in a process")
    ap.add_argument("--after", default="",
                    help="the workload whose name contains this text, first in the process, "
                         "then after the others (those --only names), in each version")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seq", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not (Path(args.old) / "tensordb").is_dir():
        sys.exit(f"{args.old}/tensordb is missing: git archive a729ab5 tensordb | "
                 f"(mkdir -p {args.old} && tar -x -C {args.old})")
    sys.path.insert(0, str(REPO))
    from tests.bench.workloads import suite
    names = [w.name for w in suite()]
    t_start = time.perf_counter()
    sides = {"old": args.old, "new": args.new}
    got: dict = {"old": {}, "new": {}}   # side -> workload -> [per-round child rows]
    loads = []

    def log(msg):
        print(f"{msg} at load {os.getloadavg()[0]:.1f} ({time.perf_counter() - t_start:.0f} s)",
              file=sys.stderr, flush=True)
    if args.after:
        w = next(i for i, n in enumerate(names) if args.after in n)
        seq = [w] + [i for i, n in enumerate(names) if i != w and args.only in n] + [w]
        pairs: dict = {"old": [], "new": []}
        for r in range(args.rounds):
            for side in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
                loads.append(os.getloadavg()[0])
                rows = _spawn(args, sides[side], seq, "")
                pairs[side].append((rows[0], rows[-1]))
                log(f"round {r + 1} {side}: tensordb first {1e3 * rows[0]['tensordb']:.1f} ms "
                    f"(CPU {1e3 * rows[0]['tensordb_cpu']:.1f}), last "
                    f"{1e3 * rows[-1]['tensordb']:.1f} ms (CPU "
                    f"{1e3 * rows[-1]['tensordb_cpu']:.1f}); numpy first "
                    f"{1e3 * rows[0]['numpy']:.1f}, last {1e3 * rows[-1]['numpy']:.1f} ms")
        return after_table(args, pairs, loads, t_start)
    picked = [i for i, n in enumerate(names) if args.only in n]
    for r in range(args.rounds):
        if args.fresh:
            for k, i in enumerate(picked):
                for side in (["old", "new"] if (r + k) % 2 == 0 else ["new", "old"]):
                    loads.append(os.getloadavg()[0])
                    for row in _spawn(args, sides[side], [i], ""):
                        got[side].setdefault(row["name"], []).append(row)
            log(f"round {r + 1}")
        else:
            for side in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
                loads.append(os.getloadavg()[0])
                for row in _spawn(args, sides[side], None, args.only):
                    got[side].setdefault(row["name"], []).append(row)
                log(f"round {r + 1} {side}")
        if r + 1 < args.rounds:  # the rounds so far, in case the run is cut short
            print(f"after round {r + 1}:", file=sys.stderr)
            table(args, got, loads, t_start, r + 1)
            print(flush=True)
    table(args, got, loads, t_start)


if __name__ == "__main__":
    main()
