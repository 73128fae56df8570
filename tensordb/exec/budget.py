"""Admission against the memory budget: the pool asks before a task runs.

A run with a ``memory_limit`` reserves, before each task runs, the bytes it will hold
(``working_bytes``: its output tile, absent input tiles as zeros, and its kernel's temporaries,
the very figure the optimizer projected: ``plan.memory.kernel_temporaries``). When the
tiles alive (``Ledger.live``) plus the reservations of running tasks plus this one would cross
the limit, it

a. spills resident intermediate tiles that no running task reads (and that the task itself does
   not read), those needed furthest in the plan's order first (``spill.py``: written to disk,
   read back memory-mapped; on a GPU, ``DeviceTiles.evict``: copied to host memory and back
   onto the device when a task reads them), until it fits;
b. else waits for a running task to end (the queue wakes it);
c. else, when nothing runs, spills the task's own inputs too, and if that is not enough runs it
   anyway and counts it (``over_budget``): the planner guarantees that one task's working set
   fits.

On a GPU the device cache's tiles that no task holds (``devcache.py``, ``idle_bytes``) count
with the run's, and are the first to go (least recently used first), before (a).

Aggregation folds are always admitted: they free a partial. Every method is called under the
ready queues' lock (``ready.py``), so admissions are serial; only the pool's workers call it.
"""
from __future__ import annotations

import ctypes
import math
import sys
from collections import Counter

import numpy as np

from ..physical.plan import Aggregate, Kernel, Load
from ..plan.memory import kernel_temporaries
from ..storage.boxes import RowGather
from ..storage.sparse import is_sparse
from . import gpu_sparse
from .sizes import coo_box_bytes, graphblas_bytes, planned_bytes, sparse_box_bytes

__all__ = ["Budget", "working_bytes", "temporary_bytes", "may_cross", "upper_bytes", "load_bytes",
           "device_upper_bytes",
           "return_freed_memory", "HEAP_SLACK"]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_malloc_set = False
# The freed memory glibc may keep per thread at its largest dynamic mmap threshold (2 x 32 MiB):
# a pool sets a fixed threshold only when its threads' share of this is more than a quarter of
# the memory_limit, since mapping every tile afresh costs page faults on every large allocation.
HEAP_SLACK = 64 << 20


def return_freed_memory() -> None:
    """Have freed tiles go back to the system at once (glibc, once per process).

    glibc serves a block below its mmap threshold from its heaps, and raises that threshold to
    the size of each large block freed (up to 32 MiB): tiles of a few MiB then come from heaps
    that keep up to twice that of freed memory per thread, which the budget does not see. A
    fixed threshold (1 MiB) maps every tile on its own and unmaps it when freed. Called when an
    executor with a memory_limit small next to that slack is made (``HEAP_SLACK``); elsewhere
    (no glibc) it does nothing."""
    global _malloc_set
    if _malloc_set or not sys.platform.startswith("linux"):
        return
    _malloc_set = True
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):  # musl or another libc: it has no such heaps
        pass


def working_bytes(plan, task, loads_copy: bool = False) -> int:
    """The bytes ``task`` holds while it runs, from the plan alone: its output tile, plus for a
    kernel call the zeros of absent inputs and its kernel's temporaries (``temporary_bytes``).
    A Load reserves nothing (a view of a stored tile; a copy counts once made), unless
    ``loads_copy``: on a GPU every Load is a copy of its box in device memory (a box of CSR
    tiles: their arrays, ``gpu_sparse.load_bytes``)."""
    if isinstance(task, Load):
        if not loads_copy:
            return 0
        csr = gpu_sparse.load_bytes(plan, task) if task.key in _device_sparse(plan) else None
        return planned_bytes(plan, task) if csr is None else csr
    out = planned_bytes(plan, task)
    if not isinstance(task, Kernel):
        return out
    op = plan.ops[task.op]
    in_dtypes = op.in_dtypes or (op.dtype,) * len(op.inputs)
    zeros = sum(math.prod(shape) * np.dtype(dt).itemsize  # an absent tile is made of zeros
                for key, shape, dt in zip(task.args, task.arg_shapes, in_dtypes) if key is None)
    return out + zeros + temporary_bytes(plan, task)


def temporary_bytes(plan, task) -> int:
    """What kernel call ``task`` allocates besides its output (``plan.memory.kernel_temporaries``,
    the optimizer's figure, on this call's tiles): reserved before it runs, and counted by the
    run's ledger while it runs."""
    memo = getattr(plan, "memo", None)
    key = ("temporaries", task.op, task.arg_shapes)
    found = memo.get(key) if memo is not None else None
    if found is None:
        op = plan.ops[task.op]
        ext = {}
        for o, shape in zip(op.inputs, task.arg_shapes):
            ext.update(zip(o.labels, shape))
        found = kernel_temporaries(op, plan.kernels[task.op], ext)
        if memo is not None:
            memo[key] = found
    return found


def may_cross(plan, limit: int, sparse: bool = False) -> bool:
    """Could a run of ``plan`` hold more than ``limit`` bytes? Not when every task's working
    bytes and every accumulator together fit: then no admission is needed, and the run goes as
    one without a limit (the default limit, most of the machine's memory, is far from most
    plans). Computed once per plan and versions read (``upper_bytes``). ``sparse``: the run's
    Loads read sparse boxes as they are (host tiles; see ``upper_bytes``)."""
    return upper_bytes(plan, sparse) > limit


def upper_bytes(plan, sparse: bool = False) -> int:
    """The most bytes a run of ``plan`` could hold: every task's working bytes, accumulators,
    and Loads at their full size (kept in the plan's memo for the versions it reads).
    ``sparse``: a box of sparse tiles that only sparse kernels read counts its stored entries
    (``load_bytes``), as the host pool reads it; else (a GPU's tiles: a box read dense onto
    the device) its dense bytes."""
    memo = getattr(plan, "memo", {})
    key = "upper_bytes_sparse" if sparse else "upper_bytes"
    token = _versions(plan)
    kept = memo.get(key)
    bound = kept[1] if kept is not None and kept[0] == token else None
    if bound is None:
        bound = sum(working_bytes(plan, t) for t in plan.tasks)
        # accumulators, and Loads at their full size: a box off the stored tiles is a copy (a
        # box of sparse tiles that only sparse kernels read: its stored entries, load_bytes)
        read_sparse = _read_sparse(plan) if sparse else set()
        bound += sum(load_bytes(plan, t, t.key in read_sparse) if isinstance(t, Load)
                     else planned_bytes(plan, t)
                     for t in plan.tasks if isinstance(t, (Aggregate, Load)))
        # and a GraphBLAS kernel's copy of such a box, made while the box is held (the graph
        # cache keeps it after the run): a shortest-path step's is larger than the box
        copied = _read_sparse(plan, graphblas=True) & read_sparse
        bound += sum(graphblas_bytes(plan, t) or 0 for t in plan.tasks
                     if isinstance(t, Load) and t.key in copied)
        memo[key] = (token, bound)
    return bound


def _versions(plan) -> tuple:
    """What the bound of ``plan`` depends on beyond the plan cache's key (the inputs' layout):
    the bytes of each input read, and the version of each one with sparse tiles (a box of
    sparse tiles counts its stored entries, tile by tile); a cached plan's memo is shared by its
    copies bound to later versions (driver/cache.py ``rebind``). A dense input's new version of
    the same layout (a training step's weights) keeps the bound: worked out again each call,
    it cost a logistic step 80 us."""
    return tuple((getattr(m, "version", None) if getattr(r, "has_sparse", True) else None,
                  getattr(m, "nbytes", None))
                 for r, m in ((r, getattr(r, "meta", None)) for r in plan.readers.values()))


def device_upper_bytes(plan) -> int:
    """``upper_bytes`` as a GPU holds the run: every Load a copy of its box on the device, a box
    of CSR tiles that stays CSR there at its arrays' bytes (``working_bytes(loads_copy=True)``),
    not its dense extent (a million-node graph's box would count terabytes and empty the device
    cache before every run). Kept in the plan's memo for the versions it reads."""
    memo = getattr(plan, "memo", {})
    token = _versions(plan)
    kept = memo.get("upper_bytes_device")
    bound = kept[1] if kept is not None and kept[0] == token else None
    if bound is None:
        bound = sum(working_bytes(plan, t, loads_copy=True) for t in plan.tasks)
        bound += sum(planned_bytes(plan, t) for t in plan.tasks if isinstance(t, Aggregate))
        memo["upper_bytes_device"] = (token, bound)
    return bound


def load_bytes(plan, task: Load, sparse_read: bool = True) -> int:
    """The most bytes Load ``task``'s tile holds on the host: a box of a matrix's sparse tiles is
    read as their entries (``runtime.sparse_box_bytes``), which a sparse kernel reads as it is;
    anything else (a dense tile, a box some consumer densifies: ``sparse_read`` False) at its
    dense bytes (``runtime.planned_bytes``)."""
    csr = sparse_box_bytes(plan, task, building=True) if sparse_read else None
    if csr is None and sparse_read:  # rank 3 or more: its entries as a CooTile
        csr = coo_box_bytes(plan, task)
    return planned_bytes(plan, task) if csr is None else csr


def _read_sparse(plan, graphblas: bool = False) -> set:
    """The keys of the Loads whose every consumer is a sparse kernel reading that operand as
    it is: the semiring kernels and GraphBLAS's SpGEMM (``KernelChoice.semiring``) any
    operand, the other sparse methods the one they name sparse (``KernelChoice.sparse``), an
    elementwise join of two sparse operands both, an ``spmm`` of a tensor of rank 3 or more
    both (its partner a matrix or of rank 3 or more: exec/sparse_nd_join.py ``contract_coo``).
    A Load read by any other task (a dense kernel, an assembly) is densified there.
    ``graphblas``: the keys of the Loads some GraphBLAS kernel (a semiring kernel, GraphBLAS's
    SpGEMM) reads, which copies them in."""
    loads = {t.key for t in plan.tasks if isinstance(t, Load)}
    if not loads:
        return set()
    from ..plan.kernel import SPARSE_METHODS
    if graphblas:
        return {k for t in plan.tasks if isinstance(t, Kernel) and (
            plan.kernels[t.op].semiring is not None or plan.kernels[t.op].method == "semiring")
            for k in t.args if k in loads}
    ok = dict.fromkeys(loads, True)
    for t in plan.tasks:
        for pos, k in enumerate(getattr(t, "args", None) or getattr(t, "inputs", ()) or ()):
            if k not in ok or not ok[k]:
                continue
            if not isinstance(t, Kernel):
                ok[k] = False
                continue
            c = plan.kernels[t.op]
            ok[k] = c.method in SPARSE_METHODS and (
                c.semiring is not None or c.method == "semiring" or pos == c.sparse
                or (c.method == "spjoin" and not c.gathers)  # a join: both operands
                or (c.method == "spmm" and _rank3(plan, t, c.sparse)
                    and len(plan.ops[t.op].inputs[pos].labels) > 1))
    return {k for k, v in ok.items() if v}


def _rank3(plan, task, pos: int) -> bool:
    """Whether operand ``pos`` of kernel ``task`` has rank 3 or more (an ``spmm`` of two such
    sparse tensors reads both as their entries: exec/sparse_nd_join.py ``contract_coo``)."""
    return len(plan.ops[task.op].inputs[pos].labels) > 2


def _device_sparse(plan) -> set:
    """The keys of the Loads whose every consumer keeps that operand CSR on a GPU (a cupyx
    method, ``plan.kernel.device_method``: the sparse operand of each, both of a SpGEMM or an
    elementwise join, the mask and a CSR factor of a masked product). One any other task reads
    (a dense kernel, a semiring, MAX or MIN, an SDDMM's factor) is densified on the device
    (``gpu_sparse.dense``): its admission counts the dense box. Once a plan."""
    memo = getattr(plan, "memo", {})
    kept = memo.get("device_sparse")
    if kept is not None and kept[0] is plan.tasks:
        return kept[1]
    from ..plan.device_kernel import device_method
    ok = {t.key: True for t in plan.tasks if isinstance(t, Load)}
    for t in plan.tasks:
        keys = t.args if isinstance(t, Kernel) else getattr(t, "parts", None) or \
            tuple(p[0] for p in getattr(t, "pieces", ()))
        for pos, k in enumerate(keys):
            if k not in ok or not ok[k]:
                continue
            method = None
            if isinstance(t, Kernel):
                c = plan.kernels[t.op]
                method = device_method(plan.ops[t.op], c)
            ok[k] = method in ("spmm", "spjoin", "masked") or (
                method in ("spreduce", "sddmm") and pos == c.sparse)
    found = {k for k, v in ok.items() if v}
    memo["device_sparse"] = (plan.tasks, found)
    return found


class Budget:
    """One run's reservations and spills (see the module docstring)."""

    def __init__(self, run, limit: int, spill) -> None:
        self.run, self.limit, self.spill = run, int(limit), spill
        self.plan, self.ledger = run.plan, run.ledger
        self.loads_copy = getattr(run.tiles, "loads_copy", False)  # device tiles (gpu.py)
        # A GPU's cached tiles that no task holds count too, and go first (exec/devcache.py).
        self.cache = getattr(run.tiles, "cache", None)
        self.rank = run.rank
        self.reserved = 0
        self.running = 0
        self.reservations: dict[int, int] = {}
        self.in_use: Counter = Counter()   # tile key -> running tasks that read it
        self.started: set[int] = set()
        self.spilled: set[int] = set()
        self.over_budget = 0               # tasks run with the budget crossed (case c)
        self.spill_failed = False          # a spill file could not be written: spill no more

    def admit(self, kind: str, task, part=None, force: bool = False) -> bool:
        """May the item run now (``force``: it runs regardless, e.g. to be skipped after an
        error)? Its reservation is kept until ``ended``."""
        if kind == "acc":
            self.running += 1
            self.in_use[part] += 1
            return True
        need = working_bytes(self.plan, task, self.loads_copy)
        idle = self.cache.idle_bytes if self.cache is not None else 0
        excess = self.ledger.live + self.reserved + need + idle - self.limit
        if excess > 0 and idle and not force:
            excess -= self.cache.make_room(excess)  # least recently used cached tiles first
        if excess > 0 and not force:
            inputs = set(task.inputs)  # needed now: spilled last, when nothing else can run
            excess -= self._spill(excess, inputs)
            if excess > 0:
                if self.running:
                    return False
                excess -= self._spill(excess, ())
                if excess > 0:
                    self.over_budget += 1
        self.reserved += need
        self.reservations[task.key] = need
        self.running += 1
        self.started.add(task.key)
        for k in task.inputs:
            self.in_use[k] += 1
        return True

    def ended(self, kind: str, task, part=None) -> None:
        self.running -= 1
        if kind == "acc":
            self._unuse(part)
            return
        self.reserved -= self.reservations.pop(task.key, 0)
        for k in task.inputs:
            self._unuse(k)

    def _unuse(self, key) -> None:
        n = self.in_use[key] - 1
        if n:
            self.in_use[key] = n
        else:
            del self.in_use[key]

    def _next_use(self, key) -> int:
        """When ``key`` is needed next: the lowest rank of its consumers not yet started; a
        partial waits only for its fold (folds run first), so it counts as needed now."""
        if key in self.run.agg_of:
            return -1
        later = [self.rank.get(c, 0) for c in self.run.consumers[key] if c not in self.started]
        return min(later) if later else -1

    def _spill(self, excess: int, keep) -> int:
        """Spill tiles (not those in ``keep``) until ``excess`` bytes are freed (or none is
        left); the bytes freed."""
        if not getattr(self.run.tiles, "spills", False) or self.spill_failed:
            return 0
        held = self.ledger.held
        # A stored output's tile stays where it is until the run ends; on a GPU it may go to
        # host memory early (it goes there at the end anyway).
        outputs_too = getattr(self.run.tiles, "evict", None) is not None
        candidates = [k for k in list(self.run.results)
                      if held.get(k, 0) > 0 and k not in self.in_use
                      and (outputs_too or k not in self.run.keep)
                      and k not in self.spilled and k not in keep]
        candidates.sort(key=self._next_use, reverse=True)
        freed = 0
        for k in candidates:
            if freed >= excess:
                break
            freed += self._spill_one(k)
        return freed

    def _spill_one(self, key: int) -> int:
        run = self.run
        with run.lock:
            value = run.results.get(key)
        if value is None or is_sparse(value) or isinstance(value, RowGather):
            return 0  # a CSR output tile stays (its entries only), a gather (its row numbers)
        evict = getattr(run.tiles, "evict", None)  # device tiles go to host memory instead
        try:
            mapped, nbytes, seconds = evict(value) if evict else self.spill.write(key, value)
        except OSError:  # a full or unwritable disk: keep tiles in memory (wait, or run over)
            self.spill_failed = True
            return 0
        with run.lock:
            if key not in run.results:  # its last consumer ran meanwhile (it cannot: in_use)
                return 0
            run.results[key] = mapped
        self.spilled.add(key)
        return self.ledger.spilled(key, nbytes, seconds)
