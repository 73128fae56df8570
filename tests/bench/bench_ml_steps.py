"""Small training steps (issue 29): the digits classifiers written naturally, against numpy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_ml_steps.py

The data: scikit-learn's digits (1,797 x 64, 10 classes) when scikit-learn is installed, else
data of the same shape made here (pixel values 0-16 drawn around a mean image per class); the
output says which. Features scaled by 1/16, rows shuffled (seed 0), the first 1,347 rows the
training set (a slice), the other 450 the test set (a slice), one-hot labels. Two models, as a
data scientist writes them (one statement for the loss, MEAN over the batch, a slice for the
mini-batch, ARGMAX for the accuracy, the learning rate a parameter):

- multinomial logistic regression, W (64 x 10);
- an MLP 64-128-10 with a RELU hidden layer, W1 (64 x 128), W2 (128 x 10).

Each step is numpy's (by hand, float64, the same formulas) and tensordb's: one step per
``execute`` call (in memory, and on disk), and ``--steps-per-call`` steps per call (in memory,
the time per step); also a one-element assignment ``a[i] = a[i] + 1`` (in memory and on disk),
the fixed cost of a call. Each kind runs in a process of its own, the processes in turn for
``--rounds`` rounds (so every kind sees the same minutes of a shared machine), each timed call
after a ``--settle`` pause; figures are medians (and fastest) over all rounds. Each child says
through threadpoolctl which BLAS kernel it runs (they must agree). Before the timing, the
steps are checked: ``--check`` steps of tensordb against numpy from the same start, the loss
and weights to 1e-10, and the test accuracy by ARGMAX against numpy's.

Then, in this process, where a one-step call's time goes: the connection's stages wrapped and
timed (the fastest of ``--split`` steps for each part), the catalog's DuckDB statements apart.
The tables go to docs/benchmarks.md between the ml-steps markers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tensordb  # noqa: E402

COMMAND = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_ml_steps.py"
N_TRAIN = 1347
LR = 0.5

KINDS = ("numpy-log", "memory-log", "disk-log", "memory-log-k",
         "numpy-mlp", "memory-mlp", "disk-mlp", "memory-mlp-k",
         "memory-assign", "disk-assign")


def digits():
    """(X, labels, source): scikit-learn's digits, or data of their shape made here."""
    try:
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        return x.astype(np.float64), y, "scikit-learn's digits"
    except ImportError:
        rng = np.random.default_rng(1)
        means = rng.uniform(0, 16, size=(10, 64))
        y = rng.integers(0, 10, 1797)
        x = np.clip(np.rint(means[y] + rng.normal(0, 4, size=(1797, 64))), 0, 16)
        return x, y, "generated data of the digits' shape (scikit-learn is not installed)"


def data():
    x, y, source = digits()
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order] / 16.0, y[order]
    return x, np.eye(10)[y], source


def weights():
    rng = np.random.default_rng(2)
    return {"W": np.zeros((64, 10)), "W1": rng.normal(0, 0.1, size=(64, 128)),
            "W2": rng.normal(0, 0.1, size=(128, 10))}


def step_sql(model: str, lo: int = 0, hi: int = N_TRAIN) -> str:
    """One step on rows lo:hi (a slice: the mini-batch), the learning rate a parameter."""
    rows = f"b {lo}:{hi}"
    if model == "log":
        return (f"LET Z[b,c] = SUM(X[{rows}, d] * W[d,c]); "
                f"L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[{rows}, c] * Z[b,c])); "
                "LET dW = GRAD(L, W); "
                "W[d,c] = W[d,c] - $lr * dW[d,c]; ")
    return (f"LET H[b,h] = RELU(SUM(X[{rows}, d] * W1[d,h])); "
            "LET Z[b,c] = SUM(H[b,h] * W2[h,c]); "
            f"L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[{rows}, c] * Z[b,c])); "
            "LET dW1 = GRAD(L, W1); LET dW2 = GRAD(L, W2); "
            "W1[d,h] = W1[d,h] - $lr * dW1[d,h]; W2[h,c] = W2[h,c] - $lr * dW2[h,c]; ")


def accuracy_sql(model: str) -> str:
    rows = f"b {N_TRAIN}:"
    if model == "log":
        z = f"LET Zt[b,c] = SUM(X[{rows}, d] * W[d,c]); "
    else:
        z = (f"LET Ht[b,h] = RELU(SUM(X[{rows}, d] * W1[d,h])); "
             "LET Zt[b,c] = SUM(Ht[b,h] * W2[h,c]); ")
    return z + f"acc = MEAN(ARGMAX(Zt[b,c]) = ARGMAX(Y[{rows}, k]));"


def _softmax_parts(z, y):
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(1, keepdims=True)
    loss = np.mean(np.log(s[:, 0]) + m[:, 0] - np.sum(y * z, 1))
    return loss, (e / s - y) / len(z)


def numpy_step(model: str, x, y, w: dict, lr: float = LR) -> float:
    """One step by hand on the training rows, ``w`` updated in place of its entries."""
    x, y = x[:N_TRAIN], y[:N_TRAIN]
    if model == "log":
        loss, dz = _softmax_parts(x @ w["W"], y)
        w["W"] = w["W"] - lr * (x.T @ dz)
        return loss
    pre = x @ w["W1"]
    h = np.maximum(pre, 0)
    loss, dz = _softmax_parts(h @ w["W2"], y)
    dh = (dz @ w["W2"].T) * (pre > 0)
    w["W2"] = w["W2"] - lr * (h.T @ dz)
    w["W1"] = w["W1"] - lr * (x.T @ dh)
    return loss


def numpy_accuracy(model: str, x, y, w: dict) -> float:
    x, y = x[N_TRAIN:], y[N_TRAIN:]
    z = x @ w["W"] if model == "log" else np.maximum(x @ w["W1"], 0) @ w["W2"]
    return float(np.mean(z.argmax(1) == y.argmax(1)))


def connect(where: str, tmp: str, workers: int):
    return tensordb.connect(None if where == "memory" else Path(tmp) / "t.tdb", workers=workers)


def load(con, x, y) -> None:
    con.load("X", x)
    con.load("Y", y)
    for name, a in weights().items():
        con.load(name, a)


def check(x, y, steps: int, workers: int) -> dict:
    """``steps`` steps of each model, tensordb (one call each, in memory) against numpy from
    the same weights; raises if they differ. The largest differences and the accuracies."""
    out = {}
    with tensordb.connect(None, workers=workers) as con:
        load(con, x, y)
        for model in ("log", "mlp"):
            w = weights()
            for _ in range(steps):
                want = numpy_step(model, x, y, w)
                con.execute(step_sql(model), {"lr": LR})
                got = float(con.tensor("L"))
                assert abs(got - want) <= 1e-10 * abs(want), (model, got, want)
            err = max(float(np.abs(con.tensor(n) - w[n]).max() / np.abs(w[n]).max())
                      for n in (("W",) if model == "log" else ("W1", "W2")))
            assert err < 1e-10, (model, err)
            con.execute(accuracy_sql(model))
            acc, want_acc = float(con.tensor("acc")), numpy_accuracy(model, x, y, w)
            assert acc == want_acc, (model, acc, want_acc)
            out[model] = {"err": err, "loss": got, "acc": acc}
    return out


def blas_kernel() -> str:
    from threadpoolctl import threadpool_info
    # numpy's own BLAS first; another (scipy's, which tensordb loads) named by its folder
    found = sorted((i for i in threadpool_info() if i["user_api"] == "blas"),
                   key=lambda i: ("numpy" not in i.get("filepath", ""), i.get("filepath", "")))
    return ", ".join(f"{i['internal_api']} {i.get('version', '')} {i.get('architecture', '')} "
                     f"x{i['num_threads']} ({Path(i.get('filepath', '')).parent.name})"
                     for i in found)


def one_process(kind: str, args) -> None:
    """``--one KIND``: a warm-up, then ``args.steps`` timed calls of one kind, each after the
    settle pause; their seconds per step and the BLAS kernel, one line of JSON."""
    x, y, _ = data()
    where, _, rest = kind.partition("-")
    model, _, per = rest.partition("-")
    k = args.steps_per_call if per == "k" else 1
    with tempfile.TemporaryDirectory() as tmp:
        con = None
        if where == "numpy":
            w = weights()

            def call():
                numpy_step(model, x, y, w)
        else:
            con = connect(where, tmp, args.workers)
            if model == "assign":
                con.execute("CREATE TENSOR a (i 1) FLOAT64;")
                text, values = "a[i] = a[i] + 1;", None
            else:
                load(con, x, y)
                text, values = step_sql(model) * k, {"lr": LR}

            def call():
                con.execute(text, values)
        for _ in range(5):
            call()
        times, cpu = [], []
        for _ in range(args.steps):
            time.sleep(args.settle)
            c0, t0 = time.process_time(), time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) / k)
            cpu.append((time.process_time() - c0) / k)
        if con is not None:
            con.close()
    print(json.dumps({"times": times, "cpu": cpu, "blas": blas_kernel()}))


def own_processes(args) -> tuple[dict, dict, set]:
    """Each kind in a process of its own, the processes in turn: wall seconds and CPU seconds
    (the process's, all its threads) per step, and the BLAS kernels they ran."""
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    cpu: dict[str, list[float]] = {k: [] for k in KINDS}
    kernels = set()
    for _ in range(args.rounds):
        for kind in KINDS:
            out = subprocess.run(
                [sys.executable, __file__, "--one", kind, "--steps", str(args.steps),
                 "--settle", str(args.settle), "--workers", str(args.workers),
                 "--steps-per-call", str(args.steps_per_call)],
                check=True, capture_output=True, text=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            times[kind] += got["times"]
            cpu[kind] += got["cpu"]
            kernels.add(got["blas"])
    return times, cpu, kernels


def split(model: str, x, y, repeat: int, workers: int) -> dict:
    """Where a one-step call's time goes, in memory: the driver's stages wrapped and timed,
    the fastest of ``repeat`` steps for each part (ms). Stages this version of the code lacks
    are left out."""
    from tensordb import connection, driver
    from tensordb.driver import pipeline, sink
    from tensordb.exec import pool
    from tensordb.storage import catalog, deferred
    parts: dict[str, list] = {}
    saved = {}

    def wrap(owner, name, key):
        fn = getattr(owner, name, None)
        if fn is None:
            return
        saved[(owner, name)] = fn
        parts.setdefault(key, [])  # a stage that runs no call in a step counts 0

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts.setdefault(key, []).append(time.perf_counter() - t0)
        setattr(owner, name, timed)
    totals = []
    with tensordb.connect(None, workers=workers) as con:
        if model == "assign":
            con.execute("CREATE TENSOR a (i 1) FLOAT64;")
            text, values = "a[i] = a[i] + 1;", None
        else:
            load(con, x, y)
            text, values = step_sql(model), {"lr": LR}
        for _ in range(5):
            con.execute(text, values)
        wrap(connection, "parse", "parse")
        wrap(pipeline, "bind", "bind (GRAD included)")
        wrap(pipeline, "plan_graph", "plan (cache hit)")
        wrap(pool.LocalExecutor, "run", "run (the pool and kernels)")
        wrap(sink.StoreSink, "open", "open the output files")
        wrap(sink._Stored, "commit", "commit")
        del driver
        wrap(catalog, "store", "catalog statements")
        wrap(deferred, "flush", "catalog statements")
        try:
            for _ in range(repeat):
                n = {k: len(v) for k, v in parts.items()}
                time.sleep(0.02)
                t0 = time.perf_counter()
                con.execute(text, values)
                totals.append(time.perf_counter() - t0)
                for k in parts:  # one figure per step: the sum of its calls
                    calls = parts[k][n.get(k, 0):]
                    del parts[k][n.get(k, 0):]
                    parts[k].append(sum(calls))
        finally:
            for (owner, name), fn in saved.items():
                setattr(owner, name, fn)
    out = {k: 1e3 * min(v) for k, v in parts.items()}
    out["step"] = 1e3 * min(totals)
    stages = ("parse", "bind (GRAD included)", "plan (cache hit)", "open the output files",
              "run (the pool and kernels)", "commit")
    out["rest (Python between the stages)"] = 1e3 * min(
        t - sum(parts[k][i] for k in stages if k in parts) for i, t in enumerate(totals))
    return out


def back_to_back(n: int, settle: float, workers: int) -> None:
    """``n`` one-step calls of each model (and the one-element assignment) in one process, in
    memory, numpy's step by hand after each (from its own weights): ms, fastest and median, and
    tensordb's CPU median (the process's, all threads)."""
    x, y, _ = data()
    for model in ("log", "mlp", "assign"):
        with tensordb.connect(None, workers=workers) as con:
            if model == "assign":
                con.execute("CREATE TENSOR a (i 1) FLOAT64;")
                text, values = "a[i] = a[i] + 1;", None
            else:
                load(con, x, y)
                text, values = step_sql(model), {"lr": LR}
            w = weights()
            for _ in range(10):
                con.execute(text, values)
            t, c, tn = [], [], []
            for _ in range(n):
                time.sleep(settle)
                c0, t0 = time.process_time(), time.perf_counter()
                con.execute(text, values)
                t.append(time.perf_counter() - t0)
                c.append(time.process_time() - c0)
                if model != "assign":
                    time.sleep(settle)
                    t0 = time.perf_counter()
                    numpy_step(model, x, y, w)
                    tn.append(time.perf_counter() - t0)
        line = (f"{model}: tensordb {1e3 * min(t):.3f} fastest, {1e3 * statistics.median(t):.3f} "
                f"median, CPU {1e3 * statistics.median(c):.3f}")
        if tn:
            line += (f"; numpy {1e3 * min(tn):.3f} fastest, {1e3 * statistics.median(tn):.3f} "
                     f"median; ratio {min(t) / min(tn):.2f}x fastest, "
                     f"{statistics.median(t) / statistics.median(tn):.2f}x median")
        print(line)
    print(f"load average {os.getloadavg()[0]:.1f}")


SPLIT_ROWS = ("parse", "bind (GRAD included)", "plan (cache hit)", "open the output files",
              "run (the pool and kernels)", "commit", "catalog statements",
              "rest (Python between the stages)", "step")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps-per-call", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the processes in turn")
    ap.add_argument("--steps", type=int, default=10, help="timed calls a process makes a round")
    ap.add_argument("--settle", type=float, default=0.05,
                    help="seconds of pause before each timed call")
    ap.add_argument("--check", type=int, default=20, help="steps checked against numpy")
    ap.add_argument("--split", type=int, default=30, help="steps timed for the breakdown")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--back-to-back", type=int, default=0, metavar="N",
                    help="only: N one-step calls of each model in this process, in memory, "
                         "each followed by numpy's step (after --settle seconds each); "
                         "fastest, median and CPU")
    args = ap.parse_args(argv)
    if args.one:
        one_process(args.one, args)
        return
    if args.back_to_back:
        back_to_back(args.back_to_back, args.settle, args.workers)
        return
    x, y, source = data()
    checked = check(x, y, args.check, args.workers)
    times, cpu, kernels = own_processes(args)
    if len(kernels) != 1:
        raise AssertionError(f"the processes ran different BLAS kernels: {kernels}")
    parts = {m: split(m, x, y, args.split, args.workers) for m in ("log", "mlp", "assign")}
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    low = {k: 1e3 * min(v) for k, v in times.items()}
    used = {k: 1e3 * statistics.median(v) for k, v in cpu.items()}
    k = args.steps_per_call
    lines = [
        f"The digits classifiers ({source}; 1,347 training rows, a slice, full batch; "
        f"float64), one SGD step each: numpy by hand against tensordb ({args.workers} workers), "
        f"each kind of step in a process of its own, the {len(KINDS)} processes in turn for "
        f"{args.rounds} rounds of {args.steps} timed calls, each call after a {args.settle:g} s "
        f"pause; medians (fastest in brackets) over the rounds. "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} when it ended: other work shares them); BLAS in every "
        f"process (threadpoolctl): {kernels.pop()}. Checked before the timing: {args.check} "
        f"steps of each model against numpy from the same weights, the largest weight "
        f"difference {max(c['err'] for c in checked.values()):.0e} of the largest weight; test "
        f"accuracy by ARGMAX {checked['log']['acc']:.3f} (logistic) and "
        f"{checked['mlp']['acc']:.3f} (MLP), numpy's the same. `{COMMAND}`",
        "",
        "| per step, ms: wall median (fastest), CPU median | logistic regression | vs numpy "
        "(median, fastest) | MLP 64-128-10 | vs numpy (median, fastest) |",
        "|---|---:|---:|---:|---:|"]
    for label, kind in (("numpy by hand", "numpy"), ("tensordb, in memory, one step per call",
                                                      "memory"),
                        ("tensordb, on disk, one step per call", "disk"),
                        (f"tensordb, in memory, {k} steps per call", "memory-@-k")):
        cells = []
        for model in ("log", "mlp"):
            key = kind.replace("@", model) if "@" in kind else f"{kind}-{model}"
            base = f"numpy-{model}"
            cells += [f"{med[key]:.2f} ({low[key]:.2f}), CPU {used[key]:.2f}",
                      f"{med[key] / med[base]:.2f}x, {low[key] / low[base]:.2f}x"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"A one-element assignment `a[i] = a[i] + 1` (one call): in memory "
        f"{med['memory-assign']:.2f} ms ({low['memory-assign']:.2f} fastest, CPU "
        f"{used['memory-assign']:.2f}), on disk {med['disk-assign']:.2f} ms "
        f"({low['disk-assign']:.2f}, CPU {used['disk-assign']:.2f}). CPU is the process's "
        "time on every core (its BLAS and worker threads included; numpy's OpenBLAS threads "
        "count while they spin for work): on a machine that other work shares, it says what "
        "a step costs when the wall time says how long it waited for a core.",
        "",
        "Where a one-step call's time goes, in memory (the stages wrapped and timed in one "
        f"process, the fastest of {args.split} calls for each part, ms; `catalog statements` is "
        "the DuckDB work of the commits, part of `commit` or of a later call that reads the "
        "catalog):",
        "",
        "| part of a call (ms, fastest) | logistic regression | MLP 64-128-10 | "
        "a[i] = a[i] + 1 |", "|---|---:|---:|---:|"]
    for row in SPLIT_ROWS:
        cells = [f"{parts[m][row]:.2f}" if row in parts[m] else "" for m in ("log", "mlp",
                                                                          "assign")]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        doc = ROOT / "docs" / "benchmarks.md"
        body = doc.read_text()
        section = f"<!-- mlsteps:begin -->\n{text}\n<!-- mlsteps:end -->"
        if "<!-- mlsteps:begin -->" in body:
            body = re.sub(r"<!-- mlsteps:begin -->.*<!-- mlsteps:end -->", lambda _: section,
                          body, flags=re.S)
        else:
            body = body.rstrip("\n") + "\n\n## ML steps (issue 29)\n\n" + section + "\n"
        doc.write_text(body)


if __name__ == "__main__":
    main()
