"""Running one tile task, the same way in every executor (threads here, Dask workers there)."""
from __future__ import annotations

from bisect import bisect_left

import numpy as np

from ..physical.plan import Aggregate, Assemble, Kernel, Load
from ..plan.aggregates import AGGREGATES
from ..storage.sparse import CooTile, densify, is_sparse, read_sparse_box
from .gpu_sparse import dense, is_device_sparse
from .graphcache import GRAPHS
from .kernels import KernelSpec, combine
from .sparse_kernels import dense_args

__all__ = ["run_load", "tile_view", "run_assemble", "run_kernel", "start_aggregate", "finish_aggregate", "run_aggregate"]


def run_load(task: Load, reader, xp=np):
    """A box of a stored tensor: a memory-mapped view when possible, zeros where absent; a
    scipy CSR array when the box lies in a matrix's sparse tiles (on the CPU: only the spmm
    kernel reads it as it is, every other consumer densifies it, sparse_kernels.py); a box of
    a sparse matrix comes through the graph cache (graphcache.py: a ``Sourced`` where its
    absent entries are not 0, a tagged view where they are 0); a
    ``RowGather`` for a gather by a vector (on the CPU: taken whole by a kernel that cannot
    read it as it is, ``dense_args``)."""
    if xp is np and reader.has_sparse:
        if reader.meta.ndim == 2:  # a matrix's boxes: their GraphBLAS copies kept (graphcache)
            out = GRAPHS.box(reader, task.starts, task.stops,
                             lambda: read_sparse_box(reader, task.starts, task.stops))
        else:
            out = read_sparse_box(reader, task.starts, task.stops)
        if out is not None:
            return out
    if xp is np and hasattr(reader, "read_rows"):
        # a gather by a vector: its rows named, taken by the kernels that read it (a
        # ``RowGather``: a batch of row products in slabs, an SpMM through its matrix)
        out = reader.read_rows(task.starts, task.stops)
        if out is not None:
            return out
    out = _whole_tile(reader, task.starts, task.stops)
    if out is None:
        out = reader.read_box(task.starts, task.stops)
    if out is None:
        out = np.zeros(tuple(b - a for a, b in zip(task.starts, task.stops)), reader.meta.dtype)
    return out if xp is np else xp.asarray(out)


def tile_view(task: Load, reader):
    """``run_load(task, reader)`` on the CPU where it is a view of one stored dense tile (no
    copy, no sparse box, no gather: what a caller may read on its own thread at no cost),
    else None."""
    if reader.has_sparse or hasattr(reader, "read_rows"):
        return None
    return _whole_tile(reader, task.starts, task.stops)


def _whole_tile(reader, starts, stops):
    """The view of the stored dense tile that the box ``[starts, stops)`` is exactly, else
    None (``read_box`` then: a box of several tiles, part of one, an absent or sparse tile).
    A block-sparse product's Loads are such boxes: each took 24-31 us through ``read_box``'s
    general case (the overlapped ranges, the run of adjacent tiles, a slice of the run), 9-13
    us so."""
    grid, entries = reader.meta.grid, getattr(reader, "entries", None)
    if entries is None or len(grid) != len(starts) or not grid:  # a gather's reader: none
        return None
    coords = []
    for cuts, a, b in zip(grid, starts, stops):
        i = bisect_left(cuts, a)
        if i + 1 >= len(cuts) or cuts[i] != a or cuts[i + 1] != b:
            return None
        coords.append(i)
    e = entries.get(tuple(coords))
    if e is None or e.sparse:
        return None
    return reader.stored_tile(e.coords)


def run_assemble(task: Assemble, sources: list, xp=np):
    """Cut pieces out of producer tiles and place them into a new tile (a re-tiling). A tile
    that one piece fills whole (a split of one producer tile) is not zeroed first: one pass over
    its memory, not two. A matrix made of CSR tiles only (a sparse intermediate re-cut for a
    consumer) stays CSR: its pieces' entries, placed."""
    if xp is np and len(task.shape) == 2 and sources and all(
            is_sparse(s) and getattr(s, "format", None) == "csr" for s in sources):
        return _assemble_csr(task, sources)
    if xp is np and sources and all(isinstance(s, CooTile) for s in sources):
        return _assemble_coo(task, sources)  # a rank-3+ sparse intermediate: its entries
    sources = dense_args(sources) if xp is np else [dense(s, xp) for s in sources]  # device CSR
    whole = len(task.pieces) == 1 and all(
        (a, b) == (0, n) for (a, b), n in zip(task.pieces[0][2], task.shape))
    out = (xp.empty if whole else xp.zeros)(task.shape, dtype=task.dtype)
    for (_, src_sl, dst_sl), src in zip(task.pieces, sources):
        out[tuple(slice(a, b) for a, b in dst_sl)] = src[tuple(slice(a, b) for a, b in src_sl)]
    return out


def _assemble_csr(task: Assemble, sources: list):
    """``run_assemble`` of CSR pieces (fill 0): the entries of each piece's box, shifted to
    its place, as one CSR array of the task's shape."""
    import scipy.sparse as sp
    rows, cols, vals = [], [], []
    for (_, src_sl, dst_sl), src in zip(task.pieces, sources):
        box = src[src_sl[0][0]:src_sl[0][1], src_sl[1][0]:src_sl[1][1]].tocoo()
        rows.append(box.row.astype(np.int64) + dst_sl[0][0])
        cols.append(box.col.astype(np.int64) + dst_sl[1][0])
        vals.append(box.data)
    out = sp.coo_array((np.concatenate(vals).astype(task.dtype, copy=False),
                        (np.concatenate(rows), np.concatenate(cols))), shape=task.shape).tocsr()
    out.sum_duplicates()  # the pieces are disjoint: this sorts each row's columns
    return out


def _assemble_coo(task: Assemble, sources: list) -> CooTile:
    """``run_assemble`` of COO pieces (a join's sparse output of rank 3 or more, fill 0,
    re-cut for a consumer): the entries inside each piece's box, shifted to its place, as one
    ``CooTile`` of the task's shape in C order (not the box densified: 10^21 elements)."""
    coords, vals = [], []
    for (_, src_sl, dst_sl), src in zip(task.pieces, sources):
        c = np.asarray(src.coords, np.int64).reshape(len(task.shape), -1)
        inside = np.ones(c.shape[1], bool)
        for d, (a, b) in enumerate(src_sl):
            inside &= (c[d] >= a) & (c[d] < b)
        shift = np.array([t[0] - s[0] for s, t in zip(src_sl, dst_sl)], np.int64)
        coords.append(c[:, inside] + shift[:, None])
        vals.append(np.asarray(src.values)[inside])
    c = np.concatenate(coords, axis=1)
    v = np.concatenate(vals).astype(task.dtype, copy=False)
    order = np.lexsort(c[::-1]) if c.shape[1] else np.zeros(0, np.int64)
    return CooTile(tuple(task.shape), np.ascontiguousarray(c[:, order]), v[order])


def run_kernel(task: Kernel, spec: KernelSpec, args: list, out=None, check=None, sink=None):
    """``check``, if given, is called between chunks of the kernel's work with the fraction done
    (the local pool's progress) and raises to stop it (the local pool's cancellation); ``sink``
    is given the slabs of ``out`` as they are finished (``KernelSpec``)."""
    return spec(args, task.arg_shapes, task.out_shape, out, check, sink)


def start_aggregate(task: Aggregate, first, xp=np, out=None):
    """The accumulator for an aggregation: a private, writable copy of the first partial (made in
    ``out`` when given: the output tile's final buffer)."""
    if xp is not np and is_device_sparse(first):  # a device CSR partial (gpu_sparse.combine)
        if out is None:
            return first if first.dtype == np.dtype(task.dtype) else first.astype(task.dtype)
        first = dense(first, xp)
    if out is not None:
        xp.copyto(out, densify(first) if xp is np else first, casting="unsafe")
        return out
    if xp is np and is_sparse(first):  # a sparse partial: combined into new ones, never changed
        return first
    acc = first
    # CuPy's flags have no ``writeable`` (device arrays always are).
    if not (getattr(acc, "flags", None) is not None and acc.flags.owndata
            and getattr(acc.flags, "writeable", True)):
        acc = xp.array(acc, dtype=task.dtype, copy=True)
    elif acc.dtype != np.dtype(task.dtype):
        acc = acc.astype(task.dtype)
    return acc


def finish_aggregate(task: Aggregate, acc, xp=np):
    if task.fill_zero:
        if xp is np and is_sparse(acc):  # every element takes the zeros in: dense
            acc = densify(acc)  # skipped combinations are zeros and take part in a max, min or prod
        elif xp is not np:
            acc = dense(acc, xp)
        zero = acc.dtype.type(0)  # a Python 0 would make a bool accumulator an int64 result
        ufunc = AGGREGATES[task.agg].ufunc
        ufunc(acc, zero, out=acc) if xp is np else getattr(xp, ufunc.__name__)(acc, zero, out=acc)
    return acc


def run_aggregate(task: Aggregate, parts: list, xp=np):
    """All partials at once (executors that cannot stream them)."""
    acc = start_aggregate(task, parts[0], xp)
    for p in parts[1:]:
        acc = combine(task.agg, acc, p, xp)
    return finish_aggregate(task, acc, xp)
