"""The tail of a pool run: the last matrix-product call of a run cut by rows among idle workers.

Nine equal tile products on two workers of one BLAS thread each split five and four: the run's
critical path is five products where the cores could do four and a half (numpy's two-thread
loop over the same products does: OpenBLAS cuts each call's rows between its threads). When a
worker starts a kernel call and no kernel call of the run is left to start after it, the other
workers whose queues are empty will have nothing to do but wait for it: the call is cut into
row blocks (``RowSplit``), one for this worker and one for each such worker, each block a
matmul of the operand's rows into the same rows of the one output tile.

The cut changes no answer: each output element is the same BLAS dot product (OpenBLAS sums the
contracted label in the same blocks whatever the rows; its own threads cut rows the same way).
Where it could differ it is not made: a block of fewer rows than ``MIN_BLOCK_MULTS`` over the
contracted and free extents (OpenBLAS's small-matrix kernels, taken below about 100^3
multiplications on this machine's SkylakeX, sum in another order), boundaries not on a multiple
of ``ROW_ALIGN`` rows (its edge kernels), a kernel that broadcasts, scales, converts or tests for
NaN/inf (``KernelSpec``: the fallbacks that need the whole result), sparse, gathered or absent
operands. tests/exec/test_tail_cut.py checks the bits against the uncut call. The identity is
OpenBLAS's on x86-64 (``EXACT_BLAS``): elsewhere (MKL, Accelerate, an ARM build's small-matrix
kernels) a call's kernels may be picked by its rows, and nothing is cut.

A block offered to another worker is taken back by the worker that cut the call if that worker
has not taken it from its queue when it is done with its own block (``ReadyQueues.take_back``):
on a busy machine, or where the other worker is still in a long call, the cut costs two half
calls instead of one, never a wait for a worker that has not started.
"""
from __future__ import annotations

import math
import platform
import threading

import numpy as np

from ..storage.boxes import RowGather
from ..storage.sparse import is_sparse

__all__ = ["RowSplit", "row_split", "MIN_CALL_MULTS", "MIN_BLOCK_MULTS", "ROW_ALIGN", "EXACT_BLAS"]

MIN_CALL_MULTS = 1 << 23   # a call of fewer multiplications is not cut (256^3 is 2^24)
MIN_BLOCK_MULTS = 1 << 22  # nor into blocks of fewer (OpenBLAS's small-matrix path: < 1e6)
ROW_ALIGN = 16             # block boundaries on a multiple of this many rows


def _exact_blas() -> bool:
    """Whether numpy's BLAS is OpenBLAS on x86-64 (numpy's build configuration says), where a
    block of rows gets each element's dot product summed as the whole call would."""
    try:
        name = np.__config__.CONFIG["Build Dependencies"]["blas"]["name"]
    except Exception:  # noqa: BLE001 - an older numpy, another build: not known to be exact
        return False
    return "openblas" in str(name).lower() and platform.machine().lower() in ("x86_64", "amd64")


EXACT_BLAS = _exact_blas()  # the cut is made only where this holds


class RowSplit:
    """One kernel call cut into row blocks of its (batch, rows, cols) product: ``run(i)``
    computes block ``i`` into ``result``. ``taken[i]`` says who runs it (under ``lock``);
    ``done`` is set when the blocks given away have all ended (``error`` the first failure)."""

    __slots__ = ("a3", "b3", "res3", "result", "bounds", "lock", "left", "done", "error")

    def __init__(self, a3, b3, res3, result, bounds) -> None:
        self.a3, self.b3, self.res3, self.result, self.bounds = a3, b3, res3, result, bounds
        self.lock = threading.Lock()
        self.left = 0  # blocks given to other workers and not yet ended
        self.done = threading.Event()
        self.error: BaseException | None = None

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def run(self, i: int) -> None:
        lo, hi = self.bounds[i], self.bounds[i + 1]
        np.matmul(self.a3[:, lo:hi], self.b3, out=self.res3[:, lo:hi])

    def given(self, n: int) -> None:
        with self.lock:
            self.left += n
            if self.left == 0:
                self.done.set()

    def ended(self, error: BaseException | None = None) -> None:
        """A block given to another worker ended there (``error``: it failed)."""
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.left -= 1
            if self.left == 0:
                self.done.set()


def row_split(spec, args: list, arg_shapes, out_shape, out, parts: int) -> RowSplit | None:
    """``spec``'s call on ``args`` cut into at most ``parts`` row blocks, or None where it is
    not a plain BLAS matmul that cuts without changing an answer (see the module's doc)."""
    if parts < 2 or not EXACT_BLAS or spec.diagonal is not None or spec.xp is not np \
            or spec.matmul is None \
            or spec.choice.method != "matmul" or spec.test_inputs or spec.test_result \
            or spec.scale != 1 or spec.scale_first is not None:
        return None
    dtype = spec.dtype
    if dtype.kind != "f":  # integers, bool: numpy's own loop, not BLAS (cut at no gain)
        return None
    lay = spec.matmul
    a, b = args[lay.first], args[lay.second]
    for x in (a, b):
        if x is None or isinstance(x, RowGather) or is_sparse(x) or \
                not isinstance(x, np.ndarray) or x.dtype != dtype:
            return None
    if len(args) != 2:
        return None
    ext = {}
    for o, arr in ((spec.op.inputs[lay.first], a), (spec.op.inputs[lay.second], b)):
        ext.update(zip(o.labels, arr.shape))
    nb, m, k, n = (math.prod(ext[l] for l in group) for group in
                   (lay.batch, lay.free_first, lay.contracted, lay.free_second))
    mults = nb * m * k * n
    if mults < MIN_CALL_MULTS:
        return None
    # rows a block: at least MIN_BLOCK_MULTS (in each matrix of a batch: numpy calls the BLAS
    # once a matrix), a multiple of ROW_ALIGN
    least = -(-MIN_BLOCK_MULTS // max(1, k * n))
    least = -(-least // ROW_ALIGN) * ROW_ALIGN
    parts = min(parts, m // max(least, ROW_ALIGN))
    if parts < 2:
        return None
    step = -(-m // parts // ROW_ALIGN) * ROW_ALIGN  # rounded up: the last block the smallest
    bounds = list(range(0, m, step)) + [m]
    if len(bounds) < 3 or bounds[-1] - bounds[-2] < least:
        return None
    shape = tuple(ext[l] for l in spec.op.out_labels)
    if out is not None and tuple(out.shape) == shape and out.dtype == dtype and \
            out.flags.c_contiguous and out.flags.writeable:
        result = out
    else:
        result = np.empty(shape, dtype=dtype)
    a3 = a.transpose(lay.perm_first).reshape(nb, m, k)
    b3 = b.transpose(lay.perm_second).reshape(nb, k, n)
    return RowSplit(a3, b3, result.reshape(nb, m, n), result, bounds)
