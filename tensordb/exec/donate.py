"""An elementwise call computed over the tile of an operand that it reads last (the pool's runs,
pool_run.py): no fresh output buffer, so no fresh pages for the kernel to fault in and zero.

A softmax's ``E = EXP(S - M)`` over 32 MiB tiles of ``S`` read by no later task made a new
32 MiB array per tile (and ``S``'s was freed right after): the kernel zeroes each fresh page as
the call first writes it, 10-40% of the attention workload's CPU time on this machine
(docs/benchmarks.md, "The attention block against a729ab5"). Computed into ``S``'s buffer, the
run allocates, faults and zeroes half as much, and holds one tile less at once.

The answers are the same bytes: only the join's outermost function writes its output (a ufunc's
``out=``; fused.py and ``scalar.evaluate``), the operand's view is the output's very layout (the
same labels in the same order, the same shape and dtype, C-contiguous), so each slab of the
output is the same memory as the operand's slab (NumPy computes a ufunc whose output overlaps an
input exactly element by element, and copies where the overlap is not exact). The operand is one
no other task reads again, not kept past the run, made by a kernel of this run (not a stored
tile's view or a cached array), owning its memory, and referenced by nothing but the run's table
of tiles and this call's inputs (``sys.getrefcount``: a kernel whose output is its input
itself, an identity join, makes two keys of one array, and is refused so). A call that fails
halfway leaves the operand half written; nothing reads it again, the run having failed.
"""
from __future__ import annotations

import sys

import numpy as np

from ..physical.plan import Kernel

__all__ = ["donor"]

# References to the operand's array while ``donor`` looks at it: the run's ``results``, the
# call's ``inputs`` list, ``donor``'s ``value`` and ``sys.getrefcount``'s argument.
_REFS = 4


def donor(plan, task: Kernel, inputs: list, refs: dict, keep) -> np.ndarray | None:
    """The array of one of ``task``'s operands (``inputs``, in ``task.inputs`` order) that its
    elementwise call may write its output over, or None. ``refs``: the run's count of the
    consumers still to read each tile, read without the run's lock (other workers lower other
    counts meanwhile: a count of 1 for an operand of this call, which has not released it yet,
    is this call's own and stays so); ``keep``: the tiles kept past the run."""
    op = plan.ops[task.op]
    choice = plan.kernels[task.op]
    if choice.method != "broadcast" or op.agg_labels or getattr(op, "writes_diagonal", False):
        return None
    dtype = np.dtype(op.dtype)
    shape = tuple(task.out_shape)
    j = -1  # the operand's position in ``inputs``
    for operand, key, arg_shape in zip(op.inputs, task.args, task.arg_shapes):
        if key is None:
            continue
        j += 1
        if tuple(operand.labels) != tuple(op.out_labels) or tuple(arg_shape) != shape or \
                task.args.count(key) != 1 or refs.get(key) != 1 or key in keep or \
                not isinstance(plan.task(key), Kernel):
            continue
        value = inputs[j]
        if type(value) is not np.ndarray or value.base is not None or \
                value.dtype != dtype or value.shape != shape or \
                not value.flags.c_contiguous or not value.flags.writeable:
            continue
        if sys.getrefcount(inputs[j]) > _REFS:
            continue
        return inputs[j]
    return None
