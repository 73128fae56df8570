"""The cost model: what a tiling of an operation costs, in bytes (docs/explain.md, "The cost").

For an operation with pieces ``d`` per label, ``K = prod(d)`` kernel calls run, and

- join cost: each input tile is read by every kernel call that needs it, so input ``i`` costs
  ``bytes(In_i) * K / prod(d over i's labels)`` (input replication);
- aggregation cost: ``bytes(Out) * (prod(d over aggregated labels) - 1)`` partial results combined;
- compute, only where a block-sparse stored input gates the kernel calls: their flops (1/8 byte
  each), which a tiling on its stored grid cuts to the calls of present tiles;
- re-tiling cost, per input edge: zero when the producer's output tiling is exactly what the
  operation needs for that input, else the producer's whole output is re-cut and moved. A stored
  input is compared with its stored grid; cutting it off that grid, or reading a piece made of
  several stored tiles that the reader cannot hand out as one view (columns of a matrix stored
  in column tiles), is a local copy, charged at a fraction (``CostParams.stored_retile``) of its
  bytes.

Two terms turn "use the workers well" into bytes, so that one number ranks candidates: every
task (kernel call or aggregation) costs a fixed overhead (a task is not free: splitting a
10-element tensor 16 ways is worse than not splitting it), and an operation with fewer kernel
calls than workers pays for the idle workers' share of its flops, unless it is small
(``small_op_flops``): a 64 x 64 matmul runs as one task, not two. Both are zero-sum for the communication part, which is reported
on its own (``OpCost.bytes``).

>>> from tensordb.plan.ir import EinOp
>>> op = EinOp.contraction("C", "ik", [("A", "ij"), ("B", "jk")], {"i": 8, "j": 8, "k": 8})
>>> m = OpModel.of(op, {"A": "float64", "B": "float64"}, 4)
>>> c = m.cost((2, 1, 2))     # labels i, k, j: di=2, dk=1, dj=2; each matrix is 512 bytes
>>> c.bytes == 512 * 1 + 512 * 2 + 512 * (2 - 1)    # |A| dk + |B| di + |C| (dj - 1)
True
"""
from __future__ import annotations

import itertools
import math
import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..geometry import Grid, even_bounds
from ..plan import memory
from ..plan.ir import EinGraph, EinOp
from ..plan.kernel import KernelChoice, choose_kernel, chunk_label, output_tile_bytes, with_output
from .retile import edge_retile, recut_bytes, stored_aligned, views
from .sparse_cost import (StoredStats, made_stats, product_reach, read_sparse, sparse_flops,
                          sparse_out_nnz, spmm_rows)

__all__ = ["CostParams", "OpModel", "OpCost", "PlanCost", "Presence", "StoredStats", "blas_efficiency",
           "evaluate", "stored_aligned", "edge_retile", "recut_bytes"]


@dataclass(frozen=True)
class CostParams:
    """Exchange rates between bytes moved and the other things a plan spends.

    ``task_bytes``: the overhead of one kernel call, as bytes moved in the same time (tens of
    microseconds in-process is a few hundred KiB of memcpy; we use a modest 4 KiB so that
    communication still dominates for real workloads). ``bytes_per_flop``: 1/8, a core does about
    eight flops in the time it copies a byte. ``stored_retile``: cutting a stored tensor off its
    stored grid is a local copy, not a transfer. ``small_op_flops``: operations at most this big
    may use fewer kernel calls than workers. ``blas_thread_elements``: the share of a BLAS call's
    M x N output one BLAS thread needs to be fully busy (``blas_efficiency``).
    """

    task_bytes: float = 4096.0
    bytes_per_flop: float = 1.0 / 8.0
    stored_retile: float = 0.25
    small_op_flops: int = 1 << 20
    blas_thread_elements: int = 256 * 256


DEFAULT_PARAMS = CostParams()


class Presence:
    """Which tiles of a sparse stored input exist: block-sparse inputs make most kernel calls
    vanish, so the cost of a tiling is scaled by the share of calls whose tiles are present.

    >>> pr = Presence(((0, 2, 4), (0, 2, 4)), [(0, 0), (1, 1)])   # a block-diagonal 4x4
    >>> pr.fraction((4, 4), (2, 2)), pr.fraction((4, 4), (1, 1)), pr.aligned((4, 4))
    (0.5, 1.0, (2, 2))
    """

    def __init__(self, grid: Grid, coords) -> None:
        self.grid = tuple(tuple(b) for b in grid)
        self.coords = tuple(tuple(c) for c in coords)
        self._cache: dict[tuple, float] = {}

    def fraction(self, shape: Sequence[int], need: Sequence[int]) -> float:
        """The share of the tiles of an even tiling ``need`` that overlap a stored tile."""
        key = tuple(need)
        hit = self._cache.get(key)
        if hit is None:
            from ..geometry import overlapping
            bounds = [even_bounds(n, d) for n, d in zip(shape, need)]
            covered: set[tuple[int, ...]] = set()
            for c in self.coords:
                ranges = [overlapping(b, g[x], g[x + 1]) for b, g, x in zip(bounds, self.grid, c)]
                covered.update(itertools.product(*ranges))
            total = math.prod(len(b) - 1 for b in bounds) or 1
            hit = self._cache[key] = len(covered) / total
        return hit

    def aligned(self, shape: Sequence[int]) -> tuple[int, ...] | None:
        """The even tiling that is exactly the stored grid, if the stored grid is even."""
        need = tuple(len(b) - 1 for b in self.grid)
        if all(even_bounds(n, d) == b for n, d, b in zip(shape, need, self.grid)):
            return need
        return None


@dataclass(frozen=True)
class OpCost:
    """The cost of one operation under one tiling. ``bytes`` is the communication volume."""

    join: float
    aggregation: float
    retile: float
    overhead: float
    balance: float
    kernel_calls: int
    fan_in: int
    flops: float
    tile_bytes: int          # the working set of the largest kernel call: input tiles + output tile
    memory: memory.CallMemory = memory.CallMemory()   # what the largest call holds (plan/memory.py)
    compute: float = 0.0     # the kernels' flops, where a sparse input makes them vary (cost())
    out_nnz: float | None = None  # a sparse kernel's estimated output nonzeros (OpModel.out_nnz)
    out_bytes: int | None = None  # the whole output's bytes as its kernel returns it (dense, or
                                  # its estimated entries where the kernel returns sparse tiles)

    @property
    def bytes(self) -> float:
        return self.join + self.aggregation + self.retile

    @property
    def total(self) -> float:
        return self.bytes + self.overhead + self.balance + self.compute


@dataclass(frozen=True)
class _Input:
    tensor: str
    pos: tuple[int, ...]       # positions of this input's labels in op.labels
    nbytes: int
    itemsize: int
    shape: tuple[int, ...]
    presence: Presence | None = None   # stored and block-sparse: which tiles exist
    inner: bool = True                 # its absence makes the join zero (it gates kernel calls)
                                       # given what is known of the other inputs' values
    stored: bool = False               # a stored tensor (else an earlier operation's output)
    grid: Grid | None = None           # its stored grid, when known (its boxes may be views)
    held: float = 1.0                  # bytes one tile holds as a share of its dense bytes (a
                                       # sparse tile a sparse kernel reads as it is: below 1)
    sparse: bool = False               # stored with sparse tiles (a copy when read: entries
                                       # sliced, or the box densified)
    row_ptrs: bool = False             # a matrix of COO tiles (hypersparse) its kernel makes
                                       # CSR of: row pointers of its box's rows (8 bytes each)


@dataclass(frozen=True)
class OpModel:
    """Everything the cost of one operation depends on, precomputed once per operation."""

    op: EinOp
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    inputs: tuple[_Input, ...]
    n_out: int                 # out labels are positions 0..n_out-1 of labels
    out_bytes: int
    out_itemsize: int
    flops: float
    workers: int
    params: CostParams = DEFAULT_PARAMS
    budget: int | None = None  # a worker's share of the memory_limit (None: no limit)
    kernel: KernelChoice | None = None  # plan.kernel.choose_kernel: the lowering's choice
    handoff: bool = False               # an unstored result read by later operations
    out_pos: tuple[int, ...] = ()       # per output axis, its label's position (a diagonal
                                        # write repeats one); () when it is 0..n_out-1
    blas: tuple[int, ...] | None = None # a BLAS kernel: the positions of the labels of the M x N
                                        # output of one call (None: not BLAS, one thread per call)
    threads: int = 1                    # BLAS threads each kernel call runs with
    sparse_kernel: tuple | None = None  # (method, operand): a sparse kernel priced by nnz
    out_nnz: float | None = None        # its output's estimated nonzeros (sparse_cost)

    @staticmethod
    def of(op: EinOp, dtypes: Mapping[str, str], workers: int,
           params: CostParams = DEFAULT_PARAMS,
           presence: Mapping[str, Presence] | None = None,
           facts: Mapping[str, tuple[bool, bool]] | None = None,
           grids: Mapping[str, Grid] | None = None, budget: int | None = None,
           produced: frozenset = frozenset(), handoff: bool = False,
           stats: Mapping[str, StoredStats] | None = None) -> "OpModel":
        """``dtypes`` maps each input tensor name to its dtype; ``presence`` the sparse stored
        inputs to the tiles they store; ``facts`` the stored inputs to (finite: no NaN/inf,
        nonzero: no 0 and no NaN), as the lowering sees them (others: neither). Without
        ``facts`` every input is taken to be finite: an estimate. ``grids``: the stored inputs'
        grids (a box inside one stored tile is a view; without a grid, a copy); ``produced``:
        the names earlier operations compute (their tiles are always copies); ``budget``: a
        worker's bytes; ``handoff``: the result is an unstored intermediate (plan.memory);
        ``stats``: the stored inputs' formats, nonzeros and payload bytes (``StoredStats``):
        a sparse input is read as its payload, and a sparse kernel's flops count its nonzeros."""
        from ..plan.skip import zero_when_absent
        labels = op.labels
        size = op.size
        sizes = tuple(size[l] for l in labels)
        known = [(True, False) if facts is None else facts.get(o.tensor, (False, False))
                 for o in op.inputs]
        finite = {k for k, f in enumerate(known) if f[0]}
        nonzero = {k for k, f in enumerate(known) if f[1]}
        # stored sparse inputs, and earlier results their kernels return as CSR (made_stats)
        st = {k: (stats or {}).get(o.tensor) for k, o in enumerate(op.inputs)}
        st = {k: v for k, v in st.items() if v is not None and v.sparse
              and (v.made or op.inputs[k].tensor not in produced)}
        # The kernel the lowering will choose (plan/kernel.py): the same function, the same
        # facts (the sparse operands, what is known finite, the fill values).
        fills = tuple(st[k].fill if k in st else 0.0 for k in range(len(op.inputs)))
        # (matrices; a tensor of rank 3 or more where the op has one or two operands, as the
        # lowering's ``_sparsity``: a reduction or a contraction on its entries)
        choice = choose_kernel(op, None, budget, tuple(
            k for k in st if len(op.inputs[k].labels) == 2 or
            (len(op.inputs[k].labels) > 2 and len(op.inputs) <= 2)),
                               tuple(f[0] for f in known), fills if st else ())
        kern = (choice.method, choice.sparse) if choice.sparse is not None else None
        ins = []
        for k, o in enumerate(op.inputs):
            item = np.dtype(dtypes[o.tensor]).itemsize
            shape = tuple(size[l] for l in o.labels)
            dense = math.prod(shape) * item
            nbytes, held = dense, 1.0
            if k in st:  # read as its payload; held sparse only by the kernel that reads it so
                nbytes = st[k].nbytes
                if kern is not None and k in read_sparse(op, kern, st):
                    held = min(1.0, nbytes / dense) if dense else 1.0
            ins.append(_Input(o.tensor, tuple(labels.index(l) for l in o.labels),
                              nbytes, item, shape,
                              (presence or {}).get(o.tensor),
                              zero_when_absent(op.join, {k}, finite - {k}, nonzero - {k}),
                              o.tensor not in produced, (grids or {}).get(o.tensor), held,
                              k in st, k in st and _builds_row_ptrs(op, kern, k, st)))
        flops, out_nnz = float(op.flops), None
        if kern is not None:
            partner = op.inputs[1 - kern[1]].tensor if len(op.inputs) == 2 else None
            other = st.get(1 - kern[1]) or (None if partner is None or partner in produced
                                            else (stats or {}).get(partner))
            flops = float(sparse_flops(op, kern, st[kern[1]].nnz, getattr(other, "nnz", None)
                                       if getattr(other, "sparse", False) else None))
            reach = product_reach(op, kern, st)
            if reach is not None:  # SpGEMM: its products counted row by row, not spread evenly
                flops = 2.0 * float(reach[0].sum())
            out_nnz = sparse_out_nnz(op, kern, st[kern[1]].nnz, getattr(other, "nnz", None), reach)
            choice = with_output(choice, op, out_nnz)  # sparse output tiles: as the lowering
        item = np.dtype(op.dtype).itemsize
        out_pos = tuple(labels.index(l) for l in op.out_labels) if op.writes_diagonal else ()
        return OpModel(op, labels, sizes, tuple(ins), len(op.free_labels),
                       output_tile_bytes(op, choice, op.out_shape), item, flops, max(1, workers),
                       params, budget, choice, handoff, out_pos, _blas_output(op, choice, labels),
                       sparse_kernel=kern, out_nnz=out_nnz)

    def clamp(self, pieces: Sequence[int]) -> tuple[int, ...]:
        return tuple(max(1, min(int(d), n)) if n > 0 else 1 for d, n in zip(pieces, self.sizes))

    def out_tiling(self, d: Sequence[int]) -> tuple[int, ...]:
        """The pieces of each axis of the output."""
        if self.out_pos:
            return tuple(d[p] for p in self.out_pos)
        return tuple(d[: self.n_out])

    def need(self, d: Sequence[int], which: int) -> tuple[int, ...]:
        """The tiling (pieces per dimension) this operation needs of input ``which``."""
        return tuple(d[p] for p in self.inputs[which].pos)

    def working_set(self, d: Sequence[int]) -> int:
        """Bytes one kernel call holds: its largest input tiles plus its output tile."""
        tile = [-(-n // k) if n else 0 for n, k in zip(self.sizes, d)]
        out = [tile[p] for p in self.out_pos] if self.out_pos else tile[: self.n_out]
        total = output_tile_bytes(self.op, self.kernel, out) if self.kernel is not None and \
            not self.out_pos else self.out_itemsize * math.prod(out)
        for i in self.inputs:
            total += int(i.itemsize * math.prod(tile[p] for p in i.pos) * i.held)
        return total + self.row_ptr_bytes(tile)

    def row_ptr_bytes(self, tile: Sequence[int]) -> int:
        """The row pointers a kernel call builds over its COO (hypersparse) input boxes' rows:
        a CSR of a 10^10-row box is 80 GB of them, whatever its entries."""
        return sum(8 * (tile[i.pos[0]] + 1) for i in self.inputs if i.row_ptrs)

    def call_memory(self, d: Sequence[int]) -> memory.CallMemory:
        """What one kernel call on the largest tiles holds at once (plan/memory.py): the peak a
        worker reaches running this operation under tiling ``d``."""
        tile = [-(-n // k) if n else 0 for n, k in zip(self.sizes, d)]
        extents = dict(zip(self.labels, tile))
        # A sparse stored input's box is always a copy: its entries (a sparse kernel, ``held``
        # below 1) or, for any other kernel, the box densified at its dense bytes.
        copied = [i.sparse or not (
                      i.stored and i.grid is not None and
                      views(tuple(map(tuple, i.grid)), i.shape, self.need(d, w),
                            i.presence is None))
                  for w, i in enumerate(self.inputs)]
        fan_in = math.prod(d[self.n_out:])
        # chunked along the label the lowering picks for these tiles
        chunk = chunk_label(self.op, extents) if self.kernel.index is None else None
        m = memory.call_memory(self.op, extents, fan_in, copied, self.kernel, self.handoff,
                               [i.held for i in self.inputs], chunk)
        ptrs = self.row_ptr_bytes(tile)
        return dataclasses.replace(m, inputs=m.inputs + ptrs) if ptrs else m

    def peak(self, d: Sequence[int]) -> int:
        """Bytes a worker holds at once running this operation under tiling ``d``."""
        return self.call_memory(d).total

    def present(self, d: Sequence[int], skip: int | None = None) -> float:
        """The expected share of kernel calls whose gating input tiles all exist (1 for dense
        inputs; sparse inputs are assumed independent), the input ``skip`` left out."""
        f = 1.0
        for w, i in enumerate(self.inputs):
            if i.presence is not None and i.inner and w != skip:
                f *= i.presence.fraction(i.shape, self.need(d, w))
        return f

    def aligned(self) -> list[tuple[int, ...]]:
        """Tilings that cut every label of a sparse input exactly on its stored grid, so absent
        stored tiles become absent kernel calls. Otherwise, the tiling on the dense stored
        inputs' (even) grids, whose pieces are their stored tiles, read as views: for a wide
        matrix stored in column tiles any piece of a tiling of ``workers`` kernel calls spans
        several tiles and is copied. Offered when it makes a multiple of ``workers`` calls, at
        most ``_MAX_ALIGNED_CALLS`` per worker; the cost decides."""
        vec = [1] * len(self.sizes)
        found = False
        for i in self.inputs:
            need = i.presence.aligned(i.shape) if i.presence is not None and i.inner else None
            if need is None:
                continue
            if not _require(vec, i.pos, need):
                return []
            found = True
        if found:
            return [tuple(vec)]
        for i in self.inputs:
            if not (i.stored and i.grid is not None and i.presence is None):
                continue
            grid = tuple(map(tuple, i.grid))
            need = tuple(len(b) - 1 for b in grid)
            if math.prod(need) <= 1 or any(even_bounds(n, d) != b
                                           for n, d, b in zip(i.shape, need, grid)):
                continue
            if not _require(vec, i.pos, need):
                return []
            found = True
        calls = math.prod(vec)
        if not found or calls % self.workers or calls > self.workers * _MAX_ALIGNED_CALLS:
            return []
        return [tuple(vec)]

    def rate(self, d: Sequence[int]) -> float:
        """How many cores one kernel call keeps busy under tiling ``d``: 1, or for a BLAS call
        run with ``threads`` threads, ``threads`` times their efficiency on its M x N output
        tile (``blas_efficiency``)."""
        if self.threads <= 1 or self.blas is None:
            return 1.0
        tile = [-(-n // k) if n else 0 for n, k in zip(self.sizes, d)]
        return self.threads * blas_efficiency(math.prod(tile[p] for p in self.blas), self.threads,
                                              self.params)

    def cost(self, d: Sequence[int], retile: float = 0.0, memory: bool = True) -> OpCost:
        """The cost of tiling ``d`` (one entry per label, in ``labels`` order), without the
        re-tiling of inputs unless given as ``retile``; ``memory=False`` leaves out the projected
        memory (the search ranks candidates by cost alone: their fit is checked before)."""
        k = math.prod(d)
        f = self.present(d)
        join = 0.0
        dense, rows = spmm_rows(self.sparse_kernel, [i.pos for i in self.inputs])
        for n, i in enumerate(self.inputs):
            rep = k / math.prod(d[p] for p in i.pos)
            if n == dense:  # read once across the sparse matrix's row slabs (spmm_rows)
                rep /= math.prod(d[p] for p in rows)
            join += i.nbytes * rep
        fan_in = math.prod(d[self.n_out:])
        agg = float(self.out_bytes * (fan_in - 1))
        p = self.workers
        calls = max(1.0, k * f)
        par = min(calls * self.rate(d), p)
        prm = self.params
        flops = self.flops * f
        if self.sparse_kernel is not None:  # its nonzeros count only the tiles that exist
            flops = self.flops * self.present(d, skip=self.sparse_kernel[1])
        # Idle workers cost their share of the flops, except next to a small operation (at most
        # small_op_flops, tens of microseconds): splitting it saves less time than a task costs
        # (and a stored result pays a catalog row per tile).
        balance = 0.0 if self.flops <= prm.small_op_flops else \
            max(0.0, flops / par - flops / p) * p * prm.bytes_per_flop
        # Aggregations are tasks too (and a synchronisation point): between tilings that move
        # the same volume, the one without partial results wins.
        tasks = calls + (calls / fan_in if fan_in > 1 else 0)
        # The flops themselves, where a block-sparse input gates the kernel calls: a tiling on
        # its stored grid skips the calls of its absent tiles, which the bytes alone do not
        # say (a 10% dense A times a wide dense B was computed dense, 6x slower, because its
        # tile-by-tile plan replicates B's rows). Every tiling of a dense operation does the
        # same flops: they are left out there, and its costs stay bytes moved.
        compute = flops * prm.bytes_per_flop if self.sparse else 0.0
        return OpCost(join * f, agg * f, retile, prm.task_bytes * tasks, balance, k, fan_in, flops,
                      self.working_set(d), self.call_memory(d) if memory else _NO_MEMORY,
                      compute, self.out_nnz, self.out_bytes)

    @property
    def sparse(self) -> bool:
        """Whether a block-sparse stored input gates this operation's kernel calls."""
        return any(i.presence is not None and i.inner for i in self.inputs)


_NO_MEMORY = memory.CallMemory()


def blas_efficiency(mn: int, threads: int, params: CostParams = DEFAULT_PARAMS) -> float:
    """The share of ``threads`` BLAS threads one call keeps busy: OpenBLAS splits the call's
    M x N output among its threads, and a thread with less than ``params.blas_thread_elements``
    of it waits more than it computes. Never below one thread's worth (measured: a 128 x 128
    Gram product X^T X over 262144 rows takes as long with 2 threads as with 1).

    >>> blas_efficiency(2048 * 2048, 2), blas_efficiency(128 * 128, 2)
    (1.0, 0.5)
    """
    t = max(1, threads)
    return max(1.0 / t, min(1.0, mn / (t * params.blas_thread_elements)))


def _blas_output(op: EinOp, choice: KernelChoice, labels: tuple[str, ...]) -> tuple[int, ...] | None:
    """The positions in ``labels`` of the labels of one BLAS call's M x N output (its batch
    labels are separate calls), or None when the kernel ``choice`` is not BLAS."""
    if choice.method == "matmul":
        mn = choice.layout.free_first + choice.layout.free_second
    elif choice.method == "contract":
        mn = op.without_diagonal().out_labels
    else:
        return None
    return tuple(labels.index(l) for l in mn if l in labels)


# The tiling on dense inputs' stored grids is a candidate with at most this many kernel calls
# per worker (a wide matrix of 16 MiB column tiles stays within it up to 8 GiB on 2 workers).
_MAX_ALIGNED_CALLS = 256



def dtypes_of(graph: EinGraph) -> dict[str, str]:
    out = {t.name: t.dtype for t in graph.inputs}
    out.update({op.output: op.dtype for op in graph.ops})
    return out


def models_of(graph: EinGraph, workers: int, params: CostParams = DEFAULT_PARAMS,
              presence: Mapping[str, Presence] | None = None,
              facts: Mapping[str, tuple[bool, bool]] | None = None,
              grids: Mapping[str, Grid] | None = None,
              budget: int | None = None,
              stats: Mapping[str, StoredStats] | None = None) -> dict[str, OpModel]:
    dt = dtypes_of(graph)
    produced = frozenset(op.output for op in graph.ops)
    read = {o.tensor for op in graph.ops for o in op.inputs}
    # An output that its kernel returns as CSR tiles is a sparse input of the operations that
    # read it, priced by its estimated nonzeros (sparse_cost.made_stats), in graph order.
    stats = dict(stats or {})
    out = {}
    for op in graph.ops:
        m = OpModel.of(op, dt, workers, params, presence, facts, grids, budget, produced,
                       op.output in read and op.output not in graph.outputs, stats)
        out[op.output] = m
        if m.out_nnz is not None and op.output in read:
            made = made_stats(op, m.kernel, m.out_nnz, stats)
            if made is not None:
                stats[op.output] = made
    return out



@dataclass(frozen=True)
class PlanCost:
    """Per-operation costs of a whole decomposition, and their totals."""

    ops: Mapping[str, OpCost]
    workers: int

    @property
    def total(self) -> float:
        return sum(c.total for c in self.ops.values())

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.ops.values())

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.ops.values())

    @property
    def peak_tile_bytes(self) -> int:
        return max((c.tile_bytes for c in self.ops.values()), default=0)


def evaluate(graph: EinGraph, pieces_by_op: Mapping[str, Mapping[str, int]], workers: int, *,
             params: CostParams = DEFAULT_PARAMS, input_grids: Mapping[str, Grid] | None = None,
             models: Mapping[str, OpModel] | None = None,
             presence: Mapping[str, Presence] | None = None,
             facts: Mapping[str, tuple[bool, bool]] | None = None,
             memory_limit: int | None = None,
             stats: Mapping[str, StoredStats] | None = None) -> PlanCost:
    """The cost of a complete decomposition (pieces per label for every operation): the oracle
    that the dynamic program's choice, the baselines and brute force are all measured with.
    Each operation's cost carries what its largest kernel call holds (``OpCost.memory``, with
    kernel chunks sized from a worker's share of ``memory_limit``)."""
    models = models or models_of(graph, workers, params, presence, facts, input_grids,
                                 memory.worker_budget(memory_limit, workers), stats)
    grids = input_grids or {}
    vec = {name: m.clamp([pieces_by_op[name].get(l, 1) for l in m.labels]) for name, m in models.items()}
    out: dict[str, OpCost] = {}
    for op in graph.ops:
        m = models[op.output]
        d = vec[op.output]
        retile = 0.0
        for which, o in enumerate(op.inputs):
            prod = models.get(o.tensor)
            retile += edge_retile(m, which, d, prod, vec.get(o.tensor), grids.get(o.tensor))
        out[op.output] = m.cost(d, retile)
    return PlanCost(out, workers)


def as_dict(model: OpModel, d: Sequence[int]) -> dict[str, int]:
    return dict(zip(model.labels, (int(x) for x in d)))


def _require(vec: list[int], pos, need) -> bool:
    """Set the pieces ``need`` on the labels at ``pos`` of ``vec``; False where a label already
    has other pieces than 1 or the ones needed."""
    for p, n in zip(pos, need):
        if vec[p] not in (1, n):
            return False
        vec[p] = n
    return True


def _builds_row_ptrs(op, kern, k: int, st) -> bool:
    """Whether operand ``k`` (stored sparse: ``st[k]``) is a matrix of COO tiles that the
    kernel ``kern`` ((method, sparse operand)) reads as CSR over its box's rows
    (exec/sparse_kernels.py): every sparse kernel but a reduction's and SpMM's with a dense
    partner, which work on the occupied rows only (exec/sparse_nd.py), SpGEMM, which works
    on the occupied row, shared and column ids (exec/sparse_kernels.py ``_spgemm_coo``), and
    the elementwise join, on the entries (exec/sparse_hyper.py)."""
    if kern is None or len(op.inputs[k].labels) != 2 or "coo" not in st[k].formats:
        return False
    if kern[0] in ("spreduce", "spjoin") or (kern[0] == "spmm" and len(op.inputs) == 2):
        return False
    return True
