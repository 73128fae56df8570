"""Kernels on sparse tiles (scipy.sparse), and the densifying of sparse tiles for every other kernel.

A Load of a box of a stored matrix whose overlapping tiles are all sparse yields a scipy CSR array
(``storage.sparse.read_sparse_box``), or a ``RowSlabs`` of views where the box spans several
whole-width row tiles (stacked into one CSR array by every kernel but ``spmm``, which computes
tile by tile into the output's rows), which only the ``spmm`` kernel reads as it is; any other
kernel, an Assemble or a GPU gets it densified (``dense_args``), so every other path computes as
before. The ``spmm`` kernel (``physical.choice.KernelChoice`` method ``spmm``, chosen when the
plan is lowered) is a SUM of the product of a sparse matrix ``S`` (labels ``i, j``, in either
order) with an operand ``D`` that holds ``j`` and labels kept in the output: ``D`` is laid out
``(j, rest)`` and ``S @ D`` is one scipy call (SpMM; SpMV when ``rest`` is empty; SpGEMM when
``D`` arrives sparse too), its result dense and reordered to the output's labels, or, for
SpGEMM where the plan says its output is sparse (``KernelChoice.out_format``, from the estimated
nonzeros), a CSR tile the writer stores as it is (``csr_output``): GraphBLAS's ``plus_times``
product where the plan chose it (``plan.kernel.spgemm_graphblas``: EXPLAIN's ``spmm x0 sparse
(GraphBLAS plus_times)``; ``semiring.plus_times_csr``), else scipy's, its rows sorted by a
counting pass (``sparse_out.sorted_product``). SpMV and SpMM call scipy's ``csr_matvec(s)``
straight into the output's rows (``_direct``). The choice is made only where
``D`` is known to hold no NaN or inf, where skipping absent entries is exact. Partial results of
one output tile (the contracted label split) are combined sparse (``combine_sparse``).

>>> import numpy as np, scipy.sparse as sp
>>> from tensordb.plan.ir import EinOp
>>> from tensordb.physical.choice import choose_kernel
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 3, "j": 4, "k": 2})
>>> c = choose_kernel(op, sparse=(0,), finite=(True, True))
>>> c.describe()
'spmm x0 sparse'
>>> S = sp.csr_array(np.eye(3, 4)); D = np.arange(8.0).reshape(4, 2)
>>> spmm(op, c, [S, D], (3, 2)).tolist()
[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
"""
from __future__ import annotations

import math

import numpy as np

from ..physical.choice import SPARSE_METHODS
from ..plan.sparse_rules import have_graphblas
from ..storage.boxes import RowGather
from ..storage.sparse import CooTile, RowSlabs, densify, is_sparse, stacked
from .graphcache import source_of
from .sparse_bands import banded
from .sparse_nd import contract_nd, reduce_nd, reduce_nd_coo, reduce_nd_csr
from .sparse_out import combine_sparse, csr_output, sorted_product

__all__ = ["spmm", "spreduce", "dense_args", "sparse_call", "combine_sparse", "csr_output",
           "SPARSE_METHODS"]


def sparse_call(op, choice, args: list, arg_shapes, out_shape, out=None, sink=None,
                check=None) -> np.ndarray:
    """One call of the sparse kernel ``choice.method`` names (on the CPU; a GPU densifies).
    ``out``: the output tile's buffer (its file's pages), which ``spmm`` computes into in row
    slabs, handing each finished slab to ``sink`` (``KernelSpec``); the others return a new
    array, which the caller copies there. Given ``check``, a large call is made in row bands of
    its sparse operand with ``check(fraction)`` between them (exec/sparse_bands.py: a Ctrl-C
    stops it within a band); a small one is one call."""
    memo: dict = {}  # what the bands of one call share (a SpGEMM's right operand in GraphBLAS)

    def one(args, arg_shapes, out_shape, out, sink):
        return _one_call(op, choice, args, arg_shapes, out_shape, out, sink, memo)
    return banded(one, op, choice, args, arg_shapes, out_shape, out, sink, check)


def _one_call(op, choice, args: list, arg_shapes, out_shape, out=None, sink=None, memo=None):
    if choice.method == "spmm" and len(args) == 2 and (args[0] is None) != (args[1] is None):
        res = _absent_times_nonfinite(op, args, arg_shapes, out_shape, choice)
        if res is not None:
            return res
    if choice.method == "spmm":
        return spmm(op, choice, args, out_shape, out, sink, memo)
    if choice.method == "spreduce":  # a COO box (rank 3 or more, hypersparse) read as it is
        return spreduce(op, choice, [a if isinstance(a, CooTile) else stacked(a) for a in args],
                        out_shape)
    if choice.method == "spjoin" and len(op.out_labels) > 2:  # rank 3+: on the entries
        from .sparse_nd_join import spjoin_nd
        return spjoin_nd(op, choice, args, arg_shapes, out_shape)
    if choice.method == "spjoin":  # a hypersparse box or output: on the entries, no row
        from .sparse_hyper import on_entries, spjoin_matrix  # pointers over the box's rows
        if on_entries(choice, args):
            return spjoin_matrix(op, choice, args, arg_shapes, out_shape)
    # a box over several CSR row tiles, or a matrix's COO box, as one CSR array; a gather's
    # rows taken
    args = [a.take() if isinstance(a, RowGather) else stacked(a) for a in args]
    from . import semiring
    return getattr(semiring, choice.method)(op, choice, args, arg_shapes, out_shape)


def _absent_times_nonfinite(op, args: list, arg_shapes, out_shape, choice=None):
    """The product of an absent tile (zeros) with a tile holding NaN or inf: NumPy's answer
    (0 * inf is NaN): of two matrices, on the present one's entries (exec/sparse_nonfinite.py:
    NaN rows or columns, as the output ``choice.out_format`` says), else on the densified
    operands; None where the present tile is finite (the product is then 0)."""
    dtype = np.dtype(op.dtype)
    k = 0 if args[0] is not None else 1
    t = args[k].take() if isinstance(args[k], RowGather) else args[k]
    if dtype.kind != "f" or np.dtype(t.dtype).kind != "f":
        return None
    t = t.tocsr() if isinstance(t, RowSlabs) else t
    values = t.values if isinstance(t, CooTile) else t.data if is_sparse(t) else np.asarray(t)
    if bool(np.isfinite(values).all()):
        return None
    labels = [o.labels for o in op.inputs]
    shared = [l for l in labels[0] if l in labels[1]]
    if choice is not None and (is_sparse(t) or isinstance(t, CooTile)) and len(shared) == 1 \
            and all(len(ls) == 2 for ls in labels) and len(op.out_labels) == 2:
        from .sparse_nonfinite import spgemm_nonfinite
        (j,) = shared
        (a,), (b,) = ([l for l in ls if l != j] for ls in labels)
        c = _as_coo(t)
        sides = [(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype))] * 2
        order = [labels[0].index(a), labels[0].index(j)] if k == 0 else \
            [labels[1].index(j), labels[1].index(b)]
        sides[k] = (c.coords[order[0]], c.coords[order[1]], c.values)
        shape = (arg_shapes[0][labels[0].index(a)], arg_shapes[1][labels[1].index(b)])
        ri, ci, data = spgemm_nonfinite(sides[0], sides[1], shape, dtype)
        return _spgemm_out(op, choice, ri, ci, data, shape, [a, b], out_shape, dtype)
    dense = [None, None]
    dense[k] = np.asarray(densify(t) if is_sparse(t) else t, dtype)
    dense[1 - k] = np.zeros(arg_shapes[1 - k], dtype)
    names = {l: chr(97 + n) for n, l in
             enumerate(dict.fromkeys(op.inputs[0].labels + op.inputs[1].labels))}
    eq = ",".join("".join(names[l] for l in o.labels) for o in op.inputs) + "->" + \
        "".join(names[l] for l in op.out_labels)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(np.einsum(eq, *dense), dtype).reshape(out_shape)


def dense_args(args: list) -> list:
    """``args`` with any sparse tile densified and any gather's rows taken (a kernel that reads
    only dense arrays)."""
    if all(a is None or isinstance(a, np.ndarray) for a in args):
        return args
    return [densify(a) if a is not None and is_sparse(a) else
            a.take() if isinstance(a, RowGather) else a for a in args]


def spmm(op, choice, args: list, out_shape, out=None, sink=None, memo=None) -> np.ndarray:
    """One call of a ``spmm`` kernel (see the module docstring): ``args`` in operand order, an
    absent tile None (the product is then 0). Given ``out`` (C-contiguous, the output's dtype,
    its labels the sparse matrix's rows then the others in ``D``'s order), the product is
    computed into it in slabs of rows (``_into``), each handed to ``sink`` when finished.
    ``memo``: a dict the row bands of one call share (``sparse_call``)."""
    dtype = np.dtype(op.dtype)
    k = choice.sparse
    s_labels, d_labels = op.inputs[k].labels, op.inputs[1 - k].labels
    if len(s_labels) > 2:  # rank 3 or more (plan.kernel.spmm_nd_operand): sparse_nd.py
        return _spmm_nd(op, choice, k, args, out_shape, dtype)
    (j,) = [l for l in s_labels if l in d_labels]
    (i,) = [l for l in s_labels if l != j]
    S, D = args[k], args[1 - k]
    if S is None or D is None or (len(args) == 3 and args[2] is None):
        return np.zeros(out_shape, dtype)
    S = S.take() if isinstance(S, RowGather) else S
    if len(args) == 2 and isinstance(D, CooTile) and D.ndim > 2:
        # a matrix times a sparse tensor of rank 3 or more (known finite): on the entries
        # where the matrix is finite too, else (its inf * 0 is NaN) the tensor densified
        if _finite_data(dtype, _as_coo(S)):
            return _coo_product(op, choice, k, S, D, out_shape, dtype)
        D = densify(D)
    if len(args) == 2 and is_sparse(D) and (isinstance(S, CooTile) or isinstance(D, CooTile)):
        # SpGEMM of a hypersparse box: on the entries, over the occupied row, shared and
        # column ids only (no row pointers over a COO box's rows: 80 GB for G^T G of a
        # 10^10-row G)
        res = _spgemm_coo(op, choice, S, D, out_shape, dtype)
        if res is not None:
            return res
    if isinstance(S, CooTile):  # a hypersparse matrix's box
        if len(args) == 2 and not is_sparse(D) and not isinstance(D, RowGather):
            # CSR over its occupied rows only, scattered into the output (sparse_nd.py): no
            # row pointers for the rows it does not hold
            return _spmm_nd(op, choice, k, args, out_shape, dtype)
        S = stacked(S)  # CSR over its rows
    if isinstance(D, RowGather) and d_labels.index(j) != 0:  # read through S's columns: j first
        D = D.take()
    D = stacked(D)
    if len(args) == 3:  # GRAD's scaled scatter-add: S's entries times the vector g on j
        S = stacked(S)
        g = args[2].take() if isinstance(args[2], RowGather) else stacked(args[2])
        g = np.asarray(densify(g) if is_sparse(g) else g).astype(dtype)
        if not is_sparse(S):
            S = np.asarray(S, dtype) * (g[None, :] if s_labels.index(j) == 1 else g[:, None])
        else:
            S = _scaled(S, g, s_labels.index(j), dtype)
    if isinstance(S, RowSlabs):  # several stored row tiles: slab by slab into ``out``
        if out is None or s_labels != (i, j) or S.dtype != dtype or is_sparse(D):
            S = S.tocsr()
        else:
            return _slabs_into(op, S, D, d_labels, i, j, out, sink)
    rest = [l for l in d_labels if l != j]
    axis = d_labels.index(j)
    if not is_sparse(S):  # the box read was (partly) dense: plain BLAS on the dense tiles
        D = densify(D)
        res = np.tensordot(np.asarray(S, dtype), np.asarray(D, dtype),
                           axes=(s_labels.index(j), axis))
        return _to_output(res, [i] + rest, op.out_labels)
    # the stored boxes whose GraphBLAS copies the graph cache keeps (SpGEMM), in their own
    # orientation, and whether the product reads them transposed
    src = [(source_of(S) if S.dtype == dtype else None, s_labels != (i, j))]
    if S.dtype != dtype:
        S = S.astype(dtype)
    S = S if s_labels == (i, j) else S.T
    if is_sparse(D) and not _finite_data(dtype, S, D):
        # one holding inf or NaN (a stored one, or an overflowed intermediate): NumPy's
        # product, whose inf * 0 is NaN, on the entries (exec/sparse_nonfinite.py)
        if len(rest) == 1:
            from .sparse_nonfinite import spgemm_nonfinite
            sc, dc = S.tocoo(), stacked(D).tocoo()
            dj, dk = (dc.row, dc.col) if axis == 0 else (dc.col, dc.row)
            shape = (S.shape[0], dc.shape[1 - axis])
            ri, ci, data = spgemm_nonfinite((sc.row, sc.col, sc.data), (dj, dk, dc.data),
                                            shape, dtype)
            return _spgemm_out(op, choice, ri, ci, data, shape, [i] + rest, out_shape, dtype)
        res = np.tensordot(densify(S).astype(dtype, copy=False),
                           np.asarray(densify(D), dtype), axes=(1, axis))
        return _to_output(res, [i] + rest, op.out_labels)
    if is_sparse(D):  # both sparse and both finite: SpGEMM
        src.append((source_of(D) if D.dtype == dtype else None, False))
        D = D.astype(dtype) if D.dtype != dtype else D
        if not rest:
            return _to_output(np.asarray((S @ densify(D))).reshape(-1), [i], op.out_labels)
        src[1] = (src[1][0], d_labels != (j, rest[0]))
        B = D if d_labels == (j, rest[0]) else D.T
        if choice.out_format == "csr":  # the plan's estimate says sparse: CSR, never dense
            return csr_output(_spgemm(S, B, dtype, choice.semiring == "plus_times", src, memo),
                              [i] + rest, op.out_labels, dtype)
        return _to_output((S @ B).toarray(), [i] + rest, op.out_labels)
    if isinstance(D, RowGather) and S.format == "csc":  # GRAD's scatter-add: slabs of j
        res = _gathered_slabs(S, D, dtype)
        if res is not None:
            return _to_output(res.reshape((S.shape[0],) + D.shape[1:]), [i] + rest,
                              op.out_labels)
    if isinstance(D, RowGather):  # S @ base[rows] as (S's columns renumbered) @ base
        S, D2 = _through_rows(S, D, dtype)
        rest_shape = D.shape[1:]
    else:
        D = np.asarray(D)
        if D.dtype != dtype:
            D = D.astype(dtype)
        rest_shape = tuple(D.shape[d_labels.index(l)] for l in rest)
        D2 = np.moveaxis(D, axis, 0).reshape(D.shape[axis], math.prod(rest_shape))
    if out is not None and [i] + rest == list(op.out_labels) and out.dtype == dtype and \
            out.flags.c_contiguous and out.shape == (S.shape[0],) + rest_shape and \
            S.format == "csr":
        # scipy's product copies a D that is not C-contiguous (a column slab of a stored
        # matrix): once here, not once per slab of rows
        return _into(S, np.ascontiguousarray(D2), out, sink)
    res = np.asarray(S @ D2).reshape((S.shape[0],) + rest_shape)
    return _to_output(res, [i] + rest, op.out_labels)


def _finite_data(dtype, *tiles) -> bool:
    """Whether every stored value of these sparse tiles is finite (always, for integers)."""
    if np.dtype(dtype).kind not in "fc":
        return True
    with np.errstate(all="ignore"):
        return all(bool(np.isfinite(t.values if isinstance(t, CooTile) else t.data).all())
                   for t in tiles)


def _gathered_slabs(S, D: RowGather, dtype):
    """``S @ D`` for a CSC ``S`` (the transpose of a CSR matrix whose rows are j: GRAD's
    scatter-add of a gather) and a gather ``D = base[rows]``: scipy's own ``csc_matvecs`` (what
    ``S @ D`` calls) over column slabs of S in order, each slab's gathered rows taken while it
    runs (``SLAB_BYTES`` of them: in the cache), every slab adding into the same output. The
    products are added in the same order as one call over the whole gathered copy: the same
    bits, and the copy never made. None where the dtypes are not one scipy kernel's (the caller
    then renumbers S's columns, ``_through_rows``)."""
    base = D.base.reshape(D.base.shape[0], -1)
    data = S.data
    if not (S.indptr.dtype == S.indices.dtype and data.dtype == dtype and dtype.kind in "fc"):
        return None
    try:
        from scipy.sparse import _sparsetools as st
    except ImportError:  # a scipy without it: the renumbered product
        return None
    n_i, n_j = S.shape
    width = base.shape[1]
    out = np.zeros((n_i, width), dtype)
    step = max(1, SLAB_BYTES // max(1, width * dtype.itemsize))
    for lo in range(0, n_j, step):
        hi = min(n_j, lo + step)
        if S.indptr[hi] == S.indptr[lo]:
            continue
        X = np.take(base, D.rows[lo:hi], axis=0)
        X = X if X.dtype == dtype else X.astype(dtype)
        st.csc_matvecs(n_i, hi - lo, width, S.indptr[lo:hi + 1], S.indices, data, X.reshape(-1),
                       out.reshape(-1))
    return out


def _through_rows(S, D: RowGather, dtype):
    """``S @ D`` for a gather ``D = base[rows]`` (its label j first) as ``E @ base``: E is S
    with column j renumbered ``rows[j]`` (the product of S with the one-hot rows of
    ``rows``), so the gathered rows are never made. E is CSR with each row's entries in S's
    order of j (a CSC S is made CSR by scipy's stable conversion: its rows' entries in
    ascending j), so each output row adds the same products in the same order as S's own
    product with the gathered rows (csr_matvecs and csc_matvecs alike add into the output row
    in that order): the same bits. Returns (E, base as a matrix of the output's dtype)."""
    import scipy.sparse as sp
    S = S.tocsr() if S.format != "csr" else S
    base = D.base.reshape(D.base.shape[0], -1)
    base = base if base.dtype == dtype else base.astype(dtype)
    itype = S.indptr.dtype if base.shape[0] <= np.iinfo(S.indptr.dtype).max else np.int64
    E = sp.csr_array((S.data, D.rows[S.indices].astype(itype, copy=False),
                      S.indptr.astype(itype, copy=False)), shape=(S.shape[0], base.shape[0]),
                     copy=False)
    return E, base


def _spgemm(S, B, dtype, graphblas: bool, sources=None, memo=None):
    """The CSR product of two sparse tiles, rows sorted: GraphBLAS's (its threads) where the
    plan chose it (``plan.kernel.spgemm_graphblas``: EXPLAIN's ``spmm x0 sparse (GraphBLAS
    plus_times)``), else scipy's without a sort (``sorted_product``). ``sources``: for each,
    the stored box it is (or is the transpose of: ``(box, transposed)``) whose GraphBLAS copy
    the graph cache keeps. ``memo`` (a dict the row bands of one call share): a B the graph
    cache does not keep is copied into GraphBLAS once for all of them."""
    if graphblas and dtype.kind in "iuf" and have_graphblas():
        from .semiring import plus_times_csr
        if memo is not None and (sources is None or sources[1][0] is None):
            key = ("gb", id(B.data), id(B.indices), id(B.indptr), B.shape, B.format)
            if key not in memo:
                from .semiring import _gb
                memo.clear()  # (B, its matrix): the arrays named by the key stay alive
                memo[key] = (B, _gb().io.from_scipy_sparse(B if B.format in ("csr", "csc")
                                                           else B.tocsr()))
            B = memo[key][1]
        return plus_times_csr(S, B, sources)
    return sorted_product(S, B)


def _scaled(S, g: np.ndarray, axis: int, dtype):
    """A CSR tile with each entry times ``g`` at its row (``axis`` 0) or column (1): one pass
    over the entries (numpy's product, so a NaN or inf of g reaches only the entries it meets)."""
    import scipy.sparse as sp
    S = sp.csr_array(S)
    with np.errstate(all="ignore"):
        at = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr)) if axis == 0 else S.indices
        data = np.asarray(S.data, dtype) * g[at]
    return sp.csr_array((data, S.indices, S.indptr), shape=S.shape)


def _slabs_into(op, S: RowSlabs, D, d_labels, i, j, out, sink) -> np.ndarray:
    """``spmm`` of a ``RowSlabs`` box into ``out``: each stored tile's rows computed into its
    rows of ``out`` (views of the tiles' entries: nothing stacked), rows no tile holds zeroed."""
    dtype = np.dtype(op.dtype)
    D = np.asarray(D)
    D = D if D.dtype == dtype else D.astype(dtype)
    axis = d_labels.index(j)
    rest = [l for l in d_labels if l != j]
    rest_shape = tuple(D.shape[d_labels.index(l)] for l in rest)
    out_labels = [i] + rest
    if out_labels != list(op.out_labels) or out.dtype != dtype or not out.flags.c_contiguous \
            or out.shape != (S.shape[0],) + rest_shape:
        return spmm_dense(S.tocsr(), D, axis, rest_shape, out_labels, op.out_labels)
    D2 = np.ascontiguousarray(np.moveaxis(D, axis, 0).reshape(D.shape[axis],
                                                              math.prod(rest_shape)))
    o2 = out.reshape(S.shape[0], -1)
    at = 0
    for r0, part in S.parts:
        if r0 > at:  # rows of an absent tile
            o2[at:r0].fill(0)
            if sink is not None:
                sink(o2[at:r0])
        _into(part, D2, o2[r0:r0 + part.shape[0]], sink)
        at = r0 + part.shape[0]
    if at < S.shape[0]:
        o2[at:].fill(0)
        if sink is not None:
            sink(o2[at:])
    return out


def spmm_dense(S, D, axis, rest_shape, labels, out_labels) -> np.ndarray:
    """``S @ D`` (D's label ``axis`` contracted) as a new array in ``out_labels`` order."""
    D2 = np.moveaxis(D, axis, 0).reshape(D.shape[axis], math.prod(rest_shape))
    res = np.asarray(S @ D2).reshape((S.shape[0],) + rest_shape)
    return _to_output(res, labels, out_labels)


SLAB_BYTES = 1 << 20  # the output rows one step of ``_into`` computes: they stay in the cache


def _into(S, D2, out: np.ndarray, sink=None) -> np.ndarray:
    """``S @ D2`` (S a CSR matrix, D2 dense and 2-D) written into ``out`` in slabs of rows of
    about ``SLAB_BYTES``: each slab's product (scipy's) is copied in while it is in the cache
    and handed to ``sink`` there, so the output tile is never made twice in memory nor swept
    again for its statistics."""
    rows = S.shape[0]
    o2 = out.reshape(rows, -1)
    row_bytes = max(1, o2.shape[1] * out.itemsize)
    step = max(1, SLAB_BYTES // row_bytes)
    ptr = S.indptr
    direct = _direct(S, D2, o2)
    if D2.shape[1] == 1:  # SpMV: scipy's matrix-vector product, not its one-column SpMM
        D2 = D2[:, 0]
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        lo, hi = int(ptr[r0]), int(ptr[r1])
        slab = o2[r0:r1]
        if hi == lo:
            slab.fill(0)
        elif direct is not None:
            slab.fill(0)  # scipy's kernels add into their output, as its own product's zeros
            direct(S, r0, r1, D2, slab)
        else:
            part = _csr_rows(S, r0, r1, lo, hi)
            slab[...] = (part @ D2).reshape(slab.shape)
        if sink is not None:
            sink(slab)
    return out


def _direct(S, D2: np.ndarray, o2: np.ndarray):
    """scipy's own product kernel (``csr_matvec``, ``csr_matvecs``: what ``S @ D2`` calls)
    writing into rows of ``o2`` straight from ``S``'s arrays, where every dtype already agrees
    (else None: ``S @ D2`` converts them): no CSR object made for a slab of rows, no result
    made and copied in. The slab's rows read ``S``'s entries through its row pointers, which
    index the whole entry arrays, so nothing is sliced."""
    if not (S.data.dtype == D2.dtype == o2.dtype and S.indptr.dtype == S.indices.dtype and
            D2.flags.c_contiguous and o2.flags.c_contiguous and D2.dtype.kind in "fc"):
        return None
    try:
        from scipy.sparse import _sparsetools as st
    except ImportError:  # a scipy without it: its public product
        return None
    n_col = S.shape[1]
    if D2.shape[1] == 1:
        def matvec(S, r0, r1, x, slab):
            st.csr_matvec(r1 - r0, n_col, S.indptr[r0:r1 + 1], S.indices, S.data, x,
                          slab.reshape(-1))
        return matvec

    def matvecs(S, r0, r1, X, slab):
        st.csr_matvecs(r1 - r0, n_col, X.shape[1], S.indptr[r0:r1 + 1], S.indices, S.data,
                       X.reshape(-1), slab.reshape(-1))
    return matvecs


def _csr_rows(S, r0: int, r1: int, lo: int, hi: int):
    """Rows ``r0:r1`` of CSR ``S`` (whose entries there are ``lo:hi``): views of its entries."""
    import scipy.sparse as sp
    m = sp.csr_array((S.data[lo:hi], S.indices[lo:hi], S.indptr[r0:r1 + 1] - lo),
                     shape=(r1 - r0, S.shape[1]), copy=False)
    m.has_sorted_indices = True
    return m


def _as_coo(t) -> CooTile:
    """A 2-D sparse tile (a ``CooTile``, a CSR box, row slabs) as a ``CooTile``."""
    if isinstance(t, CooTile):
        return t
    c = stacked(t).tocoo()
    return CooTile(tuple(c.shape), np.stack([np.asarray(c.row, np.int64),
                                             np.asarray(c.col, np.int64)]), np.asarray(c.data))


def _spgemm_coo(op, choice, S, D, out_shape, dtype):
    """The product of two sparse matrix tiles, one a hypersparse ``CooTile``, computed over the
    ids its operands occupy (rows, shared, columns: as ``sparse_nd_join.contract_coo``), into
    the output ``choice.out_format`` says (dense, or CSR over the output tile's rows); None
    where it is not a product of two matrices over one label. A NaN or inf meeting an
    absent entry is NumPy's NaN (exec/sparse_nonfinite.py)."""
    import scipy.sparse as sp
    k = choice.sparse
    s_labels, d_labels = op.inputs[k].labels, op.inputs[1 - k].labels
    shared = [l for l in s_labels if l in d_labels]
    if len(s_labels) != 2 or len(d_labels) != 2 or len(shared) != 1:
        return None
    S, D = _as_coo(S), _as_coo(D.take() if isinstance(D, RowGather) else D)
    (j,) = shared
    (i,) = [l for l in s_labels if l != j]
    (f,) = [l for l in d_labels if l != j]
    si, sj = S.coords[s_labels.index(i)], S.coords[s_labels.index(j)]
    dj, df = D.coords[d_labels.index(j)], D.coords[d_labels.index(f)]
    shape = (S.shape[s_labels.index(i)], D.shape[d_labels.index(f)])
    if dtype.kind == "f" and not (np.isfinite(S.values).all() and np.isfinite(D.values).all()):
        # NumPy's inf * 0 where an absent entry meets a non-finite one: on the entries still
        from .sparse_nonfinite import spgemm_nonfinite
        ri, ci, data = spgemm_nonfinite((si, sj, S.values), (dj, df, D.values), shape, dtype)
        return _spgemm_out(op, choice, ri, ci, data, shape, [i, f], out_shape, dtype)
    mids, mid = np.unique(np.concatenate([sj, dj]), return_inverse=True)
    mid = mid.reshape(-1)
    rows, r = np.unique(si, return_inverse=True)
    cols, c = np.unique(df, return_inverse=True)
    A = sp.csr_array((np.asarray(S.values).astype(dtype, copy=False), (r.reshape(-1), mid[:sj.size])),
                     shape=(rows.size, mids.size))
    B = sp.csr_array((np.asarray(D.values).astype(dtype, copy=False), (mid[sj.size:], c.reshape(-1))),
                     shape=(mids.size, cols.size))
    with np.errstate(invalid="ignore", over="ignore"):
        C = (A @ B).tocoo()
    ri, ci, data = rows[C.row], cols[C.col], np.asarray(C.data, dtype)
    return _spgemm_out(op, choice, ri, ci, data, shape, [i, f], out_shape, dtype)


def _spgemm_out(op, choice, ri, ci, data, shape, labels, out_shape, dtype):
    """A SpGEMM's elements (each once) as the output ``choice.out_format`` says."""
    import scipy.sparse as sp
    if choice.out_format == "csr":
        return csr_output(sp.csr_array((data, (ri, ci)), shape=shape), labels, op.out_labels,
                          dtype)
    out = np.zeros(shape, dtype)
    out[ri, ci] = data
    return _to_output(out, labels, op.out_labels).reshape(out_shape)


def _spmm_nd(op, choice, k: int, args: list, out_shape, dtype) -> np.ndarray:
    """An ``spmm`` whose sparse operand has rank 3 or more (or a hypersparse matrix's box): on
    its entries where its box was read as a ``CooTile`` (``sparse_nd.contract_nd``; a matrix
    output the plan makes sparse as CSR of the occupied rows' elements), else NumPy's einsum of
    the dense box."""
    if choice.out_format == "coo":  # an output the plan says is sparse: its entries
        from .sparse_nd_out import spmm_nd_coo
        return spmm_nd_coo(op, k, args, out_shape, dtype)
    S, D = args[k], args[1 - k]
    if S is None or D is None:
        return np.zeros(out_shape, dtype)
    D = D.take() if isinstance(D, RowGather) else D
    if isinstance(S, CooTile) and S.ndim > 2 and (
            (isinstance(D, CooTile) and D.ndim > 1) or (is_sparse(D) and len(D.shape) == 2)):
        # SpGEMM on the entries (a sparse matrix partner too: not densified)
        return _coo_product(op, choice, k, S, D, out_shape, dtype)
    D = np.asarray(densify(stacked(D)) if is_sparse(D) else D)
    s_labels, d_labels = op.inputs[k].labels, op.inputs[1 - k].labels
    if isinstance(S, CooTile):
        if choice.out_format == "csr" and len(op.out_labels) == 2:
            import scipy.sparse as sp
            (r, c), v = contract_nd(S, s_labels, D, d_labels, op.out_labels, dtype, entries=True)
            return csr_output(sp.csr_array((v, (r, c)), shape=tuple(out_shape)),
                              op.out_labels, op.out_labels, dtype)
        return contract_nd(S, s_labels, D, d_labels, op.out_labels, dtype).reshape(out_shape)
    names = {l: chr(97 + n) for n, l in enumerate(dict.fromkeys(s_labels + d_labels))}
    eq = "".join(names[l] for l in s_labels) + "," + "".join(names[l] for l in d_labels) + \
        "->" + "".join(names[l] for l in op.out_labels)
    with np.errstate(invalid="ignore", over="ignore"):
        res = np.einsum(eq, np.asarray(S).astype(dtype, copy=False), D.astype(dtype, copy=False))
    return np.asarray(res, dtype).reshape(out_shape)


def _coo_product(op, choice, k: int, S, D, out_shape, dtype):
    """The SpGEMM of sparse operand ``k`` ``S`` and ``D``, one of rank 3 or more, both finite,
    on their entries (exec/sparse_nd_join.py ``contract_coo``): dense, or CSR where the plan
    says a matrix output is sparse."""
    from .sparse_nd_join import contract_coo
    S, D = (t if isinstance(t, CooTile) else _as_coo(t) for t in (S, D))
    args = (S, op.inputs[k].labels, D, op.inputs[1 - k].labels, op.out_labels, dtype)
    if choice.out_format == "csr" and len(op.out_labels) == 2:
        import scipy.sparse as sp
        (r, c), v = contract_coo(*args, entries=True)
        return csr_output(sp.csr_array((v, (r, c)), shape=tuple(out_shape)),
                          op.out_labels, op.out_labels, dtype)
    return contract_coo(*args).reshape(out_shape)


def _to_output(res: np.ndarray, labels, out_labels) -> np.ndarray:
    order = [labels.index(l) for l in out_labels]
    if order != list(range(len(order))):
        res = res.transpose(order)
    return np.ascontiguousarray(res)


def spreduce(op, choice, args: list, out_shape) -> np.ndarray:
    """One call of a ``spreduce`` kernel: SUM, MAX or MIN of a sparse matrix tile over the
    labels the output lacks; scipy counts the absent entries as zeros (they are)."""
    dtype = np.dtype(op.dtype)
    S = args[0]
    labels = op.inputs[0].labels
    if choice.out_format == "coo":  # a sparse output of rank 1 (or 3 and more): its entries
        if S is None:
            return CooTile(tuple(out_shape), np.zeros((len(out_shape), 0), np.int64),
                           np.zeros(0, dtype))
        if not isinstance(S, CooTile):
            S = S.take() if isinstance(S, RowGather) else stacked(S)
            if not is_sparse(S):
                import scipy.sparse as sp
                S = sp.coo_array(np.asarray(S))
            S = S.tocoo() if hasattr(S, "tocoo") else S
            S = CooTile(tuple(S.shape), np.stack([np.asarray(c, np.int64) for c in S.coords]),
                        np.asarray(S.data))
        return reduce_nd_coo(S, labels, op.out_labels, op.agg, dtype)
    if S is None:
        return np.zeros(out_shape, dtype)
    if isinstance(S, CooTile):  # on its entries, matricized (sparse_nd.py): rank 3 or more,
        # or a hypersparse matrix (no row pointers made)
        if choice.out_format == "csr":  # a matrix output the plan says is sparse
            return csr_output(reduce_nd_csr(S, labels, op.out_labels, op.agg, dtype),
                              op.out_labels, op.out_labels, dtype)
        return reduce_nd(S, labels, op.out_labels, op.agg, dtype).reshape(out_shape)
    if not is_sparse(S):
        S = np.asarray(S)
        if S.ndim > 2:  # the box read dense: NumPy's reduction
            axes = tuple(d for d, l in enumerate(labels) if l not in op.out_labels)
            kept = [l for l in labels if l in op.out_labels]
            red = {"sum": np.sum, "max": np.max, "min": np.min}[op.agg]
            res = red(S, axis=axes, dtype=dtype) if op.agg == "sum" and dtype.kind != "b" \
                else red(S, axis=axes)
            res = np.asarray(res).astype(dtype, copy=False)
            if kept:
                res = res.transpose([kept.index(l) for l in op.out_labels])
            return np.array(res, dtype=dtype).reshape(out_shape)
    axis = None if not op.out_labels else 1 - labels.index(op.out_labels[0])
    if op.agg == "sum":
        res = S.sum(axis=axis, dtype=dtype if dtype.kind != "b" else None)
        if dtype.kind == "b":
            res = np.asarray(res) != 0
    else:
        if 0 in S.shape:  # the binder refuses MAX/MIN over an empty label; a kept one is empty
            return np.zeros(out_shape, dtype)
        res = S.max(axis=axis) if op.agg == "max" else S.min(axis=axis)
        res = res.toarray() if is_sparse(res) else res
    out = np.array(res, dtype=dtype).reshape(out_shape)  # (ascontiguousarray makes 0-d 1-d)
    return out
