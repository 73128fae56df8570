"""The straight-line run of a tiny plan: its tasks lowered once to a list of calls, run on the
calling thread with no dataflow bookkeeping (issue 29: a training step that pays only for its
work).

A plan the local pool would run on the calling thread anyway (``pool._tiny``, no memory budget
to keep, host tiles) has its order fixed before it starts: the ready-heap of ``_Run.go_inline``
(folds first, then the plan's rank) depends on nothing but which tasks have finished. So that
order is worked out once per plan (``program``, kept in the plan's memo, which a cached plan's
rebound copies share), with the point after which each tile is no longer needed; a run then
walks it: each Load read once however many workers the plan placed a copy on, each kernel
called through the same ``KernelSpec`` as the pool's (same arguments, same output buffers, so
the answers are bit-identical), intermediates kept as NumPy arrays (never a file), each stored
output's statistics taken as the pool takes them and handed to the sink. Cancellation is
checked between calls, errors name their operation (``runtime.translate``), and the per
operation seconds and kernel calls EXPLAIN ANALYZE shows are counted.

Two tasks of the pool's run that read the same stored box on two workers (a Load per worker)
are one read here: on one thread there is nothing to move.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

from ..physical.order import ranks
from ..physical.plan import Aggregate, Kernel, Load, TilePlan
from ..storage.writer import TileStats, tile_stats
from .budget import temporary_bytes
from .kernels import KernelSpec, combine
from .runtime import (Cancelled, OpMeasure, RunResult, _owned_nbytes, final_keys, held_bytes,
                      translate)
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


def _load(task, reader, loads: dict, dense: bool):
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


def run_program(plan: TilePlan, steps: list[Step], dest: dict, finished_tile, specs: dict,
                workers: int, check=None, progress=None) -> RunResult:
    """Run ``steps`` of ``plan``: stored output tiles computed into ``dest`` (task key ->
    buffer) where given, each final one handed to ``finished_tile(key, tile[, facts])`` as
    the pool hands it (``finished_tile``: None, no sink); ``specs`` the plan's KernelSpecs
    (``runtime.plan_specs``); ``check()`` raises to cancel between calls; ``progress()`` is
    called after each task (``RunControl.task_done``)."""
    t_run = time.perf_counter()
    ops, kernels, readers = plan.ops, plan.kernels, plan.readers
    loads = plan.memo.setdefault("fastpath_loads", {})
    measures = [OpMeasure() for _ in ops]
    final = final_keys(plan)
    keep = {k for out in plan.outputs.values() if out.stored for k in out.tiles.values()}
    results: dict = {}
    nnz: dict = {}
    nonfinite: dict = {}
    crc32: dict = {}
    acc: dict = {}
    written: set = set()
    live = peak = moved = 0
    held: dict = {}
    step = None
    try:
        with np.errstate(all="ignore"):
            for step in steps:
                if check is not None:
                    check()
                t0 = time.perf_counter()
                kind, task = step.kind, step.task
                key = step.key
                out = dest.get(key)
                stats = None
                m = measures[step.op]
                for k in step.moved:
                    n = int(getattr(results[k], "nbytes", 0))
                    moved += n
                    m.bytes_moved += n
                if step.temps and live + step.temps > peak:  # as the pool's Ledger.hold
                    peak = live + step.temps
                    m.peak_bytes = max(m.peak_bytes, peak)
                if kind == KERNEL:
                    spec = specs.get(task.op)
                    if spec is None:
                        spec = specs[task.op] = KernelSpec(ops[task.op], np, kernels[task.op])
                    it = iter([results[k] for k in step.inputs])
                    args = [None if a is None else next(it) for a in task.args]
                    if out is not None:
                        stats = TileStats()
                    value = spec(args, task.arg_shapes, task.out_shape, out, check,
                                 None if stats is None else stats.add)
                elif kind == LOAD:
                    value, load_held = _load(task, readers[task.tensor], loads, step.dense)
                elif kind == ASSEMBLE:
                    value = run_assemble(task, [results[k] for k in step.inputs], np)
                elif kind == START:
                    a = acc[key] = start_aggregate(task, results[step.inputs[0]], np, out)
                    h = held[key] = int(getattr(a, "nbytes", 0))  # the partial is still held
                    live += h
                    if live > peak:
                        peak = live
                    if live > m.peak_bytes:
                        m.peak_bytes = live
                    value = None
                elif kind == FOLD:
                    # a new accumulator where a partial is a sparse tile (kernels.combine)
                    acc[key] = combine(task.agg, acc[key], results[step.inputs[0]], np)
                    value = None
                else:  # FINISH
                    value = finish_aggregate(task, acc.pop(key), np)
                    live -= held.pop(key, 0)  # acquired again below, as a finished tile
                if value is not None:
                    if out is not None:
                        if value is not out:
                            np.copyto(out, value, casting="unsafe")
                            value, stats = out, None
                        facts = stats.result() if stats is not None and \
                            stats.nbytes == out.nbytes else tile_stats(out)
                        nnz[key], nonfinite[key], crc32[key] = facts
                        if finished_tile is not None:
                            finished_tile(key, out, facts)
                    elif finished_tile is not None and key in keep and \
                            finished_tile(key, value):
                        written.add(key)  # in its file: not the commit's to write, nor kept
                    results[key] = value
                    nbytes = int(getattr(value, "nbytes", 0))
                    if kind == LOAD:
                        h = held_bytes(task, value) if load_held is None else load_held
                    else:  # a dense tile the run computed: all its bytes (held_bytes)
                        h = nbytes if type(value) is np.ndarray else held_bytes(task, value)
                    live += h
                    if live > peak:
                        peak = live
                    if live > m.peak_bytes:
                        m.peak_bytes = live
                    if nbytes > m.peak_tile_bytes:
                        m.peak_tile_bytes = nbytes
                    if type(value) is not np.ndarray and key in final:
                        m.count_sparse(value)  # a sparse intermediate's entries (ANALYZE)
                    if out is None:
                        held[key] = h
                    else:  # an output file's pages: the page cache's, not the run's
                        live -= h
                # a tile read for the last time, or a stored output tile already in its file
                # that nothing reads (the pool streams such an output: a few tiles held)
                for k in step.free + ((key,) if step.unread and key in written else ()):
                    if k not in keep or k in written:
                        results.pop(k, None)
                        live -= held.pop(k, 0)
                m.seconds += time.perf_counter() - t0
                if kind == KERNEL:
                    m.kernel_calls += 1
                if progress is not None and kind != START and kind != FOLD:
                    progress()
    except BaseException as exc:  # noqa: BLE001 - named for its operation, as the pool names it
        if isinstance(exc, Cancelled):
            raise
        op = ops[step.op] if step is not None else None
        err = translate(exc, op)
        if err is exc:
            raise
        raise err from exc
    seconds = time.perf_counter() - t_run
    return RunResult({k: results[k] for k in keep if k not in written}, seconds, moved, peak,
                     sum(m.kernel_calls for m in measures),
                     [seconds] + [0.0] * (workers - 1), nnz=nnz, nonfinite=nonfinite,
                     crc32=crc32, ops=measures, over_budget=0)
