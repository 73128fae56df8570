"""What verifying checksums on read costs: a 256 MiB float32 tensor (16 tiles of 16 MiB) read
cold (its pages dropped from the page cache with posix_fadvise DONTNEED) and warm, with its
tiles' CRC-32 checked (the first read in a process) and without (a tile this process verified
already), through ``con.tensor`` (pread into the result), a scan of every tile's mapping (what
the executors' loads and SQL read) and an einsum over it. Medians of ``--runs`` runs, in one
process; each read in a connection of its own (no mapping outlives it, so dropped pages stay
dropped). Writes a table to stdout (and JSON with ``--json``).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_verify.py
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time

import numpy as np

import tensordb
from tensordb.storage import checksum, verify


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def scan(con) -> float:
    """Touch every stored tile through the mapping (a sum: every page is read, in order)."""
    return sum(float(np.add.reduce(tile, axis=None)) for _, tile in con.store.open("A").tiles())


READS = {"con.tensor": lambda con: con.tensor("A"),
         "mapped tiles": scan,
         "einsum SUM(A[i,j])": lambda con: con.execute("R[i] = SUM(A[i,j])")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192, help="the tensor is n x n float32")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"crc32": checksum.IMPLEMENTATION, "bytes": args.n * args.n * 4, "reads": {}}
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        root = os.path.join(tmp, "w.tdb")
        with tensordb.connect(root) as con:
            con.load("A", np.random.default_rng(0).standard_normal((args.n, args.n),
                                                                   dtype=np.float32))
        with tensordb.connect(root) as con:
            path = con.store.open("A").path
        for name, read in READS.items():
            runs: dict[str, list] = {}
            for _ in range(args.runs):  # the four cases interleaved: load from other work on
                for cache in ("cold", "warm"):  # the machine falls on each alike
                    for checked in (True, False):
                        with tensordb.connect(root, workers=2) as con:
                            read(con)  # the tiles verified now, the pages cached
                        gc.collect()  # no mapping of the file is left: its pages can go
                        if checked:
                            verify.forget_verified()
                        if cache == "cold":
                            drop_cache(path)
                        with tensordb.connect(root, workers=2) as con:
                            t0 = time.perf_counter()
                            read(con)
                            dt = time.perf_counter() - t0
                        gc.collect()
                        runs.setdefault(f"{cache}, {'verified' if checked else 'not verified'}",
                                        []).append(dt)
            out["reads"][name] = {k: statistics.median(v) for k, v in runs.items()}
    if args.json:
        print(json.dumps(out, indent=1))
    mib = out["bytes"] / 2**20
    print(f"{mib:.0f} MiB float32, crc32 by {out['crc32']}; median seconds of {args.runs} runs")
    cols = ["cold, verified", "cold, not verified", "warm, verified", "warm, not verified"]
    print(f"{'read':22s}" + "".join(f"{c:>22s}" for c in cols) + f"{'warm ratio':>12s}")
    for name, t in out["reads"].items():
        ratio = t["warm, verified"] / t["warm, not verified"]
        print(f"{name:22s}" + "".join(f"{t[c]:22.4f}" for c in cols) + f"{ratio:12.2f}")


if __name__ == "__main__":
    main()
