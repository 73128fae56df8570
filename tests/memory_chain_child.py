"""A child process for tests/test_memory_chains.py (the protocol of tests/harness.py's
SampledChild): open a database under a memory_limit, warm up with the operations the script
uses at a small size, report the idle anonymous memory, run the script after the parent's go,
and report what the run measured.

    python -m tests.memory_chain_child DB LIMIT WORKERS   (the script on stdin after the go line)

The warm-up runs a product and an elementwise reduction of the script's row width once: BLAS
keeps a buffer per thread whose pages a product touches the first time it needs them, and the
allocator keeps its arenas; both are the process's, whatever the memory_limit, so they belong to
the baseline the parent measures growth from (as tests/budget_child.py's warm-up does).
"""
from __future__ import annotations

import json
import sys

import numpy as np

import tensordb
from tests.harness import rss_anon


def main() -> None:
    db, limit, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    con = tensordb.connect(db, workers=workers, memory_limit=limit)
    con.execute("WarmH[i,k] = RELU(SUM(Warm[i,j] * W[j,k])); "
                "WarmY[i] = MAX(EXP(WarmH[i,k]) * W[k,k] - SIN(WarmH[i,k]));")
    idle = rss_anon()
    if idle is None:
        raise RuntimeError("no RssAnon in /proc/self/status")
    print(json.dumps({"idle": idle}), flush=True)
    go = sys.stdin.readline()  # the parent samples from now on
    script = sys.stdin.read()
    assert go.strip() == "go", go
    con.execute(script)
    r = con.last_run
    print(json.dumps({"result": {"spilled_bytes": r.spilled_bytes, "peak_bytes": r.peak_bytes,
                                 "over_budget": r.over_budget}}), flush=True)
    con.close()


if __name__ == "__main__":
    main()
