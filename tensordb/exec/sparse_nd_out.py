"""The sparse output of an ``spmm`` whose sparse operand has rank 3 or more, where the plan says
the output (not a matrix) is sparse (``KernelChoice.out_format`` 'coo', plan.kernel.with_output):
a ``CooTile`` of the product's entries in C order, never the dense output.
``R[a,b,k] = SUM(T[a,b,c] * U[c,k])`` of a 10^5-cubed ``T`` of 1,000 entries has at most
1,000 x 4 entries, not a 2.9 TiB array.

- the other operand dense (or a sparse box that holds a NaN or inf, or whose absent entries are
  not 0, read dense): ``sparse_nd.contract_nd`` over ``T``'s occupied rows, each row's elements
  kept (a 0 dropped, a ``-0.0`` kept, as the writer stores them);
- the other operand sparse with fill 0, both known finite (the plan knows the other one; ``T``'s
  values are tested here, as ``_spgemm_coo`` does): one scipy SpGEMM on the entries of both
  (``sparse_nd_join.contract_coo``), the other read as its entries even where it is a matrix;
- the sparse operand's box read dense (a stored dense tile): NumPy's einsum, its nonzeros kept.

>>> from tensordb.plan.ir import EinOp
>>> from tensordb.plan.kernel import KernelChoice
>>> op = EinOp.contraction("R", "abk", [("T", "abc"), ("U", "ck")], {"a": 2, "b": 3, "c": 4,
...                        "k": 2})
>>> t = CooTile((2, 3, 4), np.array([[0, 1, 1], [0, 0, 2], [3, 1, 1]]), np.array([1.0, 2.0, -5.0]))
>>> r = spmm_nd_coo(op, 0, [t, np.arange(8.0).reshape(4, 2)], (2, 3, 2), np.float64)
>>> r.coords.tolist(), r.values.tolist()
([[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 2, 2], [0, 1, 0, 1, 0, 1]], [6.0, 7.0, 4.0, 6.0, -10.0, -15.0])
"""
from __future__ import annotations

import numpy as np

from ..storage.boxes import RowGather
from ..storage.sparse import CooTile, densify, entries, fill_of, is_sparse, stacked
from .sparse_nd import contract_nd, group_ids
from .sparse_nd_join import contract_coo

__all__ = ["spmm_nd_coo", "coo_of", "combine_coo"]


def coo_of(shape, coords: np.ndarray, values: np.ndarray, dtype) -> CooTile:
    """A ``CooTile`` of ``shape`` from distinct ``coords`` (ndim x n) and ``values`` in any
    order: sorted into C order, the values that are 0 (not ``-0.0``) left out."""
    values = np.asarray(values, dtype)
    coords = np.asarray(coords, np.int64).reshape(len(shape), -1)
    keep = values != 0
    if values.dtype.kind == "f":
        keep |= np.signbit(values) | np.isnan(values)
    if not keep.all():
        coords, values = coords[:, keep], values[keep]
    if values.size > 1 and len(shape):
        order = np.lexsort(coords[::-1])
        coords, values = coords[:, order], values[order]
    return CooTile(tuple(int(n) for n in shape), np.ascontiguousarray(coords), values)


def _entries_tile(D) -> CooTile | None:
    """A sparse box of fill 0 (a ``CooTile``, CSR, row slabs) as a ``CooTile``; None for a
    dense one or one whose absent entries are not 0."""
    D = D.take() if isinstance(D, RowGather) else D
    if not is_sparse(D) or fill_of(D) != 0:
        return None
    if isinstance(D, CooTile):
        return D
    csr = stacked(D).tocsr()
    lin, vals = entries(csr)
    return CooTile(tuple(csr.shape), np.stack(np.unravel_index(lin, csr.shape)).astype(np.int64),
                   np.asarray(vals))


def spmm_nd_coo(op, k: int, args: list, out_shape, dtype) -> CooTile:
    """One call of an ``spmm`` (sparse operand ``k``, of rank 3 or more) into COO output tiles
    of ``out_shape`` (see the module docstring); an absent box (None) gives no entries."""
    dtype = np.dtype(dtype)
    S, D = args[k], args[1 - k]
    s_labels, d_labels = list(op.inputs[k].labels), list(op.inputs[1 - k].labels)
    out_labels = list(op.out_labels)
    if S is None or D is None:
        return coo_of(out_shape, np.zeros((len(out_shape), 0), np.int64), np.zeros(0), dtype)
    if isinstance(S, CooTile):
        E = _entries_tile(D) if is_sparse(D) or isinstance(D, RowGather) else None
        if E is not None and (dtype.kind != "f" or bool(np.isfinite(S.values).all())):
            coords, values = contract_coo(S, s_labels, E, d_labels, out_labels, dtype,
                                          entries=True)
            return coo_of(out_shape, coords, values, dtype)
        D = D.take() if isinstance(D, RowGather) else D
        D = np.asarray(densify(stacked(D)) if is_sparse(D) else D)
        coords, values = contract_nd(S, s_labels, D, d_labels, out_labels, dtype, entries=True)
        return coo_of(out_shape, coords, values, dtype)
    # the sparse operand's box was read dense: NumPy's einsum, its nonzeros
    D = D.take() if isinstance(D, RowGather) else D
    D = np.asarray(densify(stacked(D)) if is_sparse(D) else D)
    S = np.asarray(densify(stacked(S)) if is_sparse(S) else S)
    names = {l: chr(97 + n) for n, l in enumerate(dict.fromkeys(s_labels + d_labels))}
    eq = "".join(names[l] for l in s_labels) + "," + "".join(names[l] for l in d_labels) + \
        "->" + "".join(names[l] for l in out_labels)
    with np.errstate(invalid="ignore", over="ignore"):
        res = np.asarray(np.einsum(eq, S.astype(dtype, copy=False), D.astype(dtype, copy=False)),
                         dtype).reshape(tuple(out_shape))
    nz = np.nonzero(res if dtype.kind != "f" else (res != 0) | np.signbit(res) | np.isnan(res))
    return coo_of(out_shape, np.stack(nz) if nz else np.zeros((0, 0), np.int64), res[nz], dtype)


def combine_coo(ufunc, acc: CooTile, part: CooTile) -> CooTile:
    """``ufunc`` (the SUM's add, MAX's maximum, MIN's minimum) of two partial results of one
    COO output tile (the contracted label split over calls) on the union of their entries:
    both where both hold one, else the one with the other's absent 0; nothing made in
    proportion to the tile's extents (``group_ids`` numbers the coordinates, compressing them
    where the tile's element count passes int64).

    >>> a = CooTile((2, 3, 4), np.array([[0, 1], [1, 2], [3, 0]]), np.array([1.0, 2.0]))
    >>> b = CooTile((2, 3, 4), np.array([[1, 1], [0, 2], [0, 0]]), np.array([5.0, 7.0]))
    >>> r = combine_coo(np.add, a, b)
    >>> r.coords.tolist(), r.values.tolist()
    ([[0, 1, 1], [1, 0, 2], [3, 0, 0]], [1.0, 5.0, 9.0])
    """
    dtype = np.result_type(acc.values, part.values)
    coords = np.concatenate([np.asarray(acc.coords, np.int64).reshape(acc.ndim, -1),
                             np.asarray(part.coords, np.int64).reshape(part.ndim, -1)], axis=1)
    values = np.concatenate([acc.values.astype(dtype, copy=False),
                             part.values.astype(dtype, copy=False)])
    if not values.size:
        return CooTile(acc.shape, coords, values)
    ids, _ = group_ids(list(coords), acc.shape, values.size)
    uniq, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    out = values[first].copy()
    twice = np.bincount(inv, minlength=uniq.size) > 1
    with np.errstate(invalid="ignore", over="ignore"):
        later = np.ones(values.size, bool)
        later[first] = False  # each id's second entry (a partial holds an id once)
        out[inv[later]] = ufunc(out[inv[later]], values[later])
        if ufunc is not np.add:  # one side absent: its 0 takes part in a MAX or MIN
            out[~twice] = ufunc(out[~twice], np.zeros(1, dtype))
    return coo_of(acc.shape, coords[:, first], out, dtype)
