"""A kernel call bound once to its operands' shapes, dtypes and layouts (issue 29: the run of a
small step at numpy's pace).

``KernelSpec.__call__`` (exec/kernels.py) decides at every call what its operation's plan
already fixed for a tile of given shapes: which path (BLAS, a broadcast, one chunk or many), the
views of each operand in the join space, whether ``out`` fits, the compiled join; and it enters
``np.errstate`` and ``warnings.catch_warnings`` around each broadcast. On a 1347 x 10 tile those
decisions cost 10-20 us a call, more than the NumPy work of most of a training step's
operations. ``bind`` makes them once, for the operands of one call, and returns a function
``f(args, out)`` that makes only the NumPy calls ``KernelSpec`` would make for operands of the
same shapes, dtypes and memory layouts (``signature``), in the same order, with the same
arguments: its answers are ``KernelSpec``'s, bit for bit (tests/exec/test_bound.py).

Only the straight-line run (exec/fastpath.py) calls them: it runs under
``np.errstate(all="ignore")`` already, checks cancellation between calls, and binds again when
a call's operands have another signature. What is not bound (a sparse method, a diagonal write,
a tile computed in chunks or slabs, a product tested for NaN or inf, an absent operand, a
contraction by opt_einsum, an empty tile) returns None: the caller calls the spec itself.
Where NumPy could warn about anything but a floating-point error (a join over other dtypes
than floating ones), the call still ignores warnings as the spec does.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..plan.aggregates import AGGREGATES, ARG_AGGS
from . import fused
from .kernels import CACHE_BYTES, _ORDERLESS, _scalar
from .sparse_kernels import SPARSE_METHODS

__all__ = ["bind", "signature"]


def signature(args) -> tuple | None:
    """What a bound call depends on in its operands: per operand its shape, dtype and whether
    it is C-contiguous; None where one is not a dense NumPy array (absent, sparse)."""
    sig = []
    for a in args:
        if type(a) is not np.ndarray:
            return None
        sig.append((a.shape, a.dtype, a.flags.c_contiguous))
    return tuple(sig)


def bind(spec, args: list, out_shape, out=None, keep: bool = False):
    """``f(args, out)``: ``spec(args, arg_shapes, out_shape, out)`` for operands of ``args``'s
    signature (and an ``out`` of the same shape and dtype, or None as ``out``), without the
    decisions; None where the call is not bound (see the module's doc). ``keep``: a reduction
    in one chunk returns ``(result, value)``, ``value`` the join's value over the whole join
    space where the join made it as a fresh array of its own (else None), for a later call
    to read (exec/reuse.py); None where the call is no such reduction."""
    if spec.diagonal is not None or spec.choice.method in SPARSE_METHODS or \
            signature(args) is None or spec.xp is not np:
        return None
    if spec.blas:
        return None if keep else _bind_blas(spec, args, out)
    return _bind_broadcast(spec, args, out_shape, out, keep)


def _bind_blas(spec, args, out):
    c = spec.choice
    dtype = spec.dtype
    if c.fallback_on or any(a.dtype != dtype for a in args):
        return None  # tested for NaN or inf, or cast first: the spec decides at each call
    first = None
    if spec.scale_first is not None:
        first = (spec.scale_first, _scalar(spec.scale, dtype))
    if spec.matmul is not None:
        return _bind_matmul(spec, args, out, first)
    if not (spec.copy_only and (spec.scale_first is not None or spec.scale != 1)):
        return None  # opt_einsum's contract: left to the spec
    after = _scalar(spec.scale, dtype) if spec.scale != 1 and spec.scale_first is None else None

    def scaled(args, out):
        # one operand in its own order, scaled (KernelSpec._contract's copy_only)
        res = args[0] * first[1] if first is not None else args[0]
        if after is not None:
            res = res * after
        res = np.asarray(res, dtype=dtype)
        return res if res.flags.c_contiguous else res.copy()
    return scaled


def _bind_matmul(spec, args, out, first):
    """KernelSpec._matmul for these operands."""
    lay, op, dtype = spec.matmul, spec.op, spec.dtype
    i, j = lay.first, lay.second
    ext = {}
    for o, arr in ((op.inputs[i], args[i]), (op.inputs[j], args[j])):
        ext.update(zip(o.labels, arr.shape))
    nb, m, k, n = (math.prod(ext[l] for l in group) for group in
                   (lay.batch, lay.free_first, lay.contracted, lay.free_second))
    ta = None if tuple(lay.perm_first) == tuple(range(args[i].ndim)) else lay.perm_first
    tb = None if tuple(lay.perm_second) == tuple(range(args[j].ndim)) else lay.perm_second
    scale_after = spec.scale != 1 and spec.scale_first is None
    shape = tuple(ext[l] for l in op.out_labels)
    a_shape, b_shape, o_shape = (nb, m, k), (nb, k, n), (nb, m, n)
    into_out = out is not None and out.dtype == dtype and not scale_after
    res_dtype = np.result_type(args[i], args[j])
    after = _scalar(spec.scale, dtype) if scale_after else None
    matmul, empty = np.matmul, np.empty

    def call(args, out):
        if first is not None:
            args = list(args)
            args[first[0]] = args[first[0]] * first[1]
        a, b = args[i], args[j]
        if ta is not None:
            a = a.transpose(ta)
        if tb is not None:
            b = b.transpose(tb)
        a3, b3 = a.reshape(a_shape), b.reshape(b_shape)
        if out is not None and into_out:
            matmul(a3, b3, out=out.reshape(o_shape))
            return out
        res = empty(shape, dtype=res_dtype)
        matmul(a3, b3, out=res.reshape(o_shape))
        if res.dtype != dtype:
            res = res.astype(dtype)
        if after is not None:
            res *= after
        return res
    return call


def _bind_broadcast(spec, args, out_shape, out, keep=False):
    """KernelSpec._broadcast for these operands: an elementwise join in one piece, or a
    reduction in one chunk."""
    op, c, dtype = spec.op, spec.choice, spec.dtype
    views, full = spec._views(args)
    steps = spec._layouts.get(tuple(a.shape for a in args))
    if steps is None or 0 in full:
        return None
    steps = steps[0]
    full_t = tuple(full)
    n_agg = len(spec.space) - spec.n_out
    agg_axes = tuple(range(n_agg))
    if op.agg in ARG_AGGS and agg_axes:
        return None
    plain = _plain(op.join, dtype, [a.dtype for a in args])
    lay = [(diag, order, shape, a.shape == shape and order is None and diag is None)
           for a, (diag, order, shape) in zip(args, steps)]
    ndarray = np.ndarray

    if all(same for _, _, _, same in lay):  # every operand is its own view: itself
        def views_of(args):
            return args
    else:
        def views_of(args):
            return [a if same else _view(a, diag, order, shape)
                    for a, (diag, order, shape, same) in zip(args, lay)]

    if not agg_axes:
        if keep:
            return None
        if spec._slab_rows(full, c.chunk_elements) is not None:
            return None  # in slabs (cancellable): the spec's
        fn = _compiled(spec, views, False)
        fits = out is not None and tuple(out.shape) == full_t and out.dtype == dtype

        def elementwise(args, out):
            vs = views_of(args)
            if fits and out is not None:
                res = fn(vs, out)
                if res is out:
                    return out
            else:
                res = fn(vs, None)
            if type(res) is not ndarray or res.dtype != dtype:  # (asarray: itself then)
                res = np.asarray(res, dtype=dtype)
            if res.shape != full_t:
                res = np.broadcast_to(res, full_t).copy()
            return res
        return elementwise if plain else _quiet(elementwise)
    if c.chunk not in spec.space:
        return None
    axis = spec.space.index(c.chunk)
    per_slice = math.prod(full) // max(full[axis], 1)
    step = max(1, c.chunk_elements // max(per_slice, 1))
    if step < full[axis] or spec._cache_blocks(views, full, axis, n_agg,
                                               c.chunk_elements) is not None:
        return None  # in chunks or cache blocks: the spec's
    fn = _compiled(spec, views, True)
    ufunc = AGGREGATES[op.agg].ufunc
    orderless = ufunc in _ORDERLESS
    array, asarray, broadcast_to = np.array, np.asarray, np.broadcast_to
    reduce = ufunc.reduce

    def finish(res):
        # KernelSpec._reduce in one chunk, of the join's value ``res``
        val = res if res.shape == full_t else broadcast_to(res, full_t)
        if orderless and type(res) is ndarray and res.shape == val.shape and \
                not res.flags.c_contiguous and res.nbytes <= CACHE_BYTES:
            val = np.ascontiguousarray(res)
        part = reduce(val, axis=agg_axes)
        if type(part) is ndarray:
            return part if part.dtype == dtype else asarray(part, dtype=dtype)
        acc = array(part) if not isinstance(part, ndarray) else part
        return asarray(acc, dtype=dtype)

    def reduction(args, out):
        return finish(asarray(fn(views_of(args), None)))

    if keep:
        def kept(args, out):
            # the reduction, and its join's value where it is an array made for it (not an
            # operand's view, not broadcast): laid out in the join space as NumPy made it
            vs = views_of(args)
            res = asarray(fn(vs, None))
            fresh = type(res) is ndarray and res.shape == full_t and res.base is None and \
                not any(res is v for v in vs)
            return finish(res), (res if fresh else None)
        return kept if plain else _quiet(kept)
    return reduction if plain else _quiet(reduction)


def _plain(join, dtype, dtypes) -> bool:
    """Whether NumPy can warn of nothing but floating-point errors (ignored by the run's
    ``np.errstate``) while computing ``join``: floating operands, a floating answer of the
    output's dtype (no complex value cast to a real one)."""
    if dtype.kind != "f" or any(d.kind != "f" for d in dtypes):
        return False
    try:
        return np.dtype(fused.scalar.dtype_of(join, tuple(dtypes))) == dtype
    except Exception:  # noqa: BLE001 - NumPy refuses it: the call ignores warnings as before
        return False


def _view(a, diag, order, shape):
    """fused.views for one operand."""
    if diag is not None:
        a = np.einsum(diag, a)
    if order is not None:
        a = a.transpose(order)
    return a if a.shape == shape else a.reshape(shape)


def _compiled(spec, views, reduced: bool):
    """The join as ``fused.join`` computes it on ``views``: f(values, out)."""
    key = (reduced,) + tuple(v.dtype for v in views)
    fn = spec._fused.get(key, fused._UNSET)
    if fn is fused._UNSET:
        fn = fused.compile_join(spec.op.join, key[1:], reduced=reduced)
        if len(spec._fused) < 16:
            spec._fused[key] = fn
    if fn is None:
        join, evaluate = spec.op.join, fused.scalar.evaluate
        return lambda values, out: evaluate(join, values, np, out=out)
    return fn


def _quiet(call):
    """``call`` with warnings ignored, as KernelSpec._broadcast ignores them."""
    def quiet(args, out):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call(args, out)
    return quiet
