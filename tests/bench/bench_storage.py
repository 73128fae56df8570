"""Load and read back a 1 GiB float32 tensor from .npy, next to numpy.load on the same file.

Each measurement runs in a fresh Python process, which reports the operation's wall time and its
peak resident memory (VmHWM) above the process's resident memory just before the operation.
The page cache is warm (the file was just written); medians of ``--runs`` runs.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_storage.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

CHILD = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import tensordb

    def rss(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024

    def reset_peak():
        # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    mode, npy, db = sys.argv[1:4]
    con = tensordb.connect(db) if mode.startswith("tensordb") else None
    reset_peak()
    base = rss("VmRSS")
    t0 = time.perf_counter()
    if mode == "tensordb_load":
        con.load("A", npy, replace=True)
    elif mode == "tensordb_read":
        out = con.tensor("A")
    elif mode == "numpy_load":
        out = np.load(npy)
    elif mode == "numpy_mmap_copy":
        out = np.array(np.load(npy, mmap_mode="r"))
    elif mode == "numpy_mmap_sum":
        out = np.load(npy, mmap_mode="r").sum(dtype=np.float64)
    seconds = time.perf_counter() - t0
    peak = rss("VmHWM") - base
    if con is not None:
        con.close()
    print(json.dumps({"seconds": seconds, "peak": peak}))
""")

MODES = [
    ("tensordb_load", "con.load('A', 'x.npy')  (tiles written, fsync, commit)"),
    ("numpy_load", "np.load('x.npy')"),
    ("tensordb_read", "con.tensor('A')"),
    ("numpy_mmap_copy", "np.array(np.load('x.npy', mmap_mode='r'))"),
    ("numpy_mmap_sum", "np.load('x.npy', mmap_mode='r').sum()  (no copy)"),
]


def run(mode: str, npy: str, db: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, npy, db], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="tensor size in GiB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to put the .npy file and the database")
    args = parser.parse_args()
    cols = 16384
    rows = int(args.gib * (1 << 30)) // (4 * cols)
    size = rows * cols * 4
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        npy, db = os.path.join(tmp, "x.npy"), os.path.join(tmp, "db")
        out = np.lib.format.open_memmap(npy, mode="w+", dtype="float32", shape=(rows, cols))
        for r in range(0, rows, 1024):
            out[r:r + 1024] = np.random.default_rng(r).random((min(1024, rows - r), cols),
                                                                dtype=np.float32)
        out.flush()
        del out
        results = {}
        for mode, _ in MODES:
            results[mode] = [run(mode, npy, db) for _ in range(args.runs)]
        # Check what was stored, outside the timings.
        check = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys, numpy as np, tensordb
            with tensordb.connect(sys.argv[2], read_only=True) as con:
                ok = np.array_equal(con.tensor("A"), np.load(sys.argv[1], mmap_mode="r"))
                print(ok, con.describe("A")["tile_shape"], con.describe("A")["tile_count"])
            """), npy, db], capture_output=True, text=True, check=True).stdout.strip()
    print(f"tensor: {rows} x {cols} float32 = {size / (1 << 30):.2f} GiB; "
          f"{args.runs} runs each, fresh process per run; stored == file, tile, tiles: {check}")
    print(f"{'operation':<58} {'median s':>9} {'GiB/s':>7} {'peak RSS MiB':>13} {'x size':>7}")
    for mode, label in MODES:
        secs = statistics.median(r["seconds"] for r in results[mode])
        peak = statistics.median(r["peak"] for r in results[mode])
        print(f"{label:<58} {secs:9.2f} {size / (1 << 30) / secs:7.2f} {peak / (1 << 20):13.0f} "
              f"{peak / size:7.2f}")


if __name__ == "__main__":
    main()
