"""What holding a Ctrl-C across a commit costs (storage/_duck.held_interrupt; by hand, seconds):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_held_interrupt

One logged on-disk replace step (``A[i,j] = A[i,j] * 0.5 + 1`` on an 8 x 8 tensor: its rows in
the redo log, one record and its fdatasync) on two databases, alternated step by step in one
process, each step either as shipped (the hold: one ``signal.signal`` each way) or with the
hold replaced by a context that does nothing (the code before it); which database runs which
arm alternates too. Medians, their ratio and the load average are printed.
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
from tensordb.storage import _duck, deferred, store_commit  # noqa: E402

STEP = "A[i,j] = A[i,j] * 0.5 + 1"


class _NoHold:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="steps per arm")
    args = ap.parse_args(argv)
    held = _duck.held_interrupt
    with tempfile.TemporaryDirectory() as d:
        cons = []
        for k in range(2):
            con = tensordb.connect(os.path.join(d, str(k)))
            con.load("A", np.arange(64.0).reshape(8, 8))
            con.execute(STEP)
            cons.append(con)
        times = {"held": [], "none": []}
        try:
            for r in range(args.steps):
                for arm in (("held", "none") if r % 2 else ("none", "held")):
                    store_commit.held_interrupt = deferred.held_interrupt = \
                        held if arm == "held" else _NoHold
                    con = cons[(r // 2 + (arm == "none")) % 2]
                    t = time.perf_counter()
                    con.execute(STEP)
                    times[arm].append(time.perf_counter() - t)
        finally:
            store_commit.held_interrupt = deferred.held_interrupt = held
            for con in cons:
                con.close()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"logged replace step, median ms: held {med['held']:.3f}, without {med['none']:.3f}, "
          f"ratio {med['held'] / med['none']:.3f} ({args.steps} steps each; load "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
