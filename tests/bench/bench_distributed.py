"""The workload suite on a local Dask cluster (2 worker processes) against the local pool
(2 worker threads), in the same run. Run by hand; the table goes to docs/benchmarks.md between
the distributed markers:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_distributed.py

Both executors get the same plans (workers=2) from stored tensors to a stored result. Each figure
is the median of --repeat runs after one warm-up. With a GPU, --gpu also times the GPU executor
against CuPy's own matmul/einsum on the same device.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tensordb  # noqa: E402
from tests.bench.bench_suite import median_time  # noqa: E402
from tests.bench.bench_suite import write_section as suite_write_section  # noqa: E402
from tests.bench.workloads import suite  # noqa: E402

COMMAND = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_distributed.py"


def blas(info) -> str:
    return ", ".join(f"{i['internal_api']} {i.get('version', '')} {i.get('architecture', '')} "
                     f"x{i['num_threads']}" for i in info if i["user_api"] == "blas") or "none"


def _threadpools():
    from threadpoolctl import threadpool_info
    import numpy  # noqa: F401 - loads the BLAS that threadpoolctl reports
    return threadpool_info()


def run_workload(w, cons: dict, repeat: int) -> dict:
    """Median times per executor, timed in alternation so that both see the same machine load;
    the ratio is the median of the paired ratios."""
    arrays = w.arrays(np.random.default_rng(0))
    graph = w.graph()
    row, times = {"name": w.name}, {label: [] for label in cons}
    for con in cons.values():
        for name, a in arrays.items():
            con.load(name, a, tile=w.tile.get(name), replace=True)
        con.run(graph, replace=True)  # warm-up: worker imports, kernel caches, page cache
    labels = list(cons)
    for r in range(repeat):
        for label in labels if r % 2 == 0 else labels[::-1]:
            t0 = time.perf_counter()
            cons[label].run(graph, replace=True)
            times[label].append(time.perf_counter() - t0)
    for label, con in cons.items():
        row[label] = statistics.median(times[label])
        row[f"{label}_moved"] = con.last_run.bytes_moved
        row["tasks"] = len(con.last_plan.tasks)
    plan = cons["dask"].last_plan
    row["gathered"] = sum(_tile_nbytes(plan, plan.task(k)) for o in plan.outputs.values()
                          if o.stored for k in o.tiles.values())
    row["ratio"] = statistics.median(d / l for d, l in zip(times["dask"], times["local"]))
    want, got = cons["local"].tensor(w.output), cons["dask"].tensor(w.output)
    row["diff"] = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
    for con in cons.values():
        for name in list(arrays) + [w.output]:
            con.drop(name, if_exists=True)
    return row


def _tile_nbytes(plan, task) -> int:
    shape = getattr(task, "out_shape", None) or getattr(task, "shape", ())
    dtype = plan.ops[task.op].dtype if hasattr(task, "op") else task.dtype
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def run_gpu_workload(w, con, repeat: int) -> dict:
    """tensordb's GPU executor (stored inputs to a stored result) against the same computation
    written with CuPy on device-resident arrays (cupy's matmul/einsum through __array_function__)."""
    import cupy
    arrays = w.arrays(np.random.default_rng(0))
    graph = w.graph()
    for name, a in arrays.items():
        con.load(name, a, tile=w.tile.get(name), replace=True)
    dev = {k: cupy.asarray(v) for k, v in arrays.items()}

    def on_cupy():
        out = w.numpy(dev)
        cupy.cuda.runtime.deviceSynchronize()
        return out

    row = {"name": w.name}
    try:
        want = cupy.asnumpy(on_cupy())
        row["cupy"] = median_time(on_cupy, repeat)
    except Exception as exc:  # noqa: BLE001 - a NumPy-only reference (e.g. min-plus loops)
        want, row["cupy"] = w.numpy(arrays), None
        row["note"] = f"no CuPy reference: {type(exc).__name__}"
    row["gpu"] = median_time(lambda: con.run(graph, replace=True), repeat)
    got = con.tensor(w.output)
    row["diff"] = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
    for name in list(arrays) + [w.output]:
        con.drop(name, if_exists=True)
    return row


def render_gpu(rows, device: str) -> str:
    lines = ["", f"GPU: {device}. tensordb's `gpu` executor from stored inputs to a stored result "
             "(host to device and back included) against CuPy on arrays already on the device.", "",
             "| workload | tensordb gpu ms | cupy ms | tensordb / cupy | max diff |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        cp = "" if r["cupy"] is None else f"{1e3 * r['cupy']:.1f}"
        ratio = "" if r["cupy"] is None else f"{r['gpu'] / r['cupy']:.2f}"
        lines.append(f"| {r['name']} | {1e3 * r['gpu']:.1f} | {cp} | {ratio} | {r['diff']:.1e} |")
    return "\n".join(lines)


def gpu_section(args) -> str:
    import cupy
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []
    with tensordb.connect(executor="gpu") as con:
        for w in suite():
            if args.only and args.only not in w.name:
                continue
            rows.append(run_gpu_workload(w, con, args.repeat))
            print(rows[-1], flush=True)
    return render_gpu(rows, device)


def render(rows, args, local_blas: str, worker_blas: str) -> str:
    lines = [
        f"Command: `{COMMAND} --repeat {args.repeat}`",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}; "
        f"BLAS in the client (local pool): {local_blas}; on each Dask worker: {worker_blas}. "
        "Both executors run the same plans for 2 workers: the local pool as 2 threads with 1 BLAS "
        "thread each, Dask as a LocalCluster on 127.0.0.1 with 2 worker processes x 1 thread "
        "(the nanny sets 1 BLAS thread). Times are medians of "
        f"{args.repeat} runs after a warm-up, from stored inputs to a stored result, in ms; the two "
        "executors are timed in alternation and 'Dask / local' is the median of the paired "
        f"ratios. Load average when the run ended: {os.getloadavg()[0]:.1f} (on 2 cores; other "
        "work shared the machine, so single figures are noisy).",
        "",
        "| workload | tasks | local pool ms | Dask ms | Dask / local | moved (plan) | gathered | "
        "max diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['tasks']} | {1e3 * r['local']:.0f} | {1e3 * r['dask']:.0f} | "
                     f"{r['ratio']:.2f} | {r['dask_moved'] / 2**20:.1f} MiB | "
                     f"{r['gathered'] / 2**20:.0f} MiB | {r['diff']:.1e} |")
    if not args.gpu:
        lines.append("| GPU executor vs cupy matmul/einsum | | | | not measured: no GPU available "
                     "in this session | | | |")
    ratios = [r["ratio"] for r in rows]
    geo = float(np.exp(np.mean(np.log(ratios))))
    lines += ["", f"Geometric mean of Dask / local pool: **{geo:.2f}**. 'moved' is what the plan "
              "moves between workers (the same for both executors); 'gathered' is the stored result, "
              "which Dask sends from the worker processes to the client (the local pool stores "
              "it from memory); 'max diff' compares the two results, relative to the largest "
              "value. Where Dask's time goes: pickling and sending the gathered result over "
              "loopback, a few ms of scheduler round trips per dependency level of the graph "
              "(small plans with chains of operations feel this most), and about 1 ms per task; "
              "on 2 cores the scheduler, the client and both workers also share the CPUs."]
    return "\n".join(lines)


def write_section(text: str) -> None:
    suite_write_section(f"## Dask executor against the local pool\n\n{text}", "distributed")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="run workloads whose name contains this text")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--gpu", action="store_true", help="also: the gpu executor against CuPy")
    args = ap.parse_args(argv)
    from tensordb.exec.dask import local_cluster
    rows = []
    with local_cluster(2) as cluster, \
            tensordb.connect(workers=2) as local, \
            tensordb.connect(workers=2, executor=f"dask://{cluster.scheduler_address}") as dask:
        client = dask._get_executor().client
        worker_blas = {a: blas(i) for a, i in client.run(_threadpools).items()}
        local_blas = blas(_threadpools())
        for w in suite():
            if args.only and args.only not in w.name:
                continue
            row = run_workload(w, {"local": local, "dask": dask}, args.repeat)
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    text = render(rows, args, local_blas, "; ".join(sorted(set(worker_blas.values()))))
    if args.gpu:
        text += "\n" + gpu_section(args)
    print(text)
    if not args.no_write and not args.only:
        write_section(text)


if __name__ == "__main__":
    main()
