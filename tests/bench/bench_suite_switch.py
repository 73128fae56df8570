"""Two execution choices of the pool switched off and on inside one process, call by call (run
by hand; docs/benchmarks.md "The workload suite in sequence and alone", part 3):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/main/.venv/bin/python -m tests.bench.bench_suite_switch --switch view --pairs 8 batched "mlp layer"

``view``: a Load of exactly one stored dense tile is that tile's view (``tasks._whole_tile``,
blk26) against ``read_box``'s copy. ``lazy``: a Load whose consumers all run on its worker is
run by the first of them (``pool_run._Shape.lazy``, blk26) against queued as a task of its own.
Each named workload of tests/bench/workloads.py is loaded once; the same connection and cached
plan then run it with the choice on and off, alternating (the order swapped every pair, a 0.3 s
pause before each call), and the script prints on / off of wall and CPU time (``process_time``:
every thread) as the median over the pairs and their range. The two sides share the process,
its load and its state, so the ratio is what the choice costs; every result is checked against
NumPy."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensordb
from tensordb.exec import pool_run, tasks

from . import bench_suite
from .workloads import suite

_whole_tile = tasks._whole_tile
_of = pool_run._Shape.of.__func__
_STATE = {"on": True}


def _no_view(reader, starts, stops):
    return None


def _shape_of(cls, plan):
    shape = _of(cls, plan)
    if _STATE["on"]:
        return shape
    copy = object.__new__(cls)  # the plan's kept shape, without its lazy Loads
    for k in cls.__slots__:
        setattr(copy, k, getattr(shape, k))
    copy.lazy, copy.waiting_lazy = frozenset(), dict(shape.waiting)
    return copy


def _set(switch: str, on: bool) -> None:
    if switch == "view":
        tasks._whole_tile = _whole_tile if on else _no_view
    else:
        _STATE["on"] = on


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="workloads whose name contains one of these")
    ap.add_argument("--switch", choices=["view", "lazy"], default="view")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    pool_run._Shape.of = classmethod(_shape_of)
    med = statistics.median
    try:
        for w in suite():
            if not any(n in w.name for n in args.names):
                continue
            arrays = w.arrays(np.random.default_rng(0))
            got: dict = {True: [], False: []}
            with tensordb.connect(workers=args.workers) as con:
                for name, a in arrays.items():
                    con.load(name, a, tile=w.tile.get(name))
                graph = w.graph()
                for on in (True, False):
                    _set(args.switch, on)
                    con.run(graph, replace=True)  # warm-up
                    err = bench_suite.rel_error(con.tensor(w.output), w.numpy(arrays))
                    assert err <= (1e-3 if arrays[next(iter(arrays))].dtype == np.float32
                                   else 1e-9), f"{w.name}: off by {err:.1e}"
                for p in range(args.pairs):
                    for on in ((True, False) if p % 2 == 0 else (False, True)):
                        _set(args.switch, on)
                        time.sleep(bench_suite.SETTLE_S)
                        c0, t0 = time.process_time(), time.perf_counter()
                        con.run(graph, replace=True)
                        got[on].append((time.perf_counter() - t0, time.process_time() - c0))
            _set(args.switch, True)
            wall = [a[0] / b[0] for a, b in zip(got[True], got[False])]
            cpu = [a[1] / b[1] for a, b in zip(got[True], got[False])]
            print(f"{w.name}: {args.switch} on / off, wall {med(wall):.3f} ({min(wall):.2f}-"
                  f"{max(wall):.2f}), CPU {med(cpu):.3f} ({min(cpu):.2f}-{max(cpu):.2f}); CPU on "
                  f"{1e3 * med(c for _, c in got[True]):.1f} ms, off "
                  f"{1e3 * med(c for _, c in got[False]):.1f} ms", flush=True)
    finally:
        _set(args.switch, True)
        pool_run._Shape.of = classmethod(_of)


if __name__ == "__main__":
    main()
