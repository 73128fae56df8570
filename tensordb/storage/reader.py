"""TensorReader: tiles of one stored tensor version, memory-mapped from its payload file.

A reader holds no DuckDB handle (it is pickled to Dask workers) and maps the payload file the
first time a tile is needed, once per reader. Tiles come back as read-only views of the mapping.
"""
from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..errors import OperationalError
from .meta import TensorMeta
from .tiling import overlapping, tile_box

__all__ = ["TensorReader", "TileEntry"]


@dataclass(frozen=True)
class TileEntry:
    """Where one stored tile lives in the payload file."""

    coords: tuple[int, ...]
    starts: tuple[int, ...]
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    nnz: int
    nonfinite: bool | None = None  # holds NaN or inf; None: not known (written by an old version)


class TensorReader:
    """Read access to one version of a tensor. ``path`` is the payload file (None: no tiles)."""

    def __init__(self, meta: TensorMeta, path: str | None, entries: Sequence[TileEntry]) -> None:
        self.meta = meta
        self.path = path
        self.entries = {e.coords: e for e in entries}
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()

    # Pickling ships metadata and the file name; the other process maps the file itself.
    def __getstate__(self):
        return {"meta": self.meta, "path": self.path, "entries": self.entries}

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._map = None
        self._lock = threading.Lock()

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
        return None if e is None else self._view(e.offset, e.shape)

    def facts(self) -> tuple[bool, bool]:
        """(finite, nonzero): no stored tile holds NaN or inf (or might: unknown counts as might);
        every element is stored and is neither 0 nor NaN."""
        entries = self.entries.values()
        finite = all(e.nonfinite is False for e in entries)
        full = len(self.entries) == self.meta.total_tiles and all(
            e.nnz == int(np.prod(e.shape, dtype=np.int64)) for e in entries)
        return finite, finite and full

    def tiles(self) -> Iterator[tuple[TileEntry, np.ndarray]]:
        """Every stored tile with its entry, in file order (sequential reads)."""
        for c in self.coords():
            e = self.entries[c]
            yield e, self._view(e.offset, e.shape)

    def mapping(self) -> mmap.mmap:
        """The payload file's mapping (opened on first use)."""
        if self._map is None:
            with self._lock:
                if self._map is None:
                    self._map = self._open()
        return self._map

    def _open(self) -> mmap.mmap:
        try:
            with open(self.path, "rb") as f:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise OperationalError(
                f"cannot read the tiles of tensor '{self.meta.name}' from {self.path}: "
                f"{exc.strerror or exc}",
                hint="the tensor may have been replaced or dropped since it was opened") from None

    def _view(self, offset: int, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.mapping(), self.meta.dtype, count, offset).reshape(shape)

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
            out[tuple(slice(l - a, h - a) for l, h, a in zip(lo, hi, starts))] = \
                self.tile(c)[tuple(slice(l - s, h - s) for l, h, s in zip(lo, hi, t_lo))]
        return out

    def _run_view(self, ranges, present, starts, stops) -> np.ndarray | None:
        """A view when the overlapped tiles are all stored and are one tile, or a run along the
        first dimension of tiles that span every other dimension whole and lie back to back in
        the file (then the run is a slab of the C-ordered tensor)."""
        meta = self.meta
        if meta.ndim == 0:
            return self._view(self.entries[()].offset, ())
        if len(present) != len(ranges[0]) or any(len(r) != 1 for r in ranges[1:]):
            return None
        run = [self.entries[c] for c in sorted(present)]
        if len(run) > 1 and (any(len(b) != 2 for b in meta.grid[1:]) or any(
                a.offset + a.nbytes != b.offset for a, b in zip(run, run[1:]))):
            return None
        first = run[0]
        shape = (sum(e.shape[0] for e in run),) + first.shape[1:]
        block = self._view(first.offset, shape)
        return block[tuple(slice(a - s, b - s) for a, b, s in zip(starts, stops, first.starts))]

    def to_numpy(self) -> np.ndarray:
        """The whole tensor as a new dense array. Reads the file directly into the result (no
        mapping), so the only memory used is the result itself."""
        meta = self.meta
        out = np.zeros(meta.shape, meta.dtype)
        if not self.entries:
            return out
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            self._open()  # raises the explanatory error
            raise
        try:
            for c in self.coords():
                e = self.entries[c]
                dest = out[tuple(slice(s, s + n) for s, n in zip(e.starts, e.shape))] if meta.shape else out
                if dest.flags.c_contiguous:
                    _pread_into(fd, memoryview(dest.reshape(-1)).cast("B"), e.offset)
                else:
                    buf = np.empty(e.shape, meta.dtype)
                    _pread_into(fd, memoryview(buf.reshape(-1)).cast("B"), e.offset)
                    dest[...] = buf
        finally:
            os.close(fd)
        return out

    def close(self) -> None:
        """Drop the mapping now (views made from it keep it alive until they are freed)."""
        self._map = None


def _pread_into(fd: int, buf: memoryview, offset: int) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n <= 0:
            raise OperationalError(f"payload file ended early at byte {offset + done}")
        done += n


def _product(ranges) -> Iterator[tuple[int, ...]]:
    if not ranges:
        yield ()
        return
    first, rest = ranges[0], ranges[1:]
    for c in first:
        for tail in _product(rest):
            yield (c,) + tail
