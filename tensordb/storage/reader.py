"""TensorReader: tiles of one stored tensor version, memory-mapped from its payload file.

A reader holds no DuckDB handle (it is pickled to Dask workers) and maps the payload file the
first time a tile is needed, once per reader. Tiles come back as read-only views of the mapping.

Every read of a payload file (the mapping, ``to_numpy``) opens it through :func:`open_payload`,
which checks that it is a regular file long enough for every tile before a byte is used: a
missing, replaced or truncated file is a tensordb error naming the tensor and the file, on every
path that reads tiles (con.tensor, export, SQL relations, the executors' loads). Every tile handed
out is checked against its recorded CRC-32 the first time this process reads it (verify.py), and
a reader shipped to another process (a Dask worker) first checks that the database it finds at
the payload's path is the one it was opened on (identity.py). A payload an in-memory database
keeps as bytes, with no file (memfiles.py: a small computed output), is read from those bytes
(checked against the same checksums), and a reader pickled to another process carries them.
"""
from __future__ import annotations

import hashlib
import math
import mmap
import os
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..errors import DataError, OperationalError
from ..geometry import overlapping, tile_box
from . import memfiles
from .meta import TensorMeta
from .payloads import (_CHECK_HINT, _READING, _USERS_LOCK, _done_reading, _hold_shared,  # noqa: F401
                       _reason, file_kind, open_payload, payload_in_use, rename_private,
                       rename_unused, track_mapping)
from .identity import check_database
from .verify import file_identity, verified, verify_tile

__all__ = ["TensorReader", "TileEntry", "box_view", "open_payload", "file_kind", "track_mapping",
           "payload_in_use", "rename_unused", "rename_private"]

def box_view(grid, cuts, dense: bool = True) -> bool:
    """Whether the reader hands out as a view of its mapping (``read_box``) every box whose
    extent along dimension d is one of the ``(start, stop)`` pairs ``cuts[d]``: each lies inside
    one stored tile, or, along the first dimension of a tensor stored in whole rows (one tile
    across every other dimension) whose tiles are all stored (``dense``), spans a run of row
    tiles. The one predicate the optimizer prices (a box that is no view is a copy), the
    lowering counts and the reader follows (which also needs the run's tiles stored back to
    back, dense, and present: a box over an absent tile is no tile at all).

    >>> g = ((0, 4, 8), (0, 4, 8))
    >>> box_view(g, [[(0, 4)], [(4, 6)]]), box_view(g, [[(0, 8)], [(0, 4)]])
    (True, False)
    >>> box_view(((0, 4, 8), (0, 8)), [[(0, 8)], [(0, 8)]])     # a run of two row tiles
    True
    """
    rows = dense and all(len(b) == 2 for b in grid[1:])
    return all((dim == 0 and rows) or all(len(overlapping(bounds, a, b)) <= 1 for a, b in pairs)
               for dim, (bounds, pairs) in enumerate(zip(grid, cuts)))







@dataclass(frozen=True)
class TileEntry:
    """Where one stored tile lives in the payload file."""

    coords: tuple[int, ...]
    starts: tuple[int, ...]
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    nnz: int
    crc32: int | None = None  # zlib.crc32 of the tile's bytes; None: written before checksums
    nonfinite: bool | None = None  # holds NaN or inf; None: not known (written by an old version)
    format: str = "dense"  # 'dense', or a sparse layout ('csr', 'coo': storage/sparse.py)
    # the object holding the tile where its version's tiles lie in several (objects.part_name:
    # the parts Dask workers put); None: the version's one payload file or object
    file: str | None = None

    @property
    def sparse(self) -> bool:
        return self.format != "dense"


class TensorReader:
    """Read access to one version of a tensor. ``path`` is the payload file (None: no tiles)."""

    def __init__(self, meta: TensorMeta, path: str | None, entries: Sequence[TileEntry],
                 database: str | None = None) -> None:
        self.meta = meta
        self.path = path
        self.entries = {e.coords: e for e in entries}
        self.database = database  # the id of the database it was opened on (None: an old one)
        self.shipped = False  # unpickled in another process: the database there is checked
        self._map: mmap.mmap | None = None
        self._ident: tuple | None = None  # the mapped file's identity (verify.py)
        self._lock = threading.Lock()
        kept = memfiles.get(path)
        if kept is not None:  # a payload kept in this process, not a file: read from its bytes
            self._map, self._ident = kept

    # Pickling ships metadata and the file name; the other process maps the file itself. A
    # payload kept in this process (memfiles.py: small, no file) ships its bytes.
    def __getstate__(self):
        state = {"meta": self.meta, "path": self.path, "entries": self.entries,
                 "database": self.database}
        data = self._kept_bytes()
        if data is not None:
            state["data"] = bytes(memoryview(data))
        return state

    def _kept_bytes(self) -> np.ndarray | None:
        """The payload's bytes where they are no file here (memfiles.py): kept in this process,
        held by this reader after they were let go, or shipped with it from another process
        (then shipped on again: a reader unpickled in a worker that pickles it once more)."""
        kept = memfiles.get(self.path)
        if kept is not None:
            return kept[0]
        if isinstance(self._map, np.ndarray) and (
                self.shipped or self._ident is not None and self._ident[1:2] == ("memory",)):
            return self._map
        return None

    def __setstate__(self, state) -> None:
        data = state.pop("data", None)
        self.__dict__.update(state)
        self.shipped = True
        self._map = None
        self._ident = None
        self._lock = threading.Lock()
        if data is not None:  # checked against its checksums on first read (no identity)
            self._map = np.frombuffer(data, np.uint8)

    def preload(self, data: np.ndarray, ident: tuple) -> "TensorReader":
        """Read this version from ``data`` (its payload file's bytes, read-only, as the writer
        that committed them still holds them in memory; ``ident``: the file's identity, under
        which they count as verified), not from a mapping of the file: an in-memory
        database's small output (a training step's weights) is read back at the next step
        without opening and mapping its new file (store_catalog.py ``_keep_written``)."""
        self._map, self._ident = data, ident
        return self

    def with_entries(self, entries: Sequence[TileEntry]) -> "TensorReader":
        """A reader of the same version holding only ``entries`` (a Dask Load ships little)."""
        reader = TensorReader(self.meta, self.path, entries, self.database)
        if reader._map is None and self._kept_bytes() is not None:  # bytes, no file: theirs
            reader._map, reader._ident = self.mapping(), self._ident
            reader.shipped = self.shipped
        return reader

    def __repr__(self) -> str:
        m = self.meta
        return (f"TensorReader({m.name!r}, shape={m.shape}, dtype={m.dtype.name}, "
                f"tiles={len(self.entries)}/{m.total_tiles})")

    # -- tiles ---------------------------------------------------------------------------------
    def coords(self) -> list[tuple[int, ...]]:
        """Coordinates of the stored (present) tiles, in file order."""
        return sorted(self.entries, key=lambda c: self.entries[c].offset)

    def has(self, coords: Sequence[int]) -> bool:
        return tuple(coords) in self.entries

    def tile(self, coords: Sequence[int]) -> np.ndarray | None:
        """Read-only view of a stored tile, or None for an absent (all-zero) tile."""
        e = self.entries.get(tuple(int(c) for c in coords))
        return None if e is None else self._array(e)

    def stored_tile(self, coords: Sequence[int]):
        """A stored tile as it is stored: a read-only view (dense), a scipy CSR array or a
        ``sparse.CooTile`` (sparse, storage/sparse.py); None for an absent tile."""
        e = self.entries.get(tuple(int(c) for c in coords))
        if e is None or not e.sparse:
            return None if e is None else self._view(e.offset, e.shape, (e,))
        self._verify((e,))  # its entries' bytes, before they are decoded
        from .sparse import decode
        return decode(self.mapping(), e.offset, e.nbytes, e.shape, self.meta.dtype, e.format,
                      self.meta.name)

    def _array(self, e: TileEntry) -> np.ndarray:
        """A stored tile as a dense array: a view, or a sparse tile densified."""
        if not e.sparse:
            return self._view(e.offset, e.shape, (e,))
        from .sparse import densify
        return densify(self.stored_tile(e.coords), self.meta.fill)

    def _sparse_part(self, coords, part) -> np.ndarray:
        """The dense box ``part`` (slices) of a sparse tile, without densifying the rest."""
        from .sparse import densify_part
        return densify_part(self.stored_tile(coords), part, self.meta.fill)

    @property
    def has_sparse(self) -> bool:
        """Whether any stored tile of this version is sparse (found once per reader)."""
        found = self.__dict__.get("_has_sparse")
        if found is None:
            found = self.__dict__["_has_sparse"] = any(e.sparse for e in self.entries.values())
        return found

    def facts(self) -> tuple[bool, bool]:
        """(finite, nonzero): no stored tile holds NaN or inf (or might: unknown counts as might);
        every element is stored and is neither 0 nor NaN."""
        entries = self.entries.values()
        finite = all(e.nonfinite is False for e in entries) and math.isfinite(self.meta.fill)
        full = len(self.entries) == self.meta.total_tiles and all(
            e.nnz == math.prod(e.shape) for e in entries)
        return finite, finite and full

    def layout(self) -> bytes:
        """A digest of what planning reads of this version besides its shape and dtype: the
        grid, which tiles are present, and per tile its NaN/inf flag and whether nnz == size.
        Two versions with the same layout get the same plan (the plan cache's key): the
        values differ, the tile join, kernel calls and skipped products do not. Computed once
        per reader (a version's tiles never change; the store keeps a current version's reader
        between calls)."""
        found = self.__dict__.get("_layout")
        if found is not None:
            return found
        h = hashlib.blake2b(repr((self.meta.grid, self.meta.fill)).encode(), digest_size=16)
        for c in sorted(self.entries):
            e = self.entries[c]
            h.update(repr((c, e.nonfinite, e.nnz == math.prod(e.shape), e.format)).encode())
        found = self.__dict__["_layout"] = h.digest()
        return found

    def tiles(self) -> Iterator[tuple[TileEntry, np.ndarray]]:
        """Every stored tile with its entry, in file order (sequential reads)."""
        for c in self.coords():
            e = self.entries[c]
            yield e, self._array(e)

    def mapping(self) -> mmap.mmap:
        """The payload file's mapping (opened on first use)."""
        if self._map is None:
            with self._lock:
                if self._map is None:
                    self._map = self._open()
        return self._map

    def _open(self) -> mmap.mmap:
        kept = memfiles.get(self.path)
        if kept is not None:  # kept in this process (memfiles.py): its bytes, no file
            self._ident = kept[1]
            return kept[0]
        with _USERS_LOCK:  # counted from before the open: see rename_unused
            _READING[self.path] += 1
        try:
            self._check_database()
            fd = open_payload(self.meta.name, self.path, self.entries.values())
        except BaseException:
            _done_reading(self.path)
            raise
        try:
            _hold_shared(fd, self.path, self.meta.name)
            mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # keeps a copy of fd: the lock
            self._ident = file_identity(self.path, os.fstat(fd))
            track_mapping(self.path, mapping)
            return mapping
        except (OSError, ValueError) as exc:  # checked above; a file changing under us lands here
            raise OperationalError(f"cannot map the payload file {self.path} of tensor "
                                   f"'{self.meta.name}': {_reason(exc)}") from None
        finally:
            os.close(fd)
            _done_reading(self.path)

    def _check_database(self) -> None:
        """In a process the reader was shipped to: the database at the payload's path must be
        the one the reader was opened on (identity.py), else an OperationalError naming this
        process and the path."""
        if self.shipped and self.path is not None:
            check_database(self.path, self.database, self.meta.name)

    def _view(self, offset: int, shape: tuple[int, ...], tiles: Sequence[TileEntry]) -> np.ndarray:
        """A view of the mapping at ``offset``; ``tiles``, the stored tiles it covers, are
        checked against their checksums first (once per process: verify.py)."""
        count = int(np.prod(shape, dtype=np.int64))
        buf = self.mapping()
        if offset + count * self.meta.dtype.itemsize > len(buf):  # only if the catalog lies
            raise DataError(f"tensor '{self.meta.name}': a tile at byte {offset} runs past the end "
                            f"of its payload file {self.path} ({len(buf)} bytes)", hint=_CHECK_HINT)
        self._verify(tiles)
        return np.frombuffer(buf, self.meta.dtype, count, offset).reshape(shape)

    def _verify(self, tiles: Sequence[TileEntry]) -> None:
        """Check ``tiles`` against their checksums through the mapping (no copy), once per
        process (verify.py)."""
        buf = self.mapping()
        for e in tiles:
            if not verified(self._ident, e):
                whole = memoryview(buf)
                part = whole[e.offset:e.offset + e.nbytes]
                try:
                    verify_tile(self.meta.name, self.path, self._ident, e, part)
                finally:
                    part.release()
                    whole.release()

    # -- boxes ---------------------------------------------------------------------------------
    def read_box(self, starts: Sequence[int], stops: Sequence[int]) -> np.ndarray | None:
        """The elements in ``[starts, stops)``, or None when no stored tile overlaps the box.

        A view when the box lies in one tile or in a run of row tiles that are adjacent in the
        file; otherwise a copy with absent tiles as zeros.
        """
        meta = self.meta
        starts = tuple(int(s) for s in starts)
        stops = tuple(int(s) for s in stops)
        if len(starts) != meta.ndim or len(stops) != meta.ndim or any(
                not 0 <= a <= b <= n for a, b, n in zip(starts, stops, meta.shape)):
            raise OperationalError(f"box {starts}..{stops} is outside tensor '{meta.name}' of "
                                   f"shape {meta.shape}")
        ranges = [overlapping(b, a, z) for b, a, z in zip(meta.grid, starts, stops)]
        if any(len(r) == 0 for r in ranges) and meta.ndim:
            return None
        present = [c for c in _product(ranges) if c in self.entries]
        if not present:
            return None
        view = self._run_view(ranges, present, starts, stops)
        if view is not None:
            return view
        out = np.zeros(tuple(b - a for a, b in zip(starts, stops)), meta.dtype)
        for c in present:
            t_lo, t_hi = tile_box(meta.grid, c)
            lo = [max(a, s) for a, s in zip(starts, t_lo)]
            hi = [min(b, s) for b, s in zip(stops, t_hi)]
            part = tuple(slice(l - s, h - s) for l, h, s in zip(lo, hi, t_lo))
            e = self.entries[c]
            out[tuple(slice(l - a, h - a) for l, h, a in zip(lo, hi, starts))] = \
                self.tile(c)[part] if not e.sparse else self._sparse_part(c, part)
        return out

    def _run_view(self, ranges, present, starts, stops) -> np.ndarray | None:
        """A view when the overlapped tiles are all stored and are one tile, or a run along the
        first dimension of tiles that span every other dimension whole and lie back to back in
        the file (then the run is a slab of the C-ordered tensor)."""
        meta = self.meta
        if meta.ndim == 0:
            return self._view(self.entries[()].offset, (), (self.entries[()],))
        if len(present) != len(ranges[0]) or not box_view(
                meta.grid, [[(a, b)] for a, b in zip(starts, stops)]):
            return None
        run = [self.entries[c] for c in sorted(present)]
        if any(e.sparse for e in run) or any(a.offset + a.nbytes != b.offset
                                            for a, b in zip(run, run[1:])):
            return None
        first = run[0]
        shape = (sum(e.shape[0] for e in run),) + first.shape[1:]
        block = self._view(first.offset, shape, run)
        return block[tuple(slice(a - s, b - s) for a, b, s in zip(starts, stops, first.starts))]

    def to_numpy(self) -> np.ndarray:
        """The whole tensor as a new dense array. Reads the file directly into the result (no
        mapping), so the only memory used is the result itself."""
        meta = self.meta
        out = np.zeros(meta.shape, meta.dtype)
        if not self.entries:
            return out
        if self._map is None and memfiles.get(self.path) is not None:
            self.mapping()
        if isinstance(self._map, np.ndarray):  # read from bytes held in memory: copied
            for c in self.coords():
                e = self.entries[c]
                if meta.shape:
                    out[tuple(slice(s, s + n) for s, n in zip(e.starts, e.shape))] = \
                        self._array(e)
                else:
                    out[...] = self._array(e)
            return out
        with _USERS_LOCK:
            _READING[self.path] += 1
        try:
            self._check_database()
            fd = open_payload(meta.name, self.path, self.entries.values())
        except BaseException:
            _done_reading(self.path)
            raise
        try:
            ident = file_identity(self.path, os.fstat(fd))
            for c in self.coords():
                e = self.entries[c]
                dest = out[tuple(slice(s, s + n) for s, n in zip(e.starts, e.shape))] if meta.shape else out
                if e.sparse:  # decoded from the mapping, its entries verified first
                    dest[...] = self._array(e)
                    continue
                buf = dest if dest.flags.c_contiguous else np.empty(e.shape, meta.dtype)
                raw = memoryview(buf.reshape(-1)).cast("B")
                self._pread_into(fd, raw, e.offset)
                verify_tile(meta.name, self.path, ident, e, raw)  # before it reaches anyone
                if buf is not dest:
                    dest[...] = buf
        finally:
            os.close(fd)
            _done_reading(self.path)
        return out

    def _pread_into(self, fd: int, buf: memoryview, offset: int) -> None:
        done = 0
        while done < len(buf):
            try:
                n = os.preadv(fd, [buf[done:]], offset + done)
            except OSError as exc:
                raise OperationalError(f"cannot read the payload file {self.path} of tensor "
                                       f"'{self.meta.name}': {_reason(exc)}") from None
            if n <= 0:  # it was long enough when opened: it shrank since
                raise DataError(f"the payload file {self.path} of tensor '{self.meta.name}' ended "
                                f"early at byte {offset + done}", hint=_CHECK_HINT)
            done += n

    def close(self) -> None:
        """Drop the mapping now (views made from it keep it alive until they are freed)."""
        self._map = None







def _product(ranges) -> Iterator[tuple[int, ...]]:
    if not ranges:
        yield ()
        return
    first, rest = ranges[0], ranges[1:]
    for c in first:
        for tail in _product(rest):
            yield (c,) + tail
