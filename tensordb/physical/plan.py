"""The tile plan: what the executor runs. Every decision is already made; the executor decides nothing.

Tasks are small frozen records with integer keys, listed in a topological order. Each names the
worker it runs on. A task's inputs are the keys of earlier tasks; a task on worker w that reads a
tile produced on worker v != w is a counted transfer.

- ``Load``      read a box of a stored tensor (a memory-mapped view when it is one stored tile or a
                contiguous run of them, else an assembled copy; absent parts are zeros).
- ``Assemble``  re-tile: build a box from pieces of other tasks' tiles (counted as re-tiled bytes).
- ``Kernel``    one call of an operation's tile kernel; ``None`` inputs are absent tiles (zeros).
- ``Aggregate`` combine the partial results of one output tile with the operation's AGG.

Per operation the plan also carries its ``KernelChoice`` (choice.py): how its kernel computes.

A plan of many operations on many workers has one task per kernel call (64,000 for 1,000
operations on 64 workers), so the planner keeps an operation's calls as arrays (``CallBlock``)
and makes the task objects only when something reads ``TilePlan.tasks`` (the executor); EXPLAIN
reads the per-operation facts placement computed from the arrays (``TilePlan.deferred``).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np

from ..geometry import Grid
from ..plan.ir import EinOp
from .choice import KernelChoice, choose_kernel

__all__ = ["Load", "Assemble", "Kernel", "Aggregate", "Task", "OutputTiles", "OpStats", "TilePlan",
           "CallBlock", "Columns", "Once", "describe_tasks"]

# A task's bytes as placement counts them, at most: a sparse tile's extents can pass int64 in
# bytes (its entries are what moves), and a call's inputs summed in int64 stay below 2^63.
BYTES_CAP = 1 << 56

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (starts, stops)


@dataclass(frozen=True)
class Load:
    key: int
    tensor: str
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    worker: int = 0

    @property
    def inputs(self) -> tuple[int, ...]:
        return ()


@dataclass(frozen=True)
class Assemble:
    key: int
    shape: tuple[int, ...]
    dtype: str
    # (source key, source slices, destination slices); slices are ((start, stop), ...) per dim
    pieces: tuple[tuple[int, tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]], ...]
    worker: int = 0

    @property
    def inputs(self) -> tuple[int, ...]:
        return tuple(p[0] for p in self.pieces)


@dataclass(frozen=True)
class Kernel:
    key: int
    op: int                                  # index into TilePlan.ops
    args: tuple[int | None, ...]             # one key per operand; None = absent (zeros)
    arg_shapes: tuple[tuple[int, ...], ...]  # tile shape of each operand
    out_shape: tuple[int, ...]
    coords: tuple[int, ...]                  # piece index of every label of the op (op.labels order)
    flops: int = 0
    worker: int = 0

    @property
    def inputs(self) -> tuple[int, ...]:
        return tuple(a for a in self.args if a is not None)


@dataclass(frozen=True)
class Aggregate:
    key: int
    agg: str
    parts: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    fill_zero: bool = False  # some combinations were skipped (certainly 0): a 0 takes part in a max/min/prod
    worker: int = 0

    @property
    def inputs(self) -> tuple[int, ...]:
        return self.parts


Task = Union[Load, Assemble, Kernel, Aggregate]


def _make(cls, fields: dict):
    """A task from checked fields, without its constructor (a plan makes one per kernel call)."""
    task = object.__new__(cls)
    task.__dict__.update(fields)
    return task


@dataclass
class CallBlock:
    """The kernel calls of one operation as arrays, one row per call: what lowering makes and
    placement reads; ``kernels()`` makes the ``Kernel`` tasks when the executor needs them.

    ``args[r, k]`` is the key of operand k's tile in call r (-1: absent, zeros); ``extents[d]``
    the size of each piece of label d; ``dims[k]`` the label positions of operand k."""

    op: int
    keys: np.ndarray                 # (n,) task key of each call
    coords: np.ndarray               # (n, labels) piece index of every label of the op
    args: np.ndarray                 # (n, operands)
    flops: np.ndarray                # (n,)
    out_bytes: np.ndarray            # (n,) bytes of each call's output tile
    extents: tuple[np.ndarray, ...]  # per label
    dims: tuple[tuple[int, ...], ...]
    out_pos: tuple[int, ...]
    tasks: list | None = None        # the Kernels themselves, when the block was made from them

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def of(cls, op: int, kernels: list[Kernel], itemsize: int) -> "CallBlock":
        """The block of Kernel tasks made one by one (a plan built by hand)."""
        n, width = len(kernels), max((len(k.args) for k in kernels), default=0)
        args = np.full((n, width), -1, dtype=np.int64)
        for r, k in enumerate(kernels):
            args[r, :len(k.args)] = [-1 if a is None else a for a in k.args]
        return cls(op, np.array([k.key for k in kernels], dtype=np.int64), np.zeros((n, 0), np.int64),
                   args, np.array([k.flops for k in kernels], dtype=np.int64),
                   np.array([min(math.prod(k.out_shape) * itemsize, BYTES_CAP)
                             for k in kernels], dtype=np.int64),
                   (), (), (), list(kernels))

    def kernels(self) -> list[Kernel]:
        if self.tasks is not None:
            return self.tasks
        ext = [e.tolist() for e in self.extents]
        out: list[Kernel] = []
        op, dims, out_pos = self.op, self.dims, self.out_pos
        for key, coords, args, flops in zip(self.keys.tolist(), self.coords.tolist(),
                                            self.args.tolist(), self.flops.tolist()):
            extent = [ext[d][c] for d, c in enumerate(coords)]
            out.append(_make(Kernel, {
                "key": key, "op": op, "args": tuple(None if a < 0 else a for a in args),
                "arg_shapes": tuple(tuple(extent[d] for d in ds) for ds in dims),
                "out_shape": tuple(extent[d] for d in out_pos), "coords": tuple(coords),
                "flops": flops, "worker": 0}))
        return out


class Once:
    """A function called once: what it returned, shared by every later call (and thread)."""

    def __init__(self, fn) -> None:
        self.fn, self.made = fn, None
        self._lock = threading.Lock()

    def __call__(self):
        if self.made is None:
            with self._lock:
                if self.made is None:
                    self.made, self.fn = self.fn(), None
        return self.made


@dataclass
class Columns:
    """A plan's tasks as lowering made them: the kernel calls of each operation as arrays
    (``blocks``), every other task as an object (``others``: Loads, Assembles, Aggregates, with
    their operation in ``owner``). Keys are 0 .. ``n_keys`` - 1, in a topological order."""

    blocks: list[CallBlock]
    others: list
    owner: dict[int, int]
    n_keys: int

    def tasks(self) -> dict:
        """The task list (in key order) and every task's operation."""
        tasks: list = [None] * self.n_keys
        for t in self.others:
            tasks[t.key] = t
        owner = dict(self.owner)
        for b in self.blocks:
            for k in b.kernels():
                tasks[k.key] = k
            owner.update(dict.fromkeys(b.keys.tolist(), b.op))
        return {"tasks": tasks, "owner": owner}


@dataclass
class OutputTiles:
    """Where the tiles of one operation's result come from, in its output grid."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    grid: Grid
    tiles: dict[tuple[int, ...], int]   # output tile coords -> key of the task producing it
    stored: bool                        # a graph output (stored) or a temporary
    store_name: str = ""                # the catalog name it is stored under (default: name)


@dataclass
class OpStats:
    """Per-operation facts of the plan, filled at planning (a run returns its measurements in
    its RunResult, exec/runtime.py)."""

    op: EinOp
    pieces: dict[str, int]
    kernel_calls: int = 0
    aggregations: int = 0          # output tiles that combine more than one partial
    max_fan_in: int = 0            # the most partials any aggregation task combines
    agg_levels: int = 0            # levels of its deepest aggregation (1: one task; more: a tree)
    input_tiles: int = 0           # tiles read or re-tiled for the operation's inputs
    retile_bytes: int = 0          # bytes copied to cut and re-assemble input tiles
    flops: int = 0                 # flops of the kernel calls that exist (absent tiles excluded)


@dataclass
class TilePlan:
    ops: tuple[EinOp, ...]
    tasks: list[Task]
    outputs: dict[str, OutputTiles]
    stats: list[OpStats]
    workers: int
    owner: dict[int, int] = field(default_factory=dict)    # task key -> index of its operation
    readers: dict = field(default_factory=dict)            # stored input name -> TensorReader
    kernels: tuple[KernelChoice, ...] = ()                 # per operation (default: chosen for
                                                           # the whole operation)
    rank: dict[int, int] = field(default_factory=dict)     # task key -> its place in the order
                                                           # ready tasks run in (order.py)
    memo: dict = field(default_factory=dict)               # facts of the plan computed once (a
                                                           # cached plan's rebound copies share it)
    blas_threads: int = 0                                  # BLAS threads the local executor sets
                                                           # for the run (optimizer/threads.py;
                                                           # 0: its own rule, cores / busy workers)

    def task(self, key: int) -> Task:
        return self.tasks[self._pos[key]]

    @classmethod
    def deferred(cls, ops, outputs, stats, workers, readers, kernels, memo,
                 build: Callable[[], dict], **extra) -> "TilePlan":
        """A plan whose ``tasks``, ``owner`` and ``rank`` are made by ``build()`` when first read
        (once: copies share ``build``, which keeps what it made). ``extra``: other attributes
        (``columns``: the lowering's arrays; ``facts``: a function giving placement's totals
        for EXPLAIN: bytes moved per operation, flops per worker, how many tasks)."""
        plan = object.__new__(cls)
        plan.__dict__.update(ops=ops, outputs=outputs, stats=stats, workers=workers,
                             readers=readers, kernels=kernels, memo=memo, _build=build, **extra)
        return plan

    def __getattr__(self, name: str):
        # Only reached for an attribute not set: the lazily made parts of a deferred plan.
        if name in ("tasks", "owner", "rank", "_pos"):
            build = self.__dict__.get("_build")
            if build is not None:
                made = build()
                for k in ("tasks", "owner", "rank"):
                    self.__dict__.setdefault(k, made.get(k, {}))
                if "_pos" not in self.__dict__:
                    self.reindex()
                # for the copies a cached plan is rebound as (driver/cache.py ``rebind``):
                # each call's copy then starts with them, as made here
                self.memo["built"] = (build, {k: self.__dict__[k]
                                              for k in ("tasks", "owner", "rank", "_pos")})
                return self.__dict__[name]
        raise AttributeError(name)

    def __post_init__(self) -> None:
        if not self.kernels:
            self.kernels = tuple(choose_kernel(op) for op in self.ops)
        if len(self.kernels) != len(self.ops):
            raise ValueError(f"{len(self.kernels)} kernel choices for {len(self.ops)} operations")
        self.reindex()

    def reindex(self) -> None:
        self._pos = {t.key: i for i, t in enumerate(self.tasks)}

    def consumers(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {t.key: [] for t in self.tasks}
        for t in self.tasks:
            for k in t.inputs:
                out[k].append(t.key)
        return out

    @property
    def kernel_calls(self) -> int:
        return sum(isinstance(t, Kernel) for t in self.tasks)

    @property
    def task_count(self) -> int:
        """How many tasks the plan runs (without making them, where placement counted them)."""
        facts = self.__dict__.get("facts")
        return facts()["tasks"] if facts is not None else len(self.tasks)


def describe_tasks(plan: TilePlan) -> str:
    """Every tile task, one line each, in the order the plan lists them (TENSORDB_DEBUG=3)."""
    lines = [f"tile tasks: {len(plan.tasks)}"]
    for t in plan.tasks:
        op = plan.owner.get(t.key)
        where = f"w{t.worker}" + (f" op{op}" if op is not None else "")
        lines.append(f"  {t.key:>6} {where:<10} {t}")
    return "\n".join(lines)
