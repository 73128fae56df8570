"""Elementwise joins of sparse tensors of rank 3 and more (``storage.sparse.CooTile``) on their
entries, never densified (the ``spjoin`` kernel on rank-3-or-higher operands; the matrix case
is exec/semiring.py ``spjoin``):

- two sparse operands (fill 0) over the output's labels, in any order: ``T * U``, ``T + U``,
  ``T - U``. Each operand's entries get one id per coordinate tuple in the output's label
  order (``_joint_ids``: C-order linear ids, or the occupied tuples numbered jointly where the
  extent passes int64); the join is computed on the union of the ids (``np.union1d``, each
  side's values placed by ``searchsorted``, 0 where it is absent) with NumPy's own ufunc, so
  ``NaN * 0`` is NaN and ``inf - inf`` NaN exactly where NumPy's are. A product's entries
  outside the intersection are 0 unless a NaN or inf met the other's 0: they are dropped
  where 0, as the writer drops every 0.
- a sparse operand ``T`` times a dense one ``D`` over some of ``T``'s labels, known to hold no
  NaN or inf (the plan's rule, plan/sparse_nd_rules.py): ``T``'s pattern, each value times
  ``D`` gathered at its coordinates. An absent entry of ``T`` times a negative ``D`` is
  ``-0.0`` in NumPy; it is left absent (0.0) here, as the matrix kernels do.

The result is a ``CooTile`` in C order where the plan says the output is sparse
(``KernelChoice.out_format`` 'coo'), else the dense array.

``contract_coo`` is the ``spmm`` of two sparse tensors of rank 3 or more (both known finite),
``SUM(T[a,b,c] * U[a,c,k])``: each matricized on its entries, ``T`` as (its kept labels, the
shared ones), ``U`` as (the shared ones, its others), the shared ids numbered jointly over the
occupied ones (a kept shared label, a batch, is in both: the product is block-diagonal in it
for free); one scipy SpGEMM, scattered into the dense output.

>>> import numpy as np
>>> from tensordb.storage.sparse import CooTile
>>> t = CooTile((2, 3, 4), np.array([[0, 1], [0, 2], [3, 1]]), np.array([1.0, 2.0]))
>>> u = CooTile((2, 3, 4), np.array([[1, 1], [2, 0], [1, 0]]), np.array([5.0, 7.0]))
>>> r = join_entries("+", [t, u], ["abc", "abc"], "abc", np.float64)
>>> r.coords.tolist(), r.values.tolist()
([[0, 1, 1], [0, 0, 2], [3, 0, 1]], [1.0, 7.0, 7.0])
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..storage.sparse import CooTile
from .sparse_nd import group_ids

__all__ = ["join_entries", "spjoin_nd", "contract_coo"]

_UFUNCS = {"*": np.multiply, "+": np.add, "-": np.subtract}


def spjoin_nd(op, choice, args: list, arg_shapes, out_shape) -> object:
    """One call of an ``spjoin`` kernel whose output has rank 3 or more (see the module
    docstring): ``args`` the operands' boxes (a ``CooTile``, or a dense array: a dense stored
    tile of a sparse tensor, or the dense partner; None: an absent box, all 0) of
    ``arg_shapes``."""
    ins = op.in_dtypes or (op.dtype,) * len(args)
    # an absent box is no entries, never its zeros (a box of a 10^15-element tensor)
    args = [_no_entries(s, d) if a is None else a for a, s, d in zip(args, arg_shapes, ins)]
    join = op.join
    first = join.args[0].index
    order = [first, 1 - first]
    labels = [op.inputs[k].labels for k in order]
    sparse = order.index(choice.sparse) if choice.gathers else None
    res = join_entries(join.fn, [args[k] for k in order], labels, op.out_labels, op.dtype,
                       tuple(out_shape), sparse)
    if choice.out_format == "dense":
        return _dense(res)
    return res


def join_entries(fn: str, args: Sequence, labels: Sequence[Sequence[str]],
                 out_labels: Sequence[str], dtype, out_shape=None,
                 gather: int | None = None) -> CooTile:
    """``args[0] fn args[1]`` (``fn`` '*', '+' or '-'; each a ``CooTile`` or a dense array, of
    ``labels``) into ``out_labels`` as a ``CooTile`` in C order. ``gather``: the operand whose
    entries the product keeps, the other (dense, over some of the output's labels) gathered at
    them; else both are read as their entries (a dense box's stored ones)."""
    dtype = np.dtype(dtype)
    ufunc = _UFUNCS[fn]
    labels = [list(ls) for ls in labels]
    out_labels = list(out_labels)
    if out_shape is None:
        ext = {}
        for a, ls in zip(args, labels):
            ext.update(zip(ls, a.shape))
        out_shape = tuple(int(ext[l]) for l in out_labels)
    if gather is None:
        (ca, va), (cb, vb) = (_entries(a, ls, out_labels) for a, ls in zip(args, labels))
        ids, decode = _joint_ids([ca, cb], out_shape)
        ia, ib = ids[:va.size], ids[va.size:]
        union = np.union1d(ia, ib)
        x = np.zeros(union.size, dtype)
        y = np.zeros(union.size, dtype)
        x[np.searchsorted(union, ia)] = va.astype(dtype, copy=False)
        y[np.searchsorted(union, ib)] = vb.astype(dtype, copy=False)
        with np.errstate(all="ignore"):
            vals = np.asarray(ufunc(x, y)).astype(dtype, copy=False)
        if fn == "*":  # outside the intersection: 0 (left absent, a -0.0 too) but a NaN's
            both = np.zeros(union.size, bool)
            both[np.searchsorted(union, np.intersect1d(ia, ib, assume_unique=True))] = True
            if vals.dtype.kind == "f":
                both |= np.isnan(vals)
            union, vals = union[both], vals[both]
        coords = decode(union)
    else:
        s = gather
        if fn != "*":
            raise ValueError("join_entries: a dense partner is gathered by '*' only")
        cs, vs = _entries(args[s], labels[s], out_labels)
        dense = np.asarray(args[1 - s])
        at = tuple(cs[out_labels.index(l)] for l in labels[1 - s])
        dv = dense[at] if at else np.broadcast_to(dense, vs.shape)
        pair = (vs.astype(dtype, copy=False), np.asarray(dv).astype(dtype, copy=False))
        with np.errstate(all="ignore"):
            vals = np.asarray(ufunc(*(pair if s == 0 else pair[::-1]))).astype(dtype, copy=False)
        ids, _ = group_ids(cs, out_shape, vs.size)
        sort = np.argsort(ids, kind="stable")
        coords = cs[:, sort] if cs.size else cs
        vals = vals[sort]
    keep = _stored(vals)
    if not keep.all():
        coords, vals = coords[:, keep], vals[keep]
    return CooTile(tuple(int(n) for n in out_shape), np.ascontiguousarray(coords, np.int64), vals)


def _no_entries(shape, dtype) -> CooTile:
    return CooTile(tuple(int(n) for n in shape), np.zeros((len(shape), 0), np.int64),
                   np.zeros(0, dtype))


def _stored(vals: np.ndarray) -> np.ndarray:
    """The values the storage keeps: not 0 (a -0.0 is kept, as ``stored_entries`` keeps it)."""
    keep = vals != 0
    if vals.dtype.kind == "f":
        keep |= np.signbit(vals)
        keep |= np.isnan(vals)
    return keep


def _entries(a, labels: list, out_labels: list) -> tuple[np.ndarray, np.ndarray]:
    """(coordinates in ``out_labels``' order, an (ndim, n) int64 array; values) of operand ``a``:
    a ``CooTile``'s entries, or a dense box's stored ones (not 0; -0.0 and NaN kept)."""
    perm = [labels.index(l) for l in out_labels]
    if isinstance(a, CooTile):
        coords = np.asarray(a.coords, np.int64).reshape(len(labels), -1)
        return coords[perm], np.asarray(a.values)
    a = np.asarray(a)
    idx = np.nonzero(_stored(a))
    coords = np.stack([np.asarray(i, np.int64) for i in idx]) if idx else np.zeros((0, 0), np.int64)
    return coords.reshape(len(labels), -1)[perm], a[idx]


def _joint_ids(coords: Sequence[np.ndarray], shape: Sequence[int]):
    """(one int64 id per entry of every ``coords`` ((ndim, n) arrays along ``shape``), ordered
    as C order is; a function from sorted ids back to (ndim, n) coordinates): C-order linear
    ids where the extent's size fits int64 (``sparse_nd.group_ids``), else the occupied tuples
    of all of them numbered together."""
    both = np.concatenate(coords, axis=1)
    ids, size = group_ids(list(both), shape, both.shape[1])
    if size == math.prod(int(n) for n in shape) and len(shape):
        def decode(u):
            return np.stack(np.unravel_index(u, tuple(shape))).astype(np.int64) \
                if u.size else np.zeros((len(shape), 0), np.int64)
        return ids, decode
    uniq = np.unique(both.T, axis=0) if both.shape[1] else np.zeros((0, len(shape)), np.int64)
    return ids, lambda u: np.ascontiguousarray(uniq[u].T)


def _dense(tile: CooTile) -> np.ndarray:
    out = np.zeros(tile.shape, np.asarray(tile.values).dtype)
    if tile.values.size:
        out[tuple(tile.coords)] = tile.values
    return out


def contract_coo(S: CooTile, s_labels, D: CooTile, d_labels, out_labels, dtype,
                 entries: bool = False):
    """``SUM`` of ``S[s_labels] * D[d_labels]`` into the dense ``out_labels`` (see the module
    docstring): every label of ``D`` that ``S`` lacks is kept; a label of ``S`` alone and not
    kept is summed by scipy's duplicate sum. ``entries``: the product's entries only, as
    (coordinates in ``out_labels``' order, an (ndim, n) int64 array; values), nothing made in
    proportion to the output's extents (``D`` may be a matrix: ``SUM(T[a,b,c] * U[c,k])``).

    >>> s = CooTile((2, 3, 2), np.array([[0, 1], [2, 0], [1, 1]]), np.array([2.0, 3.0]))
    >>> d = CooTile((2, 2, 2), np.array([[0, 1, 1], [1, 1, 0], [0, 1, 1]]),
    ...             np.array([5.0, 7.0, 11.0]))
    >>> contract_coo(s, "abc", d, "ack", "abk", np.float64)[1, 0].tolist()
    [0.0, 21.0]
    """
    import scipy.sparse as sp
    dtype = np.dtype(dtype)
    s_labels, d_labels, out_labels = list(s_labels), list(d_labels), list(out_labels)
    ext = dict(zip(s_labels, S.shape))
    ext.update(zip(d_labels, D.shape))
    shared = [l for l in s_labels if l in d_labels]
    kept = [l for l in s_labels if l in out_labels]
    free = [l for l in d_labels if l not in s_labels]
    sc = np.asarray(S.coords, np.int64).reshape(len(s_labels), -1)
    dc = np.asarray(D.coords, np.int64).reshape(len(d_labels), -1)
    ns, nd = sc.shape[1], dc.shape[1]
    out_shape = tuple(int(ext[l]) for l in kept + free)
    rows_n = math.prod(int(ext[l]) for l in kept)
    f_n = math.prod(int(ext[l]) for l in free)
    out = None if entries else np.zeros((rows_n, f_n), dtype)
    if ns and nd and rows_n and f_n:
        joint, _ = _joint_ids([sc[[s_labels.index(l) for l in shared]],
                               dc[[d_labels.index(l) for l in shared]]],
                              [ext[l] for l in shared])
        mids, mid = np.unique(joint, return_inverse=True)  # the occupied shared ids only
        mid = mid.reshape(-1)
        rows, _ = group_ids([sc[s_labels.index(l)] for l in kept], [ext[l] for l in kept], ns)
        occupied, r_first, r_local = np.unique(rows, return_index=True, return_inverse=True)
        cols, _ = group_ids([dc[d_labels.index(l)] for l in free], [ext[l] for l in free], nd)
        fcols, c_first, c_local = np.unique(cols, return_index=True, return_inverse=True)
        A = sp.csr_array((np.asarray(S.values).astype(dtype, copy=False),
                          (r_local.reshape(-1), mid[:ns])), shape=(occupied.size, mids.size))
        B = sp.csr_array((np.asarray(D.values).astype(dtype, copy=False),
                          (mid[ns:], c_local.reshape(-1))), shape=(mids.size, fcols.size))
        with np.errstate(invalid="ignore", over="ignore"):
            C = (A @ B).tocoo()
        if entries:  # each occupied row's and column's coordinates, from one of its entries
            at = {l: sc[s_labels.index(l)][r_first][C.row] for l in kept}
            at.update({l: dc[d_labels.index(l)][c_first][C.col] for l in free})
            return np.stack([at[l] for l in out_labels]).reshape(len(out_labels), -1), \
                np.asarray(C.data, dtype)
        out[occupied[C.row], fcols[C.col]] = np.asarray(C.data, dtype)
    if entries:
        return np.zeros((len(out_labels), 0), np.int64), np.zeros(0, dtype)
    res = out.reshape(out_shape)
    order = [(kept + free).index(l) for l in out_labels]
    return np.ascontiguousarray(res.transpose(order)) if order != list(range(len(order))) else res
