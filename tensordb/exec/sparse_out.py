"""Sparse output tiles: what a sparse kernel returns where the plan says its output is sparse
(``KernelChoice.out_format``, plan.kernel.with_output), and how partial results of one output
tile are combined when the contracted label is split, without densifying.

A sparse output tile is a scipy CSR array (fill 0) or a ``storage.sparse.Filled`` (a CSR array
and the value of its absent entries: min-plus's +inf). The writer stores it from its entries
(``TensorWriter.write_tile``); a dense kernel that reads it densifies it (``dense_args``).

>>> import numpy as np, scipy.sparse as sp
>>> a = sp.csr_array(np.array([[1.0, 0.0], [0.0, 2.0]]))
>>> b = sp.csr_array(np.array([[0.0, 3.0], [0.0, 4.0]]))
>>> combine_sparse("sum", a, b).toarray().tolist()
[[1.0, 3.0], [0.0, 6.0]]
"""
from __future__ import annotations

import numpy as np

from ..plan.aggregates import AGGREGATES
from ..storage.sparse import CooTile, Filled, densify, entries, fill_of, is_sparse

__all__ = ["csr_output", "combine_sparse", "sorted_product"]


def csr_output(csr, labels, out_labels, dtype, fill: float = 0.0):
    """A sparse kernel's matrix result ``csr`` (scipy, labels ``labels``) as the output tile the
    plan asked for (``KernelChoice.out_format`` 'csr'): transposed to ``out_labels``, in
    ``dtype``, CSR with sorted indices; a ``Filled`` when its absent entries are ``fill``, not 0.
    The writer stores it from its entries (``TensorWriter.write_tile``)."""
    if tuple(labels) != tuple(out_labels):
        csr = csr.T
    csr = csr.tocsr()
    if csr.dtype != dtype:
        csr = csr.astype(dtype)
    if not csr.has_canonical_format:
        csr.sum_duplicates()
    return Filled(csr, fill) if fill else csr


def sorted_product(A, B):
    """``A @ B`` of two sparse matrices as a CSR array whose rows' columns are sorted, without
    sorting them: scipy's product leaves each row's columns in the order it met them, and sorting
    them (``sort_indices``) cost 60% of the product on an R-MAT graph's G @ G. The product of
    the transposes (``B.T @ A.T``, its rows as unsorted) turned to CSC by one counting pass
    (``tocsc``, which scatters the rows in order: every column's rows sorted) is ``A @ B``'s
    CSR, sorted; each entry's sum runs over the same terms in the same order as in ``A @ B``.

    >>> import numpy as np, scipy.sparse as sp
    >>> A = sp.csr_array(np.array([[0.0, 2.0], [1.0, 3.0]]))
    >>> C = sorted_product(A, A)
    >>> C.toarray().tolist(), C.has_canonical_format
    ([[2.0, 6.0], [3.0, 11.0]], True)
    """
    import scipy.sparse as sp
    t = (B.T.tocsr() @ A.T.tocsr()).tocsc()  # (A @ B).T's CSC is A @ B's CSR
    csr = sp.csr_array((t.data, t.indices, t.indptr), shape=(A.shape[0], B.shape[1]))
    csr.has_canonical_format = True  # sorted (tocsc), and a product has no repeats
    return csr


def combine_sparse(agg: str, acc, part):
    """``acc`` AGG ``part`` where either is a sparse tile (a sparse kernel's partial results of
    one output tile, the contracted label split): returns the new accumulator. Two sparse tiles
    of one fill are combined on their entries, never densified: the union of the entries, each
    the AGG of both where both hold it and of it and the other's fill where one does (a sum of
    fill 0 adds the partials; min-plus's partials, fill +inf, take their MIN). Otherwise both
    are densified with their fills (``acc`` made a private array) and combined in place."""
    ufunc = AGGREGATES[agg].ufunc
    if isinstance(acc, CooTile) and isinstance(part, CooTile):  # COO outputs: on the entries
        from .sparse_nd_out import combine_coo
        return combine_coo(ufunc, acc, part)
    if not (is_sparse(acc) and is_sparse(part)) or isinstance(acc, CooTile) or \
            isinstance(part, CooTile) or not _same(fill_of(acc), fill_of(part)):
        acc = densify(acc) if is_sparse(acc) else acc
        ufunc(acc, densify(part), out=acc)
        return acc
    fill = fill_of(acc)
    a = acc.csr if isinstance(acc, Filled) else acc
    b = part.csr if isinstance(part, Filled) else part
    if agg == "sum" and fill == 0 and a.dtype.kind in "iuf":  # scipy's add, linear
        return csr_output(a + b, (0, 1), (0, 1), a.dtype)
    (la, va), (lb, vb) = entries(a), entries(b)
    lin = np.concatenate([la, lb])
    vals = np.concatenate([va, np.asarray(vb, va.dtype)])
    order = np.argsort(lin, kind="stable")
    lin, vals = lin[order], vals[order]
    if lin.size:
        starts = np.flatnonzero(np.r_[True, lin[1:] != lin[:-1]])
        red = ufunc.reduceat(vals, starts)
        single = np.diff(np.r_[starts, lin.size]) == 1
        if single.any() and fill == fill:  # one side absent: its fill takes part
            with np.errstate(all="ignore"):
                red[single] = ufunc(red[single], np.asarray(fill).astype(red.dtype))
        lin = lin[starts]
    else:
        red = vals
    rows, cols = np.divmod(lin, a.shape[1])
    indptr = np.zeros(a.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=indptr[1:])
    import scipy.sparse as sp
    csr = sp.csr_array((red.astype(a.dtype, copy=False), cols, indptr), shape=a.shape)
    csr.has_sorted_indices = True
    return Filled(csr, fill) if fill else csr


def _same(x: float, y: float) -> bool:
    return x == y or (x != x and y != y)
