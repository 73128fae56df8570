"""Payload files as readers open them, and who in this process uses them: ``open_payload`` (a
descriptor checked to be a regular file that holds every tile, else an error naming the tensor and
the file), the live mappings and reads under way of each file (``track_mapping``,
``payload_in_use``), the shared flock another process's mapping holds (``_hold_shared``), and the
rename that recycles a file nobody uses (``rename_unused``, spares.py). reader.py re-exports them.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import stat
import threading
import weakref
from collections import Counter

from ..errors import DataError, Error, OperationalError

__all__ = ["open_payload", "file_kind", "track_mapping", "payload_in_use", "rename_unused",
           "rename_private"]

# Who in this process may still read a payload file: its live mappings (a mapping stays alive
# while any array made from it does) and its reads under way. Another process's readers hold a
# shared flock on the file for as long as their mapping lives (``_hold_shared``). A retired file
# that nobody uses, here or there, may be recycled for a new payload (spares.py).
_USERS_LOCK = threading.Lock()
_MAPPINGS: dict[str, weakref.WeakSet] = {}
_READING: Counter = Counter()
_SWEEP_AT = 1024  # paths tracked before those with no live mapping are forgotten


def track_mapping(path: str, mapping: mmap.mmap) -> None:
    """Note that ``mapping`` (alive while anything uses its memory) maps payload ``path``."""
    with _USERS_LOCK:
        if len(_MAPPINGS) >= _SWEEP_AT and path not in _MAPPINGS:
            # paths whose mappings are all gone (a version read once, then dropped): forget them
            for p in [p for p, maps in _MAPPINGS.items() if not len(maps)]:
                del _MAPPINGS[p]
        _MAPPINGS.setdefault(path, weakref.WeakSet()).add(mapping)

def payload_in_use(path: str) -> bool:
    """Whether anything in this process may still read payload ``path``: a live mapping of it
    (a reader's, a writer's, or one kept alive by an array made from it) or a read under way."""
    with _USERS_LOCK:
        return _in_use(path)

def _in_use(path: str) -> bool:
    maps = _MAPPINGS.get(path)
    if maps is not None and not len(maps):
        del _MAPPINGS[path]
        maps = None
    return maps is not None or _READING.get(path, 0) > 0

def rename_unused(path: str, new_path: str) -> bool:
    """Give the file ``path`` the name ``new_path`` (which must not exist) if nothing uses it;
    False (nothing done) otherwise. In this process a read of ``path`` counts itself before it
    opens the file, under the lock held here: one that starts later finds no file by that name.
    Another process's mapping holds a shared flock on the file: the exclusive one taken here
    fails while it lives, and a reader there that opened the file just before the rename finds
    that its name is gone once it has its lock (``_hold_shared``). Where the file system has no
    flock nobody can be ruled out, and the file is not reused."""
    with _USERS_LOCK:
        if _in_use(path):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by another process's mapping, or no flock here
                return False
            os.link(path, new_path)  # not rename: an existing new_path is an error, never replaced
            try:
                os.unlink(path)
            except OSError:
                os.unlink(new_path)
                raise
            return True
        finally:
            os.close(fd)  # and with it the lock

def rename_private(path: str, new_path: str) -> bool:
    """``rename_unused`` for a file no other process can map (an in-memory database's payload:
    its directory is this process's own, and a store that shares its files with worker
    processes recycles none): the in-process check alone, then one ``rename``, without the
    exclusive flock and the link and unlink that guard against another process's mapping (3
    system calls an output of a training step fewer). ``new_path`` must not exist (a new
    version's name): FileExistsError, nothing renamed, where it does."""
    with _USERS_LOCK:
        if _in_use(path):
            return False
        if os.path.lexists(new_path):
            raise FileExistsError(new_path)
        os.rename(path, new_path)
        return True


def _hold_shared(fd: int, path: str, name: str) -> None:
    """Take a shared flock on the open payload ``fd``: the mapping made from it keeps a copy of
    the descriptor, and so the lock, for as long as it lives, which keeps a store in another
    process from recycling the file under it (``rename_unused``). Then check that ``path``
    still names the file opened: a recycle between the open and the lock renamed it, and its
    bytes are about to be another version's."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:  # no flock on this file system: such files are never recycled
        return
    opened = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
        raise OperationalError(f"the payload file {path} of tensor '{name}' was reused for a newer "
                               "version while it was being opened",
                               hint="read the tensor again: another connection replaced this "
                                    "version")

def _done_reading(path: str) -> None:
    with _USERS_LOCK:
        _READING[path] -= 1
        if _READING[path] <= 0:
            del _READING[path]

_CHECK_HINT = "the file was changed outside tensordb; CHECK DATABASE lists every damaged tile"

def file_kind(mode: int) -> str:
    """'a directory', 'a FIFO', ... for a file that is not a regular file."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "a special file"

def open_payload(name: str, path: str | None, entries) -> int:
    """A read-only descriptor of tensor ``name``'s payload file, checked to be a regular file that
    holds every tile in ``entries``; else an OperationalError (missing, unreadable, not a regular
    file) or a DataError (too short), naming the tensor and the file. The caller closes it."""
    if path is None:
        raise DataError(f"tensor '{name}' has tiles but no payload file in the catalog")
    try:
        # O_NONBLOCK: a FIFO put where the file was must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise OperationalError(f"the payload file {path} of tensor '{name}' is missing",
                               hint="the tensor was replaced or dropped since it was opened, or "
                                    "the file was deleted outside tensordb; CHECK DATABASE "
                                    "lists every damaged tile") from None
    except OSError as exc:
        raise OperationalError(f"cannot open the payload file {path} of tensor '{name}': "
                               f"{_reason(exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OperationalError(f"the payload file {path} of tensor '{name}' is "
                                   f"{file_kind(st.st_mode)}, not a regular file", hint=_CHECK_HINT)
        short = min((e for e in entries if e.offset + e.nbytes > st.st_size),
                    key=lambda e: e.offset, default=None)
        if short is not None:
            raise DataError(f"the payload file {path} of tensor '{name}' is truncated: it has "
                            f"{st.st_size} bytes, tile {short.coords} needs bytes "
                            f"{short.offset} to {short.offset + short.nbytes}", hint=_CHECK_HINT)
    except Error:
        os.close(fd)
        raise
    except OSError as exc:
        os.close(fd)
        raise OperationalError(f"cannot read the payload file {path} of tensor '{name}': "
                               f"{_reason(exc)}") from None
    return fd

def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
