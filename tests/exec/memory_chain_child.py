"""A child process for tests/exec/test_memory_chains.py (the protocol of tests/harness.py's
SampledChild): open a database under a memory_limit, warm up by running WARMUP (the script
itself, on tensors of other names), report the idle anonymous memory, run the script after the
parent's go, and report what the run measured.

    python -m tests.exec.memory_chain_child DB LIMIT WORKERS WARMUP   (the script on stdin after go)

The first run of a script in a process leaves memory behind that no run holds (6-11 MiB here,
with nothing alive afterwards, after gc and malloc_trim too): the pages OpenBLAS touches in its
per-thread buffers the first time a product of that size runs, the allocator's arenas. They are
the process's, whatever the memory_limit, so they belong to the baseline the parent measures
growth from (tests/budget_child.py warms up the same way, with smaller statements); a second
run of the same script peaks at the limit.
"""
from __future__ import annotations

import sys

import tensordb
from tests.harness import serve_sampled


def main() -> None:
    db, limit, workers, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    con = tensordb.connect(db, workers=workers, memory_limit=limit)
    con.execute(warmup)
    serve_sampled(con)


if __name__ == "__main__":
    main()
