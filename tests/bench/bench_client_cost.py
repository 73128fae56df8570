"""What the client of a Dask run costs per task (docs/distributed.md, "64 machines over an object
store, on paper"): a LocalCluster of 2 worker processes over a database directory declared
shared (the workers read their inputs and write their outputs), and a block matmul of many
tasks. Run by hand (well under a minute):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_client_cost.py

Measured in the client process: the CPU seconds of the whole query (planning, building and
submitting the graph, waiting, receiving the facts, the catalog commit; every thread of the
process, Dask's event loop included), the bytes of the graph it submits (pickled as the client
sends it: cloudpickle of the task specs), the bytes of the values it receives (each output
tile's facts), and the catalog commit's time. Medians of --repeat runs after one warm-up.
"""
from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensordb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--pieces", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    import cloudpickle

    from tensordb.exec import dask_run
    from tensordb.exec.dask import local_cluster
    from tensordb.driver import sink as sink_mod

    seen: dict = {}

    def graph_of(*args, **kwargs):  # the fused graph of one attempt (exec/dask_fuse.py)
        fused = real_fusion(*args, **kwargs)
        graph = fused.graph
        seen["graph_bytes"] = len(cloudpickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL))
        seen["graph_tasks"] = len(graph)
        return fused

    def wait(self, futures):
        values = real_wait(self, futures)
        seen["received_bytes"] = sum(len(pickle.dumps(v)) for v in values)
        seen["received_values"] = len(values)  # the fused tasks gathered (GroupOut)
        return values

    def commit(self, result):
        t0 = time.perf_counter()
        try:
            return real_commit(self, result)
        finally:
            seen["commit_s"] = time.perf_counter() - t0

    real_fusion, real_wait = dask_run.Fusion, dask_run.Attempt._wait
    real_commit = sink_mod._Stored.commit
    dask_run.Fusion, dask_run.Attempt._wait = graph_of, wait
    sink_mod._Stored.commit = commit
    p, n = args.pieces, args.n
    q = f"C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i {p}, j {p}, k {p})"
    with tempfile.TemporaryDirectory() as d, local_cluster(2) as cluster, \
            tensordb.connect(os.path.join(d, "db"), storage="shared",
                             executor=f"dask://{cluster.scheduler_address}") as con:
        rng = np.random.default_rng(0)
        con.load("A", rng.standard_normal((n, n), dtype=np.float32), tile=(n // p, n // p))
        con.load("B", rng.standard_normal((n, n), dtype=np.float32), tile=(n // p, n // p))
        rows = []
        for i in range(args.repeat + 1):
            c0, t0 = time.process_time(), time.perf_counter()
            con.execute(q)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            if i:
                rows.append((cpu, wall, dict(seen)))
        tasks = con.last_plan.task_count
        outs = len(con.last_plan.outputs["C"].tiles)
    cpu = statistics.median(r[0] for r in rows)
    wall = statistics.median(r[1] for r in rows)
    commit = statistics.median(r[2]["commit_s"] for r in rows)
    s = rows[-1][2]
    print(f"uptime: {os.getloadavg()}")
    print(f"{n}^2 float32 matmul, {p}x{p}x{p} pieces: {tasks} plan tasks, "
          f"{s['graph_tasks']} Dask tasks, {outs} output tiles")
    print(f"client CPU {cpu * 1e3:.0f} ms per query ({cpu / s['graph_tasks'] * 1e6:.0f} us a "
          f"Dask task), wall {wall * 1e3:.0f} ms")
    print(f"graph sent: {s['graph_bytes'] / 1024:.0f} KiB "
          f"({s['graph_bytes'] / s['graph_tasks']:.0f} B a task); received: "
          f"{s['received_bytes']} B in {s['received_values']} gathered Dask tasks for {outs} "
          f"output tiles ({s['received_bytes'] / max(1, outs):.0f} B a tile)")
    print(f"catalog commit of {outs} tiles: {commit * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
