"""The database directory: what is checked before a database is opened, one writer per database
(in this process here, across processes through DuckDB's lock on the catalog), and the sweep of
payload files the catalog proves unreferenced when it is opened for writing.

    <root>/catalog.duckdb   the catalog (and the user's own tables)
    <root>/database.id      the database's id (identity.py), for workers that read payloads
    <root>/tiles/<v>-<id>.bin   one payload file per tensor version (<v>.bin before ids)
    <root>/snapshots/, readers/ catalog snapshots for readers in other processes, and their
                                leases (snapshots.py)
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import stat
import threading
import time
import weakref
from pathlib import Path

import duckdb

from ..errors import OperationalError
from . import background, catalog, memfiles
from ._duck import translate, translating

__all__ = ["CATALOG_FILE", "TILES_DIR", "check_root", "check_catalog", "claim", "release",
           "connect", "sweep", "unreferenced", "remove", "remove_payload", "MEMBER_PREFIX",
           "remove_leftover_members"]

CATALOG_FILE = "catalog.duckdb"
TILES_DIR = "tiles"
_PAYLOAD = re.compile(r"(\d+)(?:-[0-9a-f]{16})?\.bin\Z")  # <version>[-<database id>].bin

# Writable stores open in this process, by root: DuckDB lets one process open a file twice, but
# two writers would hand out the same versions and delete each other's files in flight.
_OPEN: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()
_OPEN_LOCK = threading.Lock()


def check_root(root: Path, read_only: bool) -> None:
    """Create ``root`` when it is new (and not ``read_only``); refuse a file, a directory that
    is not a database, and a database whose catalog is missing while payloads are there."""
    if root.exists() and not root.is_dir():
        raise OperationalError(f"cannot open database {root}: it is a file, not a database "
                               "directory", hint="a tensordb database is a directory holding "
                               f"{CATALOG_FILE} and {TILES_DIR}/")
    if not root.exists():
        if read_only:
            raise OperationalError(f"cannot open database {root} read-only: it does not exist")
        try:
            root.mkdir(parents=True)
        except OSError as exc:
            raise OperationalError(f"cannot create database {root}: {exc.strerror}") from None
        return
    if (root / CATALOG_FILE).exists():
        return
    tiles = root / TILES_DIR
    payloads = sorted(os.listdir(tiles)) if tiles.is_dir() else []
    if payloads or (root / (CATALOG_FILE + ".wal")).exists():
        # Without its catalog nothing proves a payload unreferenced: never start afresh here.
        raise OperationalError(
            f"cannot open database {root}: its catalog {root / CATALOG_FILE} is missing, but "
            f"{TILES_DIR}/ holds {len(payloads)} payload file(s)" if payloads else
            f"cannot open database {root}: its catalog {root / CATALOG_FILE} is missing, but "
            f"its write-ahead log {CATALOG_FILE}.wal is there",
            hint=f"restore {CATALOG_FILE} from a backup; nothing was changed or deleted")
    stray = {p.name for p in root.iterdir()} - {CATALOG_FILE + ".wal", TILES_DIR}
    if stray:
        raise OperationalError(f"cannot open database {root}: the directory is not empty and "
                               f"holds no {CATALOG_FILE}",
                               hint="choose a new or empty directory for a new database")


def check_catalog(duck, root: Path, tiles_dir: str) -> None:
    """Refuse a catalog file without the tensordb tables (replaced, or emptied) while payload
    files exist: creating fresh tables would make every payload look like an orphan."""
    if catalog.exists(duck) or not os.path.isdir(tiles_dir):
        return
    payloads = os.listdir(tiles_dir)
    if payloads:
        raise OperationalError(
            f"cannot open database {root}: {root / CATALOG_FILE} holds no tensordb "
            f"catalog, but {TILES_DIR}/ holds {len(payloads)} payload file(s)",
            hint=f"restore the database's own {CATALOG_FILE}; nothing was changed or deleted")


def claim(store) -> None:
    """Register ``store`` as this process's writer of its root (readers may share it)."""
    key = str(store.root.resolve())
    with _OPEN_LOCK:
        other = _OPEN.get(key)
        if other is not None and not other.closed:
            gc.collect()  # an unreachable connection may still be waiting for collection
            other = _OPEN.get(key)
        if other is not None and not other.closed and not (other.read_only and store.read_only):
            raise OperationalError(
                f"database {store.root} is already open in this process",
                hint="close the other connection first (one writer per database)")
        if not store.read_only:
            _OPEN[key] = store


def release(store) -> None:
    with _OPEN_LOCK:
        key = str(store.root.resolve())
        if _OPEN.get(key) is store:
            del _OPEN[key]


# How long an open for writing waits while another process holds the catalog read-only: a
# tensordb reader holds it only while it reads the catalog (readview.py), milliseconds.
READER_GRACE = 5.0


def connect(target: str, root: Path, read_only: bool):
    """A DuckDB connection to ``target``; a lock held by another process is an
    OperationalError saying whether it reads or writes. An open for writing waits up to
    ``READER_GRACE`` seconds for a reader's brief read of the catalog to end."""
    deadline = time.monotonic() + READER_GRACE
    while True:
        try:
            return _connect(target, root, read_only)
        except OperationalError as exc:
            if read_only or not getattr(exc, "reader", False) or time.monotonic() > deadline:
                raise
            time.sleep(0.002)


def writer_holds(path: str) -> bool:
    """Whether the kernel's lock table shows a process holding ``path`` for writing (False
    where it cannot tell: then an open tries)."""
    return _holder_mode(path, None) == "open for writing"


def _connect(target: str, root: Path, read_only: bool):
    try:
        return duckdb.connect(target, read_only=read_only)
    except duckdb.IOException as exc:
        text = str(exc)
        if "lock" in text.lower():
            pid = re.search(r"PID (\d+)", text)
            who = f"process {pid.group(1)}" if pid else "another process"
            mode = _holder_mode(target, pid.group(1) if pid else None)
            # a reader, or a lock already gone (or a kernel that cannot tell): worth a retry
            reader = mode != "open for writing"
            if mode is None:  # only a writer keeps a reader out; a writer is kept out by any
                mode = "open for writing" if read_only else "open"
            hint = "a database has one writer at a time; close the other connection " \
                "(readers may open it read_only=True beside the writer)"
            if mode == "open read-only":  # held past READER_GRACE: not a tensordb reader
                hint = f"another program holds {CATALOG_FILE} read-only (DuckDB itself, or a " \
                    "tensordb from before readers stopped locking it); close it, or open this " \
                    "one read_only=True (tensordb's readers never keep a writer out)"
            error = OperationalError(f"database {root} is locked: {who} has it {mode}",
                                     hint=hint)
            error.locked = True  # a read-only open then reads published snapshots (store.py)
            error.reader = reader
            raise error from None
        if "not a valid DuckDB database" in text:
            raise OperationalError(f"cannot open database {root}: {CATALOG_FILE} is not a "
                                   "DuckDB database file") from None
        raise translate(exc, f"cannot open database {root}") from None
    except duckdb.Error as exc:
        raise translate(exc, f"cannot open database {root}") from None


def sweep(duck, tiles_dir: str, read_only: bool,
          pinned: tuple[set[str], set[int]] | None = (frozenset(), frozenset())) -> int:
    """Delete unreferenced payload files (crash leftovers) and return the next version.
    ``pinned``: the file names and versions that readers in other processes may read, kept
    too (None: keep all; snapshots.pinned_files).

    A file goes only when the catalog, read without error, proves it unreferenced: no tile
    row names it and no tensor row has its version (so a damaged tiles table cannot make a
    live tensor's payload look orphaned). Directories are never ours: they stay."""
    with translating("cannot read the catalog"):
        newest = catalog.max_version(duck)
        keep = catalog.referenced_files(duck) if not read_only else set()
        live = catalog.versions(duck) if not read_only else set()
    if not os.path.isdir(tiles_dir):
        return newest + 1  # read-only, before any tensor was written
    for entry in os.scandir(tiles_dir):
        m = _PAYLOAD.match(entry.name)
        if m:
            newest = max(newest, int(m.group(1)))
        if read_only or pinned is None or _referenced(entry.name, keep, live) \
                or _referenced(entry.name, *pinned):
            continue
        if entry.is_dir(follow_symlinks=False):
            continue
        remove(entry.path)
    return newest + 1


def _referenced(name: str, files: set[str], versions: set[int]) -> bool:
    """Whether the catalog may still need payload file ``name``: a tile row names it, or a
    tensor row has its version."""
    m = _PAYLOAD.match(name)
    return name in files or bool(m and int(m.group(1)) in versions)


def unreferenced(duck, paths) -> list[str]:
    """Those of ``paths`` that the catalog proves unreferenced (see ``sweep``); a catalog that
    cannot be read proves nothing (duckdb.Error)."""
    files, versions = catalog.referenced_files(duck), catalog.versions(duck)
    return [p for p in paths if not _referenced(os.path.basename(p), files, versions)]


def _holder_mode(path: str, pid: str | None) -> str | None:
    """How the process holding ``path``'s lock has it open, from the kernel's lock table: DuckDB
    takes a shared (READ) lock for a read-only connection, an exclusive (WRITE) one otherwise.
    None where the table cannot tell (not Linux, or the lock is gone)."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            table = f.read().splitlines()
    except OSError:
        return None
    inode = f":{st.st_ino}"
    for line in table:
        parts = line.split()
        # "1: POSIX  ADVISORY  READ 25007 fe:00:2148220 0 EOF"
        if len(parts) >= 6 and parts[5].endswith(inode) and (pid is None or parts[4] == pid):
            if parts[3] == "READ":
                return "open read-only"
            if parts[3] == "WRITE":
                return "open for writing"
    return None


def remove_payload(path: str) -> None:
    """Delete a payload file the catalog no longer references: its name goes now (a listing no
    longer shows it), its blocks are freed on a helper thread. Freeing a large file's extents
    takes the file system milliseconds (32 ms for 64 MiB here), which happens at the last
    close: the file is held open across the unlink and closed there."""
    if memfiles.forget(path):  # kept in this process, never a file (memfiles.py)
        return
    try:  # O_NONBLOCK: a FIFO put in the file's place must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    except OSError:  # a symbolic link, or no permission to read: its name goes all the same
        _unlink(path)
        return
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # not a file we wrote (damage): a name
        os.close(fd)  # such as a FIFO's goes, a directory is left to whoever put it there
        _unlink(path)
        return
    try:
        _unlink(path)
    finally:
        if background.submit(os.close, fd) is None:
            os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:  # a directory, a read-only file system: nothing to do but leave it
        pass


def remove(path: str) -> None:
    if memfiles.forget(path):  # a payload kept in this process (memfiles.py)
        return
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


# A compressed .npz member a load inflates into the database root (formats/npzfile.py); the file
# goes when its load ends, unless the process is killed first.
MEMBER_PREFIX = ".npz-member-"


def remove_leftover_members(scratch) -> None:
    """Remove the inflated members that a killed load left in ``scratch`` (a database's root:
    the file goes when its load ends, unless the process is killed first)."""
    try:
        entries = list(os.scandir(str(scratch)))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(MEMBER_PREFIX) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
