"""A sparse matrix bigger than RAM (issue 26): streamed load and SpMM at memory_limit = 2GB.

Run by hand (the default size writes about 37 GB: check ``df -h`` first):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_sparse_bigger
    ... --log2-nodes 20 --per-row 64     # a small run: about a minute

G: a uniform random graph of 2^--log2-nodes nodes, --per-row column draws a row (repeats in a
row dropped), float32 values in [0, 1), made slab by slab with numpy (slab ``s`` from the seed
``(2026, s)``: the oracle makes any slab again) and loaded with ``con.load("G", slabs,
shape=...)`` (formats/slabs.py: one band of tile rows at a time). X: float32 n x --cols,
random. Each step runs in a fresh process under ../shared/tools/peak-mem at the memory limit:

1. the load of G (the generator's time included: it is the source);
2. G's payload files read once, as ``cat files > /dev/null`` does, after their pages were
   dropped from the page cache (``posix_fadvise(DONTNEED)`` on each file);
3. ``Y[i,k] = SUM(G[i,j] * X[j,k]);`` stored to stored on --workers workers, after the same
   eviction.

Y is checked against scipy on --check-slabs slabs of rows (made again from their seeds) spread
over the matrix. Figures: peak anonymous memory (absolute, and growth over the child's idle
memory after connecting), seconds, and the ratio of the SpMM's time to the read-once time.
The database is deleted at the end, also on error.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .bench_bigdata import cat_seconds, free_bytes, payload_files
from .bench_memory import PEAK_MEM

GiB = 2 ** 30
MiB = 2 ** 20


def slab(seed: int, s: int, rows: int, n: int, per_row: int):
    """Row slab ``s`` (rows ``s * rows`` onwards) of the graph: a scipy CSR array, column
    indices sorted and distinct in each row, int32 indices."""
    import scipy.sparse as sp
    rng = np.random.default_rng([seed, s])
    cols = rng.integers(0, n, (rows, per_row), dtype=np.int32)
    cols.sort(axis=1)
    keep = np.ones(cols.shape, bool)
    np.not_equal(cols[:, 1:], cols[:, :-1], out=keep[:, 1:])
    indptr = np.zeros(rows + 1, np.int32)
    np.cumsum(keep.sum(axis=1, dtype=np.int32), out=indptr[1:])
    indices = cols[keep]
    del cols, keep
    data = rng.random(indices.size, dtype=np.float32)
    m = sp.csr_array((data, indices, indptr), shape=(rows, n), copy=False)
    m.has_sorted_indices = True
    return m


def slabs(seed: int, n: int, rows: int, per_row: int):
    for s in range(n // rows):
        yield slab(seed, s, rows, n, per_row)


def x_matrix(n: int, k: int) -> np.ndarray:
    return np.random.default_rng(7).random((n, k), dtype=np.float32)


LOAD_CHILD = r"""
import json, os, sys, time
import tensordb
from tests.harness import rss_anon as anon
from tests.bench.bench_sparse_bigger import slabs
db, limit, n, rows, per_row, tile_rows = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
con = tensordb.connect(db, memory_limit=limit)
con.execute('SELECT 1')
idle = anon()
c0, t0 = os.times(), time.perf_counter()
con.load('G', slabs(2026, n, rows, per_row), shape=(n, n), tile=(tile_rows, n), dims=['i', 'j'])
seconds, c1 = time.perf_counter() - t0, os.times()
d = con.describe('G')
print(json.dumps({'idle': idle, 'seconds': seconds, 'nnz': d['nnz'], 'bytes': d['bytes'],
                  'cpu': c1.user + c1.system - c0.user - c0.system,
                  'tiles': d['tile_count']}))
"""

SPMM_CHILD = r"""
import json, os, sys, time
import tensordb
from tests.harness import rss_anon as anon
db, limit, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = tensordb.connect(db, memory_limit=limit, workers=workers)
con.execute('SELECT 1')
print(con.explain('Y[i,k] = SUM(G[i,j] * X[j,k]);'), flush=True)
idle = anon()
c0, t0 = os.times(), time.perf_counter()
con.execute('Y[i,k] = SUM(G[i,j] * X[j,k]);')
seconds, c1 = time.perf_counter() - t0, os.times()
cpu = c1.user + c1.system - c0.user - c0.system
print(json.dumps({'idle': idle, 'seconds': seconds, 'cpu': cpu}))
"""


def evict(files) -> None:
    """Drop the files' clean pages from the page cache (they are read from disk next)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def under_peak_mem(code: str, *args, out: bool = False) -> tuple[dict, dict]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, str(PEAK_MEM), "--json", "--", sys.executable, "-c",
                           code, *map(str, args)], capture_output=True, text=True, timeout=7200,
                          env=env, cwd=root)
    try:
        peak = json.loads(proc.stderr.strip().splitlines()[-1])
    except (ValueError, IndexError):
        peak = {"rc": None}
    if peak["rc"] != 0:
        raise RuntimeError(f"child failed: {proc.stderr[-3000:]}")
    if out:
        print("\n".join(proc.stdout.strip().splitlines()[:-1]), flush=True)
    return json.loads(proc.stdout.strip().splitlines()[-1]), peak


def check(db: Path, args, n: int) -> float:
    """Largest relative error of Y on --check-slabs slabs of rows against scipy."""
    import tensordb
    x = x_matrix(n, args.cols).astype(np.float64)
    count = n // args.slab_rows
    picks = sorted(set(np.linspace(0, count - 1, args.check_slabs).astype(int).tolist()))
    worst = 0.0
    with tensordb.connect(db, read_only=True) as con:
        y = con.store.open("Y")
        for s in picks:
            g = slab(2026, s, args.slab_rows, n, args.per_row)
            want = g.astype(np.float64) @ x
            r0 = s * args.slab_rows
            got = y.read_box((r0, 0), (r0 + args.slab_rows, args.cols))
            err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
            worst = max(worst, err)
    return worst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2-nodes", type=int, default=24)
    ap.add_argument("--per-row", type=int, default=276, help="column draws a row")
    ap.add_argument("--tile-rows", type=int, default=65536)
    ap.add_argument("--slab-rows", type=int, default=65536,
                    help="rows the generator yields at once")
    ap.add_argument("--cols", type=int, default=4, help="X's columns (k)")
    ap.add_argument("--limit", default="2GB")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--check-slabs", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp", help="where the database goes")
    ap.add_argument("--keep-free", type=float, default=12.0, help="GiB of disk left to others")
    ap.add_argument("--x-tile", choices=("one", "default"), default="one",
                    help="X stored as one tile (n x k), or in the dense default tiles")
    ap.add_argument("--warm", action="store_true", help="run the SpMM a second time, not evicted")
    ap.add_argument("--db", help="keep the database here (loaded only if it is not there yet; "
                    "not deleted): for repeated SpMM runs")
    args = ap.parse_args(argv)
    n = 2 ** args.log2_nodes
    if n % args.slab_rows:
        ap.error("--slab-rows must divide the node count")
    need = n * args.per_row * 8 + 2 * n * args.cols * 4 + GiB
    free = free_bytes(Path(args.dir))
    reuse = bool(args.db) and Path(args.db).with_suffix(".load.json").exists()
    if free - need < args.keep_free * GiB and not reuse:
        print(f"bench_sparse_bigger: skipped: {free / GiB:.0f} GiB free in {args.dir}, about "
              f"{need / GiB:.0f} GiB needed and {args.keep_free:.0f} GiB to leave free")
        return
    if args.db:
        run(Path(args.db), args, n)
        return
    root = Path(tempfile.mkdtemp(prefix="tensordb-sparse-bigger-", dir=args.dir))
    try:
        run(root / "g.tdb", args, n)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        print(f"removed {root}", flush=True)


def run(db: Path, args, n: int) -> None:
    import tensordb
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    loaded = db.with_suffix(".load.json")
    with tensordb.connect(db) as con:  # X first, so that G's load is measured alone
        # one tile: every SpMM call gathers from all of X, a view of the mapping (in the
        # default tiles, the plan follows X's tiles and cuts G's columns as well: docs)
        con.load("X", x_matrix(n, args.cols), dims=["j", "k"], replace=True,
                 tile=(n, args.cols) if args.x_tile == "one" else None)
        con.drop("Y", if_exists=True)
        have = con.store.has("G")
    if have and loaded.exists():
        load, lpeak = json.loads(loaded.read_text())
    else:
        load, lpeak = under_peak_mem(LOAD_CHILD, db, args.limit, n, args.slab_rows,
                                     args.per_row, args.tile_rows)
        loaded.write_text(json.dumps([load, lpeak]))
    print(f"load: {load} {lpeak}", flush=True)
    files = payload_files(db, "G")
    evict(files)
    cat = cat_seconds(files)
    print(f"read once: {cat:.1f} s", flush=True)
    evict(files)
    spmm, speak = under_peak_mem(SPMM_CHILD, db, args.limit, args.workers, out=True)
    print(f"spmm: {spmm} {speak}", flush=True)
    if args.warm:  # again, G's pages left in the page cache (as many as it holds)
        warm, wpeak = under_peak_mem(SPMM_CHILD, db, args.limit, args.workers)
        print(f"spmm, warm: {warm} {wpeak}", flush=True)
    err = check(db, args, n)
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    csr_bytes = load["nnz"] * 8 + (n + 1) * 4
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    print(json.dumps({
        "nodes": n, "nnz": load["nnz"], "stored_bytes": load["bytes"], "csr_bytes": csr_bytes,
        "tiles": load["tiles"], "ram": ram, "ratio_to_ram": load["bytes"] / ram,
        "load_s": load["seconds"], "load_peak_anon": lpeak["peak_anon_bytes"],
        "load_growth": lpeak["peak_anon_bytes"] - load["idle"],
        "read_once_s": cat, "spmm_s": spmm["seconds"], "spmm_peak_anon": speak["peak_anon_bytes"],
        "spmm_growth": speak["peak_anon_bytes"] - spmm["idle"],
        "spmm_over_read_once": spmm["seconds"] / cat, "max_rel_error": err}, indent=1))


if __name__ == "__main__":
    main()
