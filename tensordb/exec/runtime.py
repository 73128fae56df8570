"""The runtime every executor shares: running one task, counting its bytes, naming its failures.

An executor (the local pool, Dask, the GPU pool) decides only where a task runs and how a tile
moves there. What a task does, what it costs and what its failure means is decided here, once:

- ``TaskRunner`` is the task interpreter: inputs -> tile function -> output tile, or one step of
  an aggregation fold (start, fold, finish); every exception leaves it as a tensordb error naming
  the operation (``translate``).
- ``Ledger`` is the byte accounting of one run: tiles acquired and released (the bytes alive and
  their peak), bytes moved between workers, seconds and kernel calls, per operation. ``acquire``
  and ``release`` are the one place a task's tile bytes enter and leave the run's memory: the seam
  the memory budget builds on (``budget.py`` reserves before a task runs, ``spilled`` counts a
  tile written to a spill file); ``planned_bytes`` sizes a tile from the plan before its task
  runs.
- ``RunControl`` is cancellation and progress: kernels call ``check(fraction)`` between chunks;
  it raises ``Cancelled`` once the run has failed or was interrupted.

A run returns a ``RunResult``: the output tiles and the run's statistics, per operation in
``ops`` (what EXPLAIN ANALYZE shows); nothing is written into the plan.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError, Error, InternalError, OperationalError, OutOfMemoryError
from ..physical.plan import Aggregate, Assemble, Kernel, Load, TilePlan
from ..storage.sparse import is_sparse, tile_nbytes
from .kernels import KernelSpec, combine
from .sizes import planned_bytes  # noqa: F401 - callers import it from the runtime
from .tasks import (finish_aggregate, run_aggregate, run_assemble, run_kernel, run_load,
                    start_aggregate)

__all__ = ["RunResult", "OpMeasure", "TaskRunner", "Ledger", "RunControl", "Cancelled",
           "translate", "op_of", "held_bytes", "planned_bytes", "plan_specs"]


@dataclass
class OpMeasure:
    """What one operation of a run measured (EXPLAIN ANALYZE's starred columns)."""

    seconds: float = 0.0        # task time summed over workers
    kernel_calls: int = 0
    bytes_moved: int = 0        # bytes of its tasks' inputs read from another worker
    peak_tile_bytes: int = 0    # its largest tile
    peak_bytes: int = 0         # the run's tile bytes alive when one of its tiles was made
    spilled_bytes: int = 0      # bytes of its tiles written to spill files
    spill_seconds: float = 0.0  # time spent writing them
    out_nnz: int | None = None  # the entries of its finished output tiles returned sparse

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "kernel_calls": self.kernel_calls,
                "bytes_moved": self.bytes_moved, "peak_tile_bytes": self.peak_tile_bytes,
                "peak_bytes": self.peak_bytes, "spilled_bytes": self.spilled_bytes,
                "spill_seconds": self.spill_seconds,
                **({"out_nnz": self.out_nnz} if self.out_nnz is not None else {})}

    def count_sparse(self, value) -> None:
        """Add a finished output tile's entries where it is a sparse tile (a sparse
        intermediate's CSR tile: EXPLAIN ANALYZE's measured nnz beside the estimate)."""
        n = sparse_entries(value)
        if n is not None:
            self.out_nnz = (self.out_nnz or 0) + n


def sparse_entries(value) -> int | None:
    """The entries a sparse tile stores (a scipy array, a ``Filled`` one); None for a dense one."""
    if isinstance(value, np.ndarray) or value is None:
        return None
    csr = getattr(value, "csr", value)
    n = getattr(csr, "nnz", None)
    return int(n) if n is not None and not isinstance(csr, np.ndarray) else None


def final_keys(plan) -> frozenset:
    """The task keys that make an output tile of some operation (its kernel call, or the
    aggregation of its partials), kept with the plan (a cached plan runs again)."""
    memo = getattr(plan, "memo", None)
    keys = memo.get("final_keys") if memo is not None else None
    if keys is None:
        keys = frozenset(k for out in plan.outputs.values() for k in out.tiles.values())
        if memo is not None:
            memo["final_keys"] = keys
    return keys


@dataclass
class RunResult:
    tiles: dict = field(repr=False)  # output task key -> tile (numpy array)
    seconds: float = 0.0
    bytes_moved: int = 0        # bytes of tiles read by a worker other than their producer
    peak_bytes: int = 0         # the most tile bytes alive at once (owned arrays, not mmap views)
    kernel_calls: int = 0
    worker_busy: list = field(default_factory=list)
    nnz: dict = field(default_factory=dict, repr=False)  # output key -> nonzeros, when counted
    nonfinite: dict = field(default_factory=dict, repr=False)  # output key -> holds NaN/inf
    crc32: dict = field(default_factory=dict, repr=False)  # output key -> zlib.crc32 of its bytes
    ops: list = field(default_factory=list)  # OpMeasure per operation of the plan
    spilled_bytes: int = 0      # bytes of intermediate tiles written to spill files
    spill_seconds: float = 0.0  # time spent writing them
    over_budget: int = 0        # tasks run although the memory_limit was crossed (exec/budget.py)
    memory_limit: int | None = None  # the budget the run kept (None: none)
    # On a GPU: bytes copied host_to_device, device_to_host and between devices (peer), and the
    # device cache's hits, misses and evictions (exec/gpu.py); empty for host tiles.
    copies: dict = field(default_factory=dict)


# -- errors ------------------------------------------------------------------------------------

class Cancelled(Exception):
    """Raised inside a kernel to stop it: the run already has the error that ends it."""


def translate(exc: BaseException, op=None) -> BaseException:
    """A tile task's exception as a tensordb error naming the operation (``op``, an EinOp) it
    ran for; tensordb errors, cancellations and interrupts pass unchanged."""
    if isinstance(exc, (Error, Cancelled)) or not isinstance(exc, Exception):
        return exc
    where = f" of {op.describe()}" if op is not None else ""
    if isinstance(exc, MemoryError):
        return OutOfMemoryError(f"out of memory while running a tile task{where}: {exc}")
    if isinstance(exc, (ValueError, ArithmeticError)):  # the data, e.g. int ** negative int
        return DataError(f"a tile kernel{where} failed on the data: {exc}")
    if isinstance(exc, OSError):  # a payload file or the system, not tensordb's code
        return OperationalError(f"a tile task{where} failed: {type(exc).__name__}: {exc}")
    err = InternalError(f"a tile task{where} failed: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def _reraise(exc: BaseException, op):
    """Raise ``exc`` as ``translate`` makes it (the original as the cause)."""
    err = translate(exc, op)
    if err is exc:
        raise exc
    raise err from exc


# -- tile bytes --------------------------------------------------------------------------------

def _owned_nbytes(a) -> int:
    """Bytes of process memory a tile holds: 0 for views of memory-mapped files (stored tiles,
    output buffers), which the page cache holds. A device array (CuPy's: no NumPy array) is a
    copy on the device: all of it."""
    if not isinstance(a, np.ndarray):
        if hasattr(a, "nbytes") or is_sparse(a):
            return int(getattr(a, "nbytes", 0))
        return tile_nbytes(a)  # a device CSR tile (cupyx's have no nbytes): its three arrays
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return int(a.nbytes) if isinstance(base, np.ndarray) else 0


def held_bytes(task, value) -> int:
    """The memory a tile alive in the run stands for: all of it for a tile the run computed
    (written into an output file's mapping or not, its pages are this run's), only what it owns
    for a Load (a view of a stored tensor costs nothing until read; absent tiles are zeros)."""
    return _owned_nbytes(value) if isinstance(task, Load) else tile_nbytes(value)


# -- the task interpreter ----------------------------------------------------------------------

def op_of(plan: TilePlan, task):
    """The EinOp a task runs for: a kernel's own, else its owner's (the operation whose inputs
    it reads or whose partials it combines)."""
    return plan.ops[task.op if isinstance(task, Kernel) else plan.owner.get(task.key, 0)]


def plan_specs(plan, xp) -> dict:
    """The dict a ``TaskRunner`` keeps the KernelSpecs of ``plan``'s operations in, shared by
    every run of the plan with ``xp``: kept in its ``memo``, which a cached plan's rebound
    copies share (a training step's kernels are then set up once, not at each step: 17 us an
    operation). The entry holds the operations and kernel choices it was made for, and a plan
    that shares the memo with other ones (``dataclasses.replace``) gets a new one."""
    entry = plan.memo.get("kernel_specs")
    if entry is None or entry[0] is not plan.ops or entry[1] is not plan.kernels or \
            entry[2] is not xp:
        entry = plan.memo["kernel_specs"] = (plan.ops, plan.kernels, xp, {})
    return entry[3]


class TaskRunner:
    """Runs tasks with one array module ``xp`` (NumPy, CuPy): the same code in every executor.

    ``check``, if given, is passed to kernels (progress and cancellation, see RunControl).
    """

    def __init__(self, xp=np, check=None, specs: dict | None = None) -> None:
        self.xp, self.check = xp, check
        # op index -> KernelSpec, built when first needed: once per run, or once per plan
        # where the caller keeps them (``plan_specs``)
        self._specs: dict[int, KernelSpec] = {} if specs is None else specs

    def run(self, task, inputs: list, op, *, choice=None, out=None, source=None, sink=None):
        """The tile of a Load, Assemble or Kernel (or a whole Aggregate) from its ``inputs``, in
        ``task.inputs`` order. ``op`` is the EinOp the task belongs to and ``choice`` its
        kernel choice from the plan (``TilePlan.kernels``); ``out`` a buffer the result may land
        in; ``source`` the reader of a Load; ``sink`` a kernel's receiver of the slabs of
        ``out`` as they are finished (``KernelSpec``)."""
        try:
            if isinstance(task, Load):
                return run_load(task, source, self.xp)
            if isinstance(task, Assemble):
                return run_assemble(task, inputs, self.xp)
            if isinstance(task, Kernel):
                spec = self._specs.get(task.op)
                if spec is None:
                    spec = self._specs[task.op] = KernelSpec(op, self.xp, choice)
                it = iter(inputs)
                args = [None if a is None else next(it) for a in task.args]
                return run_kernel(task, spec, args, out, self.check, sink)
            return run_aggregate(task, inputs, self.xp)  # all partials at once
        except BaseException as exc:
            _reraise(exc, op)

    # An aggregation fold, one partial at a time (the partial may be freed after each call).
    def start(self, task: Aggregate, first, op, out=None):
        try:
            return start_aggregate(task, first, self.xp, out)
        except BaseException as exc:
            _reraise(exc, op)

    def fold(self, task: Aggregate, acc, part, op):
        """``part`` folded into ``acc``: the accumulator (a new one where a tile is sparse)."""
        try:
            return combine(task.agg, acc, part, self.xp)
        except BaseException as exc:
            _reraise(exc, op)

    def finish(self, task: Aggregate, acc, op):
        try:
            return finish_aggregate(task, acc, self.xp)
        except BaseException as exc:
            _reraise(exc, op)


# -- the byte accounting -----------------------------------------------------------------------

class Ledger:
    """Bytes, seconds and calls of one run, per operation; safe to call from any worker thread."""

    def __init__(self, plan: TilePlan, workers: int) -> None:
        self.owner = plan.owner
        self.lock = threading.Lock()
        self.live = 0
        self.peak = 0
        self.moved_bytes = 0
        self.spilled_bytes = 0
        self.spill_seconds = 0.0
        self.held: dict = {}  # tile key -> bytes acquired for it
        self.working = 0      # running kernel calls' temporaries (``hold``), beside ``live``
        self.busy = [0.0] * workers
        self.ops = [OpMeasure() for _ in plan.ops]
        self.final = final_keys(plan)

    def _op(self, task) -> OpMeasure:
        return self.ops[self.owner.get(task.key, 0)]

    def acquire(self, key, nbytes: int) -> None:
        """A tile of ``nbytes`` enters the run's memory (an accumulator; a task's output through
        ``produced``); the pool's budget reserves room before the task runs (budget.py)."""
        with self.lock:
            self._acquire(key, nbytes)

    def _acquire(self, key, nbytes: int) -> None:  # the caller holds the lock
        self.held[key] = self.held.get(key, 0) + nbytes
        self.live += nbytes
        self._peak(key)

    def _peak(self, key) -> None:  # the caller holds the lock
        now = self.live + self.working
        if now > self.peak:
            self.peak = now
        m = self.ops[self.owner.get(key, 0)]
        if now > m.peak_bytes:
            m.peak_bytes = now

    def hold(self, key, nbytes: int) -> None:
        """Kernel call ``key`` allocates ``nbytes`` of temporaries while it runs (its chunks, its
        copies: ``budget.temporary_bytes``); ``drop(key)`` when it has returned. They count in
        the run's peak, not in ``live`` (the budget reserved them with the call)."""
        with self.lock:
            self.working += nbytes
            self._peak(key)

    def drop(self, nbytes: int) -> None:
        with self.lock:
            self.working -= nbytes

    def release(self, key) -> None:
        """The tile ``key`` leaves memory (its last consumer ran)."""
        with self.lock:
            self.live -= self.held.pop(key, 0)

    def spilled(self, key, nbytes: int, seconds: float) -> int:
        """Tile ``key`` (``nbytes``) was written to a spill file and leaves memory: the bytes
        it held are returned."""
        with self.lock:
            freed = self.held.pop(key, 0)
            self.live -= freed
            self.spilled_bytes += nbytes
            self.spill_seconds += seconds
            m = self.ops[self.owner.get(key, 0)]
            m.spilled_bytes += nbytes
            m.spill_seconds += seconds
        return freed

    def moved(self, task, nbytes: int) -> None:
        """``task`` read a tile of ``nbytes`` produced on another worker (or device)."""
        with self.lock:
            self.moved_bytes += nbytes
            self._op(task).bytes_moved += nbytes

    def produced(self, task, held: int, nbytes: int, value=None) -> None:
        """``task``'s tile of ``nbytes`` exists: ``acquire(task.key, held)`` and the largest tile
        of its operation, under one lock (this runs once per task); ``value``: the tile, whose
        entries count where it is a sparse output tile (``OpMeasure.count_sparse``)."""
        with self.lock:
            self._acquire(task.key, held)
            m = self._op(task)
            m.peak_tile_bytes = max(m.peak_tile_bytes, nbytes)
            if value is not None and task.key in self.final:
                m.count_sparse(value)

    def ran(self, task, worker: int, seconds: float) -> None:
        with self.lock:
            self.busy[worker] += seconds
            m = self._op(task)
            m.seconds += seconds
            m.kernel_calls += isinstance(task, Kernel)

    def result(self, tiles: dict, seconds: float, **extra) -> RunResult:
        return RunResult(tiles, seconds, self.moved_bytes, self.peak,
                         sum(m.kernel_calls for m in self.ops), list(self.busy), ops=self.ops,
                         spilled_bytes=self.spilled_bytes, spill_seconds=self.spill_seconds,
                         **extra)


# -- cancellation and progress -----------------------------------------------------------------

class RunControl:
    """The first error of a run (which cancels it) and its progress: ``done`` of ``total`` tasks
    plus the fractions of the kernel calls running now, reported to ``progress(done, total)``."""

    def __init__(self, total: int, progress=None) -> None:
        self.total, self.progress = total, progress
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.done = 0
        self.partial: dict[int, float] = {}  # worker thread -> fraction of its kernel call done
        # ``progress`` is called on the thread that made the run (which reports while it waits,
        # in short ticks), never on a worker: a callback may then use the connection, whose
        # calls wait for the one running the plan (calls.py) and so would wait for ever.
        self.owner = threading.get_ident()

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` as the run's error unless it already has one; running kernels stop."""
        with self.lock:
            if self.error is None:
                self.error = exc

    def check(self, fraction: float | None = None) -> None:
        """Called by kernels between chunks: stop when the run has failed or was cancelled, and
        report progress within the call, so that a plan of a few long calls shows it too."""
        if self.error is not None:
            raise Cancelled()
        if fraction is not None and self.progress is not None:
            self.partial[threading.get_ident()] = fraction
            self.report()  # on a worker: counted, reported by the owner's next tick

    def call_ended(self) -> None:
        with self.lock:
            self.partial.pop(threading.get_ident(), None)

    def task_done(self) -> int:
        with self.lock:
            self.done += 1
            done = self.done
        if self.progress is not None and threading.get_ident() == self.owner:
            self.progress(done, self.total)
        return done

    def report(self) -> None:
        if self.progress is None or threading.get_ident() != self.owner:
            return
        with self.lock:
            done = self.done
            running = sum(self.partial.values())
        self.progress(min(done + running, self.total), self.total)
