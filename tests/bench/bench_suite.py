"""The workload suite through tensordb, NumPy/opt_einsum and dask.array, side by side.

Run by hand (numbers go to docs/benchmarks.md, between the suite markers):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_suite

tensordb is timed from stored tensors to a stored result (plan, run, write back); NumPy and dask
from in-memory arrays to an in-memory result. Each figure is the median of --repeat runs after
one warm-up; dask gets the best of several chunkings.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import tensordb

from .workloads import Workload, suite

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def median_time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def blas_info() -> str:
    from threadpoolctl import threadpool_info
    return ", ".join(f"{i['internal_api']} {i.get('version', '')} {i.get('architecture', '')} "
                     f"x{i['num_threads']}" for i in threadpool_info() if i["user_api"] == "blas")


def run_workload(w: Workload, repeat: int, workers: int, dask_on: bool) -> dict:
    rng = np.random.default_rng(0)
    arrays = w.arrays(rng)
    row = {"name": w.name}
    with tensordb.connect(workers=workers) as con:
        for name, a in arrays.items():
            con.load(name, a, tile=w.tile.get(name))
        graph = w.graph()
        row["tensordb"] = median_time(lambda: con.run(graph, replace=True), repeat)
        plan = con.last_plan
        row["calls"] = plan.kernel_calls
        row["pieces"] = "; ".join(" ".join(f"{l}{d}" for l, d in s.pieces.items() if d > 1) or "-"
                                  for s in plan.stats)
        got = con.tensor(w.output)
    want = w.numpy(arrays)
    scale = max(1.0, float(np.abs(want).max()))
    row["max_err"] = float(np.abs(got - want).max()) / scale
    row["numpy"] = median_time(lambda: w.numpy(arrays), repeat)
    if dask_on and w.dask is not None:
        import dask
        best = math.inf
        with dask.config.set(scheduler="threads", num_workers=workers):
            for c in w.chunks:
                best = min(best, median_time(lambda: w.dask(arrays, c).compute(), max(1, repeat // 2 + 1)))
        row["dask"] = best
    return row


def render(rows: list[dict], args) -> str:
    lines = [
        "## Workload suite: tensordb against NumPy/opt_einsum and dask.array", "",
        f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_suite "
        f"--repeat {args.repeat} --workers {args.workers}`",
        f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; BLAS: {blas_info()}; "
        f"numpy {np.__version__}; tensordb {tensordb.__version__} with {args.workers} workers.",
        "Times are medians in milliseconds; ratios are tensordb / numpy (lower is better) and "
        "dask / tensordb (higher is better).", "",
        "| workload | numpy ms | tensordb ms | dask.array ms | tensordb/numpy | dask/tensordb | "
        "kernel calls | pieces | rel. error |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        dask = r.get("dask")
        dask_ms = "" if dask is None else f"{1e3 * dask:.1f}"
        dask_ratio = "" if dask is None else f"{dask / r['tensordb']:.2f}"
        lines.append(f"| {r['name']} | {1e3 * r['numpy']:.1f} | {1e3 * r['tensordb']:.1f} | "
                     f"{dask_ms} | {r['tensordb'] / r['numpy']:.2f} | {dask_ratio} | {r['calls']} | "
                     f"{r['pieces']} | {r['max_err']:.1e} |")
    dense = [r for r in rows if not r["name"].startswith("block-sparse")]
    lines.append("")
    if dense:
        geo = math.exp(statistics.mean(math.log(r["tensordb"] / r["numpy"]) for r in dense))
        lines.append(f"Geometric mean of tensordb/numpy over the dense workloads: **{geo:.2f}**.")
    with_dask = [r for r in rows if r.get("dask")]
    if with_dask:
        geo_d = math.exp(statistics.mean(math.log(r["dask"] / r["tensordb"]) for r in with_dask))
        lines.append(f"Geometric mean of dask/tensordb over the whole suite: **{geo_d:.2f}** "
                     "(tensordb that many times faster).")
        dense_d = [r for r in with_dask if r in dense]
        if dense_d:
            geo_dd = math.exp(statistics.mean(math.log(r["dask"] / r["tensordb"]) for r in dense_d))
            lines.append(f"Over the dense workloads only: **{geo_dd:.2f}**.")
    sparse = [r for r in rows if r["name"].startswith("block-sparse")]
    for r in sparse:
        lines.append(f"{r['name']}: tensordb is **{r['numpy'] / r['tensordb']:.1f}x** faster than the "
                     f"same matmul dense in numpy.")
    return "\n".join(lines)


def write_section(text: str, marker: str = "suite") -> None:
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    old = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    DOCS.write_text(new)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="run workloads whose name contains this text")
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = ap.parse_args(argv)
    rows = []
    for w in suite():
        if args.only and args.only not in w.name:
            continue
        row = run_workload(w, args.repeat, args.workers, not args.no_dask)
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    text = render(rows, args)
    print(text)
    if not args.no_write and not args.only:
        write_section(text)


if __name__ == "__main__":
    main()
