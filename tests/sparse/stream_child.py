"""A child process for tests/sparse/test_sparse_stream.py: open a database at a memory_limit, warm
up, report the idle anonymous memory, wait for the parent's go, then either load a random graph
streamed in row slabs or run its SpMM (the protocol of tests/harness.py's SampledChild).

    python -m tests.sparse.stream_child DB LIMIT N PER_ROW TILE_ROWS SLAB_ROWS   (stdin: go, then
    "load" or "spmm")
"""
from __future__ import annotations

import json
import sys

import numpy as np
import scipy.sparse as sp

import tensordb
from tests.harness import rss_anon

SEED = 2027


def slab(s: int, rows: int, n: int, per_row: int):
    """Row slab ``s`` of the graph: ``per_row`` column draws a row, repeats dropped, values in
    (0, 1]; made again from its seed by the test's oracle."""
    rng = np.random.default_rng([SEED, s])
    cols = np.sort(rng.integers(0, n, (rows, per_row), dtype=np.int32), axis=1)
    keep = np.ones(cols.shape, bool)
    np.not_equal(cols[:, 1:], cols[:, :-1], out=keep[:, 1:])
    indptr = np.zeros(rows + 1, np.int32)
    np.cumsum(keep.sum(axis=1, dtype=np.int32), out=indptr[1:])
    indices = cols[keep]
    data = (1 - rng.random(indices.size, dtype=np.float32))
    return sp.csr_array((data, indices, indptr), shape=(rows, n))


def x_matrix(n: int) -> np.ndarray:
    return np.random.default_rng(SEED + 1).random((n, 4), dtype=np.float32)


def main() -> None:
    db, limit, n, per_row, tile_rows, slab_rows = sys.argv[1], *map(int, sys.argv[2:7])
    con = tensordb.connect(db, workers=2, memory_limit=limit)
    # warm-up: the same paths on a tiny matrix, so that idle counts what they import
    small = (slab(0, 8, 64, 4) for _ in range(2))
    con.load("WarmG", small, shape=(16, 64), tile=(8, 64), replace=True)
    con.load("WarmX", np.ones((64, 4), np.float32), replace=True)
    con.execute("WarmY[i,k] = SUM(WarmG[i,j] * WarmX[j,k]);")
    idle = rss_anon()
    print(json.dumps({"idle": idle}), flush=True)
    go = sys.stdin.readline()
    what = sys.stdin.read().strip()
    assert go.strip() == "go", go
    if what == "load":
        slabs = (slab(s, slab_rows, n, per_row) for s in range(n // slab_rows))
        con.load("G", slabs, shape=(n, n), tile=(tile_rows, n), dims=["i", "j"])
        meta = con.store.meta("G")
        print(json.dumps({"nnz": meta.nnz, "bytes": meta.nbytes, "tiles": meta.tile_count}),
              flush=True)
    else:
        con.execute("Y[i,k] = SUM(G[i,j] * X[j,k]);")
        r = con.last_run
        print(json.dumps({"peak_bytes": r.peak_bytes, "over_budget": r.over_budget}), flush=True)
    con.close()


if __name__ == "__main__":
    main()
