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
- ``temporaries``: what the kernel allocates besides: a broadcasting kernel evaluates its join in
  chunks of ``chunk_elements`` join-space elements (each operand's slice and the join's value),
  plus the chunk's reduction (``chunk_elements`` times the operands' itemsizes, an estimate of
  the join's intermediate arrays); a matmul writes into its output and copies only an operand it must
  cast or transpose; opt_einsum's ``contract`` may copy every operand and its result.

An operation's projected peak per worker is its largest call's working set (the call on the
largest tiles: ``ceil(size / pieces)`` per label). Intermediates waiting for their consumers may
be spilled by the executor, so they need not fit; they are projected beside the peak
(``may_spill``).

This module sits in ``plan/`` because the optimizer (which fits plans to the budget) and the
physical stage (which sizes kernel chunks from it) both read it, and exec, below the optimizer
in the import rules, reads the kernel choice built from it.

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

from . import scalar
from .aggregates import ARG_AGGS
from .ir import EinOp

__all__ = ["CHUNK_ELEMENTS", "TEMPORARY_SHARE", "CallMemory", "PlanMemory", "worker_budget",
           "chunk_elements", "element_bytes", "blas_product", "matmul_layout", "MatmulLayout",
           "kernel_copies", "call_memory", "project", "sparse_kernel", "spmm_operand",
           "sparse_reduction"]

CHUNK_ELEMENTS = 1 << 22  # the most join-space elements a broadcasting kernel materialises at once
TEMPORARY_SHARE = 4       # a chunked kernel's temporaries stay within 1/4 of a worker's budget


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
    """A worker's share of ``memory_limit`` (None: no limit).

    >>> worker_budget(128 << 20, 2) == 64 << 20, worker_budget(None, 4)
    (True, None)
    """
    return None if memory_limit is None else max(1, int(memory_limit) // max(1, int(workers)))


def element_bytes(op: EinOp) -> int:
    """Bytes a broadcasting kernel holds per join-space element: one element of each operand's
    slice, broadcast to the chunk (the join's intermediate values), at least one of the result's.
    """
    ins = op.in_dtypes or (op.dtype,) * len(op.inputs)
    return sum(np.dtype(d).itemsize for d in ins) or np.dtype(op.dtype).itemsize


def chunk_elements(budget: int | None, op: EinOp) -> int:
    """The join-space elements one chunk of ``op``'s broadcasting kernel materialises: at most
    ``CHUNK_ELEMENTS`` (larger chunks gain nothing), and few enough that the chunk's temporaries
    stay within ``1 / TEMPORARY_SHARE`` of the worker's ``budget``.

    >>> from tensordb.plan.ir import EinOp
    >>> op = EinOp.contraction("P", "ik", [("A", "ij"), ("B", "jk")], {"i": 8, "j": 8, "k": 8})
    >>> chunk_elements(None, op) == CHUNK_ELEMENTS, chunk_elements(64 << 10, op)   # 16 B/element
    (True, 1024)
    """
    if budget is None:
        return CHUNK_ELEMENTS
    return max(1, min(CHUNK_ELEMENTS, int(budget) // TEMPORARY_SHARE // element_bytes(op)))


# -- what the kernel computes with (physical/choice.py builds its KernelChoice from these) -------

@dataclass(frozen=True)
class MatmulLayout:
    """``matmul(X(b, m, k), Y(b, k, n))`` with X = operand ``first`` transposed by ``perm_first``
    and Y = operand ``second`` by ``perm_second``; the groups name the labels of b, m, k and n."""

    first: int
    second: int
    perm_first: tuple[int, ...]
    perm_second: tuple[int, ...]
    batch: tuple[str, ...]
    free_first: tuple[str, ...]
    contracted: tuple[str, ...]
    free_second: tuple[str, ...]

    def __post_init__(self) -> None:
        from ..errors import InternalError
        if {self.first, self.second} != {0, 1}:
            raise InternalError(f"a matmul layout takes operands 0 and 1, not {self.first}, {self.second}")
        n_first = len(self.batch + self.free_first + self.contracted)
        n_second = len(self.batch + self.contracted + self.free_second)
        if sorted(self.perm_first) != list(range(n_first)) or \
                sorted(self.perm_second) != list(range(n_second)):
            raise InternalError(f"matmul permutations {self.perm_first}, {self.perm_second} do not "
                                "match the label groups")


# A BLAS thread per this many flops of a call (about 1 ms of one core): a call of a few MFLOP
# split over threads waits for each of them to get a core, which on a busy machine took a 256^3
# product from 0.3 ms to 48 ms. The optimizer (optimizer/threads.py) and the local executor's
# own rule (exec/pool.py) both keep to it.
BLAS_FLOPS_PER_THREAD = 1 << 26


def blas_product(op: EinOp):
    """``scalar.product_of(op.join)`` when BLAS computes ``op`` as NumPy would (a sum of products
    of every input, each once, in one dtype), else None."""
    in_dtypes = op.in_dtypes or (op.dtype,) * len(op.inputs)
    prod = scalar.product_of(op.join)
    if (op.agg in ("sum", None) and prod is not None
            and sorted(prod[1]) == list(range(len(op.inputs)))
            and scalar.uniform_dtype(op.join, in_dtypes, op.dtype)):
        return prod
    return None


def matmul_layout(op: EinOp) -> MatmulLayout | None:
    """How to run a two-operand product as one batched matmul that yields the output in C order.

    Labels are batch (both operands and the output), contracted (both, not the output) or free
    (one operand and the output). When the output reads batch + free(first) + free(second), for
    one order of the operands, the product is ``matmul(A(b,m,k), B(b,k,n))`` with no transpose of
    the result. None when there is no such order.
    """
    if len(op.inputs) != 2:
        return None
    a, b = (o.labels for o in op.inputs)
    if not a or not b or len(set(a)) != len(a) or len(set(b)) != len(b):
        return None  # a scalar operand or a diagonal: the general path handles those
    if any(l not in b and l not in op.out_labels for l in a) or \
            any(l not in a and l not in op.out_labels for l in b):
        return None  # a label summed inside one operand
    out = op.out_labels
    batch = [l for l in out if l in a and l in b]
    contracted = [l for l in a if l in b and l not in out]
    if list(out[:len(batch)]) != batch:
        return None
    rest = list(out[len(batch):])
    for first, second, x, y in ((0, 1, a, b), (1, 0, b, a)):
        free_x = [l for l in rest if l in x]
        free_y = [l for l in rest if l in y]
        if rest != free_x + free_y:
            continue
        perm_x = tuple(x.index(l) for l in batch + free_x + contracted)
        perm_y = tuple(y.index(l) for l in batch + contracted + free_y)
        return MatmulLayout(first, second, perm_x, perm_y, tuple(batch), tuple(free_x),
                            tuple(contracted), tuple(free_y))
    return None


# -- the projection ------------------------------------------------------------------------------

def kernel_copies(op: EinOp) -> tuple[str, tuple[bool, ...]]:
    """The kernel's method (``matmul``, ``contract`` or ``broadcast``, as physical/choice.py
    chooses it) and, for a matmul, which operands it copies (casts, transposes or scales)."""
    op = op.without_diagonal()
    prod = blas_product(op)
    if prod is None:
        return "broadcast", ()
    layout = matmul_layout(op)
    if layout is None:
        return "contract", ()
    ins = op.in_dtypes or (op.dtype,) * len(op.inputs)
    lead = prod[1][0] if prod[2] and prod[0] != 1 else None
    perms = {layout.first: layout.perm_first, layout.second: layout.perm_second}
    return "matmul", tuple(np.dtype(d) != np.dtype(op.dtype) or k == lead
                           or perms[k] != tuple(range(len(perms[k])))
                           for k, d in enumerate(ins))


def call_memory(op: EinOp, extents: Mapping[str, int], fan_in: int, copied: Sequence[bool],
                chunk: int = CHUNK_ELEMENTS, kernel: tuple | None = None,
                handoff: bool = False, held: Sequence[float] | None = None) -> CallMemory:
    """The working set of one kernel call of ``op`` on tiles of ``extents`` per label, in an
    output tile combining ``fan_in`` calls; ``copied[k]``: operand k's tile is a copy (not a
    view of a stored tile); ``chunk``: the broadcasting kernel's chunk (``chunk_elements``);
    ``kernel``: ``kernel_copies(op)``, when the caller has it already; ``handoff``: the result
    is an unstored intermediate, whose tile a consumer on the same worker holds next to its own
    output (so a producer's tile leaves its consumer room: at most half a worker's budget);
    ``held[k]``: the share of its dense bytes operand k's copy holds (a sparse tile that a
    sparse kernel reads as its entries: below 1; default 1, dense)."""
    method, copies = kernel or kernel_copies(op)
    ins = op.in_dtypes or (op.dtype,) * len(op.inputs)
    out_item = np.dtype(op.dtype).itemsize
    elems = [math.prod(extents[l] for l in o.labels) for o in op.inputs]
    held = held or (1.0,) * len(elems)
    inputs = int(sum(n * np.dtype(d).itemsize * h
                     for n, d, c, h in zip(elems, ins, copied, held) if c))
    output = out_item * math.prod(extents[l] for l in op.out_labels)
    accumulator = output if fan_in > 1 else 0
    if method == "contract":  # opt_einsum may copy every operand, and its result
        temps = sum(elems) * out_item + output
    elif method == "matmul":  # it writes into its output: only the operands it copies
        temps = sum(n * out_item for n, c in zip(elems, copies) if c)
    else:
        space = math.prod(extents[l] for l in op.labels)
        if op.agg in ARG_AGGS and op.agg_labels:  # ARGMAX evaluates its join space whole
            temps = space * element_bytes(op) + output
        elif op.agg_labels:  # chunks along the largest aggregated label; one slice at least
            along = max(op.agg_labels, key=lambda l: extents[l])
            per_slice = space // max(extents[along], 1)
            temps = min(space, max(chunk, per_slice)) * element_bytes(op) + output  # + its reduction
        else:  # slabs of the first axis when the tile is larger than a chunk
            first = op.out_labels[0] if op.out_labels else None
            per_slice = space // max(extents[first], 1) if first else 1
            temps = min(space, max(chunk, per_slice)) * element_bytes(op)
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
            workers: int) -> PlanMemory:
    """The ``PlanMemory`` of ``graph`` (an ``EinGraph``) whose operations' largest calls hold
    ``ops``: intermediates are alive from the operation that computes them to their last reader,
    in the graph's order (a stored result is written into its payload file, not kept)."""
    last: dict[str, int] = {}
    for at, op in enumerate(graph.ops):
        for o in op.inputs:
            last[o.tensor] = at
    sizes = {op.output: math.prod(op.out_shape) * np.dtype(op.dtype).itemsize
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


def sparse_kernel(op: EinOp, sparse: Sequence[int], finite: Sequence[bool]) -> tuple[str, int] | None:
    """The sparse kernel ``op`` runs as, (method, the sparse operand), or None: ``spmm`` or
    ``spreduce`` (physical/choice.py). ``sparse``: the operands stored as matrices with sparse
    tiles; ``finite``: per operand, whether it is known to hold no NaN or inf. The lowering
    chooses the kernel with it, and the optimizer prices the same kernel (optimizer/cost.py)."""
    if not sparse or op.writes_diagonal:
        return None
    k = spmm_operand(op, sparse, finite)
    if k is not None:
        return "spmm", k
    if sparse_reduction(op, sparse):
        return "spreduce", 0
    return None


def spmm_operand(op: EinOp, sparse: Sequence[int], finite: Sequence[bool]) -> int | None:
    """The operand a sparse kernel takes as its sparse matrix, or None: ``op`` is a SUM of the
    product of two operands (no constant, one dtype that is not bool), the sparse one a matrix
    with one label contracted with the other operand and one kept in the output, the other
    operand known finite, with distinct labels, all kept but the contracted one."""
    prod = blas_product(op)
    if prod is None or op.agg != "sum" or len(op.inputs) != 2 or prod[0] != 1 or \
            np.dtype(op.dtype).kind not in "iuf" or len(finite) != 2:
        return None
    for k in sparse:
        s, d = op.inputs[k].labels, op.inputs[1 - k].labels
        if not finite[1 - k] or len(s) != 2 or len(set(s)) != 2 or len(set(d)) != len(d):
            continue
        shared = [l for l in s if l in d]
        if len(shared) != 1 or shared[0] in op.out_labels:
            continue
        kept = [l for l in s if l != shared[0]]
        if kept[0] not in op.out_labels or any(
                l != shared[0] and l not in op.out_labels for l in d):
            continue
        return k
    return None


def sparse_reduction(op: EinOp, sparse: Sequence[int]) -> bool:
    """Whether ``op`` is ``AGG(S[i,j])`` over ``j``, ``i`` or both, for a stored sparse matrix
    ``S`` read as it is (no function, no constant, no cast) and AGG SUM, MAX or MIN: a
    reduction of the stored entries that counts absent ones as zeros is then NumPy's answer."""
    if list(sparse) != [0] or len(op.inputs) != 1 or op.agg not in ("sum", "max", "min"):
        return False
    labels = op.inputs[0].labels
    prod = scalar.product_of(op.join)
    in_dtype = (op.in_dtypes or (op.dtype,))[0]
    return (len(labels) == 2 and len(set(labels)) == 2 and len(op.out_labels) < 2
            and set(op.out_labels) <= set(labels) and prod is not None and prod[0] == 1
            and tuple(prod[1]) == (0,) and np.dtype(in_dtype) == np.dtype(op.dtype))
