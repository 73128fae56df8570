"""The bytes a task's tile takes, from the plan alone (before it runs): what the memory budget
reserves and the fast path and the pool size their runs by. Below the kernels, so that the
GPU's sparse module may ask it too."""
from __future__ import annotations

import math

import numpy as np

from ..geometry import overlapping
from ..physical.plan import Kernel, Load, TilePlan
from ..plan.kernel import output_tile_bytes

__all__ = ["planned_bytes", "sparse_box_bytes", "graphblas_bytes", "coo_box_bytes"]


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


def sparse_box_bytes(plan: TilePlan, task: Load, building: bool = False) -> int | None:
    """The most bytes Load ``task``'s box holds read as CSR (``storage.sparse.read_sparse_box``):
    the entries of the stored tiles it overlaps (their payloads, or every element of the box as
    an entry if fewer: the most a CSR of the box can hold) and a row pointer of its own; None
    where it is not a box of a matrix's sparse tiles only (it is read dense). An SSSP step's
    graph of 131,072 nodes is 13 MiB of CSR, not the 137 GB of its extents. ``building``: the
    most the host holds while it reads the box, where the box is not views of one tile or of
    whole-width row slabs: the slices cut from the tiles and the box made of them, twice its
    entries and their row pointers (a GPU's device holds the box only)."""
    found = _sparse_tiles(plan, task)
    if found is None:
        return None
    meta, entries, ranges, present = found
    rows = task.stops[0] - task.starts[0]
    item = np.dtype(meta.dtype).itemsize
    if meta.fill == 0 and all(entries[rc].format == "coo" for rc in present):
        # a CooTile (hypersparse tiles), and the row pointers of the CSR a kernel makes of it
        return coo_box_bytes(plan, task, matrix=True) + 8 * (rows + 1)
    held = min(sum(int(entries[rc].nbytes) for rc in present),
               math.prod(b - a for a, b in zip(task.starts, task.stops)) * (8 + item))
    if building and not _views(meta, ranges, present, task):
        # and row pointers: each tile column's slice's, a band's, the box's, scipy's counts
        return 2 * held + 8 * (rows + 1) * (len(ranges[1]) + 3)
    return held + 8 * (rows + 1)


def coo_box_bytes(plan: TilePlan, task: Load, matrix: bool = False) -> int | None:
    """The most bytes Load ``task``'s box of a tensor of rank 3 or more holds read as its
    entries (``storage.sparse.read_sparse_box``: a ``CooTile``, int64 coordinates and the
    values, twice while the tiles' parts are joined): the entries the payloads of the sparse
    tiles it overlaps can hold, at most every element of the box; None where it is not such a
    box (fill 0, every overlapped tile sparse).
    ``matrix``: a matrix's box of COO tiles (hypersparse), read so too."""
    reader = plan.readers.get(task.tensor)
    meta = getattr(reader, "meta", None)
    entries = getattr(reader, "entries", None)
    if not getattr(reader, "has_sparse", False) or getattr(meta, "ndim", 0) < (2 if matrix else 3) or \
            not isinstance(entries, dict) or meta.fill != 0:
        return None
    ranges = [overlapping(b, a, z) for b, a, z in zip(meta.grid, task.starts, task.stops)]
    present = [k for k in entries if all(k[d] in ranges[d] for d in range(meta.ndim))]
    if not present or not all(entries[k].sparse for k in present):
        return None
    item = np.dtype(meta.dtype).itemsize
    box = math.prod(b - a for a, b in zip(task.starts, task.stops))
    # at most this many entries (indices of 4 bytes at least); each held with int64
    # coordinates, twice while the tiles' parts are joined
    nse = min(sum(int(entries[k].nbytes) for k in present) // (4 * meta.ndim + item), box)
    return 2 * nse * (8 * meta.ndim + item)


def graphblas_bytes(plan: TilePlan, task: Load) -> int | None:
    """The most bytes GraphBLAS's copy of Load ``task``'s CSR box takes (exec/semiring.py
    ``_to_gb``, ``plus_times_csr``: int64 row pointers and column indices, and the values),
    made while a GraphBLAS kernel runs beside the box (and kept by the graph cache); None where
    the box is not read as CSR. Its entries at most those the stored payloads can hold (4-byte
    indices at least) or every element of the box."""
    found = _sparse_tiles(plan, task)
    if found is None:
        return None
    meta, entries, _, present = found
    item = np.dtype(meta.dtype).itemsize
    nse = min(sum(int(entries[rc].nbytes) // (4 + item) for rc in present),
              math.prod(b - a for a, b in zip(task.starts, task.stops)))
    return nse * (8 + item) + 8 * (task.stops[0] - task.starts[0] + 1)


def _sparse_tiles(plan: TilePlan, task: Load):
    """(meta, entries, tile ranges, present tiles) of Load ``task``'s box where it is read as
    CSR (a matrix's box whose stored tiles are all sparse), else None."""
    reader = plan.readers.get(task.tensor)
    meta = getattr(reader, "meta", None)
    entries = getattr(reader, "entries", None)
    if not getattr(reader, "has_sparse", False) or getattr(meta, "ndim", None) != 2 or \
            not isinstance(entries, dict) or getattr(reader, "sparse_box", None) is not None:
        return None
    ranges = [overlapping(b, a, z) for b, a, z in zip(meta.grid, task.starts, task.stops)]
    present = [(r, c) for r in ranges[0] for c in ranges[1] if (r, c) in entries]
    if not present or not all(entries[rc].sparse for rc in present):
        return None
    return meta, entries, ranges, present


def _views(meta, ranges, present, task) -> bool:
    """Whether ``read_sparse_box`` makes the box of views of the stored entries (whole-width row
    slabs of one tile column, or rows of one tile), or of one tile's slice (a copy of part of
    its entries): nothing beside the box itself. Row slabs of a fill other than 0 are made one
    CSR (a copy of them)."""
    (s0, s1), (z0, z1) = task.starts, task.stops
    grid = meta.grid
    if len(present) > 1:
        c = ranges[1][0]
        return len(ranges[1]) == 1 and (grid[1][c], grid[1][c + 1]) == (s1, z1) and \
            meta.fill == 0
    r, c = present[0]
    return grid[0][r] <= s0 and z0 <= grid[0][r + 1] and grid[1][c] <= s1 and z1 <= grid[1][c + 1]
