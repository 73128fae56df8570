"""tensordb on a GPU (``executor="gpu"``) against CuPy and host NumPy.

Run on a machine with an NVIDIA GPU and CuPy (tests/bench/gpu_device.sh runs it on a lent one):

    python -m tests.bench.bench_gpu --json gpu.json --md gpu.md

Each figure is the median of ``--repeat`` runs after one warm-up, float32 throughout:

- tensordb ``stored``: stored inputs to a stored result (plan, Loads host -> device, kernels,
  the result back to the host, written and committed), the wall clock of ``con.run``;
- tensordb ``run``: the part of that on the executor (``con.last_run.seconds``: Loads copied to
  the device, kernels, synchronisation; no planning, no writing);
- CuPy ``device``: the same computation on arrays already on the device (``cupy.matmul``,
  ``cupy.einsum``, broadcasting), synchronised before the clock is read;
- CuPy ``host->host``: host arrays copied to the device, the computation, the result copied back;
- NumPy: host arrays to a host result (all cores' BLAS).

The device-resident section (``resident``, run first) repeats queries on stored inputs, as a
session does, so that the GPU executor's device cache (exec/devcache.py) holds the inputs and
the stored results from one query to the next: a 8192^2 matmul stored to stored and with its
result a LET (only its row sums stored), a 2-layer MLP forward, and a step of
sql/train_mlp.sql's training (forward, loss, GRADs, SGD updates stored) at a size that fills a
good part of the GPU's memory. Each is timed end to end (``con.execute``), with the cache and
without it (every Load copied host -> device), beside CuPy on device-resident arrays (and
CuPy with the result copied back to the host where tensordb stores it); the bytes the last
cached run copied each way are recorded.

``--dry-run`` checks this script without a GPU: small sizes, tensordb on ``executor="local"``,
NumPy standing in for CuPy. The results are written after each workload (a run stopped by a
timeout keeps what it measured).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import tensordb
from tensordb.config import format_bytes
from tests.bench.workloads import _block_sparse, _rand  # the suite's generators

F32 = np.float32


@dataclass
class GpuWorkload:
    name: str
    arrays: Callable[[np.random.Generator], dict]          # host inputs
    graph: Callable[[], tensordb.Graph]                     # tensordb: inputs -> OUT
    numpy: Callable[[dict], np.ndarray] | None               # host reference (None: too slow)
    cupy: Callable[[object, dict], object]                   # (cupy, device arrays) -> result
    flops: float = 0.0
    tile: dict = field(default_factory=dict)                 # stored tiling per input
    numpy_repeat: int | None = None                          # fewer NumPy runs (slow ones)
    check: Callable[[dict, np.ndarray], float] | None = None  # error vs NumPy, when not w.numpy's
    cupy_host: bool = True                                   # time CuPy host->host too
    note: str = ""


def _matmul(n, numpy_repeat=None) -> GpuWorkload:
    return GpuWorkload(
        f"matmul {n}^2",
        arrays=lambda rng: {"A": _rand(rng, n, n), "B": _rand(rng, n, n)},
        graph=lambda: tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT"),
        numpy=lambda a: a["A"] @ a["B"],
        cupy=lambda cp, a: cp.matmul(a["A"], a["B"]),
        flops=2.0 * n ** 3, numpy_repeat=numpy_repeat)


def _mlp(b, h, f) -> GpuWorkload:
    """Y = relu(X W1) W2: X (b, h), W1 (h, f), W2 (f, h)."""
    def np_mlp(a):
        return np.maximum(a["X"] @ a["W1"], 0) @ a["W2"]

    return GpuWorkload(
        f"2-layer MLP forward b={b} h={h} f={f}",
        arrays=lambda rng: {"X": _rand(rng, b, h), "W1": _rand(rng, h, f) / F32(math.sqrt(h)),
                            "W2": _rand(rng, f, h) / F32(math.sqrt(f))},
        graph=lambda: (tensordb.Graph()
                       .einsum("bh,hf->bf", "X", "W1", into="Z", store=False)
                       .op("H", "bf", [("Z", "bf")], join="relu(x0)", store=False)
                       .einsum("bf,fo->bo", "H", "W2", into="OUT")),
        numpy=np_mlp,
        cupy=lambda cp, a: cp.matmul(cp.maximum(cp.matmul(a["X"], a["W1"]), 0), a["W2"]),
        flops=4.0 * b * h * f)


def _sparse(n, tile, density) -> GpuWorkload:
    return GpuWorkload(
        f"block-sparse matmul {n}^2, {tile}^2 tiles, {density:.0%} dense",
        arrays=lambda rng: {"A": _block_sparse(rng, n, tile, density),
                            "B": _block_sparse(rng, n, tile, density)},
        graph=lambda: tensordb.Graph().einsum("ij,jk->ik", "A", "B", into="OUT"),
        numpy=lambda a: a["A"] @ a["B"],
        cupy=lambda cp, a: cp.matmul(a["A"], a["B"]),
        tile={"A": (tile, tile), "B": (tile, tile)},
        note="CuPy and NumPy multiply the same matrices dense")


def _min_plus(n, numpy_n) -> GpuWorkload:
    """OUT[i,j] = MIN_k D[i,k] + D[k,j]. The whole n^3 join does not fit a GPU at n = 8192
    (2 TiB): CuPy broadcasts it in chunks of 16 values of k."""
    def cupy_minplus(cp, a, chunk=16):
        d = a["D"]
        out = cp.full((n, n), cp.inf, F32)
        for k0 in range(0, n, chunk):
            blk = d[:, k0:k0 + chunk, None] + d[None, k0:k0 + chunk, :]
            cp.minimum(out, blk.min(axis=1), out=out)
        return out

    def np_minplus(a):  # the top-left numpy_n x numpy_n block as a problem of its own
        d = a["D"][:numpy_n, :numpy_n]
        out = np.full((numpy_n, numpy_n), np.inf, F32)
        for k0 in range(0, numpy_n, 16):
            np.minimum(out, (d[:, k0:k0 + 16, None] + d[None, k0:k0 + 16, :]).min(axis=1), out=out)
        return out

    def check_rows(a, got, rows=16):  # the first rows of the whole product, by NumPy
        d = a["D"]
        ref = np.full((rows, n), np.inf, F32)
        for k0 in range(0, n, 256):
            np.minimum(ref, (d[:rows, k0:k0 + 256, None] + d[None, k0:k0 + 256, :]).min(axis=1),
                       out=ref)
        return rel_err(got[:rows], ref)

    return GpuWorkload(
        f"min-plus product {n}",
        arrays=lambda rng: {"D": np.abs(_rand(rng, n, n))},
        graph=lambda: tensordb.Graph().op("OUT", "ij", [("D", "ik"), ("D", "kj")],
                                          join="x0 + x1", agg="min"),
        numpy=np_minplus if numpy_n else None, cupy=cupy_minplus, numpy_repeat=1, check=check_rows,
        cupy_host=False,
        note=f"CuPy broadcasts in chunks of 16 values of k (the whole join is {n ** 3 * 4 / 2 ** 40:.1f}"
             f" TiB); NumPy: one run of the {numpy_n}x{numpy_n} problem, single-threaded (its "
             f"error column: the first 16 rows of the {n} product by NumPy); CuPy host->host not "
             f"timed (copying {n * n * 4 >> 20} MiB each way is small next to the product)")


# -- the device-resident section ----------------------------------------------------------------

@dataclass
class Resident:
    name: str
    arrays: Callable[[np.random.Generator], dict]   # host inputs, stored once
    sql: str                                        # the statements repeated
    cupy: Callable[[object, dict], object]          # (cupy, device arrays) -> result (one step)
    result: str                                     # the tensor tensordb stores (checked)
    flops: float = 0.0
    note: str = ""


def _train_step_xp(xp, a: dict, lr: float):
    """sql/train_mlp.sql's step by hand on ``xp`` (bench_train.xp_step): the weights in ``a``
    are replaced by the updated ones, as the SQL step stores them."""
    from tests.bench.bench_train import xp_step
    loss, a["W1"], a["W2"] = xp_step(xp, a["X"], a["Y"], a["W1"], a["W2"], lr)
    return loss


def resident_workloads(dry: bool, train: tuple[int, int, int, int]) -> list[Resident]:
    from tests.bench.bench_train import LR, _arrays, step_sql
    n = 256 if dry else 8192
    b, h, f = (128, 64, 256) if dry else (8192, 4096, 16384)
    tb, tf, th, tc = train

    def mm(rng):
        return {"A": _rand(rng, n, n), "B": _rand(rng, n, n)}

    def mlp(rng):
        return {"X": _rand(rng, b, h), "W1": _rand(rng, h, f) / F32(math.sqrt(h)),
                "W2": _rand(rng, f, h) / F32(math.sqrt(f))}

    def train_arrays(rng):
        x, y, w1, w2 = _arrays(tb, tf, th, tc)
        return {"X": x, "Y": y, "W1": w1, "W2": w2}

    return [
        Resident(f"matmul {n}^2 stored -> stored", mm, "C[i,k] = A[i,j] * B[j,k]",
                 lambda cp, a: cp.matmul(a["A"], a["B"]), "C", 2.0 * n ** 3),
        Resident(f"matmul {n}^2, result a LET (row sums stored)", mm,
                 "LET C[i,k] = A[i,j] * B[j,k]; R[i] = SUM(C[i,k])",
                 lambda cp, a: cp.matmul(a["A"], a["B"]).sum(1), "R", 2.0 * n ** 3,
                 note="with the device cache, a repeated run reads the LET C from the device "
                      "(exec/devlets.py): the product runs in the first run only; without "
                      "it, every run computes C"),
        Resident(f"2-layer MLP forward b={b} h={h} f={f}", mlp,
                 "LET H[b,f] = RELU(SUM(X[b,h] * W1[h,f])); OUT[b,o] = SUM(H[b,f] * W2[f,o])",
                 lambda cp, a: cp.matmul(cp.maximum(cp.matmul(a["X"], a["W1"]), 0), a["W2"]),
                 "OUT", 4.0 * b * h * f,
                 note="with the device cache, a repeated run reads the LET H from the device: "
                      "only the second layer runs after the first run"),
        Resident(f"train_mlp step b={tb} f={tf} h={th} c={tc}", train_arrays, step_sql(tb),
                 lambda cp, a: _train_step_xp(cp, a, LR), "W2", 6.0 * tb * tf * th,
                 note="sql/train_mlp.sql's step (bench_train.step_sql): the weights are stored "
                      "each step and read by the next; CuPy updates them on the device"),
    ]


def run_resident(w: Resident, cp, executor: str, repeat: int, directory: str) -> dict:
    """``w`` repeated on one connection with the device cache, then without it, then CuPy."""
    rng = np.random.default_rng(0)
    arrays = w.arrays(rng)
    row: dict = {"name": w.name, "note": w.note, "flops": w.flops, "section": "resident",
                 "input_bytes": sum(int(a.nbytes) for a in arrays.values())}
    results = {}
    for cached in (True, False):
        path = os.path.join(directory, f"res{abs(hash((w.name, cached))) % 10 ** 8}.tdb")
        spec = executor if cached or executor != "gpu" else "gpu://?cache=off"
        with tensordb.connect(path, executor=spec) as con:  # no cache: every Load copies
            for name, a in arrays.items():
                con.load(name, a)
            row["tensordb_cached" if cached else "tensordb_uncached"] = \
                median_time(lambda: con.execute(w.sql), repeat)
            if cached:
                row["copies"] = dict(getattr(con.last_run, "copies", {}) or {})
                row["tensordb_run"] = con.last_run.seconds
            results[cached] = con.tensor(w.result)
        _log(f"tensordb {'cached' if cached else 'uncached'} "
             f"{row['tensordb_cached' if cached else 'tensordb_uncached']:.3f}s")
    row["err_cached_vs_uncached"] = rel_err(results[True], results[False])
    if cp is not None:
        sync = cp.cuda.Device().synchronize
        dev = {k: cp.asarray(v) for k, v in arrays.items()}
        row["cupy_device"] = median_time(lambda: w.cupy(cp, dev), repeat, sync)
        row["cupy_to_host"] = median_time(lambda: cp.asnumpy(w.cupy(cp, dev)), repeat, sync)
        _log(f"cupy device {row['cupy_device']:.3f}s")
        del dev
        cp.get_default_memory_pool().free_all_blocks()
    return row


def render_resident(rows: list[dict]) -> str:
    lines = ["Device-resident inputs (queries repeated on one connection; medians, ms):", "",
             "| workload | tensordb, device cache | tensordb, no cache | CuPy device | "
             "CuPy device, result to host | cached / CuPy device | copied host->device, "
             "device->host (last cached run) | rel. diff cached vs not |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.get("copies", {})
        ratio = f"{r['tensordb_cached'] / r['cupy_device']:.1f}x" if r.get("cupy_device") else "-"
        lines.append(f"| {r['name']} | {_ms(r['tensordb_cached'])} | "
                     f"{_ms(r['tensordb_uncached'])} | {_ms(r.get('cupy_device'))} | "
                     f"{_ms(r.get('cupy_to_host'))} | {ratio} | "
                     f"{format_bytes(c.get('host_to_device', 0))}, "
                     f"{format_bytes(c.get('device_to_host', 0))} | "
                     f"{r['err_cached_vs_uncached']:.1e} |")
    notes = [f"- {r['name']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def workloads(dry: bool, min_plus: int = 8192) -> list[GpuWorkload]:
    if dry:
        return [_matmul(256), _matmul(512, numpy_repeat=1), _mlp(128, 64, 256),
                _sparse(512, 64, 0.05), _min_plus(128, 64)]
    return [_matmul(8192), _matmul(16384, numpy_repeat=1), _mlp(8192, 4096, 16384),
            _sparse(8192, 256, 0.01), _min_plus(min_plus, 1024)]


# -- timing ------------------------------------------------------------------------------------

def median_time(fn, repeat: int, sync=None) -> float:
    """The median wall time of ``fn`` over ``repeat`` runs after one warm-up; ``sync`` (the
    device's synchronize) is called before each clock read."""
    sync = sync or (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')}   {text}", flush=True)


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    scale = float(np.linalg.norm(want[finite])) or 1.0
    return float(np.linalg.norm((got - want)[finite])) / scale


def run_workload(w: GpuWorkload, cp, executor: str, repeat: int, directory: str) -> dict:
    rng = np.random.default_rng(0)
    arrays = w.arrays(rng)
    row: dict = {"name": w.name, "note": w.note, "flops": w.flops,
                 "input_bytes": sum(int(a.nbytes) for a in arrays.values())}
    path = os.path.join(directory, f"bench{abs(hash(w.name)) % 10 ** 8}.tdb")
    with tensordb.connect(path, executor=executor) as con:
        for name, a in arrays.items():
            con.load(name, a, tile=w.tile.get(name))
        graph = w.graph()
        runs = []

        def tdb():
            con.run(graph, replace=True)
            runs.append(con.last_run.seconds)

        _log(f"loaded {sorted(arrays)}")
        row["tensordb_stored"] = median_time(tdb, repeat)
        _log(f"tensordb {row['tensordb_stored']:.3f}s")
        row["tensordb_run"] = statistics.median(runs[1:])
        plan = con.last_plan
        row["kernel_calls"] = plan.kernel_calls
        row["pieces"] = "; ".join(" ".join(f"{l}{d}" for l, d in s.pieces.items() if d > 1) or "-"
                                  for s in plan.stats)
        got = con.tensor("OUT")
    if cp is not None:  # CuPy, or its stand-in in a dry run
        sync = cp.cuda.Device().synchronize
        dev = {k: cp.asarray(v) for k, v in arrays.items()}
        row["cupy_device"] = median_time(lambda: w.cupy(cp, dev), repeat, sync)
        _log(f"cupy device {row['cupy_device']:.3f}s")
        want = cp.asnumpy(w.cupy(cp, dev))
        del dev
        cp.get_default_memory_pool().free_all_blocks()
        if w.cupy_host:
            row["cupy_host"] = median_time(
                lambda: cp.asnumpy(w.cupy(cp, {k: cp.asarray(v) for k, v in arrays.items()})),
                repeat, sync)
            cp.get_default_memory_pool().free_all_blocks()
        row["err_vs_cupy"] = rel_err(got, want)
    if w.numpy is not None:
        nrep = w.numpy_repeat or repeat
        if nrep == 1:
            t0 = time.perf_counter()
            ref = w.numpy(arrays)
            row["numpy"] = time.perf_counter() - t0
        else:
            row["numpy"] = median_time(lambda: w.numpy(arrays), nrep)
            ref = w.numpy(arrays)
        row["numpy_runs"] = nrep
        row["err_vs_numpy"] = w.check(arrays, got) if w.check else rel_err(got, ref)
    return row


def budget_check(cp, executor: str, n: int, tile: int, limit: int) -> dict:
    """One product whose tiles hold more than ``memory_limit`` (A, B and the result: 3 n^2
    float32): it must finish, equal, with the run's tile bytes under the limit (on a GPU the
    tasks wait for room on the device; nothing is spilled). The CuPy pool's size afterwards
    (``total_bytes``: the most it held) is recorded too."""
    rng = np.random.default_rng(5)
    a, b = _rand(rng, n, n), _rand(rng, n, n)
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    with tensordb.connect(executor=executor, memory_limit=limit) as con:
        con.load("A", a, tile=(tile, tile))
        con.load("B", b, tile=(tile, tile))
        t0 = time.perf_counter()
        con.einsum("ij,jk->ik", "A", "B", into="C")
        seconds = time.perf_counter() - t0
        run = con.last_run
        con.set("memory_limit", "none")
        got = con.tensor("C")
    total = getattr(pool, "total_bytes", lambda: 0)()
    return {"name": f"budget: matmul {n}^2 float32 under memory_limit {limit >> 20} MiB",
            "tiles_bytes": 3 * n * n * 4, "memory_limit": limit, "seconds": seconds,
            "peak_bytes": run.peak_bytes, "over_budget": run.over_budget,
            "spilled_bytes": run.spilled_bytes, "kernel_calls": run.kernel_calls,
            "pool_total_bytes": int(total), "err_vs_numpy": rel_err(got, a @ b),
            "ok": bool(rel_err(got, a @ b) < 1e-5)}


class _NumpyAsCupy:
    """NumPy with the few CuPy names this script uses: the dry run's stand-in for CuPy."""

    __version__ = "numpy stand-in"

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def asnumpy(a):
        return np.asarray(a)

    class cuda:  # noqa: N801 - CuPy's name
        class Device:
            def synchronize(self):
                pass

    @staticmethod
    def get_default_memory_pool():
        return _NumpyAsCupy._Pool()

    class _Pool:
        def free_all_blocks(self):
            pass


# -- report ------------------------------------------------------------------------------------

def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def render(rows: list[dict], meta: dict) -> str:
    lines = [
        f"Device: {meta['device']}; CuPy {meta['cupy']}, numpy {meta['numpy']}, "
        f"{meta['cpus']} CPUs; {meta['date']}. Medians of {meta['repeat']} runs after one "
        "warm-up, float32, milliseconds.", "",
        "| workload | tensordb stored->stored | tensordb run | CuPy host->host | CuPy device | "
        "NumPy host | run / CuPy host | TFLOP/s (tensordb run) | kernel calls | rel. error vs CuPy |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = (f"{r['tensordb_run'] / r['cupy_host']:.2f}x" if r.get("cupy_host") else "-")
        tf = f"{r['flops'] / r['tensordb_run'] / 1e12:.1f}" if r.get("flops") else "-"
        err = f"{r['err_vs_cupy']:.1e}" if "err_vs_cupy" in r else \
            (f"{r['err_vs_numpy']:.1e} (NumPy)" if "err_vs_numpy" in r else "-")
        npy = _ms(r.get("numpy")) + (" (1 run)" if r.get("numpy_runs") == 1 else "")
        lines.append(f"| {r['name']} | {_ms(r['tensordb_stored'])} | {_ms(r['tensordb_run'])} | "
                     f"{_ms(r.get('cupy_host'))} | {_ms(r.get('cupy_device'))} | {npy} | {ratio} | "
                     f"{tf} | {r['kernel_calls']} | {err} |")
    notes = [f"- {r['name']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dry-run", action="store_true", help="no GPU: small sizes, executor local")
    p.add_argument("--only", default="", help="run the workloads whose name has this text")
    p.add_argument("--min-plus", type=int, default=8192, help="the min-plus product's size")
    p.add_argument("--budget", action="store_true", help="the memory_limit check also with --only")
    p.add_argument("--train", default="",
                   help="the training step's b,f,h,c (default: by the device's memory)")
    p.add_argument("--no-resident", action="store_true", help="leave out the resident section")
    p.add_argument("--json", default="")
    p.add_argument("--md", default="")
    args = p.parse_args(argv)
    cp = None
    meta = {"numpy": np.__version__, "cpus": os.cpu_count(), "repeat": args.repeat,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cupy": "-",
            "device": f"none (dry run on {platform.machine()})"}
    if not args.dry_run:
        import cupy as cp
        props = cp.cuda.runtime.getDeviceProperties(0)
        meta["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        meta["device_memory_gib"] = round(props["totalGlobalMem"] / 2 ** 30, 1)
        meta["cupy"] = cp.__version__
    else:
        cp = _NumpyAsCupy()
    executor = "local" if args.dry_run else "gpu"
    rows: list[dict] = []
    if args.train:
        train = tuple(int(x) for x in args.train.split(","))
    elif args.dry_run:
        train = (64, 8, 16, 3)
    else:  # X, the hidden layer and its gradient take about a fifth of the device
        big = meta.get("device_memory_gib", 0) >= 100
        train = (65536 if big else 32768, 4096, 16384, 1024)
    resident: list[dict] = []

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "resident": resident, "rows": rows}, f, indent=1)

    def run_each(ws, run, into: list, prefix: str, section: dict) -> None:
        """Run the workloads ``ws`` that --only names with ``run``, each row into ``into`` (and
        the JSON file) as it ends; a failure is a row with its error, and the rest still run."""
        with tempfile.TemporaryDirectory(prefix=prefix) as d:
            for w in ws:
                if args.only and args.only not in w.name:
                    continue
                t0 = time.perf_counter()
                _log(f"{w.name}: starting")
                try:
                    row = run(w, cp, executor, args.repeat, d)
                except Exception as exc:  # noqa: BLE001 - one failure must not lose the rest
                    row = {"name": w.name, **section,
                           "error": f"{type(exc).__name__}: {exc}"[:2000]}
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                into.append(row)
                print(json.dumps(row), flush=True)
                save()
                cp.get_default_memory_pool().free_all_blocks()

    if not args.no_resident:
        run_each(resident_workloads(args.dry_run, train), run_resident, resident,
                 "bench-gpu-res-", {"section": "resident"})
    if not args.only or args.budget:
        n, tile, limit = (512, 64, 1 << 20) if args.dry_run else (8192, 1024, 512 << 20)
        try:
            meta["budget"] = budget_check(cp, executor, n, tile, limit)
        except Exception as exc:  # noqa: BLE001
            meta["budget"] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "ok": False}
        print(json.dumps(meta["budget"]), flush=True)
        save()
    run_each(workloads(args.dry_run, args.min_plus), run_workload, rows, "bench-gpu-", {})
    good = [r for r in rows if "error" not in r]
    good_res = [r for r in resident if "error" not in r]
    text = render(good, meta) + "".join(f"- {r['name']}: FAILED {r['error']}\n"
                                        for r in rows + resident if "error" in r)
    if good_res:
        text += "\n" + render_resident(good_res)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return 1 if len(good) < len(rows) or len(good_res) < len(resident) or \
        not meta.get("budget", {}).get("ok", True) else 0


if __name__ == "__main__":
    raise SystemExit(main())
