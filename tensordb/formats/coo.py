"""Coordinate (COO) entries into tiles and out of them, never through the dense tensor: the one
path that COO tables (tables.py), scipy.sparse matrices and arrays and pydata ``sparse.COO``
arrays take in, and :func:`to_sparse` (``con.sparse``) out.

A tile's entries are sorted into C order, duplicates summed (as scipy does) or refused
(``duplicates="error"``), and handed to the writer, which stores them in the format that
``sparsity.choose_format`` picks (``TensorWriter.write_entries``). Coordinates are checked
(integers, at least 0, inside the shape) with a DataError that names the first bad one.

>>> import numpy as np
>>> from tensordb.storage import Store
>>> with Store() as store:
...     m = load_coo(store, "G", (np.array([0, 2, 2]), np.array([1, 0, 0])),
...                  np.array([1.0, 2.0, 3.0]), (3, 3), dims=("i", "j"))
...     float(store.open("G").to_numpy()[2, 0])
5.0
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import DataError, NotSupportedError, ProgrammingError
from ..geometry import default_tile_shape, tile_box
from ..sparsity import choose_format, is_sparse_overall, sparse_tile_shape
from ..storage.meta import check_dims, check_tile_shape, supported_dtype

__all__ = ["DUPLICATES", "check_duplicates", "default_tile", "write_tile_entries", "TileEntries",
           "load_coo",
           "from_object", "is_sparse_object", "to_sparse"]

DUPLICATES = ("sum", "error")


def check_duplicates(duplicates: str | None, name: str) -> str:
    d = "sum" if duplicates is None else str(duplicates).lower()
    if d not in DUPLICATES:
        raise ProgrammingError(f"load '{name}': duplicates must be one of {', '.join(DUPLICATES)}, "
                               f"got {duplicates!r}")
    return d


def default_tile(shape, nnz: int, dtype) -> tuple[int, ...]:
    """Tiles sized by nonzeros for a tensor that is sparse as a whole, else the dense default."""
    if is_sparse_overall(shape, nnz, dtype):
        return sparse_tile_shape(shape, nnz, dtype)
    return default_tile_shape(shape, dtype)


def _fmt(names, values) -> str:
    return "(" + ", ".join(f"{n}={v}" for n, v in zip(names, values)) + ")"


def write_tile_entries(w, key, coords: Sequence[np.ndarray], values: np.ndarray, *,
                       duplicates: str, where: str, names) -> None:
    """Store tile ``key`` of writer ``w`` from the entries at global ``coords`` (one array per
    dimension, all inside the tile) with ``values``."""
    lo, hi = tile_box(w.grid, key)
    shape = tuple(h - l for l, h in zip(lo, hi))
    local = tuple(np.asarray(c, np.int64) - l for c, l in zip(coords, lo))
    lin = np.ravel_multi_index(local, shape) if shape else np.zeros(len(values), np.int64)
    values = np.asarray(values)
    if lin.size > 1 and not bool((lin[1:] >= lin[:-1]).all()):  # a table's rows come sorted
        order = np.argsort(lin, kind="stable")
        lin, values = lin[order], values[order]
    if lin.size > 1:
        first = np.r_[True, lin[1:] != lin[:-1]]
        if not first.all():
            if duplicates == "error":
                at = np.unravel_index(int(lin[np.flatnonzero(~first)[0]]), shape)
                raise DataError(f"{where}: coordinate {_fmt(names, [int(x) + l for x, l in zip(at, lo)])}"
                                " appears more than once", hint=_DUP_HINT)
            starts = np.flatnonzero(first)
            summed = np.add.reduceat(values, starts)
            lin, values = lin[starts], summed.astype(w.dtype, copy=False)
    w.write_entries(key, lin, values)


class TileEntries:
    """One tile's entries as they arrive in batches (a table's rows, sorted by tile): kept as
    entries while the tile may be stored sparse, and scattered into a dense buffer from the
    batch on which the format rule can no longer make it sparse (so a dense table loads in
    about one dense tile of memory, as before sparse tiles)."""

    def __init__(self, w, key, *, duplicates: str, where: str, names) -> None:
        self.w, self.key, self.duplicates, self.where, self.names = w, key, duplicates, where, names
        self.lo, hi = tile_box(w.grid, key)
        self.shape = tuple(h - l for l, h in zip(self.lo, hi))
        size = math.prod(self.shape)
        # the fewest entries for which the tile is dense whatever their positions
        self.dense_at = next((n for n in _doubling(size) if choose_format(
            self.shape, n, w.dtype) == "dense"), size + 1)
        self.parts: list = []
        self.count = 0
        self.buf = self.seen = None
        self.filled = 0

    def add(self, coords, values) -> None:
        if self.buf is None:
            self.parts.append((coords, values))
            self.count += len(values)
            if self.count < self.dense_at:
                return
            parts, self.parts = self.parts, []
            self.buf = np.full(self.shape, self.w.fill, self.w.dtype) if self.w.fill else \
                np.zeros(self.shape, self.w.dtype)
            self.seen = np.zeros(self.buf.size, bool)
            for c, v in parts:
                self._scatter(c, v)
            return
        self._scatter(coords, values)

    def _scatter(self, coords, values) -> None:
        local = tuple(np.asarray(c, np.int64) - l for c, l in zip(coords, self.lo))
        lin = np.ravel_multi_index(local, self.shape)
        flat = self.buf.reshape(-1)
        hit = self.seen[lin]
        self.seen[lin] = True
        repeated = hit.any() or np.count_nonzero(self.seen) != self.filled + len(lin)
        if repeated and self.duplicates == "error":
            if hit.any():
                dup = int(lin[hit][0])
            else:
                u, counts = np.unique(lin, return_counts=True)
                dup = int(u[counts > 1][0])
            at = np.unravel_index(dup, self.shape)
            raise DataError(f"{self.where}: coordinate "
                            f"{_fmt(self.names, [int(x) + l for x, l in zip(at, self.lo)])} "
                            "appears more than once", hint=_DUP_HINT)
        if repeated:
            if self.w.fill:  # summed from 0, not from the fill
                flat[lin[~hit]] = 0
            np.add.at(flat, lin, np.asarray(values, self.w.dtype))
            self.filled = int(np.count_nonzero(self.seen))
        else:
            flat[lin] = values  # assigned, so a -0.0 stays -0.0
            self.filled += len(lin)

    def finish(self) -> None:
        if self.buf is not None:
            self.w.write_tile(self.key, self.buf)
        elif self.parts:
            coords = [np.concatenate([p[0][d] for p in self.parts]) for d in range(len(self.shape))]
            values = np.concatenate([p[1] for p in self.parts])
            write_tile_entries(self.w, self.key, coords, values, duplicates=self.duplicates,
                               where=self.where, names=self.names)


def _doubling(size: int):
    n = 1
    while n <= size:
        yield n
        n *= 2


_DUP_HINT = ("leave out DUPLICATES ERROR (duplicates='error') to sum them, or aggregate first: "
             "SELECT i, j, SUM(value) AS value FROM ... GROUP BY i, j")


def _check_coords(coords, shape, names, where) -> None:
    for d, (c, n) in enumerate(zip(coords, shape)):
        if c.size and c.min() < 0:
            k = int(np.argmax(c < 0))
            raise DataError(f"{where}: negative coordinate {_fmt(names, [int(x[k]) for x in coords])}"
                            f" (entry {k})", hint="coordinates count from 0")
        if c.size and c.max() >= n:
            k = int(np.argmax(c >= n))
            raise DataError(f"{where}: coordinate {_fmt(names, [int(x[k]) for x in coords])} "
                            f"(entry {k}) is outside shape {tuple(shape)}")


def load_coo(store, name: str, coords, values, shape, *, tile=None, replace=False, dims=None,
             duplicates=None, where: str | None = None, fill=0.0):
    """Store the entries ``values`` at ``coords`` (one integer array per dimension) as tensor
    ``name`` of ``shape``: one sort by tile, then tile by tile."""
    where = where or f"tensor '{name}'"
    duplicates = check_duplicates(duplicates, name)
    shape = tuple(int(n) for n in shape)
    coords = [np.asarray(c) for c in coords]
    values = np.asarray(values)
    if values.dtype.kind == "u" and values.dtype.itemsize == 8:
        supported_dtype(values.dtype, where)  # refused, as a dense load refuses it: no wrap
    if values.dtype.kind in "iu":
        values = values.astype(np.int64 if values.dtype.itemsize > 4 or values.dtype.kind == "u"
                               else np.int32)
    dtype = supported_dtype(values.dtype, where)
    dims = check_dims(dims, len(shape), name)
    if any(c.dtype.kind not in "iu" for c in coords):
        raise DataError(f"{where}: coordinates must be integers")
    names = list(dims)
    _check_coords(coords, shape, names, where)
    tile_shape = (check_tile_shape(tile, shape, name) if tile is not None
                  else default_tile(shape, values.size, dtype))
    # each entry's tile as one number (C order of the grid); entries already in tile order
    # (a CSR matrix in row slabs, a table sorted by tile) are not sorted again
    grid = tuple(-(-n // max(t, 1)) for n, t in zip(shape, tile_shape))
    tkey = np.ravel_multi_index(tuple(np.asarray(c // max(t, 1), np.int64)
                                      for c, t in zip(coords, tile_shape)), grid) \
        if shape and values.size else np.zeros(values.size, np.int64)
    if tkey.size > 1 and not bool((tkey[1:] >= tkey[:-1]).all()):
        order = np.argsort(tkey, kind="stable")
        tkey, coords, values = tkey[order], [c[order] for c in coords], values[order]
    values = values.astype(dtype, copy=False)
    with store.writer(name, shape, dtype, tile_shape, dims=dims, replace=replace, fill=fill) as w:
        if values.size:
            change = np.flatnonzero(tkey[1:] != tkey[:-1]) + 1
            for a, b in zip(np.r_[0, change], np.r_[change, values.size]):
                key = tuple(int(k) for k in np.unravel_index(int(tkey[a]), grid)) if shape else ()
                write_tile_entries(w, key, [c[a:b] for c in coords],
                                   values[a:b], duplicates=duplicates, where=where, names=names)
    return w.meta()


def is_sparse_object(obj) -> bool:
    """Whether ``obj`` is a scipy.sparse matrix or array, or a pydata ``sparse`` array."""
    mod = type(obj).__module__
    return mod.startswith("scipy.sparse") or mod.split(".")[0] == "sparse"


def from_object(obj):
    """(coords, values, shape, fill value) of a scipy.sparse or pydata sparse array, without
    densifying."""
    mod = type(obj).__module__
    if mod.startswith("scipy.sparse"):
        coo = obj.tocoo()
        return ((coo.row, coo.col) if coo.ndim == 2 else tuple(coo.coords), coo.data, coo.shape,
                0.0)
    coo = obj.tocoo() if hasattr(obj, "tocoo") else obj
    fill = getattr(obj, "fill_value", 0)
    return tuple(coo.coords), coo.data, coo.shape, (0.0 if fill is None else float(fill))


def to_sparse(reader):
    """A stored tensor as a sparse array built from its tiles' nonzeros (a sparse tile's entries,
    a dense tile's nonzeros; ``-0.0`` is a zero here): a ``scipy.sparse.csr_array`` for a matrix,
    a ``scipy.sparse.coo_array`` for a hypersparse matrix (stored COO: ``sparsity.choose_format``),
    a pydata ``sparse.COO`` for any other rank (the optional package ``sparse``), and for a
    tensor whose fill value is not 0 (its ``fill_value``; scipy has none)."""
    from ..storage.views import coo_batches
    meta = reader.meta
    parts = [[] for _ in range(meta.ndim + 1)]
    for batch in coo_batches(reader):
        for k in range(meta.ndim + 1):
            parts[k].append(batch.column(k).to_numpy(zero_copy_only=False))
    cols = [np.concatenate(p) if p else np.zeros(0, np.int64 if k < meta.ndim else meta.dtype)
            for k, p in enumerate(parts)]
    coords, values = cols[:-1], cols[-1].astype(meta.dtype, copy=False)
    if meta.ndim == 2 and not meta.fill:
        import scipy.sparse as sp
        idx = np.int32 if max(meta.shape + (values.size,)) < 2**31 else np.int64
        if choose_format(meta.shape, values.size, meta.dtype) == "coo":
            # hypersparse: CSR's row pointers would be most of it (80 GB for 10^10 rows)
            return sp.coo_array((values, tuple(c.astype(idx) for c in coords)), shape=meta.shape)
        return sp.csr_array(sp.coo_array((values, tuple(c.astype(idx) for c in coords)),
                                         shape=meta.shape))
    from .._optional import require
    sparse = require("sparse", "con.sparse() of a tensor that is not a matrix, or whose fill "
                     "value is not 0")
    if math.prod(meta.shape) > np.iinfo(np.int64).max:  # pydata's COO linearises its indices
        raise NotSupportedError(
            f"con.sparse('{meta.name}'): a pydata sparse.COO cannot hold shape {meta.shape} (its "
            "element count passes int64)",
            hint=f"read its entries with SELECT * FROM {meta.name}, or export them with "
                 f"con.export('{meta.name}', 'entries.parquet')")
    return sparse.COO(np.stack(coords) if coords else np.zeros((0, values.size), np.int64),
                      values, shape=meta.shape, has_duplicates=False, sorted=False,
                      fill_value=meta.dtype.type(meta.fill))
