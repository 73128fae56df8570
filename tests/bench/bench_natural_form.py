"""The natural form against its hand split (run by hand): each one-statement form beside its LET
form, on the same stored tensors, medians of ``--runs`` runs.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_natural_form.py

The statements are tests/bind/test_natural_form.py's at moderate sizes: a 2-layer MLP (X 2048x512,
W1 512x2048, W2 2048x512), a masked attention block (softmax(Q K^T + M) V, 2048 positions, 64
wide) and a layer norm (4096x1024), all float32 in an on-disk database. Each run executes the
statement (the result is stored); also, by ``--only``, the same attention block unmasked
(softmax(Q K^T) V) and the MLP at 8192x1024x4096x1024 (``bigmlp``, X 32 MiB, H 128 MiB, 137
GFLOP a run). The two forms alternate, after one warm-up each, so that a
busy shared machine slows both alike. The ratio is one-statement / LET, of the medians and of
the best runs (the best is steadier on a machine others share). Also printed: whether
the two forms bind to the same operations (kernel methods, flops, kernel calls per operation).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import tensordb  # noqa: E402

MLP = ("Y[b,o] = SUM(RELU(SUM(X[b,h] * W1[h,f])) * W2[f,o])",
       "LET H[b,f] = RELU(SUM(X[b,h] * W1[h,f])); Y[b,o] = SUM(H[b,f] * W2[f,o])")
ATTENTION = (
    "O[i,d] = SUM(EXP(SUM(Q[i,e] * K[j,e]) + M[i,j] - MAX(SUM(Q[i,e] * K[k,e]) + M[i,k]))"
    " * V[j,d]) / SUM(EXP(SUM(Q[i,e] * K[m,e]) + M[i,m] - MAX(SUM(Q[i,e] * K[n,e]) + M[i,n])))",
    "LET S[i,j] = SUM(Q[i,e] * K[j,e]); LET mx[i] = MAX(S[i,k] + M[i,k]); "
    "LET P[i,j] = EXP(S[i,j] + M[i,j] - mx[i]); O[i,d] = SUM(P[i,j] * V[j,d]) / SUM(P[i,m])")
LAYER_NORM = (
    "N[i,j] = (C[i,j] - SUM(C[i,k]) / 1024) / "
    "SQRT(SUM(SQUARE(C[i,k] - SUM(C[i,m]) / 1024)) / 1024 + 1e-5)",
    "LET s[i] = SUM(C[i,k]); LET var[i] = SUM(SQUARE(C[i,k] - s[i] / 1024)); "
    "N[i,j] = (C[i,j] - s[i] / 1024) / SQRT(var[i] / 1024 + 1e-5)")
UNMASKED = (
    "O[i,d] = SUM(EXP(SUM(Q[i,e] * K[j,e]) - MAX(SUM(Q[i,e] * K[k,e]))) * V[j,d])"
    " / SUM(EXP(SUM(Q[i,e] * K[m,e]) - MAX(SUM(Q[i,e] * K[n,e]))))",
    "LET S[i,j] = SUM(Q[i,e] * K[j,e]); LET mx[i] = MAX(S[i,k]); "
    "LET P[i,j] = EXP(S[i,j] - mx[i]); O[i,d] = SUM(P[i,j] * V[j,d]) / SUM(P[i,m])")
BIG_MLP = ("Z[b,o] = SUM(RELU(SUM(XB[b,h] * W1B[h,f])) * W2B[f,o])",
           "LET H[b,f] = RELU(SUM(XB[b,h] * W1B[h,f])); Z[b,o] = SUM(H[b,f] * W2B[f,o])")
WORKLOADS = {"mlp": ("MLP 2048x512x2048x512", MLP),
             "attention": ("attention 2048x2048x64, causal", ATTENTION),
             "unmasked": ("attention 2048x2048x64, unmasked", UNMASKED),
             "layernorm": ("layer norm 4096x1024", LAYER_NORM),
             "bigmlp": ("MLP 8192x1024x4096x1024", BIG_MLP)}


def load(con) -> None:
    rng = np.random.default_rng(0)
    f32 = np.float32
    con.load("X", rng.standard_normal((2048, 512), dtype=f32))
    con.load("W1", rng.standard_normal((512, 2048), dtype=f32) / 20)
    con.load("W2", rng.standard_normal((2048, 512), dtype=f32) / 40)
    for name in ("Q", "K", "V"):
        con.load(name, rng.standard_normal((2048, 64), dtype=f32) / 8)
    con.load("M", np.where(np.tril(np.ones((2048, 2048))) > 0, 0, -1e9).astype(f32))
    con.load("C", rng.standard_normal((4096, 1024), dtype=f32) * 3 + 1)


def load_big(con) -> None:
    rng = np.random.default_rng(1)
    f32 = np.float32
    con.load("XB", rng.standard_normal((8192, 1024), dtype=f32))
    con.load("W1B", rng.standard_normal((1024, 4096), dtype=f32) / 32)
    con.load("W2B", rng.standard_normal((4096, 1024), dtype=f32) / 64)


def plan_shape(con, sql: str) -> list:
    nodes = json.loads(con.explain(sql, format="json"))["nodes"]
    return [(n["kernel"]["method"], n["flops"], n["kernel_calls"]) for n in nodes]


def seconds(con, sql: str) -> float:
    t = time.perf_counter()
    con.execute(sql)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=list(WORKLOADS),
                    default=["mlp", "attention", "unmasked", "layernorm"],
                    help="the workloads to run (bigmlp, the 8192x1024x4096 MLP, on request)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, tensordb.connect(os.path.join(tmp, "b.db")) as con:
        load(con)
        if "bigmlp" in args.only:
            load_big(con)
        print("| workload | operations (one / LET) | same plan | one statement | LET form | ratio "
              "| best one / LET | ratio of bests |")
        print("|---|---:|:---:|---:|---:|---:|---:|---:|")
        for name, (one, let) in (WORKLOADS[w] for w in args.only):
            s1, s2 = plan_shape(con, one), plan_shape(con, let)
            seconds(con, one), seconds(con, let)  # warm-up
            t1, t2 = [], []
            for _ in range(args.runs):
                t1.append(seconds(con, one))
                t2.append(seconds(con, let))
            m1, m2 = statistics.median(t1), statistics.median(t2)
            print(f"| {name} | {len(s1)} / {len(s2)} | {'yes' if s1 == s2 else 'no'} | "
                  f"{m1 * 1e3:.0f} ms | {m2 * 1e3:.0f} ms | {m1 / m2:.2f} | "
                  f"{min(t1) * 1e3:.0f} / {min(t2) * 1e3:.0f} ms | {min(t1) / min(t2):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
