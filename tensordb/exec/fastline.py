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

import time
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


def record(loads: list, rows: list, dest: dict, moved: int, peak: int, moves, tiles,
           peaks) -> Trace:
    return Trace(tuple(loads), tuple(rows), frozenset(dest), moved, peak, tuple(moves),
                 tuple(tiles), tuple(peaks))


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
    measures = [OpMeasure(s, c, m, t, p) for s, c, m, t, p in
                zip(secs, calls_per_op, trace.moves, trace.tiles, trace.peaks)]
    seconds = clock() - t_run
    return RunResult(results, seconds, trace.moved, trace.peak, sum(calls_per_op),
                     [seconds] + [0.0] * (workers - 1),
                     nnz=nnz, nonfinite=nonfinite, crc32=crc32, ops=measures, over_budget=0)
