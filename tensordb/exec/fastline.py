"""The straight-line run replayed (exec/fastpath.py; issue 29: a small step's run at numpy's
pace).

A run of ``fastpath.run_program`` decides, row by row, what each of its tiles' calls is: the
bound function of each kernel call (exec/bound.py, bound again when its operands' signature
changes), whether it writes into an output buffer or a kept one, whether it reads a kept join
value (exec/reuse.py), and it keeps the run's accounts (bytes moved, the live tile bytes and
their peak, each operation's largest tile) as it goes. For a training step's plan run again on
operands of the same signatures, every one of those decisions comes out the same: the bound
functions are deterministic in their operands' shapes, dtypes and layouts, and so are the
layouts of what they make. So a run that took no other path (every kernel call bound, dense
tiles only, no kept buffer of the pool's, each stored tile written into its output buffer)
is recorded as a ``Trace``: the function each row called, its operands' keys, where its tile
goes, and the accounts the run kept. The next run of the same rows:

- reads the plan's Loads first (a Load reads no tile of the run) and checks each against the
  trace: a dense array of the same shape, dtype and C-contiguity, held for the same bytes
  (a kept copy, or the tile the last run wrote: ``fastpath._load``); and the output buffers
  the sink opened, the trace's keys. Where any differs, ``replay`` returns what it read and
  the general loop runs (and records again), reading those Loads' tiles, not reading them
  twice;
- then calls the recorded functions in the recorded order, with nothing decided per row but
  the operands' lookup and the output buffer: the same NumPy calls into the same buffers as
  the general loop (the same bytes), a stored tile's statistics taken and handed to the sink
  as there, each tile dropped after its last reader, cancellation checked and progress
  reported between calls, each operation's seconds counted (EXPLAIN ANALYZE);
- returns the recorded accounts, which depend only on the tiles' sizes and the Loads' held
  bytes (both checked).

A row the general loop handles otherwise (a spec called, a pool buffer, an assembled box, an
aggregation's partials, a sparse tile) makes its rows not replayable; they are not recorded
again while the plan keeps them. The trace is kept in the plan's memo beside the rows it
was recorded for (the same list object: new parameter values or kernel choices make new
rows); it holds functions and keys only, never a tile, so two runs of the plan at once share
nothing but read-only objects.
"""
from __future__ import annotations

import operator
import time
from itertools import starmap
from dataclasses import dataclass

import numpy as np

from .runtime import Cancelled, OpMeasure, RunResult, _owned_nbytes, translate

__all__ = ["Trace", "record", "replay", "PLAIN", "KEEP", "SHARED"]

PLAIN, KEEP, SHARED = range(3)


@dataclass(frozen=True)
class Trace:
    """A recorded run: ``loads`` (key, op, task, dense, signature, held bytes) per Load; ``rows``
    (kind, op, function, input keys, key, stored, keys freed after it, kept key) per kernel
    call in the run's order (``kind``: PLAIN, a reduction that KEEPs its join value under the
    kept key, or a SHARED call that reads it as its last operand); ``stored``: the output
    buffers' keys; the accounts: bytes moved, the peak, per operation its bytes moved,
    largest tile and peak."""

    loads: tuple
    rows: tuple
    stored: frozenset
    moved: int
    peak: int
    moves: tuple
    tiles: tuple
    peaks: tuple
    run: object = None  # the rows as one function (``_compile``)


def record(loads: list, rows: list, dest: dict, moved: int, peak: int, moves, tiles,
           peaks) -> Trace:
    rows = tuple(rows)
    return Trace(tuple(loads), rows, frozenset(dest), moved, peak, tuple(moves),
                 tuple(tiles), tuple(peaks), _compile(rows, [ld[0] for ld in loads]))


def _compile(rows: tuple, loaded: list):
    """The rows written out as one function ``f(tiles, dest, check, progress, at, clock,
    secs, facts, finished, nnz, nonfinite, crc32, spec_call)`` (``tiles``: the Loads' by key;
    ``at[0]``: the row running, for an error's name): each tile a local variable, each call
    a line, a tile dropped (``del``) after its last reader, as the loop below does with a
    dict (1.3 us a row of a digits step's run: the row's tuple, the operands' list, the
    dict's lookups and stores; about 0.4 here). The text is made of generated names and the
    tiles' integer keys only; every function and row is bound in its namespace.
    Returns the tiles left at the end by key."""
    names: dict = {"copyto": np.copyto}
    lines = ["def f(tiles, dest, check, progress, at, clock, secs, facts, finished, nnz, "
             "nonfinite, crc32, spec_call):"]
    body = []
    alive: set = set()

    def v(k) -> str:
        k = operator.index(k)  # an integer (a NumPy one from the plan's arrays too), or raise
        return f"v{k}" if k >= 0 else f"m{-k}"

    for k in loaded:
        body.append(f"{v(k)} = tiles[{operator.index(k)}]")
        alive.add(k)
    kept = {r[7] for r in rows if r[0] == KEEP}
    for k in sorted(kept):
        body.append(f"{v(k)} = None")  # a reduction's join value, when it keeps one
        alive.add(k)
    body.append("t0 = clock()")
    for n, (kind, o, fn, inputs, key, stored, free, extra, _) in enumerate(rows):
        f = f"F{n}"
        names[f] = fn
        body.append(f"at[0] = {n}")
        body.append("if check is not None: check()")
        out = "o" if stored else "None"
        if stored:
            body.append(f"o = dest[{operator.index(key)}]")
        args = ", ".join(v(k) for k in inputs)
        if kind == PLAIN:
            body.append(f"x = {f}([{args}], {out})")
        elif kind == KEEP:
            body.append(f"x, kept = {f}([{args}], {out})")
            body.append(f"if kept is not None: {v(extra)} = kept")
            body.append("kept = None")  # (freed with its last reader's del, not held here)
        else:
            body.append(f"if {v(extra)} is not None: x = {f}([{args}{', ' if args else ''}"
                        f"{v(extra)}], {out})")
            body.append(f"else: x = spec_call({n}, [{args}], {out})")
        if stored:
            k = operator.index(key)
            body += ["if x is not o:", "    copyto(o, x, casting='unsafe')", "    x = o",
                     "fa = facts(o)", f"nnz[{k}], nonfinite[{k}], crc32[{k}] = fa",
                     f"if finished is not None: finished({k}, o, fa)"]
        body.append(f"{v(key)} = x")
        alive.add(key)
        gone = [k for k in free if k in alive]
        alive.difference_update(gone)
        if gone:
            body.append("del " + ", ".join(v(k) for k in gone))
        body += ["t1 = clock()", f"secs[{operator.index(o)}] += t1 - t0", "t0 = t1",
                 "if progress is not None: progress()"]
    body.append("return {" + ", ".join(f"{operator.index(k)}: {v(k)}" for k in sorted(alive)
                                       if k not in kept) + "}")
    lines += ["    " + line for line in body]
    text = "\n".join(lines)
    exec(text, names)  # noqa: S102 - generated names and integer keys only
    fn = names["f"]
    fn.source = text
    return fn


def replay(trace: Trace, ops, dest: dict, finished_tile, check, progress, read, facts,
           calls_per_op, spec_call, workers: int):
    """Run ``trace`` again: a RunResult (its ``tiles`` all the run's tiles left: the caller
    keeps the stored outputs'), or, where a Load or the output buffers differ from the trace,
    {key: (tile, held)} of the Loads read (the general loop reads them from there).
    ``read(task, dense)``: a Load's (tile, held) (``fastpath._load``); ``facts(tile)``: a
    stored tile's statistics; ``spec_call(row)``: the tile of a SHARED row whose kept value is
    missing, by its operation's KernelSpec."""
    clock = time.perf_counter
    t_run = clock()
    results: dict = {}
    pre: dict = {}
    ndarray = np.ndarray
    n_ops = len(ops)
    secs = [0.0] * n_ops
    ok = dest.keys() == trace.stored
    if check is not None:
        check()
    for key, o, task, dense, sig, held in trace.loads:
        t0 = clock()
        value, h = read(task, dense)
        pre[key] = (value, h)
        if ok:
            if type(value) is not ndarray or value.shape != sig[0] or \
                    value.dtype != sig[1] or value.flags.c_contiguous != sig[2] or \
                    (_owned_nbytes(value) if h is None else h) != held:
                ok = False
            results[key] = value
        secs[o] += clock() - t0
    if not ok:
        return pre
    if progress is not None:
        for _ in trace.loads:
            progress()
    nnz: dict = {}
    nonfinite: dict = {}
    crc32: dict = {}
    if trace.run is not None:
        at = [-1]
        try:
            with np.errstate(all="ignore"):
                results = trace.run(results, dest, check, progress, at, clock, secs, facts,
                                    finished_tile, nnz, nonfinite, crc32,
                                    lambda n, args, out: spec_call(trace.rows[n], args, out))
        except BaseException as exc:  # noqa: BLE001 - named for its operation, as the pool names it
            if isinstance(exc, Cancelled):
                raise
            err = translate(exc, ops[trace.rows[at[0]][1]] if at[0] >= 0 else None)
            if err is exc:
                raise
            raise err from exc
        return _result(trace, results, secs, calls_per_op, nnz, nonfinite, crc32, workers,
                       t_run)
    row = None
    try:
        with np.errstate(all="ignore"):
            t0 = clock()
            for row in trace.rows:
                kind, o, fn, inputs, key, stored, free, extra, _ = row
                if check is not None:
                    check()
                out = dest[key] if stored else None
                args = [results[k] for k in inputs]
                if kind == PLAIN:
                    value = fn(args, out)
                elif kind == KEEP:
                    value, kept = fn(args, out)
                    if kept is not None:
                        results[extra] = kept
                else:  # SHARED
                    kept = results.get(extra)
                    if kept is not None:
                        args.append(kept)
                        value = fn(args, out)
                    else:  # (not expected: the same calls keep the same value)
                        value = spec_call(row, args, out)
                if out is not None:
                    if value is not out:
                        np.copyto(out, value, casting="unsafe")
                        value = out
                    f = facts(out)
                    nnz[key], nonfinite[key], crc32[key] = f
                    if finished_tile is not None:
                        finished_tile(key, out, f)
                results[key] = value
                for k in free:
                    results.pop(k, None)
                t1 = clock()
                secs[o] += t1 - t0
                t0 = t1
                if progress is not None:
                    progress()
    except BaseException as exc:  # noqa: BLE001 - named for its operation, as the pool names it
        if isinstance(exc, Cancelled):
            raise
        err = translate(exc, ops[row[1]] if row is not None else None)
        if err is exc:
            raise
        raise err from exc
    return _result(trace, results, secs, calls_per_op, nnz, nonfinite, crc32, workers, t_run)


def _result(trace, results, secs, calls_per_op, nnz, nonfinite, crc32, workers, t_run):
    measures = list(starmap(OpMeasure, zip(secs, calls_per_op, trace.moves, trace.tiles,
                                           trace.peaks)))
    seconds = time.perf_counter() - t_run
    return RunResult(results, seconds, trace.moved, trace.peak, sum(calls_per_op),
                     [seconds] + [0.0] * (workers - 1),
                     nnz=nnz, nonfinite=nonfinite, crc32=crc32, ops=measures, over_budget=0)
