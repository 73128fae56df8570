"""The workload suite through tensordb, NumPy and dask.array, side by side.

Run by hand (numbers go to docs/benchmarks.md, between the suite markers):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_suite

tensordb is timed from stored tensors to a stored result (plan, run, write back); NumPy and dask
from in-memory arrays to an in-memory result. The NumPy baseline is the fastest of the workload's
formulations (its operator form, np.einsum(optimize=True), opt_einsum.contract; the table names
the winner), each checked against the first. tensordb and every NumPy formulation are timed in
turn within each round, so a noisy machine slows them alike; each figure is the median of
--repeat rounds after one warm-up. dask gets the best of several chunkings.

``one call ms`` (with --one-call) is the same query with ``SET blas_one_call = on``: the search
also prices one BLAS call per operation on every core (optimizer/threads.py) and keeps the cheaper
plan; ``blas threads`` is the count that plan records (0: split). It is timed in turn with the
others in each round, from its own connection on the same arrays.
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
import tensordb.connection

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


SETTLE_S = 0.3  # the pause before each timed call (--settle)


def median_times(fns: dict, repeat: int, samples: dict | None = None) -> dict[str, float]:
    """The median time of each of ``fns``, timed in turn within each of ``repeat`` rounds after
    one warm-up each. Each timed call starts after a pause of ``SETTLE_S``: after a multi-threaded
    BLAS call OpenBLAS's helper threads poll for work for a while before they sleep, and without
    the pause whichever call comes next shares the cores with them."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    if samples is not None:
        samples.update(times)
    return {k: statistics.median(v) for k, v in times.items()}


def rel_error(got, want) -> float:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape}, expected {want.shape}")
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(got - want).max()) / scale


def blas_info() -> str:
    from threadpoolctl import threadpool_info
    # numpy's own BLAS first; another (scipy's, loaded by dask) is named by its folder
    found = sorted((i for i in threadpool_info() if i["user_api"] == "blas"),
                   key=lambda i: "numpy" not in i.get("filepath", ""))
    return ", ".join(f"{i['internal_api']} {i.get('version', '')} {i.get('architecture', '')} "
                     f"x{i['num_threads']} ({Path(i.get('filepath', '')).parent.name})"
                     for i in found)


def run_workload(w: Workload, repeat: int, workers: int, dask_on: bool,
                 one_call: bool = False) -> dict:
    rng = np.random.default_rng(0)
    arrays = w.arrays(rng)
    row = {"name": w.name}
    want = w.numpy(arrays)
    tol = 1e-3 if want.dtype == np.float32 else 1e-9
    for form, fn in list(w.forms.items())[1:]:  # a wrong formulation cannot win
        err = rel_error(fn(arrays), want)
        if err > tol:
            raise AssertionError(f"{w.name}: numpy form {form} is off by {err:.1e}")
    with tensordb.connect(workers=workers) as con, tensordb.connect(workers=workers) as old:
        for name, a in arrays.items():
            con.load(name, a, tile=w.tile.get(name))
        graph = w.graph()
        runs = []  # what each tensordb call's run reported: an outlier is explained below

        def tensordb_call():
            con.run(graph, replace=True)
            r = con.last_run
            runs.append((r.seconds, sum(m.seconds for m in r.ops), r.spilled_bytes,
                         con.last_plan.blas_threads))
        fns = {"tensordb": tensordb_call}
        if one_call:
            old.set("blas_one_call", "on")
            for name, a in arrays.items():
                old.load(name, a, tile=w.tile.get(name))
            old.run(graph, replace=True)
            row["threads"] = old.last_plan.blas_threads
            fns["one_call"] = lambda: old.run(graph, replace=True)
        fns.update({form: (lambda fn=fn: fn(arrays)) for form, fn in w.forms.items()})
        samples: dict = {}
        times = median_times(fns, repeat, samples)
        plan = con.last_plan
        calls = samples["tensordb"]
        if max(calls) > 1.5 * min(calls):  # noisy: say where each call's time went
            print(f"{w.name}: tensordb calls " + ", ".join(
                f"{1e3 * t:.1f} ms (run {1e3 * r:.1f}, kernels {1e3 * k:.1f} over the workers, "
                f"spilled {s >> 20} MiB, blas threads {b})"
                for t, (r, k, s, b) in zip(calls, runs[-len(calls):])), flush=True)
        row["calls"] = plan.kernel_calls
        row["pieces"] = "; ".join(" ".join(f"{l}{d}" for l, d in s.pieces.items() if d > 1) or "-"
                                  for s in plan.stats)
        got = con.tensor(w.output)
    row["max_err"] = rel_error(got, want)
    row["tensordb"] = times.pop("tensordb")
    row.setdefault("threads", plan.blas_threads)
    if one_call:
        row["one_call"] = times.pop("one_call")
    row["forms"] = times
    row["form"] = min(times, key=times.get)
    row["numpy"] = times[row["form"]]
    row["dense"], row["blas"] = w.dense, w.blas
    if dask_on and w.dask is not None:
        import dask
        best = math.inf
        with dask.config.set(scheduler="threads", num_workers=workers):
            for c in w.chunks:
                best = min(best, median_time(lambda: w.dask(arrays, c).compute(), max(1, repeat // 2 + 1)))
        row["dask"] = best
    return row


def _geo(values) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def render(rows: list[dict], args) -> str:
    split = all("one_call" in r for r in rows) and bool(rows)
    lines = [
        "## Workload suite: tensordb against NumPy and dask.array", "",
        f"Command: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_suite "
        f"--repeat {args.repeat} --workers {args.workers}{' --one-call' if split else ''}`",
        f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; BLAS: {blas_info()}; "
        f"numpy {np.__version__}; tensordb {tensordb.__version__} with {args.workers} workers.",
        f"Load average (1 min) at the start and the end of the run: {args.load[0]:.1f}, "
        f"{args.load[1]:.1f} (other work on the machine slows every figure; tensordb and NumPy "
        "are timed in turn, so their ratio suffers less).",
        f"Times are medians in milliseconds, each timed call started after a {SETTLE_S:g} s pause "
        "(`--settle`: OpenBLAS's threads poll for a while after a multi-threaded call, and would "
        "slow whichever call came next). numpy is the fastest of the workload's NumPy "
        "formulations (its operator form, np.einsum(optimize=True), opt_einsum.contract), timed in "
        "turn with tensordb in each round; `numpy form` names the winner. Ratios are tensordb / "
        "numpy (lower is better) and dask / tensordb (higher is better). `blas threads`: the "
        "count the one-call run's plan records (optimizer/threads.py; 0: split, the executor's "
        "rule)" + ("; `one call ms`: the same query with `SET blas_one_call = on` (one BLAS call "
           "per operation on every core where the cost model prefers it), timed in turn in the "
           "same rounds." if split
           else "."), "",
        "| workload | numpy ms | numpy form | tensordb ms | " + ("one call ms | " if split else "")
        + "dask.array ms | tensordb/numpy | dask/tensordb | kernel calls | blas threads | pieces "
        "| rel. error |",
        "|---|---:|---|---:|" + ("---:|" if split else "") + "---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        dask = r.get("dask")
        dask_ms = "" if dask is None else f"{1e3 * dask:.1f}"
        dask_ratio = "" if dask is None else f"{dask / r['tensordb']:.2f}"
        lines.append(f"| {r['name']} | {1e3 * r['numpy']:.1f} | {r['form']} | "
                     f"{1e3 * r['tensordb']:.1f} | "
                     + (f"{1e3 * r['one_call']:.1f} | " if split else "")
                     + f"{dask_ms} | {r['tensordb'] / r['numpy']:.2f} | "
                     f"{dask_ratio} | {r['calls']} | {r['threads']} | {r['pieces']} | "
                     f"{r['max_err']:.1e} |")
    dense = [r for r in rows if r["dense"]]
    lines.append("")
    if dense:
        lines.append(f"Geometric mean of tensordb/numpy over the {len(dense)} dense workloads: "
                     f"**{_geo(r['tensordb'] / r['numpy'] for r in dense):.2f}**.")
        if split:
            lines.append(f"The same with `SET blas_one_call = on`: "
                         f"**{_geo(r['one_call'] / r['numpy'] for r in dense):.2f}**.")
        blas = [r for r in dense if r["blas"]]
        if 0 < len(blas) < len(dense):
            lines.append(f"Over the {len(blas)} product-and-sum workloads (min-plus left out): "
                         f"**{_geo(r['tensordb'] / r['numpy'] for r in blas):.2f}**.")
    with_dask = [r for r in rows if r.get("dask")]
    if with_dask:
        lines.append(f"Geometric mean of dask/tensordb over the whole suite: "
                     f"**{_geo(r['dask'] / r['tensordb'] for r in with_dask):.2f}** "
                     "(tensordb that many times faster).")
        dense_d = [r for r in with_dask if r["dense"]]
        if dense_d:
            lines.append(f"Over the dense workloads only: "
                         f"**{_geo(r['dask'] / r['tensordb'] for r in dense_d):.2f}**.")
        slower = [r["name"] for r in dense_d if r["dask"] < r["tensordb"]]
        lines.append("Dense workloads where dask.array is faster: "
                     + (", ".join(slower) if slower else "none") + ".")
    for r in rows:
        if not r["dense"]:
            lines.append(f"{r['name']}: tensordb is **{r['numpy'] / r['tensordb']:.1f}x** faster "
                         "than the same matmul dense in numpy.")
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
    global SETTLE_S
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="run workloads whose name contains this text")
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--one-call", action="store_true",
                    help="also time each query with SET blas_one_call = on")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--settle", type=float, default=SETTLE_S,
                    help="seconds of pause before each timed call (0: none)")
    args = ap.parse_args(argv)
    SETTLE_S = args.settle
    rows = []
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    for w in suite():
        if args.only and args.only not in w.name:
            continue
        row = run_workload(w, args.repeat, args.workers, not args.no_dask, args.one_call)
        rows.append(row)
        print({k: ({f: round(t, 4) for f, t in v.items()} if k == "forms" else
                   round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    args.load = (load0, os.getloadavg()[0])
    text = render(rows, args)
    print(text)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if not args.no_write and not args.only:
        write_section(text)


if __name__ == "__main__":
    main()
