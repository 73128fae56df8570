"""What publishing catalog snapshots for readers in other processes costs the writer, per
statement (by hand; storage/snapshots.py).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_snapshots.py

A small statement that stores a tensor (``A[i,j] = A[i,j] + 1``, 64 x 64 float64 in 16 tiles)
on an on-disk database, with the writer publishing a snapshot after each commit (as tensordb
does) and with publishing turned off (``store.publisher = None``: what it cost before), the two
alternating statement by statement; then the same with a reader in another process holding an old snapshot (every
replaced payload is then deferred rather than recycled). The catalog holds ``--tensors`` other
tensors of 16 tiles each, since a snapshot copies the whole catalog. Medians of ``--runs``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import tensordb  # noqa: E402
from tensordb.storage import snapshots  # noqa: E402

STEP = "A[i,j] = A[i,j] + 1"
HOLD = ("import sys, tensordb; c = tensordb.connect(sys.argv[1], read_only=True); "
        "c.tensor('A'); print('ready', flush=True); sys.stdin.read()")


def measure(con, runs: int) -> tuple[float, float]:
    """Medians of the statement with the publisher and without, alternating statement by
    statement so that a busy machine slows both alike."""
    store = con.store
    publisher = store.publisher
    on, off = [], []
    try:
        for k in range(2 * runs):
            store.publisher = publisher if k % 2 == 0 else None
            t = time.perf_counter()
            con.execute(STEP)
            (on if k % 2 == 0 else off).append(time.perf_counter() - t)
    finally:
        store.publisher = publisher
        publisher.committed()  # what ran unpublished is published too (as outside a bench)
    return statistics.median(on), statistics.median(off)


def hook(con, runs: int) -> float:
    """The writer's own part of a commit, alone: the counter and the look at the leases."""
    publisher = con.store.publisher
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        publisher.committed()
        snapshots.live_pins(publisher.root)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--tensors", type=int, nargs="+", default=[0, 100, 1000])
    args = ap.parse_args()
    print("| other tensors (tile rows) | reader | publishing | not publishing | difference "
          "| the commit's hook alone |")
    print("|---:|:---:|---:|---:|---:|---:|")
    for others in args.tensors:
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "db")
            with tensordb.connect(root) as con:
                con.load("A", np.zeros((64, 64)), tile=(16, 16))
                for k in range(others):
                    con.load(f"T{k}", np.ones((64, 64)), tile=(16, 16))
                for reader in (False, True):
                    holder = None
                    if reader:
                        holder = subprocess.Popen(
                            [sys.executable, "-c", HOLD, root], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
                        assert holder.stdout.readline().strip() == b"ready"
                    try:
                        on, off = measure(con, args.runs)
                        alone = hook(con, args.runs)
                    finally:
                        if holder is not None:
                            holder.communicate(b"")
                    rows = 16 * (others + 1)
                    print(f"| {others} ({rows}) | {'yes' if reader else 'no'} | "
                          f"{on * 1e3:.2f} ms | {off * 1e3:.2f} ms | {(on - off) * 1e3:+.2f} ms | "
                          f"{alone * 1e6:.0f} us |",
                          flush=True)


if __name__ == "__main__":
    main()
