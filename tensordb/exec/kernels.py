"""Tile kernels: one call computes one operation over one tile of its join space.

How is the plan's decision (``physical.choice.KernelChoice``, one per operation): a product join
with a sum goes to BLAS (one batched matmul when the output order allows, else opt_einsum's
contract); anything else is evaluated with broadcasting NumPy, in chunks of an aggregated label so
that, for example, a min-plus tile never materialises its n^3 join space. Backends are named and
registered; CuPy registers itself only when the GPU backend is asked for.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import opt_einsum as oe

from ..errors import NotSupportedError
from ..plan import scalar
from ..plan.aggregates import AGGREGATES, ARG_AGGS
from ..plan.kernel import CHUNK_ELEMENTS, KernelChoice, choose_kernel
from ..plan.ir import EinOp
from ..storage.boxes import RowGather
from ..storage.sparse import is_sparse
from . import fused, gathered, gpu_sparse
from .sparse_kernels import SPARSE_METHODS, dense_args, sparse_call
from .sparse_out import combine_sparse

__all__ = ["KernelSpec", "BACKENDS", "get_backend", "combine", "CHUNK_ELEMENTS"]

CACHE_BYTES = 512 << 10  # one chunk of a blocked reduction: about half a core's L2
SLAB_BYTES = 1 << 20     # one slab of a large elementwise tile's output (_slab_rows)
MIN_CHUNK_STEP = 8       # slabs of the aggregated label reduced together, where the label allows


@dataclass
class KernelSpec:
    """What a kernel needs to know about its operation, computed once per plan; ``choice`` is
    the plan's decision (chosen for the whole operation when not given)."""

    op: EinOp
    xp: object = np
    choice: KernelChoice | None = None
    _exprs: dict = field(default_factory=dict)
    _fused: dict = field(default_factory=dict)    # (reduced, dtypes) -> compiled join or None
    _layouts: dict = field(default_factory=dict)  # operand shapes -> the join space's views

    def __post_init__(self) -> None:
        op = self.op
        c = self.choice = self.choice or choose_kernel(op)
        self.diagonal = None
        if op.writes_diagonal:
            # Computed with each output label once, then written onto the diagonal.
            self.diagonal = KernelSpec(op.without_diagonal(), self.xp, c)
            self.dtype = np.dtype(op.dtype)
            free = op.free_labels
            self.scatter = tuple(free.index(l) for l in op.out_labels)  # output axis -> free axis
            return
        self.labels = op.labels
        self.n_out = len(op.out_labels)
        # The broadcasting path lays the join space out aggregated labels first: reducing over
        # leading axes combines whole contiguous slabs, which NumPy does at memory speed.
        self.space = op.agg_labels + op.out_labels
        self.in_dtypes = op.in_dtypes or (op.dtype,) * len(op.inputs)
        # Off the CPU a sparse method computes as the dense kernel: BLAS for spmm's product and
        # sum; the others (spreduce's MAX, a semiring, a join, a fused three-operand product)
        # broadcast.
        self.blas = c.method in ("matmul", "contract", "spmm")
        self.scale, self.scale_first = c.scale, c.scale_first
        # Where the plan says NumPy's answer may differ next to a NaN or inf, its variant.
        self.test_inputs = "inputs" in c.fallback_on
        self.test_result = "result" in c.fallback_on
        sym = {l: oe.get_symbol(i) for i, l in enumerate(op.labels)}
        self.eq = ",".join("".join(sym[l] for l in o.labels) for o in op.inputs) + "->" + \
            "".join(sym[l] for l in op.out_labels)
        self.dtype = np.dtype(op.dtype)
        self.matmul = c.layout
        ins, outs = self.eq.split("->")
        self.copy_only = ins == outs  # one operand, its labels in the output's order
        # For the broadcasting path: per operand, its labels made unique (diagonal taken first),
        # the order of its axes in the join space and the labels it has there.
        self.unique, self.placed = [], []
        for o in op.inputs:
            uniq = list(dict.fromkeys(o.labels))
            diag = None
            if len(uniq) != len(o.labels):
                diag = "".join(sym[l] for l in o.labels) + "->" + "".join(sym[l] for l in uniq)
            self.unique.append((uniq, diag))
            order = tuple(sorted(range(len(uniq)), key=lambda i: self.space.index(uniq[i])))
            self.placed.append((order, frozenset(uniq)))

    def __call__(self, args: list, arg_shapes, out_shape, out=None, check=None, sink=None):
        """The kernel over one tile; ``out``, if given, is a buffer the result may be written to
        directly (the caller checks whether it was). ``check``, if given, is called between
        chunks with the fraction of the call done so far (for progress), and raises to cancel
        the call (one BLAS call is not interruptible). ``sink``, if given, is called with each
        slab of rows of ``out`` as it is finished, in order, where the kernel computes ``out``
        in slabs (a large elementwise tile on the CPU): the pool takes the tile's statistics
        while the slab is in the cache (the caller checks how much of ``out`` it was given)."""
        xp = self.xp
        if self.diagonal is not None:
            return self._write_diagonal(args, arg_shapes, out_shape, out, check)
        check = check or _no_check
        check()
        if self.choice.method in SPARSE_METHODS and xp is np:  # exec/sparse_kernels.py
            return sparse_call(self.op, self.choice, args, arg_shapes, out_shape, out, sink, check)
        if xp is np and self.blas and any(isinstance(a, RowGather) for a in args):
            # a batch of row products over gathers: a slab of rows at a time (exec/gathered.py)
            res = gathered.by_rows(self, self._matmul, None if self.scale_first is None else
                                   _scalar(self.scale, self.dtype), args, out_shape, out, check)
            if res is not None:
                return res
        if xp is not np:  # a device CSR tile: cupyx's kernel, else densified (gpu_sparse.py)
            res, args = gpu_sparse.call(self, args, out_shape)
            if res is not None:
                return res
        args = dense_args(args)  # a sparse tile (a Load's CSR box) for a dense kernel
        arrays = [xp.zeros(s, dtype=d) if a is None else a
                  for a, s, d in zip(args, arg_shapes, self.in_dtypes)]
        if self.blas:
            # NumPy multiplies in the promoted dtype: int32 x float64 is a float64 product.
            arrays = [a if a.dtype == self.dtype else a.astype(self.dtype) for a in arrays]
            if self.test_inputs and not all(bool(xp.isfinite(a).all()) for a in arrays):
                # opt_einsum sums a label that one operand alone has before multiplying, and
                # groups a product of three: next to an inf that is not the sum of the products
                # (sum(a) * inf is inf for a = [2, -1]; 2 * inf - 1 * inf is NaN).
                return self._broadcast(arrays, out, check, sink, self.choice.fallback)
            if self.scale_first is not None:
                k = self.scale_first
                arrays[k] = arrays[k] * _scalar(self.scale, self.dtype)
            res = self._contract(arrays, out)
            if self.test_result and not bool(xp.isfinite(res).all()):
                # the sum of the unscaled products overflowed, or the constant met an inf
                # (0 * inf): NumPy's answer is that of the constant times each product
                return self._broadcast(arrays, out, check, sink, self.choice.fallback)
            return res
        # a sparse method run dense (off the CPU): the plan's broadcast variant
        return self._broadcast(arrays, out, check, sink,
                               self.choice.fallback if "device" in self.choice.fallback_on else None)

    def _write_diagonal(self, args, arg_shapes, out_shape, out, check):
        """A diagonal write: the values of each distinct output label, placed where the
        repeated labels are equal (an index array per output axis); 0 elsewhere."""
        xp = self.xp
        rank = len(self.diagonal.op.out_labels)
        free_shape = [1] * rank
        for u, n in zip(self.scatter, out_shape):
            free_shape[u] = n
        values = self.diagonal(args, arg_shapes, tuple(free_shape), None, check)
        if out is not None and tuple(out.shape) == tuple(out_shape) and out.dtype == self.dtype:
            res = out
            res[...] = 0
        else:
            res = xp.zeros(out_shape, dtype=self.dtype)
        # output axis d reads the index of its free axis u: broadcast, equal along repeats
        index = tuple(xp.arange(free_shape[u]).reshape([-1 if a == u else 1 for a in range(rank)])
                      for u in self.scatter)
        res[index] = values
        return res

    # -- BLAS ----------------------------------------------------------------------------------
    def _contract(self, arrays, out=None):
        if self.matmul is not None:
            return self._matmul(arrays, out)
        if self.copy_only and (self.scale_first is not None or self.scale != 1):
            # one operand in its own order, scaled: nothing to contract (opt_einsum's set-up
            # alone is 20 us; a GRAD's ``-c * Y``)
            out = arrays[0]
        else:
            out = self._contract_expression(arrays)
        if self.scale != 1 and self.scale_first is None:
            out = out * _scalar(self.scale, self.dtype)
        # Tiles are stored and accumulated C-ordered: pay the transpose here, on the worker.
        out = self.xp.asarray(out, dtype=self.dtype)
        return out if out.flags.c_contiguous else out.copy()

    def _contract_expression(self, arrays):
        shapes = tuple(a.shape for a in arrays)
        expr = self._exprs.get(shapes)
        if expr is None:
            expr = self._exprs[shapes] = oe.contract_expression(self.eq, *shapes, optimize="auto")
        if self.xp is np:
            return expr(*arrays)
        return expr(*arrays, backend="cupy")

    def _matmul(self, arrays, out=None):
        """One (batched) matrix product, written into ``out`` when its dtype matches.

        Operands are laid out (batch, free, contracted) and (batch, contracted, free): reshaping
        is free for tiles already in that order (the common case), a copy otherwise. A leading
        literal was applied to its operand already; a trailing one is applied to the result."""
        xp = self.xp
        lay = self.matmul
        first, second, ta, tb = lay.first, lay.second, lay.perm_first, lay.perm_second
        nb, m, k, n = lay.batch, lay.free_first, lay.contracted, lay.free_second
        a, b = arrays[first], arrays[second]
        ext = {}
        for o, arr in ((self.op.inputs[first], a), (self.op.inputs[second], b)):
            ext.update(zip(o.labels, arr.shape))
        nb, m, k, n = (math.prod(ext[l] for l in group) for group in (nb, m, k, n))
        scale_after = self.scale != 1 and self.scale_first is None
        a3 = a.transpose(ta).reshape(nb, m, k)
        b3 = b.transpose(tb).reshape(nb, k, n)
        if out is not None and xp is np and a3.dtype == b3.dtype == out.dtype and not scale_after:
            xp.matmul(a3, b3, out=out.reshape(nb, m, n))
            return out
        shape = tuple(ext[l] for l in self.op.out_labels)
        # Computed into a buffer of the final shape (of the operands' result type): res owns its
        # memory (an accumulator need not copy it). NumPy 2.5 deprecates setting ``.shape``.
        res = xp.empty(shape, dtype=xp.result_type(a3, b3))
        xp.matmul(a3, b3, out=res.reshape(nb, m, n))
        if res.dtype != self.dtype:
            res = res.astype(self.dtype)
        if scale_after:
            res *= _scalar(self.scale, self.dtype)
        return res

    # -- broadcasting NumPy, chunked over aggregated labels --------------------------------------
    def _broadcast(self, arrays, out=None, check=None, sink=None, choice=None):
        """The join by broadcasting NumPy, chunked as ``choice`` says (default: the plan's)."""
        xp = self.xp
        choice = choice or self.choice
        op = self.op
        views, full = self._views(arrays)
        agg_axes = tuple(range(len(self.space) - self.n_out))
        agg = AGGREGATES[op.agg] if agg_axes else None
        if 0 in full:
            # An empty join space: the join is evaluated at no point (not on the operands that
            # are not empty, where it might fail: an int to a negative power). SUM over nothing
            # is 0, PROD 1 (MAX and MIN over an empty label are refused before planning).
            out_shape = full[len(agg_axes):]
            if agg_axes and 0 not in out_shape:
                return xp.full(out_shape, agg.identity, dtype=self.dtype)
            return xp.zeros(out_shape, dtype=self.dtype)
        if op.agg in ARG_AGGS and agg_axes:
            return self._arg_reduce(views, full)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not agg_axes:
                slab = self._slab_rows(full, choice.chunk_elements)
                if slab is not None:  # a large tile: in slabs, cancellable
                    return self._elementwise_chunked(views, full, out, check or _no_check, slab,
                                                     sink)
                if out is not None and tuple(out.shape) == tuple(full) and out.dtype == self.dtype:
                    res = self._join(views, out)
                    if res is out:  # written in place into the output's final buffer
                        return out
                else:
                    res = self._join(views)
                res = xp.asarray(res, dtype=self.dtype)
                if res.shape != tuple(full):  # the join ignores some label: repeat it
                    res = xp.broadcast_to(res, full).copy()
                return res
            # Chunk along the plan's aggregated label so one chunk stays near chunk_elements (a
            # BLAS tile holding NaN or inf comes here too, chunked as its variant says).
            axis = self.space.index(choice.chunk)
            per_slice = math.prod(full) // max(full[axis], 1)
            step = max(1, choice.chunk_elements // max(per_slice, 1))
            oax = len(agg_axes)  # the first output axis
            blocked = self._cache_blocks(views, full, axis, oax, choice.chunk_elements) \
                if xp is np else None
            if blocked is None:
                return self._reduce(views, full, axis, step, agg, arrays, check)
            # On the CPU a reduction whose operands fit the chunks' budget is computed in blocks
            # of its output's first axis, each reduced over chunks small enough to stay in
            # cache: a min-plus tile then streams through L2 instead of main memory (3x faster
            # at 1024^2). An operand read across its rows (A[i,k] walked by k) is laid out in
            # the join's order first.
            block, step = blocked
            views = [v if v.flags.c_contiguous else np.ascontiguousarray(v) for v in views]
            result, scratch = None, {}
            for lo in range(0, full[oax], block):
                hi = min(lo + block, full[oax])
                sl = [v if v.shape[oax] == 1 else _slice(v, oax, lo, hi, xp) for v in views]
                shape = list(full)
                shape[oax] = hi - lo
                def within(done, lo=lo, hi=hi):  # the fraction of the whole tile done
                    check((lo + done * (hi - lo)) / full[oax])
                part = self._reduce(sl, shape, axis, step, agg, arrays, within, scratch)
                if result is None:
                    result = np.empty(full[oax:], dtype=part.dtype)
                result[lo:hi] = part
            return xp.asarray(result, dtype=self.dtype)

    def _views(self, arrays):
        """The operands as views in the join space, and its extents (``fused.views``)."""
        return fused.views(self, arrays)

    def _join(self, views, out=None, reduced: bool = False):
        """The join on ``views``: ``scalar.evaluate``'s answer (``fused.join``)."""
        return fused.join(self, views, out, reduced)

    def _cache_blocks(self, views, full, axis, oax, chunk_elements):
        """(block, step): blocks of output axis ``oax`` and chunks of ``step`` along ``axis``
        whose join stays within CACHE_BYTES, when the join combines operands (a reduction of one
        gains nothing), that cuts the output at all, and the operands may be copied into the
        join's order (the copies together fit the chunks' share of the budget); None otherwise
        (the plain chunks along ``axis`` are used)."""
        copies = sum(v.size for v in views if not v.flags.c_contiguous)
        if len(views) < 2 or oax == len(full) or copies > chunk_elements:
            return None
        rest = math.prod(full) // (full[axis] * full[oax])
        cache = CACHE_BYTES // self.dtype.itemsize
        step = min(full[axis], MIN_CHUNK_STEP)
        block = max(1, min(full[oax], cache // max(step * rest, 1)))
        if block == full[oax]:
            return None
        budget = chunk_elements // max(block * rest, 1)
        return block, max(1, min(budget, full[axis], cache // max(block * rest, 1)))

    def _arg_reduce(self, views, full):
        """ARGMAX / ARGMIN over the one aggregated label (axis 0), which the plan keeps in one
        piece: the index within the tile is the index in the tensor (numpy's first occurrence;
        the first NaN wins, as in numpy.argmax)."""
        xp = self.xp
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            val = xp.asarray(self._join(views, reduced=True))
        val = xp.broadcast_to(val, full)
        return getattr(xp, self.op.agg)(val, axis=0).astype(self.dtype, copy=False)

    def _reduce(self, views, full, axis, step, agg, arrays, check, scratch=None):
        """The join over the space ``full`` (aggregated axes first) reduced by ``agg``, computed
        in chunks of ``step`` along ``axis``, each folded into an accumulator. ``scratch`` keeps
        the chunk buffers from one call to the next (blocks of one output, the first the
        largest)."""
        xp = self.xp
        op = self.op
        agg_axes = tuple(range(len(full) - self.n_out))
        ufunc = agg.ufunc
        scratch = {} if scratch is None else scratch
        acc = None
        buf = scratch.get("buf")  # the first chunk's join, reused by later ones (no fresh pages)
        spare = scratch.get("spare")  # later chunks' reductions, before they are folded into acc
        for lo in range(0, max(full[axis], 1), step):
            if check is not None:
                check(lo / max(full[axis], 1))
            hi = min(lo + step, full[axis])
            if hi - lo == full[axis]:  # one chunk: the views whole
                sl, shape = views, full
            else:
                sl = [v if v.shape[axis] == 1 else _slice(v, axis, lo, hi, xp) for v in views]
                shape = list(full)
                shape[axis] = hi - lo
            into = None if buf is None else buf[tuple(slice(0, n) for n in shape)]
            res = xp.asarray(self._join(sl, into, reduced=True))
            if buf is None and xp is np and _fresh(res, shape, arrays):
                buf = scratch["buf"] = res  # same inputs' dtypes, same ufunc loop: the same values
            val = res if res.shape == tuple(shape) else xp.broadcast_to(res, shape)
            if xp is np and ufunc in _ORDERLESS and type(res) is np.ndarray and \
                    res.shape == val.shape and not res.flags.c_contiguous and \
                    res.nbytes <= CACHE_BYTES:
                # MAX / MIN over rows laid across memory (the join space puts the aggregated
                # label first): one copy into its order, then whole rows folded at memory
                # speed. The maximum is the same value in any order (of 0.0 and -0.0, which
                # compare equal, either may be kept, as in NumPy's own SIMD loops); NumPy's
                # reduction of short strided rows is about 5x slower (a digits step's row MAX
                # over 1347 x 10)
                val = np.ascontiguousarray(res)
            if xp is not np:
                part = getattr(xp, agg.xp_reduce)(val, axis=agg_axes)
            elif acc is None:
                part = ufunc.reduce(val, axis=agg_axes)
            else:  # reduced into one buffer, then folded into the accumulator
                if spare is None:
                    spare = scratch["spare"] = np.empty_like(acc)
                into = spare if spare.shape == acc.shape else \
                    spare[tuple(slice(0, n) for n in acc.shape)]
                part = ufunc.reduce(val, axis=agg_axes, out=into)
            if acc is None:  # an array (a reduction over every label gives a scalar)
                acc = np.array(part) if xp is np and not isinstance(part, np.ndarray) else part
            elif xp is np:
                ufunc(acc, part, out=acc)
            else:
                acc = getattr(xp, ufunc.__name__)(acc, part)
        if acc is None:  # an empty aggregated label: the aggregate's identity
            acc = xp.full(full[len(agg_axes):], agg.identity, dtype=self.dtype)
        return xp.asarray(acc, dtype=self.dtype)

    def _slab_rows(self, full, chunk_elements: int) -> int | None:
        """Rows of the first axis an elementwise tile is computed in at once (None: all of
        them, the tile whole): slabs of at most the choice's ``chunk_elements`` and, on the
        CPU, of about ``SLAB_BYTES`` of output. A slab's inputs, temporaries and output then
        stay in the cache while the join's functions pass over them one after another; over
        the whole tile each function would stream it through memory (an 8 MiB SGD update
        ``W - 0.01 * dW`` on each of two cores: 1.1 ms in 1 MiB slabs, 1.7 ms whole)."""
        if not full or full[0] <= 1:
            return None
        row = max(math.prod(full[1:]), 1)
        rows = chunk_elements // row
        if self.xp is np:
            rows = min(rows, SLAB_BYTES // (row * self.dtype.itemsize))
        return max(1, rows) if rows < full[0] else None

    def _elementwise_chunked(self, views, full, out, check, step, sink=None):
        """An elementwise join over a large tile, in slabs of ``step`` rows of its first axis
        written into the result (``out`` when it fits), with ``check`` between slabs; ``sink``
        is given each finished slab of ``out``."""
        xp = self.xp
        res = out if out is not None and tuple(out.shape) == tuple(full) and \
            out.dtype == self.dtype else xp.empty(full, dtype=self.dtype)
        if res is not out or not res.flags.c_contiguous:
            sink = None
        for lo in range(0, full[0], step):
            check(lo / full[0])
            hi = min(lo + step, full[0])
            sl = [v if v.shape[0] == 1 else v[lo:hi] for v in views]
            # The join's outermost function writes the slab in place where it can (a ufunc),
            # broadcasting a label the join ignores; otherwise its result is copied in.
            into = res[lo:hi]
            val = self._join(sl, into if xp is np else None)
            if val is not into:
                into[...] = val
            if sink is not None:
                sink(into)
        return res


_ORDERLESS = (np.maximum, np.minimum)  # reductions whose answer no order of the fold changes


def _fresh(res, shape, arrays) -> bool:
    """Is ``res`` a new array of ``shape`` that the kernel owns (a ufunc's result, not an input
    or a view of one), so that later chunks may be computed into it?"""
    return (isinstance(res, np.ndarray) and res.base is None and res.flags.writeable
            and res.shape == tuple(shape) and all(res is not a for a in arrays))


def _no_check(done: float = 0.0) -> None:
    pass


def _scalar(value, dtype: np.dtype):
    """``value`` as a scalar of ``dtype``. A folded integer constant (``2**20 * x * 2**20``) may
    not fit an int32; NumPy's int32 products wrap, so the constant wraps the same way."""
    if dtype.kind in "iu" and isinstance(value, (int, np.integer)):
        bits = dtype.itemsize * 8
        value = (int(value) + (1 << bits - 1)) % (1 << bits) - (1 << bits - 1)
    return dtype.type(value)


def _slice(a, axis: int, lo: int, hi: int, xp):
    index = [slice(None)] * a.ndim
    index[axis] = slice(lo, hi)
    return a[tuple(index)]


def combine(agg: str, acc, part, xp=np):
    """Accumulate ``part`` into ``acc`` in place (acc must be writable and owned); returns the
    accumulator, a new one where either is a sparse tile (``combine_sparse``)."""
    if xp is np and not (isinstance(acc, np.ndarray) and isinstance(part, np.ndarray)) and \
            (is_sparse(acc) or is_sparse(part)):
        return combine_sparse(agg, acc, part)
    if xp is not np and (gpu_sparse.is_device_sparse(acc) or gpu_sparse.is_device_sparse(part)):
        return gpu_sparse.combine(agg, acc, part, xp)
    ufunc = AGGREGATES[agg].ufunc
    fn = ufunc if xp is np else getattr(xp, ufunc.__name__)
    fn(acc, part, out=acc)
    return acc


# -- backends ----------------------------------------------------------------------------------

def _numpy_backend():
    return np


def _cupy_backend():
    try:
        import cupy  # noqa: F401 - imported only when the GPU backend is asked for
    except ImportError:
        raise NotSupportedError("the GPU backend needs CuPy, which is not installed",
                                hint="pip install 'tensordb[gpu]' on a machine with an NVIDIA GPU") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDA reports many kinds of failure
        raise NotSupportedError(f"CuPy is installed but no GPU is usable: {exc}") from None
    if n == 0:
        raise NotSupportedError("CuPy is installed but no GPU is present")
    return cupy


BACKENDS: dict[str, Callable[[], object]] = {"numpy": _numpy_backend, "cupy": _cupy_backend}


def get_backend(name: str):
    factory = BACKENDS.get(name)
    if factory is None:
        raise NotSupportedError(f"unknown kernel backend '{name}'",
                                hint=f"valid backends: {', '.join(sorted(BACKENDS))}")
    return factory()
