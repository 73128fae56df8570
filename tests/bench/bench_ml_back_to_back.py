"""Digits steps back to back in one process, numpy's step alternated (issue 29, the run).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_ml_back_to_back.py log 1

Arguments: the model (``log`` or ``mlp``, as in bench_ml_steps.py; or ``assign``, the
one-element assignment ``a[i] = a[i] + 1`` of a 4-element tensor: no numpy step, its result
checked) and the steps a call. In
memory, 2 workers: 20 warm-up calls, then 10 blocks of 30 tensordb calls back to back, each
block followed by 30 of numpy's steps by hand (the same formulas, bench_ml_steps.numpy_step).
Prints one line of JSON, ms a step: the call's fastest and median, numpy's, and the fast path's
run alone (``fastpath.run_program``, per call, over all steps of the call). Run it under each
tree to compare two versions of the code (each in a process of its own, in turn); the
figures in docs/benchmarks.md, "The run at numpy's pace", were taken so.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tensordb  # noqa: E402
from tensordb.exec import fastpath  # noqa: E402
from tests.bench import bench_ml_steps as B  # noqa: E402


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    model = argv[0] if argv else "log"
    k = int(argv[1]) if len(argv) > 1 else 1
    x, y, _ = B.data()
    con = tensordb.connect(None, workers=2)
    if model == "assign":
        con.load("a", np.zeros(4))
        text, values = "a[i] = a[i] + 1;" * k, None
    else:
        B.load(con, x, y)
        text, values = B.step_sql(model) * k, {"lr": B.LR}
    runs: list[float] = []
    run_program = fastpath.run_program

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return run_program(*a, **kw)
        finally:
            runs.append(time.perf_counter() - t0)
    fastpath.run_program = timed
    try:
        for _ in range(20):
            con.execute(text, values)
        w = B.weights()
        calls, steps = [], []
        runs.clear()
        for _ in range(10):
            for _ in range(30):
                t0 = time.perf_counter()
                con.execute(text, values)
                calls.append((time.perf_counter() - t0) / k)
            for _ in range(30 if model != "assign" else 0):
                t0 = time.perf_counter()
                B.numpy_step(model, x, y, w)
                steps.append(time.perf_counter() - t0)
        if model == "assign":  # checked against what 20 + 300 calls of k steps must give
            assert (con.tensor("a") == 320 * k).all(), con.tensor("a")
    finally:
        fastpath.run_program = run_program
        con.close()
    out = {"model": model, "steps_per_call": k,
           "call_fastest": 1e3 * min(calls), "call_median": 1e3 * float(np.median(calls))}
    if steps:
        out.update(numpy_fastest=1e3 * min(steps), numpy_median=1e3 * float(np.median(steps)))
    if runs:  # the plan took the fast path
        out["run_fastest"] = 1e3 * min(runs) / k
        out["run_median"] = 1e3 * float(np.median(runs)) / k
    print(json.dumps(out))


if __name__ == "__main__":
    main()
