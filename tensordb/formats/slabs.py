"""A matrix streamed in row slabs: ``con.load(name, slabs, shape=(rows, cols))`` where ``slabs`` is
an iterator (a generator, say) of scipy.sparse matrices or arrays, each the next rows of the
matrix, top to bottom. The tensor is written one band of tile rows at a time, so a load holds
one slab and one band of tiles, never the whole matrix: a sparse tensor larger than the
machine's memory loads in memory proportional to a slab (docs/storage.md, "Streamed loads").

Slabs need not line up with the tiles: a slab is cut at the tile rows' boundaries and a band
that several slabs fill is stacked before it is written (slabs of the tile's height are
written as they come, with no copy but the payload's). Every tile goes through the writer, so
the format rule, checksums, the catalog's nnz and the atomic replace are those of any load: the
catalog is committed once, after the last slab; an error in any slab (a bad shape, a column out
of range, a repeated coordinate under ``duplicates='error'``), an exception raised by the
generator itself, or Ctrl-C leaves nothing stored and the old tensor in place.

>>> import numpy as np, scipy.sparse as sp
>>> from tensordb.storage import Store
>>> with Store() as store:
...     slabs = (sp.csr_array(np.eye(4, dtype="float32")[r:r + 2]) for r in (0, 2))
...     m = load_slabs(store, "G", slabs, shape=(4, 4), tile=(2, 4))
...     m.tile_count, float(store.open("G").to_numpy().trace())
(2, 4.0)
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ..errors import DataError, OutOfMemoryError, ProgrammingError
from ..storage.meta import check_tile_shape, supported_dtype
from ..storage.sparse import Filled
from .coo import _DUP_HINT, check_duplicates, default_tile, is_sparse_object

__all__ = ["is_slab_stream", "load_slabs"]


def is_slab_stream(source) -> bool:
    """Whether ``source`` is a stream of row slabs: an iterator (a generator), or a list or
    tuple of scipy.sparse / pydata sparse matrices."""
    if isinstance(source, Iterator):
        return True
    return isinstance(source, (list, tuple)) and len(source) > 0 and \
        all(is_sparse_object(s) for s in source)


def _value_dtype(dtype, where: str) -> np.dtype:
    """The stored dtype of a slab's values (integers widened as ``load_coo`` widens them)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "u" and dtype.itemsize == 8:
        supported_dtype(dtype, where)  # refused: no wrap
    if dtype.kind in "iu":
        dtype = np.dtype(np.int64 if dtype.itemsize > 4 or dtype.kind == "u" else np.int32)
    return supported_dtype(dtype, where)


def _csr_of(slab, k: int, row: int, cols: int, where: str):
    """Slab ``k`` (its first row is ``row`` of the matrix) as a scipy CSR array, checked."""
    import scipy.sparse as sp
    if not is_sparse_object(slab):
        raise DataError(f"{where}: slab {k} (from row {row}) is a {type(slab).__name__}, not a "
                        "scipy.sparse matrix or array",
                        hint="yield scipy.sparse row slabs (csr_array((data, indices, indptr)))")
    if type(slab).__module__.split(".")[0] == "sparse":  # pydata sparse
        slab = slab.tocsr() if getattr(slab, "ndim", 0) == 2 else slab
    if getattr(slab, "ndim", 0) != 2:
        raise DataError(f"{where}: slab {k} (from row {row}) has {getattr(slab, 'ndim', '?')} "
                        "dimensions; a stream of row slabs makes a matrix")
    if slab.shape[1] != cols:
        raise DataError(f"{where}: slab {k} (from row {row}) has shape {tuple(slab.shape)}: "
                        f"{slab.shape[1]} columns, the tensor's shape says {cols}")
    csr = slab if getattr(slab, "format", None) == "csr" else slab.tocsr()
    return sp.csr_array(csr) if not isinstance(csr, sp.sparray) else csr


def _check_columns(csr, row: int, names, shape, where: str) -> None:
    ind = csr.indices
    if not ind.size:
        return
    bad = (ind < 0) | (ind >= shape[1])
    if bad.any():
        k = int(np.argmax(bad))
        r = row + int(np.searchsorted(csr.indptr, k, side="right")) - 1
        raise DataError(f"{where}: coordinate ({names[0]}={r}, {names[1]}={int(ind[k])}) is "
                        f"outside shape {tuple(shape)}",
                        hint="column indices count from 0 and stay under the column count")


def _rows(csr, a: int, b: int):
    """Rows ``a:b`` of a CSR array: views of its entries, new row pointers only."""
    import scipy.sparse as sp
    if (a, b) == (0, csr.shape[0]):
        return csr
    ptr = csr.indptr
    lo, hi = int(ptr[a]), int(ptr[b])
    part = sp.csr_array((csr.data[lo:hi], csr.indices[lo:hi], ptr[a:b + 1] - ptr[a]),
                        shape=(b - a, csr.shape[1]), copy=False)
    return part


def _canonical(csr, row: int, names, duplicates: str, where: str):
    """The band with column indices sorted within rows and repeats summed (or refused)."""
    if csr.has_canonical_format:
        return csr
    csr = csr.copy()
    csr.sort_indices()
    ptr, ind = csr.indptr, csr.indices
    if ind.size > 1:
        same = ind[1:] == ind[:-1]
        # a repeat is two equal columns inside one row (not across a row boundary)
        starts = np.zeros(ind.size, bool)
        starts[ptr[:-1][ptr[:-1] < ind.size]] = True
        repeated = same & ~starts[1:]
        if repeated.any() and duplicates == "error":
            k = int(np.argmax(repeated)) + 1
            r = row + int(np.searchsorted(ptr, k, side="right")) - 1
            raise DataError(f"{where}: coordinate ({names[0]}={r}, {names[1]}={int(ind[k])}) "
                            "appears more than once", hint=_DUP_HINT)
    csr.sum_duplicates()
    return csr


def _nbytes(csr) -> int:
    return int(csr.data.nbytes + csr.indices.nbytes + csr.indptr.nbytes)


def load_slabs(store, name: str, slabs, *, shape, tile=None, replace: bool = False, dims=None,
               duplicates: str | None = None, fill=None, memory_limit: int | None = None,
               where: str | None = None):
    """Store the matrix whose rows ``slabs`` yields, slab after slab, as tensor ``name`` of
    ``shape`` (rows, columns), one band of tile rows at a time; its catalog entry. The dtype is
    the first slab's (integers widened as ``load_coo`` does); a later slab's values are cast to
    it when numpy casts them safely, else it is a DataError. The slabs' rows must add up to
    ``shape[0]``. ``tile`` defaults to row slabs of about ``sparsity.TARGET_TILE_NSE`` entries,
    judged by the first slab's density. ``memory_limit``: a band larger than it is refused
    (OutOfMemoryError) before it is written."""
    from ..storage.meta import check_dims
    where = where or f"tensor '{name}'"
    duplicates = check_duplicates(duplicates, name)
    if shape is None:
        raise ProgrammingError(f"load '{name}': a stream of row slabs needs shape=(rows, columns)",
                               hint="the rows are not known until the last slab has come")
    try:
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise ProgrammingError(f"load '{name}': shape must be (rows, columns), got {shape!r}") \
            from None
    if len(shape) != 2 or min(shape) < 0:
        raise ProgrammingError(f"load '{name}': a stream of row slabs makes a matrix: shape must "
                               f"be (rows, columns), got {shape}")
    dims = check_dims(dims, 2, name)
    names = list(dims)
    rows, cols = shape
    it = iter(slabs)
    first = next(it, None)
    if first is None:
        dtype = np.dtype(np.float64)
        est = 0
    else:
        first = _csr_of(first, 0, 0, cols, where)
        dtype = _value_dtype(first.dtype, where)
        est = first.nnz * max(rows, 1) // max(first.shape[0], 1)
    tile_shape = (check_tile_shape(tile, shape, name) if tile is not None
                  else default_tile(shape, est, dtype))
    band_rows = max(tile_shape[0], 1)
    fill = 0.0 if fill is None else float(fill)
    stream = itertools.chain([first] if first is not None else [], it)
    del first  # held by the stream until the band it falls in is written
    with store.writer(name, shape, dtype, tile_shape, dims=dims, replace=replace, fill=fill,
                      check_tables=False) as w:
        col_edges = w.grid[1]
        pending: list = []
        band, at = 0, 0  # the band being filled, and the rows received so far
        for k, slab in enumerate(stream):
            csr = slab if k == 0 else _csr_of(slab, k, at, cols, where)
            if csr.dtype != dtype:
                if not np.can_cast(csr.dtype, dtype, "safe"):
                    raise DataError(f"{where}: slab {k} (from row {at}) holds {csr.dtype.name} "
                                    f"values; the first slab's make the tensor {dtype.name}",
                                    hint="yield slabs of one dtype")
                csr = csr.astype(dtype)
            if at + csr.shape[0] > rows:
                raise DataError(f"{where}: slab {k} (rows {at} to {at + csr.shape[0] - 1}) goes "
                                f"past the {rows} rows of shape {shape}")
            _check_columns(csr, at, names, shape, where)
            done = 0
            while done < csr.shape[0]:
                end = min((band + 1) * band_rows, rows)
                take = min(end - at, csr.shape[0] - done)
                pending.append(_rows(csr, done, done + take))
                done += take
                at += take
                if at == end:
                    _write_band(w, band, pending, col_edges, fill, duplicates, names, where,
                                memory_limit)
                    pending, band = [], band + 1
            del csr, slab
        if at != rows:
            raise DataError(f"{where}: the slabs hold {at} rows; shape {shape} says {rows}",
                            hint="yield every row (an empty slab for rows with no entries)")
    return w.meta()


def _write_band(w, band: int, pieces, col_edges, fill: float, duplicates: str, names,
                where: str, memory_limit: int | None) -> None:
    """Write the tiles of band ``band`` (tile row) from its row ``pieces`` (CSR, in order)."""
    import scipy.sparse as sp
    row = int(w.grid[0][band])
    if memory_limit is not None:
        need = 2 * sum(_nbytes(p) for p in pieces)  # the band and its payload
        if need > memory_limit:
            raise OutOfMemoryError(
                f"{where}: the tile rows from row {row} hold {sum(p.nnz for p in pieces)} "
                f"entries, {need} bytes with their payload, more than the memory_limit "
                f"({memory_limit} bytes)", hint="give tile= fewer rows")
    csr = pieces[0] if len(pieces) == 1 else sp.vstack(pieces, format="csr")
    pieces.clear()
    csr = _canonical(csr, row, names, duplicates, where)
    for c in range(len(col_edges) - 1):
        c0, c1 = int(col_edges[c]), int(col_edges[c + 1])
        part = csr if (c0, c1) == (0, csr.shape[1]) else sp.csr_array(csr[:, c0:c1])
        if part.nnz == 0 and fill == 0:
            continue
        w.write_tile((band, c), part if fill == 0 else Filled(part, fill))
