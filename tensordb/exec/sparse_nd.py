"""Sparse tiles of rank 3 and more (``storage.sparse.CooTile``) computed on their entries, never
densified: the operand is matricized as pydata sparse's ``tensordot`` does, its labels grouped
into the ones the output keeps (rows) and the ones the operation reduces (columns), each group's
coordinates made one int64 id (``group_ids``: checked for overflow; where the product of a
group's extents passes int64 the ids are compressed to the occupied ones), and the 2-D kernel of
the rows applied.

- ``reduce_nd``: SUM, MAX or MIN of a sparse tile over the labels the output lacks (the
  ``spreduce`` kernel on a rank-3 or higher operand, exec/sparse_kernels.py); the output is
  dense (its extents are the kept labels'), absent entries counting as the zeros they are:
  NumPy's answer on the densified tile, NaN and inf included, for every dtype. Where the
  plan says a matrix output is sparse (``KernelChoice.out_format``), ``reduce_nd_csr`` gives
  it as CSR: its elements with an entry only (``S2[a,b] = SUM(T[a,b,c])`` of a 10^6-cubed
  tensor is its entries, not 8 TB).
- ``contract_nd``: ``SUM(T[...] * D[...])`` of a sparse tile ``T`` with a dense operand ``D``
  known to hold no NaN or inf (the ``spmm`` kernel on a rank-3 or higher operand): ``T``'s
  labels that ``D`` shares (summed, or kept: a batch label, in the rows and the columns both)
  are its columns, the ones the output keeps its rows (only
  the occupied rows: CSR over them), a label of ``T`` alone and not kept summed into its entries
  by scipy's duplicate sum; one scipy product with ``D`` laid out (contracted, the rest), its rows
  scattered into the dense output.

>>> import numpy as np
>>> from tensordb.storage.sparse import CooTile
>>> t = CooTile((2, 3, 4), np.array([[0, 1, 1], [0, 0, 2], [3, 1, 1]]), np.array([1.0, 2.0, -5.0]))
>>> reduce_nd(t, "abc", "a", "sum", np.float64).tolist()
[1.0, -3.0]
>>> reduce_nd(t, "abc", "ca", "max", np.float64).tolist()
[[0.0, 0.0], [0.0, 2.0], [0.0, 0.0], [1.0, 0.0]]
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["group_ids", "reduce_nd", "reduce_nd_csr", "reduce_nd_coo", "contract_nd"]

_INT64_MAX = np.iinfo(np.int64).max


def group_ids(coords: Sequence[np.ndarray], extents: Sequence[int],
              n: int | None = None) -> tuple[np.ndarray, int]:
    """(one int64 id per entry for its coordinates ``coords`` along ``extents``, the number of
    ids): C-order linear ids where the product of the extents fits int64, else the occupied
    coordinate tuples numbered in C order (``np.unique`` of their rows: proportional to the
    entries, not the extents). No dimensions: every one of the ``n`` entries' id is 0, of 1.

    >>> group_ids([np.array([0, 2]), np.array([5, 1])], (3, 10))
    (array([ 5, 21]), 30)
    >>> ids, n = group_ids([np.array([9, 0, 9]), np.array([1, 2, 1])], (10**10, 10**10))
    >>> ids.tolist(), n
    ([1, 0, 1], 2)
    """
    n = len(coords[0]) if len(coords) else int(n or 0)
    if not len(extents):
        return np.zeros(n, np.int64), 1
    size = math.prod(int(e) for e in extents)
    if size <= _INT64_MAX:
        ids = np.zeros(n, np.int64)
        for c, e in zip(coords, extents):
            ids *= int(e)
            ids += np.asarray(c, np.int64)
        return ids, size
    rows = np.stack([np.asarray(c, np.int64) for c in coords], axis=1)
    uniq, ids = np.unique(rows, axis=0, return_inverse=True)
    return ids.reshape(-1).astype(np.int64), int(len(uniq))


def reduce_nd(tile, labels: Sequence[str], out_labels: Sequence[str], agg: str,
              dtype) -> np.ndarray:
    """AGG (``sum``, ``max``, ``min``) of a sparse tile ``tile`` (a ``CooTile``: ``coords``,
    ``values``, ``shape``; labels ``labels``, each once) over the labels ``out_labels`` lacks:
    the dense output in ``out_labels``' order and ``dtype`` (NumPy's ``einsum``/``max``/``min``
    of the densified tile)."""
    dtype = np.dtype(dtype)
    labels, out_labels = list(labels), list(out_labels)
    shape = tuple(int(n) for n in tile.shape)
    kept = [labels.index(l) for l in out_labels]
    gone = [d for d in range(len(labels)) if d not in kept]
    out_shape = tuple(shape[d] for d in kept)
    size = math.prod(out_shape)
    coords, values = tile.coords, np.asarray(tile.values)
    rows, _ = group_ids([coords[d] for d in kept], out_shape, values.size)  # dense output: its size fits
    per_row = math.prod(shape[d] for d in gone)  # elements each output element reduces
    if agg == "sum":
        if dtype.kind == "b":
            out = np.zeros(size, bool)
            out[rows[values != 0]] = True
        else:
            out = np.zeros(size, dtype)
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in NumPy
                np.add.at(out, rows, values.astype(dtype, copy=False))
        return out.reshape(out_shape)
    if agg not in ("max", "min"):
        raise ValueError(f"reduce_nd: unknown aggregate {agg!r}")
    if per_row == 0 or size == 0:
        return np.zeros(out_shape, dtype)
    ufunc = np.maximum if agg == "max" else np.minimum
    if dtype.kind == "b":
        start = agg == "min"
    elif dtype.kind == "f":
        start = -np.inf if agg == "max" else np.inf
    else:
        info = np.iinfo(dtype)
        start = info.min if agg == "max" else info.max
    out = np.full(size, start, dtype)
    with np.errstate(invalid="ignore"):  # a NaN wins, as in NumPy's max and min
        ufunc.at(out, rows, values.astype(dtype, copy=False))
        count = np.bincount(rows, minlength=size) if rows.size else np.zeros(size, np.int64)
        partial = count < per_row  # an absent entry (a zero) takes part
        out[partial] = ufunc(out[partial], np.zeros(1, dtype))
    return out.reshape(out_shape)


def contract_nd(tile, labels: Sequence[str], dense: np.ndarray, d_labels: Sequence[str],
                out_labels: Sequence[str], dtype, entries: bool = False):
    """``SUM`` of ``tile[labels] * dense[d_labels]`` into ``out_labels`` (see the module
    docstring): ``tile`` a ``CooTile``; the labels ``dense`` shares with it are its columns
    (summed, or kept as a batch), each other label of ``dense`` is kept. NumPy's ``einsum`` of the densified tile
    where ``dense`` is finite. ``entries``: the output's elements over the tile's occupied rows
    only, as (coordinates in ``out_labels``' order, an (ndim, n) int64 array; values), not the
    dense output (a matrix output the plan makes sparse: ``R[a,b] = SUM(T[a,b,c] * x[c])`` of
    a 10^6 x 10^6 x 4 ``T`` of 5 entries is 5 entries, not 7.3 TiB).

    >>> from tensordb.storage.sparse import CooTile
    >>> t = CooTile((2, 3, 4), np.array([[0, 1, 1], [0, 0, 2], [3, 1, 1]]),
    ...             np.array([1.0, 2.0, -5.0]))
    >>> d = np.arange(8.0).reshape(4, 2)
    >>> contract_nd(t, "abc", d, "ck", "ka", np.float64).tolist()
    [[6.0, -6.0], [7.0, -9.0]]
    """
    import scipy.sparse as sp
    dtype = np.dtype(dtype)
    labels, d_labels, out_labels = list(labels), list(d_labels), list(out_labels)
    shape = dict(zip(labels, tile.shape))
    shape.update(zip(d_labels, dense.shape))
    shared = [l for l in labels if l in d_labels]
    kept = [l for l in labels if l in out_labels]
    free = [l for l in d_labels if l not in labels]
    rows_n = math.prod(shape[l] for l in kept)
    cols_n = math.prod(shape[l] for l in shared)
    f_n = math.prod(shape[l] for l in free)
    values = np.asarray(tile.values).astype(dtype, copy=False)
    coords = tile.coords
    rows, _ = group_ids([coords[labels.index(l)] for l in kept], [shape[l] for l in kept],
                        values.size)
    cols, _ = group_ids([coords[labels.index(l)] for l in shared], [shape[l] for l in shared],
                        values.size)
    occupied, local = np.unique(rows, return_inverse=True)  # CSR over the occupied rows only
    S = sp.csr_array((values, (local.reshape(-1), cols)), shape=(occupied.size, cols_n))
    S.sum_duplicates()  # a label of the tile alone, not kept: summed here
    D = np.transpose(np.asarray(dense), [d_labels.index(l) for l in shared + free])
    D = np.ascontiguousarray(D, dtype).reshape(cols_n, f_n)
    if entries:
        with np.errstate(invalid="ignore", over="ignore"):
            prod = np.asarray(S @ D, dtype).reshape(-1)
        local = local.reshape(-1)
        first = np.unique(local, return_index=True)[1]  # an entry of each occupied row
        at = {l: np.repeat(np.asarray(coords[labels.index(l)], np.int64)[first], f_n)
              for l in kept}
        free_at = np.unravel_index(np.arange(f_n), tuple(shape[l] for l in free)) if free \
            else ()
        at.update({l: np.tile(np.asarray(c, np.int64), occupied.size)
                   for l, c in zip(free, free_at)})
        return np.stack([at[l] for l in out_labels]).reshape(len(out_labels), -1), prod
    out = np.zeros((rows_n, f_n), dtype)
    if occupied.size:
        with np.errstate(invalid="ignore", over="ignore"):
            out[occupied] = np.asarray(S @ D, dtype)
    res = out.reshape(tuple(shape[l] for l in kept + free))
    order = [(kept + free).index(l) for l in out_labels]
    return np.ascontiguousarray(res.transpose(order)) if order != list(range(len(order))) else res


def reduce_nd_csr(tile, labels: Sequence[str], out_labels: Sequence[str], agg: str, dtype):
    """``reduce_nd`` into a matrix (two ``out_labels``) as a scipy CSR array: an element only
    where the tile has an entry over it (the others are the 0 every absent entry is; one
    whose MAX or MIN meets an absent entry takes that 0 in).

    >>> from tensordb.storage.sparse import CooTile
    >>> t = CooTile((2, 3, 4), np.array([[0, 1, 1], [0, 0, 2], [3, 1, 1]]),
    ...             np.array([1.0, 2.0, -5.0]))
    >>> reduce_nd_csr(t, "abc", "ca", "min", np.float64).toarray().tolist()
    [[0.0, 0.0], [0.0, -5.0], [0.0, 0.0], [0.0, 0.0]]
    """
    import scipy.sparse as sp
    dtype = np.dtype(dtype)
    labels, out_labels = list(labels), list(out_labels)
    shape = tuple(int(n) for n in tile.shape)
    r_d, c_d = labels.index(out_labels[0]), labels.index(out_labels[1])
    out_shape = (shape[r_d], shape[c_d])
    per_el = math.prod(n for d, n in enumerate(shape) if d not in (r_d, c_d))
    values = np.asarray(tile.values).astype(dtype, copy=False)
    if not values.size:
        return sp.csr_array(out_shape, dtype=dtype)
    pairs = np.stack([np.asarray(tile.coords[r_d], np.int64),
                      np.asarray(tile.coords[c_d], np.int64)], axis=1)
    uniq, acc = _grouped(pairs, values, agg, per_el, dtype)
    return sp.csr_array((acc, (uniq[:, 0], uniq[:, 1])), shape=out_shape)


def _grouped(keys: np.ndarray, values: np.ndarray, agg: str, per_el: int, dtype):
    """(the distinct rows of ``keys`` in C order, the ``agg`` of each one's ``values``), each
    group of ``per_el`` elements of which the absent ones are 0: a MAX or MIN with fewer entries
    than that takes the 0 in; a SUM of bools is their OR, as np.einsum's."""
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    n = len(uniq)
    with np.errstate(invalid="ignore", over="ignore"):
        if agg == "sum":
            if dtype.kind == "b":
                acc = np.zeros(n, bool)
                acc[inv[values != 0]] = True
            else:
                acc = np.zeros(n, dtype)
                np.add.at(acc, inv, values)
        elif agg in ("max", "min"):
            ufunc = np.maximum if agg == "max" else np.minimum
            acc = values[np.unique(inv, return_index=True)[1]].copy()  # each group's first
            ufunc.at(acc, inv, values)
            partial = np.bincount(inv, minlength=n) < per_el
            acc[partial] = ufunc(acc[partial], np.zeros(1, dtype))
        else:
            raise ValueError(f"unknown aggregate {agg!r}")
    return uniq, acc


def reduce_nd_coo(tile, labels: Sequence[str], out_labels: Sequence[str], agg: str, dtype):
    """``reduce_nd`` into a sparse output of any rank but a matrix's (``out_labels``, at least
    one) as a ``CooTile`` in C order: an element only where the tile has an entry over it, as
    ``reduce_nd_csr`` (``deg[i] = SUM(G[i,j])`` of a 10^10-row hypersparse G is its occupied
    rows, not 80 GB).

    >>> from tensordb.storage.sparse import CooTile
    >>> t = CooTile((2, 3, 4), np.array([[0, 1, 1], [0, 0, 2], [3, 1, 1]]),
    ...             np.array([1.0, 2.0, -5.0]))
    >>> r = reduce_nd_coo(t, "abc", "a", "sum", np.float64)
    >>> r.shape, r.coords.tolist(), r.values.tolist()
    ((2,), [[0, 1]], [1.0, -3.0])
    """
    from ..storage.sparse_coo import CooTile
    dtype = np.dtype(dtype)
    labels, out_labels = list(labels), list(out_labels)
    shape = tuple(int(n) for n in tile.shape)
    kept = [labels.index(l) for l in out_labels]
    out_shape = tuple(shape[d] for d in kept)
    per_el = math.prod(n for d, n in enumerate(shape) if d not in kept)
    values = np.asarray(tile.values).astype(dtype, copy=False)
    if not values.size:
        return CooTile(out_shape, np.zeros((len(kept), 0), np.int64), values[:0])
    keys = np.stack([np.asarray(tile.coords[d], np.int64) for d in kept], axis=1)
    uniq, acc = _grouped(keys, values, agg, per_el, dtype)  # C order of the kept coordinates
    return CooTile(out_shape, np.ascontiguousarray(uniq.T), acc)
