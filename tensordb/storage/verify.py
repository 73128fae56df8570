"""Checksums verified on read: a stored tile's bytes are compared with the CRC-32 its catalog row
records the first time this process reads them, on every read path (the local pool's and the
GPU's loads, Dask workers, ``con.tensor``, SQL relations, export, CHECK aside), before they reach
a kernel, a result or a file. A damaged tile is a DataError naming the tensor, the tile and the
file, so it never flows into a new tensor (whose own checksums would be valid).

Once per process: what was verified is remembered by the file's identity (path, device, inode,
modification time, size: a payload rewritten in place, or a spare recycled under a new
version's name, is another file) and the tile's place and recorded checksum. Damage that leaves
the modification time alone, such as a disk's bit rot, is found by the next process that reads
the file, and by CHECK. The tiles a process writes and commits count as verified in it (their
checksums were taken from those bytes: ``mark_written``). A memory-mapped tile is checksummed
through the mapping (a memoryview of it: nothing is copied); ISA-L folds 10-23 GB/s, so the
first read of a 16 MiB tile costs 0.7-1.6 ms more, a warm read nothing (docs/benchmarks.md,
"Checksums on read"). Tiles written before checksums were recorded (NULL ``crc32``) cannot be
verified and are read as before.
"""
from __future__ import annotations

import os
import threading

from ..errors import DataError
from . import memfiles
from .checksum import crc32

__all__ = ["file_identity", "verified", "verify_tile", "mark_written", "verified_count",
           "forget_verified"]

_VERIFIED: set[tuple] = set()
_LOCK = threading.Lock()
_LIMIT = 1 << 20  # remembered tiles before the set starts afresh (about 150 MB of keys at most)
HINT = ("the payload file was changed outside tensordb, or the disk corrupted it; CHECK "
        "DATABASE lists every damaged tile; drop or reload the tensor, or restore the database "
        "from a backup")


def file_identity(path: str, st: os.stat_result) -> tuple:
    """What names one file's contents for the verified set: a payload is immutable once
    committed, and a file rewritten in place gets a new modification time."""
    return (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def verified(ident: tuple | None, entry) -> bool:
    """Whether tile ``entry`` of the file ``ident`` needs no check: this process verified it, or
    it has no recorded checksum."""
    return entry.crc32 is None or (
        ident is not None and (ident, entry.offset, entry.nbytes, entry.crc32) in _VERIFIED)


def verify_tile(name: str, path: str, ident: tuple | None, entry, data,
                what: str = "payload file") -> None:
    """Check tile ``entry`` of tensor ``name`` (its bytes in ``data``: a buffer of exactly
    ``entry.nbytes`` bytes) against its recorded CRC-32, unless this process verified it
    already; a mismatch is a DataError naming the tensor, the tile and the file (``what``: or
    the object, objects.py)."""
    if entry.crc32 is None:
        return
    key = None if ident is None else (ident, entry.offset, entry.nbytes, entry.crc32)
    if key is not None and key in _VERIFIED:
        return
    got = crc32(data)
    if got != entry.crc32:
        raise DataError(f"tensor '{name}': tile {entry.coords} in its {what} {path} (bytes "
                        f"{entry.offset} to {entry.offset + entry.nbytes}) is damaged: its CRC-32 "
                        f"is {got:08x}, the catalog records {entry.crc32:08x}", hint=HINT)
    if key is not None:
        with _LOCK:
            if len(_VERIFIED) >= _LIMIT:
                _VERIFIED.clear()
            _VERIFIED.add(key)


def mark_written(path: str, entries) -> tuple | None:
    """Tiles this process has just written into ``path`` and committed: their checksums were
    taken from the very bytes written, so they count as verified here (a training step then
    does not checksum the weights it wrote on its next read); another process verifies them on
    its first read, and a later change of the file changes its identity. Returns that
    identity (None: the file could not be looked at)."""
    kept = memfiles.get(path)
    if kept is not None:  # bytes kept in this process as the payload, no file (memfiles.py)
        ident = kept[1]
    else:
        try:
            ident = file_identity(path, os.stat(path))
        except OSError:
            return None
    with _LOCK:
        if len(_VERIFIED) >= _LIMIT:
            _VERIFIED.clear()
        _VERIFIED.update((ident, e.offset, e.nbytes, e.crc32) for e in entries
                         if e.crc32 is not None)
    return ident


def verified_count() -> int:
    """Tiles this process has verified and remembers (for tests and benchmarks)."""
    return len(_VERIFIED)


def forget_verified() -> None:
    """Forget every verified tile: the next read of each is checked again (benchmarks)."""
    with _LOCK:
        _VERIFIED.clear()
