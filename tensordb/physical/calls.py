"""An operation's kernel calls as arrays: what lowering.py makes of the joined rows.

A plan of 1,000 operations on 64 workers has 64,000 kernel calls; one Python object per call,
made and then placed, re-keyed and ordered, was most of the time of planning it. Here the calls
of one operation become a ``CallBlock`` (plan.py) of NumPy arrays, and only the tasks that are
few (input tiles, aggregations) become objects.

- ``Layout``: what the calls look like apart from the tiles they read (rows sorted by output
  tile, which output tiles aggregate, extents, flops). Operations alike in shape share one:
  ``LAYOUTS`` keeps them for the process by shape.
- ``Calls``: one operation's calls with their task keys, their input tiles (made through the
  lowering's ``_input_tile``) and Aggregates; keys as a call-by-call walk gives them.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from ..plan.aggregates import AGGREGATES
from ..plan.ir import EinOp
from .plan import BYTES_CAP, Aggregate, CallBlock, OpStats

__all__ = ["Layout", "Layouts", "LAYOUTS", "Calls", "grid_rows"]


class Layout:
    """What the kernel calls of one operation look like, apart from the tiles they read: rows
    sorted by output tile (each one's calls in join order: a stable sort), the groups of calls
    of each output tile and which of them need an Aggregate, tile extents, flops, and per
    operand the tile each call reads. Operations alike in shape (the layers of a deep network)
    share one: lowering keeps them by shape where the join is the whole grid."""

    def __init__(self, op: EinOp, bounds, rows: np.ndarray, outer: list[int]) -> None:
        labels = op.labels
        n_lab = len(labels)
        pos = {l: d for d, l in enumerate(labels)}
        self.out_pos = out_pos = tuple(pos[l] for l in op.out_labels)
        self.dims = dims = tuple(tuple(pos[l] for l in o.labels) for o in op.inputs)
        if len(rows) > 1 and out_pos:
            rows = rows[np.lexsort(tuple(rows[:, d] for d in reversed(out_pos)))]
        self.n = n = len(rows)
        self.coords = coords = np.ascontiguousarray(rows[:, :n_lab])
        first = np.ones(n, dtype=bool)
        if n > 1:
            first[1:] = (coords[1:, out_pos] != coords[:-1, out_pos]).any(axis=1)
        group = np.cumsum(first) - 1
        self.starts = starts = np.flatnonzero(first)
        self.ends = np.append(starts[1:], n) - 1 if n else starts
        sizes = np.diff(np.append(starts, n))
        # One output tile of one call is that call; others (or skipped calls that take part:
        # a 0 in a MAX, MIN or PROD, where it makes the tile 0, or NaN next to an inf) get an
        # Aggregate. Over an empty label nothing was skipped: the one call per output tile is
        # the whole (empty) aggregate.
        total = math.prod(len(bounds[l]) - 1 for l in op.agg_labels)
        empty = any(op.size[l] == 0 for l in op.agg_labels)
        fills = op.agg is not None and not AGGREGATES[op.agg].zero_is_identity and not empty
        self.fill = fill = (sizes < total) & fills
        self.aggregated = aggregated = (sizes > 1) | fill
        self.n_aggs = int(aggregated.sum())
        self.max_fan_in = int(sizes[aggregated].max()) if self.n_aggs else 0
        self.aggs_before = (np.cumsum(aggregated) - aggregated)[group] if n else group
        self.extents = tuple(np.diff(np.asarray(bounds[l], dtype=np.int64)) for l in labels)
        ext = np.stack([self.extents[d][coords[:, d]] for d in range(n_lab)], axis=1) if n_lab \
            else np.ones((n, 0), dtype=np.int64)
        flops_per_elem = max(1, op.flops // max(1, math.prod(op.size[l] for l in labels)))
        self.flops = flops_per_elem * ext.prod(axis=1)
        self.flops_total = int(self.flops.sum())
        item = np.dtype(op.dtype).itemsize  # a sparse output's tile may pass int64 in bytes
        self.out_bytes = np.minimum(ext[:, list(out_pos)].prod(axis=1), BYTES_CAP // item) * item
        self.out_shapes = ext[:, list(out_pos)]
        self.out_coords = [tuple(c) for c in coords[starts][:, list(out_pos)].tolist()]
        self.out_index = tuple(coords[starts][:, list(out_pos)].T)
        self.out_grid = tuple(len(bounds[l]) - 1 for l in op.out_labels)
        self.boxes = [[(b[i], b[i + 1]) for i in range(len(b) - 1)] for b in (bounds[l] for l in labels)]
        # Per operand: the calls that read it (a left-joined one may be absent), the index of
        # the tile each reads, and each distinct tile's first reader.
        where_outer = {k: m for m, k in enumerate(outer)}
        self.reads = []
        for k, o in enumerate(op.inputs):
            m = where_outer.get(k)
            rows_in = np.arange(n) if m is None else np.flatnonzero(rows[:, n_lab + m])
            at = tuple(coords[rows_in][:, dims[k]].T)
            shape = tuple(len(bounds[l]) - 1 for l in o.labels)
            ids = np.ravel_multi_index(at, shape) if dims[k] else np.zeros(len(rows_in), dtype=np.int64)
            _, first_at, inv = np.unique(ids, return_index=True, return_inverse=True)
            self.reads.append((rows_in, at, inv, rows_in[first_at].tolist()))
        for a in (self.coords, self.flops, self.out_bytes, self.out_shapes, *self.extents):
            a.flags.writeable = False  # shared by the plans of operations alike


class Layouts:
    """The layouts of whole-grid operations by shape, kept for the process (they are pure
    functions of it, and read only): the layers of one script share one, and a repeated
    statement planned again finds its own. The most recent ``capacity`` of at most ``largest``
    calls each are kept."""

    def __init__(self, capacity: int = 256, largest: int = 1 << 16) -> None:
        self.capacity, self.largest = capacity, largest
        self._kept: OrderedDict[tuple, Layout] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, shape: tuple) -> "Layout | None":
        with self._lock:
            lay = self._kept.get(shape)
            if lay is not None:
                self._kept.move_to_end(shape)
            return lay

    def put(self, shape: tuple, lay: "Layout") -> None:
        with self._lock:
            self._kept[shape] = lay
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)


LAYOUTS = Layouts()


class Calls:
    """The kernel calls of one operation, made as arrays (``block``), its input tiles and
    aggregations as tasks, and ``out_tiles`` (output tile coords -> the task making it).

    Keys are given in the order a call-by-call walk would give them: the output tiles in
    sorted order, each one's calls in join order, a call's new input tiles just before it and
    an output tile's Aggregate just after its calls."""

    def __init__(self, low, index: int, op: EinOp, bounds, lay: Layout,
                 stats: OpStats):
        n, dims = lay.n, lay.dims
        # Input tiles: an earlier operation's output on this grid maps tile to tile; others are
        # made (Load, Assemble) at their first call, in call order then operand order.
        args = np.full((n, len(op.inputs)), -1, dtype=np.int64)
        base = low._cursor
        events = []
        for k, o in enumerate(op.inputs):
            rows_in, at, inv, firsts = lay.reads[k]
            out = low.outputs.get(o.tensor)
            if out is not None and out.grid == tuple(bounds[l] for l in o.labels):
                table = low.tile_keys[o.tensor]
                args[rows_in, k] = table[at] if dims[k] else table[()]
                continue
            events += [(r, k, u) for u, r in enumerate(firsts)]
        events.sort()
        tile_keys = {k: np.full(len(lay.reads[k][3]), -1, dtype=np.int64) for _, k, _ in events}
        made: list[int] = []  # the call (row) before which each new input tile task comes
        aggs_before = lay.aggs_before
        for r, k, u in events:
            low._cursor = base + r + int(aggs_before[r]) + len(made)
            row = lay.coords[r].tolist()
            box = tuple(lay.boxes[d][row[d]] for d in dims[k])
            before = len(low.others)
            key = low._input_tile(index, op.inputs[k].tensor, box, stats)
            if len(low.others) > before:
                made.append(r)
            tile_keys[k][u] = -1 if key is None else key
        for k, keys_of_tiles in tile_keys.items():
            rows_in, _, inv, _ = lay.reads[k]
            args[rows_in, k] = keys_of_tiles[inv]
        keys = base + np.arange(n, dtype=np.int64) + aggs_before
        if made:
            keys += np.searchsorted(np.asarray(made, dtype=np.int64), np.arange(n), side="right")
        # The Aggregates, each right after the last call of its output tile.
        key_list = keys.tolist()
        out_keys = [key_list[e] for e in lay.ends.tolist()]
        if lay.n_aggs:
            for g in np.flatnonzero(lay.aggregated).tolist():
                s, e = int(lay.starts[g]), int(lay.ends[g])
                low._cursor = key_list[e] + 1
                out_keys[g] = low._add(Aggregate(low._cursor, op.agg, tuple(key_list[s:e + 1]),
                                                 tuple(lay.out_shapes[s].tolist()), op.dtype,
                                                 bool(lay.fill[g])), index)
        low._cursor = base + n + lay.n_aggs + len(made)
        self.out_tiles = dict(zip(lay.out_coords, out_keys))
        # The output's tile keys on its grid (-1: absent), for the operations reading it.
        self.tile_keys = np.full(lay.out_grid, -1, dtype=np.int64)
        if lay.out_grid:
            self.tile_keys[lay.out_index] = out_keys
        elif out_keys:
            self.tile_keys[()] = out_keys[0]
        self.block = CallBlock(index, keys, lay.coords, args, lay.flops, lay.out_bytes, lay.extents,
                               dims, lay.out_pos)
        stats.kernel_calls += n
        stats.flops += lay.flops_total
        if lay.n_aggs:
            stats.aggregations += lay.n_aggs
            stats.max_fan_in = max(stats.max_fan_in, lay.max_fan_in)
            stats.agg_levels = 1  # one task per output tile; trees.py may make it a tree


def grid_rows(pieces: list[int], flags: int, flag: bool) -> np.ndarray:
    """Every cell of a grid of ``pieces`` (the last label fastest, as itertools.product), then
    ``flags`` columns of ``flag``."""
    n = math.prod(pieces)
    cells = np.indices(pieces, dtype=np.int64).reshape(len(pieces), n).T
    return np.hstack([cells, np.full((n, flags), int(flag), dtype=np.int64)])
