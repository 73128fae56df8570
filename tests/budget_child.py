"""A child process for tests/exec/test_memory_budget.py: open a database, warm up, report the idle
anonymous memory, wait for the parent's go, run one script, report what the run measured (the
protocol of tests/harness.py's SampledChild).

    python -m tests.budget_child DB LIMIT WORKERS   (the script on stdin after the go line)

LIMIT is memory_limit in bytes (0: none). Protocol on stdout, one JSON object a line:
{"idle": bytes} after the warm-up; {"result": {...}} after the script, or {"error": "..."}.
"""
from __future__ import annotations

import json
import sys

import numpy as np

import tensordb
from tests.harness import rss_anon


def main() -> None:
    db, limit, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    con = tensordb.connect(db, workers=workers, memory_limit=limit or None)
    # Warm-up: BLAS buffers, NumPy, DuckDB and the executor's threads exist before idle is read.
    con.load("WarmA", np.ones((64, 64), np.float32), replace=True)
    con.execute("WarmC[i,k] = SUM(WarmA[i,j] * WarmA[j,k]);")
    con.execute("WarmM[i,k] = MIN(WarmA[i,j] + WarmA[j,k]);")
    idle = rss_anon()
    if idle is None:
        raise RuntimeError("no RssAnon in /proc/self/status")
    print(json.dumps({"idle": idle}), flush=True)
    go = sys.stdin.readline()  # the parent samples from now on
    script = sys.stdin.read()
    assert go.strip() == "go", go
    try:
        con.execute(script)
    except tensordb.Error as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return
    r = con.last_run
    print(json.dumps({"result": {"spilled_bytes": r.spilled_bytes, "peak_bytes": r.peak_bytes,
                                 "over_budget": r.over_budget}}), flush=True)
    con.close()


if __name__ == "__main__":
    main()
