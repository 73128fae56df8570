"""A large sparse kernel call run in row bands of its sparse operand, ``check`` between bands.

One sparse kernel call (exec/sparse_kernels.py, exec/semiring.py) is one scipy or GraphBLAS
call that Python cannot interrupt: a 30,000-row SpGEMM took 4.5 s, and Ctrl-C waited for it.
A call whose estimated work is large is therefore made in bands of rows of its sparse operand
(``choice.sparse``, a CSR tile, a ``Filled`` one or a ``RowSlabs`` box), each band the same
kernel on those rows (and on the same rows of any other operand holding that label), with
``check(fraction)`` between bands: a cancelled run (a Ctrl-C, another task's error) stops
within one band, and the call reports its progress on the way.

The band's label is the sparse operand's row label. Where the output keeps it, output row r
depends only on the operands' row r, so the banded result is the one call's, bit for bit:
dense bands are written into the output's rows (``out`` where the caller gave it, each band
handed to ``sink`` where the rows are contiguous), CSR bands are concatenated (their entry
arrays one after the other, nothing sorted again). The one reduction over the band label
banded is the masked product (``masked``, a triangle count): the bands' scalar sums are added,
exact for integers, a float sum in another order otherwise (as GraphBLAS's own threads sum).
Any other call is one call.

Sizing: the work of a call is estimated from the entries of its banded operands times the
average work per entry (the other operand's entries per row, or its width), a few arithmetic
operations, so a small call (the common case: a benchmark's 0.2-5 ms products) is one call and
pays nothing else (``SMALL_WORK``). A large call's first band is ``SMALL_WORK`` of work; each
later band is sized from the time the band before it took, to ``BAND_SECONDS`` (at most
``GROWTH`` times the band before it). A band's last row is found by bisection on the work
before each row, computed where asked from the operands' row pointers (``_Cumulative``): no
per-row array is made for a call (on a 2^20-row SpMV one cost 6 ms of a 37 ms statement).
A band's rows are views of its operands' entries (``_major``). What a semiring product
makes of its other operand (its GraphBLAS matrix) is made once for all the bands (``_kept``),
as is a SpGEMM's right operand (``sparse_kernels._spgemm``'s memo). ``FORCE_ROWS`` (tests) bands every call by that many rows.

Left one call: a call whose sparse operand's rows are a contracted label (a vector times a
matrix: an SSSP step's ``MIN(dist[j] + D[j,k])``; ``SUM(A[j,i] * B[j,k])``), where bands would
split a sum, and a reduction of a row label other than the masked product's; a float call whose
banded operands hold values the kernel computes densely (a NaN or inf; min-plus: a NaN or -inf),
or whose SDDMM or masked dot products could overflow (``_one_path``): a band of passing rows
would take another path than the one call (its zeros' signs and NaNs not the one call's).
"""
from __future__ import annotations

import bisect
import math
import time

import numpy as np

from ..sparsity import index_dtype
from ..storage.boxes import RowGather
from ..storage.sparse import CooTile, Filled, RowSlabs, densify, is_sparse, stacked
from .graphcache import Sourced

__all__ = ["banded", "BAND_SECONDS", "SMALL_WORK", "GROWTH", "FORCE_ROWS"]

BAND_SECONDS = 0.15    # the kernel time one band aims at (a Ctrl-C waits at most about this)
SMALL_WORK = 1 << 22   # estimated work (multiply-adds) under which a call is one call
GROWTH = 16            # a band's work at most this many times the one before it
FORCE_ROWS = None      # tests: band every call this many rows at a time

_ROW_METHODS = ("spmm", "semiring", "sddmm", "spjoin", "spreduce")  # the output keeps the rows


def banded(call, op, choice, args: list, arg_shapes, out_shape, out=None, sink=None,
           check=None):
    """``call(args, arg_shapes, out_shape, out, sink)`` (one sparse kernel call) made in row
    bands where the work is large (see the module docstring), ``check(fraction)`` between
    bands; else the one call."""
    plan = None if check is None else _plan(op, choice, args, out_shape)
    if plan is None:
        return call(args, arg_shapes, out_shape, out, sink)
    label, axes, cw = plan
    rows = len(cw) - 1
    total = cw[rows]
    if FORCE_ROWS is None and total <= SMALL_WORK:
        return call(args, arg_shapes, out_shape, out, sink)
    if not _one_path(op, choice, args, axes):
        return call(args, arg_shapes, out_shape, out, sink)
    # the operands made sliceable once: a box over row tiles stacked unless it is spmm's own
    # operand, a gather's rows taken, a CSR tile banded on its columns made CSC
    args = [_sliceable(a, ax, choice.method == "spmm" and t == choice.sparse) if ax is not None
            else stacked(a) for t, (a, ax) in enumerate(zip(args, axes))]  # stacked once
    if choice.method == "semiring":  # the whole other operand: made GraphBLAS's once, not per band
        args = [_kept(a) if ax is None else a for a, ax in zip(args, axes)]
    dtype = np.dtype(op.dtype)
    oax = op.out_labels.index(label) if label in op.out_labels else None
    usable = out is not None and oax is not None and tuple(out.shape) == tuple(out_shape) and \
        out.dtype == dtype
    band_out = usable and oax == 0 and out.flags.c_contiguous and choice.method == "spmm"
    dest = None  # the dense result, made at the first band that returns dense rows
    sinking = sink is not None and usable and oax == 0 and out.flags.c_contiguous
    sparse_parts, acc = [], None
    target = float(SMALL_WORK)
    r0 = 0
    while r0 < rows:
        if r0:
            check(cw[r0] / total if total else r0 / rows)
        if FORCE_ROWS is not None:
            r1 = min(rows, r0 + FORCE_ROWS)
        else:
            r1 = min(rows, max(cw.last_within(r0, cw[r0] + target), r0 + 1))
            if total - cw[r1] <= 0.25 * target:  # a short rest: in this band
                r1 = rows
        b_args = [a if ax is None else _rows(a, ax, r0, r1) for a, ax in zip(args, axes)]
        b_shapes = [s if ax is None else _with(s, ax, r1 - r0) for s, ax in zip(arg_shapes, axes)]
        b_shape = tuple(out_shape) if oax is None else _with(out_shape, oax, r1 - r0)
        view = out[r0:r1] if band_out else None
        t0 = time.perf_counter()
        res = call(b_args, b_shapes, b_shape, view, sink if sinking else None)
        spent = time.perf_counter() - t0
        done = cw[r1] - cw[r0]
        if oax is None:  # a scalar sum over the bands (masked)
            acc = res if acc is None else np.add(acc, res, dtype=dtype)
        elif is_sparse(res) and not isinstance(res, np.ndarray):
            sparse_parts.append((r0, r1, res))
        else:
            if dest is None:
                dest = out if usable else np.empty(out_shape, dtype)
            if res is not view:
                at = _index(oax, r0, r1)
                dest[at] = res
                if sinking:
                    sink(dest[r0:r1])
        if FORCE_ROWS is None and spent > 0:
            rate = done / spent  # the last band's: the first one's includes imports, caches
            target = min(GROWTH * target, max(float(SMALL_WORK), rate * BAND_SECONDS))
        r0 = r1
    if oax is None:
        return np.asarray(acc, dtype).reshape(out_shape)
    if dest is None:
        return _concat([p for _, _, p in sparse_parts], oax, out_shape)
    for b0, b1, part in sparse_parts:  # bands returned sparse beside dense ones: densified
        dest[_index(oax, b0, b1)] = densify(part)
    return dest


def _plan(op, choice, args, out_shape):
    """(the band label, per operand the axis it has that label on or None, the cumulative
    estimated work per row: a ``_Cumulative``, ``rows + 1`` values), or None where the call is
    not banded."""
    k = choice.sparse
    if k is None or k >= len(args) or args[k] is None or len(op.inputs[k].labels) != 2:
        return None
    method = choice.method
    S = args[k]
    if not (isinstance(S, (RowSlabs, Filled)) or (is_sparse(S) and getattr(S, "format", "")
                                                   == "csr")):
        return None
    label = op.inputs[k].labels[0]
    if method in _ROW_METHODS:
        if label not in op.out_labels:
            return None
    elif method != "masked" or op.out_labels:
        return None
    if len(args) != len(op.inputs) or any(a is None or isinstance(a, CooTile) for a in args):
        return None  # a COO box (hypersparse, rank 3+) is read whole: its kernel is by entries
    axes = [o.labels.index(label) if label in o.labels else None for o in op.inputs]
    if any(o.labels.count(label) > 1 for o in op.inputs):
        return None
    for a, ax in zip(args, axes):
        if ax is not None and not (isinstance(a, (np.ndarray, RowSlabs, Filled, RowGather)) or
                                   is_sparse(a)):
            return None
    rows = S.shape[0]
    if rows < 2:
        return None
    width = math.prod(out_shape) // max(1, out_shape[op.out_labels.index(label)]) \
        if label in op.out_labels else 0
    per_entry = _per_entry(op, choice, args, k)
    # the whole call's estimate first, from entry counts alone: a small call (the common case)
    # builds no per-row array (a 50,000-row SpMV's took 0.3 ms, half its product)
    total = _nnz(S) * per_entry + sum(_nnz(a) for t, (a, ax) in enumerate(zip(args, axes))
                                      if t != k and ax is not None)
    if choice.out_format != "csr":
        total += float(width) * rows
    if FORCE_ROWS is None and total <= SMALL_WORK:
        return None
    terms, per_row = [(per_entry, _entries_before(S))], 0.0
    for t, (a, ax) in enumerate(zip(args, axes)):
        if t != k and ax is not None:
            if _row_sparse(a, ax):
                terms.append((1.0, _entries_before(a)))
            else:  # banded on its columns: their average entries
                per_row += _nnz(a) / max(1, a.shape[ax])
    if choice.out_format != "csr":
        per_row += width  # the output's dense row written (a CSR one's entries: counted above)
    return label, axes, _Cumulative(rows, per_row, terms)


class _Cumulative:
    """The estimated work of a call's rows before row ``r`` (``self[r]``, ``r`` in ``0..rows``:
    what a cumulative sum of the work per row would hold), each value computed where asked from
    the operands' row pointers, which are their cumulative entry counts already: no per-row
    array is made. (One was: on a 2^20-row SpMV its 8 MiB faulted in, a diff and a cumsum took
    6 ms of a 37 ms statement, on every worker.) A call asks a few values a band."""

    __slots__ = ("rows", "per_row", "terms")

    def __init__(self, rows: int, per_row: float, terms: list) -> None:
        self.rows, self.per_row, self.terms = rows, float(per_row), terms

    def __len__(self) -> int:
        return self.rows + 1

    def __getitem__(self, r: int) -> float:
        return self.per_row * r + sum(c * before(r) for c, before in self.terms)

    def last_within(self, r0: int, limit: float) -> int:
        """The last row ``r >= r0`` with ``self[r] <= limit`` (``self[r0]`` is): the values
        do not decrease, so a bisection (``np.searchsorted(cw, limit, "right") - 1``)."""
        lo, hi = r0, self.rows
        if self[hi] <= limit:
            return hi
        while hi - lo > 1:  # self[lo] <= limit < self[hi]
            mid = (lo + hi) // 2
            if self[mid] <= limit:
                lo = mid
            else:
                hi = mid
        return lo


def _entries_before(a):
    """For a sparse tile banded on its rows: a function of ``r`` giving its entries in the
    rows before ``r``, read off its row pointers."""
    if isinstance(a, RowSlabs):
        starts = [p0 for p0, _ in a.parts]
        bases = np.concatenate([[0], np.cumsum([int(p.nnz) for _, p in a.parts])]).tolist()
        parts = a.parts

        def before(r: int) -> int:
            n = bisect.bisect_right(starts, r) - 1
            if n < 0:
                return 0
            p0, p = parts[n]
            return bases[n] + int(p.indptr[min(r - p0, p.shape[0])])
        return before
    m = a.csr if isinstance(a, Filled) else a
    if getattr(m, "format", "") != "csr":
        m = m.tocsr()
    ptr = m.indptr
    return lambda r: int(ptr[r])


def _one_path(op, choice, args, axes) -> bool:
    """Whether every band takes the path the one call takes. A kernel tests its operands'
    values and computes densely with numpy where they fail (a NaN or inf: SpGEMM, a join's
    product, max-times; a NaN or the fill's opposite infinity: min-plus, max-plus; dot products
    that may overflow: sddmm, the masked product). A band of passing rows of an operand that
    fails as a whole would take the sparse path, its rows then not the one call's (the sign of
    a zero: numpy's ``-6 * 0`` is -0.0, an absent entry's product 0.0; a NaN's sign; a sum's
    rounding): such a call is one call. An operand every band reads whole is tested whole."""
    dtype = np.dtype(op.dtype)
    k = choice.sparse
    if dtype.kind != "f" or choice.method == "spreduce" or (
            choice.method == "spmm" and not any(_is_tile_sparse(a) for t, a in
                                                enumerate(args) if t != k)):
        return True  # no test of the values (SpMM's partner is known finite when planned)
    name = (choice.semiring or "") if choice.method == "semiring" else ""
    worst = -np.inf if name.startswith("min") else np.inf  # meets a plus semiring's fill: NaN
    with np.errstate(all="ignore"):
        for v in (v for a, ax in zip(args, axes) if ax is not None for v in _values(a)):
            if v.dtype.kind != "f" or not v.size:
                continue
            v = v.astype(dtype, copy=False) if v.dtype.itemsize > dtype.itemsize else v
            if name.endswith("plus"):
                bad = bool(np.isnan(v).any() or (v == worst).any())
            else:
                bad = not bool(np.isfinite(v).all())
            if bad:
                return False
        if choice.method in ("sddmm", "masked"):
            from .semiring import may_overflow
            mask = op.inputs[k].labels
            inner = {l: a.shape[o.labels.index(l)] for t, (a, o) in
                     enumerate(zip(args, op.inputs)) if t != k for l in o.labels if l not in mask}
            peaks = [max((float(np.max(np.abs(v))) for v in _values(a) if v.size), default=0.0)
                     for t, a in enumerate(args) if t != k]  # the largest magnitude of each
            return not may_overflow(dtype, math.prod(inner.values()),
                                    *[np.full(1, p) for p in peaks])
    return True


def _values(a) -> list:
    """The values of an operand, as arrays (no copy): a sparse tile's entries (and the fill of a
    ``Filled`` where an element is absent), a dense one's elements."""
    if isinstance(a, RowGather):
        a = a.take()
    if isinstance(a, Filled):
        data = np.asarray(a.csr.data)
        if not a.fill or a.csr.nnz >= math.prod(a.shape):
            return [data]
        return [data, np.full(1, a.fill, data.dtype)]
    if isinstance(a, RowSlabs):
        return [np.asarray(p.data) for _, p in a.parts] or [np.zeros(0, a.dtype)]
    if isinstance(a, CooTile):
        return [np.asarray(a.values)]
    if _is_tile_sparse(a):
        return [np.asarray(a.data)]
    return [np.asarray(a).reshape(-1)]


def _per_entry(op, choice, args, k) -> float:
    """The estimated work per entry of the sparse operand: the entries of the other operand's
    row it meets (a sparse one: its average), or the other operand's width (a dense one)."""
    method = choice.method
    if method in ("spjoin", "spreduce"):
        return 1.0
    labels = op.inputs[k].labels
    others = [t for t in range(len(args)) if t != k]
    if method == "masked":
        # M's entries meet X @ Y: each of X's entries meets a row of Y
        x = next(t for t in others if labels[0] in op.inputs[t].labels)
        y = next(t for t in others if t != x)
        return max(1.0, _nnz(args[x]) * _avg_row(args[y]) / max(1, _nnz(args[k])))
    j = labels[1]
    work = 1.0
    for t in others:
        a, o = args[t], op.inputs[t]
        if j in o.labels:
            if _is_tile_sparse(a):
                work = max(work, _nnz(a) / max(1, a.shape[o.labels.index(j)]))
            else:
                work = max(work, math.prod(a.shape) / max(1, a.shape[o.labels.index(j)]))
        elif method == "sddmm":
            work = max(work, math.prod(a.shape) / max(1, a.shape[0]))
    return work


def _is_tile_sparse(a) -> bool:
    return isinstance(a, (RowSlabs, Filled)) or (a is not None and is_sparse(a) and
                                                 not isinstance(a, np.ndarray))


def _nnz(a) -> float:
    if isinstance(a, Filled):
        return float(a.csr.nnz)
    if _is_tile_sparse(a):
        return float(a.nnz)
    return float(math.prod(np.shape(a)))


def _avg_row(a) -> float:
    shape = np.shape(a) if not _is_tile_sparse(a) else a.shape
    return _nnz(a) / max(1, shape[0])


def _row_sparse(a, ax) -> bool:
    return _is_tile_sparse(a) and ax == 0


def _sliceable(a, ax, keep_slabs: bool):
    """Operand ``a`` in a form whose rows (its axis ``ax``) are cheap views."""
    if ax is None or a is None:
        return a
    if isinstance(a, RowGather):
        a = a.take()
    if isinstance(a, RowSlabs):
        return a if keep_slabs and ax == 0 else _sliceable(a.tocsr(), ax, False)
    if isinstance(a, Filled):
        csr = a.csr
        return Filled(_oriented(csr, ax), a.fill)
    if is_sparse(a) and not isinstance(a, np.ndarray):
        return _oriented(a, ax)
    return np.asarray(a)


def _kept(a):
    """A semiring product's operand that every band reads whole, as a ``Sourced`` box of its
    own (no stored origin: the graph cache does not hold it), so that what the kernel makes of
    it (its GraphBLAS matrix, the test of its values: ``graphcache.remember``) is made once
    for all the bands, as for a stored graph's box."""
    if isinstance(a, Sourced) or not (isinstance(a, Filled) or (
            is_sparse(a) and getattr(a, "format", "") == "csr")):
        return a
    if isinstance(a, Filled):
        return Sourced(a.csr, a.fill) if getattr(a.csr, "format", "") == "csr" else a
    return Sourced(a, 0.0)


def _oriented(csr, ax):
    """A sparse matrix as CSR where banded on its rows, CSC where on its columns."""
    if ax == 0:
        return csr if csr.format == "csr" else csr.tocsr()
    return csr if csr.format == "csc" else csr.tocsc()


def _rows(a, ax, r0: int, r1: int):
    """Rows ``r0:r1`` of operand ``a`` along its axis ``ax``: views of its entries."""
    if isinstance(a, RowSlabs):
        parts = []
        for p0, p in a.parts:
            lo, hi = max(r0, p0), min(r1, p0 + p.shape[0])
            if lo < hi:
                parts.append((lo - r0, _major(p, lo - p0, hi - p0)))
        return RowSlabs((r1 - r0, a.shape[1]), a.dtype, tuple(parts))
    if isinstance(a, Filled):
        return Filled(_major(a.csr, r0, r1), a.fill)
    if isinstance(a, np.ndarray):
        return a[_index(ax, r0, r1)]
    return _major(a, r0, r1)


def _major(m, r0: int, r1: int):
    """Rows ``r0:r1`` of a CSR matrix (columns of a CSC one) sharing its entry arrays."""
    import scipy.sparse as sp
    ptr = m.indptr
    lo, hi = int(ptr[r0]), int(ptr[r1])
    cls = sp.csr_array if m.format == "csr" else sp.csc_array
    shape = (r1 - r0, m.shape[1]) if m.format == "csr" else (m.shape[0], r1 - r0)
    data, indices, indptr = m.data[lo:hi], m.indices[lo:hi], ptr[r0:r1 + 1] - ptr[r0]
    if indices.dtype == indptr.dtype and data.ndim == 1:
        # the views as they are (as storage.sparse's row slabs): scipy's constructor copies a
        # view under half of the array it views (its ``prune``), which a band of a stored
        # tile's rows often is: a copy of the band's entries (uncounted) at every band
        band = cls(shape, dtype=m.dtype)
        band.data, band.indices, band.indptr = data, indices, indptr
    else:
        band = cls((data, indices, indptr), shape=shape, copy=False)
    flags = getattr(m, "_has_canonical_format", None), getattr(m, "_has_sorted_indices", None)
    if flags[0]:
        band.has_canonical_format = True
    elif flags[1]:
        band.has_sorted_indices = True
    return band


def _with(shape, ax: int, n: int) -> tuple:
    shape = list(shape)
    shape[ax] = n
    return tuple(shape)


def _index(ax: int, r0: int, r1: int) -> tuple:
    return (slice(None),) * ax + (slice(r0, r1),)


def _concat(parts: list, oax: int, out_shape):
    """The CSR bands (or ``Filled`` ones, one fill) of an output whose axis ``oax`` was banded
    as one tile: rows one after the other (``oax`` 0), else stacked side by side."""
    import scipy.sparse as sp
    fills = {float(p.fill) if isinstance(p, Filled) else 0.0 for p in parts}
    mats = [p.csr if isinstance(p, Filled) else p for p in parts]
    fill = fills.pop() if len(fills) == 1 else None
    if fill is None or any(getattr(m, "format", "") != "csr" for m in mats):
        dest = np.empty(out_shape, np.result_type(*[m.dtype for m in mats]))
        at = 0
        for p in parts:
            n = p.shape[oax]
            dest[_index(oax, at, at + n)] = densify(p)
            at += n
        return dest
    if oax != 0:
        csr = sp.hstack(mats, format="csr")
        csr.sum_duplicates()  # sorted (the bands' columns in order): only flags it
    else:
        nnz = sum(int(m.nnz) for m in mats)
        idx = np.result_type(index_dtype(tuple(out_shape), nnz), *[m.indices.dtype for m in mats])
        data = np.concatenate([m.data for m in mats])
        indices = np.concatenate([m.indices for m in mats]).astype(idx, copy=False)
        indptr = np.empty(out_shape[0] + 1, idx)
        indptr[0] = 0
        at, base = 1, 0
        for m in mats:
            n = m.shape[0]
            # in idx (int64 once the total passes 2^31): an int32 band's indptr + base wraps
            indptr[at:at + n] = m.indptr[1:].astype(idx, copy=False) + idx.type(base)
            base += int(m.nnz)
            at += n
        csr = sp.csr_array((data, indices, indptr), shape=tuple(out_shape), copy=False)
        if all(getattr(m, "_has_canonical_format", False) for m in mats):
            csr.has_canonical_format = True
        elif all(m.has_sorted_indices for m in mats):
            csr.has_sorted_indices = True
    return Filled(csr, fill) if fill else csr
