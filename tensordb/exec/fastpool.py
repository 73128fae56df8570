"""The buffers of large intermediates a plan of the straight-line run keeps between its runs
(exec/fastpath.py; issue 29): taken whole by a run, so two runs at once never share one, and
bounded for the whole process (``POOL_TOTAL_BYTES``)."""
from __future__ import annotations

import threading

__all__ = ["POOL_BYTES", "POOL_TOTAL_BYTES"]


# Bytes of intermediates' buffers a plan keeps between its runs (and recycles within one): an
# intermediate of 128 KiB or more is a fresh mmap, faulted in page by page, at every run; the
# digits MLP step's 1347 x 128 products and their RELU took 640 page faults a step (numpy's own
# step 730).
POOL_BYTES = 8 << 20
# ...and all plans' kept buffers together: idle bytes the process holds between statements,
# outside any statement's memory budget, so bounded for the whole process (a plan cache of 32
# plans would otherwise keep up to 32 x POOL_BYTES). A run that finds no room keeps none.
POOL_TOTAL_BYTES = 32 << 20
_kept = [0]  # bytes of every plan's kept buffers (_Buffers.nbytes summed)
_kept_lock = threading.Lock()


def _count_kept(n: int) -> None:
    with _kept_lock:
        _kept[0] += n


class _Buffers(dict):
    """A plan's kept buffers by (shape, dtype); ``nbytes`` of them count in the process's
    total while the plan's memo holds them (a run takes them out: 0), and leave it when the
    memo drops them (the plan left the cache)."""

    __slots__ = ("nbytes",)

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def take(self) -> int:
        """Out of the memo, into a run: its bytes no longer count as kept."""
        n, self.nbytes = self.nbytes, 0
        _count_kept(-n)
        return n

    def keep(self, n: int) -> bool:
        """Back into the memo with ``n`` bytes, if the process's total has room."""
        with _kept_lock:
            if _kept[0] + n > POOL_TOTAL_BYTES:
                return False
            _kept[0] += n
        self.nbytes = n
        return True

    def __del__(self) -> None:
        if self.nbytes:
            _count_kept(-self.nbytes)


def _aliased(buf, results: dict, acc: dict) -> bool:
    """Is ``buf`` (a tile read for the last time) still part of a tile the run holds: one of
    them, or a view of it (a join whose value is its operand)?"""
    for v in results.values():
        if v is buf or getattr(v, "base", None) is buf:
            return True
    for v in acc.values():
        if v is buf or getattr(v, "base", None) is buf:
            return True
    return False
