"""What a reader's open and its per-call refresh cost (by hand; storage/readview.py).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_readers.py

An on-disk database holding ``A`` (64 x 64 float64, 16 tiles) and ``--tensors`` other tensors
of 16 tiles each. Medians of ``--runs``:

- open, no writer: ``tensordb.connect(root, read_only=True)`` and close (its lease, a brief
  read-only open of catalog.duckdb, the copy, the pin); beside it a bare DuckDB read-only open
  and close of the same file, what a reader's open cost at least before;
- refresh, nothing new: what each call on a reader costs when nothing was committed (a stat of
  the catalog file, a look at the kernel's lock table and at the snapshots directory);
- refresh, catalog re-read: the same call when the catalog changed with no writer open (forced
  by forgetting the stamp);
- open beside a writer: a writer process holds the database; the reader waits for its answer
  (its thread looks every 50 ms) and loads the published snapshot;
- refresh to a published snapshot: the load of the newest snapshot (forced).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import tensordb  # noqa: E402

HOLD = ("import sys, tensordb; c = tensordb.connect(sys.argv[1]); "
        "print('ready', flush=True); sys.stdin.read(); c.close()")


def _median_ms(f, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench(tensors: int, runs: int) -> list[tuple[str, float]]:
    root = tempfile.mkdtemp(prefix="bench-readers-") + "/db"
    with tensordb.connect(root) as con:
        con.load("A", np.ones((64, 64)), tile=(16, 16))
        for k in range(tensors):
            con.load(f"T{k}", np.full((64, 64), k + 1.0), tile=(16, 16))
    out = []
    out.append(("open, no writer", _median_ms(
        lambda: tensordb.connect(root, read_only=True).close(), runs)))
    out.append(("bare DuckDB read-only open", _median_ms(
        lambda: duckdb.connect(root + "/catalog.duckdb", read_only=True).close(), runs)))
    with tensordb.connect(root, read_only=True) as con:
        store = con.store
        out.append(("refresh, nothing new", _median_ms(store.refresh_snapshot, runs * 10)))

        def reread():
            store.view.stamp = None
            store.refresh_snapshot()
        out.append(("refresh, catalog re-read", _median_ms(reread, runs)))
    writer = subprocess.Popen([sys.executable, "-c", HOLD, root], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == b"ready"
        out.append(("open beside a writer", _median_ms(
            lambda: tensordb.connect(root, read_only=True).close(), runs)))
        with tensordb.connect(root, read_only=True) as con:
            store = con.store

            def reload():
                store.view.seq = 0
                store.refresh_snapshot()
            out.append(("refresh to a published snapshot", _median_ms(reload, runs)))
    finally:
        writer.communicate(b"", timeout=60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tensors", type=int, nargs="+", default=[0, 300])
    args = parser.parse_args()
    print("| other tensors | what | median |")
    print("|---:|:---|---:|")
    for n in args.tensors:
        for what, ms in bench(n, args.runs):
            print(f"| {n} | {what} | {ms:.2f} ms |", flush=True)


if __name__ == "__main__":
    main()
