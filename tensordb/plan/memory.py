"""The memory a plan holds, projected from piece counts alone (no tile is read, nothing runs).

The executor runs a worker's tasks one output tile at a time: that tile's kernel calls, each
folded into the tile's accumulator as it finishes, then the next tile. So what one worker holds
at once is the working set of one kernel call (``CallMemory``):

- ``inputs``: its input tiles that are copies: a re-tiled (assembled) piece, an earlier
  operation's output tile, a stored box that is not one stored tile or a run of row tiles; a box
  of a stored tensor the reader hands out as a memory-mapped view costs nothing (the page
  cache's, not the budget's); a box of a tensor stored with sparse tiles is a copy (its
  entries for a sparse kernel, ``held``; densified, at its dense bytes, for any other);
- ``output``: its output tile (the partial result when the contraction is split);
- ``accumulator``: the output tile's accumulator, when its contracted labels are split (fan-in
  above 1: a sliced contraction);
- ``temporaries``: what the kernel allocates besides (``kernel_temporaries``, read off the
  kernel's choice, plan/kernel.py): a broadcasting kernel evaluates its join in chunks of
  ``chunk_elements`` join-space elements, ``element_bytes`` each (the join's intermediate
  arrays alive at once), plus the chunk's reduction; a matmul writes into its output and
  copies only an operand it must cast or transpose; opt_einsum's ``contract`` may copy every
  operand and its result. The pool reserves the same figure before a call runs and its ledger
  counts it while the call runs (exec/budget.py), so projection, admission and the measured
  peak are one model.

An operation's projected peak per worker is its largest call's working set (the call on the
largest tiles: ``ceil(size / pieces)`` per label). Intermediates waiting for their consumers may
be spilled by the executor, so they need not fit; they are projected beside the peak
(``may_spill``).

This module sits in ``plan/`` because the optimizer (which fits plans to the budget) and the
executor (which admits tasks against it) both read it.

>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 64, "j": 64, "k": 64})
>>> m = call_memory(op, {"i": 32, "j": 16, "k": 64}, fan_in=4, copied=(False, True))
>>> m.inputs == 16 * 64 * 8, m.output == m.accumulator == 32 * 64 * 8, m.temporaries
(True, True, 0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..config import format_bytes, physical_memory
from ..errors import OutOfMemoryError
from ..shares import Shares
from ..sparsity import choose_format, sparse_nbytes
from .aggregates import ARG_AGGS
from .ir import EinOp
from .kernel import (SPARSE_METHODS, KernelChoice, choose_kernel, chunk_label, element_bytes,
                     output_tile_bytes)

__all__ = ["CallMemory", "PlanMemory", "worker_budget", "kernel_temporaries", "call_memory",
           "project", "refuse_unfillable", "BLAS_FLOPS_PER_THREAD", "SPARSE_FLOPS_PER_THREAD",
           "SPARSE_FLOP_WEIGHT"]

# A BLAS thread per this many flops of a call (about 1 ms of one core): a call of a few MFLOP
# split over threads waits for each of them to get a core, which on a busy machine took a 256^3
# product from 0.3 ms to 48 ms. The optimizer (optimizer/threads.py) and the local executor's
# own rule (exec/pool.py) both keep to it.
BLAS_FLOPS_PER_THREAD = 1 << 26
# The same for a sparse kernel's call (scipy, GraphBLAS: its flops counted from the stored
# entries, physical/lower.py ``sparse_scaled``), whose flop costs a core some hundred times a
# BLAS flop's (an entry read through its index): GraphBLAS's min-plus vxm over 1.1M entries took
# 13 ms of CPU. About 1 ms of one core, as above.
SPARSE_FLOPS_PER_THREAD = 1 << 18
SPARSE_FLOP_WEIGHT = BLAS_FLOPS_PER_THREAD // SPARSE_FLOPS_PER_THREAD  # a sparse flop, in BLAS's



@dataclass(frozen=True)
class CallMemory:
    """The bytes one kernel call holds at once (see the module docstring)."""

    inputs: int = 0
    output: int = 0
    accumulator: int = 0
    temporaries: int = 0
    handoff: int = 0  # an unstored result's tile again: it stays while a consumer makes its own

    @property
    def total(self) -> int:
        """The most held at once: while the call runs, or afterwards, when its result (an
        unstored intermediate) waits next to a consumer's output tile of the same size."""
        running = self.inputs + self.output + self.accumulator + self.temporaries
        return max(running, self.output + self.handoff)

    def as_dict(self) -> dict:
        return {"inputs": self.inputs, "output": self.output, "accumulator": self.accumulator,
                "temporaries": self.temporaries, "handoff": self.handoff, "total": self.total}


def worker_budget(memory_limit: int | None, workers: int) -> int | None:
    """A worker's share of ``memory_limit`` (None: no limit): ``Shares.worker`` (shares.py).

    >>> worker_budget(128 << 20, 2) == 64 << 20, worker_budget(None, 4)
    (True, None)
    """
    return Shares(memory_limit, workers).worker


# -- the projection ------------------------------------------------------------------------------

def kernel_temporaries(op: EinOp, choice: KernelChoice, extents: Mapping[str, int],
                       chunk: str | None = None) -> int:
    """What one kernel call of ``op`` allocates besides its inputs and output tile, run as
    ``choice`` on tiles of ``extents`` per label: the one figure the optimizer projects
    (``call_memory``), the pool reserves before a call (exec/budget.py) and the run's ledger
    counts while it runs. A broadcasting kernel evaluates its join in chunks of
    ``choice.chunk_elements`` join-space elements (one slice of the chunk label at least),
    ``element_bytes`` each, plus the chunk's reduction; a matmul writes into its output and copies
    only the operands it casts, transposes or scales; opt_einsum's ``contract`` may copy every
    operand and its result; a sparse kernel (scipy, GraphBLAS) makes its result once more (dense,
    or its CSR entries). ``chunk``: the label a broadcasting kernel chunks along on these tiles,
    when not ``choice.chunk`` (the optimizer's tilings: ``plan.kernel.chunk_label``).

    >>> from tensordb.plan.kernel import choose_kernel
    >>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 4, "j": 3, "k": 2})
    >>> kernel_temporaries(op, choose_kernel(op), op.size)
    0
    """
    ins = op.in_dtypes or (op.dtype,) * len(op.inputs)
    out_item = np.dtype(op.dtype).itemsize
    elems = [math.prod(extents[l] for l in o.labels) for o in op.inputs]
    # its result (a sparse kernel's at its estimated entries: plan.kernel.with_output)
    output = output_tile_bytes(op, choice, [extents[l] for l in op.out_labels])
    method = choice.method
    if method in SPARSE_METHODS:
        # scipy's or GraphBLAS's result, made once more (a CSR one at its estimated entries);
        # the dense variant of a tile whose values rule the sparse kernel out (a NaN) is not
        # what the plan is sized for
        return output
    if method == "contract":  # opt_einsum may copy every operand, and its result
        return sum(elems) * out_item + output
    if method == "matmul":  # it writes into its output: only the operands it copies
        return sum(n * out_item for n, c in zip(elems, choice.copies) if c)
    space = math.prod(extents[l] for l in op.labels)
    if op.agg in ARG_AGGS and op.agg_labels:  # ARGMAX evaluates its join space whole
        return space * element_bytes(op) + output
    if op.agg_labels:  # chunks along the chunk label; one slice at least, + the reduction
        along = chunk or choice.chunk
        if along not in extents:
            along = chunk_label(op, extents)
        per_slice = space // max(extents[along], 1)
        return min(space, max(choice.chunk_elements, per_slice)) * element_bytes(op) + output
    # slabs of the first axis when the tile is larger than a chunk
    first = op.out_labels[0] if op.out_labels else None
    per_slice = space // max(extents[first], 1) if first else 1
    return min(space, max(choice.chunk_elements, per_slice)) * element_bytes(op)


def call_memory(op: EinOp, extents: Mapping[str, int], fan_in: int, copied: Sequence[bool],
                choice: KernelChoice | None = None, handoff: bool = False,
                held: Sequence[float] | None = None, chunk: str | None = None) -> CallMemory:
    """The working set of one kernel call of ``op`` on tiles of ``extents`` per label, in an
    output tile combining ``fan_in`` calls; ``copied[k]``: operand k's tile is a copy (not a
    view of a stored tile); ``choice``: the kernel (``plan.kernel.choose_kernel(op)`` when not
    given), whose ``kernel_temporaries`` count; ``handoff``: the result is an unstored
    intermediate, whose tile a consumer on the same worker holds next to its own output (so a
    producer's tile leaves its consumer room: at most half a worker's budget); ``held[k]``: the
    share of its dense bytes operand k's copy holds (a sparse tile that a sparse kernel reads as
    its entries: below 1; default 1, dense); ``chunk``: as for ``kernel_temporaries``."""
    choice = choice or choose_kernel(op)
    ins = op.in_dtypes or (op.dtype,) * len(op.inputs)
    elems = [math.prod(extents[l] for l in o.labels) for o in op.inputs]
    held = held or (1.0,) * len(elems)
    inputs = int(sum(n * np.dtype(d).itemsize * h
                     for n, d, c, h in zip(elems, ins, copied, held) if c))
    # a sparse kernel's output tile at its estimated entries (plan.kernel.with_output)
    output = output_tile_bytes(op, choice, [extents[l] for l in op.out_labels])
    accumulator = output if fan_in > 1 else 0
    temps = kernel_temporaries(op, choice, extents, chunk)
    return CallMemory(inputs, output, accumulator, temps, output if handoff else 0)


@dataclass(frozen=True)
class PlanMemory:
    """A plan's projected memory: per operation the working set of its largest kernel call
    (``ops``), which must fit a worker's share of the ``memory_limit``, and the intermediates
    that wait for their consumers (``may_spill``: bytes per unstored result; ``spill_peak``: the
    most of them alive at once), which the executor may spill to disk instead."""

    memory_limit: int | None
    workers: int
    ops: Mapping[str, CallMemory]
    may_spill: Mapping[str, int]
    spill_peak: int = 0

    @property
    def budget(self) -> int | None:
        return worker_budget(self.memory_limit, self.workers)

    @property
    def peak(self) -> int:
        """The projected peak per worker: the largest working set of any operation."""
        return max((m.total for m in self.ops.values()), default=0)

    @property
    def fits(self) -> bool:
        return self.budget is None or self.peak <= self.budget

    def as_dict(self) -> dict:
        return {"memory_limit": self.memory_limit, "workers": self.workers,
                "budget": self.budget, "peak": self.peak, "fits": self.fits,
                "spill_peak": self.spill_peak}


def project(graph, ops: Mapping[str, CallMemory], memory_limit: int | None,
            workers: int, out_nnz: Mapping[str, float] | None = None) -> PlanMemory:
    """The ``PlanMemory`` of ``graph`` (an ``EinGraph``) whose operations' largest calls hold
    ``ops``: intermediates are alive from the operation that computes them to their last reader,
    in the graph's order (a stored result is written into its payload file, not kept). An
    intermediate matrix that a sparse kernel returns as CSR tiles (``out_nnz``: its estimated
    nonzeros, sparse by the format rule) counts at the CSR bytes of those entries."""
    last: dict[str, int] = {}
    for at, op in enumerate(graph.ops):
        for o in op.inputs:
            last[o.tensor] = at
    sizes = {op.output: _result_bytes(op, (out_nnz or {}).get(op.output))
             for op in graph.ops if op.output not in graph.outputs}
    alive: dict[str, int] = {}
    top = 0
    for at, op in enumerate(graph.ops):
        if op.output in sizes:
            alive[op.output] = sizes[op.output]
        top = max(top, sum(alive.values()))
        for name in [n for n in alive if last.get(n, at) <= at]:
            del alive[name]
    return PlanMemory(memory_limit, max(1, int(workers)), dict(ops), sizes, top)


def _result_bytes(op: EinOp, nnz: float | None) -> int:
    """An unstored result's bytes: dense, or a matrix's CSR bytes (a join of rank 3 or more,
    a reduction into a vector or a rank 3+ tensor: COO) where a sparse kernel's estimated nonzeros ``nnz`` make it sparse
    (``plan.kernel.with_output``'s rule)."""
    dense = math.prod(op.out_shape) * np.dtype(op.dtype).itemsize
    rank = len(op.out_labels)
    join = len(op.inputs) == 2 and not op.agg_labels and rank > 2  # spjoin: COO tiles
    reduction = len(op.inputs) == 1 and bool(op.agg_labels)  # spreduce: COO (a vector)
    if nnz is None or op.writes_diagonal or not (rank == 2 or join or reduction):
        return dense  # not a matrix: only a join or a reduction returns sparse (COO) tiles
    nse = int(math.ceil(nnz))
    if choose_format(op.out_shape, nse, op.dtype) == "dense":
        return dense
    fmt = "csr" if len(op.out_labels) == 2 else "coo"  # rank 3+: a join's COO tiles
    return min(dense, sparse_nbytes(op.out_shape, nse, op.dtype, fmt))


def refuse_unfillable(graph, sparse: Mapping[str, int], out_bytes: Mapping[str, int] | None,
                      memory_limit: int | None) -> None:
    """Refuse (OutOfMemoryError, before anything runs) an operation over a stored sparse input
    whose output, in the format the plan gives it, is larger than the machine's memory (or
    ``memory_limit`` where that is larger) and more than twice its inputs' stored bytes: an
    output its inputs cannot fill, such as ``deg[i] = SUM(G[i,j])`` of a 10^10 x 10^10 ``G`` of 5
    entries, a dense vector of 80 GB (a matrix output the plan makes sparse counts at its
    sparse bytes: ``out_bytes``, the optimizer's ``OpCost.out_bytes``, the whole output as its
    kernel returns it; an SpMM's output is dense whatever its estimated nonzeros). A dense output below that is written tile by tile under ``memory_limit``, as
    any other. ``sparse``: stored input -> its stored bytes, for the inputs with sparse tiles;
    another input counts at its dense bytes. Here a ``memory_limit`` above the machine's counts:

    >>> from tensordb.plan.ir import EinOp, EinGraph, TensorInfo
    >>> n = 10**17
    >>> op = EinOp.contraction("deg", "i", [("G", "ij")], {"i": n, "j": n})
    >>> g = EinGraph((TensorInfo("G", (n, n), "float64"),), (op,), ("deg",))
    >>> try:
    ...     refuse_unfillable(g, {"G": 160}, None, 2**50)
    ... except OutOfMemoryError as e:
    ...     print(e.message)
    deg[i] = SUM(G[i,j]): its output deg of shape (100000000000000000,) is dense: 727595.8 TiB (float64), more than memory_limit (1024.0 TiB) and than its inputs' 160 B (G: sparse, 160 B stored): nothing was run or changed
    """
    machine = physical_memory() or 0
    limit, what = (memory_limit, "memory_limit") if (memory_limit or 0) > machine else \
        (machine, "this machine's memory")
    if not limit or not sparse:
        return
    dims = {t.name: t for t in graph.inputs}
    for op in graph.ops:
        if not any(o.tensor in sparse for o in op.inputs):
            continue
        dense = math.prod(op.out_shape) * np.dtype(op.dtype).itemsize
        out = min(dense, (out_bytes or {}).get(op.output, dense))
        fmt = "dense" if out == dense else "sparse (its entries and row pointers)"
        held = sum(sparse[o.tensor] if o.tensor in sparse else
                   math.prod(dims[o.tensor].shape) * np.dtype(dims[o.tensor].dtype).itemsize
                   if o.tensor in dims else math.prod(op.size[l] for l in o.labels) * 8
                   for o in op.inputs)
        if out > limit and out > 2 * held:
            stored = ", ".join(f"{t}: sparse, {format_bytes(sparse[t])} stored"
                               for t in dict.fromkeys(o.tensor for o in op.inputs)
                               if t in sparse)
            raise OutOfMemoryError(
                f"{op.describe()}: its output {op.output} of shape {tuple(op.out_shape)} is "
                f"{fmt}: {format_bytes(out)} ({np.dtype(op.dtype).name}), more than {what} "
                f"({format_bytes(limit)}) and than its inputs' {format_bytes(held)} ({stored}): "
                "nothing was run or changed",
                hint="compute it over a slice of the rows, or an aggregate of it (a SUM over "
                     "all its labels), or store the input with fewer rows")

