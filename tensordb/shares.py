"""The shares of a connection's memory_limit: who may hold how much of it, in one place.

A query's workers split the limit evenly (``worker``: what the optimizer fits one kernel call
into, and sizes a broadcasting kernel's chunks from; a Dask worker process gets its share
too); a load or an export gives DuckDB half of it, at least ``DUCK_FLOOR`` (``duck``), and passes
Arrow batches of at most a sixteenth (``batch``); outputs computed in anonymous memory before
they are written hold at most a sixteenth (``staging``). Without a limit (None) there is no
worker share, DuckDB keeps its default (except for a COO sort: ``SORT_MEMORY``) and batches are
``BATCH_BYTES``.

Who asks: the projected memory (plan/memory.py), the executors' capabilities (the pool's,
exec/contract.py; Dask's, and the limit of each worker process of a cluster it makes,
exec/dask.py), the staging cap of a run's outputs (driver/sink.py), DuckDB's memory for loads
and exports (storage/budget.py). A share of the limit computed anywhere else is a bug.

>>> s = Shares(128 << 20, workers=2)
>>> s.worker == 64 << 20, s.duck == 64 << 20, s.batch == 8 << 20, Shares(None, 4).worker
(True, True, True, None)
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Shares", "SORT_MEMORY", "DUCK_FLOOR", "BATCH_BYTES", "BATCH_FLOOR"]

SORT_MEMORY = 1 << 30   # DuckDB memory for sorting a COO table by tile without a memory_limit
DUCK_FLOOR = 64 << 20   # the least DuckDB gets: its CSV reader and a sort fail below about 50 MB
BATCH_BYTES = 16 << 20  # per Arrow batch without a memory_limit: about one tile
BATCH_FLOOR = 1 << 20


@dataclass(frozen=True)
class Shares:
    """The shares of ``limit`` bytes (None: no limit) among ``workers`` (see the module)."""

    limit: int | None
    workers: int = 1

    @property
    def worker(self) -> int | None:
        """One worker's share (None: no limit)."""
        if self.limit is None:
            return None
        return max(1, int(self.limit) // max(1, int(self.workers)))

    @property
    def duck(self) -> int | None:
        """DuckDB's memory limit during a load or export (None: leave DuckDB's default)."""
        return None if self.limit is None else max(int(self.limit) // 2, DUCK_FLOOR)

    @property
    def sort(self) -> int:
        """DuckDB's memory limit for sorting a COO table by tile."""
        return SORT_MEMORY if self.limit is None else max(int(self.limit) // 2, DUCK_FLOOR)

    @property
    def batch(self) -> int:
        """The most bytes of one Arrow batch between DuckDB and a loader or an exporter."""
        if self.limit is None:
            return BATCH_BYTES
        return min(BATCH_BYTES, max(int(self.limit) // 16, BATCH_FLOOR))

    @property
    def staging(self) -> int | None:
        """The most bytes of outputs computed in anonymous memory before they are written."""
        return None if self.limit is None else int(self.limit) // 16
