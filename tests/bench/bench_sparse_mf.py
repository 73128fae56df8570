"""A matrix-factorisation training step with GRAD on a sparse ratings matrix, against the same
step written with scipy.sparse and numpy, in one process, alternating.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/main/.venv/bin/python -m tests.bench.bench_sparse_mf

The step (sql/train_mf.sql's, `STEP` below): the residual at the observed ratings only (an
SDDMM: U's and V's rows gathered at R's coordinates, their dot products), the loss (squared
error plus L2 terms), `LET dU = GRAD(L, U); LET dV = GRAD(L, V)` (the scatter-adds of the
residual times the other factor's rows: SpMM with the one-hot rows of the index, sparse), and
the update of both factors, stored. tensordb runs it as one `execute` call (parse, bind, plan
from the plan cache, run, commit) on an in-memory database. The peer is the same step by hand:
`e = einsum(U[rows], V[cols]) - r`, then `E = csr(2e)`, `E @ V`, `E.T @ U` (scipy.sparse).
Each figure is the median of --repeat rounds after one warm-up; the ratio is tensordb's over the
peer's. The factors both end with are compared (they must agree to 1e-8). ``--eager`` also times
the step with every gather's rows taken at its Load (``GatherReader.read_rows`` answering None:
the code before ``RowGather``, storage/boxes.py) on a second database, in the same rounds, and
checks that both databases end with the same bits.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tensordb  # noqa: E402
from tests.bench import bench_suite  # noqa: E402

COMMAND = ("env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/main/.venv/bin/python "
           "-m tests.bench.bench_sparse_mf")
LAM, LR = 0.05, 0.001

STEP = f"""LET Resid[n] = SUM(U[obs_user[n], f] * V[obs_item[n], f]) - obs_rating[n];
L = SUM(Resid[n] * Resid[n]) + {LAM} * SUM(U[u,f] * U[u,f]) + {LAM} * SUM(V[i,f] * V[i,f]);
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - {LR} * dU[u,f];
V[i,f] = V[i,f] - {LR} * dV[i,f]"""


# The matrix form (--matrix-form): the residual as a users x items matrix masked by R's pattern
# M, the loss and its GRADs over it. Planned with sparse intermediates (docs/explain.md, "Sparse
# intermediates"): E is an SDDMM then a sparse join, SUM(E*E) a sparse join and reduction, the
# gradients an SpMM of 2E with the other factor; nothing of users x items is dense.
MATRIX_STEP = f"""LET E[u,i] = M[u,i] * SUM(U[u,f] * V[i,f]) - R[u,i];
L = SUM(E[u,i] * E[u,i]) + {LAM} * (SUM(U[u,f] * U[u,f]) + SUM(V[i,f] * V[i,f]));
LET dU = GRAD(L, U); LET dV = GRAD(L, V);
U[u,f] = U[u,f] - {LR} * dU[u,f];
V[i,f] = V[i,f] - {LR} * dV[i,f]"""


def ratings(users: int, items: int, nnz: int, seed: int = 0) -> sp.coo_array:
    """``nnz`` distinct (user, item) pairs drawn uniformly, ratings 1..5, in row-major order."""
    rng = np.random.default_rng(seed)
    flat = np.unique(rng.integers(0, users * items, int(nnz * 1.02)))[:nnz]
    rng.shuffle(flat)
    flat = np.sort(flat[:nnz])
    return sp.coo_array((rng.integers(1, 6, flat.size).astype(np.float64),
                         (flat // items, flat % items)), shape=(users, items))


class Peer:
    """The step by hand: SDDMM by gathering rows of U and V at R's coordinates, SpMM for the
    gradients (scipy.sparse), the same arithmetic as the SQL."""

    def __init__(self, R: sp.coo_array, U, V) -> None:
        self.rows, self.cols, self.vals = R.row, R.col, R.data
        self.shape = R.shape
        self.U, self.V = U.copy(), V.copy()
        self.loss = None

    def step(self) -> None:
        U, V = self.U, self.V
        e = np.einsum("nr,nr->n", U[self.rows], V[self.cols]) - self.vals
        self.loss = float(e @ e + LAM * np.sum(U * U) + LAM * np.sum(V * V))
        E = sp.csr_array((2 * e, (self.rows, self.cols)), shape=self.shape)
        dU = E @ V + 2 * LAM * U
        dV = E.T @ U + 2 * LAM * V
        self.U, self.V = U - LR * dU, V - LR * dV


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=50_000)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--nnz", type=int, default=500_000)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--matrix-form", action="store_true",
                    help="the residual as a users x items matrix masked by R's pattern "
                         "(MATRIX_STEP), R and M stored sparse, not the gathered vectors")
    ap.add_argument("--no-peer", action="store_true",
                    help="run tensordb's steps only (its peak memory alone, under peak-mem)")
    ap.add_argument("--eager", action="store_true",
                    help="also time the step with the gathers' rows taken at their Loads")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    R = ratings(args.users, args.items, args.nnz)
    rng = np.random.default_rng(1)
    U = 0.5 + 0.1 * rng.standard_normal((args.users, args.rank))
    V = 0.5 + 0.1 * rng.standard_normal((args.items, args.rank))
    peer = Peer(R, U, V)
    def load(con) -> None:
        con.load("U", U)
        con.load("V", V)
        if args.matrix_form:
            csr = R.tocsr()
            con.load("R", csr)
            con.load("M", sp.csr_array((np.ones_like(csr.data), csr.indices, csr.indptr),
                                       shape=csr.shape))
        else:
            con.load("obs_user", R.row.astype(np.int64))
            con.load("obs_item", R.col.astype(np.int64))
            con.load("obs_rating", R.data)

    if args.eager and args.matrix_form:
        ap.error("--eager times the gathers' rows taken at their Loads: the gather form only")
    step = MATRIX_STEP if args.matrix_form else STEP
    with tensordb.connect(None, workers=args.workers) as con, \
            tensordb.connect(None, workers=args.workers) as con2:
        t0 = time.perf_counter()
        load(con)
        t_load = time.perf_counter() - t0
        fns = {"tensordb": lambda: con.execute(step)}
        if not args.no_peer:
            fns["scipy"] = peer.step
        if args.eager:
            from tensordb.storage import boxes
            lazy = boxes.GatherReader.read_rows
            load(con2)

            def eager() -> None:
                boxes.GatherReader.read_rows = lambda self, starts, stops: None
                try:
                    con2.execute(step)
                finally:
                    boxes.GatherReader.read_rows = lazy
            fns["eager"] = eager
        times = bench_suite.median_times(fns, args.repeat)
        if args.no_peer:  # the same number of steps by the peer, after, for the answer
            for _ in range(args.repeat + 1):
                peer.step()
        err = max(bench_suite.rel_error(con.tensor("U"), peer.U),
                  bench_suite.rel_error(con.tensor("V"), peer.V))
        if args.eager:
            assert np.array_equal(con.tensor("U"), con2.tensor("U")) and \
                np.array_equal(con.tensor("V"), con2.tensor("V")), "not the same bits"
        plan = con.explain(step)
    assert err < 1e-8, err
    load1 = os.getloadavg()[0]
    times.setdefault("scipy", float("nan"))
    ratio = times["tensordb"] / times["scipy"]
    print(plan)
    print(f"MF step{' (matrix form)' if args.matrix_form else ''}, {args.users:,} users x "
          f"{args.items:,} items, {R.nnz:,} ratings "
          f"({R.nnz / args.users / args.items:.2%}), rank {args.rank}, "
          f"{args.workers} worker(s), median of {args.repeat}")
    print(f"| | tensordb (GRAD, SQL) | scipy.sparse + numpy | ratio |")
    print(f"|---|---:|---:|---:|")
    print(f"| one step | {times['tensordb'] * 1e3:,.0f} ms | {times['scipy'] * 1e3:,.0f} ms "
          f"| {ratio:.2f}x |")
    if args.eager:
        print(f"| the rows taken at the Loads (--eager; same bits) | {times['eager'] * 1e3:,.0f} ms "
              f"| {times['scipy'] * 1e3:,.0f} ms | {times['eager'] / times['scipy']:.2f}x |")
    print(f"loading the COO vectors and factors: {t_load * 1e3:,.0f} ms; the factors agree to "
          f"{err:.1e}; load average {load0:.1f} -> {load1:.1f}; {platform.machine()}, "
          f"{os.cpu_count()} cores; {bench_suite.blas_info()}; "
          f"total {time.perf_counter() - t_start:.0f} s")
    print(f"command: {COMMAND} " + " ".join(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":
    main()
