"""Semiring, masked and sampled kernels on sparse tiles (python-graphblas, SuiteSparse:GraphBLAS;
numpy where it is one line), chosen when the plan is lowered (plan/sparse_rules.py):

- ``semiring``: ``AGG_j (S[i,j] (+) X[j,...])`` as one GraphBLAS ``mxm`` in the semiring
  (min_plus, max_plus, max_times, min_times) over the stored entries. Min-plus of operands
  whose fill is +inf leaves out what can never win; an output with no pair is +inf, the fill.
  Max-times and min-times of operands whose fill is 0: an output where some pair has an absent
  entry also takes that pair's 0 (a structural count, ``plus_pair``, tells which);
- ``masked``: ``SUM(A[i,j] * B[j,k] * C[k,i])``: ``A @ B`` only where C has entries (GraphBLAS's
  masked ``mxm``), times C there, summed: the triangle count of a graph;
- ``sddmm``: ``SUM_r(M[i,j] * U[i,r] * V[j,r])``: the dot products of U's and V's rows only at
  M's entries, times M's values; 0 elsewhere (an absent M entry times finite values);
- ``spjoin``: ``A * B`` of two sparse tiles on the intersection of their entries (where both
  hold no NaN or inf: an absent 0 times them is 0), ``A + B`` and ``A - B`` on the union
  (scipy.sparse); a tile that arrives dense is computed densely.

Each checks the values of its tile first: where they are not what its rule assumes (NaN, or an
infinity that meets the fill), the tile is computed densely with numpy, as the dense kernel
would, so the answer is numpy's on the densified inputs either way. The output tile is dense,
or CSR (a ``Filled`` one where the semiring's fill is not 0) where the plan says the output is
sparse (``KernelChoice.out_format``, from its estimated nonzeros: plan.kernel.with_output); the
writer stores a CSR tile from its entries, never densified.

>>> import numpy as np, scipy.sparse as sp
>>> from tensordb.plan.ir import EinOp
>>> from tensordb.plan.scalar import parse_join
>>> from tensordb.physical.choice import choose_kernel
>>> from tensordb.storage.sparse import Filled
>>> inf = np.inf
>>> op = EinOp.contraction("P", "ik", [("D", "ij"), ("D", "jk")], {"i": 2, "j": 2, "k": 2},
...                        join=parse_join("x0 + x1"), agg="min")
>>> c = choose_kernel(op, sparse=(0, 1), finite=(False, False), fills=(inf, inf))
>>> c.describe()
'semiring min_plus x0 sparse (GraphBLAS)'
>>> D = Filled(sp.csr_array(np.array([[0.0, 1.0], [2.0, 0.0]])), inf)  # 0 -> 1: 1, 1 -> 0: 2
>>> semiring(op, c, [D, D], [(2, 2), (2, 2)], (2, 2)).tolist()   # two steps: there and back
[[3.0, inf], [inf, 3.0]]
"""
from __future__ import annotations

import math
import threading
from collections import Counter
from contextlib import contextmanager

import numpy as np

from ..plan.sparse_rules import SEMIRINGS, have_graphblas, mask_orientation
from ..sparsity import index_dtype
from ..storage.sparse import Filled, densify, is_sparse
from ..storage.tilestats import count_nonzero
from .graphcache import remember, source_of
from .sparse_out import csr_output

__all__ = ["semiring", "masked", "sddmm", "spjoin", "plus_times_csr", "threads", "CHUNK"]

CHUNK = 1 << 22  # elements of a dense fallback's temporary (a tile whose values rule GraphBLAS out)
_FILLS = {name: fill for name, fill in SEMIRINGS.values()}


_IMPORT = threading.Lock()
_GB = None
# GraphBLAS threads per kernel call: the run's BLAS threads, set by the pool around a run
# (``threads``), so that two workers' calls do not run four OpenMP threads on two cores (their
# spin-waits took the cores from each other). Runs on several connections overlap and end in
# any order: each holds its count here until it ends, the calls use the fewest held (none held:
# GraphBLAS's own setting, every core).
_HELD: Counter = Counter()
_HELD_LOCK = threading.Lock()


@contextmanager
def threads(n: int):
    """Kernel calls made inside use at most ``n`` GraphBLAS threads each (as BLAS threads are
    capped per run: exec/pool.py); ``n`` 0 holds nothing."""
    n = max(0, int(n))
    if n:
        with _HELD_LOCK:
            _HELD[n] += 1
    try:
        yield
    finally:
        if n:
            with _HELD_LOCK:
                _HELD[n] -= 1
                if not _HELD[n]:
                    del _HELD[n]


def _opts() -> dict:
    with _HELD_LOCK:
        n = min(_HELD) if _HELD else 0
    return {"nthreads": n} if n else {}


def _gb():
    """python-graphblas, imported when a semiring kernel first runs (about 1 s), once: its
    submodules load lazily, and two workers importing them at once see a half-made module."""
    global _GB
    if _GB is None:
        with _IMPORT:
            if _GB is None:
                import graphblas as gb
                import graphblas.binary  # noqa: F401
                import graphblas.io  # noqa: F401
                import graphblas.monoid  # noqa: F401
                import graphblas.semiring  # noqa: F401
                for name in ("min_plus", "max_plus", "max_times", "min_times", "plus_pair",
                             "plus_times"):
                    getattr(gb.semiring, name)  # made on first use, too
                gb.binary.times, gb.monoid.plus  # noqa: B018
                _GB = gb
    return _GB


# -- operands -------------------------------------------------------------------------------

def _matrix(x, swap: bool, dtype):
    """A 2-D tile as (scipy CSR or None, its fill, dense array or None), transposed when
    ``swap``, in ``dtype``: a sparse tile stays sparse (its fill: a Filled box's, else 0)."""
    if isinstance(x, Filled) or is_sparse(x):
        fill = x.fill if isinstance(x, Filled) else 0.0
        csr = x.csr if isinstance(x, Filled) else x
        csr = (csr.T if swap else csr).tocsr()
        if csr.dtype != dtype:
            csr = csr.astype(dtype)
        return csr, fill, None
    a = np.asarray(x)
    a = a.T if swap else a
    return None, 0.0, np.ascontiguousarray(a, dtype=dtype)


def _values(csr, dense) -> np.ndarray:
    return np.asarray(csr.data) if csr is not None else dense.reshape(-1)


def _dense(csr, fill, dense) -> np.ndarray:
    return dense if csr is None else densify(Filled(csr, fill) if fill else csr)


def may_overflow(dtype, inner: int, *values) -> bool:
    """Whether a sum of ``inner`` products of one element of each of ``values`` can overflow
    ``dtype`` (a float): then a product computed only at a mask's entries is not NumPy's, whose
    dense product is inf (and its 0 * inf NaN) where the mask is 0. Finite inputs whose dot
    products overflow (values near 1e200) are the case: their bound, the product of the largest
    magnitudes times ``inner``, is over the dtype's largest value."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "fc":
        return False
    bound = float(inner)
    with np.errstate(all="ignore"):
        for v in values:
            if v.size == 0:
                return False
            bound *= float(np.max(np.abs(v)))
    return not bound <= float(np.finfo(dtype).max)


def _to_gb(csr, dense, missing=None, box=None):
    """A GraphBLAS matrix of a tile: its entries, or every element of a dense one but those
    equal to ``missing`` (an absorbing value, +inf in min-plus, that can never win). ``box``:
    the stored box ``csr`` was made from, whose matrix the graph cache keeps (graphcache.py:
    a stored graph is copied into GraphBLAS once, not once a statement)."""
    gb = _gb()
    if csr is not None:
        if box is not None and csr.dtype == box.dtype and box.csr.format == "csr":
            return remember(box, ("gb", csr.dtype.str), lambda: gb.io.from_scipy_sparse(csr),
                            lambda m: m.ss.nbytes)
        return gb.io.from_scipy_sparse(csr)
    if missing is None:
        return gb.Matrix.from_dense(dense)
    # as a bitmap (a copy of the values and the mask): a quarter of the time of gathering the
    # entries for ``from_coo`` (a shortest-path step's 131,072 distances), and not
    # ``from_dense(missing_value=)``, which with float32 kept the infinities and left out 0
    dense = np.ascontiguousarray(dense)
    return gb.Matrix.ss.import_bitmapr(bitmap=(dense != missing).view(np.int8), values=dense,
                                       nrows=dense.shape[0], ncols=dense.shape[1],
                                       take_ownership=False)


def _bad_values(v: np.ndarray, plus: bool, fill) -> bool:
    """Whether values ``v`` rule GraphBLAS out (see ``semiring``)."""
    if v.dtype.kind != "f":
        return False
    return bool(np.isnan(v).any() or (v == -fill).any()) if plus else not np.isfinite(v).all()


def _to_output(res: np.ndarray, labels, out_labels) -> np.ndarray:
    order = [labels.index(l) for l in out_labels]
    if order != list(range(len(order))):
        res = res.transpose(order)
    return np.ascontiguousarray(res)


def _materialize(args, arg_shapes, op):
    """``args`` with an absent tile (None) as the zeros it stands for."""
    dtypes = op.in_dtypes or (op.dtype,) * len(op.inputs)
    return [np.zeros(s, d) if a is None else a for a, s, d in zip(args, arg_shapes, dtypes)]


# -- semiring products ------------------------------------------------------------------------

def semiring(op, choice, args: list, arg_shapes, out_shape) -> np.ndarray:
    """One call of a ``semiring`` kernel (see the module docstring). A sparse tile is handed to
    GraphBLAS as it is stored and transposed there (a descriptor, no copy) when its labels are
    the other way round."""
    dtype = np.dtype(op.dtype)
    name, k = choice.semiring, choice.sparse
    fill = _FILLS[name]
    s_labels, d_labels = op.inputs[k].labels, op.inputs[1 - k].labels
    (j,) = [l for l in s_labels if l in d_labels]
    (i,) = [l for l in s_labels if l != j]
    rest = [l for l in d_labels if l != j]
    S, D = _materialize(args, arg_shapes, op)[k], _materialize(args, arg_shapes, op)[1 - k]
    s = _matrix(S, False, dtype) + (s_labels != (i, j),)   # (csr, fill, dense, transposed)
    if len(d_labels) == 2 and (isinstance(D, Filled) or is_sparse(D)):
        d = _matrix(D, False, dtype) + (d_labels != (j, rest[0]),)
        rest_shape = (D.shape[d_labels.index(rest[0])],)
    else:
        D = densify(D)
        axis = d_labels.index(j)
        rest_shape = tuple(D.shape[d_labels.index(l)] for l in rest)
        d = (None, 0.0, np.ascontiguousarray(
            np.moveaxis(D, axis, 0).reshape(D.shape[axis], math.prod(rest_shape)), dtype=dtype),
             False)
    # an operand whose absent entries are not the semiring's own fill takes part densely
    s, d = [x if x[0] is not None and x[1] == fill else (None, 0.0, _dense(*x[:3]), x[3])
            for x in (s, d)]
    I, J = S.shape[s_labels.index(i)], S.shape[s_labels.index(j)]
    R = math.prod(rest_shape)
    plus = name.endswith("plus")
    agg = np.minimum if name.startswith("min") else np.maximum
    # a stored box's matrix and the test of its values are made once (graphcache.py)
    boxes = [source_of(b) if x[0] is not None and x[0].dtype == b.dtype else None
             for b, x in zip((S, D), (s, d))]
    with np.errstate(all="ignore"):
        bad = any(remember(b, ("bad", plus, fill), lambda x=x: _bad_values(
                      _values(x[0], x[2]), plus, fill)) if b is not None else
                  _bad_values(_values(x[0], x[2]), plus, fill) for b, x in zip(boxes, (s, d)))
    if bad:
        dense = [_dense(*x[:3]) for x in (s, d)]
        res = _dense_semiring(*[a.T if x[3] else a for a, x in zip(dense, (s, d))],
                              plus, agg, dtype)
    else:
        gb = _gb()
        # in min-plus (max-plus) a dense element at the fill is as absent: it never wins
        A, B = [_to_gb(x[0], x[2], fill if plus else None, b) for x, b in zip((s, d), boxes)]
        A, B = A.T if s[3] else A, B.T if d[3] else B
        C = A.mxm(B, getattr(gb.semiring, name)).new(**_opts())
        if choice.out_format == "csr" and len(rest) == 1:  # the plan says sparse: CSR output
            return _sparse_result(gb, C, A, B, plus, agg, J, s, d, dtype, fill, (I, R),
                                  [i] + rest, op.out_labels)
        res = _dense_result(C, fill, dtype)  # a bitmap or full result: moved out of it
        if res is None:
            res = np.full((I, R), fill, dtype) if fill else np.zeros((I, R), dtype)
            r, c, v = C.to_coo()
            res[r, c] = v
        if not plus and J and (s[0] is not None or d[0] is not None):
            # an output with some pair absent also aggregates that pair's product, 0
            cnt = np.zeros((I, R), np.int64)
            r, c, v = A.mxm(B, gb.semiring.plus_pair).new(dtype="INT64", **_opts()).to_coo()
            cnt[r, c] = v
            part = cnt < J
            res[part] = agg(res[part], dtype.type(0))
    res = res.reshape((I,) + rest_shape)
    return _to_output(res, [i] + rest, op.out_labels)


def _sparse_result(gb, C, A, B, plus, agg, J, s, d, dtype, fill, shape, labels, out_labels):
    """A semiring product ``C`` (GraphBLAS) as the CSR output tile the plan asked for
    (``KernelChoice.out_format``), its absent entries the semiring's fill: min-plus's +inf
    where no pair is; max-times' 0, an entry some of whose pairs are absent also taking that
    0 into its MAX or MIN (the structural count ``plus_pair`` has C's very structure)."""
    csr = _unpack_csr(C)
    if csr.dtype != dtype:
        csr = csr.astype(dtype)
    if not plus and J and (s[0] is not None or d[0] is not None) and csr.nnz:
        cnt = _unpack_csr(A.mxm(B, gb.semiring.plus_pair).new(dtype="INT64", **_opts()))
        part = np.asarray(cnt.data) < J
        csr.data[part] = agg(csr.data[part], dtype.type(0))
    import scipy.sparse as sp
    return csr_output(sp.csr_array(csr), labels, out_labels, dtype, fill)


def _dense_result(C, fill, dtype):
    """GraphBLAS matrix ``C`` (a kernel's own result, emptied here) as a dense array in
    ``dtype``, its absent entries ``fill``, where GraphBLAS holds it as a bitmap or full (a
    shortest-path step's distances): its arrays moved out (``unpack``) and the present ones
    copied over the fill. ``to_dense`` assigns it into a new full matrix first (4 ms for the
    131,072 distances of an R-MAT graph, against 0.5 ms so). None for another format (sparse:
    the caller scatters its entries)."""
    fmt = C.ss.format
    if fmt not in ("bitmapr", "bitmapc", "fullr", "fullc"):
        return None
    shape = (C.nrows, C.ncols)
    d = C.ss.unpack(fmt)
    values = d["values"]
    if d.get("is_iso"):  # one value for every entry
        values = np.broadcast_to(values.reshape(-1)[:1], shape)
    if fmt.startswith("full"):
        return np.array(values.reshape(shape), dtype, order="C")
    out = np.full(shape, fill, dtype) if fill else np.zeros(shape, dtype)
    np.copyto(out, values.reshape(shape), where=d["bitmap"].reshape(shape).view(bool),
              casting="unsafe")
    return out


def _unpack_csr(C):
    """GraphBLAS matrix ``C`` (a kernel's own result, emptied here) as a scipy CSR array of
    sorted rows, its arrays moved out of GraphBLAS (``unpack``), not copied as an export is: a
    copy was 15% of a min-plus statement on an R-MAT graph. GraphBLAS's uint64 indices are
    turned into the payload's index dtype (``sparsity.index_dtype``: int32 where they fit) in
    one pass, which scipy and the writer then take as they are: scipy's own conversion (to
    int64) and the writer's (to int32) were two copies of every index."""
    import scipy.sparse as sp
    # the sort at GraphBLAS's own thread count, not the run's (``_opts``): measured with
    # GraphBLAS's own product in the same process, one thread here left the workers with no
    # OpenMP team of their own, and libgomp, no longer seeing more threads than cores, spun
    # its idle threads far longer after every call (GOMP_SPINCOUNT): the peer's call took 3x
    # its CPU and the statement 40-50% more CPU (docs/benchmarks.md, spg39)
    d = C.ss.unpack("csr", sort=True)
    values = d["values"]
    nnz = int(d["indptr"][-1])
    if d["is_iso"]:  # one value for every entry
        values = np.full(nnz, values[0] if values.size else 0, values.dtype)
    shape = (int(d["nrows"]), int(d["ncols"]))
    idx = index_dtype(shape, nnz)
    csr = sp.csr_array((values[:nnz], d["col_indices"][:nnz].astype(idx),
                        d["indptr"].astype(idx)), shape=shape, copy=False)
    csr.has_canonical_format = True  # sorted (sort=True); GraphBLAS holds no repeats
    return csr


def _operand(x, src):
    """A GraphBLAS matrix of scipy matrix ``x``; ``src``: None, or ``(box, transposed)`` where
    ``x`` is stored box ``box`` (its transpose), whose copy the graph cache keeps (``_to_gb``)
    and GraphBLAS reads transposed (a descriptor, no copy)."""
    box, transposed = src if src is not None else (None, False)
    if box is not None and box.csr.dtype == x.dtype:
        m = _to_gb(box.csr, None, box=box)
        return m.T if transposed else m
    return _gb().io.from_scipy_sparse(x if x.format in ("csr", "csc") else x.tocsr())


def plus_times_csr(A, B, sources=None):
    """``A @ B`` of two scipy sparse matrices (one numeric dtype, not bool) by GraphBLAS's
    ``plus_times`` ``mxm`` (its threads: ``gb.ss.config['nthreads']``), as a CSR array of sorted
    rows with scipy's structure: an entry whose sum is 0 (or -0.0) left out, as scipy's product
    leaves it out. SpGEMM's CSR output (``sparse_kernels.spmm``): scipy's single-threaded
    product was 1.5-2.3x GraphBLAS's on R-MAT graphs. The sums may round differently from
    scipy's (GraphBLAS's order of the terms), equal where they are exact. ``sources``: for
    ``A`` and ``B``, None or the stored box (``graphcache.source_of``) each is, or is the
    transpose of, as ``(box, transposed)``: its GraphBLAS copy is made once and kept.

    >>> import scipy.sparse as sp
    >>> A = sp.csr_array(np.array([[0.0, 2.0], [1.0, -3.0]]))
    >>> B = sp.csr_array(np.array([[3.0, 0.0], [1.0, 0.0]]))
    >>> plus_times_csr(A, B).toarray().tolist(), plus_times_csr(A, B).nnz
    ([[2.0, 0.0], [0.0, 0.0]], 1)
    """
    gb = _gb()
    a, b = (x if isinstance(x, gb.Matrix) else _operand(x, src)  # B GraphBLAS's already: a
            for x, src in zip((A, B), sources or (None, None)))      # banded call's (its memo)
    csr = _unpack_csr(a.mxm(b, gb.semiring.plus_times).new(**_opts()))
    if count_nonzero(csr.data) != csr.nnz:  # a sum of exactly 0: absent in scipy's product
        import scipy.sparse as sp
        keep = csr.data != 0
        rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))[keep]
        indptr = np.zeros(csr.shape[0] + 1, csr.indptr.dtype)
        np.cumsum(np.bincount(rows, minlength=csr.shape[0]), out=indptr[1:])
        csr = sp.csr_array((csr.data[keep], csr.indices[keep], indptr), shape=csr.shape)
        csr.has_canonical_format = True
    return csr


def _dense_semiring(S: np.ndarray, D: np.ndarray, plus: bool, agg, dtype) -> np.ndarray:
    """``AGG_j (S[i,j] (+) D[j,r])`` with numpy, in slabs of ``j`` (NaN propagates as in
    numpy's MIN and MAX)."""
    I, J = S.shape
    R = D.shape[1]
    fn = np.add if plus else np.multiply
    step = max(1, CHUNK // max(I * R, 1))
    out = None
    with np.errstate(all="ignore"):
        for lo in range(0, J, step):
            part = fn(S[:, lo:lo + step, None], D[None, lo:lo + step, :])
            red = part.min(axis=1) if agg is np.minimum else part.max(axis=1)
            out = red if out is None else agg(out, red)
    return np.asarray(out, dtype)


# -- masked SpGEMM, SDDMM ---------------------------------------------------------------------

def _dense_product_sum(op, args, dtype, out_shape) -> np.ndarray:
    """``op`` (a SUM of a product of three operands) as numpy computes it on the dense tiles:
    each operand broadcast over the join space, the join evaluated, summed (a tile whose values
    rule the masked or sampled product out: an inf meets a 0 per product there)."""
    from ..plan import scalar
    labels = list(op.out_labels) + [l for l in op.labels if l not in op.out_labels]
    dense = [np.asarray(densify(a), dtype) for a in args]
    sizes = {}
    for a, o in zip(dense, op.inputs):
        sizes.update(zip(o.labels, a.shape))
    views = []
    for a, o in zip(dense, op.inputs):
        spec = "".join(chr(97 + labels.index(l)) for l in o.labels)
        kept = sorted(o.labels, key=labels.index)
        arr = np.einsum(f"{spec}->{''.join(chr(97 + labels.index(l)) for l in kept)}", a)
        views.append(arr.reshape([sizes[l] if l in o.labels else 1 for l in labels]))
    # the join space in slabs of its first label, ``CHUNK`` elements each: the whole of it (a
    # masked product's rows x columns x inner, counted at its entries by the budget) is never
    # made at once; a slab's elements are the same numbers, its sums added slab after slab
    full = [sizes[l] for l in labels]
    red = tuple(range(len(op.out_labels), len(labels)))
    step = max(1, CHUNK // max(math.prod(full[1:]), 1))
    parts = []
    with np.errstate(all="ignore"):
        for lo in range(0, full[0], step):
            hi = min(full[0], lo + step)
            res = np.asarray(scalar.evaluate(op.join, [v if v.shape[0] == 1 else v[lo:hi]
                                                       for v in views]), dtype)
            res = np.broadcast_to(res, [hi - lo] + full[1:])
            parts.append(np.add.reduce(res, axis=red, dtype=dtype))
        if not parts:
            res = np.zeros(out_shape, dtype)
        elif op.out_labels:
            res = np.concatenate(parts, axis=0)
        else:
            res = np.add.reduce(np.asarray(parts, dtype), dtype=dtype)
    return np.ascontiguousarray(np.asarray(res, dtype).reshape(out_shape))


def masked(op, choice, args: list, arg_shapes, out_shape) -> np.ndarray:
    """One call of a ``masked`` kernel: ``SUM(M[a,b] * X[a,c] * Y[c,b])`` = the sum over M's
    entries of M times ``(X @ Y)`` there, ``X @ Y`` computed only at M's entries."""
    dtype = np.dtype(op.dtype)
    k = choice.sparse
    args = _materialize(args, arg_shapes, op)
    a, b, c, x, y = mask_orientation(op, k)
    m = _matrix(args[k], False, dtype)
    X = _matrix(args[x], op.inputs[x].labels != (a, c), dtype)
    Y = _matrix(args[y], op.inputs[y].labels != (c, b), dtype)
    with np.errstate(all="ignore"):
        finite = all(np.isfinite(_values(t[0], t[2])).all() for t in (m, X, Y)
                     if _values(t[0], t[2]).dtype.kind == "f")
    if m[0] is None or not finite or may_overflow(
            dtype, (X[0] if X[0] is not None else X[2]).shape[1],
            _values(X[0], X[2]), _values(Y[0], Y[2])):  # X @ Y inf where M is 0: NaN there
        return _dense_product_sum(op, args, dtype, out_shape)
    if not have_graphblas():  # scipy's SpGEMM, unmasked, then the mask's entries of it
        import scipy.sparse as sp
        xs = X[0] if X[0] is not None else sp.csr_array(X[2])
        ys = Y[0] if Y[0] is not None else sp.csr_array(Y[2])
        value = (xs @ ys).multiply(m[0]).sum(dtype=dtype)
        return np.asarray(value, dtype).reshape(out_shape)
    gb = _gb()
    M = _to_gb(m[0], None)
    P = _to_gb(X[0], X[2]).mxm(_to_gb(Y[0], Y[2]), gb.semiring.plus_times)
    P = P.new(mask=M.S, **_opts())
    total = P.ewise_mult(M, gb.binary.times).new().reduce_scalar(gb.monoid.plus).new()
    value = total.value if total.nvals else 0
    return np.asarray(value if value is not None else 0, dtype).reshape(out_shape)


def sddmm(op, choice, args: list, arg_shapes, out_shape) -> np.ndarray:
    """One call of an ``sddmm`` kernel: ``SUM_r(M[a,b] * U[a,r] * V[b,r])``, the dot products
    of U's and V's rows only at M's entries (in slabs of entries), times M's values."""
    dtype = np.dtype(op.dtype)
    k = choice.sparse
    args = _materialize(args, arg_shapes, op)
    a, b, r, x, y = mask_orientation(op, k)
    m = _matrix(args[k], False, dtype)
    U = _dense(*_matrix(args[x], op.inputs[x].labels != (a, r), dtype))
    V = _dense(*_matrix(args[y], op.inputs[y].labels != (b, r), dtype))
    with np.errstate(all="ignore"):
        finite = all(np.isfinite(x).all() for x in (_values(m[0], m[2]), U, V)
                     if x.dtype.kind == "f")
    if m[0] is None or not finite or may_overflow(dtype, U.shape[1], U, V):
        # finite rows whose dot products overflow: NumPy's M * (U @ V.T) is NaN where M is 0
        return _dense_product_sum(op, args, dtype, out_shape)
    with np.errstate(all="ignore"):
        csr = m[0]
        rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
        cols = np.asarray(csr.indices)
        vals = np.empty(rows.size, dtype)
        step = max(1, CHUNK // max(U.shape[1], 1))
        for lo in range(0, rows.size, step):
            sl = slice(lo, lo + step)
            vals[sl] = np.einsum("nr,nr->n", U[rows[sl]], V[cols[sl]])
        vals *= np.asarray(csr.data)
    if choice.out_format == "csr":  # M's structure: a CSR tile, never dense
        import scipy.sparse as sp
        out = sp.csr_array((vals, np.asarray(csr.indices), np.asarray(csr.indptr)),
                           shape=csr.shape)
        return csr_output(out, [a, b], op.out_labels, dtype)
    res = np.zeros(csr.shape, dtype)
    res[rows, cols] = vals
    return _to_output(res, [a, b], op.out_labels)


def spjoin(op, choice, args: list, arg_shapes, out_shape) -> np.ndarray:
    """One call of an ``spjoin`` kernel (see the module docstring)."""
    import scipy.sparse as sp
    dtype = np.dtype(op.dtype)
    # an absent tile: no entries (not its zeros: a hypersparse matrix's box is terabytes)
    args = [sp.csr_array(tuple(s), dtype=dtype) if x is None else x
            for x, s in zip(args, arg_shapes)]
    a, b = (_matrix(x, o.labels != op.out_labels, dtype) for x, o in zip(args, op.inputs))
    fn = op.join.fn
    first = op.join.args[0].index
    a, b = (a, b) if first == 0 else (b, a)
    if a[0] is None or b[0] is None:
        x, y = _dense(*a), _dense(*b)
    elif fn == "*":
        with np.errstate(all="ignore"):
            res = a[0].multiply(b[0]).tocsr()
            if dtype.kind == "f":  # NumPy's NaN where a NaN or inf meets an absent 0
                res = res + _nonfinite_meets_absent(a[0], b[0], dtype)
        return _join_result(res, choice, dtype)
    else:
        return _join_result(a[0] + b[0] if fn == "+" else a[0] - b[0], choice, dtype)
    with np.errstate(all="ignore"):
        res = x * y if fn == "*" else x + y if fn == "+" else x - y
    return np.ascontiguousarray(res, dtype=dtype)


def _nonfinite_meets_absent(a, b, dtype):
    """A CSR of NaN at each NaN or inf entry of ``a`` (``b``) where the other has no entry
    (``inf * 0`` is NaN in NumPy), the rest absent."""
    import scipy.sparse as sp
    rows, cols = [], []
    for x, y in ((a, b), (b, a)):
        c = x.tocoo()
        bad = ~np.isfinite(c.data)
        r, k = c.row[bad], c.col[bad]
        if r.size:
            absent = np.asarray(y[r, k]).reshape(-1) == 0  # absent (or a stored 0: NaN too)
            rows.append(r[absent]), cols.append(k[absent])
    n = sum(len(r) for r in rows)
    if not n:
        return sp.csr_array(a.shape, dtype=dtype)
    return sp.csr_array((np.full(n, np.nan, dtype), (np.concatenate(rows), np.concatenate(cols))),
                        shape=a.shape)


def _join_result(res, choice, dtype):
    """A sparse join's scipy result (in the output's orientation already) as the plan's output
    tile: CSR where ``choice.out_format`` says sparse, else dense."""
    if choice.out_format == "csr":
        return csr_output(res, (0, 1), (0, 1), dtype)
    return np.ascontiguousarray(densify(res.tocsr()), dtype=dtype)
