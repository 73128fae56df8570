"""A child process for tests/exec/test_memory_budget.py: open a database, warm up, report the idle
anonymous memory, wait for the parent's go, run one script, report what the run measured (the
protocol of tests/harness.py's SampledChild).

    python -m tests.budget_child DB LIMIT WORKERS   (the script on stdin after the go line)

LIMIT is memory_limit in bytes (0: none). Protocol on stdout, one JSON object a line:
{"idle": bytes} after the warm-up; {"result": {...}} after the script, or {"error": "..."}.
"""
from __future__ import annotations

import sys

import numpy as np

import tensordb
from tests.harness import serve_sampled


def main() -> None:
    db, limit, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    con = tensordb.connect(db, workers=workers, memory_limit=limit or None)
    # Warm-up: BLAS buffers, NumPy, DuckDB and the executor's threads exist before idle is read.
    con.load("WarmA", np.ones((64, 64), np.float32), replace=True)
    con.execute("WarmC[i,k] = SUM(WarmA[i,j] * WarmA[j,k]);")
    con.execute("WarmM[i,k] = MIN(WarmA[i,j] + WarmA[j,k]);")
    serve_sampled(con, errors=(tensordb.Error,))


if __name__ == "__main__":
    main()
