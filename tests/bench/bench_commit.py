"""What an on-disk commit's durability costs (run by hand; under a minute):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_commit

1. The disk's floor, in a directory next to the database: an append of 1.5 KB and its
   fdatasync (what DuckDB's COMMIT does to its WAL), a bare flush (4 KiB rewritten in place,
   fdatasync), a new 1 MiB payload file fdatasynced while its directory is fsynced (tensordb's
   payload step), and DuckDB's COMMIT of a one-row UPDATE with its WAL synced and without
   (``fsync_mode``).
2. One statement on disk: a shortest-path step (``MIN(dist[j] + D[j,k])`` over an R-MAT graph)
   repeated, alternated step by step in one process on four databases: on disk as shipped
   (a step's rows in the redo log, storage/redolog.py), on disk with the redo log off
   (``redolog.ENABLED = False`` at its open: the rows in DuckDB at each COMMIT),
   on disk with every sync off (``store.fsync = False`` and DuckDB's ``fsync_mode = NONE``),
   and in memory. Durable minus unsynced is what the syncs cost the statement; unsynced minus
   in memory is the rest of an on-disk commit (the catalog rows, which in memory wait).
3. The syncs of those steps: each call tensordb makes (fdatasync of a payload, fsync of
   ``tiles/``), its time on its helper thread, and how long the statement waited for them
   before its COMMIT.

Figures are medians; the machine's load is printed with them (``os.getloadavg``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402
from tensordb.storage import staging, writer  # noqa: E402


def _ms(xs) -> str:
    return f"{1e3 * statistics.median(xs):.3f} ms (p10 {1e3 * np.percentile(xs, 10):.3f}, " \
           f"p90 {1e3 * np.percentile(xs, 90):.3f})"


def floor(root: str, runs: int) -> None:
    import duckdb
    d = tempfile.mkdtemp(dir=root)
    wal = os.open(os.path.join(d, "wal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    flush = os.open(os.path.join(d, "flush"), os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(flush, bytes(4096), 0)
    os.fsync(flush)
    record, page, mib = os.urandom(1500), os.urandom(4096), os.urandom(1 << 20)
    found = {k: [] for k in ("wal", "flush", "payload", "commit", "commit_nosync")}

    def payload(k: int) -> float:
        fd = os.open(os.path.join(d, f"p{k}.bin"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.pwrite(fd, mib, 0)
        t = time.perf_counter()
        with staging.one_directory_sync():
            staging.sync_in_background(fd, d)()
        return time.perf_counter() - t

    ducks = {}
    for key, mode in (("commit", "STANDARD"), ("commit_nosync", "NONE")):
        con = duckdb.connect(os.path.join(d, f"{key}.duckdb"))
        con.execute(f"SET fsync_mode = '{mode}'")
        con.execute("CREATE TABLE t (k INTEGER, v BIGINT)")
        con.execute("INSERT INTO t VALUES (1, 0)")
        ducks[key] = con
    for k in range(runs):
        t = time.perf_counter()
        os.write(wal, record)
        os.fdatasync(wal)
        found["wal"].append(time.perf_counter() - t)
        t = time.perf_counter()
        os.pwrite(flush, page, 0)
        os.fdatasync(flush)
        found["flush"].append(time.perf_counter() - t)
        found["payload"].append(payload(k))
        for key, con in ducks.items():
            con.execute("BEGIN")
            con.execute("UPDATE t SET v = ? WHERE k = 1", [k])
            t = time.perf_counter()
            con.execute("COMMIT")
            found[key].append(time.perf_counter() - t)
    for con in ducks.values():
        con.close()
    print(f"the disk's floor ({runs} each, load {os.getloadavg()[0]:.2f}):")
    print(f"  append 1.5 KB + fdatasync (a WAL commit):          {_ms(found['wal'])}")
    print(f"  4 KiB rewritten + fdatasync (a bare flush):         {_ms(found['flush'])}")
    print(f"  new 1 MiB payload: fdatasync || fsync of its dir:    {_ms(found['payload'])}")
    print(f"  DuckDB COMMIT of a one-row UPDATE, WAL synced:      {_ms(found['commit'])}")
    print(f"  the same, fsync_mode NONE:                          {_ms(found['commit_nosync'])}")


class Syncs:
    """tensordb's sync calls (on helper threads) and the statement's waits for them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.waits: list[float] = []
        self.lock = threading.Lock()
        real_datasync, real_dir, real_sib = staging._datasync, staging._fsync_dir, \
            writer.sync_in_background

        def datasync(fd):
            t = time.perf_counter()
            real_datasync(fd)
            with self.lock:
                self.calls.append(("fdatasync payload", time.perf_counter() - t))

        def fsync_dir(directory):
            t = time.perf_counter()
            real_dir(directory)
            with self.lock:
                self.calls.append(("fsync tiles/", time.perf_counter() - t))

        def sync_in_background(fd, directory):
            wait = real_sib(fd, directory)

            def timed():
                t = time.perf_counter()
                try:
                    wait()
                finally:
                    self.waits.append(time.perf_counter() - t)
            return timed
        staging._datasync, staging._fsync_dir = datasync, fsync_dir
        writer.sync_in_background = sync_in_background

    def clear(self) -> None:
        with self.lock:
            self.calls.clear()
            self.waits.clear()


def statements(root: str, scale: int, steps: int, syncs: Syncs) -> None:
    import scipy.sparse as sp
    from tests.bench.bench_sparse_graph import rmat
    rng = np.random.default_rng(1)
    i, j = rmat(scale, 8, rng)
    n = 1 << scale
    keep = i != j
    w = rng.integers(1, 11, int(keep.sum())).astype(np.float64)
    D = sp.coo_array((w, (i[keep], j[keep])), shape=(n, n)).tocsr().tocoo()
    D = sp.coo_array((np.r_[D.data, np.zeros(n)], (np.r_[D.row, np.arange(n)],
                                                   np.r_[D.col, np.arange(n)])), shape=(n, n))
    d0 = np.full(n, np.inf)
    d0[int(np.argmax(np.bincount(D.row, minlength=n)))] = 0.0
    cons = {}
    from tensordb.storage import redolog
    for key in ("on disk", "on disk, no redo log", "on disk, unsynced", "in memory"):
        redolog.ENABLED = key != "on disk, no redo log"  # rows to DuckDB at each commit
        con = tensordb.connect(None if key == "in memory" else
                               os.path.join(root, f"{len(cons)}.tdb"), workers=2)
        redolog.ENABLED = True
        if key == "on disk, unsynced":
            con.store.fsync = False
            con.store.duck.execute("SET fsync_mode = 'NONE'")
        con.load("D", D, fill_value=np.inf)
        con.load("dist", d0)
        cons[key] = con
    step = "CREATE OR REPLACE TENSOR dist[k] AS MIN(dist[j] + D[j,k])"
    times = {k: [] for k in cons}
    calls, waits = [], []
    for k in range(steps + 3):
        for key, con in cons.items():
            if k % 8 == 0:
                con.load("dist", d0, replace=True)
            syncs.clear()
            t = time.perf_counter()
            con.execute(step)
            if k >= 3:  # the first steps plan and warm the caches
                times[key].append(time.perf_counter() - t)
                if key == "on disk":
                    calls.append(list(syncs.calls))
                    waits.extend(syncs.waits)
    load = os.getloadavg()[0]
    print(f"\nan SSSP step on R-MAT scale {scale} ({n} nodes, {D.nnz} entries), {steps} steps "
          f"alternated, 2 workers, load {load:.2f}:")
    for key, ts in times.items():
        print(f"  {key:18s} {_ms(ts)}")
    on, duck, unsynced, memory = (statistics.median(times[k]) for k in cons)
    print(f"  the redo log against DuckDB's statements: {1e3 * (on - duck):+.2f} ms a step "
          f"({on / duck:.3f}x)")
    print(f"  the syncs: {1e3 * (on - unsynced):+.2f} ms a step (the redo log's own stays on); "
          f"the rest of the on-disk commit: {1e3 * (unsynced - memory):+.2f} ms")
    kinds = sorted({c for step_calls in calls for c, _ in step_calls})
    for kind in kinds:
        per = [sum(1 for c, _ in s if c == kind) for s in calls]
        took = [t for s in calls for c, t in s if c == kind]
        print(f"  {kind:18s} {statistics.median(per):.0f} a step, {_ms(took)} on its helper thread")
    print(f"  the statement waited for them before COMMIT: {_ms(waits)}")
    for con in cons.values():
        con.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where the databases go (default: a temporary "
                    "directory under /tmp)")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--scale", type=int, default=15, help="R-MAT scale of the SSSP graph")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    syncs = Syncs()
    with tempfile.TemporaryDirectory(prefix="tensordb-bench-commit-", dir=args.dir) as root:
        floor(root, args.runs)
        statements(root, args.scale, args.steps, syncs)


if __name__ == "__main__":
    main()
