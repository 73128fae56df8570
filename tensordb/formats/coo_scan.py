"""A sparse matrix's COO table loaded with no sort in DuckDB: the rows are read as they come (a
scan, no ORDER BY), a pass of whole tile rows at a time, and bucketed into CSR by two counting
sorts in scipy's sparsetools (O(nnz), in C): by column, then by row, which leaves every row's
columns sorted and a repeated coordinate's values adjacent in the order the table gave them.
Repeats are then summed in that order (as scipy sums them) or refused, and each tile is stored
from its slice of the CSR arrays (``TensorWriter.write_tile`` of a canonical scipy CSR array:
its arrays are the payload's).

A pass holds its entries three times (as read, bucketed by column, by row), so the passes are
sized to DuckDB's share of ``memory_limit`` (``storage.budget.duck_bytes``; 1 GiB without a
limit, what the sort had): one pass for a graph of about 10M edges without a limit, more under a
limit, each a scan of the source for its rows (``WHERE i >= lo AND i < hi``).

Used for a matrix that is sparse as a whole, with fill 0 and a numeric dtype (tables.py decides);
higher ranks, booleans, fill values and dense tables take the sorted path (tables._fill_coo).

>>> import numpy as np
>>> p, c, v = bucket(np.array([1, 0, 1], np.int32), np.array([2, 1, 0], np.int32),
...                  np.array([1.0, 2.0, 3.0]), 2, 3)
>>> p.tolist(), c.tolist(), v.tolist()
([0, 1, 3], [1, 0, 2], [2.0, 3.0, 1.0])
"""
from __future__ import annotations

import numpy as np

from ..errors import DataError
from ..storage import quote_ident
from ..storage.budget import SORT_MEMORY, duck_bytes
from .coo import _DUP_HINT

__all__ = ["applies", "bucket", "load_passes"]

_DTYPES = {"float32": "FLOAT", "float64": "DOUBLE", "int32": "INTEGER", "int64": "BIGINT"}
_COPIES = 3  # a pass's entries as read, bucketed by column and by row


def _budget(limit) -> int:
    return duck_bytes(limit) if limit is not None else SORT_MEMORY


def applies(shape, tile_shape, dtype, fill, limit=None) -> bool:
    """Whether a COO table of a matrix with these tiles loads by scan (see the module): not
    where the column pointers of the first counting sort (one per column of a tile) or a tile
    row's row pointers would take half the budget by themselves (a very wide matrix)."""
    if len(shape) != 2 or fill or np.dtype(dtype).name not in _DTYPES:
        return False
    rows_t, cols_t = (max(int(t), 1) for t in tile_shape)
    col_tiles = -(-max(int(shape[1]), 1) // cols_t)
    return 8 * (cols_t + 1 + rows_t * col_tiles + 1) <= _budget(limit) // 2


def bucket(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, nrows: int, ncols: int):
    """CSR arrays (indptr, indices, data) of the entries at (``rows``, ``cols``), each row's
    columns sorted, repeats kept adjacent in their input order (two stable counting sorts)."""
    from scipy.sparse import _sparsetools as st  # scipy's own coo->csr and csr->csc, in C
    idx = rows.dtype
    nnz = int(values.size)
    tp, ti, tv = np.empty(ncols + 1, idx), np.empty(nnz, idx), np.empty(nnz, values.dtype)
    st.coo_tocsr(ncols, nrows, nnz, cols, rows, values, tp, ti, tv)  # by column: the transpose
    p, c, v = np.empty(nrows + 1, idx), np.empty(nnz, idx), np.empty(nnz, values.dtype)
    st.csr_tocsc(ncols, nrows, tp, ti, tv, p, c, v)  # by row, columns in order
    return p, c, v


def _sum_repeats(p, c, v, nrows: int, ncols: int):
    """Repeats summed in place (scipy's csr_sum_duplicates): the arrays cut to the new nnz."""
    from scipy.sparse import _sparsetools as st
    st.csr_sum_duplicates(nrows, ncols, p, c, v)
    nnz = int(p[-1])
    return p, c[:nnz], v[:nnz]


def _first_repeat(p, c) -> tuple[int, int] | None:
    """(CSR row, column) of the first coordinate that appears twice, or None."""
    if c.size < 2:
        return None
    same = c[1:] == c[:-1]
    if not same.any():
        return None
    starts = np.zeros(c.size, bool)
    starts[p[:-1][p[:-1] < c.size]] = True
    same &= ~starts[1:]
    hits = np.flatnonzero(same)
    if not hits.size:
        return None
    k = int(hits[0]) + 1
    return int(np.searchsorted(p, k, side="right") - 1), int(c[k])


def _passes(duck, src, qi, tile_rows: int, rows: int, per_entry: int, budget: int,
            per_tile_row: int = 0, tile_rows_total: int = 1):
    """[(first tile row, end tile row, entries)]: consecutive tile rows whose entries (and
    ``per_tile_row`` bytes of row pointers each) fit ``budget`` together (a tile row alone may
    not: it is the least a pass holds)."""
    if rows * per_entry + tile_rows_total * per_tile_row <= budget:
        return [(0, None, rows)]
    counts = duck.sql(f"SELECT {qi} // {tile_rows} AS k, count(*) FROM {src} GROUP BY k "
                      "ORDER BY k").fetchall()
    out, at, held, first = [], None, 0, None
    for k, n in counts:
        span = 0 if first is None else k + 1 - first
        if first is not None and (held + n) * per_entry + span * per_tile_row > budget:
            out.append((first, at + 1, held))
            first, held = None, 0
        if first is None:
            first = k
        at, held = k, held + n
    if first is not None:
        out.append((first, at + 1, held))
    return out


def load_passes(w, duck, src, idx, val, *, tile_shape, rows, limit, duplicates, where, stream,
                budget: int | None = None) -> None:
    """Store the tiles of writer ``w`` (a matrix, ``applies``) from the COO table ``src`` with
    index columns ``idx`` and value column ``val``, whose ``rows`` rows were checked (no NULLs,
    inside the shape): pass by pass (see the module), each holding at most ``budget`` bytes
    (default: DuckDB's share of ``limit``)."""
    nrows, dtype = w.shape[0], np.dtype(w.dtype)
    rows_t, cols_t = (max(int(t), 1) for t in tile_shape)
    row_bounds, col_bounds = w.grid
    col_tiles = len(col_bounds) - 1
    qi, qj = (quote_ident(c) for c in idx)
    per_entry = _COPIES * (8 + dtype.itemsize) + 8
    if budget is None:
        budget = _budget(limit)
    # the first counting sort's column pointers are held by every pass; each tile row adds
    # its rows' pointers (one per row and column tile)
    budget -= 8 * (cols_t + 1)
    passes = _passes(duck, src, qi, rows_t, rows, per_entry, budget, 8 * rows_t * col_tiles,
                     len(row_bounds) - 1)
    for first, end, held in passes:
        if not held:
            continue
        lo = first * rows_t
        hi = nrows if end is None else min(nrows, end * rows_t)
        span = hi - lo
        vrows = span * col_tiles  # a CSR row per (row of the pass, column tile)
        big = max(vrows, cols_t, held) >= 2**31
        it = "BIGINT" if big else "INTEGER"
        # the entry's CSR row: its row in the pass, in the block of its column tile
        vrow = f"{qi} - {lo}" if col_tiles == 1 else f"{qi} - {lo} + ({qj} // {cols_t}) * {span}"
        vcol = qj if col_tiles == 1 else f"{qj} % {cols_t}"
        select = (f"SELECT CAST({vrow} AS {it}), CAST({vcol} AS {it}), "
                  f"CAST({quote_ident(val)} AS {_DTYPES[dtype.name]}) FROM {src}"
                  + ("" if end is None else f" WHERE {qi} >= {lo} AND {qi} < {hi}"))
        r = np.empty(held, np.int64 if big else np.int32)
        c, v = np.empty_like(r), np.empty(held, dtype)
        got = 0
        with stream(duck, select, 2 * r.itemsize + dtype.itemsize, limit) as reader:
            for batch in reader:
                n = batch.num_rows
                if got + n > held:
                    raise DataError(f"{where} yielded more rows than it counted")
                for k, out in enumerate((r, c, v)):
                    out[got:got + n] = batch.column(k).to_numpy(zero_copy_only=False)
                got += n
        if got != held:
            raise DataError(f"{where} yielded {got} rows but counted {held}")
        p, c, v = bucket(r, c, v, vrows, cols_t)
        del r
        if duplicates == "error":
            rep = _first_repeat(p, c)
            if rep is not None:
                vr, col = rep
                at = (lo + vr % span, (vr // span) * cols_t + col)
                raise DataError(f"{where}: coordinate ({idx[0]}={at[0]}, {idx[1]}={at[1]}) "
                                "appears more than once", hint=_DUP_HINT)
        p, c, v = _sum_repeats(p, c, v, vrows, cols_t)
        _write_tiles(w, p, c, v, lo, hi, span, row_bounds, col_bounds)


def _write_tiles(w, p, c, v, lo, hi, span, row_bounds, col_bounds) -> None:
    """Each tile of rows [lo, hi) from its slice of the pass's CSR arrays."""
    import scipy.sparse as sp
    first = int(np.searchsorted(row_bounds, lo, side="right") - 1)
    for rt in range(first, len(row_bounds) - 1):
        r0, r1 = row_bounds[rt], row_bounds[rt + 1]
        if r0 >= hi:
            break
        for ct in range(len(col_bounds) - 1):
            a, b = ct * span + r0 - lo, ct * span + r1 - lo
            s, e = int(p[a]), int(p[b])
            if s == e:
                continue
            tile = sp.csr_array((v[s:e], c[s:e], p[a:b + 1] - p[a]),
                                shape=(r1 - r0, col_bounds[ct + 1] - col_bounds[ct]),
                                copy=False)
            tile.has_canonical_format = True  # sorted, repeats summed: bucket, _sum_repeats
            w.write_tile((rt, ct), tile)
