"""A batch of row products over gathers, a slab of rows at a time: the gathered rows never made.

``Resid[n] = SUM(U[obs_user[n], f] * V[obs_item[n], f])`` (the dot products of U's and V's rows
at the observed entries: an SDDMM written with gathers) reads two gathers whose Loads are
``RowGather`` tiles (storage/boxes.py): their rows named, not taken. Where the operation is a
BLAS product (``MatmulLayout``) whose leading batch label is every operand's and the output's
first label, each output row depends only on the same row of every operand, so the kernel
runs on slabs of rows: the gathered rows of one slab (``SLAB_BYTES`` of them) are taken, in the
cache, multiplied into the slab's rows of the output, and dropped. numpy's matmul computes
each batch element by itself, so each output element is the same bits as the whole tile's.
At 500,000 ratings and rank 32 the two gathers are 244 MiB of fresh memory a step otherwise
(their pages faulted in, written and read again). Anything else returns None: the caller takes
the rows whole (``dense_args``) and computes as before.
"""
from __future__ import annotations

import numpy as np

from ..storage.boxes import RowGather

__all__ = ["by_rows", "SLAB_BYTES"]

SLAB_BYTES = 1 << 21  # the gathered bytes of one slab, all operands: they stay in the cache


def by_rows(spec, matmul, scale, args: list, out_shape, out=None, check=None):
    """The kernel ``spec`` (exec/kernels.py ``KernelSpec``) over ``args``, some of them
    ``RowGather``, computed a slab of leading rows at a time by ``matmul`` (its BLAS product
    of one tile's operands, into a given buffer where it can); ``scale``: the constant its
    operand ``spec.scale_first`` is multiplied by first. None where it does not apply."""
    lay, op = spec.matmul, spec.op
    if lay is None or spec.test_inputs or not lay.batch or not op.out_labels or \
            any(a is None for a in args):
        return None
    lead = op.out_labels[0]
    if lay.batch[0] != lead or any(o.labels[0] != lead for o in op.inputs) or \
            any(not isinstance(a, (np.ndarray, RowGather)) for a in args):
        return None
    rows = out_shape[0]
    if any(a.shape[0] != rows for a in args):
        return None
    dtype = spec.dtype
    row_bytes = sum(int(np.prod(a.shape[1:], dtype=np.int64)) * dtype.itemsize for a in args)
    step = max(1, SLAB_BYTES // max(1, row_bytes))
    res = out if out is not None and out.dtype == dtype and tuple(out.shape) == tuple(out_shape) \
        and out.flags.c_contiguous else np.empty(out_shape, dtype)
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        part = [a.take(lo, hi) if isinstance(a, RowGather) else a[lo:hi] for a in args]
        part = [a if a.dtype == dtype else a.astype(dtype) for a in part]
        if spec.scale_first is not None:
            k = spec.scale_first
            part[k] = part[k] * scale
        view = res[lo:hi]
        got = matmul(part, view)
        if got is not view:
            view[...] = got
        if check is not None:
            check(hi / rows)
    if spec.test_result and not bool(np.isfinite(res).all()):
        return None  # numpy's answer next to an inf: the caller's variant, on the whole tile
    return res
