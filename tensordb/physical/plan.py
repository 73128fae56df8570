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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


from ..geometry import Grid
from ..plan.ir import EinOp
from .choice import KernelChoice, choose_kernel

__all__ = ["Load", "Assemble", "Kernel", "Aggregate", "Task", "OutputTiles", "OpStats", "TilePlan",
           "describe_tasks"]

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

    def task(self, key: int) -> Task:
        return self.tasks[self._pos[key]]

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


def describe_tasks(plan: TilePlan) -> str:
    """Every tile task, one line each, in the order the plan lists them (TENSORDB_DEBUG=3)."""
    lines = [f"tile tasks: {len(plan.tasks)}"]
    for t in plan.tasks:
        op = plan.owner.get(t.key)
        where = f"w{t.worker}" + (f" op{op}" if op is not None else "")
        lines.append(f"  {t.key:>6} {where:<10} {t}")
    return "\n".join(lines)
