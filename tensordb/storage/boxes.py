"""A reader of one box of a stored tensor: what a slice (``X[0:100, d]``) reads.

A ``BoxReader`` looks to planning and execution like the reader of a tensor whose shape is the
box's extent: its grid is the stored grid cut to the box (so the pieces the optimizer chooses
fall on the stored tiles), and each Load reads ``read_box`` of the stored tensor shifted by the
box's start, so only the stored tiles that overlap the box are ever read. Its catalog facts are
those of the overlapping tiles; it claims every tile of its grid present (the lowering then joins
no catalog relation for it: an absent stored tile reads as zeros, as for any Load).

>>> import numpy as np
>>> from tensordb.storage.meta import TensorMeta
>>> meta = TensorMeta("X", 1, np.dtype("float64"), (10, 4), ("d0", "d1"), ((0, 4, 8, 10), (0, 4)),
...                   0, 0, 0, 0.0)
>>> box_meta(meta, ((3, 9), (0, 4))).grid, box_meta(meta, ((3, 9), (0, 4))).shape
(((0, 1, 5, 6), (0, 4)), (6, 4))
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from typing import Sequence

import numpy as np

from ..errors import DataError, OperationalError
from ..geometry import overlapping
from .meta import TensorMeta

__all__ = ["BoxReader", "GatherReader", "IotaReader", "OneHotReader", "RowGather", "box_meta"]


def box_meta(meta: TensorMeta, box) -> TensorMeta:
    """``meta`` of the box: its extent, the stored grid cut to it and shifted to start at 0."""
    grid = tuple((0,) + tuple(b - lo for b in bounds if lo < b < hi) + (hi - lo,)
                 for bounds, (lo, hi) in zip(meta.grid, box))
    shape = tuple(hi - lo for lo, hi in box)
    tiles = math.prod(len(g) - 1 for g in grid)
    return dataclasses.replace(meta, shape=shape, grid=grid, tile_count=tiles,
                               nbytes=math.prod(shape) * meta.dtype.itemsize,
                               nnz=math.prod(shape), density=1.0)


class BoxReader:
    """The reader of ``box`` (one ``(start, stop)`` per dimension) of the tensor ``base`` reads;
    ``name`` is the box's graph name (geometry.BoxName)."""

    has_sparse = False  # read_box densifies the box's part of a sparse tile

    def __init__(self, base, box, name: str) -> None:
        self.base = base
        self.box = tuple((int(a), int(b)) for a, b in box)
        m = base.meta
        if len(self.box) != m.ndim or any(not 0 <= a <= b <= n for (a, b), n in zip(self.box, m.shape)):
            raise OperationalError(f"box {self.box} is outside tensor '{m.name}' of shape {m.shape}")
        self.meta = dataclasses.replace(box_meta(m, self.box), name=str(name))

    def __repr__(self) -> str:
        return f"BoxReader({self.base!r}, box={self.box})"

    def _overlapped(self) -> list:
        ranges = [overlapping(g, a, b) for g, (a, b) in zip(self.base.meta.grid, self.box)]
        entries = self.base.entries
        out = []
        for c in _product(ranges):
            if c in entries:
                out.append(entries[c])
        return out

    def facts(self) -> tuple[bool, bool]:
        """(finite, nonzero): finite when no stored tile the box overlaps may hold NaN or inf;
        nonzero is not claimed (the box may cross absent tiles)."""
        return all(e.nonfinite is False for e in self._overlapped()), False

    def layout(self) -> bytes:
        """The plan cache's digest: the stored layout, and the box (computed once: the store
        keeps the reader while its base's version is current)."""
        found = self.__dict__.get("_layout")
        if found is None:
            found = self.__dict__["_layout"] = hashlib.sha256(
                self.base.layout() + repr(self.box).encode()).digest()
        return found

    def read_box(self, starts: Sequence[int], stops: Sequence[int]):
        """The elements in ``[starts, stops)`` of the box (None where no stored tile overlaps)."""
        lo = [a for a, _ in self.box]
        return self.base.read_box([s + o for s, o in zip(starts, lo)],
                                  [s + o for s, o in zip(stops, lo)])

    def to_numpy(self):
        out = self.read_box([0] * len(self.box), list(self.meta.shape))
        return np.zeros(self.meta.shape, self.meta.dtype) if out is None else np.array(out)

    def close(self) -> None:
        self.base.close()


def _product(ranges):
    return itertools.product(*ranges)


class GatherReader:
    """The reader of a gather ``base[index]`` (geometry.GatherName): the tensor of shape
    ``index.shape + base.shape[1:]`` whose element ``[b..., d...]`` is ``base[index[b...], d...]``.
    A Load of a box reads the index's box, then only the base's tiles that hold the rows it
    names (a join of the index's values with the base's row tiles). numpy's semantics: a
    negative row counts from the end; one out of ``[-rows, rows)`` is a DataError naming it."""

    has_sparse = False

    def __init__(self, base, index, name) -> None:
        self.base, self.index, self.name = base, index, name
        if index.meta.dtype.kind not in "iu":
            raise DataError(f"the index tensor '{index.meta.name}' of a gather is "
                            f"{index.meta.dtype.name}, not an integer")
        bm, im = base.meta, index.meta
        shape = tuple(im.shape) + tuple(bm.shape[1:])
        grid = tuple(im.grid) + tuple(bm.grid[1:])
        # The version a device cache keys its tiles by: changes with either tensor's version.
        version = int.from_bytes(hashlib.sha256(f"{bm.version}:{im.version}".encode()).digest()[:7],
                                 "big")
        self.meta = dataclasses.replace(bm, name=str(name), shape=shape, grid=grid, version=version,
                                        tile_count=math.prod(len(g) - 1 for g in grid),
                                        nbytes=math.prod(shape) * bm.dtype.itemsize,
                                        nnz=math.prod(shape), density=1.0)

    def __repr__(self) -> str:
        return f"GatherReader({self.base!r}, index={self.index!r})"

    def facts(self) -> tuple[bool, bool]:
        return self.base.facts()[0], False

    def layout(self) -> bytes:
        return hashlib.sha256(b"gather" + self.base.layout() + self.index.layout()).digest()

    def _rows(self, starts: Sequence[int], stops: Sequence[int]) -> np.ndarray:
        """The base's rows the box names, checked and made non-negative (int64, the index's
        box's shape)."""
        k = self.index.meta.ndim
        rows = self.index.read_box(starts[:k], stops[:k])
        if rows is None:  # absent index tiles hold 0: row 0
            rows = np.zeros(tuple(b - a for a, b in zip(starts[:k], stops[:k])),
                            self.index.meta.dtype)
        n = self.base.meta.shape[0]
        rows = np.asarray(rows).astype(np.int64, copy=False)
        bad = (rows < -n) | (rows >= n)  # numpy's: a negative row counts from the end
        if bad.any():
            at = tuple(int(c) + int(s) for c, s in zip(np.argwhere(bad)[0], starts[:k]))
            raise DataError(f"gather {self.name}: index {self.index.meta.name}{list(at)} = "
                            f"{int(rows[tuple(np.argwhere(bad)[0])])} is out of range for the "
                            f"{n} rows of {self.base.meta.name}")
        return np.where(rows < 0, rows + n, rows)

    def read_rows(self, starts: Sequence[int], stops: Sequence[int]):
        """The box as a ``RowGather`` (its rows named, not yet taken), where the index is a
        vector and the base is one row tile; else None (``read_box`` then)."""
        if self.index.meta.ndim != 1 or len(self.base.meta.grid[0]) != 2:
            return None
        rows = self._rows(starts, stops)
        n = self.base.meta.shape[0]
        block = self.base.read_box([0] + list(starts[1:]), [n] + list(stops[1:]))
        if block is None:  # an absent base tile: zeros, made by read_box
            return None
        return RowGather(_resident(block, rows.size), rows)

    def read_box(self, starts: Sequence[int], stops: Sequence[int]):
        k = self.index.meta.ndim
        shape = tuple(b - a for a, b in zip(starts, stops))
        rows = self._rows(starts, stops)
        n = self.base.meta.shape[0]
        rest_lo, rest_hi = list(starts[k:]), list(stops[k:])
        flat = rows.reshape(-1)
        grid0 = self.base.meta.grid[0]
        if len(grid0) == 2:  # one row tile: one indexing (a few times faster than a setitem)
            block = self.base.read_box([0] + rest_lo, [n] + rest_hi)
            if block is not None:
                return np.take(_resident(block, flat.size), flat, axis=0).reshape(shape)
        out = np.zeros(shape, self.base.meta.dtype)
        dest = out.reshape((flat.size,) + shape[k:])
        tile_of = np.searchsorted(np.asarray(grid0), flat, side="right") - 1
        for t in np.unique(tile_of):  # only the base's row tiles that the index names
            lo, hi = int(grid0[t]), int(grid0[t + 1])
            block = self.base.read_box([lo] + rest_lo, [hi] + rest_hi)
            if block is None:
                continue
            sel = np.nonzero(tile_of == t)[0]
            dest[sel] = _resident(block, sel.size)[flat[sel] - lo]
        return out

    def close(self) -> None:
        self.base.close()
        self.index.close()


def _resident(block, lookups: int) -> np.ndarray:
    """A stored tile to gather ``lookups`` rows from: copied first (one sequential read) when
    the lookups are at least its rows, since random rows of a memory-mapped file fault its
    pages in one at a time (ten times slower than the copy and a gather from memory)."""
    block = np.asarray(block)
    return np.array(block) if lookups >= len(block) else block


class RowGather:
    """A gather's box whose rows are named but not yet taken: ``base[rows]``, ``base`` the rows
    of the base's one row tile (the box's columns), ``rows`` a vector of non-negative row
    numbers. A Load of a gather hands it out so that a kernel that can reads the rows where it
    needs them: a batch of row products takes them a slab at a time, in the cache
    (exec/gathered.py), and an SpMM reads the base through the sparse matrix's columns
    renumbered (exec/sparse_kernels.py): the gathered copy, as large as the index times the
    row, is never made. Every other reader takes them whole (``take``, ``numpy.asarray``):
    the same array the gather's ``read_box`` makes.

    >>> import numpy as np
    >>> g = RowGather(np.arange(6.0).reshape(3, 2), np.array([2, 0, 2]))
    >>> g.shape, g.take(1, 3).tolist(), np.asarray(g).tolist()
    ((3, 2), [[0.0, 1.0], [4.0, 5.0]], [[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]])
    """

    __slots__ = ("base", "rows", "shape", "dtype")

    def __init__(self, base: np.ndarray, rows: np.ndarray) -> None:
        self.base, self.rows = base, rows
        self.shape = (int(rows.shape[0]),) + tuple(base.shape[1:])
        self.dtype = base.dtype

    def __repr__(self) -> str:
        return f"RowGather(shape={self.shape}, base rows={self.base.shape[0]})"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes it holds: its row numbers and, where it is one, its copy of the base (a
        view of a memory-mapped payload is the page cache's)."""
        root = self.base
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        own = self.base.nbytes if isinstance(root, np.ndarray) else 0
        return int(self.rows.nbytes + own)

    def take(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``lo:hi`` of the gather, as a new array (numpy's ``take``: the same rows as
        ``base[rows]``, copied a row at a time rather than an element at a time)."""
        return np.take(self.base, self.rows[lo:hi], axis=0)

    def __array__(self, dtype=None, copy=None):
        out = self.take()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __reduce__(self):
        return RowGather, (np.asarray(self.base), self.rows)


class IotaReader:
    """The reader of ``numpy.arange(name.start, name.stop)`` (geometry.IotaName): int64 values
    computed for each box read, never stored; one tile, every element finite."""

    has_sparse = False

    def __init__(self, name) -> None:
        self.name = name
        n = name.stop - name.start
        self.meta = TensorMeta(str(name), 0, np.dtype("int64"), (n,), ("d0",), ((0, n),),
                               n * 8, 1, n, 1.0)

    def __repr__(self) -> str:
        return f"IotaReader({self.name!s})"

    def facts(self) -> tuple[bool, bool]:
        return True, False

    def layout(self) -> bytes:
        return hashlib.sha256(str(self.name).encode()).digest()

    def read_box(self, starts: Sequence[int], stops: Sequence[int]):
        return np.arange(self.name.start + starts[0], self.name.start + stops[0], dtype=np.int64)

    def to_numpy(self):
        return self.read_box([0], [self.meta.shape[0]])

    def close(self) -> None:
        pass


class OneHotReader:
    """The reader of the one-hot rows of an index tensor (geometry.OneHotName): a box reads the
    index's box and compares its values (negative ones counted from the end, as numpy's) with
    the box's row numbers; bool, computed, never stored. The one-hot rows of a vector index
    (a matrix, one entry per lookup) are sparse: ``sparse_box`` reads a box as a scipy CSR
    array, so the scatter-add that reads them (GRAD of a gather) runs as SpMM, its work the
    lookups times the columns, not the lookups times the rows (plan/kernel.py)."""

    def __init__(self, index, name) -> None:
        self.index, self.name = index, name
        im = index.meta
        shape = tuple(im.shape) + (name.rows,)
        version = int.from_bytes(hashlib.sha256(f"onehot:{im.version}".encode()).digest()[:7],
                                 "big")
        self.meta = TensorMeta(str(name), version, np.dtype("bool"), shape,
                               tuple(f"d{k}" for k in range(len(shape))),
                               tuple(im.grid) + ((0, name.rows),), math.prod(shape),
                               math.prod(len(g) - 1 for g in im.grid), math.prod(shape), 1.0)

    def __repr__(self) -> str:
        return f"OneHotReader({self.index!r}, rows={self.name.rows})"

    @property
    def has_sparse(self) -> bool:
        return self.meta.ndim == 2

    def facts(self) -> tuple[bool, bool]:
        return True, False

    def sparse_stats(self) -> tuple[tuple[str, ...], int, int, float]:
        """(formats, nonzeros, bytes, fill) as the catalog gives a stored tensor's: one entry
        per lookup, held as CSR (int64 column and row pointer, one byte of value each)."""
        n = math.prod(self.index.meta.shape)
        return ("csr",), n, n * 17 + 8, 0.0

    def sparse_box(self, starts: Sequence[int], stops: Sequence[int]):
        """The box of a matrix one-hot as a scipy CSR array (bool): row b holds one entry, at
        the index's value ``tok[b]`` (negative counted from the end), where that falls inside
        the box's columns."""
        import scipy.sparse as sp
        rows = self.index.read_box(starts[:1], stops[:1])
        m = stops[0] - starts[0]
        rows = np.zeros(m, np.int64) if rows is None else np.asarray(rows).astype(np.int64)
        n = self.name.rows
        self._check(rows, starts[:1])  # out of range in any box: numpy's IndexError, named
        cols = np.where(rows < 0, rows + n, rows) - starts[1]
        keep = (cols >= 0) & (cols < stops[1] - starts[1])
        indptr = np.concatenate(([0], np.cumsum(keep)))
        return sp.csr_array((np.ones(int(indptr[-1]), bool), cols[keep], indptr),
                            shape=(m, stops[1] - starts[1]))

    def layout(self) -> bytes:
        return hashlib.sha256(b"onehot" + self.index.layout() + str(self.name.rows).encode()).digest()

    def read_box(self, starts: Sequence[int], stops: Sequence[int]):
        k = self.index.meta.ndim
        rows = self.index.read_box(starts[:k], stops[:k])
        shape = tuple(b - a for a, b in zip(starts[:k], stops[:k]))
        rows = np.zeros(shape, np.int64) if rows is None else np.asarray(rows).astype(np.int64)
        n = self.name.rows
        self._check(rows, starts[:k])
        rows = np.where(rows < 0, rows + n, rows)
        return rows[..., None] == np.arange(starts[k], stops[k], dtype=np.int64)

    def _check(self, rows: np.ndarray, starts) -> None:
        """A DataError naming the first index value no row matches (numpy's IndexError)."""
        n = self.name.rows
        bad = (rows < -n) | (rows >= n)
        if bad.any():
            first = tuple(np.argwhere(bad)[0])
            at = tuple(int(c) + int(s) for c, s in zip(first, starts))
            raise DataError(f"gather by {self.index.meta.name}: index "
                            f"{self.index.meta.name}{list(at)} = {int(rows[first])} is out of "
                            f"range for {n} rows")

    def to_numpy(self):
        return self.read_box([0] * len(self.meta.shape), list(self.meta.shape))

    def close(self) -> None:
        self.index.close()
