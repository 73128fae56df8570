"""The Dask executor's round trips a query, A/B in one process (docs/distributed.md, "Round
trips a query"): the results straight from the workers (exec/dask_collect.py), the workers'
facts cached until one joins or leaves, and the client's stream unbatched, against the older
paths on the same cluster (the results gathered through the scheduler, the facts asked for each
query, Dask's 10 ms stream), alternating query by query, with the local pool as the reference.
Counts the requests the client makes per query (rpc to the scheduler, messages on its stream,
rpc to workers). Run by hand, on a few small workloads (names, comma-separated, matched as
substrings) and a count of rounds:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.bench_dask_round_trips \
        "1%,tensor network,attention,Gram,batched" 11
"""
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tensordb  # noqa: E402
from tensordb.exec.dask import local_cluster  # noqa: E402
from tests.bench.workloads import suite  # noqa: E402

def main():
    names = sys.argv[1].split(","); N = int(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp, local_cluster(2) as cluster, \
            tensordb.connect(Path(tmp) / "local", workers=2) as local, \
            tensordb.connect(Path(tmp) / "dask", workers=2, storage="shared",
                             executor=f"dask://{cluster.scheduler_address}") as dask:
        ex = dask._get_executor(); client = ex.client
        new_collectors = ex.collectors
        msgs = Counter()
        osend = client._send_to_scheduler
        def send(msg):
            msgs[("stream", msg.get("op"))] += 1; return osend(msg)
        client._send_to_scheduler = send
        sched = client.scheduler
        class Spy:
            def __getattr__(self, op):
                f = getattr(sched, op)
                async def call(**kw):
                    msgs[("rpc-scheduler", op)] += 1; return await f(**kw)
                return call
        client.scheduler = Spy()
        orpc = client.rpc
        class RpcSpy:
            def __call__(self, addr):
                r = orpc(addr)
                class W:
                    def __getattr__(self, op):
                        f = getattr(r, op)
                        async def call(**kw):
                            msgs[("rpc-worker", op)] += 1; return await f(**kw)
                        return call
                return W()
            def __getattr__(self, a): return getattr(orpc, a)
        client.rpc = RpcSpy()
        def mode(new):
            ex.collectors = new_collectors if new else (lambda addrs: set())
            ex.listening = new
            client.scheduler_comm.interval = 0.001 if new else 0.01
            if not new: ex._info = None
        print("uptime", os.getloadavg())
        for w in suite():
            if not any(n in w.name for n in names): continue
            arrays = w.arrays(np.random.default_rng(0)); graph = w.graph()
            for con in (local, dask):
                for name, a in arrays.items():
                    con.load(name, a, tile=w.tile.get(name), replace=True)
                con.run(graph, replace=True); con.run(graph, replace=True)
            t = {"local": [], "old": [], "new": []}; counts = {"old": Counter(), "new": Counter()}
            for r in range(N):
                for label in (["local", "old", "new"] if r % 2 == 0 else ["new", "old", "local"]):
                    if label == "local":
                        t0 = time.perf_counter(); local.run(graph, replace=True); t[label].append(time.perf_counter() - t0)
                        continue
                    mode(label == "new"); time.sleep(0.02)
                    msgs.clear()
                    t0 = time.perf_counter(); dask.run(graph, replace=True); t[label].append(time.perf_counter() - t0)
                    counts[label].update(msgs)
            want = local.tensor(w.output); got = dask.tensor(w.output)
            assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * max(1, np.abs(want).max()))
            med = {k: statistics.median(v) for k, v in t.items()}
            print(f"{w.name}: local {1e3*med['local']:.1f} ms, old {1e3*med['old']:.1f} ms ({med['old']/med['local']:.2f}x), "
                  f"new {1e3*med['new']:.1f} ms ({med['new']/med['local']:.2f}x); new/old paired "
                  f"{statistics.median(n/o for n, o in zip(t['new'], t['old'])):.2f}", flush=True)
            for k in ("old", "new"):
                print("   ", k, "per query:", {f"{a}:{b}": round(c / N, 2) for (a, b), c in sorted(counts[k].items())})
        mode(True)
        print("uptime", os.getloadavg())

if __name__ == "__main__":
    main()
