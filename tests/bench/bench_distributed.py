"""The workload suite on a local Dask cluster (2 worker processes) against the local pool
(2 worker threads), in the same run, and the loopback bytes of a 4096^2 float32 matmul on two
hand-started workers over a shared directory. Run by hand; the tables go to docs/benchmarks.md
between the distributed markers:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_distributed.py

Both executors get the same plans (workers=2) from stored tensors in a database directory to a
stored result; the Dask workers see it (storage='shared'): they read their inputs and write their
outputs there themselves. Each figure is the median of --repeat runs after one warm-up. The
loopback figure is the bytes that crossed the loopback interface (/proc/net/dev, lo: every
process on the machine) while the query ran, against the result's bytes. With a GPU, --gpu also
times the GPU executor against CuPy's own matmul/einsum on the same device.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
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
    last = cons["dask"]._get_executor().last_run
    row["gathered"] = last.get("gathered_bytes", 0)
    row["written"] = last.get("written_by_workers", 0)
    row["dask_tasks"] = last.get("dask_tasks", 0)
    row["ratio"] = statistics.median(d / l for d, l in zip(times["dask"], times["local"]))
    want, got = cons["local"].tensor(w.output), cons["dask"].tensor(w.output)
    row["diff"] = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
    for con in cons.values():
        for name in list(arrays) + [w.output]:
            con.drop(name, if_exists=True)
    return row


def loopback_bytes() -> int:
    """Bytes received on the loopback interface so far, by every process (/proc/net/dev): each
    byte sent over 127.0.0.1 is received once."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def loopback_run(n: int = 4096, repeat: int = 3) -> list[dict]:
    """A float32 n^2 matmul on a scheduler and 2 workers started by hand (``dask scheduler``,
    ``dask worker``), over one database directory: with storage='shared' (the workers read and
    write the payloads) and storage='local' (they read them; the result comes to the client)."""
    from tests.exec.dask_deploy import Deployment
    rows = []
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    want = None
    with tempfile.TemporaryDirectory() as tmp, Deployment(Path(tmp) / "cluster") as dep:
        dep.worker("w1", memory_limit="6GB")
        dep.worker("w2", memory_limit="6GB")
        dep.wait(2)
        for storage in ("shared", "local"):
            with tensordb.connect(Path(tmp) / "db", executor=f"dask://{dep.address}",
                                  storage=storage) as con:
                if not con.store.has("A"):
                    con.load("A", a)
                    con.load("B", b)
                sql = "C[i,k] = SUM(A[i,j] * B[j,k])"
                con.execute(sql)  # warm-up: imports on the workers, the page cache
                moved, secs = [], []
                for _ in range(repeat):
                    before, t0 = loopback_bytes(), time.perf_counter()
                    con.execute(sql)
                    secs.append(time.perf_counter() - t0)
                    moved.append(loopback_bytes() - before)
                got = con.tensor("C")
                if want is None:
                    want = a @ b
                run = con._get_executor().last_run
                rows.append({"storage": storage, "loopback": statistics.median(moved),
                             "result": got.nbytes, "seconds": statistics.median(secs),
                             "written": run.get("written_by_workers", 0),
                             "gathered": run.get("gathered_bytes", 0),
                             "pieces": dict(con.last_plan.stats[0].pieces),
                             "diff": float(np.abs(got - want).max() / np.abs(want).max())})
                print(rows[-1], flush=True)
    return rows


def render_loopback(rows, n: int) -> str:
    lines = ["", f"Loopback bytes of a {n}^2 float32 matmul (`C[i,k] = SUM(A[i,j] * B[j,k])`, "
             f"a {rows[0]['result'] / 2**20:.0f} MiB result) on a scheduler and 2 workers started "
             "by hand (`dask scheduler`, `dask worker --nthreads 1 --no-nanny`) on 127.0.0.1 over "
             "one database directory: bytes received on `lo` by all processes while the query "
             "ran (/proc/net/dev), median of the timed runs.", "",
             "| storage | pieces | loopback | loopback / result | tiles written by workers | "
             "gathered by the client | s | max rel. diff |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        pieces = " ".join(f"{k}:{v}" for k, v in r["pieces"].items())
        lines.append(f"| {r['storage']} | {pieces} | {r['loopback'] / 2**20:.2f} MiB | "
                     f"{100 * r['loopback'] / r['result']:.1f}% | {r['written']} | "
                     f"{r['gathered'] / 2**20:.0f} MiB | {r['seconds']:.2f} | {r['diff']:.1e} |")
    return "\n".join(lines)


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
        "| workload | tasks | Dask tasks | local pool ms | Dask ms | Dask / local | moved (local) | "
        "moved (Dask) | written by workers | gathered | max diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['tasks']} | {r['dask_tasks']} | {1e3 * r['local']:.0f} | "
                     f"{1e3 * r['dask']:.0f} | "
                     f"{r['ratio']:.2f} | {r['local_moved'] / 2**20:.1f} MiB | "
                     f"{r['dask_moved'] / 2**20:.1f} MiB | {r['written']} tiles | "
                     f"{r['gathered'] / 2**20:.0f} MiB | {r['diff']:.1e} |")
    if not args.gpu:
        lines.append("| GPU executor vs cupy matmul/einsum | | | | | not measured: no GPU available "
                     "in this session | | | |")
    ratios = [r["ratio"] for r in rows]
    geo = float(np.exp(np.mean(np.log(ratios))))
    lines += ["", f"Geometric mean of Dask / local pool: **{geo:.2f}**. 'moved' is measured on "
              "each executor by one rule (exec/contract.py): the bytes of tiles a task read that "
              "another worker made; the Dask workers read stored tiles from the database "
              "themselves, so only computed tiles move there. 'written by workers' counts the "
              "stored output tiles the workers wrote into the payload files themselves "
              "(storage='shared'); 'gathered' is what came back to the client; 'max diff' "
              "compares the two results, relative to the largest value. 'tasks' are the plan's "
              "tile tasks, 'Dask tasks' what the scheduler ran: each worker's tasks of one stage "
              "are one Dask task (exec/dask_fuse.py). Where Dask's time goes now: the graph "
              "to the scheduler, the scheduler to the workers and one scheduler round trip per "
              "stage (the results come straight from the workers: exec/dask_collect.py), the "
              "transfers between worker processes, and on 2 cores the scheduler, the client and "
              "both workers share the CPUs."]
    return "\n".join(lines)


def write_section(text: str) -> None:
    suite_write_section(f"## Dask executor against the local pool\n\n{text}", "distributed")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="run workloads whose name contains this text")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    ap.add_argument("--gpu", action="store_true", help="also: the gpu executor against CuPy")
    ap.add_argument("--loopback-only", action="store_true",
                    help="only the loopback bytes of the hand-started deployment")
    ap.add_argument("--n", type=int, default=4096, help="the loopback matmul's size")
    args = ap.parse_args(argv)
    loop = "" if args.only else render_loopback(loopback_run(args.n, args.repeat), args.n)
    if args.loopback_only:
        print(loop)
        return
    from tensordb.exec.dask import local_cluster
    rows = []
    with tempfile.TemporaryDirectory() as tmp, local_cluster(2) as cluster, \
            tensordb.connect(Path(tmp) / "local", workers=2) as local, \
            tensordb.connect(Path(tmp) / "dask", workers=2, storage="shared",
                             executor=f"dask://{cluster.scheduler_address}") as dask:
        client = dask._get_executor().client
        worker_blas = {a: blas(i) for a, i in client.run(_threadpools).items()}
        local_blas = blas(_threadpools())
        for w in suite():
            if args.only and args.only not in w.name:
                continue
            row = run_workload(w, {"local": local, "dask": dask}, args.repeat)
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    text = render(rows, args, local_blas, "; ".join(sorted(set(worker_blas.values())))) + \
        "\n" + loop
    if args.gpu:
        text += "\n" + gpu_section(args)
    print(text)
    if not args.no_write and not args.only:
        write_section(text)


if __name__ == "__main__":
    main()
