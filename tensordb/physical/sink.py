"""The output sink: where every stored output tile of a run is written, decided here once, and
the one catalog commit that makes them visible.

Every executor hands its stored output tiles to a sink (the ``OutputSink`` protocol,
exec/contract.py) and to nothing else: the local pool computes them in the sink's buffers and
calls ``finished`` on the worker, the GPU executor copies each one to its buffer and calls
``finished``, a Dask cluster whose workers see the storage has them write each tile into its
``slot`` and reports what they wrote (``wrote``); the tiles it gathers instead go to
``finished`` too. The driver then calls ``commit`` (or ``abort``):

    sink = CatalogSink(store, plan, replace=True)
    result = executor.run(plan, store, sink=sink)       # buffers, slots and finished tiles
    sink.commit(result)                                 # one catalog transaction, or none

``CatalogSink`` writes a new payload file per output (storage/writer.py) and commits them all
in one transaction; a run that fails is aborted and leaves no file (a file a killed client or
worker left is an orphan that the next open deletes, storage/directory.py).
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from ..geometry import tile_box
from ..storage.sparse import is_sparse
from ..storage.tilestats import tile_stats
from ..storage.writer import commit_all
from .plan import TilePlan

__all__ = ["CatalogSink", "OutputWriters"]


class CatalogSink:
    """The writers of a plan's stored outputs, opened before the run.

    Every output tile gets a place in its new payload file: a buffer (``open(False)``, task key
    -> array) the executor may compute in, or a slot a worker in another process writes into
    (``open(True)``). The catalog takes them all in one transaction, or none. A user table named
    like an output is refused by that transaction; ``check_tables`` also refuses it before the
    run (one catalog query per output). ``stage_max``: how many bytes of outputs in all may be
    computed in anonymous memory and written at commit (the writer's ``STAGE_MAX`` per file, at
    most); the rest is computed in mappings of their payload files.
    """

    def __init__(self, store, plan: TilePlan, *, replace: bool = False,
                 check_tables: bool = True, stage_max: int | None = None,
                 fills: Mapping[str, float] | None = None) -> None:
        self.store, self.plan = store, plan
        self.writers = []
        self._stage_max = stage_max
        self._sparse: set[str] = set()  # outputs the plan says are sparse: no places
        self._buffers: dict[int, np.ndarray] | None = None  # None until ``open``
        self._tile_of: dict[int, tuple] = {}  # task key -> (writer, tile coords)
        self._written: set[int] = set()  # tiles in their files already (streamed, or by workers)
        self._tiles: dict[int, object] = {}  # tiles handed to ``finished``, for the commit
        self._facts: dict[int, tuple] = {}  # key -> (nnz, nonfinite, crc32) taken by the executor
        self.workers_write = False
        self._workers: dict | None = None  # task key -> plan worker, for an object store
        try:
            self._order = order = []  # (output, writer, its tiles' coords in order)
            for out, dims, fill, sparse, coords_order in _stored_outputs(plan, fills):
                w = store.writer(out.store_name or out.name, out.shape, out.dtype, out.grid,
                                 dims=dims, replace=replace, check_tables=check_tables, fill=fill)
                self.writers.append((out, w))
                order.append((out, w, coords_order))
                if sparse:
                    self._sparse.add(out.name)
                for coords, key in out.tiles.items():
                    self._tile_of[key] = (w, coords)
        except BaseException:
            self.abort()
            raise

    # -- where tiles go (the executor's side) ---------------------------------------------------
    def open(self, workers_write: bool = False) -> dict[int, np.ndarray]:
        """Lay out the outputs' files and return the buffers an executor in this process may
        compute tiles in (task key -> array). ``workers_write``: workers in other processes
        write the tiles themselves (``slot``), so no buffer is made. Called once, before the
        run; a later call returns the same buffers."""
        if self._buffers is not None:
            return self._buffers
        self._buffers, left = {}, self._stage_max
        self.workers_write = bool(workers_write)
        objects = getattr(self.store, "objects", None) is not None
        try:
            for out, w, coords_order in self._order:
                if out.name in self._sparse:
                    continue
                places = w.reserve(coords_order, stage_max=left, remote=workers_write,
                                   groups=self._groups(out) if objects else None)
                for coords, buf in places.items():
                    self._buffers[out.tiles[coords]] = buf
                if left is not None:
                    left -= w.staged_bytes
        except BaseException:
            self.abort()
            raise
        return self._buffers

    def _groups(self, out) -> dict:
        """Tile coords -> the plan worker that computes it: an object store that takes parts
        lays each worker's tiles out together, a part per run of them (storage/objparts.py)."""
        if self._workers is None:
            self._workers = {t.key: t.worker for t in self.plan.tasks}
        return {coords: self._workers.get(key, 0) for coords, key in out.tiles.items()}

    def kept(self, done: Mapping) -> dict:
        """Of the output tiles an attempt that lost a worker finished (key -> what came back),
        those the next attempt need not compute again: all of them, but for an object written
        in parts, only the tiles of parts whose upload came back (a part's other tiles were in
        the memory of the worker that was to upload it)."""
        parts: dict = {}
        for key, facts in done.items():
            part = getattr(facts, "part", None)
            if part is not None:
                w, _ = self._tile_of[key]
                parts.setdefault(id(w), set()).add(part[0])
        out = {}
        for key, facts in done.items():
            w, coords = self._tile_of[key]
            part = w.part_of(coords)
            if part is None or part in parts.get(id(w), ()):
                out[key] = facts
        return out

    @property
    def buffers(self) -> Mapping[int, np.ndarray]:
        """The buffers of ``open(False)``, laid out when first looked into: a caller that only
        passes them on (the older ``run(destinations=sink.buffers, finished=sink.finished)``)
        leaves the choice to the executor, which opens the sink as its workers need."""
        return _LazyBuffers(self)

    @property
    def versions(self) -> dict[str, int]:
        """The version each output will be stored as, by lower-cased catalog name (a GPU
        keeps the run's output tiles on the device as that version's, once it is committed)."""
        return {w.name.lower(): w.version for _, w in self.writers}

    def slot(self, key: int):
        """Where a worker in another process writes output tile ``key`` itself
        (storage/slots.py TileSlot), or None: the tile comes back to ``finished``."""
        w, coords = self._tile_of[key]
        return w.slot(coords)

    def wrote(self, key: int, facts) -> None:
        """A worker wrote tile ``key`` into its slot and reported its ``facts`` (TileFacts)."""
        w, coords = self._tile_of[key]
        w.record_slot(coords, facts)
        self._written.add(key)

    def finished(self, key: int, tile, facts: tuple | None = None) -> bool:
        """Output tile ``key`` is final (called on the worker that finished it, or on the
        client for a tile gathered from a cluster): its writer takes it now, not at the
        commit. ``facts`` = (nnz, nonfinite, crc32), where the executor took them from this
        very array. A tile computed in its buffer goes to the file (``write_early``); a tile
        made elsewhere is copied into its buffer first; a streamed output's tile (no buffer)
        is written into its place, and so is a sparse tile of an output with no places (a
        sparse kernel's CSR tile: encoded from its entries); True tells the executor it need
        not keep it."""
        w, coords = self._tile_of[key]
        buf = (self._buffers or {}).get(key)
        if w.streams or (buf is None and is_sparse(tile)):
            # streamed, or a sparse kernel's CSR tile (an output with no places): encoded,
            # checksummed and written now, on the worker that finished it, not at the commit
            w.write_tile(coords, tile)
            self._written.add(key)
            return True
        if buf is not None and tile is not buf:
            np.copyto(buf, tile, casting="unsafe")
            tile, facts = buf, tile_stats(buf)
        self._tiles[key] = tile
        if facts is not None:
            self._facts[key] = facts
        w.write_early(coords)
        return False

    # -- the commit (the driver's side) ---------------------------------------------------------
    def commit(self, result) -> None:
        """Record the run's output tiles and commit every output atomically (``result``: the
        executor's RunResult; tiles handed to ``finished`` or written by workers need not be
        in it)."""
        self.store_tiles(result.tiles, result.nnz, result.nonfinite, result.crc32)

    def store_tiles(self, tiles: dict[int, np.ndarray], nnz: dict[int, int] | None = None,
                    nonfinite: dict[int, bool] | None = None,
                    crc32: dict[int, int] | None = None) -> None:
        """Record the run's output tiles (with their nonzero counts, NaN/inf flags and
        checksums, if the run made them) and commit every output atomically."""
        # the run's own facts first, else those the executor gave ``finished`` with the tile
        nnz, nonfinite, crc32 = nnz or {}, nonfinite or {}, crc32 or {}
        facts, kept, written = self._facts, self._tiles, self._written
        tiles = tiles or {}
        try:
            with self.store.transaction():
                # one catalog query for every output's name, not one per commit below
                self.store.check_no_tables([w.name for _, w in self.writers])
                for _, w in self.writers:
                    w.tables_checked = True
                for out, w, coords_order in self._order:
                    out_tiles = out.tiles
                    for coords in coords_order:
                        key = out_tiles[coords]
                        if key in written:  # in its file already (streamed, or a worker's)
                            continue
                        f = facts.get(key, _NO_FACTS)
                        w.write_tile(coords, tiles[key] if key in tiles else kept[key],
                                     nnz.get(key, f[0]), nonfinite.get(key, f[1]),
                                     crc32.get(key, f[2]))
                    if w.fill:  # a tile no kernel computed is zeros, not the fill: stored
                        _store_zeros(w)
                commit_all([w for _, w in self.writers])  # the rows of all in a few statements
        except BaseException:
            self.abort()
            raise
        self._tiles.clear()
        for buf in (self._buffers or {}).values():  # they are the stored tensor's bytes now
            buf.flags.writeable = False

    def abort(self) -> None:
        """Forget every output: their files go (a worker still writing finds none to open)."""
        self._tiles.clear()
        for _, w in self.writers:
            w.abort()

    def nnz(self) -> dict[str, int]:
        """The nonzeros stored per output (after the commit), by plan name."""
        return {out.name: sum(int(e.nnz) for e in w.entries.values()) for out, w in self.writers}

    def nonfinite(self) -> list[str]:
        """The outputs (plan names) a stored tile of which holds NaN or inf."""
        return [out.name for out, w in self.writers
                if any(e.nonfinite is True for e in w.entries.values())]


def _stored_outputs(plan: TilePlan, fills) -> list:
    """(output, dims, fill, sparse, its tiles' coords in order) of each stored output of
    ``plan``, worked out once per
    plan and fills (kept in its memo, which a cached plan's rebound copies share: a training
    step opens its writers each call). ``sparse``: the output gets no dense places, because
    the plan says it is sparse (``KernelChoice.out_places``, decided once from the estimated
    nonzeros: plan.kernel.with_output) or its fill is not 0 (plan/fills.py); the commit then
    stores each tile as the format rule says (writer.write_tile takes a sparse tile as it is)."""
    kept = plan.memo.get("stored_outputs")
    if kept is not None and kept[0] is plan.outputs and kept[1] is plan.ops and \
            kept[2] is plan.kernels and kept[3] == (fills or {}):
        return kept[4]
    found = []
    for out in plan.outputs.values():
        if not out.stored:
            continue
        n_op, op = next((n, o) for n, o in enumerate(plan.ops) if o.output == out.name)
        dims = [lbl if lbl.isidentifier() and not op.writes_diagonal else f"d{n}"
                for n, lbl in enumerate(op.out_labels)]
        fill = (fills or {}).get(out.name, 0.0)
        found.append((out, tuple(dims), fill, fill != 0 or not plan.kernels[n_op].out_places,
                      tuple(sorted(tuple(int(c) for c in t) for t in out.tiles))))
    plan.memo["stored_outputs"] = (plan.outputs, plan.ops, plan.kernels, dict(fills or {}), found)
    return found


def _store_zeros(w) -> None:
    """Store every tile of writer ``w`` (an output whose fill is not 0) that the run computed
    no kernel call for, so is all zeros, as zeros: an absent tile of it would read as the fill."""
    for coords in itertools.product(*(range(len(b) - 1) for b in w.grid)):
        if coords not in w.entries:
            lo, hi = tile_box(w.grid, coords)
            w.write_tile(coords, np.zeros(tuple(b - a for a, b in zip(lo, hi)), w.dtype))


_NO_FACTS = (None, None, None)  # a tile whose statistics the writer takes itself


class _LazyBuffers(Mapping):
    """``CatalogSink.buffers`` before the sink is opened: opened (in this process) on first use."""

    def __init__(self, sink: CatalogSink) -> None:
        self._sink = sink

    def _open(self) -> dict:
        return self._sink.open(False)

    def __getitem__(self, key):
        return self._open()[key]

    def __iter__(self):
        return iter(self._open())

    def __len__(self) -> int:
        return len(self._open())


OutputWriters = CatalogSink  # the name the connection knew it by
