"""Sparse tiles on the GPU executor: CSR tiles kept on the devices as cupyx.scipy.sparse
matrices, and the kernels that have a cupyx form run on them.

A Load of a box whose stored tiles are all CSR (``storage.sparse.read_sparse_box``, fill 0,
float32 or float64) copies the box's three arrays (values, column indices, row pointers) host ->
device and makes them one ``csr_matrix`` (``load``): the copy counted is those arrays' bytes,
never the dense box's. The array module's sparse module is ``sparse_module(xp)``: CuPy's
``cupyx.scipy.sparse``, or a stand-in's own (tests/fakecupy), held by the executor as
``DeviceTiles.xsparse``. The kernels (``call``, by ``plan.kernel.device_method``, which EXPLAIN
names: ``device_describe``):

- ``spmm``: ``S @ D`` (cuSPARSE's SpMM, or SpMV for one column) and ``S @ T`` (SpGEMM; its result
  CSR where the plan's ``out_format`` says so, else densified);
- ``spreduce`` SUM: ``S.sum(axis)`` over rows or columns;
- ``sddmm``: by its definition, the dot products of U's and V's rows at M's stored coordinates
  times M's values (cupyx has no SDDMM);
- ``spjoin``: ``A.multiply(B)``, ``A + B``, ``A - B``;
- ``masked``: ``(X @ Y).multiply(M).sum()`` (a dense X or Y made CSR on the device).

Every other consumer of a device CSR tile (a dense kernel, a semiring or masked product, MAX or
MIN over it, an Assemble, a dense accumulator) gets it densified on the device (``dense``), so
its answer is the one it had before. Where the values are not what the sparse form assumes
(a NaN or inf in a SpGEMM, an SDDMM or a product join, dot products that may overflow), the kernel
returns None and the tile is computed the dense way, as the CPU's kernels do. Sparse output
tiles come back to the host as scipy CSR (``download``) and the writer stores them as the CPU's.

Tested without a GPU on the stand-in for CuPy (tests/fakecupy: scipy.sparse under cupyx's
names, holding the stand-in's device arrays); run on an NVIDIA H200 with CuPy 14.2 on
2026-11-27 (the gpu tests and the sparse corpus on executor="gpu": docs/benchmarks.md, "Sparse
tiles on a GPU").
"""
from __future__ import annotations

import math

import numpy as np

from ..plan.aggregates import AGGREGATES
from ..plan.device_kernel import DEVICE_SPARSE_DTYPES, device_method
from ..plan.sparse_rules import mask_orientation
from ..storage.sparse import (CooTile, Filled, RowSlabs, is_sparse, read_sparse_box, stacked,
                              tile_nbytes)
from .sizes import sparse_box_bytes

__all__ = ["sparse_module", "is_device_sparse", "tile_bytes", "load", "load_bytes", "upload",
           "download",
           "dense", "call", "combine"]

CHUNK = 1 << 22  # elements of one SDDMM step's gathered rows

_MODULES: dict[int, tuple] = {}  # id(xp) -> (xp, its sparse module or None)


def sparse_module(xp):
    """The sparse module of array module ``xp``: ``cupyx.scipy.sparse`` for CuPy, a
    stand-in's own (its ``cupyx_sparse``), None for NumPy or a module with neither (then a
    sparse box is densified at its Load, as before)."""
    if xp is np:
        return None
    kept = _MODULES.get(id(xp))
    if kept is not None and kept[0] is xp:
        return kept[1]
    mod = None
    if getattr(xp, "__name__", "") == "cupy":
        try:
            import cupyx.scipy.sparse as mod
        except ImportError:  # a CuPy without cupyx: the tiles go dense
            mod = None
    if mod is None:
        mod = getattr(xp, "cupyx_sparse", None)
    _MODULES[id(xp)] = (xp, mod)
    return mod


def is_device_sparse(x) -> bool:
    """Whether ``x`` is a sparse matrix on a device (not a host tile, not a dense array)."""
    return getattr(x, "format", None) in ("csr", "csc", "coo") and \
        not isinstance(x, np.ndarray) and not is_sparse(x)


def tile_bytes(x) -> int:
    """The bytes a device tile takes: a dense array's, or a sparse one's three arrays (which
    cupyx's matrices do not report as ``nbytes``)."""
    if is_device_sparse(x):
        return tile_nbytes(x)
    return int(getattr(x, "nbytes", 0))


def load_bytes(plan, task) -> int | None:
    """What Load ``task`` will copy to a device when its box stays CSR there (``load``'s
    conditions, a sparse module aside): its CSR bytes (``runtime.sparse_box_bytes``); None where
    the box is read dense (the admission then reserves the dense box, ``budget.working_bytes``)."""
    csr = sparse_box_bytes(plan, task)  # None: not a box of sparse tiles (a LET's, a dense one)
    meta = plan.readers[task.tensor].meta
    if csr is None or meta.fill != 0 or np.dtype(meta.dtype).name not in DEVICE_SPARSE_DTYPES:
        return None
    return csr


def upload(box, xp, xsparse):
    """A host CSR tile (scipy, or a ``RowSlabs`` stacked) as a device ``csr_matrix``: its three
    arrays copied host -> device, nothing densified."""
    csr = box.tocsr() if isinstance(box, RowSlabs) else box
    if getattr(csr, "format", None) != "csr":
        csr = csr.tocsr()
    return xsparse.csr_matrix((xp.asarray(csr.data), xp.asarray(csr.indices),
                               xp.asarray(csr.indptr)), shape=tuple(csr.shape))


def download(x):
    """A device sparse tile as a host scipy CSR array (its three arrays copied)."""
    import scipy.sparse as sp
    if x.format != "csr":
        x = x.tocsr()
    host = x.get()
    out = sp.csr_array((host.data, host.indices, host.indptr), shape=host.shape, copy=False)
    return out


def load(task, reader, xp, xsparse):
    """The box of Load ``task`` as a device CSR matrix where every stored tile it overlaps is
    CSR of fill 0 and a dtype cuSPARSE computes in (``DEVICE_SPARSE_DTYPES``); else None (the
    box is read dense, as before)."""
    meta = reader.meta
    if xsparse is None or not reader.has_sparse or meta.fill != 0 or \
            np.dtype(meta.dtype).name not in DEVICE_SPARSE_DTYPES:
        return None
    box = read_sparse_box(reader, task.starts, task.stops)
    if isinstance(box, CooTile) and box.ndim == 2:  # hypersparse COO tiles: CSR of the box
        box = stacked(box)
    if box is None or isinstance(box, Filled) or not (isinstance(box, RowSlabs) or
                                                      getattr(box, "format", None) == "csr"):
        return None
    return upload(box, xp, xsparse)


def dense(x, xp):
    """``x`` as a dense device array (a device sparse tile densified there, its stored values
    placed, not added into zeros: a stored -0.0 stays -0.0 as on the CPU); anything else as it
    is."""
    if not is_device_sparse(x):
        return x
    coo = x.tocoo()
    out = xp.zeros(tuple(x.shape), dtype=x.dtype)
    if coo.nnz:
        out[coo.row, coo.col] = coo.data
    return out


# -- the kernels -------------------------------------------------------------------------------

def call(spec, args: list, out_shape):
    """One kernel call of ``spec`` (exec/kernels.py ``KernelSpec``) whose arguments hold a device
    sparse tile: (its result, args) where a cupyx kernel computes it (``device_method``), else
    (None, args with every sparse tile densified): the caller runs the dense kernel."""
    if not any(is_device_sparse(a) for a in args):
        return None, args
    xp = spec.xp
    method = device_method(spec.op, spec.choice)
    if method is not None:
        with np.errstate(all="ignore"):
            res = _KERNELS[method](spec.op, spec.choice, args, out_shape, xp)
        if res is not None:
            return res, args
    return None, [dense(a, xp) for a in args]


def _to_output(res, labels, out_labels, xp):
    order = [list(labels).index(l) for l in out_labels]
    if order != list(range(len(order))):
        res = res.transpose(order)
    return xp.ascontiguousarray(res)


def _csr(m, transpose: bool = False):
    m = m.T if transpose else m
    return m if m.format == "csr" else m.tocsr()


def _sparse_out(m, labels, out_labels, dtype, xp):
    """A sparse kernel's matrix result as the output tile the plan asked for: CSR (sorted, in
    ``dtype``, transposed to ``out_labels``)."""
    m = _csr(m, tuple(labels) != tuple(out_labels))
    if m.dtype != dtype:
        m = m.astype(dtype)
    m.sum_duplicates()  # sorts each row's columns, as the writer's CSR wants
    return m


def _finite(xp, *values) -> bool:
    return all(bool(xp.isfinite(v).all()) for v in values if v.size)


def _spmm(op, choice, args, out_shape, xp):
    """``S @ D`` (SpMM; SpMV for one column) or ``S @ T`` (SpGEMM): sparse_kernels.spmm's
    forms on the device."""
    if len(args) != 2:
        return None
    dtype = np.dtype(op.dtype)
    k = choice.sparse
    S, D = args[k], args[1 - k]
    if not is_device_sparse(S):  # a box read (partly) dense: the dense kernel
        return None
    if D is None:
        return xp.zeros(out_shape, dtype=dtype)
    s_labels, d_labels = op.inputs[k].labels, op.inputs[1 - k].labels
    (j,) = [l for l in s_labels if l in d_labels]
    (i,) = [l for l in s_labels if l != j]
    rest = [l for l in d_labels if l != j]
    S = _csr(S, s_labels != (i, j))
    S = S.astype(dtype) if S.dtype != dtype else S
    if is_device_sparse(D):  # SpGEMM
        D = D.astype(dtype) if D.dtype != dtype else D
        if len(rest) != 1 or not _finite(xp, S.data, D.data):
            return None  # an inf or NaN among the entries: NumPy's dense product (0 * inf)
        B = _csr(D, d_labels != (j, rest[0]))
        P = S @ B
        if choice.out_format == "csr":
            return _sparse_out(P, [i] + rest, op.out_labels, dtype, xp)
        return _to_output(dense(_csr(P), xp), [i] + rest, op.out_labels, xp)
    D = xp.asarray(D)
    D = D if D.dtype == dtype else D.astype(dtype)
    axis = d_labels.index(j)
    rest_shape = tuple(D.shape[d_labels.index(l)] for l in rest)
    width = math.prod(rest_shape)
    if S.nnz == 0 or width == 0 or 0 in S.shape:
        return xp.zeros(out_shape, dtype=dtype)
    D2 = xp.ascontiguousarray(xp.moveaxis(D, axis, 0).reshape(D.shape[axis], width))
    res = S @ (D2[:, 0] if width == 1 else D2)  # SpMV : SpMM
    res = xp.asarray(res).reshape((S.shape[0],) + rest_shape)
    return _to_output(res.astype(dtype, copy=False), [i] + rest, op.out_labels, xp)


def _spreduce(op, choice, args, out_shape, xp):
    """SUM of a device CSR tile over its rows, its columns or both."""
    dtype = np.dtype(op.dtype)
    S = args[0]
    if S is None:
        return xp.zeros(out_shape, dtype=dtype)
    if not is_device_sparse(S):
        return None
    if S.nnz == 0 or 0 in S.shape:
        return xp.zeros(out_shape, dtype=dtype)
    labels = op.inputs[0].labels
    if not op.out_labels:
        res = S.data.sum(dtype=dtype)
    else:
        res = S.sum(axis=1 - labels.index(op.out_labels[0]))
    return xp.asarray(res).astype(dtype, copy=False).reshape(out_shape)


def _sddmm(op, choice, args, out_shape, xp):
    """``SUM_r(M[a,b] * U[a,r] * V[b,r])``: the dot products of U's and V's rows at M's stored
    coordinates (in steps of ``CHUNK`` gathered elements) times M's values."""
    dtype = np.dtype(op.dtype)
    k = choice.sparse
    a, b, r, x, y = mask_orientation(op, k)
    M, U, V = args[k], args[x], args[y]
    if not is_device_sparse(M) or U is None or V is None:
        return None
    M = _csr(M)
    M = M.astype(dtype) if M.dtype != dtype else M
    U, V = (xp.asarray(dense(t, xp)).astype(dtype, copy=False) for t in (U, V))
    U = U if op.inputs[x].labels == (a, r) else U.T
    V = V if op.inputs[y].labels == (b, r) else V.T
    if not _finite(xp, M.data, U, V) or _may_overflow(dtype, U, V, xp):
        return None  # NumPy's M * (U @ V.T) is NaN where M is 0 and a product is inf
    coo = M.tocoo()  # M's entries in its CSR order
    rows, cols = coo.row, coo.col
    vals = xp.empty(rows.size, dtype=dtype)
    step = max(1, CHUNK // max(U.shape[1], 1))
    for lo in range(0, rows.size, step):
        hi = min(rows.size, lo + step)
        vals[lo:hi] = (U[rows[lo:hi]] * V[cols[lo:hi]]).sum(axis=1)
    vals *= coo.data
    if choice.out_format == "csr":  # M's structure
        out = type(M)((vals, M.indices.copy(), M.indptr.copy()), shape=tuple(M.shape))
        return _sparse_out(out, [a, b], op.out_labels, dtype, xp)
    res = xp.zeros(tuple(M.shape), dtype=dtype)
    res[rows, cols] = vals
    return _to_output(res, [a, b], op.out_labels, xp)


def _may_overflow(dtype, U, V, xp, inner: int | None = None) -> bool:
    """``semiring.may_overflow`` on the device: whether a sum of ``inner`` (U's columns)
    products of an element of U and one of V can pass the dtype's largest value."""
    if U.size == 0 or V.size == 0:
        return False
    inner = U.shape[1] if inner is None else inner
    bound = float(inner) * float(xp.abs(U).max()) * float(xp.abs(V).max())
    return not bound <= float(np.finfo(dtype).max)


def _spjoin(op, choice, args, out_shape, xp):
    """``A * B`` (the intersection of their entries), ``A + B``, ``A - B`` (the union)."""
    dtype = np.dtype(op.dtype)
    if not all(is_device_sparse(t) for t in args):
        return None
    a, b = (_csr(t, o.labels != op.out_labels) for t, o in zip(args, op.inputs))
    a, b = (t.astype(dtype) if t.dtype != dtype else t for t in (a, b))
    fn = op.join.fn
    if op.join.args[0].index != 0:
        a, b = b, a
    if fn == "*":
        if not _finite(xp, a.data, b.data):
            return None  # inf * an absent 0 is NaN in NumPy's product
        res = a.multiply(b)
    else:
        res = a + b if fn == "+" else a - b
    if choice.out_format == "csr":
        return _sparse_out(res, (0, 1), (0, 1), dtype, xp)
    return xp.ascontiguousarray(dense(_csr(res), xp))


def _masked(op, choice, args, out_shape, xp):
    """``SUM(M[a,b] * X[a,c] * Y[c,b])``: the sum over M's entries of M times ``X @ Y`` (the
    SpGEMM unmasked, then M's entries of it: the CPU's form without GraphBLAS)."""
    dtype = np.dtype(op.dtype)
    k = choice.sparse
    a, b, c, x, y = mask_orientation(op, k)
    M, X, Y = args[k], args[x], args[y]
    xsparse = sparse_module(xp)
    if not is_device_sparse(M) or X is None or Y is None or xsparse is None:
        return None
    X, Y = (_csr(t, op.inputs[n].labels != want) if is_device_sparse(t) else
            xsparse.csr_matrix(xp.ascontiguousarray(t if op.inputs[n].labels == want else t.T))
            for t, n, want in ((X, x, (a, c)), (Y, y, (c, b))))
    M, X, Y = (t.astype(dtype) if t.dtype != dtype else t for t in (_csr(M), X, Y))
    if not _finite(xp, M.data, X.data, Y.data) or \
            _may_overflow(dtype, X.data, Y.data, xp, X.shape[1]):
        return None  # X @ Y inf where M is 0: NumPy's sum is NaN there
    value = (X @ Y).multiply(M).sum()
    return xp.asarray(value).astype(dtype, copy=False).reshape(out_shape)


_KERNELS = {"spmm": _spmm, "spreduce": _spreduce, "sddmm": _sddmm, "spjoin": _spjoin,
            "masked": _masked}


def combine(agg: str, acc, part, xp):
    """``acc`` AGG ``part`` where either is a device sparse tile (partials of one output tile):
    two CSR tiles summed stay CSR (cupyx's ``+``); anything else is densified and combined in
    place. Returns the new accumulator (``acc`` is never changed in place while sparse)."""
    if agg == "sum" and is_device_sparse(acc) and is_device_sparse(part) and \
            acc.dtype == part.dtype:
        res = _csr(acc + part)
        res.sum_duplicates()
        return res
    acc = dense(acc, xp) if is_device_sparse(acc) else acc
    getattr(xp, AGGREGATES[agg].ufunc.__name__)(acc, dense(part, xp), out=acc)
    return acc
