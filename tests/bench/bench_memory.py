"""Peak memory under a memory_limit: what the engine holds while a query runs, against the budget.

Run by hand (figures go to docs/benchmarks.md, between the memory markers):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_memory

Each case is set up once (inputs stored in a database directory under --dir), then every run is a
fresh process under ../shared/tools/peak-mem (peak anonymous memory of the process tree: heap and
numpy buffers, not the page cache of memory-mapped tiles). The child reports its own idle anonymous
memory after connecting, so the figure quoted is the growth while the query ran: peak - idle.
Medians of --repeat runs, with and without the limit, in the same run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# ../shared/tools/peak-mem next to the checkout (/work/main) or its worktree (/work/wt/x).
PEAK_MEM = next((p / "shared" / "tools" / "peak-mem" for p in Path(__file__).resolve().parents
                 if (p / "shared" / "tools" / "peak-mem").exists()),
                Path(__file__).resolve().parents[3] / "shared" / "tools" / "peak-mem")
MiB = 2 ** 20


@dataclass(frozen=True)
class Case:
    name: str
    tensors: dict          # name -> (shape, tile or None)
    script: str            # the dialect script one run executes


def cases(shrink: int = 1) -> list[Case]:
    """The cases; ``shrink`` divides every dimension (and tile) by that much, for a quick run."""
    return [_shrunk(c, shrink) for c in _CASES]


def _shrunk(case: Case, k: int) -> Case:
    if k == 1:
        return case
    def small(dims):
        return None if dims is None else tuple(max(1, n // k) for n in dims)
    return Case(f"{case.name} /{k}", {n: (small(shape), small(tile))
                                       for n, (shape, tile) in case.tensors.items()}, case.script)


_CASES = [
    # Operands 2x and 0.5x a 256 MB budget; the contraction is long enough that a planner
    # which splits it keeps many partial products alive.
    Case("matmul 8192x16384 @ 16384x2048", {"A": ((8192, 16384), None), "B": ((16384, 2048), None)},
         "C[i,k] = SUM(A[i,j] * B[j,k]);"),
    # An MLP layer whose unstored activation (8192 x 16384 float32 = 512 MiB) is twice the budget.
    Case("chain LET H (512 MiB) then H W2", {"X": ((8192, 1024), None), "W1": ((1024, 16384), None),
                                              "W2": ((16384, 256), None)},
         "LET H[b,f] = RELU(SUM(X[b,d] * W1[d,f])); Y[b,o] = SUM(H[b,f] * W2[f,o]);"),
    # Many partials folded into one small output.
    Case("gram 65536x1024 (many partials)", {"T": ((65536, 1024), (4096, 1024))},
         "G[i,j] = SUM(T[k,i] * T[k,j]);"),
    # A semiring product: no BLAS, broadcast temporaries.
    Case("min-plus 1024", {"D": ((1024, 1024), None)}, "P[i,j] = MIN(D[i,k] + D[k,j]);"),
]


CHILD = r"""
import json, sys, time
import tensordb
path, script, workers, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
from tests.harness import rss_anon as anon  # the one sampler (the bench runs from the repository root)
con = tensordb.connect(path, workers=workers, memory_limit=limit)  # 'none': no limit (None is the default)
con.execute('SELECT 1')  # warm DuckDB so its own start-up is idle memory
# The first tensor a process stores costs ~30 MiB once (DuckDB's catalog writes, imports): a
# tiny stored query first, so that growth is what the case itself adds.
import numpy
con.load('warm_a', numpy.ones((64, 64), 'float32'), replace=True)
con.execute('warm_b[i,j] = SUM(warm_a[i,k] * warm_a[k,j]);')
con.drop('warm_b')
con.drop('warm_a')
idle = anon()
t0 = time.perf_counter()
err = None
try:
    con.execute(script)
except tensordb.Error as exc:
    err = f'{type(exc).__name__}: {str(exc).splitlines()[0]}'
print(json.dumps({'idle': idle, 'seconds': time.perf_counter() - t0, 'error': err}))
"""


def setup(case: Case, root: Path) -> Path:
    import tensordb
    path = root / (case.name.split()[0] + ".tdb")
    if path.exists():
        shutil.rmtree(path)
    rng = np.random.default_rng(0)
    with tensordb.connect(path) as con:
        for name, (shape, tile) in case.tensors.items():
            con.load(name, rng.standard_normal(shape, dtype=np.float32), tile=tile)
    return path


def run_once(path: Path, script: str, workers: int, limit: str) -> dict:
    proc = subprocess.run([sys.executable, str(PEAK_MEM), "--json", "--", sys.executable, "-c", CHILD,
                           str(path), script, str(workers), limit],
                          capture_output=True, text=True, timeout=1800)
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    peak = json.loads(proc.stderr.strip().splitlines()[-1])
    return {"growth": peak["peak_anon_bytes"] - child["idle"], "seconds": child["seconds"],
            "error": child["error"]}


def measure(path: Path, case: Case, workers: int, limit: str, repeat: int) -> dict:
    runs = [run_once(path, case.script, workers, limit) for _ in range(repeat)]
    return {"growth": statistics.median(r["growth"] for r in runs),
            "seconds": statistics.median(r["seconds"] for r in runs),
            "error": next((r["error"] for r in runs if r["error"]), None)}


def render(rows: list[dict], args) -> str:
    lines = ["## Memory under a budget", "",
             f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m "
             f"tests.bench.bench_memory --limit {args.limit} --repeat {args.repeat}"
             + (f" --shrink {args.shrink}" if args.shrink != 1 else "") + "`",
             "Growth = peak anonymous memory (../shared/tools/peak-mem) minus the process's idle "
             "anonymous memory after connecting; medians. Ratios: growth / limit (goal <= 1.25) and "
             "time with the limit / time without (goal <= 1.5).", "",
             "| case | workers | growth, no limit | growth, limit | growth / limit | s, no limit | "
             "s, limit | time ratio | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    limit = _bytes(args.limit)
    for r in rows:
        free, lim = r["free"], r["limited"]
        lines.append(f"| {r['case']} | {r['workers']} | {free['growth'] / MiB:.0f} MiB | "
                     f"{lim['growth'] / MiB:.0f} MiB | {lim['growth'] / limit:.2f} | {free['seconds']:.2f} | "
                     f"{lim['seconds']:.2f} | {lim['seconds'] / free['seconds']:.2f} | {lim['error'] or ''} |")
    return "\n".join(lines)


def _bytes(text: str) -> int:
    from tensordb.config import parse_bytes
    return parse_bytes(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", default="256MB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--only", default="")
    ap.add_argument("--shrink", type=int, default=1,
                    help="divide every dimension by this (a quick check that it runs; not for docs)")
    ap.add_argument("--dir", default=None, help="where the benchmark databases go (default: a temp dir)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = ap.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="tensordb-bench-mem-"))
    rows = []
    try:
        for case in cases(args.shrink):
            if args.only and args.only not in case.name:
                continue
            path = setup(case, root)
            for w in (int(x) for x in args.workers.split(",")):
                row = {"case": case.name, "workers": w,
                       "free": measure(path, case, w, "none", args.repeat),
                       "limited": measure(path, case, w, args.limit, args.repeat)}
                rows.append(row)
                print(row, flush=True)
            shutil.rmtree(path)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    text = render(rows, args)
    print(text)
    if not args.no_write and not args.only and args.shrink == 1:
        from .bench_suite import write_section
        write_section(text, "memory")


if __name__ == "__main__":
    main()
