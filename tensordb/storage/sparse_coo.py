"""Sparse tiles in COO read as their entries: a box of a tensor of rank 3 or more, or of a
matrix's hypersparse COO tiles, as one ``CooTile`` (``coo_box``, what ``read_sparse_box`` gives
such a box), and a matrix's COO tile made CSR over some of its rows (``coo_rows_csr``, for a
kernel that needs CSR). Nothing here is allocated in proportion to a tensor's extents: the
entries of the tiles the box overlaps, and for ``coo_rows_csr`` row pointers of the rows asked.

>>> import numpy as np
>>> t = CooTile((4, 3), np.array([[1, 3], [0, 2]]), np.array([5.0, 6.0]))
>>> coo_rows_csr(t, 1, 4).toarray().tolist()
[[5.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 6.0]]
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..geometry import overlapping, tile_box
from ..sparsity import index_dtype
__all__ = ["CooTile", "coo_box", "coo_rows_csr"]


@dataclass(frozen=True)
class CooTile:
    """A sparse tile of any rank: ``coords`` (ndim x nse, C order), ``values`` (nse)."""

    shape: tuple[int, ...]
    coords: np.ndarray
    values: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nnz(self) -> int:  # stored entries, as scipy names them
        return int(self.values.size)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def toarray(self, fill: float = 0.0) -> np.ndarray:
        out = np.full(self.shape, fill, self.values.dtype) if fill else \
            np.zeros(self.shape, self.values.dtype)
        if self.values.size:
            out[tuple(self.coords)] = self.values
        return out


def coo_rows_csr(tile: CooTile, r0: int = 0, r1: int | None = None):
    """Rows ``r0:r1`` of a matrix's COO tile (entries in C order) as a scipy CSR array: row
    pointers for those rows only, the entries there copied."""
    r1 = tile.shape[0] if r1 is None else r1
    rows = tile.coords[0]
    lo, hi = np.searchsorted(rows, [r0, r1], side="left")
    sub = rows[lo:hi].astype(np.int64) - r0
    nse = int(hi - lo)
    idx = index_dtype((r1 - r0, tile.shape[1]), nse)
    indptr = np.searchsorted(sub, np.arange(r1 - r0 + 1), side="left").astype(idx)
    import scipy.sparse as sp
    m = sp.csr_array((np.array(tile.values[lo:hi]), np.asarray(tile.coords[1][lo:hi], idx),
                      indptr), shape=(r1 - r0, tile.shape[1]), copy=False)
    m.has_sorted_indices = True  # C order: sorted within each row
    return m



def coo_box(reader, starts, stops) -> CooTile | None:
    """The box ``[starts, stops)`` of a stored tensor of rank 3 or more (or of a matrix's COO
    tiles) as a ``CooTile`` (its entries there, coordinates relative to the box, in C order)
    when every stored tile it overlaps is sparse and the fill is 0; None otherwise (then read
    it dense)."""
    meta = reader.meta
    if meta.fill != 0:
        return None
    starts, stops = tuple(int(x) for x in starts), tuple(int(x) for x in stops)
    ranges = [overlapping(b, a, z) for b, a, z in zip(meta.grid, starts, stops)]
    keys = [k for k in reader.entries if all(k[d] in ranges[d] for d in range(meta.ndim))] \
        if math.prod(len(r) for r in ranges) > len(reader.entries) else \
        [k for k in itertools.product(*ranges) if k in reader.entries]
    if not keys or any(not reader.entries[k].sparse for k in keys):
        return None
    shape = tuple(z - a for a, z in zip(starts, stops))
    coords, values = [], []
    for k in sorted(keys):
        tile = reader.stored_tile(k)
        lo, _ = tile_box(meta.grid, k)
        c = [np.asarray(tile.coords[d], np.int64) + (lo[d] - starts[d]) for d in range(meta.ndim)]
        inside = np.ones(tile.values.size, bool)
        for d in range(meta.ndim):
            inside &= (c[d] >= 0) & (c[d] < shape[d])
        coords.append(np.stack([x[inside] for x in c]) if c else np.zeros((0, 0), np.int64))
        values.append(np.asarray(tile.values)[inside])
    coords_all = np.concatenate(coords, axis=1)
    vals = np.concatenate(values)
    if len(keys) > 1 and vals.size > 1:  # tiles' entries interleave in the box's C order
        order = np.lexsort(coords_all[::-1])
        coords_all, vals = coords_all[:, order], vals[order]
    return CooTile(shape, coords_all, vals)
