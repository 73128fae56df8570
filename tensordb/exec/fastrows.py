"""The straight-line run's program as the run reads it (exec/fastpath.py): its rows, the slots
of its bound kernel calls, the stored outputs' keys it keeps, and a small stored tile's
statistics; each kept in the plan's memo, made once per program."""
from __future__ import annotations

import math

import numpy as np

from ..storage.checksum import crc32
from ..storage.writer import tile_stats
from .kernels import KernelSpec
from .reuse import shares

__all__ = ["rows", "spec", "calls", "kept_keys", "facts", "SMALL_TILE"]


def facts(a) -> tuple:
    """``tile_stats(a)`` (nonzeros, NaN or inf, CRC-32: the catalog row's facts), for a small
    C-contiguous floating tile the same three answers taken under the run's ``np.errstate``
    (``tile_stats`` enters one of its own: 2 us of a stored weight's or loss's 9)."""
    if a.dtype.kind != "f" or a.size > SMALL_TILE or not a.flags.c_contiguous:
        return tile_stats(a)
    if a.ndim == 0:  # a loss: its one value as a Python float (exact for every float dtype)
        v = a.item()
        return int(v != 0), not math.isfinite(v), crc32(a)
    # NaN or inf in the sum (a 1-d reduce of the C-ordered tile, a view: no ``axis=None``
    # set-up), or a sum that overflowed: then each element is looked at
    nonfinite = a.size > 0 and not math.isfinite(_add(a.reshape(-1))) and \
        not bool(np.isfinite(a).all())
    # count_nonzero of the tile itself (a float's truth is ``!= 0``: NaN counts, -0.0 not)
    # where it is small: no boolean array (1.3 -> 0.6 us a 64 x 10 tile)
    return int(np.count_nonzero(a) if a.size <= SMALL_COUNT else np.count_nonzero(a != 0)), \
        nonfinite, crc32(a)


_add = np.add.reduce
SMALL_TILE = 1 << 15  # elements: within storage/tilestats.py's one block
# elements up to which NumPy's count_nonzero of a float array beats counting ``a != 0``
SMALL_COUNT = 4096


def rows(memo: dict, plan, steps: list, kernel_kind: int) -> tuple:
    """The steps as the run reads them, once per steps list: per step (index, kind, task, key,
    op, inputs, keys freed after it, stored output keys freed after it once in their file,
    moved, temps, dense, whether it makes a stored output's tile, and its share of a kept join
    value: ``(key, None)`` for a reduction that keeps its join's value under ``key``, ``(key,
    KernelSpec)`` for a later call that reads it, by that spec's rewritten operation
    (exec/reuse.py), else None); and the kernel calls per operation (EXPLAIN ANALYZE's count)."""
    kept = memo.get("fastpath_rows")
    # made again for other operations (new parameter values: cache.rebind) or kernel choices,
    # as the plan's KernelSpecs are (runtime.plan_specs): a rewritten operation holds its
    # parameters' values
    if kept is not None and kept[0] is steps and kept[1] is plan.outputs and \
            kept[4] is plan.ops and kept[5] is plan.kernels:
        return kept[2], kept[3]
    keep = kept_keys(memo, plan)
    kept_joins, uses = shares(plan, steps, kernel_kind)
    last = {u.key: e for e, u in uses.items()}  # the kept value freed after its last reader
    pooled = _pooled(plan, steps, kernel_kind, keep)
    rows = []
    per_op = [0] * len(plan.ops)
    for i, s in enumerate(steps):
        free = tuple(k for k in s.free if k not in keep) + \
            tuple(k for k, e in last.items() if e == i)
        kept_free = tuple(k for k in s.free if k in keep) + \
            ((s.key,) if s.unread and s.key in keep else ())
        share = (kept_joins[i], None) if i in kept_joins else \
            (uses[i].key, KernelSpec(uses[i].op, np, plan.kernels[s.task.op])) if i in uses \
            else None
        rows.append((i, s.kind, s.task, s.key, s.op, s.inputs, free, kept_free, s.moved,
                     s.temps, s.dense, s.key in keep, share,
                     None if share is not None else pooled.get(i)))
        if s.kind == kernel_kind:
            per_op[s.op] += 1
    memo["fastpath_rows"] = (steps, plan.outputs, rows, per_op, plan.ops, plan.kernels)
    return rows, per_op


# An intermediate at least this large is written into a buffer the plan keeps (fastpath's pool)
POOL_MIN_BYTES = 128 << 10


def _pooled(plan, steps: list, kernel_kind: int, keep) -> dict:
    """{step index: (shape, dtype)} for the kernel calls whose tile may be written into a
    buffer of the plan's pool: an intermediate (no stored output's tile) of POOL_MIN_BYTES or
    more, computed by a product (BLAS) or an elementwise join, whose every reader is such a
    dense kernel call (no aggregate's accumulator or assembled box keeps it)."""
    readers: dict = {}
    for s in steps:
        for k in s.inputs:
            readers.setdefault(k, []).append(s)
    out = {}
    for i, s in enumerate(steps):
        if s.kind != kernel_kind or s.key in keep or None in s.task.args:
            continue
        op, method = plan.ops[s.task.op], plan.kernels[s.task.op].method
        if op.writes_diagonal or not (method == "matmul" or
                                      (method == "broadcast" and not op.agg_labels)):
            continue
        dtype = np.dtype(op.dtype)
        shape = tuple(s.task.out_shape)
        if dtype.itemsize * math.prod(shape) < POOL_MIN_BYTES:
            continue
        if all(r.kind == kernel_kind and plan.kernels[r.task.op].method in ("matmul", "broadcast")
               for r in readers.get(s.key, ())):
            out[i] = (shape, dtype)
    return out


def spec(specs: dict, n: int, ops, kernels) -> KernelSpec:
    spec = specs.get(n)
    if spec is None:
        spec = specs[n] = KernelSpec(ops[n], np, kernels[n])
    return spec


def calls(memo: dict, steps: list, specs: dict | None, kernel_kind: int,
          name: str = "fastpath_calls") -> list:
    """Per step, its kernel call bound to its operands (exec/bound.py) as (signature, whether
    ``out`` was None, the function or None: not bound); None for a step that is no kernel or
    has an absent operand (its spec is called). Kept in the plan's memo for these steps and
    KernelSpecs; an entry is replaced whole, never changed (a bound function keeps no state).
    ``specs`` None: the calls of the rewritten operations that read a kept join value
    (``_rows``' shares), None until bound; a list (the rows those operations are in): the
    same, bound again for new rows (another parameter value's operations)."""
    kept = memo.get(name)
    if kept is None or kept[0] is not steps or kept[1] is not specs:
        kept = memo[name] = (steps, specs, [
            None if specs is None or type(specs) is list else
            ((), None, None) if s.kind == kernel_kind and None not in s.task.args else None
            for s in steps])
    return kept[2]


def kept_keys(memo: dict, plan) -> frozenset:
    """The keys of the stored outputs' tiles (the run keeps them), once per plan outputs."""
    kept = memo.get("fastpath_keep")
    if kept is None or kept[0] is not plan.outputs:
        kept = memo["fastpath_keep"] = (plan.outputs, frozenset(
            k for out in plan.outputs.values() if out.stored for k in out.tiles.values()))
    return kept[1]
