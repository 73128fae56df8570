"""Payloads kept as bytes in this process, not in files: a small output of an in-memory database.

An in-memory database's catalog names a payload file per version (``tiles/<version>-<id16>.bin``)
as on disk, but the payload of a small computed output (one that fits its staging buffer under
``StagingBuffers.min_bytes``, 1 MiB: a training step's weights and loss) is never written to that
file: the writer registers the very bytes the run computed here, read-only, under the file's path,
and every read of that path (a reader's mapping, ``to_numpy``, CHECK DATABASE, a reader pickled
to another process) takes them from here. The entry goes when its version is retired (the
commit that replaced or dropped it, or the rollback of the statement that wrote it: wherever a
payload file would be deleted, ``directory.remove_payload`` and ``directory.remove``) or when the
database closes (``forget_under``). A reader that holds the bytes keeps them alive after that
(a snapshot of another thread keeps reading its version), as a mapping keeps an unlinked file.

A leaf module: it imports nothing of tensordb, so the readers, the verifier and the directory
code can all ask it.
"""
from __future__ import annotations

import itertools
import sys
import threading

import numpy as np

__all__ = ["keep", "get", "forget", "forget_under", "held_bytes", "paths_under", "room",
           "take", "spare_bytes", "MAX_BYTES", "FILE_MAX", "SPARE_BYTES"]

# The most bytes one database (its tiles directory) keeps here; beyond it an output goes to a
# file as before. Payload files of an in-memory database were never the memory budget's, and a
# small output's bytes were already kept by its current version's reader; this bounds what a
# database of many small tensors holds outside the budget.
MAX_BYTES = 256 << 20

# The largest output kept here (reserved.py): a block-sparse product's 2 MiB output, in a
# recycled payload file, cost each statement its file's rename, open, mapping and unmapping
# (about 0.13 ms of a 3 ms statement, docs/benchmarks.md blk39); kept here, none of those.
# 16 MiB since spmv40b: the SpMM x64 (50,000 x 64 float32, 12.2 MiB) computed into a
# recycled file's mapping took 21 ms a statement, its 3,125 pages faulted in afresh each time,
# against 16 ms in a spare allocation here (scipy's own ``G @ X``: 12 ms).
FILE_MAX = 16 << 20
# A retired payload's allocation is kept for the next output of its size (``take``): a
# repeated statement computes into memory the process has touched already, not new pages. At
# most this many bytes of them a database, the oldest let go first.
SPARE_BYTES = 16 << 20

_FILES: dict[str, tuple[np.ndarray, tuple]] = {}  # path -> (bytes, identity)
_HELD: dict[str, int] = {}  # tiles directory -> bytes kept for it
_RAW: dict[str, np.ndarray] = {}  # path -> the allocation its bytes are (``keep``'s ``raw``)
_SPARES: dict[str, list[np.ndarray]] = {}  # tiles directory -> retired allocations, oldest first
_LOCK = threading.Lock()
_SERIAL = itertools.count(1)


def _directory(path: str) -> str:
    return path.rsplit("/", 1)[0]


def room(directory: str, nbytes: int) -> bool:
    """Whether ``nbytes`` more may be kept for the database whose tiles are in ``directory``."""
    return _HELD.get(directory, 0) + nbytes <= MAX_BYTES


def keep(path: str, data: np.ndarray, raw: np.ndarray | None = None) -> tuple:
    """Hold ``data`` (read-only bytes) as the payload at ``path``; returns its identity, under
    which its tiles count as verified (verify.py): unique in this process, so a later payload of
    the same name is another file. ``raw``: the allocation ``data`` views (the writer's own,
    from ``take`` or new), offered to ``take`` once the payload is let go."""
    ident = (path, "memory", next(_SERIAL), len(data))
    with _LOCK:
        old = _FILES.get(path)
        if old is not None:
            _HELD[_directory(path)] -= len(old[0])
        _FILES[path] = (data, ident)
        if raw is not None:
            _RAW[path] = raw
        else:
            _RAW.pop(path, None)
        d = _directory(path)
        _HELD[d] = _HELD.get(d, 0) + len(data)
    return ident


def get(path: str | None) -> tuple[np.ndarray, tuple] | None:
    """The bytes kept for ``path`` and their identity, or None (a file, or nothing)."""
    return _FILES.get(path) if _FILES else None


def forget(path: str) -> bool:
    """The payload at ``path`` is unreferenced: let its bytes go (a reader holding them keeps
    them). Whether there was one."""
    if not _FILES:
        return False
    with _LOCK:
        old = _FILES.pop(path, None)
        if old is None:
            return False
        d = _directory(path)
        left = _HELD.get(d, 0) - len(old[0])
        if left > 0:
            _HELD[d] = left
        else:
            _HELD.pop(d, None)
        raw = _RAW.pop(path, None)
        if raw is not None and raw.nbytes <= SPARE_BYTES:
            spares = _SPARES.setdefault(d, [])
            spares.append(raw)  # (a reader may hold it still: ``take`` looks)
            while sum(r.nbytes for r in spares) > SPARE_BYTES:
                del spares[0]
    return True


def take(path: str, nbytes: int) -> np.ndarray | None:
    """A writable allocation of exactly ``nbytes`` for a new payload at ``path``: one a
    payload of its database that was let go had (``forget``), if nothing refers to it any
    more (no reader, no tile, no view of it: its reference count says so, as the staging
    cache's does), else None."""
    if not _SPARES:
        return None
    with _LOCK:
        spares = _SPARES.get(_directory(path))
        for k in range(len(spares) if spares else 0):
            raw = spares[k]
            # references: the list's, ``raw``'s and getrefcount's argument: no view of it
            if raw.nbytes == nbytes and sys.getrefcount(raw) <= 3:
                del spares[k]
                return raw
    return None


def spare_bytes(directory: str) -> int:
    """Bytes of let-go allocations kept for ``take`` for the database whose tiles are in
    ``directory`` (tests)."""
    with _LOCK:
        return sum(r.nbytes for r in _SPARES.get(directory.rstrip("/"), ()))


def forget_under(directory: str) -> None:
    """A database whose tiles are in ``directory`` closed: every payload it kept goes."""
    prefix = directory.rstrip("/") + "/"
    with _LOCK:
        for path in [p for p in _FILES if p.startswith(prefix)]:
            del _FILES[path]
            _RAW.pop(path, None)
        _HELD.pop(directory.rstrip("/"), None)
        _SPARES.pop(directory.rstrip("/"), None)


def held_bytes(directory: str | None = None) -> int:
    """Bytes kept for the database with tiles in ``directory`` (None: all), for tests and
    CHECK."""
    with _LOCK:
        if directory is None:
            return sum(_HELD.values())
        return _HELD.get(directory.rstrip("/"), 0)


def paths_under(directory: str) -> list[str]:
    """The payloads kept for the database whose tiles are in ``directory``."""
    prefix = directory.rstrip("/") + "/"
    with _LOCK:
        return sorted(p for p in _FILES if p.startswith(prefix))
