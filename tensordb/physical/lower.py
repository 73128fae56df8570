"""Lowering: an EinGraph plus a Decomposition becomes a TilePlan.

For every operation, DuckDB computes the tile join: the present tiles of each input, cut to the
operation's grid (an interval join against the tile catalog), joined on shared labels. Inputs whose
absence makes the join zero (for a product, every input) are inner-joined, so absent tiles produce
no kernel call; the others are left-joined and read as zeros. Each joined row is one kernel call;
rows are grouped by output tile into aggregations. A join that is one stored input's tiles as
stored (a block-sparse A times a dense B) is made from its reader's entries, with no query.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..errors import InternalError
from ..geometry import Grid, even_bounds, overlapping, tile_box
from ..plan import skip
from ..plan.aggregates import AGGREGATES
from ..plan.ir import EinGraph, EinOp
from ..storage.reader import TensorReader, box_view
from .calls import LAYOUTS, Calls, Layout, grid_rows
from .choice import choose_kernel, with_output
from . import tilejoin
from .plan import Assemble, CallBlock, Columns, Load, OpStats, Once, OutputTiles, TilePlan

__all__ = ["lower", "describe"]


class _Lowering:
    def __init__(self, graph: EinGraph, decomp, store, readers=None, facts=None) -> None:
        self.graph, self.decomp, self.store = graph, decomp, store
        self.others: list = []                   # Loads, Assembles, Aggregates
        self.owner: dict[int, int] = {}          # their operation
        self.blocks: list[CallBlock] = []        # the kernel calls, per operation
        self.tile_keys: dict[str, np.ndarray] = {}  # per output: its tiles' keys on its grid
        self._cursor = 0                         # the key of the next task
        self.outputs: dict[str, OutputTiles] = {}
        self.stats: list[OpStats] = []
        self.kernels: list = []
        self.readers = readers if readers is not None else \
            store.open_many([t.name for t in graph.inputs])
        self._loads: dict[tuple, int] = {}
        self._tables: set[str] = set()
        self._assembled: dict[tuple, int] = {}
        self._known: dict[str, tuple[bool, bool]] = dict(facts or {})  # of each input, read once
        # earlier outputs whose kernels return CSR tiles -> their fill: sparse inputs of the
        # operations that read them, as the optimizer priced them (optimizer.sparse_cost.made_stats)
        self._made: dict[str, float] = {}

    def _add(self, task, op_index: int) -> int:
        self.others.append(task)
        self.owner[task.key] = op_index
        self._cursor += 1
        return task.key

    @property
    def _next_key(self) -> int:
        return self._cursor

    # -- presence of input tiles at an operation's grid ------------------------------------------
    def _presence_sql(self, tensor: str, labels, bounds: dict[str, tuple]) -> tuple[str, list]:
        """The relation of the op-grid coordinates of the present tiles of an input, with what
        the catalog knows of each piece (physical/tilejoin.py), cut to the operation's pieces."""
        cut = [bounds[l] for l in labels]
        if tensor in self.readers and not isinstance(self.readers[tensor], TensorReader):
            # a slice, a gather, positions: no catalog tiles; every piece reads (boxes.py)
            return tilejoin.every_piece(cut, labels, self._facts(tensor)[0])
        if tensor in self.readers:
            meta = self.readers[tensor].meta
            return tilejoin.stored_pieces(meta.name, meta.version, meta.grid, cut, labels,
                                          self.store.nonfinite_column)
        return tilejoin.made_pieces(self._materialize(tensor), self.outputs[tensor].grid,
                                    cut, labels)

    def _facts(self, tensor: str) -> tuple[bool, bool]:
        """(finite, nonzero) of a whole input (TensorReader.facts); neither is known of an
        earlier operation's output."""
        if tensor not in self._known:
            reader = self.readers.get(tensor)
            self._known[tensor] = (False, False) if reader is None else reader.facts()
        return self._known[tensor]

    def _sparsity(self, op: EinOp) -> tuple[tuple[int, ...], tuple[bool, ...], tuple[float, ...]]:
        """(operands stored as matrices with sparse tiles, whether each operand is finite, each
        operand's fill value): what the kernel choice needs to pick a sparse kernel
        (choice.spmm_operand, plan/sparse_rules.py), and to leave out a BLAS kernel's test of
        its inputs for NaN or inf."""
        sparse = tuple(k for k, o in enumerate(op.inputs) if (
            o.tensor in self.readers and (self.readers[o.tensor].meta.ndim == 2 or (
                self.readers[o.tensor].meta.ndim > 2 and len(op.inputs) <= 2))
            and self.readers[o.tensor].has_sparse) or o.tensor in self._made)
        # every input's finite fact also lets a BLAS kernel on inputs known finite skip its
        # NaN/inf test (plan/kernel.py)
        return (sparse, tuple(self._facts(o.tensor)[0] for o in op.inputs),
                tuple(self.readers[o.tensor].meta.fill if o.tensor in self.readers else
                      self._made.get(o.tensor, 0.0) for o in op.inputs) if sparse else ())

    def _made_fill(self, op: EinOp, choice) -> float:
        """The fill of a sparse kernel's CSR output: a semiring product keeps its sparse
        operand's (min-plus: +inf), the others' is 0 (as ``optimizer.sparse_cost.made_stats``)."""
        if choice.method != "semiring":
            return 0.0
        src = op.inputs[choice.sparse].tensor
        return self.readers[src].meta.fill if src in self.readers else self._made.get(src, 0.0)

    # -- the tile join -------------------------------------------------------------------------
    def _complete(self, tensor: str) -> bool:
        """Every tile of this input is present, so its presence at any grid is complete."""
        if tensor in self.readers:
            meta = self.readers[tensor].meta
            return meta.tile_count == meta.total_tiles
        out = self.outputs[tensor]
        return len(out.tiles) == math.prod(len(b) - 1 for b in out.grid)

    def _join_sql(self, op: EinOp, pieces: dict, bounds: dict, inner: list, outer: list) -> np.ndarray:
        """The kernel calls of ``op`` where some input is not complete: DuckDB joins the
        present tiles. One row of label piece indices (then presence flags of the outer
        inputs) per call."""
        # A complete stored input that gates the join adds no row restriction: its labels range
        # over the whole grid. It is left out of the SQL when the test of a row does not read
        # what the catalog knows of its pieces (it is finite throughout, and its zeros do not
        # matter): a block-sparse A times a dense B joins only A's tiles.
        whole = {k for k in inner if op.inputs[k].tensor in self.readers
                 and self._complete(op.inputs[k].tensor) and self._facts(op.inputs[k].tensor)[0]}
        rows = self._join_one(op, pieces, bounds, inner, outer, whole)
        if rows is not None:
            return rows
        sql, params = tilejoin.join(
            op, pieces, inner, outer, whole,
            lambda k: self._presence_sql(op.inputs[k].tensor, op.inputs[k].labels, bounds))
        try:
            rows = self.store.query(sql, params)
        except Exception as exc:  # a bug in the generated SQL, never the user's fault
            raise InternalError(f"tile join for {op.describe()} failed: {exc}\n{sql}") from exc
        return np.array(rows, dtype=np.int64).reshape(len(rows), len(op.labels) + len(outer))

    def _join_one(self, op: EinOp, pieces: dict, bounds: dict, inner: list, outer: list,
                  whole: set) -> np.ndarray | None:
        """The tile join without DuckDB where it is one stored input's tiles (a block-sparse A
        times a dense B): every input but one is ``whole`` and needs no test, nothing is
        left-joined, and that input's tiles are the operation's pieces on each of its labels
        (no interval join, no diagonal). Its catalog entries, which its reader holds, are the
        rows ``tilejoin.join`` would return, crossed with every piece of the other labels and
        sorted. None where the SQL is needed."""
        rest = [k for k in inner if k not in whole]
        if outer or len(rest) != 1:
            return None
        k0 = rest[0]
        reader = self.readers.get(op.inputs[k0].tensor)
        labels = op.inputs[k0].labels
        if not labels or not isinstance(reader, TensorReader) or len(set(labels)) != len(labels) \
                or any(tuple(bounds[l]) != tuple(g) for l, g in zip(labels, reader.meta.grid)):
            return None
        # the rows' test must need no catalog facts (as tilejoin.join would find it)
        test = tilejoin.nonzero_test(op.join, lambda k: "TRUE",
                                     lambda k: "TRUE" if k in whole else f"in{k}.f",
                                     lambda k: f"in{k}.n")
        if test != "TRUE":
            return None
        coords = np.array(sorted(reader.entries), dtype=np.int64).reshape(-1, len(labels))
        cols = {l: coords[:, d] for d, l in enumerate(labels)}
        free = [l for l in op.labels if l not in cols]
        rest_rows = grid_rows([pieces[l] for l in free], 0, True) if free else \
            np.zeros((1, 0), np.int64)
        n, m = len(coords), len(rest_rows)
        out = np.empty((n * m, len(op.labels)), dtype=np.int64)
        for i, l in enumerate(op.labels):
            out[:, i] = np.repeat(cols[l], m) if l in cols else \
                np.tile(rest_rows[:, free.index(l)], n)
        return out[np.lexsort(out.T[::-1])] if len(out) else out

    # -- one operation -------------------------------------------------------------------------
    def lower_op(self, index: int, op: EinOp) -> None:
        pieces = self.decomp.pieces(op.output)
        size = op.size
        labels = op.labels
        # even extents, or the optimizer's cuts of equal nonzeros (optimizer/balance.py)
        cuts = self.decomp.details.get("cuts", {}).get(op.output, {})
        bounds = {l: tuple(cuts[l]) if l in cuts else even_bounds(size[l], pieces.get(l, 1))
                  for l in labels}
        pieces = {l: len(b) - 1 for l, b in bounds.items()}
        stats = OpStats(op, pieces)
        # The kernel's method and chunking, for the largest tile of each label and chunks sized
        # from a worker's memory budget (the optimizer's projection: details["memory"]).
        budget = getattr(self.decomp.details.get("memory"), "budget", None)
        choice = choose_kernel(op, {l: max(b[k + 1] - b[k] for k in range(len(b) - 1))
                                    if len(b) > 1 else 0 for l, b in bounds.items()},
                               budget, *self._sparsity(op))
        # its output tiles sparse or dense, by the optimizer's estimate of its nonzeros (the
        # choice the optimizer priced: plan.kernel.with_output)
        est = self.decomp.details.get("output_nnz", {}).get(op.output)
        choice = with_output(choice, op, est)
        self.kernels.append(choice)
        if choice.out_format != "dense":  # CSR tiles handed to the operations that read it
            self._made[op.output] = self._made_fill(op, choice)
        rows, outer, shape = self._call_rows(op, pieces, bounds)
        lay = LAYOUTS.get(shape) if shape is not None else None
        if lay is None:
            lay = Layout(op, bounds, rows() if callable(rows) else rows, outer)
            if shape is not None and lay.n <= LAYOUTS.largest:
                LAYOUTS.put(shape, lay)
        calls = Calls(self, index, op, bounds, lay, stats)
        bal = self.decomp.details.get("balance", {}).get(op.output)
        if bal is not None:  # a sparse kernel's calls weigh their slab's nonzeros, not extents
            calls.block.flops = nnz_weighted(lay, labels.index(bal["label"]), bal)
        if choice.sparse is not None:  # its work by the stored entries, not the extents
            calls.block.flops = sparse_scaled(calls.block.flops, self.decomp, op)
        self.tile_keys[op.output] = calls.tile_keys
        self.blocks.append(calls.block)
        grid: Grid = tuple(bounds[l] for l in op.out_labels)
        self.outputs[op.output] = OutputTiles(op.output, op.out_shape, op.dtype, grid, calls.out_tiles,
                                              op.output in self.graph.outputs,
                                              self.graph.stored_name(op.output))
        self._op_index[op.output] = index
        self.stats.append(stats)

    def _call_rows(self, op: EinOp, pieces, bounds) -> tuple:
        """The kernel calls that exist: one row of label coordinates each (then a presence flag
        per left-joined input), which inputs are left-joined, and for a whole grid (rows made
        when asked: a function) the shape its layout is kept under (else None)."""
        n_out, n_lab = len(op.free_labels), len(op.labels)
        if any(op.size[l] == 0 for l in op.agg_labels):
            # Aggregating over nothing (EinOp refuses MAX and MIN): SUM is 0, absent tiles;
            # PROD is 1, one call per output tile on empty inputs, which yields the identity.
            outer = list(range(len(op.inputs)))
            if AGGREGATES[op.agg].zero_is_identity:
                return np.zeros((0, n_lab + len(outer)), dtype=np.int64), outer, None
            rows = grid_rows([pieces[l] for l in op.free_labels], len(outer), False)
            return np.insert(rows, [n_out] * (n_lab - n_out), 0, axis=1), outer, None
        # An input gates the join (is inner-joined: its absent tiles make no kernel call)
        # when its absence makes the join 0 whatever the other inputs' tiles hold; the
        # others are left-joined and each call is kept unless the catalog's facts about
        # its tiles prove it 0.
        facts = [self._facts(o.tensor) for o in op.inputs]
        finite = {k for k, f in enumerate(facts) if f[0]}
        nonzero = {k for k, f in enumerate(facts) if f[1]}
        inner = [k for k in range(len(op.inputs))
                 if skip.zero_when_absent(op.join, {k}, finite - {k}, nonzero - {k})]
        outer = [k for k in range(len(op.inputs)) if k not in inner]
        if all(self._complete(o.tensor) for o in op.inputs):
            # The join is the whole grid: no query, and a layout shared by operations alike.
            pos = {l: d for d, l in enumerate(op.labels)}
            shape = (tuple(bounds[l] for l in op.labels), tuple(pos[l] for l in op.out_labels),
                     tuple(tuple(pos[l] for l in o.labels) for o in op.inputs),
                     tuple(pos[l] for l in op.agg_labels), op.agg, tuple(outer),
                     op.flops // max(1, math.prod(op.size[l] for l in op.labels)),
                     np.dtype(op.dtype).itemsize)
            return (lambda: grid_rows([pieces[l] for l in op.labels], len(outer), True)), outer, shape
        return self._join_sql(op, pieces, bounds, inner, outer), outer, None

    def _materialize(self, tensor: str) -> str:
        """The present output tiles of an earlier operation as a DuckDB table (made on first use)."""
        table = f"__tensordb_tiles_{self._op_index[tensor]}"
        if table not in self._tables:
            out = self.outputs[tensor]
            self.store.query(tilejoin.coords_table(table, out.tiles, len(out.shape)))
            self._tables.add(table)
        return table

    # -- input tiles ---------------------------------------------------------------------------
    def _input_tile(self, index: int, tensor: str, box, stats: OpStats) -> int | None:
        starts = tuple(a for a, _ in box)
        stops = tuple(b for _, b in box)
        if tensor in self.readers:
            key = self._loads.get((tensor, starts, stops))
            if key is None:
                key = self._add(Load(self._next_key, tensor, starts, stops), index)
                self._loads[(tensor, starts, stops)] = key
                stats.input_tiles += 1
                if not _free(self.readers[tensor].meta, starts, stops):
                    stats.retile_bytes += _nbytes(box, self.readers[tensor].meta.dtype)
            return key
        out = self.outputs[tensor]
        cut = [overlapping(out.grid[d], a, b) for d, (a, b) in enumerate(box)]
        if all(len(r) == 1 and out.grid[d][r[0]] == box[d][0] and out.grid[d][r[0] + 1] == box[d][1]
               for d, r in enumerate(cut)):
            return out.tiles.get(tuple(r[0] for r in cut))
        ident = (tensor, starts, stops)
        if ident in self._assembled:
            return self._assembled[ident]
        pieces = []
        for coords in itertools.product(*cut):
            src = out.tiles.get(coords)
            if src is None:
                continue
            src_sl, dst_sl = [], []
            for d, c in enumerate(coords):
                lo, hi = max(out.grid[d][c], box[d][0]), min(out.grid[d][c + 1], box[d][1])
                src_sl.append((lo - out.grid[d][c], hi - out.grid[d][c]))
                dst_sl.append((lo - box[d][0], hi - box[d][0]))
            pieces.append((src, tuple(src_sl), tuple(dst_sl)))
        if not pieces:
            return None
        shape = tuple(b - a for a, b in box)
        key = self._add(Assemble(self._next_key, shape, out.dtype, tuple(pieces)), index)
        self._assembled[ident] = key
        stats.input_tiles += 1
        stats.retile_bytes += _nbytes(box, out.dtype)
        return key

    def run(self) -> TilePlan:
        self._op_index: dict[str, int] = {}
        try:
            for index, op in enumerate(self.graph.ops):
                self.lower_op(index, op)
        finally:
            for table in self._tables:
                self.store.query(tilejoin.drop_coords_table(table))
        columns = Columns(self.blocks, self.others, self.owner, self._cursor)
        return TilePlan.deferred(self.graph.ops, self.outputs, self.stats, self.decomp.workers,
                                 self.readers, tuple(self.kernels), {}, Once(columns.tasks),
                                 columns=columns,
                                 blas_threads=int(self.decomp.details.get("blas_threads", 0)))


def _nbytes(box, dtype) -> int:
    return math.prod(b - a for a, b in box) * np.dtype(dtype).itemsize


def _free(meta, starts, stops) -> bool:
    """True when the box is whole stored tiles that the reader hands out as a view (the
    optimizer's test, optimizer/retile.py: anything else is a re-tiling copy)."""
    return all(a in g and b in g for g, a, b in zip(meta.grid, starts, stops)) and \
        box_view(meta.grid, [[(a, b)] for a, b in zip(starts, stops)],
                 meta.tile_count == meta.total_tiles)


def lower(graph: EinGraph, decomp, store, readers=None, facts=None) -> TilePlan:
    """Build the tile plan of ``graph`` under the pieces chosen in ``decomp``. ``readers`` (name
    -> TensorReader of every input) and their ``facts`` (name -> TensorReader.facts()) are what
    the planner read already; left out, they are read from ``store``."""
    return _Lowering(graph, decomp, store, readers, facts).run()


def describe(plan: TilePlan) -> str:
    """A short per-operation summary (TENSORDB_DEBUG=2)."""
    lines = [f"tile plan: {len(plan.tasks)} tasks on {plan.workers} workers"]
    for s, kernel in zip(plan.stats, plan.kernels):
        pieces = " ".join(f"{l}:{d}" for l, d in s.pieces.items())
        lines.append(f"  {s.op.describe()}  [{pieces}]  {kernel.describe()}  calls={s.kernel_calls} "
                     f"aggs={s.aggregations} fan_in={s.max_fan_in}"
                     + (f" levels={s.agg_levels}" if s.agg_levels > 1 else "")
                     + f" retile={s.retile_bytes}B")
    return "\n".join(lines)


def sparse_scaled(flops: np.ndarray, decomp, op: EinOp) -> np.ndarray:
    """The flops of a sparse kernel's calls (``flops``: each call's share of the operation's
    join space, ``EinOp.flops``) scaled to what the cost model counts for the whole operation
    from the catalog's nonzeros (``optimizer/sparse_cost.sparse_flops``, EXPLAIN's figure):
    an SSSP step's two calls over a 131,072-node graph are 1.1M flops each, not 8.6G. The pool
    reads them to choose the calling thread and the BLAS/GraphBLAS threads (exec/pool.py),
    placement to balance the workers. Unchanged where the cost model has no figure."""
    cost = decomp.details.get("cost")
    c = cost.ops.get(op.output) if cost is not None else None
    total = float(np.sum(flops))
    if c is None or total <= 0 or not c.flops or c.flops >= total:
        return flops
    return np.maximum(1, np.ceil(flops * (float(c.flops) / total))).astype(np.int64)


def nnz_weighted(lay, d: int, bal: dict) -> np.ndarray:
    """Per kernel call of ``lay``, its flops scaled by the share of the sparse matrix's
    nonzeros in its piece of label ``d`` over that piece's share of the extent (placement
    balances these; optimizer/balance.py cut the pieces)."""
    nnz = np.asarray(bal["nnz"], dtype=np.float64)
    ext = np.diff(np.asarray(bal["bounds"], dtype=np.float64))
    share = (nnz / max(nnz.sum(), 1.0)) / np.maximum(ext / max(ext.sum(), 1.0), 1e-12)
    return np.maximum(1, (lay.flops * share[lay.coords[:, d]]).astype(np.int64))
