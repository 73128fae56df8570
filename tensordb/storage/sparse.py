"""Sparse tile payloads: encoded from entries (or a dense tile), decoded as views of the mapping.

Layout of a sparse tile's payload (``tensordb.sparsity`` sizes it and chooses the format):

    nse (int64) | values (nse x itemsize, zero-padded to 8 bytes) | indices

with indices ``indptr (rows + 1), indices (nse)`` for ``csr`` (a matrix, column indices sorted
within each row) and ``coords (ndim x nse)`` (dimension-major, entries in C order) for ``coo``; int32
where they fit, int64 otherwise (``sparsity.index_dtype``). The stored entries are a tile's
nonzeros and its ``-0.0``s (an absent entry reads as ``+0``, and ``1 / -0.0`` is ``-inf``); the
catalog's ``nnz`` counts nonzeros as for dense tiles. The tile's CRC-32 is over these bytes.

A decoded matrix tile is a ``scipy.sparse.csr_array`` over read-only views of the payload; any
other rank a :class:`CooTile`. :func:`densify` turns either into the dense array.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import DataError
from ..sparsity import HEADER_BYTES, SPARSE_FORMATS, index_dtype, sparse_nbytes
from .sparse_coo import CooTile, coo_box, coo_rows_csr

__all__ = ["CooTile", "Filled", "RowSlabs", "stacked", "encode", "encode_coo", "in_c_order", "encode_csr", "csr_parts",
           "encode_dense",
           "decode", "densify", "densify_part", "is_sparse", "scatter_into", "entries", "fill_of",
           "tile_nbytes",
           "stored_entries",
           "validate", "to_scipy", "read_sparse_box"]


def is_sparse(tile) -> bool:
    """Whether ``tile`` is a decoded sparse tile (not a dense array)."""
    if type(tile) is np.ndarray:  # the common answer first (asked ten times a statement)
        return False
    return isinstance(tile, (CooTile, Filled, RowSlabs)) or _is_scipy(tile)


@dataclass(frozen=True)
class RowSlabs:
    """A box of a matrix that spans several stored CSR row tiles, whole width: each tile's rows
    in it as a CSR view of its payload (``parts``: (first row in the box, the view)), nothing
    copied. The ``spmm`` kernel computes slab by slab from it; any other reader takes
    ``tocsr()``, the entries stacked into one CSR array (one copy of them)."""

    shape: tuple[int, int]
    dtype: np.dtype
    parts: tuple

    @property
    def nnz(self) -> int:
        return sum(int(p.nnz) for _, p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(int(p.data.nbytes + p.indices.nbytes + p.indptr.nbytes) for _, p in self.parts)

    def tocsr(self):
        """The box as one CSR array (its entries copied once)."""
        rows, cols = self.shape
        nse = self.nnz
        idx = index_dtype(self.shape, nse)
        data = np.empty(nse, self.dtype)
        indices = np.empty(nse, idx)
        indptr = np.zeros(rows + 1, idx)
        at = 0
        ends = [r for r, _ in self.parts[1:]] + [rows]
        for (r0, p), r1 in zip(self.parts, ends):
            k = int(p.nnz)
            data[at:at + k] = p.data
            indices[at:at + k] = p.indices
            indptr[r0 + 1:r0 + p.shape[0] + 1] = p.indptr[1:] + at
            indptr[r0 + p.shape[0] + 1:r1 + 1] = at + k  # rows of an absent tile: empty
            at += k
        return _csr(data, indices, indptr, self.shape)


def stacked(tile):
    """``tile`` with a ``RowSlabs`` box, or a matrix's ``CooTile`` box, made one CSR array (any
    other tile as it is)."""
    if isinstance(tile, CooTile) and tile.ndim == 2:
        return coo_rows_csr(tile)
    return tile.tocsr() if isinstance(tile, RowSlabs) else tile


def _is_scipy(tile) -> bool:
    return type(tile).__module__.startswith("scipy.sparse")


@dataclass(frozen=True)
class Filled:
    """A sparse matrix box (scipy CSR) of a tensor whose absent entries are ``fill``, not 0:
    what a Load gives the semiring kernels (exec/semiring.py); any other kernel densifies it."""

    csr: object
    fill: float

    @property
    def shape(self):
        return self.csr.shape

    @property
    def dtype(self):
        return self.csr.dtype

    @property
    def nbytes(self) -> int:
        """Its entries' bytes (values and indices): what it holds in memory."""
        c = self.csr
        return int(c.data.nbytes + c.indices.nbytes + c.indptr.nbytes)


def fill_of(tile) -> float:
    """The value of the entries a sparse tile does not store: a ``Filled`` box's fill, else 0."""
    return tile.fill if isinstance(tile, Filled) else 0.0


def tile_nbytes(tile) -> int:
    """The bytes a tile holds in memory: a dense array's, or a sparse tile's entries (values and
    indices), which scipy's arrays do not report as ``nbytes``."""
    if isinstance(tile, Filled):
        tile = tile.csr
    if isinstance(tile, CooTile):
        return int(tile.values.nbytes + tile.coords.nbytes)
    if _is_scipy(tile) or getattr(tile, "format", None) in ("csr", "csc", "coo"):
        # scipy's, or a GPU's (cupyx.scipy.sparse: its arrays on the device)
        return int(sum(getattr(tile, a).nbytes for a in ("data", "indices", "indptr", "row", "col",
                                                         "coords") if hasattr(tile, a)
                       and hasattr(getattr(tile, a), "nbytes")))
    return int(getattr(tile, "nbytes", 0))


def entries(tile) -> tuple[np.ndarray, np.ndarray]:
    """A sparse tile's stored entries as (C-order linear indices, sorted and distinct; values):
    what ``TensorWriter.write_entries`` stores, with no dense tile made (repeated coordinates
    of a scipy array that is not canonical are summed, as scipy does)."""
    if isinstance(tile, Filled):
        tile = tile.csr
    if isinstance(tile, CooTile):
        lin = np.ravel_multi_index(tuple(np.asarray(c, np.int64) for c in tile.coords), tile.shape) \
            if tile.values.size else np.zeros(0, np.int64)
        order = np.argsort(lin, kind="stable")
        return lin[order], np.asarray(tile.values)[order]
    csr = tile.tocsr()
    if not csr.has_canonical_format:
        csr = csr.copy()
        csr.sum_duplicates()  # sorted within rows, repeats summed
    rows = np.repeat(np.arange(csr.shape[0], dtype=np.int64), np.diff(csr.indptr))
    return rows * csr.shape[1] + np.asarray(csr.indices, np.int64), np.asarray(csr.data)


def _full(shape, fill, dtype) -> np.ndarray:
    return np.full(shape, fill, dtype) if fill else np.zeros(shape, dtype)


def densify(tile, fill: float = 0.0) -> np.ndarray:
    """The dense array of a tile, sparse or not (a dense one comes back as it is); its absent
    entries are ``fill`` (a ``Filled`` box carries its own)."""
    if isinstance(tile, Filled):
        tile, fill = tile.csr, tile.fill
    tile = stacked(tile)
    if isinstance(tile, CooTile):
        return tile.toarray(fill)
    if _is_scipy(tile):
        # not scipy's toarray, which adds the entries into zeros (-0.0 + 0 is +0.0)
        csr = tile.tocsr()
        out = _full(csr.shape, fill, csr.dtype)
        rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
        out[rows, csr.indices] = csr.data
        return out
    return tile


def densify_part(tile, part, fill: float = 0.0) -> np.ndarray:
    """The dense box ``part`` (one slice per dimension, steps of 1) of a sparse tile: only the
    box is made dense (a small box of a large tile costs the box and the entries in it)."""
    lo = [p.start or 0 for p in part]
    hi = [n if p.stop is None else p.stop for p, n in zip(part, tile.shape)]
    if isinstance(tile, CooTile):
        c = tile.coords
        inside = np.ones(tile.values.size, bool)
        for d in range(len(lo)):
            inside &= (c[d] >= lo[d]) & (c[d] < hi[d])
        out = _full(tuple(h - l for l, h in zip(lo, hi)), fill, tile.values.dtype)
        out[tuple(c[d][inside] - lo[d] for d in range(len(lo)))] = tile.values[inside]
        return out
    rows = _row_slab(tile, lo[0], hi[0])
    ptr = rows.indptr
    r = np.repeat(np.arange(rows.shape[0]), np.diff(ptr))
    cols = np.asarray(rows.indices)
    inside = (cols >= lo[1]) & (cols < hi[1])
    out = _full((hi[0] - lo[0], hi[1] - lo[1]), fill, rows.dtype)
    out[r[inside], cols[inside] - lo[1]] = np.asarray(rows.data)[inside]
    return out


def scatter_into(out: np.ndarray, starts, tile) -> None:
    """Write a sparse tile's entries into ``out`` (zeros there already) at offset ``starts``."""
    if isinstance(tile, CooTile):
        coords, values = tile.coords, tile.values
    else:
        coords = (np.repeat(np.arange(tile.shape[0]), np.diff(tile.indptr)), tile.indices)
        values = tile.data
    out[tuple(np.asarray(c, np.int64) + s for c, s in zip(coords, starts))] = values


def stored_entries(flat: np.ndarray) -> np.ndarray:
    """Linear indices of the entries a sparse tile stores: nonzeros (NaN included) and -0.0."""
    mask = flat != 0
    if flat.dtype.kind == "f":
        mask |= np.signbit(flat)
    return np.flatnonzero(mask)


def encode_dense(a: np.ndarray, fmt: str) -> np.ndarray:
    """The payload (uint8) of dense tile ``a`` in sparse format ``fmt``."""
    flat = np.ascontiguousarray(a).reshape(-1)
    lin = stored_entries(flat)
    return encode(a.shape, a.dtype, lin, flat[lin], fmt)


def encode(shape, dtype, lin: np.ndarray, values: np.ndarray, fmt: str) -> np.ndarray:
    """The payload (uint8) of a tile of ``shape`` whose entries are at C-order linear indices
    ``lin`` (sorted, distinct) with ``values``."""
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    nse = int(lin.size)
    idx = index_dtype(shape, nse)
    out = np.empty(sparse_nbytes(shape, nse, dtype, fmt), np.uint8)  # every byte written below
    out[:HEADER_BYTES].view(np.int64)[0] = nse
    vbytes = nse * dtype.itemsize
    out[HEADER_BYTES:HEADER_BYTES + vbytes].view(dtype)[:] = values
    at = HEADER_BYTES + vbytes + (-vbytes % 8)
    out[HEADER_BYTES + vbytes:at] = 0  # the values' padding
    if fmt == "csr":
        # rows from the sorted linear indices: their pointers by binary search, no count
        cols = max(shape[1], 1)
        rows = lin // cols
        indptr = np.searchsorted(rows, np.arange(shape[0] + 1), side="left")
        parts = [indptr, lin - rows * cols]
    elif fmt == "coo":
        coords = np.unravel_index(lin, shape) if nse else \
            tuple(np.zeros(0, np.int64) for _ in shape)
        parts = list(coords)
    else:
        raise ValueError(f"unknown sparse format {fmt!r}")
    for p in parts:
        n = p.size * idx.itemsize
        out[at:at + n].view(idx)[:] = p
        at += n
    return out


def encode_coo(shape, dtype, coords: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The ``coo`` payload (uint8) of a tile from its entries' coordinates per dimension
    (``coords``, ndim x nse, in C order, distinct) and ``values``: ``encode``'s layout (the
    format stores a coordinate per dimension), with no linear index made, so a tile whose
    element count passes int64 (a 10^7-cubed output tile, 10^21 elements) is written too.

    >>> import numpy as np
    >>> c, v = np.array([[0, 2], [1, 0]]), np.array([1.0, 2.0])
    >>> bool((encode_coo((3, 4), np.float64, c, v) == encode((3, 4), np.float64,
    ...                                                      np.array([1, 8]), v, "coo")).all())
    True
    """
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    coords = np.asarray(coords).reshape(len(shape), -1)
    nse = int(coords.shape[1])
    idx = index_dtype(shape, nse)
    parts = [np.array([nse], np.int64), np.ascontiguousarray(values, dtype),
             np.zeros(-(nse * dtype.itemsize) % 8, np.uint8)] + \
        [np.ascontiguousarray(c, idx) for c in coords]
    out = np.empty(sparse_nbytes(shape, nse, dtype, "coo"), np.uint8)
    at = 0
    for p in parts:
        out[at:at + p.nbytes] = p.reshape(-1).view(np.uint8)
        at += p.nbytes
    return out


def in_c_order(coords: np.ndarray) -> bool:
    """Whether the entries at ``coords`` (ndim x n) are in C order and distinct, compared a
    dimension at a time (no linear index: the tile's element count may pass int64).

    >>> import numpy as np
    >>> in_c_order(np.array([[0, 0, 1], [2, 3, 0]])), in_c_order(np.array([[0, 0], [3, 3]]))
    (True, False)
    """
    c = np.asarray(coords, np.int64)
    if c.ndim != 2 or c.shape[1] < 2:
        return True
    d = np.diff(c, axis=1)
    nz = d != 0
    first = np.argmax(nz, axis=0)  # the first dimension where neighbours differ
    return bool(nz.any(axis=0).all() and (d[first, np.arange(d.shape[1])] > 0).all())


def encode_csr(shape, dtype, indptr: np.ndarray, indices: np.ndarray,
               values: np.ndarray) -> np.ndarray:
    """The ``csr`` payload (uint8) of a matrix tile from its CSR arrays (column indices sorted
    within each row, none repeated): ``encode``'s layout, with no linear indices made."""
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    nse = int(values.size)
    idx = index_dtype(shape, nse)
    out = np.empty(sparse_nbytes(shape, nse, dtype, "csr"), np.uint8)
    out[:HEADER_BYTES].view(np.int64)[0] = nse
    vbytes = nse * dtype.itemsize
    out[HEADER_BYTES:HEADER_BYTES + vbytes].view(dtype)[:] = values
    at = HEADER_BYTES + vbytes
    out[at:at + (-vbytes % 8)] = 0
    at += -vbytes % 8
    for p in (indptr, indices):
        n = p.size * idx.itemsize
        out[at:at + n].view(idx)[:] = p
        at += n
    return out


def csr_parts(shape, dtype, indptr: np.ndarray, indices: np.ndarray,
              values: np.ndarray) -> list[np.ndarray]:
    """``encode_csr``'s payload as the arrays it is made of, in order (the entry count, the
    values, their padding, the row pointers, the column indices): the very arrays where their
    dtype is already the payload's, so a writer writes them one after the other and no payload
    is assembled (a copy of every byte: a tenth of an SpGEMM statement's CPU).

    >>> import numpy as np
    >>> p, i, v = np.array([0, 1, 2]), np.array([1, 0]), np.array([1.0, 2.0], np.float32)
    >>> parts = csr_parts((2, 2), np.float32, p, i, v)
    >>> b"".join(a.tobytes() for a in parts) == encode_csr((2, 2), np.float32, p, i, v).tobytes()
    True
    """
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    nse = int(values.size)
    idx = index_dtype(shape, nse)
    vals = np.ascontiguousarray(values, dtype)
    return [np.array([nse], np.int64), vals, np.zeros(-vals.nbytes % 8, np.uint8),
            np.ascontiguousarray(indptr, idx), np.ascontiguousarray(indices, idx)]


def decode(buf, offset: int, nbytes: int, shape, dtype, fmt: str, name: str = "?"):
    """The sparse tile stored at ``buf[offset:offset + nbytes]`` (views of ``buf``)."""
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    if fmt not in SPARSE_FORMATS:
        raise DataError(f"tensor '{name}': unknown tile format {fmt!r}")
    if nbytes < HEADER_BYTES:
        raise DataError(f"tensor '{name}': a sparse tile at byte {offset} has {nbytes} bytes")
    nse = int(np.frombuffer(buf, np.int64, 1, offset)[0])
    if not 0 <= nse <= math.prod(shape) or sparse_nbytes(shape, nse, dtype, fmt) != nbytes:
        raise DataError(f"tensor '{name}': the sparse tile at byte {offset} says it holds {nse} "
                        f"entries, which does not fit its {nbytes} bytes and shape {shape}",
                        hint="CHECK DATABASE lists every damaged tile")
    idx = index_dtype(shape, nse)
    at = offset + HEADER_BYTES
    values = np.frombuffer(buf, dtype, nse, at)
    at += nse * dtype.itemsize
    at += -(nse * dtype.itemsize) % 8
    if fmt == "csr":
        indptr = np.frombuffer(buf, idx, shape[0] + 1, at)
        indices = np.frombuffer(buf, idx, nse, at + indptr.nbytes)
        return _csr(values, indices, indptr, shape)
    coords = np.frombuffer(buf, idx, len(shape) * nse, at).reshape(len(shape), nse)
    return CooTile(shape, coords, values)


def _row_slab(tile, r0: int, r1: int):
    """Rows ``r0:r1`` of a CSR tile: views of its entries, new row pointers only (a matrix's COO
    tile, hypersparse, is made CSR over those rows first: row pointers for them, its entries)."""
    if isinstance(tile, CooTile):
        return coo_rows_csr(tile, r0, r1)
    if (r0, r1) == (0, tile.shape[0]):
        return tile
    ptr = tile.indptr
    lo, hi = int(ptr[r0]), int(ptr[r1])
    return _csr(tile.data[lo:hi], tile.indices[lo:hi], ptr[r0:r1 + 1] - ptr[r0],
                (r1 - r0, tile.shape[1]))


def _csr(values, indices, indptr, shape):
    import scipy.sparse as sp
    if indices.dtype != indptr.dtype or values.ndim != 1:  # scipy's constructor makes them one
        m = sp.csr_array((values, indices, indptr), shape=shape, copy=False)
    else:
        # the views as they are: scipy's constructor copies the values and indices of a view
        # under half of the array it views (``prune``), which a band of a stored tile's rows
        # often is: a copy at every Load, and a box the graph cache took for a copy of its own
        m = sp.csr_array(shape, dtype=values.dtype)
        m.data, m.indices, m.indptr = values, indices, indptr
    m.has_sorted_indices = True  # the encoder writes them sorted: scipy need not check or sort
    return m


def validate(tile, name: str, coords) -> list[str]:
    """Problems of a decoded sparse tile's structure (for CHECK): indices out of range or out of
    order. An empty list when it is sound."""
    if isinstance(tile, CooTile):
        c = tile.coords.astype(np.int64)
        if c.size and (c.min() < 0 or any(c[d].max() >= n for d, n in enumerate(tile.shape))):
            return ["sparse tile: a coordinate is outside the tile"]
        if not in_c_order(c):  # per dimension: the tile's linear ids may pass int64
            return ["sparse tile: entries out of order or repeated"]
        return []
    ptr = tile.indptr.astype(np.int64)
    ind = tile.indices.astype(np.int64)
    if ptr[0] != 0 or ptr[-1] != ind.size or np.any(np.diff(ptr) < 0):
        return ["sparse tile: row pointers are not a valid CSR index"]
    if ind.size and (ind.min() < 0 or ind.max() >= tile.shape[1]):
        return ["sparse tile: a column index is outside the tile"]
    rows = np.repeat(np.arange(tile.shape[0]), np.diff(ptr))
    if ind.size > 1 and np.any(np.diff(rows * tile.shape[1] + ind) <= 0):
        return ["sparse tile: entries out of order or repeated"]
    return []


def to_scipy(tile):
    """A 2-D tile (sparse or dense) as a scipy CSR array, for kernels and export."""
    import scipy.sparse as sp
    tile = stacked(tile)
    if _is_scipy(tile):
        return tile
    if isinstance(tile, CooTile):
        if tile.ndim == 2:
                return coo_rows_csr(tile)
        return sp.csr_array(sp.coo_array((tile.values, tuple(tile.coords)), shape=tile.shape))
    return sp.csr_array(tile)


def read_sparse_box(reader, starts, stops):
    """The box ``[starts, stops)`` of a stored matrix as a scipy CSR array when every stored
    tile it overlaps is sparse (slices of them, copied: proportional to their entries); None
    when it overlaps a dense tile or none at all (then read it as ``reader.read_box``)."""
    from ..geometry import overlapping, tile_box
    import scipy.sparse as sp
    own = getattr(reader, "sparse_box", None)
    if own is not None:  # computed sparse (a one-hot's rows, storage/boxes.py)
        return own(starts, stops)
    meta = reader.meta
    if meta.ndim > 2 and reader.has_sparse:
        return coo_box(reader, starts, stops)
    if meta.ndim != 2 or not reader.has_sparse:
        return None
    starts, stops = tuple(int(x) for x in starts), tuple(int(x) for x in stops)
    ranges = [overlapping(b, a, z) for b, a, z in zip(meta.grid, starts, stops)]
    present = [(r, c) for r in ranges[0] for c in ranges[1] if (r, c) in reader.entries]
    if not present or any(not reader.entries[c].sparse for c in present):
        return None
    if meta.fill == 0 and all(reader.entries[c].format == "coo" for c in present):
        # hypersparse tiles: the box's entries as COO, no row pointers (``stacked`` makes
        # it CSR for a kernel that needs one; a reduction reads it as it is)
        return coo_box(reader, starts, stops)
    if len(present) > 1 and len(ranges[1]) == 1 and \
            (meta.grid[1][ranges[1][0]], meta.grid[1][ranges[1][0] + 1]) == (starts[1], stops[1]):
        slabs = _row_slabs(reader, ranges[0], ranges[1][0], starts[0], stops[0])
        return slabs if meta.fill == 0 else Filled(slabs.tocsr(), meta.fill)
    if len(present) == 1:
        lo, hi = tile_box(meta.grid, present[0])
        a = [max(s, l) for s, l in zip(starts, lo)]
        b = [min(z, h) for z, h in zip(stops, hi)]
        if (tuple(a), tuple(b)) == (starts, stops):
            tile = reader.stored_tile(present[0])
            if (a[1], b[1]) == (lo[1], hi[1]):
                return _filled(_row_slab(tile, a[0] - lo[0], b[0] - lo[0]), meta.fill)  # views
            # a box inside one tile: scipy's slice of its rows and columns (a copy of the part,
            # ten times faster than through COO for a column slab of a large tile)
            return _filled(sp.csr_array(
                _row_slab(tile, a[0] - lo[0], b[0] - lo[0])[:, a[1] - lo[1]:b[1] - lo[1]]),
                meta.fill)
    # Several tiles cut, or one and absent ones: band by band of tile rows, each band's slices
    # (copies of their entries) side by side and let go once joined, then the bands stacked.
    # At most the slices and the box at once, twice its entries (what the memory budget counts,
    # exec/sizes.sparse_box_bytes); through COO, the slices, their coordinates and the
    # concatenated copies were four times them.
    dtype = np.dtype(meta.dtype)
    bands = []
    for r in ranges[0]:
        lo0, hi0 = meta.grid[0][r], meta.grid[0][r + 1]
        a0, b0 = max(starts[0], lo0), min(stops[0], hi0)
        row = []
        for c in ranges[1]:
            lo1, hi1 = meta.grid[1][c], meta.grid[1][c + 1]
            a1, b1 = max(starts[1], lo1), min(stops[1], hi1)
            if (r, c) not in reader.entries:
                row.append(sp.csr_array((b0 - a0, b1 - a1), dtype=dtype))
                continue
            slab = _row_slab(reader.stored_tile((r, c)), a0 - lo0, b0 - lo0)
            row.append(slab if (a1, b1) == (lo1, hi1) else
                       sp.csr_array(slab[:, a1 - lo1:b1 - lo1]))
        bands.append(row[0] if len(row) == 1 else sp.hstack(row, format="csr"))
        del row
    box = bands[0] if len(bands) == 1 else sp.vstack(bands, format="csr")
    return _filled(box, meta.fill)


def _row_slabs(reader, row_tiles, col: int, r0: int, r1: int) -> RowSlabs:
    """Rows ``r0:r1`` of a matrix whose tiles there are whole-width CSR row slabs (tile column
    ``col``): a ``RowSlabs`` of views of their entries (an absent tile's rows are empty)."""
    from ..geometry import tile_box
    meta = reader.meta
    parts = []
    for r in row_tiles:
        (lo, _), (hi, _) = tile_box(meta.grid, (r, col))
        a, b = max(r0, lo), min(r1, hi)
        tile = reader.stored_tile((r, col))
        if tile is not None and b > a:
            parts.append((a - r0, _row_slab(tile, a - lo, b - lo)))
    cols = meta.grid[1][col + 1] - meta.grid[1][col]  # the tile column's width (the box's)
    return RowSlabs((r1 - r0, cols), np.dtype(meta.dtype), tuple(parts))


def _filled(csr, fill: float):
    return csr if fill == 0 else Filled(csr, fill)
