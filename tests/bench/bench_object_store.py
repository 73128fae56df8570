"""The workload suite with the payloads in an object store on loopback against the local
directory, side by side (storage/objects.py). The S3 server is moto's (``moto_server``, a process
of its own on 127.0.0.1), standing in for S3/MinIO: docs/storage.md says what differs. Run by
hand, a few workloads at a time (each run under a minute); rows accumulate in a JSON file and
the table goes to docs/benchmarks.md between the objectstore markers:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_object_store.py --only "float64 matmul"
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_object_store.py --render

Every configuration runs the same plans (workers=2) from stored tensors to a stored result: the
local pool over a database directory ('local dir'), the local pool with the payloads in the
object store ('object store'), and with --dask a LocalCluster of 2 worker processes, whose
workers read the object store themselves. Times are medians of --repeat runs after a warm-up,
timed in alternation; ratios are medians of the paired ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
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
from tests.bench.bench_suite import write_section  # noqa: E402
from tests.bench.workloads import suite  # noqa: E402

COMMAND = ("env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python "
           "tests/bench/bench_object_store.py")
ROWS = Path(tempfile.gettempdir()) / "tensordb-bench-object-store.json"
BUCKET = "bench"
OPTIONS: dict = {}  # the storage_options of the running server


def start_moto() -> tuple[subprocess.Popen, dict]:
    """moto_server on a free port of 127.0.0.1, and the storage_options that reach it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from pyarrow import fs
    admin = fs.S3FileSystem(access_key="bench", secret_key="bench", region="us-east-1",
                            endpoint_override=f"127.0.0.1:{port}", scheme="http",
                            allow_bucket_creation=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.create_dir(BUCKET)
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.2)
    return proc, {"endpoint": f"http://127.0.0.1:{port}", "access_key": "bench",
                  "secret_key": "bench", "region": "us-east-1"}


# Seconds spent in object-store requests (tests/bench/objstore_timers.py), by kind: PutObject
# of a whole payload or of a part object ('put'), a part of a multipart upload ('part'), its
# completion ('complete'), ranged GETs ('read'); in this process (the client) and, read from
# each of them after a run, in the Dask workers.
from tests.bench import objstore_timers  # noqa: E402
from tensordb.storage import objparts  # noqa: E402

CLUSTER: list = []  # [distributed.Client of the LocalCluster], with --dask
# with --ab: Dask's workers upload each output's parts into one multipart upload, completed
# by the client at commit, as before part objects (objparts.WORKER_PART_OBJECTS = False)
MULTIPART = "Dask, multipart"


def _take_all() -> tuple[dict, dict]:
    """(client's, workers' summed) seconds per kind since the last take."""
    mine = objstore_timers.take()
    theirs = {k: 0.0 for k in objstore_timers.KINDS}
    if CLUSTER:
        for spent in CLUSTER[0].run(objstore_timers.take).values():
            for k, v in spent.items():
                theirs[k] += v
    return mine, theirs


def raw_transfer(options: dict, nbytes: int, repeat: int) -> tuple[float, float]:
    """moto's floor for ``nbytes``: the median seconds of one PutObject of that many bytes
    (boto3, one request: the fastest upload this client has) and of one GET of the object,
    nothing of tensordb in between."""
    from tensordb.storage.objects import ObjectStore
    store = ObjectStore(f"s3://{BUCKET}/raw", options)
    data = np.random.default_rng(1).integers(0, 255, nbytes, np.uint8).tobytes()
    puts, gets = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        store.s3.put_object(Bucket=BUCKET, Key="raw/x", Body=data)
        puts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.s3.get_object(Bucket=BUCKET, Key="raw/x")["Body"].read()
        gets.append(time.perf_counter() - t0)
    store.s3.delete_object(Bucket=BUCKET, Key="raw/x")
    return statistics.median(puts), statistics.median(gets)


def run_workload(w, cons: dict, repeat: int) -> dict:
    arrays = w.arrays(np.random.default_rng(0))
    graph = w.graph()
    row, times = {"name": w.name}, {label: [] for label in cons}
    spent = {"put": 0.0, "read": 0.0}
    dask = {"worker PUTs": 0.0, "worker parts": 0.0, "completes": 0.0, "client PUTs": 0.0,
            "worker GETs": 0.0}
    for label, con in cons.items():
        for name, a in arrays.items():
            con.load(name, a, tile=w.tile.get(name), replace=True)
        objparts.WORKER_PART_OBJECTS = label != MULTIPART
        con.run(graph, replace=True)  # warm-up
        objparts.WORKER_PART_OBJECTS = True
    labels = list(cons)
    for r in range(repeat):
        for label in labels if r % 2 == 0 else labels[::-1]:
            _take_all()
            objparts.WORKER_PART_OBJECTS = label != MULTIPART
            t0 = time.perf_counter()
            cons[label].run(graph, replace=True)
            times[label].append(time.perf_counter() - t0)
            objparts.WORKER_PART_OBJECTS = True
            mine, theirs = _take_all()
            if label == "object store":
                spent["put"] += mine["put"] + mine["part"] + mine["complete"]
                spent["read"] += mine["read"]
            elif label == "Dask, object store":
                dask["worker PUTs"] += theirs["put"]
                dask["worker parts"] += theirs["part"]
                dask["completes"] += mine["complete"] + mine["part"]
                dask["client PUTs"] += mine["put"]
                dask["worker GETs"] += theirs["read"]
    # one more run of the local pool over the object store with this process's range cache
    # emptied first: its inputs fetched from the store again, as a query's first run does
    from tensordb.storage.objreader import _RANGES
    _RANGES.clear()
    _take_all()
    t0 = time.perf_counter()
    cons["object store"].run(graph, replace=True)
    row["cold s"] = time.perf_counter() - t0
    row["cold GETs s"] = _take_all()[0]["read"]
    for k, v in dask.items():
        if "Dask, object store" in cons:
            row[f"Dask {k} s/run"] = v / repeat
    row["uploads s/run"] = spent["put"] / repeat
    row["GETs s/run"] = spent["read"] / repeat
    want = cons["local dir"].tensor(w.output)
    stored = sum(m.nbytes for m in cons["local dir"].store.list() if m.name not in arrays)
    row["output MiB"] = stored / 2**20
    row["raw PUT s"], row["raw GET s"] = raw_transfer(OPTIONS, max(stored, 1), repeat)
    row["raw PUT / local dir"] = row["raw PUT s"] / statistics.median(times["local dir"])
    for label in labels:
        row[label] = statistics.median(times[label])
        if label != "local dir":
            row[f"{label} / local dir"] = statistics.median(
                o / l for o, l in zip(times[label], times["local dir"]))
            got = cons[label].tensor(w.output)
            row[f"{label} diff"] = float(np.abs(got - want).max()) / max(1.0, float(
                np.abs(want).max()))
    if MULTIPART in times:  # part objects against the multipart upload of before, paired
        row[f"Dask, object store / {MULTIPART}"] = statistics.median(
            d / m for d, m in zip(times["Dask, object store"], times[MULTIPART]))
    if "Dask, object store" in times:  # Dask against the local pool, both over the store
        row["Dask, object store / object store"] = statistics.median(
            d / o for d, o in zip(times["Dask, object store"], times["object store"]))
    for con in cons.values():
        for name in list(arrays) + [w.output]:
            con.drop(name, if_exists=True)
    return row


def render(rows: list[dict], meta: dict, missing: list[str]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    labels = [k for k in keys if k != "name" and " / " not in k and "diff" not in k
              and "s/run" not in k and "cold" not in k and "raw" not in k and "MiB" not in k]
    ratios = [k for k in keys if " / " in k and "raw" not in k]
    floor = [k for k in ("raw PUT / local dir",) if any(k in r for r in rows)]
    dask = [k for k in ("worker PUTs", "worker parts", "completes", "client PUTs", "worker GETs")
            if any(f"Dask {k} s/run" in r for r in rows)]

    def cell(r, k, scale=1.0, fmt=".2f"):
        return format(scale * r[k], fmt) if k in r else "-"
    lines = [f"Commands: `{COMMAND} --repeat {meta['repeat']} --dask --only <workload>` for "
             f"each workload, then `{COMMAND} --render`",
             "",
             f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
             f"{platform.python_version()}; the S3 server is moto {meta['moto']} "
             "(`moto_server`, a process of its own on 127.0.0.1, objects in its memory). Same "
             "plans for 2 workers everywhere, from stored tensors to a stored result (the "
             "local pool puts each output whole from memory before its commit, one PutObject; "
             "Dask's workers put each part of the outputs they computed, from 8 MiB, as an "
             "object of its own: storage/objparts.py; 'Dask, local dir' is the same cluster "
             "over a local directory, the Dask executor's own cost); medians of "
             f"{meta['repeat']} runs after a warm-up, timed in alternation, in ms; ratios are "
             "medians of the paired ratios.", "",
             "| workload | " + " | ".join(f"{l} ms" for l in labels) + " | " +
             " | ".join(ratios) + " | of the object store's ms: uploads | ranged GETs | cold run ms | its GETs ms |"
             + "".join(f" Dask's {k} ms |" for k in dask)
             + (" output MiB | moto's floor: one PutObject of it ms | its GET ms | "
                "that PUT / local dir |" if floor else ""),
             "|---|" + "---:|" * (len(labels) + len(ratios) + 4 + len(dask) + 4 * len(floor))]
    for r in rows:
        lines.append(f"| {r['name']} | " + " | ".join(cell(r, l, 1e3, ".0f") for l in labels) +
                     " | " + " | ".join(cell(r, k) for k in ratios) + " | " +
                     cell(r, "uploads s/run", 1e3, ".0f") + " | " +
                     cell(r, "GETs s/run", 1e3, ".0f") + " | " + cell(r, "cold s", 1e3, ".0f") +
                     " | " + cell(r, "cold GETs s", 1e3, ".0f") + " |" +
                     "".join(f" {cell(r, f'Dask {k} s/run', 1e3, '.0f')} |" for k in dask) +
                     (f" {cell(r, 'output MiB', 1, '.0f')} | {cell(r, 'raw PUT s', 1e3, '.0f')} | "
                      f"{cell(r, 'raw GET s', 1e3, '.0f')} | {cell(r, 'raw PUT / local dir')} |"
                      if floor else ""))
    for name in missing:
        lines.append(f"| {name} | not measured: its run did not fit the benchmark's time "
                     "limit with moto's throughput |" + " |" * (len(labels) + len(ratios) + 3
                                                              + len(dask) + 4 * len(floor)))
    def geomean(k, rows):
        return (float(np.exp(np.mean(np.log([r[k] for r in rows if k in r])))),
                sum(k in r for r in rows))
    geo = {k: geomean(k, rows) for k in ratios + floor}
    # the workloads where one PutObject of the result takes moto no longer than the local
    # directory's whole run: there a client within 2x is possible on this server
    allowed = [r for r in rows if r.get("raw PUT / local dir", 0) <= 1]
    within = {k: geomean(k, allowed) for k in ratios} if floor else {}
    lines += ["", "Geometric means: " + "; ".join(f"{k} **{v:.2f}** (over {n} workloads)"
                                                  for k, (v, n) in geo.items()) +
              ("; over the workloads whose raw PUT / local dir is at most 1: " +
               "; ".join(f"{k} **{v:.2f}** (over {n})" for k, (v, n) in within.items())
               if within else "") +
              ". Largest relative difference from the local directory's result: " +
              f"{max(r[k] for r in rows for k in r if 'diff' in k):.1e}. 'uploads' and "
              "'ranged GETs' are the ms per run the client spent in those requests (the local "
              "pool over the object store, summed over its threads, so GETs may exceed the "
              "wall time); 'Dask's ...' the same for the Dask run over the object store: the "
              "workers' PutObjects of part objects (summed over both workers), their parts of "
              "multipart uploads, the client's completions, its own PutObjects (outputs "
              "under 8 MiB, gathered) and the workers' ranged GETs; GETs near 0 "
              "mean every input range came from the process's range cache (objreader.py), "
              "fetched in the warm-up, as the local directory's come from the page cache. "
              "'cold run' is one more run after emptying that cache: every input fetched from "
              "the store again, as a first query does. 'moto's floor': one PutObject and one "
              "GET of as many bytes as the run stores, straight from boto3 (no tensordb), "
              "and that PUT's time over the local directory's whole run: where it is over 1, "
              "moto takes longer to receive the result than the local directory takes to "
              "compute and write it."]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="run workloads whose name contains this text")
    ap.add_argument("--dask", action="store_true", help="also: Dask workers over the store")
    ap.add_argument("--ab", action="store_true", help="with --dask: also Dask's workers "
                    "writing multipart uploads (the way before part objects), side by side")
    ap.add_argument("--render", action="store_true", help="write the table of the rows so far")
    ap.add_argument("--fresh", action="store_true", help="forget the rows of earlier runs")
    args = ap.parse_args(argv)
    saved = json.loads(ROWS.read_text()) if ROWS.exists() and not args.fresh else \
        {"rows": {}, "meta": {}}
    if args.render:
        order = [w.name for w in suite()]
        rows = sorted(saved["rows"].values(), key=lambda r: order.index(r["name"]))
        text = render(rows, saved["meta"], [n for n in order if n not in saved["rows"]])
        print(text)
        write_section("## Payloads in an object store against the local directory\n\n" + text,
                      "objectstore")
        return
    import moto
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout: the server goes too
    proc, options = start_moto()
    OPTIONS.update(options)
    objstore_timers.install()
    cluster = None
    try:
        with tempfile.TemporaryDirectory() as d:
            cons = {"local dir": tensordb.connect(os.path.join(d, "local"), workers=2),
                    "object store": tensordb.connect(
                        os.path.join(d, "obj"), workers=2, storage=f"s3://{BUCKET}/pool",
                        storage_options=options)}
            if args.dask:
                from tensordb.exec.dask import local_cluster
                cluster = local_cluster(2)
                from distributed import Client
                CLUSTER.append(Client(cluster))
                CLUSTER[0].run(objstore_timers.install)
                # the Dask executor's own cost: the same cluster over a local directory
                cons["Dask, local dir"] = tensordb.connect(
                    os.path.join(d, "dlocal"), workers=2,
                    executor=f"dask://{cluster.scheduler_address}")
                cons["Dask, object store"] = tensordb.connect(
                    os.path.join(d, "dobj"), workers=2, storage=f"s3://{BUCKET}/dask",
                    storage_options=options, executor=f"dask://{cluster.scheduler_address}")
                if args.ab:
                    cons[MULTIPART] = tensordb.connect(
                        os.path.join(d, "dmulti"), workers=2, storage=f"s3://{BUCKET}/multi",
                        storage_options=options,
                        executor=f"dask://{cluster.scheduler_address}")
            for w in suite():
                if args.only and args.only not in w.name:
                    continue
                row = run_workload(w, cons, args.repeat)
                saved["rows"][w.name] = row
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()},
                      flush=True)
            for con in cons.values():
                con.close()
    finally:
        if CLUSTER:
            CLUSTER.pop().close()
        if cluster is not None:
            cluster.close()
        proc.kill()
        proc.wait()
    saved["meta"] = {"repeat": args.repeat, "dask": args.dask, "moto": moto.__version__}
    ROWS.write_text(json.dumps(saved))


if __name__ == "__main__":
    main()
