"""The bytes a task's tile takes, from the plan alone (before it runs): what the memory budget
reserves and the fast path and the pool size their runs by. Below the kernels, so that the
GPU's sparse module may ask it too."""
from __future__ import annotations

import math

import numpy as np

from ..geometry import overlapping
from ..physical.plan import Kernel, Load, TilePlan
from ..plan.kernel import output_tile_bytes

__all__ = ["planned_bytes", "sparse_box_bytes"]


def planned_bytes(plan: TilePlan, task) -> int:
    """The bytes of the tile ``task`` produces, from the plan alone (before it runs)."""
    if isinstance(task, Load):
        shape = [b - a for a, b in zip(task.starts, task.stops)]
        dtype = plan.readers[task.tensor].meta.dtype
    elif isinstance(task, Kernel):  # a sparse output tile at its estimated entries
        return output_tile_bytes(plan.ops[task.op], plan.kernels[task.op], task.out_shape)
    else:
        shape, dtype = task.shape, task.dtype
    return math.prod(shape) * np.dtype(dtype).itemsize


def sparse_box_bytes(plan: TilePlan, task: Load) -> int | None:
    """The most bytes Load ``task``'s box holds read as CSR (``storage.sparse.read_sparse_box``):
    the payloads of the stored tiles it overlaps and a row pointer of its own, or its dense bytes
    if fewer; None where it is not a box of a matrix's sparse tiles only (it is read dense). An
    SSSP step's graph of 131,072 nodes is 13 MiB of CSR, not the 137 GB of its extents."""
    reader = plan.readers.get(task.tensor)
    meta = getattr(reader, "meta", None)
    entries = getattr(reader, "entries", None)
    if not getattr(reader, "has_sparse", False) or getattr(meta, "ndim", None) != 2 or \
            not isinstance(entries, dict) or getattr(reader, "sparse_box", None) is not None:
        return None
    ranges = [overlapping(b, a, z) for b, a, z in zip(meta.grid, task.starts, task.stops)]
    present = [entries[(r, c)] for r in ranges[0] for c in ranges[1] if (r, c) in entries]
    if not present or not all(e.sparse for e in present):
        return None
    rows = task.stops[0] - task.starts[0]
    return min(planned_bytes(plan, task), sum(int(e.nbytes) for e in present) + 8 * (rows + 1))
