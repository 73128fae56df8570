"""Where a run's output tiles go (``Prepared.run(executor, sink)``): a sink's ``open(prepared)``
gives the run's ``buffers`` (task key -> array the executor computes that tile into, or None),
``finished`` (called with each final tile), ``abort()`` and ``commit(result)``.

``StoreSink`` is the store's commit path (physical.OutputWriters: tiles computed straight into
their new payload files, the catalog taking every output in one transaction); ``ArraySink``
stores nothing and assembles one output as a numpy array (``con.einsum`` without ``into``).
"""
from __future__ import annotations

import numpy as np

from .. import physical
from ..geometry import tile_box
from ..shares import Shares
from ..storage.sparse import densify

__all__ = ["StoreSink", "ArraySink", "EARLY_CHECK_FLOPS"]

# A statement planned afresh whose kernels do at most this many flops (a few ms) leaves the user
# table check to its commit (see StoreSink).
EARLY_CHECK_FLOPS = 1 << 24


class StoreSink:
    """Store the outputs, replacing tensors of their names when ``replace``.

    Nothing is visible until the catalog commit. A user table named like an output is refused
    by the commit; a plan made afresh (a new statement) is also checked before its run, so that
    a refused name costs no compute, unless its kernels are a few milliseconds at most: then
    that catalog query (0.5 ms) would cost more than it could save. A repeated plan is not.
    Outputs computed in anonymous memory are outside the memory budget: a sixteenth of the
    limit at most (no limit: the writer's own cap per file)."""

    def __init__(self, store, memory_limit: int | None, replace: bool = True) -> None:
        self.store, self.limit, self.replace = store, memory_limit, replace

    def open(self, prepared) -> "_Stored":
        plan, staging = prepared.plan, Shares(self.limit).staging  # a sixteenth (shares.py)
        # the staging buffers kept between statements: no more than one statement may stage
        self.store.staging.cap(staging)
        writers = physical.OutputWriters(
            self.store, plan, replace=self.replace,
            check_tables=prepared.fresh and sum(s.flops for s in plan.stats) > EARLY_CHECK_FLOPS,
            stage_max=staging,
            fills=prepared.decomp.details.get("output_fill"))
        return _Stored(writers)


class _Stored:
    def __init__(self, writers) -> None:
        self.writers = writers
        self.buffers, self.finished, self.abort = writers.buffers, writers.finished, writers.abort

    def commit(self, result):
        self.writers.store_tiles(result.tiles, result.nnz, result.nonfinite, result.crc32)
        result.output_nnz = self.writers.nnz()  # what EXPLAIN ANALYZE compares the estimate with
        result.output_nonfinite = self.writers.nonfinite()  # bind/overflow.py warns of these
        # The tiles are the stored tensors' now (read them through the catalog): the result
        # keeps its statistics, not the buffers, which the next run's outputs may then reuse
        # (a staging buffer, a spare payload file no mapping holds).
        result.tiles = {}
        return result


class ArraySink:
    """Return output ``name`` as an array; nothing is stored (its tiles stay in memory and are
    assembled here). ``check(what, shape, dtype)`` refuses an array too big, before the run."""

    buffers = finished = None

    def __init__(self, name: str, check=None) -> None:
        self.name, self.check = name, check

    def open(self, prepared) -> "ArraySink":
        out = prepared.plan.outputs[self.name]
        if self.check is not None:
            self.check("the einsum's result", out.shape, out.dtype)
        self.out = out
        return self

    def abort(self) -> None:
        pass

    def commit(self, result):
        # Tiles no call produced are zeros. np.zeros' pages take memory only once written, and
        # each tile is let go as it lands: the run's tiles and the array are not both held whole.
        out = self.out
        arr = np.zeros(out.shape, out.dtype)
        for coords, key in out.tiles.items():
            lo, hi = tile_box(out.grid, coords)
            arr[tuple(slice(a, b) for a, b in zip(lo, hi))] = densify(result.tiles.pop(key))
        return arr[()] if arr.ndim == 0 else arr  # a numpy scalar, as numpy.einsum gives
