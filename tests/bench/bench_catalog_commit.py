"""What the catalog's part of a commit costs in DuckDB, right after a run and at once (by hand).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tests/bench/bench_catalog_commit.py

A training step (bench_train.py) commits three tensors: the loss and the two new weights, four
tile rows, each replacing the tensor's version of the step before with the same layout. This
times that catalog work on its own, in an in-memory DuckDB holding the catalog tables
(``catalog.create``): as tensordb does it (``catalog.store``: one UPDATE, one DELETE, one
INSERT), in a transaction, with DuckDB 2.0's appenders where the installed DuckDB has them, and
the least a statement costs (one UPDATE of one scalar, ``SELECT 1``). "cold": right after a
float32 product of the step's first layer (512 x 4096 x 1024), as a commit follows a run;
"warm": the same work again at once. Medians of ``--rounds``; the table is printed for
docs/benchmarks.md ("Why one step a call stays above 1.2x").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import duckdb  # noqa: E402

from tensordb.storage import catalog  # noqa: E402
from tensordb.storage.meta import TensorMeta  # noqa: E402
from tensordb.storage.reader import TileEntry  # noqa: E402

# the step's stored tensors: name -> (shape, row pieces); every tile spans all columns
TENSORS = {"L": ((), 1), "W1": ((4096, 1024), 2), "W2": ((1024, 16), 1)}
S = catalog.SCHEMA


def _meta(name: str, version: int) -> TensorMeta:
    shape, pieces = TENSORS[name]
    grid = tuple(tuple(range(0, n + 1, n // pieces)) if d == 0 else (0, n)
                 for d, n in enumerate(shape))
    nbytes = 4 * int(np.prod(shape))
    return TensorMeta(name, version, np.dtype(np.float32), shape, tuple("ij"[:len(shape)]),
                      grid, nbytes, pieces, int(np.prod(shape)), 1.0)


def _entries(meta: TensorMeta) -> list[TileEntry]:
    if not meta.shape:
        return [TileEntry((), (), (), 0, 4, 1, 7, False)]
    rows = meta.grid[0]
    cols = meta.shape[1]
    return [TileEntry((k, 0), (rows[k], 0), (rows[k + 1] - rows[k], cols), 4 * rows[k] * cols,
                      4 * (rows[k + 1] - rows[k]) * cols, (rows[k + 1] - rows[k]) * cols, 7, False)
            for k in range(len(rows) - 1)]


class Catalog:
    """An in-memory DuckDB with the catalog tables and the step's tensors, at a version that
    every commit moves on."""

    def __init__(self) -> None:
        self.duck = duckdb.connect()
        catalog.create(self.duck)
        self.version = 0
        self.metas = {}
        for name in TENSORS:
            self.version += 1
            meta = _meta(name, self.version)
            catalog.insert(self.duck, meta, f"{name}.{meta.version}", _entries(meta))
            self.metas[name] = meta
        self.appenders = None

    def _next(self):
        rows = []
        for name, old in self.metas.items():
            self.version += 1
            meta = _meta(name, self.version)
            rows.append((old, meta, f"{name}.{meta.version}", _entries(meta)))
            self.metas[name] = meta
        return rows

    def store(self) -> None:
        catalog.store(self.duck, self._next())

    def store_in_transaction(self) -> None:
        self.duck.execute("BEGIN TRANSACTION")
        self.store()
        self.duck.execute("COMMIT")

    def append(self) -> None:
        if self.appenders is None:
            self.appenders = (
                self.duck.appender(f"{S}.tensors", columns=["name", "version", "nnz", "density"],
                                   action="update", key=["name"]),
                self.duck.appender(f"{S}.tiles", action="delete", key=["tensor", "version"]),
                self.duck.appender(f"{S}.tiles"))
        update, delete, insert = self.appenders
        rows = self._next()
        for old, meta, _, _ in rows:
            update.append_row(meta.name, meta.version, meta.nnz, meta.density)
        update.flush()
        for old, _, _, _ in rows:
            delete.append_row(old.name, old.version)
        delete.flush()
        for _, meta, file, entries in rows:
            for e in entries:
                insert.append_row(meta.name, meta.version, list(e.coords), list(e.starts),
                                  list(e.shape), file, e.offset, e.nbytes, e.nnz, e.crc32,
                                  e.nonfinite)
        insert.flush()

    def append_in_transaction(self) -> None:
        self.duck.execute("BEGIN TRANSACTION")
        self.append()
        self.duck.execute("COMMIT")

    def update_one(self) -> None:
        self.duck.execute(f"UPDATE {S}.tensors SET nnz = ? WHERE name = ?", [1, "L"])

    def select_one(self) -> None:
        self.duck.execute("SELECT 1").fetchall()

    def check(self) -> None:
        """Each tensor's row names its newest version, which has its tile rows and no other."""
        for name, meta in self.metas.items():
            got = catalog.find(self.duck, name)
            assert got is not None and got.version == meta.version, (name, got)
            files, entries = catalog.tile_entries(self.duck, got)
            assert entries == _entries(meta), (name, entries)
        count = self.duck.execute(f"SELECT count(*) FROM {S}.tiles").fetchall()[0][0]
        assert count == sum(p for _, p in TENSORS.values()), count


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    cat = Catalog()
    forms = [("as tensordb commits: one UPDATE ... FROM VALUES, one DELETE, one INSERT",
              cat.store),
             ("the same in a BEGIN ... COMMIT", cat.store_in_transaction)]
    if hasattr(cat.duck, "appender"):
        forms += [("DuckDB 2.0's appenders (update, delete, insert; each flushed once)",
                   cat.append),
                  ("the appenders in a BEGIN ... COMMIT", cat.append_in_transaction)]
    forms += [("one UPDATE of one scalar in one row", cat.update_one), ("`SELECT 1`", cat.select_one)]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4096), dtype=np.float32)
    w = rng.standard_normal((4096, 1024), dtype=np.float32)
    times: dict[str, tuple[list, list]] = {label: ([], []) for label, _ in forms}
    for _ in range(args.rounds):
        for label, fn in forms:
            x @ w
            for kind in (0, 1):
                t0 = time.perf_counter()
                fn()
                times[label][kind].append(time.perf_counter() - t0)
    cat.check()
    print(f"DuckDB {duckdb.__version__}, medians of {args.rounds}")
    print("| the catalog's part of a step's commit (3 tensors, 4 tile rows) | cold | warm |")
    print("|---|---:|---:|")
    for label, (cold, warm) in times.items():
        print(f"| {label} | {1e3 * statistics.median(cold):.2f} ms | "
              f"{1e3 * statistics.median(warm):.2f} ms |")


if __name__ == "__main__":
    main()
