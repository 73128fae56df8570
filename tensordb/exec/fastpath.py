"""The straight-line run of a tiny plan: its tasks lowered once to a list of calls, run on the
calling thread with no dataflow bookkeeping (issue 29: a training step that pays only for its
work).

A plan the local pool would run on the calling thread anyway (``pool._tiny``, no memory budget
to keep, host tiles) has its order fixed before it starts: the ready-heap of ``_Run.go_inline``
(folds first, then the plan's rank) depends on nothing but which tasks have finished. So that
order is worked out once per plan (``program``, kept in the plan's memo, which a cached plan's
rebound copies share), with the point after which each tile is no longer needed; a run then
walks it: each Load read once however many workers the plan placed a copy on, each kernel
call bound once to its operands (exec/bound.py: the NumPy calls the pool's ``KernelSpec``
makes, with the same arguments and output buffers, so the answers are bit-identical; a call
that is not bound calls the spec), intermediates kept as NumPy arrays (never a file), each stored
output's statistics taken as the pool takes them and handed to the sink. Cancellation is
checked between calls, errors name their operation (``runtime.translate``), and the per
operation seconds and kernel calls EXPLAIN ANALYZE shows are counted.

Two tasks of the pool's run that read the same stored box on two workers (a Load per worker)
are one read here: on one thread there is nothing to move. A stored output tile that a Load of
the plan reads is kept, as the version its commit gives it, for the next run (``_written``).
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

from ..geometry import tile_box
from ..physical.order import ranks
from ..physical.plan import Aggregate, Kernel, Load, TilePlan
from ..storage.writer import TileStats
from . import fastline
from .fastpool import POOL_BYTES, _aliased, _Buffers, _kept  # noqa: F401 - _kept: tests read it
from .bound import bind, signature
from .budget import temporary_bytes
from .kernels import combine
from .fastrows import calls as _calls, facts as _facts, kept_keys as _kept_keys, \
    rows as _rows, spec as _spec
from .runtime import (Cancelled, OpMeasure, RunResult, _owned_nbytes, final_keys, held_bytes,
                      sparse_entries, translate)
from .sparse_kernels import SPARSE_METHODS, dense_args
from .tasks import finish_aggregate, run_assemble, run_load, start_aggregate

__all__ = ["program", "run_program", "Step"]

LOAD, KERNEL, ASSEMBLE, START, FOLD, FINISH = range(6)


@dataclass(frozen=True)
class Step:
    """One call of the straight-line program: ``kind``, the ``task`` it runs for, the keys of
    the tiles it reads (``inputs``), the key it stores its tile under (``key``: for a Load read
    before on another worker, the first read's), the op it counts for, and ``free``: keys whose
    last reader this step is; ``moved``: inputs the pool would count as moved from another
    worker (read there first), ``temps``: the kernel's temporary bytes (both for the run's
    accounts, as the pool keeps them)."""

    kind: int
    task: object
    inputs: tuple
    key: int
    op: int
    free: tuple
    moved: tuple = ()
    temps: int = 0
    dense: bool = False
    unread: bool = False  # no later step reads its tile


def program(plan: TilePlan, workers: int) -> list[Step]:
    """The steps of ``plan`` in the order ``_Run.go_inline`` runs its items on ``workers``
    (kept in the plan's memo)."""
    kept = plan.memo.get("fastpath")
    if kept is not None and kept[0] is plan.tasks and kept[1] == workers:
        return kept[2]
    steps = _lower(plan, workers)
    plan.memo["fastpath"] = (plan.tasks, workers, steps)
    return steps


def _lower(plan: TilePlan, workers: int) -> list[Step]:
    rank = plan.rank or ranks(plan)
    owner = plan.owner
    waiting = {t.key: len(t.inputs) for t in plan.tasks if not isinstance(t, Aggregate)}
    left = {t.key: len(t.parts) for t in plan.tasks if isinstance(t, Aggregate)}
    agg_of = {p: t.key for t in plan.tasks if isinstance(t, Aggregate) for p in t.parts}
    consumers = plan.consumers()
    outputs = {k for out in plan.outputs.values() for k in out.tiles.values()}
    heap: list = []
    seq = 0

    def push(kind, task, part=None):
        nonlocal seq
        pri = (0, rank.get(task.key, 0)) if kind == "acc" else (1, rank.get(task.key, 0))
        heapq.heappush(heap, (pri, seq, kind, task, part))
        seq += 1

    for t in plan.tasks:
        if not isinstance(t, Aggregate) and not t.inputs:
            push("run", t)
    raw: list[tuple] = []  # (kind, task, inputs, key, moved)
    on = {t.key: t.worker % workers for t in plan.tasks}
    sent: set = set()

    def moved(task, keys):
        """The pool's count: an input read on another worker than its producer's, once."""
        w, out = task.worker % workers, []
        for k in keys:
            if on[k] != w and (k, w) not in sent:
                sent.add((k, w))
                out.append(alias.get(k, k))
        return tuple(out)

    started: set = set()
    same_box: dict = {}  # (tensor, starts, stops) -> key of the first Load of it
    alias: dict = {}     # a repeated Load's key -> the first's
    while heap:
        _, _, kind, task, part = heapq.heappop(heap)
        if kind == "run":
            if isinstance(task, Load):
                box = (task.tensor, task.starts, task.stops)
                # (a Load that is a stored output's tile is read into its buffer: its own step)
                first = task.key if task.key in outputs else same_box.setdefault(box, task.key)
                if first != task.key:
                    alias[task.key] = first
                else:
                    raw.append((LOAD, task, (), task.key, ()))
            else:
                raw.append((KERNEL if isinstance(task, Kernel) else ASSEMBLE, task,
                            tuple(alias.get(k, k) for k in task.inputs), task.key,
                            moved(task, task.inputs)))
            done = task.key
        else:
            p = alias.get(part, part)
            raw.append((FOLD if task.key in started else START, task, (p,), task.key,
                        moved(task, (part,))))
            started.add(task.key)
            left[task.key] -= 1
            if left[task.key]:
                continue
            raw.append((FINISH, task, (), task.key, ()))
            done = task.key
        if done in agg_of:
            push("acc", plan.task(agg_of[done]), done)
        for c in consumers[done]:
            if c in waiting:
                waiting[c] -= 1
                if waiting[c] == 0:
                    push("run", plan.task(c))
    if len([r for r in raw if r[0] != START and r[0] != FOLD]) + len(alias) != len(plan.tasks):
        raise RuntimeError("the plan's tasks are not all reachable")  # pragma: no cover
    # where each tile is read for the last time (stored outputs are kept by the run)
    last: dict = {}
    for i, (kind, task, inputs, key, _) in enumerate(raw):
        for k in inputs:
            last[k] = i
    frees: dict[int, list] = {}
    for k, i in last.items():
        frees.setdefault(i, []).append(k)
    # Loads whose every reader is a dense kernel (not a sparse method, which reads a CSR box)
    sparse_readers = {k for r in raw if r[0] == KERNEL
                      and plan.kernels[r[1].op].method in SPARSE_METHODS for k in r[2]}
    dense_only = {r[3] for r in raw if r[0] == LOAD and r[3] not in sparse_readers
                  and all(c[0] == KERNEL for c in raw if r[3] in c[2])}
    return [Step(kind, task, inputs, key, task.op if isinstance(task, Kernel) else
                 owner.get(task.key, 0), tuple(frees.get(i, ())), mv,
                 temporary_bytes(plan, task) if kind == KERNEL else 0, key in dense_only,
                 key not in last)
            for i, (kind, task, inputs, key, mv) in enumerate(raw)]


# A Load's tile read again at the next run when its tensor kept its version: a copy the read
# made (a sparse tile densified, a box assembled from tiles) is kept with the plan, up to this
# many bytes a plan (outside the memory budget: small on purpose; the prepared-statement cache
# keeps 32 plans). A digits step densifies its one-hot labels (1347 x 10, stored sparse, 105
# KiB) every step otherwise: 0.2 ms of its 1.8; and maps its training slice of X (1347 x 64,
# 690 KiB) afresh, 0.09 ms.
LOAD_CACHE_BYTES = 1 << 20


def _load(task, reader, loads: dict, dense: bool, wrote=None):
    """The tile of Load ``task``: the copy kept from the last run when its reader reads the
    same version (a payload is immutable once committed, and a version number names one
    tensor's contents: storage/store_catalog.py keys tile entries by it), else read now.
    A version is kept only once it is seen twice in a row, and as a copy (a view of a
    payload file is copied then: keeping the view would keep the file mapped). ``dense``: no
    consumer reads a sparse tile as it is, so a CSR box is densified here, once, as each dense
    kernel would densify it. Returns the tile and the bytes the run counts it as holding (None:
    its own, ``held_bytes``)."""
    ident = (type(reader).__name__, reader.meta.version, getattr(reader, "path", None))
    kept = loads.get(task.key)
    if kept is not None and kept[0] == ident and kept[1] is not None:
        return kept[1], kept[2]
    if wrote is not None:
        mine = _written(task, reader, wrote)
        if mine is not None:  # the tile the last run wrote as this version: read as a view
            return mine, 0
    value = run_load(task, reader, np)
    if dense and not isinstance(value, np.ndarray):
        value = dense_args([value])[0]  # a CSR box, read by dense kernels only
    held = None
    if kept is not None and kept[0] == ident and isinstance(value, np.ndarray) and \
            value.nbytes <= LOAD_CACHE_BYTES - sum(
                0 if v[1] is None else v[1].nbytes for v in loads.values()):
        if not _owned_nbytes(value):
            # a view of a payload file: copied once (its mapping is not kept), and counted
            # as the view it stands for (the page cache's bytes, not the run's), as the pool
            # counts its read: a digits step's training slice of X, 0.09 ms a step otherwise
            value, held = value.copy(), 0
        value.flags.writeable = False  # shared by the runs of this plan
        loads[task.key] = (ident, value, held)
    else:
        loads[task.key] = (ident, None, None)
    return value, held


def _written(task, reader, wrote: dict):
    """The tile the last run of this plan stored as the box ``task`` reads, when ``reader``
    reads the version it was stored as (a version number names one tensor's contents, and is
    given once) and the catalog's row of that tile is the dense tile with the checksum and
    nonzero count the run took of it; else None."""
    meta = reader.meta
    hit = wrote.get((meta.name.lower(), meta.version, task.starts, task.stops))
    if hit is None or task.tensor != meta.name:
        return None
    coords, value, crc, nnz = hit
    e = getattr(reader, "entries", {}).get(coords)
    if e is None or e.sparse or e.crc32 != crc or e.nnz != nnz or e.starts != task.starts or \
            e.shape != value.shape or meta.dtype != value.dtype:
        return None
    return value


def _keep_outputs(plan: TilePlan, dest: dict, crc32: dict, nnz: dict, versions: dict,
                  loads: dict) -> None:
    """Keep copies of the stored output tiles of this run that a Load of this plan reads at
    the next run (a training step's new weights: otherwise read from their new payload file,
    opened, mapped and verified afresh, 0.07 ms a step), by name, the version the commit gives
    them, and box; within what the plan's kept Loads leave of ``LOAD_CACHE_BYTES``. A run
    whose commit fails leaves them unread: the next run reads the old version."""
    memo = plan.memo
    boxes = _output_boxes(plan)
    if not boxes:
        return
    room = LOAD_CACHE_BYTES - sum(0 if v[1] is None else v[1].nbytes for v in loads.values())
    wrote = {}
    for key, name, coords, starts, stops in boxes:
        out = dest.get(key)
        version = versions.get(name)
        if out is None or version is None or key not in crc32 or out.nbytes > room:
            continue
        room -= out.nbytes
        copy = out.copy()
        copy.flags.writeable = False
        wrote[(name, version, starts, stops)] = (coords, copy, crc32[key], nnz[key])
    if wrote:
        memo["fastpath_outputs"] = wrote
    else:
        memo.pop("fastpath_outputs", None)


def _output_boxes(plan: TilePlan) -> tuple:
    """(key, lower-cased name, coords, starts, stops) of each tile of a stored output that a
    Load of the plan reads (a tensor the plan replaces), once per plan outputs."""
    kept = plan.memo.get("fastpath_boxes")
    if kept is not None and kept[0] is plan.outputs:
        return kept[1]
    read = {t.tensor.lower() for t in plan.tasks if isinstance(t, Load)}
    boxes = []
    for out in plan.outputs.values():
        name = (out.store_name or out.name)
        if not out.stored or out.grid is None or name.lower() not in read:
            continue
        for coords, key in out.tiles.items():
            starts, stops = tile_box(out.grid, coords)
            boxes.append((key, name.lower(), tuple(coords), tuple(starts), tuple(stops)))
    plan.memo["fastpath_boxes"] = (plan.outputs, tuple(boxes))
    return tuple(boxes)


# Runs of the same rows that took a path the replay does not take before they are no longer
# recorded (fastline.py): a first run reads its Loads otherwise than the next (not yet kept)
TRACE_TRIES = 3


def run_program(plan: TilePlan, steps: list[Step], dest: dict, finished_tile, specs: dict,
                workers: int, check=None, progress=None, versions=None) -> RunResult:
    """Run ``steps`` of ``plan``: stored output tiles computed into ``dest`` (task key ->
    buffer) where given, each final one handed to ``finished_tile(key, tile[, facts])`` as
    the pool hands it (``finished_tile``: None, no sink); ``specs`` the plan's KernelSpecs
    (``runtime.plan_specs``); ``check()`` raises to cancel between calls; ``progress()`` is
    called after each task (``RunControl.task_done``); ``versions``: the version each stored
    output will have once committed, by lower-cased name (the sink's), so that the next run's
    Load of that version reads the tile this run wrote (``_keep_outputs``)."""
    t_run = time.perf_counter()
    clock = time.perf_counter
    ops, kernels, readers, memo = plan.ops, plan.kernels, plan.readers, plan.memo
    loads = memo.setdefault("fastpath_loads", {})
    rows, calls_per_op = _rows(memo, plan, steps, KERNEL)
    calls = _calls(memo, steps, specs, KERNEL)
    shared = _calls(memo, steps, rows, KERNEL, "fastpath_shared")  # bound anew with new rows
    dest = dest or {}
    wrote = memo.get("fastpath_outputs")  # the last run's stored outputs, by name and version
    # the last run of these rows replayed where it took no other path (exec/fastline.py)
    traced = memo.get("fastpath_trace")
    pre = None  # Loads a replay read before it found them changed: {key: (tile, held)}
    if traced is not None and traced[0] is rows and traced[1] is specs and \
            traced[2] is not None:
        done = fastline.replay(
            traced[2], ops, dest, finished_tile, check, progress,
            lambda task, dense: _load(task, readers[task.tensor], loads, dense, wrote), _facts,
            calls_per_op, lambda row, args, out: _spec(specs, row[8].op, ops, kernels)(
                args, row[8].arg_shapes, row[8].out_shape, out, check, None), workers)
        if type(done) is RunResult:
            if versions:
                _keep_outputs(plan, dest, done.crc32, done.nnz, versions, loads)
            elif wrote is not None:
                memo.pop("fastpath_outputs", None)
            tiles = done.tiles
            done.tiles = {k: tiles[k] for k in _kept_keys(memo, plan)}
            return done
        pre = done
    # recorded for a replay while every row takes the paths it can replay
    rec = None if traced is not None and traced[0] is rows and traced[1] is specs and \
        traced[3] >= TRACE_TRIES else []
    rec_loads: list = []
    # buffers of intermediates kept from the last run, taken by this one (another run of the
    # plan at the same time finds none); given back once this run succeeded
    pool = memo.pop("fastpath_pool", None)
    if pool is None:
        pool, pool_bytes = _Buffers(), 0
    else:
        pool_bytes = pool.take()
    made: set = set()  # keys whose tile is a buffer of the pool's kind (written by its call)
    empty = np.empty
    n_ops = len(ops)
    secs, peaks, tiles, moves = [0.0] * n_ops, [0] * n_ops, [0] * n_ops, [0] * n_ops
    final, sparse_out = final_keys(plan), {}  # a sparse intermediate's entries (ANALYZE)
    results: dict = {}
    nnz: dict = {}
    nonfinite: dict = {}
    crc32: dict = {}
    acc: dict = {}
    written: set = set()
    live = peak = moved = 0
    held: dict = {}
    i = -1
    ndarray = np.ndarray
    try:
        with np.errstate(all="ignore"):
            for i, kind, task, key, o, inputs, free, kept_free, mv, temps, dense, stored, \
                    share, pooled in rows:
                if check is not None:
                    check()
                t0 = clock()
                out = dest.get(key)
                stats = None
                for k in mv:
                    n = int(getattr(results[k], "nbytes", 0))
                    moved += n
                    moves[o] += n
                if temps and live + temps > peak:  # as the pool's Ledger.hold
                    peak = live + temps
                    if peak > peaks[o]:
                        peaks[o] = peak
                if kind == KERNEL:
                    call = calls[i]
                    value = None
                    if share is not None and share[1] is not None and share[0] in results:
                        # the join reads a reduction's kept value (exec/reuse.py), bound so
                        args = [results[k] for k in inputs]
                        args.append(results[share[0]])
                        sig, alt = signature(args), shared[i]
                        if alt is None or alt[0] != sig or alt[1] != (out is None):
                            alt = shared[i] = (sig, out is None, None if sig is None else
                                               bind(share[1], args, task.out_shape, out))
                        if alt[2] is not None:
                            value = alt[2](args, out)
                            if rec is not None:
                                rec.append((fastline.SHARED, o, alt[2], inputs, key,
                                            out is not None, free, share[0], task))
                    if value is not None:
                        pass
                    elif call is not None:  # every operand present: bound once to them
                        args = [results[k] for k in inputs]
                        sig = signature(args)
                        keep = share is not None and share[1] is None
                        target = out
                        if pooled is not None and sig is not None:  # an intermediate
                            # written into a kept buffer (an unbound call's spec takes none)
                            free_bufs = pool.get(pooled)
                            if free_bufs:
                                target = free_bufs.pop()
                                pool_bytes -= target.nbytes
                            else:
                                target = empty(*pooled)
                        if call[0] != sig or call[1] != (target is None):
                            call = calls[i] = (sig, target is None, None if sig is None else
                                               bind(_spec(specs, task.op, ops, kernels), args,
                                                    task.out_shape, target, keep=keep))
                        if call[2] is not None:
                            value = call[2](args, target)
                            if rec is not None:
                                if target is not out:
                                    rec = None
                                else:
                                    rec.append((fastline.KEEP if keep else fastline.PLAIN, o,
                                                call[2], inputs, key, out is not None, free,
                                                share[0] if keep else None, task))
                            if target is not out:  # a buffer of the pool, given
                                if value is target:
                                    made.add(key)
                                elif pool_bytes + target.nbytes <= POOL_BYTES:
                                    pool_bytes += target.nbytes  # not written into (scaled
                                    pool.setdefault(pooled, []).append(target)  # after it)
                            if keep:  # a reduction whose join's value a later call reads
                                value, kept = value
                                if kept is not None:
                                    results[share[0]] = kept
                                    h = held[share[0]] = kept.nbytes
                                    live += h
                                    if live > peak:
                                        peak = live
                                    if live > peaks[o]:
                                        peaks[o] = live
                        else:
                            rec = None
                            if out is not None:
                                stats = TileStats()
                            value = _spec(specs, task.op, ops, kernels)(
                                args, task.arg_shapes, task.out_shape, out, check,
                                None if stats is None else stats.add)
                    else:
                        rec = None
                        it = iter([results[k] for k in inputs])
                        args = [None if a is None else next(it) for a in task.args]
                        if out is not None:
                            stats = TileStats()
                        value = _spec(specs, task.op, ops, kernels)(
                            args, task.arg_shapes, task.out_shape, out, check,
                            None if stats is None else stats.add)
                elif kind == LOAD:
                    if pre is not None and key in pre:
                        value, load_held = pre.pop(key)
                    else:
                        value, load_held = _load(task, readers[task.tensor], loads, dense, wrote)
                    if rec is not None:
                        if out is not None or free or type(value) is not ndarray:
                            rec = None
                        else:
                            rec_loads.append((key, o, task, dense, (
                                value.shape, value.dtype, value.flags.c_contiguous),
                                _owned_nbytes(value) if load_held is None else load_held))
                elif kind == ASSEMBLE:
                    value = run_assemble(task, [results[k] for k in inputs], np)
                elif kind == START:
                    a = acc[key] = start_aggregate(task, results[inputs[0]], np, out)
                    h = held[key] = int(getattr(a, "nbytes", 0))  # the partial is still held
                    live += h
                    if live > peak:
                        peak = live
                    if live > peaks[o]:
                        peaks[o] = live
                    value = None
                elif kind == FOLD:
                    # a new accumulator where a partial is a sparse tile (kernels.combine)
                    acc[key] = combine(task.agg, acc[key], results[inputs[0]], np)
                    value = None
                else:  # FINISH
                    value = finish_aggregate(task, acc.pop(key), np)
                    live -= held.pop(key, 0)  # acquired again below, as a finished tile
                if kind > KERNEL:  # an assembled box, an aggregation: not replayed
                    rec = None
                if value is not None:
                    if out is not None:
                        if value is not out:
                            np.copyto(out, value, casting="unsafe")
                            value, stats = out, None
                        facts = stats.result() if stats is not None and \
                            stats.nbytes == out.nbytes else _facts(out)
                        nnz[key], nonfinite[key], crc32[key] = facts
                        if finished_tile is not None:
                            finished_tile(key, out, facts)
                    elif finished_tile is not None and stored and \
                            finished_tile(key, value):
                        written.add(key)  # in its file: not the commit's to write, nor kept
                        rec = None
                    if rec is not None and type(value) is not ndarray:
                        rec = None
                    results[key] = value
                    if type(value) is ndarray:
                        nbytes = value.nbytes
                        if kind == LOAD:
                            h = _owned_nbytes(value) if load_held is None else load_held
                        else:  # a dense tile the run computed: all its bytes (held_bytes)
                            h = nbytes
                    else:
                        nbytes = int(getattr(value, "nbytes", 0))
                        h = held_bytes(task, value) if kind != LOAD or load_held is None \
                            else load_held
                    live += h
                    if live > peak:
                        peak = live
                    if live > peaks[o]:
                        peaks[o] = live
                    if nbytes > tiles[o]:
                        tiles[o] = nbytes
                    if type(value) is not np.ndarray and key in final:
                        n = sparse_entries(value)
                        if n is not None:
                            sparse_out[o] = sparse_out.get(o, 0) + n
                    if out is None:
                        held[key] = h
                    else:  # an output file's pages: the page cache's, not the run's
                        live -= h
                # a tile read for the last time, or a stored output tile already in its file
                # that nothing reads (the pool streams such an output: a few tiles held)
                for k in free:
                    v = results.pop(k, None)
                    live -= held.pop(k, 0)
                    if k in made:  # its buffer, for a later call of this run or the next
                        made.discard(k)
                        if pool_bytes + v.nbytes <= POOL_BYTES and not _aliased(v, results, acc):
                            pool_bytes += v.nbytes
                            pool.setdefault((v.shape, v.dtype), []).append(v)
                if kept_free:
                    for k in kept_free:
                        if k in written:
                            results.pop(k, None)
                            live -= held.pop(k, 0)
                secs[o] += clock() - t0
                if progress is not None and kind != START and kind != FOLD:
                    progress()
    except BaseException as exc:  # noqa: BLE001 - named for its operation, as the pool names it
        if isinstance(exc, Cancelled):
            raise
        op = ops[rows[i][4]] if i >= 0 else None
        err = translate(exc, op)
        if err is exc:
            raise
        raise err from exc
    if rec is not None:
        memo["fastpath_trace"] = (rows, specs, fastline.record(
            rec_loads, rec, dest, moved, peak, moves, tiles, peaks), 0)
    elif traced is None or traced[0] is not rows or traced[1] is not specs:
        memo["fastpath_trace"] = (rows, specs, None, 1)
    elif traced[3] < TRACE_TRIES:
        memo["fastpath_trace"] = (rows, specs, None, traced[3] + 1)
    if pool and pool.keep(pool_bytes):
        memo["fastpath_pool"] = pool
    if versions:
        _keep_outputs(plan, dest, crc32, nnz, versions, loads)
    elif wrote is not None:
        del memo["fastpath_outputs"]
    keep = _kept_keys(memo, plan)
    measures = [OpMeasure(secs[n], calls_per_op[n], moves[n], tiles[n], peaks[n])
                for n in range(n_ops)]
    for o, n in sparse_out.items():
        measures[o].out_nnz = n
    seconds = time.perf_counter() - t_run
    return RunResult({k: results[k] for k in keep if k not in written}, seconds, moved, peak,
                     sum(calls_per_op),
                     [seconds] + [0.0] * (workers - 1), nnz=nnz, nonfinite=nonfinite,
                     crc32=crc32, ops=measures, over_budget=0)
