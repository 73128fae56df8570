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


def child(args) -> None:
    """One version's pass over the workloads: a JSON line per workload on stdout."""
    sys.path.insert(0, str(Path(args.child)))
    sys.path.insert(1, str(REPO))
    import numpy as np
    import tensordb
    from tests.bench import bench_suite
    from tests.bench.workloads import suite
    assert Path(tensordb.__file__).resolve().parents[1] == Path(args.child).resolve(), \
        tensordb.__file__
    bench_suite.SETTLE_S = args.settle
    for w in suite():
        if args.only and args.only not in w.name:
            continue
        arrays = w.arrays(np.random.default_rng(0))
        with tensordb.connect(workers=args.workers) as con:
            for name, a in arrays.items():
                con.load(name, a, tile=w.tile.get(name))
            graph = w.graph()
            t = bench_suite.median_times({"tensordb": lambda: con.run(graph, replace=True),
                                          "numpy": lambda: w.numpy(arrays)}, args.repeat)
            err = bench_suite.rel_error(con.tensor(w.output), w.numpy(arrays))
        tol = 1e-3 if arrays[next(iter(arrays))].dtype == np.float32 else 1e-9
        assert err <= tol, f"{w.name}: off by {err:.1e}"
        print(json.dumps({"name": w.name, **t}), flush=True)


def table(args, got, np_got, loads, t_start, rounds=None) -> None:
    """The markdown table of the rounds so far (each workload's medians over them)."""
    med = statistics.median
    print(f"{rounds or args.rounds} rounds, old {args.old} and new {args.new} alternating (medians of "
          f"{args.repeat} a process), {args.workers} workers; load average {min(loads):.1f}-"
          f"{max(loads):.1f} at the processes' starts; {time.perf_counter() - t_start:.0f} s")
    print("| workload | old | new | new / old | per-round new / old | numpy new-process / "
          "old-process | new / old, each over its process's numpy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for name, old in got["old"].items():
        new = got["new"][name]
        rr = [n / o for n, o in zip(new, old)]
        ratio = med(new) / med(old)
        ratios.append(ratio)
        npr = med(np_got["new"][name]) / med(np_got["old"][name])
        # tensordb's time over NumPy's in the same process, new against old: what a machine
        # whose load moves between the processes disturbs less
        rel = med(n / m for n, m in zip(new, np_got["new"][name])) / \
            med(o / m for o, m in zip(old, np_got["old"][name]))
        print(f"| {name} | {1e3 * med(old):,.1f} ms | {1e3 * med(new):,.1f} ms | {ratio:.3f} | "
              f"{min(rr):.2f}-{max(rr):.2f} | {npr:.3f} | {rel:.3f} |")
    geo = float(statistics.geometric_mean(ratios))
    print(f"geometric mean new / old: {geo:.3f}; workloads over 1.05: "
          + (", ".join(n for n, x in zip(got["old"], ratios) if x > 1.05) or "none"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="/tmp/old26", help="folder holding the old tensordb/")
    ap.add_argument("--new", default=str(REPO), help="folder holding the new tensordb/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--settle", type=float, default=0.3)
    ap.add_argument("--only", default="", help="only workloads whose name contains this text")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if not (Path(args.old) / "tensordb").is_dir():
        sys.exit(f"{args.old}/tensordb is missing: git archive a729ab5 tensordb | "
                 f"(mkdir -p {args.old} && tar -x -C {args.old})")
    t_start = time.perf_counter()
    sides = {"old": args.old, "new": args.new}
    got: dict = {"old": {}, "new": {}}   # side -> workload -> [per-round medians]
    np_got: dict = {"old": {}, "new": {}}
    loads = []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for side in order:
            loads.append(os.getloadavg()[0])
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", sides[side],
                   "--repeat", str(args.repeat), "--workers", str(args.workers),
                   "--settle", str(args.settle), "--only", args.only]
            out = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{side} round {r + 1} failed:\n{out.stderr[-3000:]}")
            for line in out.stdout.splitlines():
                row = json.loads(line)
                got[side].setdefault(row["name"], []).append(row["tensordb"])
                np_got[side].setdefault(row["name"], []).append(row["numpy"])
            print(f"round {r + 1} {side}: done at load {os.getloadavg()[0]:.1f} "
                  f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
        if r + 1 < args.rounds:  # the rounds so far, in case the run is cut short
            print(f"after round {r + 1}:", file=sys.stderr)
            table(args, got, np_got, loads, t_start, r + 1)
            print(flush=True)
    table(args, got, np_got, loads, t_start)

if __name__ == "__main__":
    main()
