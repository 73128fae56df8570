"""Bigger than RAM: a float32 tensor of 32 GiB, loaded and queried at memory_limit = 2 GB.

Run by hand (it needs about 80 GiB of free disk, writes 70 GiB and reads some 250 GiB):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_bigdata

Steps: a .npy of --rows x --cols float32 is written in chunks with numpy.lib.format.open_memmap
(random data; column sums and maxima, some rows of X @ w and some columns of the slice's Gram
matrix are computed from the chunks as they are written, as the oracle); it is loaded into a
database directory (LOAD, one tile at a time, tiles of --tile-rows rows), and its first
--slice-rows rows are loaded as a second tensor S from a memory-mapped view of the same file (the
dialect has no slicing). The database copies the payload (it cannot reference a .npy in place),
so the .npy is deleted after loading. Then each query runs --repeat times in a fresh process under
../shared/tools/peak-mem at the memory limit, next to reading the tensor's own payload files
once (as `cat files > /dev/null` does, same run). Every file is removed at the end, also on error.
Figures: medians; growth = peak anonymous memory minus the child's idle anonymous memory.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .bench_memory import PEAK_MEM  # noqa: E402
GiB = 2 ** 30
MiB = 2 ** 20
CHECK_ROWS = 4096  # rows of X @ w checked, from each of three places in X

QUERIES = {
    "column sums": ("CS[c] = SUM(X[r,c]);", "X"),
    "column maxima": ("CM[c] = MAX(X[r,c]);", "X"),
    "X @ w (1024x64)": ("Y[r,k] = SUM(X[r,c] * W[c,k]);", "X"),
    "Gram of the slice": ("G[c,d] = SUM(S[r,c] * S[r,d]);", "S"),
}

# The child: connect at the limit, note idle anonymous memory, run, check against the oracle.
CHILD = r"""
import json, sys, time
import numpy as np
import tensordb
db, limit, script, oracle = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
from tests.harness import rss_anon as anon  # the one sampler (the bench runs from the repository root)
con = tensordb.connect(db, memory_limit=limit)
con.execute('SELECT 1')
idle = anon()
t0 = time.perf_counter()
con.execute(script)
seconds = time.perf_counter() - t0
o = np.load(oracle)
if script.startswith('CS'):
    got, want = con.tensor('CS'), o['colsum']
elif script.startswith('CM'):
    got, want = con.tensor('CM'), o['colmax']
elif script.startswith('Y'):
    y = con.store.open('Y')
    got = np.concatenate([y.read_box((int(s), 0), (int(s) + len(o['yrows'][0]), y.meta.shape[1]))
                          for s in o['ystarts']])
    want = np.concatenate(list(o['yrows']))
else:
    got, want = con.tensor('G')[:, :o['gram'].shape[1]], o['gram']
err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
print(json.dumps({'idle': idle, 'seconds': seconds, 'relerr': err}))
"""

LOAD_CHILD = r"""
import json, sys, time
import numpy as np
import tensordb
db, limit, npy, tile_rows, slice_rows = sys.argv[1:6]
tile_rows, slice_rows = int(tile_rows), int(slice_rows)
from tests.harness import rss_anon as anon  # the one sampler (the bench runs from the repository root)
con = tensordb.connect(db, memory_limit=limit)
con.execute('SELECT 1')
idle = anon()
t0 = time.perf_counter()
view = np.load(npy, mmap_mode="r")[:slice_rows]   # S: a view of the same file, not a copy
con.execute(f"LOAD TENSOR X (r, c) FROM '{npy}' TILE (r {tile_rows}, c {view.shape[1]})")
seconds = time.perf_counter() - t0
con.load('S', view, tile=(tile_rows, view.shape[1]), dims=['r', 'c'])
print(json.dumps({'idle': idle, 'seconds': seconds}))
"""


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def write_source(path: Path, rows: int, cols: int, chunk: int, slice_rows: int, w: np.ndarray,
                 oracle: Path) -> None:
    """The .npy, chunk by chunk, and the oracle from the same chunks."""
    rng = np.random.default_rng(2026)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    colsum = np.zeros(cols, np.float64)
    colmax = np.full(cols, -np.inf, np.float32)
    gcols = min(64, cols)
    gram = np.zeros((cols, gcols), np.float64)
    ystarts = [0, (rows // 2) // chunk * chunk, rows - chunk]
    yrows = []
    try:
        for start in range(0, rows, chunk):
            block = rng.random((min(chunk, rows - start), cols), dtype=np.float32) - 0.5
            out[start:start + len(block)] = block
            colsum += block.sum(axis=0, dtype=np.float64)
            np.maximum(colmax, block.max(axis=0), out=colmax)
            if start < slice_rows:
                part = block[:slice_rows - start].astype(np.float64)
                gram += part.T @ part[:, :gcols]
            if (start // chunk) % 32 == 31:
                out.flush()  # write back as we go: dirty pages would crowd out other processes
            if start in ystarts:
                yrows.append(block[:CHECK_ROWS].astype(np.float64) @ w.astype(np.float64))
        out.flush()
    finally:
        del out
    np.savez(oracle, colsum=colsum, colmax=colmax, gram=gram,
             ystarts=np.array(ystarts), yrows=np.stack(yrows))


def payload_files(db: Path, tensor: str) -> list[str]:
    import tensordb
    with tensordb.connect(db, read_only=True) as con:
        rows = con.store.duck.execute(
            "SELECT DISTINCT file FROM tensordb.tiles WHERE tensor = ? ORDER BY file",
            [tensor]).fetchall()
        return [os.path.join(con.store.tiles_dir, f) for (f,) in rows]


def cat_seconds(files: list[str]) -> float:
    """Read the files once, as `cat files > /dev/null` does (16 MiB reads into one buffer; not
    through /dev/null itself, which on some containers is a regular file that fills the disk)."""
    buf = bytearray(16 * MiB)
    t0 = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - t0


def under_peak_mem(args: list[str]) -> tuple[dict, dict]:
    proc = subprocess.run([sys.executable, str(PEAK_MEM), "--json", "--", sys.executable, "-c",
                           *args], capture_output=True, text=True, timeout=7200)
    try:
        peak = json.loads(proc.stderr.strip().splitlines()[-1])
    except (ValueError, IndexError):
        peak = {"rc": None}
    if peak["rc"] != 0:
        raise RuntimeError(f"child failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), peak


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8_388_608)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--tile-rows", type=int, default=32_768, help="128 MiB tiles of 1024 columns")
    ap.add_argument("--slice-rows", type=int, default=1_048_576, help="S: 4 GiB of 1024 columns")
    ap.add_argument("--limit", default="2GB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp", help="where the files go (one file system)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = ap.parse_args(argv)
    size = args.rows * args.cols * 4
    slice_size = min(args.slice_rows, args.rows) * args.cols * 4
    need = 2 * size + slice_size + args.rows * 64 * 4 + 4 * GiB  # source + X + S + Y + slack
    free = free_bytes(Path(args.dir))
    if free < need:
        print(f"bench_bigdata: skipped: {free / GiB:.0f} GiB free in {args.dir}, "
              f"{need / GiB:.0f} GiB needed (source + database + slice + X @ w)")
        return
    root = Path(tempfile.mkdtemp(prefix="tensordb-bigdata-", dir=args.dir))
    try:
        run(root, args, size)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        print(f"removed {root}", flush=True)


def run(root: Path, args, size: int) -> None:
    npy, oracle, db, wfile = root / "x.npy", root / "oracle.npz", root / "big.tdb", root / "w.npy"
    w = np.random.default_rng(7).standard_normal((args.cols, 64)).astype(np.float32)
    np.save(wfile, w)
    t0 = time.perf_counter()
    write_source(npy, args.rows, args.cols, args.tile_rows, args.slice_rows, w, oracle)
    print(f"wrote {npy} ({size / GiB:.1f} GiB) in {time.perf_counter() - t0:.0f} s", flush=True)
    src_cat = cat_seconds([str(npy)])
    child, peak = under_peak_mem([LOAD_CHILD, str(db), args.limit, str(npy), str(args.tile_rows),
                                  str(args.slice_rows)])
    load = {"seconds": child["seconds"], "growth": peak["peak_anon_bytes"] - child["idle"],
            "cat": src_cat}
    print(f"load: {load}", flush=True)
    npy.unlink()  # the database holds its own copy
    import tensordb
    with tensordb.connect(db) as con:
        con.load("W", str(wfile), dims=["c", "k"])
    files = {"X": payload_files(db, "X"), "S": payload_files(db, "S")}
    results = []
    for label, (script, tensor) in QUERIES.items():
        runs = []
        for _ in range(args.repeat):
            cat = cat_seconds(files[tensor])
            child, peak = under_peak_mem([CHILD, str(db), args.limit, script, str(oracle)])
            runs.append({"cat": cat, "seconds": child["seconds"],
                         "growth": peak["peak_anon_bytes"] - child["idle"],
                         "relerr": child["relerr"]})
            print(f"{label}: {runs[-1]}", flush=True)
        results.append({"query": label, "script": script, "tensor": tensor,
                        **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
                        "max_relerr": max(r["relerr"] for r in runs)})
    text = render(results, load, args, size)
    print(text)
    if not args.no_write:
        from .bench_suite import write_section
        write_section(text, "bigdata")


def render(results: list[dict], load: dict, args, size: int) -> str:
    lines = ["## Bigger than RAM", "",
             "Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m "
             f"tests.bench.bench_bigdata --rows {args.rows} --cols {args.cols} --tile-rows "
             f"{args.tile_rows} --limit {args.limit} --repeat {args.repeat}`", "",
             f"X: float32 {args.rows} x {args.cols} ({size / GiB:.0f} GiB) on a machine with "
             f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GiB:.0f} GiB of memory "
             f"and {os.cpu_count()} cores; tiles of {args.tile_rows} rows "
             f"({args.tile_rows * args.cols * 4 / MiB:.0f} MiB); S: its first {args.slice_rows} rows "
             f"({min(args.slice_rows, args.rows) * args.cols * 4 / GiB:.0f} GiB). memory_limit = "
             f"{args.limit}. Growth: peak anonymous memory (../shared/tools/peak-mem) minus the "
             "process's idle anonymous memory after connecting. Read once: the tensor's own payload "
             "files read once in 16 MiB pieces (as `cat files > /dev/null`) just before each run. "
             f"Medians of {args.repeat}; every "
             "result checked against numpy (relative error against the largest value).", "",
             f"Load (LOAD TENSOR X FROM 'x.npy' TILE (r {args.tile_rows}, c {args.cols})): "
             f"{load['seconds']:.0f} s, growth {load['growth'] / MiB:.0f} MiB; "
             f"reading x.npy once: {load['cat']:.0f} s.", "",
             "| query | statement | growth | s | s, read once | time / read once | max rel. error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['query']} | `{r['script']}` | {r['growth'] / MiB:.0f} MiB | "
                     f"{r['seconds']:.1f} | {r['cat']:.1f} | {r['seconds'] / r['cat']:.2f} | "
                     f"{r['max_relerr']:.1e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
