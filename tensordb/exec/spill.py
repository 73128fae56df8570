"""Spill files: intermediate tiles of one run written to disk and read back memory-mapped.

A spilled tile is written with NumPy (``np.save``) into the run's spill directory
(``storage/spilldir.py``: ``<database dir>/spill/run-<pid>-<n>/``, or a temporary directory for an
in-memory database) and read back with ``np.load(mmap_mode="r")``: its consumers read file pages,
which the page cache holds, not the process's anonymous memory. The directory is made at the
first spill and removed by ``close`` (the pool calls it in its ``finally``: on success, on error
and on cancellation); a file goes as soon as its tile's last consumer has run.
"""
from __future__ import annotations

import os
import shutil
import time

import numpy as np

from ..storage.spilldir import make_run_directory

__all__ = ["SpillFiles"]


class SpillFiles:
    """The spill files of one run (not thread-safe: the pool calls it under its queue lock)."""

    def __init__(self, store=None) -> None:
        self.store = store
        self.path: str | None = None
        self.files: dict[int, str] = {}
        self.bytes = 0
        self.seconds = 0.0

    def write(self, key: int, value) -> tuple[np.ndarray, int, float]:
        """Write tile ``key``: its memory-mapped, read-only copy, its bytes and the seconds the
        write took. A failed write leaves no file behind and raises OSError."""
        t0 = time.perf_counter()
        if self.path is None:
            self.path = make_run_directory(self.store)
        path = os.path.join(self.path, f"{key}.npy")
        self.files[key] = path
        try:
            np.save(path, value, allow_pickle=False)  # (ascontiguousarray would make a 0-d tile 1-d)
        except BaseException:
            self.drop(key)
            raise
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        nbytes = int(value.nbytes)
        self.bytes += nbytes
        seconds = time.perf_counter() - t0
        self.seconds += seconds
        return mapped, nbytes, seconds

    def drop(self, key: int) -> None:
        """Tile ``key``'s last consumer ran: its file goes (a mapping still open keeps its
        pages until it is closed; the file's name is gone now)."""
        path = self.files.pop(key, None)
        if path is not None:
            try:
                os.remove(path)
            except OSError:
                pass

    def close(self) -> None:
        """Remove the run's spill directory and everything in it."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
            self.files.clear()
