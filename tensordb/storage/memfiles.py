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
import threading

import numpy as np

__all__ = ["keep", "get", "forget", "forget_under", "held_bytes", "paths_under", "room",
           "MAX_BYTES"]

# The most bytes one database (its tiles directory) keeps here; beyond it an output goes to a
# file as before. Payload files of an in-memory database were never the memory budget's, and a
# small output's bytes were already kept by its current version's reader; this bounds what a
# database of many small tensors holds outside the budget.
MAX_BYTES = 256 << 20

_FILES: dict[str, tuple[np.ndarray, tuple]] = {}  # path -> (bytes, identity)
_HELD: dict[str, int] = {}  # tiles directory -> bytes kept for it
_LOCK = threading.Lock()
_SERIAL = itertools.count(1)


def _directory(path: str) -> str:
    return path.rsplit("/", 1)[0]


def room(directory: str, nbytes: int) -> bool:
    """Whether ``nbytes`` more may be kept for the database whose tiles are in ``directory``."""
    return _HELD.get(directory, 0) + nbytes <= MAX_BYTES


def keep(path: str, data: np.ndarray) -> tuple:
    """Hold ``data`` (read-only bytes) as the payload at ``path``; returns its identity, under
    which its tiles count as verified (verify.py): unique in this process, so a later payload of
    the same name is another file."""
    ident = (path, "memory", next(_SERIAL), len(data))
    with _LOCK:
        old = _FILES.get(path)
        if old is not None:
            _HELD[_directory(path)] -= len(old[0])
        _FILES[path] = (data, ident)
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
    return True


def forget_under(directory: str) -> None:
    """A database whose tiles are in ``directory`` closed: every payload it kept goes."""
    prefix = directory.rstrip("/") + "/"
    with _LOCK:
        for path in [p for p in _FILES if p.startswith(prefix)]:
            del _FILES[path]
        _HELD.pop(directory.rstrip("/"), None)


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
