"""Tiles an executor computes in place (a mixin ``TensorWriter`` inherits, writer.py): ``reserve``
lays them out as in the payload file and hands out buffers, staged in anonymous memory (written
into the file as each is finished, ``write_early``, or at commit, ``_write_staged``) or the file
itself, memory-mapped; a file too large to stage where the commit fsyncs is streamed instead,
each tile written into its place when finished (``_write_slot``), and a file written by workers
in other processes is laid out in slots they fill themselves (``slot``, ``record_slot``).
"""
from __future__ import annotations

import dataclasses
import math
import mmap
import os
from typing import Sequence

import numpy as np

from ..errors import DataError, InterfaceError, InternalError, OperationalError
from ..geometry import tile_box
from . import memfiles
from .checksum import crc32 as checksum
from .reader import TileEntry, track_mapping
from .slots import TileFacts, TileSlot
from .staging import ALIGN, STAGE_MAX, STREAM_TILE_MAX, open_payload
from .tilestats import has_negative_zero, has_nonfinite, tile_stats
from .writeback import start_writeback

# The local pool writes an output to an object store in parts while it computes (objparts.py)
# from this size up; a smaller one goes up as one PutObject from memory at commit. On this
# 2-core machine, moto's CPU taking multipart uploads (parts, then their concatenation) cost
# more than the overlap saved: a 128 MiB output 6.4-6.9x the local directory in parts against
# 5.1-5.2x put whole (docs/benchmarks.md). S3 takes parts in parallel at its full speed.
POOL_PARTS_MIN = 256 << 20

__all__ = ["ReservedTiles"]


# (grid, tiles, itemsize) -> the layout of a payload file: a repeated output (a training
# step's weights) is laid out once
_LAYOUTS: dict[tuple, tuple] = {}


def _layout(grid, tiles, itemsize: int) -> tuple[dict, int]:
    """Tile coords -> (offset, starts, shape) of ``tiles`` in that order, each at an
    ``ALIGN``ed offset, and the file's size. The dict is the one kept for the next call: the
    caller copies it to keep or change it. ``tiles``: a tuple of tuples of ints is taken as
    it is (the sink's, made once per plan: physical/sink.py), anything else made one."""
    if type(tiles) is not tuple or not all(type(t) is tuple for t in tiles):
        tiles = tuple(tuple(int(c) for c in t) for t in tiles)
    key = (grid, tiles, itemsize)
    try:
        kept = _LAYOUTS.get(key)
    except TypeError:  # an unhashable grid: laid out each time
        key = kept = None
    if kept is None:
        layout, pos = {}, 0
        for coords in tiles:
            starts, stops = tile_box(grid, coords)
            shape = tuple(b - a for a, b in zip(starts, stops))
            pos += -pos % ALIGN
            layout[coords] = (pos, starts, shape)
            pos += math.prod(shape) * itemsize
        kept = (layout, pos)
        if key is not None:
            if len(_LAYOUTS) >= 256:
                _LAYOUTS.clear()
            _LAYOUTS[key] = kept
    return kept


class ReservedTiles:
    """The reserved, staged, streamed and remote tiles of a ``TensorWriter`` (its state is set
    up by ``TensorWriter.__init__``)."""

    kept_bytes = None  # a small staged file's bytes, its version's reader's (_write_staged)
    kept_ident = None  # their identity where they are the payload, kept with no file (memfiles)
    _memory = False  # the payload is kept in this process, not in a file (memfiles.py)

    def reserve(self, tiles: Sequence[Sequence[int]], stage_max: int | None = None,
                remote: bool = False, groups=None) -> dict[tuple[int, ...], np.ndarray]:
        """Writable buffers for ``tiles``, laid out as in the payload file, whose blocks are
        allocated here (a full disk is an error now, not at commit): anonymous memory that
        ``commit`` writes into the file with one pwrite (a file up to ``STAGE_MAX``), or, where
        the commit does not fsync, the file itself, memory-mapped. ``stage_max`` (default
        ``STAGE_MAX``): the largest file staged (anonymous memory is not the memory budget's
        to spill or drop; under a small memory limit the caller passes less). Whoever computes
        a tile can write it in place, and ``write_tile`` of that very buffer then costs no
        copy. A larger file where the commit fsyncs gets no buffers (``streams``): each tile is
        computed as any other and handed to ``write_tile`` once finished, which writes it into
        its place in the file then. With ``remote``, no buffers either: workers in other
        processes write each tile into its place themselves (``slot``, slots.py) and the
        caller records what they report (``record_slot``). Call once, before any
        ``write_tile``.

        In an object store that takes parts (objparts.py), ``groups`` (tile -> the plan worker
        that computes it) lays the tiles out grouped by worker and cuts them into parts, each
        uploaded by whoever finishes its last tile: a worker in another process (``remote``:
        its ``slot`` is an ObjectSlot) or this process (``write_early``); no local file is made
        for a staged object. An output that cannot be cut so (objparts.cut_parts) is put whole
        at commit, its ``remote`` tiles then computed here (``slot`` gives None)."""
        objects = self.store.objects
        if objects is not None and groups is not None and objects.multipart:
            from .objparts import order_tiles
            itemsize = self.dtype.itemsize
            tiles = order_tiles([tuple(int(c) for c in t) for t in tiles], groups,
                                lambda c: math.prod(b - a for a, b in zip(*tile_box(self.grid, c)))
                                * itemsize)
        else:
            groups = None
        with self._lock:
            if self._state != "open" or self._fd is not None:
                raise InterfaceError(f"writer for '{self.name}': reserve() comes before any write")
            if self.fill != 0:
                raise InternalError(f"writer for '{self.name}': a tensor with fill "
                                    f"{self.fill} is written tile by tile, not reserved")
            layout, pos = _layout(self.grid, tiles, self.dtype.itemsize)
            if not layout or pos == 0:
                return {c: np.zeros(sh, self.dtype) for c, (_, _, sh) in layout.items()}
            large = pos > (STAGE_MAX if stage_max is None else min(stage_max, STAGE_MAX))
            if groups is not None and (remote or pos >= POOL_PARTS_MIN):
                from . import objparts
                parts = objparts.cut_parts([(c, off, math.prod(sh) * self.dtype.itemsize)
                                            for c, (off, _, sh) in layout.items()], groups)
                if parts is not None:
                    # workers in other processes put objects of their own; the pool's threads
                    # upload the parts of one multipart upload
                    kind = objparts.PartObjects if remote and objparts.WORKER_PART_OBJECTS \
                        else objparts.PartUploads
                    try:
                        self._uploads = kind(objects, self.file, self.store.database, parts)
                    except BaseException:
                        self._fail()
                        raise
            if self._uploads is None and objects is not None:
                remote = False  # put whole at commit: the tiles come here
            store = self.store
            # An in-memory database's small output gets no file: its staged bytes are its
            # payload, kept in this process under the file's name (memfiles.py). Not where
            # workers of other processes read payload files (Dask: no spares either), nor
            # where the caller stages less (``stage_max``: under a small memory limit).
            in_process = objects is None and not remote and not large and \
                not store.persistent and store.spares.enabled and \
                pos <= memfiles.FILE_MAX and memfiles.room(store.tiles_dir, pos)
            try:
                if in_process:
                    recycled = False
                    self._memory = True
                elif objects is not None and (self._uploads is not None and remote or not large):
                    recycled = False  # no local file: the bytes go up from memory
                    self._in_memory = True
                else:
                    self._fd, recycled = open_payload(self.store, self.path, pos)
                    os.lseek(self._fd, pos, os.SEEK_SET)  # later plain writes append after them
                # A recycled file's pages are in the page cache already: computing into its
                # mapping (the faults taken by the workers, in parallel) costs less than staging
                # and a pwrite at commit (16 MiB of an SGD update: 1.9 against 2.4 ms). Not
                # where the commit fsyncs: writing back pages dirtied through a live mapping
                # write-protects each one, a TLB shootdown (an IPI to every core running the
                # process), and a block-sparse product's 1.8 MiB output took 7 ms to fsync
                # that way against 1.2 ms for 8 MiB written by pwrite.
                # For the same reason a file too large to stage is not mapped where the commit
                # fsyncs, but streamed, if its tiles are small: 80 MiB computed into a mapping
                # and then fsynced took 57-70 ms, computed in 8 MiB anonymous tiles each written
                # by pwrite as it was finished (its write-back started then) 35-39 ms. A large
                # tile is left mapped: the allocator maps each afresh (glibc above 32 MiB), and
                # a 6144^2 product's two 72 MiB output tiles took their kernels 7% longer in
                # new pages than in the file's cached ones, more than the fsync saved.
                # A small file is staged all the same (where nothing is fsynced): its mapping
                # would cost more than its pwrite (mmap, a fault per page, and munmap when its
                # tiles go: a TLB shootdown across the process's threads), and the staged
                # bytes become its reader's (``kept_bytes``).
                mapped = recycled and not self.store.fsync and \
                    pos + ALIGN >= self.store.staging.min_bytes
                if remote or (large and self.store.fsync and STREAM_TILE_MAX >= max(
                        math.prod(sh) for _, _, sh in layout.values()) * self.dtype.itemsize):
                    self._slots = dict(layout)  # (the kept layout is _LAYOUTS')
                elif mapped or large:
                    self._map = mmap.mmap(self._fd, pos)
                    track_mapping(self.path, self._map)  # its tiles outlive the writer
            except OSError as exc:
                self._fail()
                raise OperationalError(f"cannot reserve {pos} bytes for '{self.name}' in "
                                       f"{self.path}: {exc.strerror or exc}") from None
            self._pos = pos
            if self._slots:
                return {}
            if self._memory:  # its own allocation, kept as the payload: numpy's alignment
                # (16 bytes) does for a tile under 1 MiB, and finding the pointer to align it
                # to 64 and slicing cost 3 us an output; a let-go payload's, where nothing
                # refers to it any more (memfiles.take: pages touched already)
                raw = memfiles.take(self.path, pos)
                self._staged = self._raw = raw if raw is not None else np.empty(pos, np.uint8)
            elif self._map is None:  # staged: computed in anonymous memory, written at commit
                raw = self._raw = self.store.staging.take(pos + ALIGN)
                self._staged = raw[-raw.ctypes.data % ALIGN:][:pos]
            base = self._map if self._map is not None else self._staged
            self._reserved = {c: (off, st, sh, np.ndarray(sh, self.dtype, base, off))
                              for c, (off, st, sh) in layout.items()}
            return {c: r[3] for c, r in self._reserved.items()}

    @property
    def streams(self) -> bool:
        """Whether ``reserve`` gave no buffers: each tile is written as it is finished."""
        return bool(self._slots)

    def slot(self, coords: Sequence[int]) -> TileSlot | None:
        """Where a worker in another process writes tile ``coords`` itself (a file laid out by
        ``reserve(..., remote=True)``), or None."""
        place = self._slots.get(tuple(coords))
        if place is None:
            return None
        if self._uploads is not None:
            from .objparts import ObjectSlot
            n = self._uploads.part_of(coords)
            start, stop, cs = self._uploads.parts[n]
            return ObjectSlot(self.store.objects, self.file, self._uploads.upload_id, n + 1,
                              start, stop, tuple(self._slots[c][0] for c in cs), place[0],
                              place[2], self.dtype.str, self.store.database, self.name)
        return TileSlot(self.path, place[0], place[2], self.dtype.str, self.store.database,
                        self.store.fsync, self.name)

    def part_of(self, coords: Sequence[int]) -> int | None:
        """The part (1-based) of an object written in parts by other processes that tile
        ``coords`` lies in; None for any other tile."""
        if self._uploads is None or tuple(coords) not in self._slots:
            return None
        return self._uploads.part_of(coords) + 1

    def record_slot(self, coords: Sequence[int], facts: TileFacts) -> bool:
        """A worker wrote tile ``coords`` into its ``slot`` and reported ``facts``: its row,
        unless the tile is all zero (``facts.keep``, the rule of ``_write_slot``)."""
        coords = tuple(int(c) for c in coords)
        offset, starts, shape = self._slots[coords]
        part = getattr(facts, "part", None)
        uploads = self._uploads
        if part is not None and uploads is not None:  # its worker uploaded that part
            uploads.took(part[0] - 1, part[1])
        # a part put as an object of its own (objparts.PartObjects): its tiles' rows name it
        named = getattr(uploads, "name_of", None)
        with self._lock:
            if self._state != "open":
                raise InterfaceError(f"writer for '{self.name}' is already {self._state}")
            if coords in self.entries:
                raise InternalError(f"tensor '{self.name}': tile {coords} written twice")
            if facts.keep:
                self.entries[coords] = TileEntry(coords, starts, shape, offset, facts.nbytes,
                                                 facts.nnz, facts.crc32, facts.nonfinite,
                                                 file=named(coords) if named else None)
            if named and part is not None and part[1] is not None:  # those recorded before
                for c in uploads.parts[part[0] - 1][2]:
                    e = self.entries.get(c)
                    if e is not None and e.file != part[1]:
                        self.entries[c] = dataclasses.replace(e, file=part[1])
        return facts.keep

    def payload_objects(self) -> list[str]:
        """The objects this writer's payload is (the commit's to delete if it rolls back):
        its file, or the part objects Dask workers put."""
        put = getattr(self._uploads, "put", None)
        return put() if put is not None else [self.file]

    def _write_slot(self, coords: tuple[int, ...], array) -> bool:
        """A streamed tile, written into its place in the file now (by whichever thread
        finished it; tiles of one writer may come from several threads at once), and the
        write-back of its pages started. An all-zero tile is not written and gets no row,
        unless a zero in it is -0.0 (as ``_fill_reserved``)."""
        offset, starts, shape = self._slots[coords]
        a = np.asarray(array)
        if a.shape != shape:
            raise DataError(f"tensor '{self.name}': tile {coords} should have shape {shape}, "
                            f"got {a.shape}")
        flat = np.ascontiguousarray(a, dtype=self.dtype).reshape(-1)
        nnz, nonfinite, crc = tile_stats(flat)
        if not nnz and not has_negative_zero(flat):
            return False
        with self._lock:
            if self._state != "open" or self._fd is None:
                raise InterfaceError(f"writer for '{self.name}' is already {self._state}")
            if coords in self.entries:
                raise InternalError(f"tensor '{self.name}': tile {coords} written twice")
            fd = self._dup()  # an abort on another thread cannot close it under us
        try:
            self._pwrite(fd, flat, offset)
            start_writeback(fd, offset, flat.nbytes)
        finally:
            os.close(fd)
        with self._lock:
            self.entries[coords] = TileEntry(coords, starts, shape, offset, flat.nbytes,
                                             int(nnz), crc, bool(nonfinite))
        return True

    def _fill_reserved(self, coords: tuple[int, ...], array, nnz: int | None,
                       nonfinite: bool | None, crc: int | None = None) -> bool:
        offset, starts, shape, buf = self._reserved[coords]
        a = np.asarray(array)
        if a.shape != shape:
            raise DataError(f"tensor '{self.name}': tile {coords} should have shape {shape}, "
                            f"got {a.shape}")
        if a is not buf:
            np.copyto(buf, a, casting="unsafe")
            nnz = nonfinite = crc = None
            with self._lock:
                self._early.discard(coords)  # the commit writes these bytes, not the early ones
            if self._uploads is not None:
                self._uploads.changed(coords)  # its part goes up again at commit
        if nnz is None:
            nnz, nonfinite, crc = tile_stats(buf)
        nnz = int(nnz)
        keep = bool(nnz) or has_negative_zero(buf)
        # The tile is final now (computed in place, or copied just above): checksum its bytes.
        crc = (checksum(buf) if crc is None else int(crc)) if keep else None
        if keep and nonfinite is None:
            nonfinite = has_nonfinite(buf)
        with self._lock:
            if coords in self.entries:
                raise InternalError(f"tensor '{self.name}': tile {coords} written twice")
            # An all-zero reserved tile (a computed result) gets no catalog row, its bytes go
            # unused, unless a zero in it is -0.0: numpy's answer keeps its sign.
            if keep:
                self.entries[coords] = TileEntry(coords, starts, shape, offset, buf.nbytes, nnz,
                                                 crc, bool(nonfinite))
        return keep

    def write_early(self, coords: Sequence[int]) -> None:
        """Reserved tile ``coords`` is final (computed in place, its statistics taken): hand it to
        the file now, on the caller's thread (a worker, as each output tile is finished). A staged
        tile is written by pwrite, so the commit writes only what is left, and where the commit
        fsyncs the write-back of its pages starts at once (writeback.py): the disk works while
        the run goes on. A mapped tile (where nothing is fsynced) is in the file already.
        Called while the writer is open, before ``write_tile`` records the tile; tiles of one
        writer may come from several threads at once (each writes its own bytes)."""
        reserved = self._reserved.get(tuple(coords))
        if reserved is None:  # a tensor with no bytes: reserve() gave plain zero-size arrays
            return
        coords, (offset, _, _, buf) = tuple(coords), reserved
        if self._uploads is not None:  # a part whose last tile this is goes up now
            self._uploads.tile_done(coords, self._upload_buffer())
            return
        if self._in_memory or self._memory:  # put whole at commit, or kept as it is
            return
        with self._lock:
            if self._state != "open" or self._fd is None:
                raise InterfaceError(f"writer for '{self.name}' is already {self._state}")
            if self._staged is None:
                return
            # a duplicate: an abort on another thread (an error, Ctrl-C) closes the writer's
            # descriptor, whose number a file opened meanwhile would take (``_append`` alike)
            fd = self._dup()
        try:
            self._pwrite(fd, buf, offset)
            with self._lock:
                self._early.add(coords)
            if self.store.fsync:
                start_writeback(fd, offset, buf.nbytes)
        finally:
            os.close(fd)

    def _dup(self) -> int:
        """A duplicate of the payload file's descriptor (called under the lock)."""
        try:
            return os.dup(self._fd)
        except OSError as exc:
            raise OperationalError(f"cannot write tiles of '{self.name}' to {self.path}: "
                                   f"{exc.strerror or exc}") from None

    def _upload_buffer(self):
        """The bytes of an object written in parts: its staging buffer, or its mapping (None:
        workers in other processes hold them)."""
        return self._staged if self._staged is not None else self._map

    def upload(self) -> None:
        """Into the object store, at commit: the parts not uploaded yet and the upload
        completed, or the local payload file put whole."""
        if self._uploads is None and not self._in_memory:
            self.store.objects.put(self.path, self.file, self.store.database)
            return
        if self._uploads is None:  # one PutObject from the staging buffer
            try:
                self.store.objects.put_bytes(bytes(memoryview(self._staged).cast("B")),
                                             self.file, self.store.database)
            finally:
                self._give_back_staging()
            return
        try:
            self._uploads.complete(self._upload_buffer())
        finally:
            self._give_back_staging()
            self._map = None

    def _abort_upload(self) -> None:
        uploads, self._uploads = self._uploads, None
        if uploads is not None:
            try:
                uploads.abort()
            except Exception:  # noqa: BLE001 - the next open for writing aborts what is left
                pass

    def _write_staged(self) -> None:
        """Write the reserved tiles computed in anonymous memory into the payload file (one
        pwrite over blocks that reserve() allocated already)."""
        if self._in_memory or self._uploads is not None:  # they go up at commit (upload)
            return
        staged, self._staged = self._staged, None
        if staged is None:
            return
        if self._memory:  # no file: these bytes are the payload (memfiles.py)
            kept = staged.view()
            kept.flags.writeable = False
            self.kept_bytes = kept
            self.kept_ident = memfiles.keep(self.path, kept, raw=staged)
            self._raw = None  # under the staging cache's floor: nothing to give back
            return
        if not self.store.persistent and self._raw is not None and \
                self._raw.nbytes < self.store.staging.min_bytes:
            # an in-memory database's small output: the committed version is read from these
            # bytes (store_catalog.py ``_keep_written``); the staging cache keeps none so small
            kept = staged.view()
            kept.flags.writeable = False
            self.kept_bytes = kept
        # the whole buffer in one pwrite, or the ranges of the tiles write_early has not written
        ranges = [(0, len(staged))] if not self._early else sorted(
            (off, buf.nbytes) for c, (off, _, _, buf) in self._reserved.items()
            if c not in self._early and c in self.entries)
        try:
            for start, size in ranges:
                self._pwrite(self._fd, staged[start:start + size], start)
        finally:
            self._give_back_staging()

    def _give_back_staging(self) -> None:
        """Hand the staging allocation to the store's cache: the next writer reuses it once
        nothing refers to its tiles any more (StagingBuffers)."""
        raw, self._raw = self._raw, None
        self._staged = None
        if raw is not None:
            self.store.staging.keep(raw)
