"""TensorWriter: tiles go into a new payload file; the catalog sees them only at commit.

The payload file ``tiles/<version>-<id>.bin`` (``<id>``: the database's, identity.py) holds the
stored tiles back to back, each C-ordered (or, for a tile the format rule
``sparsity.choose_format`` makes sparse, its entries: storage/sparse.py) and
starting at a 64-byte aligned offset; each tile's CRC-32 goes into its catalog row (the
integrity check compares it with the bytes read back). Until :meth:`TensorWriter.commit` it is
referenced by no catalog row, so a crash leaves an orphan that the next open deletes. Tiles an
executor computes in place (``reserve``) are staged in anonymous memory and written into the file
as each is finished (``write_early``, its write-back started then) or at commit, before its fsync
and the catalog rows. A larger file is streamed where the commit fsyncs (each tile written into
its place when finished, no buffer reserved) or mapped and written in place, and so is a recycled
one, whose pages are cached already, where the commit does not fsync.
"""
from __future__ import annotations

import contextlib
import math
import mmap
import os
import sys
import threading
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import DataError, InterfaceError, InternalError, OperationalError
from ..geometry import Grid, grid_shape, tile_box
from . import memfiles
from .checksum import crc32 as checksum
from .identity import payload_name
from .meta import TensorMeta
from .reader import TileEntry
from .reserved import ReservedTiles
from .spares import SPARE_MIN, current_bytes
from .sparse import (CooTile, Filled, csr_parts, densify, encode, encode_coo, encode_csr,
                     entries, fill_of, in_c_order, is_sparse, stored_entries)
from ..sparsity import MAX_TILE_ELEMENTS, choose_format
from .staging import (ALIGN, STAGE_MAX, STREAM_TILE_MAX, StagingBuffers, no_wait,  # noqa: F401
                      one_directory_sync, open_payload, sync_early, sync_in_background)
from .writeback import start_writeback
from .tilestats import (_NNZ_BLOCK, _STATS_BLOCK, TileStats, count_nonzero, has_negative_zero,  # noqa: F401
                        has_nonfinite, tile_stats)

if TYPE_CHECKING:  # pragma: no cover
    from .store import Store

__all__ = ["TensorWriter", "ALIGN", "STAGE_MAX", "STREAM_TILE_MAX", "StagingBuffers", "commit_all",
           "count_nonzero", "has_nonfinite", "has_negative_zero", "tile_stats", "TileStats"]


class TensorWriter(ReservedTiles):
    """Writes one new version of tensor ``name``. Use as a context manager, or call
    :meth:`commit` / :meth:`abort`. ``write_tile`` may be called from several threads."""

    def __init__(self, store: "Store", name: str, shape: tuple[int, ...], dtype: np.dtype,
                 grid: Grid, dims: tuple[str, ...], replace: bool, version: int,
                 fill: float = 0.0) -> None:
        self.store = store
        self.name, self.shape, self.dtype, self.grid, self.dims = name, shape, dtype, grid, dims
        # The value of an entry a sparse tile leaves out (TensorMeta.fill): with another than 0,
        # every tile is stored (one never written is stored empty, all fill, at commit) and a
        # tile stores the entries that differ from it (``_write_filled``).
        self.fill = float(fill)
        self.replace = replace
        self.tables_checked = False  # set by a caller that looked for user tables of its name
                                     # inside the commit's transaction already
        self.version = version
        self.file = payload_name(version, store.database)
        self.path = os.path.join(store.tiles_dir, self.file)
        self.entries: dict[tuple[int, ...], TileEntry] = {}
        self._fd: int | None = None
        self._pos = 0
        # reentrant: ``_fail`` takes it, and is called with it held (``_append``, ``reserve``)
        self._lock = threading.RLock()
        self._state = "open"
        self._grid_shape = grid_shape(grid)
        self._map: mmap.mmap | None = None
        self._staged: np.ndarray | None = None  # reserved tiles in anonymous memory (bytes)
        self._raw: np.ndarray | None = None     # the allocation _staged lies in
        self._reserved: dict[tuple[int, ...], tuple] = {}
        self._early: set[tuple[int, ...]] = set()  # staged tiles already in the file
        # streamed (an output too large to stage, where the commit fsyncs): each tile's place in
        # the file, written by write_tile as soon as the tile is finished
        self._slots: dict[tuple[int, ...], tuple] = {}
        self._appending: set[tuple[int, ...]] = set()  # tiles whose bytes _append is writing
        self._uploads = None  # an object written in parts (objparts.PartUploads)
        self._in_memory = False  # an object staged with no local file, uploaded at commit
        self._size_hint = current_bytes(store, name) if replace else 0  # (_open_appended)
        self._appended = 0  # tiles whose bytes _append has written
        # the fdatasync jobs large appended tiles started, and the count of tiles written when
        # the last one started: it covers the whole file if none was written after it
        self._early_jobs: list = []
        self._early_at = -1

    def __repr__(self) -> str:
        return f"TensorWriter({self.name!r}, shape={self.shape}, tiles={len(self.entries)}, {self._state})"

    def __enter__(self) -> "TensorWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.commit()

    # -- writing -------------------------------------------------------------------------------
    def write_tile(self, coords: Sequence[int], array, nnz: int | None = None,
                   nonfinite: bool | None = None, crc32: int | None = None) -> bool:
        """Store tile ``coords`` (a dense array, or a sparse tile a sparse kernel returned,
        stored from its entries: ``_write_sparse``); returns False (and stores nothing) when it is all zero, ``-0.0``
        included (so that an array masked by a product, ``x * 0`` being ``-0.0`` for a negative
        ``x``, loads block-sparse).
        ``nnz``, ``nonfinite`` (it holds NaN or inf) and ``crc32`` (of its bytes), when the
        caller already computed them for this very array (a reserved tile computed in place),
        save computing them again."""
        coords = tuple(map(int, coords))
        if is_sparse(array):  # a sparse kernel's output tile (scipy CSR, a Filled, a CooTile)
            if coords not in self._reserved and coords not in self._slots:
                return self._write_sparse(coords, array)
            array = densify(array)  # a place laid out dense for it
        if coords in self._reserved:
            return self._fill_reserved(coords, array, nnz, nonfinite, crc32)
        if coords in self._slots:
            return self._write_slot(coords, array)
        if len(coords) != len(self.shape) or any(
                not 0 <= c < n for c, n in zip(coords, self._grid_shape)):
            raise InternalError(f"tensor '{self.name}': tile {coords} is outside its grid "
                                f"{self._grid_shape}")
        starts, stops = tile_box(self.grid, coords)
        shape = tuple(b - a for a, b in zip(starts, stops))
        a = np.asarray(array)
        if a.shape != shape:
            raise DataError(f"tensor '{self.name}': tile {coords} should have shape {shape}, "
                            f"got {a.shape}")
        if a.dtype != self.dtype:
            a = a.astype(self.dtype)
        if self.fill != 0:
            flat = np.ascontiguousarray(a).reshape(-1)
            lin = np.flatnonzero(flat != self.fill)
            return self._write_filled(coords, starts, shape, lin, flat[lin], flat)
        if not a.flags.c_contiguous and count_nonzero(a) == 0:
            return False  # an absent tile: not copied only to be dropped
        flat = np.ascontiguousarray(a).reshape(-1)  # copies only a non-contiguous tile
        nnz, nonfinite, crc = tile_stats(flat)  # outside the lock: the checksum drops the GIL
        if nnz == 0:
            return False
        fmt = "dense"
        if choose_format(shape, nnz, self.dtype) != "dense":  # stored entries: nnz and -0.0s
            lin = stored_entries(flat)
            fmt = choose_format(shape, lin.size, self.dtype)
            if fmt != "dense":
                flat = encode(shape, self.dtype, lin, flat[lin], fmt)
                crc = checksum(flat)
        return self._append(coords, starts, shape, flat, int(nnz), crc, bool(nonfinite), fmt)

    def _write_sparse(self, coords: tuple, tile) -> bool:
        """Store a sparse tile from its entries (``write_entries``: no dense tile is made unless
        the format rule says dense). Its absent entries are its fill (``sparse.fill_of``); a
        tile whose fill is not the tensor's is stored from its dense form."""
        fill = fill_of(tile)
        if not (fill == self.fill or (math.isnan(fill) and math.isnan(self.fill))):
            return self.write_tile(coords, densify(tile))
        starts, stops = tile_box(self.grid, coords)
        shape = tuple(b - a for a, b in zip(starts, stops))
        if tuple(tile.shape) != shape:
            raise DataError(f"tensor '{self.name}': tile {coords} should have shape {shape}, "
                            f"got {tuple(tile.shape)}")
        csr = tile.csr if isinstance(tile, Filled) else tile
        if getattr(csr, "format", None) == "csr" and csr.has_canonical_format:
            data = np.asarray(csr.data, self.dtype)
            indptr, indices = csr.indptr, csr.indices
            if choose_format(shape, data.size, self.dtype) == "csr":
                # the rule says CSR: its arrays are the payload's, checksummed and counted in
                # one sweep of the values (``_csr_stats``) where none is to be left out
                parts = csr_parts(shape, self.dtype, indptr, indices, data)
                stats = self._csr_stats(parts)
                if stats is not None:
                    nnz, nonfinite, crc = stats
                    if nnz == 0 and self.fill == 0:
                        return False
                    return self._append(coords, starts, shape, parts, nnz, crc, nonfinite, "csr")
            with np.errstate(invalid="ignore"):
                keep = data != self.fill
            if self.fill == 0 and data.dtype.kind == "f":
                keep |= np.signbit(data)  # a -0.0 is stored (stored_entries)
            if not keep.all():  # zeros (or fills) left out: the CSR arrays without them, not
                # int64 linear indices of every entry (a streamed slab's few zeros: slabs.py)
                drop = np.flatnonzero(~keep)
                indptr = indptr - np.searchsorted(drop, indptr, side="left").astype(indptr.dtype)
                indices, data = np.delete(indices, drop), np.delete(data, drop)
            if choose_format(shape, data.size, self.dtype) == "csr":
                parts = csr_parts(shape, self.dtype, indptr, indices, data)
                nnz = data.size if self.fill != 0 else count_nonzero(data)
                if nnz == 0 and self.fill == 0:
                    return False
                crc = 0
                for part in parts:
                    crc = checksum(part, crc)
                return self._append(coords, starts, shape, parts, int(nnz), crc,
                                    has_nonfinite(data) or not math.isfinite(self.fill), "csr")
        if isinstance(tile, CooTile) and math.prod(shape) > MAX_TILE_ELEMENTS:
            return self.write_coords(coords, tile.coords, tile.values)
        lin, values = entries(tile)
        return self.write_entries(coords, lin, values)

    def write_coords(self, coords: Sequence[int], at: np.ndarray, values: np.ndarray) -> bool:
        """Store tile ``coords`` of a tensor of fill 0 from its entries at ``at`` (ndim x n, in
        the tile, distinct) with ``values``, never through linear indices: a tile whose element
        count passes int64 (the COO output tile of a 10^7-cubed contraction, 10^21 elements)
        is stored COO (the format's coordinates per dimension: ``encode_coo``), or CSR where
        the format rule says so of a matrix. False (nothing stored) when no value is nonzero."""
        coords = tuple(int(c) for c in coords)
        starts, stops = tile_box(self.grid, coords)
        shape = tuple(b - a for a, b in zip(starts, stops))
        if self.fill != 0:
            raise InternalError(f"tensor '{self.name}': entries by coordinates need fill 0")
        values = np.asarray(values, self.dtype)
        at = np.asarray(at, np.int64).reshape(len(shape), -1)
        keep = stored_entries(values)  # nonzeros, NaN and -0.0
        if keep.size != values.size:
            at, values = at[:, keep], values[keep]
        if not in_c_order(at):
            order = np.lexsort(at[::-1])
            at, values = at[:, order], values[order]
        nnz = count_nonzero(values)
        if nnz == 0:
            return False
        if choose_format(shape, values.size, self.dtype) == "csr":
            indptr = np.searchsorted(at[0], np.arange(shape[0] + 1), side="left")
            payload, fmt = encode_csr(shape, self.dtype, indptr, at[1], values), "csr"
        else:  # a tile past int64 elements is never dense: its dense bytes pass any memory
            payload, fmt = encode_coo(shape, self.dtype, at, values), "coo"
        return self._append(coords, starts, shape, payload, int(nnz), checksum(payload),
                            has_nonfinite(values), fmt)

    def _csr_stats(self, parts: list) -> tuple[int, bool, int] | None:
        """(nnz, nonfinite, crc32) of a CSR payload (``csr_parts``: the entry count, values,
        padding, row pointers, column indices) whose values are all to be stored: none is 0
        or -0.0 where the fill is 0 (a stored entry's value counts as a nonzero), none equals
        the fill otherwise. The values are swept once, block by block (``tilestats``), each
        block checksummed in its place in the payload, counted and summed while it is in the
        cache; a GraphBLAS product's 51 MB half took four sweeps from memory (the test of the
        fill, the sign bits, the count, the finite test) before its checksum. None when some
        value is to be left out (the caller drops them and takes the statistics again)."""
        head, vals, rest = parts[0], parts[1], parts[2:]
        crc = checksum(head)
        fill = self.fill
        nonfinite = not math.isfinite(fill)
        step = max(1, _STATS_BLOCK // max(vals.itemsize, 1))
        kept = 0
        with np.errstate(invalid="ignore"):
            for lo in range(0, vals.size, step):
                block = vals[lo:lo + step]
                crc = checksum(block, crc)
                if fill == 0:
                    kept += count_nonzero(block)
                    nonfinite = nonfinite or has_nonfinite(block)
                else:
                    kept += int(np.count_nonzero(block != fill))
                    if not nonfinite:
                        nonfinite = has_nonfinite(block)
                if kept != min(lo + step, vals.size):
                    return None  # a 0 (or -0.0), or the fill: left out by the caller
        for part in rest:
            crc = checksum(part, crc)
        return kept, bool(nonfinite), crc

    def write_entries(self, coords: Sequence[int], lin: np.ndarray, values: np.ndarray) -> bool:
        """Store tile ``coords`` from its entries: C-order linear indices ``lin`` in the tile
        (sorted, distinct) and their ``values``, without making the dense tile unless the format
        rule (``sparsity.choose_format``) says dense. False (nothing stored) when no value is
        nonzero (a ``-0.0`` included, as ``write_tile``)."""
        coords = tuple(int(c) for c in coords)
        starts, stops = tile_box(self.grid, coords)
        shape = tuple(b - a for a, b in zip(starts, stops))
        values = np.asarray(values, self.dtype)
        if self.fill != 0:
            keep = np.flatnonzero(values != self.fill)
            return self._write_filled(coords, starts, shape, np.asarray(lin, np.int64)[keep],
                                      values[keep], None)
        keep = stored_entries(values)
        lin = np.asarray(lin, np.int64)
        if keep.size != values.size:  # zeros left out (a graph's entries usually have none)
            lin, values = lin[keep], values[keep]
        nnz = count_nonzero(values)
        if nnz == 0:
            return False
        fmt = choose_format(shape, lin.size, self.dtype)
        if fmt == "dense":
            buf = np.zeros(shape, self.dtype)
            buf.reshape(-1)[lin] = values
            return self.write_tile(coords, buf)
        payload = encode(shape, self.dtype, lin, values, fmt)
        return self._append(coords, starts, shape, payload, nnz, checksum(payload),
                            has_nonfinite(values), fmt)

    def _write_filled(self, coords, starts, shape, lin: np.ndarray, values: np.ndarray,
                      dense: np.ndarray | None) -> bool:
        """Store a tile of a tensor whose fill is not 0 from the entries that differ from the
        fill (``lin``, sorted; ``values``) and, where the caller has it, its dense form: sparse
        or dense as the format rule says of their count (its ``nnz``), stored even when empty."""
        fmt = choose_format(shape, lin.size, self.dtype)
        if fmt == "dense":
            if dense is None:
                dense = np.full(math.prod(shape), self.fill, self.dtype)
                dense[lin] = values
            payload = dense
        else:
            payload = encode(shape, self.dtype, lin, values, fmt)
        return self._append(coords, starts, shape, payload, int(lin.size), checksum(payload),
                            has_nonfinite(values) or not math.isfinite(self.fill), fmt)

    def _fill_absent(self) -> None:
        """A tensor whose fill is not 0 stores every tile: each one not written is stored
        empty (all fill), so that an absent tile anywhere means zeros, as for any tensor."""
        if self.fill == 0:
            return
        import itertools
        for coords in itertools.product(*(range(n) for n in self._grid_shape)):
            if coords not in self.entries:
                starts, stops = tile_box(self.grid, coords)
                shape = tuple(b - a for a, b in zip(starts, stops))
                self._write_filled(coords, starts, shape, np.zeros(0, np.int64),
                                   np.zeros(0, self.dtype), None)

    def _append(self, coords, starts, shape, flat, nnz: int, crc: int,
                nonfinite: bool, fmt: str) -> bool:
        """Append one tile's payload bytes (``flat``: an array, or the list of arrays it is made
        of, ``sparse.csr_parts``) to the file and record its entry. Its place is taken under the
        lock and its bytes written outside it (``pwrite`` at that place, through a duplicate of
        the file's descriptor, which an abort on another thread cannot close under it), so two
        workers that finish large tiles at once write them at once: a whole-graph SpGEMM's two
        halves (51 MB each) were written one after the other. Where the commit fsyncs, the
        write-back of the bytes starts at once (writeback.py), as an early-written tile's."""
        parts = flat if isinstance(flat, list) else [flat]
        nbytes = sum(p.nbytes for p in parts)
        with self._lock:
            if self._state != "open":
                raise InterfaceError(f"writer for '{self.name}' is already {self._state}")
            if coords in self.entries or coords in self._appending:
                raise InternalError(f"tensor '{self.name}': tile {coords} written twice")
            try:
                if self._fd is None:
                    self._fd = self._open_appended(nbytes)
                    self._memory = False  # a tile reserve() did not lay out: a file after all
                fd = os.dup(self._fd)
            except OSError as exc:
                self._fail()
                raise OperationalError(f"cannot write tiles of '{self.name}' to {self.path}: "
                                       f"{exc.strerror or exc}") from None
            offset = self._pos + (-self._pos % ALIGN)  # the gap before it: a hole, read as 0
            self._pos = offset + nbytes
            self._appending.add(coords)
        early = False
        try:
            at = offset
            for part in parts:
                if part.nbytes:
                    self._pwrite(fd, part, at)
                    at += part.nbytes
            if self.store.fsync:
                start_writeback(fd, offset, nbytes)
                early = nbytes >= EARLY_SYNC_MIN
        except BaseException:
            with self._lock:
                self._appending.discard(coords)
            self._fail()
            os.close(fd)
            raise
        with self._lock:
            self._appending.discard(coords)
            if self._state != "open":  # aborted while its bytes were written: the file is gone
                os.close(fd)
                raise InterfaceError(f"writer for '{self.name}' is already {self._state}")
            self.entries[coords] = TileEntry(coords, starts, shape, offset, nbytes, nnz, crc,
                                             nonfinite, fmt)
            self._appended += 1
            # a large tile, every other tile's bytes written too, and no earlier such sync
            # still running (one at a time: an output of many large tiles is not a sync each):
            # the file's fdatasync started now, while the run goes on (``_close_file``)
            if early and not self._appending and \
                    (not self._early_jobs or self._early_jobs[-1].done()):
                job = sync_early(fd)
                if job is not None:
                    self._early_jobs.append(job)
                    self._early_at = self._appended
                return True
        os.close(fd)
        return True

    def _open_appended(self, first: int) -> int:
        """The file tiles are appended to (``first``: the first one's bytes): a spare the size
        of the version this one replaces (a sparse product's output each statement), renamed,
        where the store has one (spares.py: its blocks and pages are not allocated again), else
        a new file. Bytes past the last tile are left as they were: nothing reads them."""
        hint = max(first, self._size_hint)
        if hint >= SPARE_MIN and self.store.take_spare(hint, self.path) is not None:
            return os.open(self.path, os.O_WRONLY)
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def _pwrite(self, fd: int, data, offset: int) -> None:
        """Write all of ``data`` (an array, or a slice of one) at ``offset`` of the file."""
        view = memoryview(data).cast("B")
        at = 0
        try:
            while at < len(view):
                at += os.pwrite(fd, view[at:], offset + at)
        except OSError as exc:
            raise OperationalError(f"cannot write tiles of '{self.name}' to {self.path}: "
                                   f"{exc.strerror or exc}") from None
        finally:
            view.release()

    # -- finishing -----------------------------------------------------------------------------
    def meta(self) -> TensorMeta:
        """The catalog entry this writer will commit."""
        size = math.prod(self.shape)
        nnz = nbytes = 0
        for e in self.entries.values():  # one pass (a training step's commit asks each call)
            nnz += e.nnz
            nbytes += e.nbytes
        return TensorMeta(self.name, self.version, self.dtype, self.shape, self.dims, self.grid,
                          nbytes, len(self.entries), nnz, nnz / size if size else 0.0, self.fill)

    def commit(self) -> TensorMeta:
        """Make the tensor visible: flush the payload, then swap catalog rows atomically.

        The payload and its directory entry are fsynced on helper threads while the catalog
        rows are written; the catalog's COMMIT waits for both (payload first, then catalog)."""
        return commit_all([self])[0]

    def _finish(self):
        """Close the payload for the commit: staged tiles written, its fsync started. Returns
        the wait for the fsync."""
        with self._lock:
            if self._state != "open":
                raise InterfaceError(f"writer for '{self.name}' is already {self._state}")
            self._state = "committing"
        if self.entries:
            self._write_staged()
            return self._close_file(sync=self.store.fsync)
        self._close_file(sync=False)  # every reserved tile was zero: nothing to keep
        self._abort_upload()
        self._give_back_staging()
        if os.path.exists(self.path):
            os.unlink(self.path)
        return no_wait

    def abort(self) -> None:
        """Forget everything written; the catalog never saw it."""
        if self._state in ("committed", "aborted"):
            return
        self._fail()

    def _close_file(self, sync: bool):
        """Close the payload file; with ``sync``, fsync it and its directory (so power loss
        cannot lose its name) on helper threads. Returns the wait for that (raising OSError)."""
        if self._map is not None and self._uploads is None:  # else upload() reads it first
            if sync and sys.platform != "linux":  # Linux's fsync writes mapped pages too
                self._map.flush()
            # Tiles handed out by reserve() may still be in use (the run's results): the mapping
            # stays alive as long as they do, and goes with them.
            self._map = None
        fd, self._fd = self._fd, None
        if fd is None:
            return no_wait
        if not sync:
            os.close(fd)
            return no_wait
        early, self._early_jobs = self._early_jobs, []
        covered = bool(early) and self._early_at == self._appended and not self._reserved \
            and not self._slots and self._staged is None and self._uploads is None
        return sync_in_background(fd, self.store.tiles_dir, early, covered)

    def _fail(self) -> None:
        """Abort: the payload file closed and removed, staging given back. Once, whichever
        threads call it at once (an abort and a failing worker's append): the first marks the
        writer aborted under its lock and takes the descriptor out of it, so no other closes it
        a second time (by then possibly another file's number), and an ``_append`` that opens
        the file (under the same lock) either runs before, its file removed here, or after, and
        finds the writer aborted: no payload file is left behind."""
        with self._lock:
            if self._state == "aborted":
                return
            self._state = "aborted"
        self._abort_upload()  # outside the lock: it waits for the upload's own threads
        with self._lock:
            self._give_back_staging()
            try:
                self._close_file(sync=False)
            except OSError:  # pragma: no cover - the file is going away anyway
                pass
            memfiles.forget(self.path)  # bytes kept as the payload (memfiles.py), if any
            if self.entries or os.path.exists(self.path):
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass

    @property
    def staged_bytes(self) -> int:
        """Bytes of reserved tiles held in anonymous memory until the commit writes them."""
        return 0 if self._staged is None else self._staged.nbytes

    @property
    def has_file(self) -> bool:
        return bool(self.entries)


# An appended tile of at least this many bytes starts the file's fdatasync as soon as its bytes
# are written (no other tile's being written, no such sync of the file running), on a helper
# thread: the commit waits for every such job and syncs the file itself only where a tile was
# written after the last one started (docs/storage.md "The durable steps of a commit", step b).
EARLY_SYNC_MIN = 1 << 20


_NO_SYNCS = contextlib.nullcontext()  # commit_all's batch of directory syncs, where none is


def commit_all(writers: Sequence[TensorWriter]) -> list[TensorMeta]:
    """Commit several writers of one store at once: every payload closed and its sync
    started (each file's fdatasync, one fsync of the directory for all), then one catalog
    transaction that swaps all their rows in (a statement for all their ``tensors`` rows
    where it can, one for their tile rows) and commits after the syncs. All land or none
    does: on any error every writer is aborted."""
    durables = []
    try:
        for w in writers:
            w._fill_absent()
        # every payload file exists now: one fsync of tiles/ (none where nothing is synced)
        with one_directory_sync() if any(w.store.fsync for w in writers) else _NO_SYNCS:
            for w in writers:
                durables.append(no_wait)  # until _finish has started a sync to wait for
                durables[-1] = w._finish()
        metas = writers[0].store._commit_writers(list(zip(writers, durables))) if writers else []
    except BaseException:
        for durable in durables:
            try:
                durable()  # the sync jobs end before the file goes
            except OSError:
                pass
        for w in writers:
            if w._state != "committed":  # a landed COMMIT's payloads stay (store._commit_writers)
                w._fail()
        raise
    for w in writers:
        w._state = "committed"
    return metas
