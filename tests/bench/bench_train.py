"""One training step of a 2-layer MLP in SQL against the same step written by hand in numpy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_train.py

The step (b=512 rows, f=4096 features, h=1024 hidden units, c=16 classes, float32): forward
(RELU hidden layer), softmax cross-entropy, the gradients of both weights (LET dW = GRAD(...):
computed, never stored), the SGD update of both, stored. tensordb runs it as one `execute` call on an on-disk database (parse, bind,
plan, run, commit included), and on an in-memory one (`tensordb.connect(None)`: no fsync); numpy is the same step by hand, in memory. Each figure is the median
of --repeat runs after one warm-up; the table goes to docs/benchmarks.md between the train
markers. tensordb is timed twice: reusing its plan from step to step (the plan cache, keyed by
the weights' layout), and with the cache emptied before each step (planning included). JAX (jit
on CPU, the `bench` extra: `pip install 'tensordb[bench]'`) is timed in the same alternation when
it is installed: the same step as one jit-compiled function (compiled in the warm-up, not timed),
its result waited for with block_until_ready; its updated weights are checked against numpy's.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tensordb  # noqa: E402
from tests.bench.bench_suite import SETTLE_S, blas_info  # noqa: E402

COMMAND = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_train.py"
LR = 0.01


def step_sql(b: int, stored: bool = False) -> str:
    """The step: the forward values are LETs (as sql/train_mlp.sql writes them), so a step
    stores the loss and the new weights; ``stored``: H, Z and M are stored as well (the step
    this benchmark timed before, names of their own so that both can run on one database)."""
    if stored:
        return step_sql(b).replace("LET ", "").replace("H[", "Hs[").replace("Z[", "Zs[") \
            .replace("M[", "Ms[").replace("dW1 = GRAD", "LET dW1 = GRAD") \
            .replace("dW2 = GRAD", "LET dW2 = GRAD")
    return (f"LET H[b,h] = RELU(SUM(X[b,f] * W1[f,h])); "
            f"LET Z[b,c] = SUM(H[b,h] * W2[h,c]); "
            f"LET M[b] = MAX(Z[b,c]); "
            f"L = SUM(LOG(SUM(EXP(Z[b,c] - M[b]))) + M[b] - SUM(Y[b,c] * Z[b,c])) / {b}; "
            f"LET dW1 = GRAD(L, W1); LET dW2 = GRAD(L, W2); "
            f"W1[f,h] = W1[f,h] - {LR} * dW1[f,h]; W2[h,c] = W2[h,c] - {LR} * dW2[h,c];")


class _Shapes:
    """A catalog of shapes only (the binder reads ``has``, ``meta``, ``list``): plans for sizes
    that are not stored."""

    def __init__(self, shapes) -> None:
        self.shapes = shapes

    def has(self, name):
        return name in self.shapes

    def meta(self, name):
        return type("Meta", (), {"name": name, "shape": self.shapes[name], "dtype": "float32"})

    def list(self):
        return []


def plans(f: int, h: int, c: int) -> list[str]:
    """The optimizer's plan for the step at 4, 16 and 64 workers, with few and many rows: the
    pieces of the first layer's forward product and of its weight's gradient, and the bytes the
    cost model moves, against data parallel (every operation split along its rows)."""
    from tensordb import optimizer
    from tensordb.bind import bind_statements
    from tensordb.dialect import parse
    out = ["| rows | workers | forward X W1 (pieces) | backward dW1 (pieces) | bytes moved | "
           "data parallel | saved |", "|---:|---:|---|---|---:|---:|---:|"]
    for rows in (64, 65536):
        cat = _Shapes({"X": (rows, f), "Y": (rows, c), "W1": (f, h), "W2": (h, c)})
        text = step_sql(rows)
        graph = bind_statements(cat, {}, [(text, s) for s in parse(text)]).eingraph()
        for workers in (4, 16, 64):
            ein = optimizer.decompose(graph, workers)
            dp = optimizer.decompose(graph, workers, strategy="data-parallel")
            fwd = " ".join(f"{k}={v}" for k, v in ein.pieces("H.t1").items())
            bwd = " ".join(f"{k}={v}" for k, v in ein.pieces("dW1").items())
            mine, theirs = ein.details["cost"].bytes, dp.details["cost"].bytes
            out.append(f"| {rows} | {workers} | {fwd} | {bwd} | {mine / 2**20:,.0f} MiB | "
                       f"{theirs / 2**20:,.0f} MiB | {theirs / mine:.1f}x |")
    return out


def numpy_step(x, y, w1, w2):
    """The same step by hand (float32 throughout)."""
    return xp_step(np, x, y, w1, w2)


def xp_step(xp, x, y, w1, w2, lr: float = LR):
    """The step by hand on the array module ``xp`` (NumPy, or CuPy for bench_gpu.py): the loss
    and the updated weights."""
    pre = x @ w1
    h = xp.maximum(pre, 0)
    z = h @ w2
    m = z.max(1, keepdims=True)
    e = xp.exp(z - m)
    s = e.sum(1, keepdims=True)
    loss = xp.sum(xp.log(s[:, 0]) + m[:, 0] - xp.sum(y * z, 1)) / len(x)
    dz = (e / s - y) / np.float32(len(x))
    dw2 = h.T @ dz
    dh = (dz @ w2.T) * (pre > 0)
    dw1 = x.T @ dh
    return loss, w1 - np.float32(lr) * dw1, w2 - np.float32(lr) * dw2


def jax_step():
    """The step as one jit-compiled JAX function on the CPU (None without JAX): forward,
    softmax cross-entropy (log-sum-exp), the gradients of both weights, the SGD update."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_platform_name", "cpu")

    def loss(w1, w2, x, y):
        z = jnp.maximum(x @ w1, 0) @ w2
        return jnp.sum(jax.nn.logsumexp(z, axis=1) - jnp.sum(y * z, 1)) / x.shape[0]

    @jax.jit
    def step(w1, w2, x, y):
        l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2, x, y)
        return l, w1 - LR * g1, w2 - LR * g2
    return step


def _rel_err(a, b) -> float:
    """The largest difference of two weight arrays, relative to the largest weight."""
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())


def split(con, text: str, repeat: int) -> dict:
    """Where a plan-reusing step's wall time goes, the fastest of ``repeat`` steps for each
    part on its own (ms; minima, as the least disturbed by other work on the machine): the
    connection's stages, timed by wrapping them on this connection (the output files opened
    before the run and their commit, with its fsyncs, apart), and the run cut by the kernel
    method of each operation (its share of the tasks' seconds summed over workers)."""
    from tensordb import physical
    parts: dict[str, list] = {}
    saved = {}

    def wrap(owner, name, key):
        fn = getattr(owner, name)
        saved[(owner, name)] = fn

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts.setdefault(key, []).append(time.perf_counter() - t0)
        setattr(owner, name, timed)
    from tensordb import connection
    from tensordb.driver import pipeline
    for owner, name, key in ((connection, "parse", "parse"),
                             (pipeline, "bind", "bind (GRAD included)"),
                             (pipeline, "plan_graph", "plan (cache hit)"),
                             (con._get_executor(), "run", "run")):
        wrap(owner, name, key)
    wrap(physical.CatalogSink, "__init__", "open the output files")
    wrap(physical.CatalogSink, "store_tiles", "commit")
    wrap(os, "fsync", "fsync")
    kinds = {}
    totals = []
    try:
        for _ in range(repeat):
            n = {k: len(v) for k, v in parts.items()}
            t0 = time.perf_counter()
            con.execute(text)
            totals.append(time.perf_counter() - t0)
            for k in parts:  # one figure per step: the sum of its calls
                calls = parts[k][n.get(k, 0):]
                del parts[k][n.get(k, 0):]
                parts[k].append(sum(calls))
            run, ops = con.last_run, con.last_plan
            busy = sum(m.seconds for m in run.ops) or 1.0
            step = {}
            for m, kernel in zip(run.ops, ops.kernels):
                key = "run: matmul kernels" if kernel.method == "matmul" else \
                    "run: other kernels (elementwise, softmax, sums)"
                step[key] = step.get(key, 0.0) + m.seconds / busy * parts["run"][-1]
            for key, v in step.items():
                kinds.setdefault(key, []).append(v)
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)
    out = {k: 1e3 * min(v) for k, v in parts.items()}
    for k, v in kinds.items():
        out[k] = 1e3 * min(v)
    out["step"] = 1e3 * min(totals)
    out["rest (Python between the stages)"] = 1e3 * min(
        t - sum(parts[k][i] for k in ("parse", "bind (GRAD included)", "plan (cache hit)",
                                      "open the output files", "run", "commit") if k in parts)
        for i, t in enumerate(totals))
    return out


def numpy_split(x, y, w1, w2, repeat: int) -> dict:
    """The numpy step's time in its matrix products (the same five products, alone) and in
    the rest, the fastest of ``repeat`` (ms)."""
    pre = x @ w1
    h = np.maximum(pre, 0)
    dz = np.ones((len(x), w2.shape[1]), dtype=np.float32)
    dh = (dz @ w2.T) * (pre > 0)

    def products():
        _ = x @ w1, h @ w2, h.T @ dz, dz @ w2.T, x.T @ dh
    prod, whole = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        products()
        prod.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        numpy_step(x, y, w1, w2)
        whole.append(time.perf_counter() - t0)
    p, w = 1e3 * min(prod), 1e3 * min(whole)
    return {"run: matmul kernels": p, "run: other kernels (elementwise, softmax, sums)": w - p,
            "step": w}


SPLIT_ROWS = ("parse", "bind (GRAD included)", "plan (cache hit)", "open the output files",
              "run", "run: matmul kernels", "run: other kernels (elementwise, softmax, sums)",
              "commit", "fsync")


def split_table(parts: dict) -> list[str]:
    out = ["| part of a step (ms, fastest of the runs) | tensordb | tensordb in memory | "
           "tensordb, H Z M stored | numpy |", "|---|---:|---:|---:|---:|"]
    for key in SPLIT_ROWS + ("rest (Python between the stages)", "step"):
        cells = []
        for kind in ("sql", "memory", "stored", "numpy"):
            p = parts[kind]
            v = p.get(key)
            cells.append("" if v is None else f"{v:.1f}")
        name = {"fsync": "fsyncs (summed over the helper threads that run them while the commit goes on)", "run: matmul kernels":
                "run: matmul kernels (share of the run)",
                "run: other kernels (elementwise, softmax, sums)":
                "run: other kernels (share of the run)"}.get(key, key)
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def _jax_version() -> str:
    import jax
    return jax.__version__


def paired(fns: dict, repeat: int, settle: float = SETTLE_S) -> dict:
    """Times of each function, run in alternation (the order rotated every round, so each
    takes every place in turn: a step pays for what the one before it left, e.g. the pages of
    its writes) after a warm-up. Each timed call starts after a pause of ``settle`` seconds:
    OpenBLAS's helper threads poll for work for a while after a multi-threaded product, and
    without the pause the call after numpy's step shares the cores with them."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(repeat):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            time.sleep(settle)
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    return times


def _arrays(b: int, f: int, h: int, c: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(b, f)).astype(np.float32)
    y = np.eye(c, dtype=np.float32)[rng.integers(0, c, b)]
    w1 = (rng.normal(size=(f, h)) / np.sqrt(f)).astype(np.float32)
    w2 = (rng.normal(size=(h, c)) / np.sqrt(h)).astype(np.float32)
    return x, y, w1, w2


# the steps timed each in a process of its own; "-k": k steps in one execute call, per step
OWN = ("numpy", "memory", "disk", "memory-k", "disk-k")


def one_process(kind: str, args) -> None:
    """``--one KIND``: ``args.steps`` steps of one kind (numpy's step by hand, tensordb's in
    memory or on disk) in this process alone, after a warm-up, each after the settle pause;
    their seconds printed as one line of JSON."""
    import json
    x, y, w1, w2 = _arrays(args.b, args.f, args.h, args.c)
    state = {"w1": w1, "w2": w2}
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "numpy":
            def step():
                _, state["w1"], state["w2"] = numpy_step(x, y, state["w1"], state["w2"])
            con = None
        else:
            con = tensordb.connect(None if kind.startswith("memory") else Path(tmp) / "t.tdb",
                                   workers=args.workers)
            for name, a in {"X": x, "Y": y, "W1": w1, "W2": w2}.items():
                con.load(name, a)
            k = args.steps_per_call if kind.endswith("-k") else 1
            text = step_sql(args.b) * k

            def step():
                con.execute(text)
        for _ in range(3):
            step()
        times, cpu = [], []
        for _ in range(args.steps):
            time.sleep(args.settle)
            c0, t0 = time.process_time(), time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) / (1 if con is None else k))
            cpu.append((time.process_time() - c0) / (1 if con is None else k))
        if con is not None:
            con.close()
    print(json.dumps({"times": times, "cpu": cpu}))


def own_processes(args) -> dict[str, list[float]]:
    """Each kind of step in ``OWN`` timed in a process of its own, the processes in turn for
    ``args.own_rounds`` rounds of ``args.steps`` steps, so the rounds spread every kind over the
    same minutes. numpy's step then shares its process with nothing. In the alternation of
    ``paired`` it does not: a tensordb step between two of numpy's leaves the allocator to hand
    the pages numpy freed back to the kernel, and numpy's next step takes 1,400-2,200 page
    faults that it does not take alone (none), 26-51 ms against 24 (measured by hand): the
    paired ratios flatter tensordb, these do not."""
    import json
    import subprocess
    times: dict[str, list[float]] = {k: [] for k in OWN}
    cpu: dict[str, list[float]] = {k: [] for k in OWN}
    for _ in range(args.own_rounds):
        for kind in OWN:
            out = subprocess.run(
                [sys.executable, __file__, "--one", kind, "--steps", str(args.steps),
                 "--settle", str(args.settle), "--b", str(args.b), "--f", str(args.f),
                 "--h", str(args.h), "--c", str(args.c), "--workers", str(args.workers),
                 "--steps-per-call", str(args.steps_per_call)],
                check=True, capture_output=True, text=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            times[kind] += got["times"]
            cpu[kind] += got["cpu"]
    times["cpu"] = cpu  # the process's CPU seconds per step (all its threads), by kind
    return times


def own_table(times: dict[str, list[float]], args) -> list[str]:
    def q(v, f):
        return sorted(v)[int(f * (len(v) - 1))]
    n_med, n_min = statistics.median(times["numpy"]), min(times["numpy"])
    k = args.steps_per_call
    names = {"numpy": "numpy by hand", "memory": "tensordb, in-memory database",
             "disk": "tensordb, on-disk database",
             "memory-k": f"tensordb, in-memory database, {k} steps per execute call (per step)",
             "disk-k": f"tensordb, on-disk database, {k} steps per execute call (per step)"}
    out = [f"Each step in a process of its own ({args.own_rounds} rounds of {args.steps} steps a "
           f"process, the {len(OWN)} processes in turn, each step after the same pause; ratios "
           "are median over median and fastest over fastest). This is the comparison to judge "
           "by: in the alternation above, a tensordb step between two of numpy's leaves the "
           "allocator to hand the pages numpy freed back to the kernel, and numpy's next step "
           "takes 1,400-2,200 page faults it does not take alone (26-51 ms against 24, measured "
           "by hand), so the paired ratios flatter tensordb:", "",
           "| step, in a process of its own | median ms | tenth fastest ms | fastest ms | "
           "vs numpy (median) | vs numpy (fastest) | CPU median ms (all threads) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    cpu = times.get("cpu", {})
    for k in OWN:
        v = times[k]
        used = f"{1e3 * statistics.median(cpu[k]):.1f}" if cpu.get(k) else ""
        out.append(f"| {names[k]} | {1e3 * statistics.median(v):.1f} | {1e3 * q(v, 0.1):.1f} | "
                   f"{1e3 * min(v):.1f} | {statistics.median(v) / n_med:.2f}x | "
                   f"{min(v) / n_min:.2f}x | {used} |")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=512)
    ap.add_argument("--f", type=int, default=4096)
    ap.add_argument("--h", type=int, default=1024)
    ap.add_argument("--c", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps-per-call", type=int, default=5)
    ap.add_argument("--settle", type=float, default=SETTLE_S,
                    help="seconds of pause before each timed step (0: none)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--own-rounds", type=int, default=4,
                    help="rounds of the steps timed each in a process of its own (0: none)")
    ap.add_argument("--steps", type=int, default=10, help="steps a process times per round")
    ap.add_argument("--one", choices=OWN, help=argparse.SUPPRESS)  # a process of own_processes
    args = ap.parse_args(argv)
    if args.one:
        one_process(args.one, args)
        return
    x, y, w1, w2 = _arrays(args.b, args.f, args.h, args.c)

    state = {"w1": w1, "w2": w2}

    def by_hand():
        _, state["w1"], state["w2"] = numpy_step(x, y, state["w1"], state["w2"])

    step = jax_step()
    fns = {"numpy": by_hand}
    jax_err = None
    if step is not None:
        import jax.numpy as jnp
        jx, jy = jnp.asarray(x), jnp.asarray(y)
        jstate = {"w1": jnp.asarray(w1), "w2": jnp.asarray(w2)}
        # compiled here, outside every timing; its weights against numpy's from the same ones
        _, j1, j2 = step(jstate["w1"], jstate["w2"], jx, jy)
        _, n1, n2 = numpy_step(x, y, w1, w2)
        jax_err = max(_rel_err(j1, n1), _rel_err(j2, n2))
        assert jax_err < 1e-5, f"JAX's updated weights differ from numpy's by {jax_err:.1e}"

        def run_jax():
            _, jstate["w1"], jstate["w2"] = step(jstate["w1"], jstate["w2"], jx, jy)
            jstate["w2"].block_until_ready()
            jstate["w1"].block_until_ready()
        fns["jax"] = run_jax

    with tempfile.TemporaryDirectory() as tmp:
        con = tensordb.connect(Path(tmp) / "train.tdb", workers=args.workers)
        # the same step on an in-memory database: no fsync at its commit
        mem = tensordb.connect(None, workers=args.workers)
        for name, a in {"X": x, "Y": y, "W1": w1, "W2": w2}.items():
            con.load(name, a)
            mem.load(name, a)
        text = step_sql(args.b)
        plan = con.explain(text)  # before the LETs are defined by running it
        ops = int(re.search(r"(\d+) operation", plan).group(1))
        backward = sum(1 for line in plan.splitlines() if " backward " in line)
        # numpy and tensordb in alternation, so that both see the same load of the machine;
        # the ratio is the median of the paired ratios
        # A step reuses its plan (the cache is keyed by the weights' layout, not their
        # versions); "planned every step" empties the cache first: what a step cost before.
        # The time spent planning (driver/pipeline.py's plan_graph; a hit: the layout digest
        # and the rebinding).
        from tensordb.driver import pipeline
        hits, planning = [], {"sql": [], "fresh": []}
        plan = pipeline.plan_graph

        def timed_plan(kind):
            def run(*a, **k):
                t0 = time.perf_counter()
                out = plan(*a, **k)
                planning[kind].append(time.perf_counter() - t0)
                return out
            return run

        def cached():
            before = con.plan_cache_stats["hits"]
            pipeline.plan_graph = timed_plan("sql")
            try:
                con.execute(text)
            finally:
                pipeline.plan_graph = plan
            hits.append(con.plan_cache_stats["hits"] > before)

        def afresh():
            # planned with an empty cache of its own: the other steps' plans stay cached
            cache = con._plan_cache
            kept, cache._plans = cache._plans, type(cache._plans)()
            try:
                pipeline.plan_graph = timed_plan("fresh")
                con.execute(text)
            finally:
                cache._plans = kept
                pipeline.plan_graph = plan
        text_stored = step_sql(args.b, stored=True)

        def stored():
            con.execute(text_stored)
        # k steps in one execute call: one group, planned as one graph (the plan reused), one
        # commit of the last weights: what parse, bind and the commit cost is paid once per k
        k = args.steps_per_call
        text_k = step_sql(args.b) * k

        def several():
            con.execute(text_k)

        def in_memory():
            mem.execute(text)
        times = paired({**fns, "sql": cached, "memory": in_memory, "stored": stored,
                        "fresh": afresh, "several": several}, args.repeat, args.settle)
        times["several"] = [t / k for t in times["several"]]
        parts = {"sql": split(con, text, args.repeat),
                 "memory": split(mem, text, args.repeat),
                 "stored": split(con, text_stored, args.repeat)}
        parts["numpy"] = numpy_split(x, y, w1, w2, args.repeat)
        t_numpy, t_sql = statistics.median(times["numpy"]), statistics.median(times["sql"])
        t_fresh = statistics.median(times["fresh"])
        p_sql, p_fresh = (statistics.median(planning[k]) for k in ("sql", "fresh"))
        ratio = statistics.median(s / n for s, n in zip(times["sql"], times["numpy"]))
        ratio_fresh = statistics.median(s / n for s, n in zip(times["fresh"], times["numpy"]))
        t_stored = statistics.median(times["stored"])
        t_memory = statistics.median(times["memory"])
        ratio_memory = statistics.median(s / n for s, n in zip(times["memory"], times["numpy"]))
        # the spread of a step: its median over its fastest (a quiet machine: close to 1)
        spread = {k: statistics.median(times[k]) / min(times[k]) for k in ("numpy", "sql",
                                                                            "memory")}
        t_several = statistics.median(times["several"])
        ratio_several = statistics.median(s / n for s, n in zip(times["several"], times["numpy"]))
        ratio_stored = statistics.median(s / n for s, n in zip(times["stored"], times["numpy"]))
        # the step's result against numpy: one more step from the same weights
        w1_now, w2_now = con.tensor("W1"), con.tensor("W2")
        con.execute(text)
        _, w1_np, w2_np = numpy_step(x, y, w1_now, w2_now)
        err = max(float(np.abs(con.tensor("W1") - w1_np).max() / np.abs(w1_np).max()),
                  float(np.abs(con.tensor("W2") - w2_np).max() / np.abs(w2_np).max()))
        m1, m2 = mem.tensor("W1"), mem.tensor("W2")
        mem.execute(text)
        _, m1_np, m2_np = numpy_step(x, y, m1, m2)
        err = max(err, float(np.abs(mem.tensor("W1") - m1_np).max() / np.abs(m1_np).max()),
                  float(np.abs(mem.tensor("W2") - m2_np).max() / np.abs(m2_np).max()))
        con.close()
        mem.close()
    t_jax = statistics.median(times["jax"]) if "jax" in times else None
    own = own_table(own_processes(args), args) if args.own_rounds else []

    rows = [("numpy by hand", t_numpy, 1.0), ("tensordb (SQL step, plan reused)", t_sql, ratio),
            ("tensordb (SQL step, plan reused, in-memory database)", t_memory, ratio_memory),
            ("tensordb (SQL step, planned every step)", t_fresh, ratio_fresh),
            ("tensordb (plan reused, H, Z, M stored too)", t_stored, ratio_stored),
            (f"tensordb ({k} steps in one execute call, per step)", t_several, ratio_several)]
    if t_jax is not None:
        rows.append(("JAX jit (CPU)", t_jax,
                     statistics.median(j / n for j, n in zip(times["jax"], times["numpy"]))))
    table = ["| step | median s | vs numpy (median of paired ratios) |", "|---|---:|---:|"] + \
        [f"| {n} | {t:.3f} | {r:.2f}x |" for n, t, r in rows]
    lines = [
        f"One SGD step of a 2-layer MLP, b={args.b}, f={args.f}, h={args.h}, c={args.c}, float32 "
        f"(forward values and GRAD of both weights as LETs, softmax cross-entropy, the loss and "
        f"the updated weights stored), median of "
        f"{args.repeat} after a warm-up, numpy, JAX and tensordb timed in alternation; tensordb with {args.workers} workers on an on-disk "
        f"database (and on an in-memory one where said), {ops} operations of which {backward} backward. "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} when it ended: other work shares them), BLAS: {blas_info()}."
        + (f" JAX {_jax_version()} (jit on the CPU, compiled before the timing, "
           f"block_until_ready): its updated weights against numpy's from the same weights, "
           f"largest difference {jax_err:.1e} of the largest weight." if t_jax is not None
           else " JAX is not installed here: not timed."),
        "",
        *table,
        "",
        "A step's median over its fastest run (a quiet machine keeps it near 1; other work on "
        "the machine shows here first): " + ", ".join(
            f"{n} {spread[k]:.2f}" for k, n in (("numpy", "numpy"), ("sql", "tensordb on disk"),
                                                ("memory", "tensordb in memory"))) + ". "
        f"Each timed step starts after a {args.settle:g} s pause (`--settle`, as in the suite): "
        "after numpy's products its OpenBLAS helper thread polls for work for a while before it "
        "sleeps (an idle process used about 55 ms of CPU in the 250 ms after a numpy step, 0.1 ms "
        "after a tensordb step, whose workers call BLAS with one thread each), and without the "
        "pause the step after it in the alternation shared the two cores with it: a tensordb "
        "step right after a numpy step took 12 ms more CPU and 17 ms more wall time than one "
        "after 0.3 s idle (medians of 10, load about 3).",
        "",
        *(own + [""] if own else []),
        f"The plan-reusing step hit the plan cache in {sum(hits)} of its {len(hits)} runs "
        f"(warm-up included; the first step after the EXPLAIN): planning took "
        f"{1e3 * p_sql:.2f} ms of a step (the inputs' layout, the rebinding) against "
        f"{1e3 * p_fresh:.1f} ms planned afresh (optimize, lower, place), medians. The rest of "
        f"a step is the same work (running, then committing the new weights); differences "
        f"between the two rows beyond that are noise of a shared machine. "
        f"tensordb's weights after one more step (on disk and in memory) against numpy's from "
        f"the same weights: largest "
        f"difference {err:.1e} of the largest weight. `{COMMAND}`",
        "",
        f"Where a plan-reusing step's time goes (the connection's stages wrapped and timed over "
        f"{args.repeat} more steps each, the fastest of them for each part: minima are the "
        f"least disturbed by other work; the run cut by each operation's kernel method in "
        f"proportion to its tasks' seconds; numpy's five products timed alone):",
        "",
        *split_table(parts),
        "",
        "What is not compute: parsing and binding the step's statements (the step's text is "
        "parsed once and kept; a repeated step is bound "
        "once: its graph, GRAD's backward included, is reused while the catalog gives the same "
        "answers about its tensors; a plan cache hit starts from that graph); "
        "opening the output files (a writer per stored tensor); and the commit (`commit`: each "
        "stored tensor's payload synced to disk, the file and its directory, while the "
        "catalog rows of all three are swapped by one UPDATE, one DELETE and one INSERT; in "
        "memory there is no fsync). Each output tile's checksum, nonzero count and NaN flag "
        "are taken on the worker that finished it (part of `run`). The new W1 (16 MiB) goes "
        "into the payload file of the version two steps back, kept as a spare when it was "
        "replaced (storage/spares.py): writing and fsyncing blocks the file already has "
        "costs a third of allocating new ones. On disk it is computed in anonymous memory and "
        "each of its tiles written by a pwrite on the worker that finished it, its write-back "
        "started then (an fsync of pages written through a mapping costs a TLB shootdown per "
        "page); in memory, with no fsync, it is computed straight into the file's mapping, "
        "whose pages are cached already. The catalog is not asked for user tables named like "
        "the outputs: they are tensors already. "
        "With the forward values stored too (the step timed before), three more tensors are "
        "opened and committed each step. Several steps in one execute call are one graph "
        "with one commit of the last weights: the fixed costs are paid once per call.",
        "",
        f"The plan of the same step (f={args.f}, h={args.h}, c={args.c}) as the optimizer chooses "
        "it, planned only: with few rows the first layer's weight is split along f and h "
        "(model parallel, as Megatron does) and its gradient keeps that split, so W1 is not "
        "re-tiled between forward and backward; with many rows the rows are split and dW1 sums "
        "over them. Bytes are the cost model's (`details['cost'].bytes`), against the "
        "`data-parallel` strategy on the same graph:",
        "",
        *plans(args.f, args.h, args.c),
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        doc = ROOT / "docs" / "benchmarks.md"
        body = doc.read_text()
        section = f"<!-- train:begin -->\n## Training step (GRAD)\n\n{text}\n<!-- train:end -->"
        if "<!-- train:begin -->" in body:
            body = re.sub(r"<!-- train:begin -->.*<!-- train:end -->", lambda _: section, body,
                          flags=re.S)
        else:
            body = body.rstrip("\n") + "\n\n" + section + "\n"
        doc.write_text(body)


if __name__ == "__main__":
    main()
