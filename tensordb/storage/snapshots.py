"""Readers in other processes while one process writes: published catalog snapshots and leases.

DuckDB locks its file per process: while a writer has ``catalog.duckdb`` open, no other process
can open it, not even read-only. So the writer publishes what it committed, and a read-only
connection that finds the catalog held by a writer reads the newest published snapshot instead
(SQLite's WAL mode and TileDB give readers the same: the last committed version, never a half
one). Payload files are immutable, so a snapshot's rows are all a reader needs.

    <root>/snapshots/<seq>.tiles.parquet    the ``tiles`` rows of commit <seq>
    <root>/snapshots/<seq>.tensors.parquet  its ``tensors`` rows (written last: the snapshot's
                                            mark of completeness)
    <root>/readers/<id>.lock                a reader's lease, flock-ed while the reader lives
    <root>/readers/<id>.seq                 the snapshot it reads (absent: any of them)

The writer publishes snapshot ``seq + 1`` after every COMMIT, before it deletes the payload
files that COMMIT retired. A file retired by snapshot ``r`` is still named by the snapshots
before ``r``: it is deleted (never reused as a spare) only once every live lease reads ``r`` or
later; until then it is deferred. A lease appears (under its final name, already locked) before
its reader lists the snapshots, and pins every snapshot until it names one: so a reader either
is seen by the writer's check, or finds the snapshot published before it. A lease whose lock
can be taken belongs to a dead process and is removed. A writer that opens the database keeps,
besides what its catalog references, every payload file a pinned snapshot names
(``pinned_files``): no file a reader may still read is deleted.

A reader picks up newer snapshots at the start of each call on its connection (``Turns``).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import uuid

from ._duck import quote_str
from .catalog import SCHEMA
from .directory import remove_payload

__all__ = ["SNAPSHOTS_DIR", "READERS_DIR", "newest", "Publisher", "Lease", "load", "pinned_files",
           "live_pins", "Turns"]

SNAPSHOTS_DIR = "snapshots"
READERS_DIR = "readers"
_SNAP = re.compile(r"(\d+)\.tensors\.parquet\Z")
_TABLES = ("tiles", "tensors")  # written in this order: tensors last marks a snapshot complete


def _path(root, seq: int, table: str) -> str:
    return os.path.join(root, SNAPSHOTS_DIR, f"{seq}.{table}.parquet")


def published(root) -> list[int]:
    """The complete snapshots' numbers, oldest first."""
    try:
        names = os.listdir(os.path.join(root, SNAPSHOTS_DIR))
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_SNAP.match, names) if m)


def newest(root) -> int | None:
    seqs = published(root)
    return seqs[-1] if seqs else None


# -- leases ------------------------------------------------------------------------------------
def live_pins(root) -> list[int]:
    """The snapshot each live reader reads (0 for a reader that has not named one yet: it pins
    them all); dead readers' leases are removed on the way."""
    where = os.path.join(root, READERS_DIR)
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return []
    pins = []
    for name in names:
        if not name.endswith(".lock"):
            continue
        lock = os.path.join(where, name)
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: the reader lives
                pins.append(_read_pin(lock[:-len(".lock")] + ".seq"))
                continue
            for path in (lock[:-len(".lock")] + ".seq", lock):  # its process is gone
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        finally:
            os.close(fd)
    return pins


def _read_pin(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):  # not named yet (or being renamed into place): pins all
        return 0


class Lease:
    """A reader's lease: its lock file, flock-ed for as long as the reader lives."""

    def __init__(self, root) -> None:
        where = os.path.join(root, READERS_DIR)
        os.makedirs(where, exist_ok=True)
        self.base = os.path.join(where, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
        tmp = self.base + ".new"
        self.fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        os.rename(tmp, self.base + ".lock")  # visible only once locked: never taken for dead

    def pin(self, seq: int) -> None:
        tmp = self.base + ".seq.new"
        with open(tmp, "w") as f:
            f.write(str(seq))
        os.replace(tmp, self.base + ".seq")

    def close(self) -> None:
        if self.fd is None:
            return
        for suffix in (".seq", ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.base + suffix)
        os.close(self.fd)
        self.fd = None


def pinned_files(root, duck) -> set[str] | None:
    """The payload files named by the snapshots live readers read; None when that cannot be
    told (a reader has not named its snapshot yet, or names one no longer there): then every
    file must be kept."""
    pins = set(live_pins(root))
    if not pins:
        return set()
    if 0 in pins:
        return None
    files: set[str] = set()
    for seq in pins:
        path = _path(root, seq, "tiles")
        try:
            files.update(r[0] for r in duck.execute(
                f"SELECT DISTINCT file FROM read_parquet({quote_str(path)})").fetchall())
        except Exception:  # noqa: BLE001 - gone or unreadable: nothing proves a file unneeded
            return None
    return files


# -- the reader's side -------------------------------------------------------------------------
def load(duck, root, seq: int, database: str | None) -> None:
    """Make ``duck`` (an in-memory DuckDB) hold snapshot ``seq``'s catalog tables;
    FileNotFoundError when the writer has removed it meanwhile (take the newest again)."""
    paths = {t: _path(root, seq, t) for t in _TABLES}
    for p in paths.values():
        if not os.path.exists(p):
            raise FileNotFoundError(p)
    duck.execute("BEGIN TRANSACTION")
    try:
        duck.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        for table, path in paths.items():
            duck.execute(f"CREATE OR REPLACE TABLE {SCHEMA}.{table} AS "
                         f"SELECT * FROM read_parquet({quote_str(path)})")
        duck.execute(f"CREATE OR REPLACE TABLE {SCHEMA}.identity AS SELECT ?::VARCHAR AS id, "
                     "current_localtimestamp() AS created", [database])
        duck.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(Exception):
            duck.execute("ROLLBACK")
        raise


def load_newest(duck, root, database: str | None, lease: Lease, after: int = 0) -> int | None:
    """Load the newest snapshot newer than ``after`` into ``duck`` and pin it; its number, or
    None when there is none newer."""
    for _ in range(20):  # the writer may remove a superseded snapshot between list and read
        seq = newest(root)
        if seq is None or seq <= after:
            return None
        try:
            load(duck, root, seq, database)
        except FileNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 - a file vanished under DuckDB's read
            if "No files found" in str(exc) or "No such file" in str(exc):
                continue
            raise
        lease.pin(seq)
        return seq
    return None


class Turns:
    """A connection's call lock (calls.py) that, on a call's first entry, runs ``refresh``:
    a snapshot reader then sees the newest published commit at the start of each call."""

    def __init__(self, refresh) -> None:
        self._lock = threading.RLock()
        self._depth = threading.local()
        self.refresh = refresh

    def __enter__(self):
        self._lock.acquire()
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth == 0 and self.refresh is not None:
            try:
                self.refresh()
            except BaseException:
                self._depth.n = 0
                self._lock.release()
                raise
        return self

    def __exit__(self, *exc) -> None:
        self._depth.n -= 1
        self._lock.release()

    def acquire(self, *args, **kwargs):
        return self._lock.acquire(*args, **kwargs)

    def release(self) -> None:
        self._lock.release()


# -- the writer's side -------------------------------------------------------------------------
class Publisher:
    """The writer's snapshots and the payload files retired while readers may still read them."""

    def __init__(self, root) -> None:
        self.root = root
        os.makedirs(os.path.join(root, SNAPSHOTS_DIR), exist_ok=True)
        self.seq = newest(root) or 0
        self.deferred: list[tuple[str, int]] = []  # (payload path, first snapshot without it)
        self.failed = False  # the last publish failed: the next one still owes the readers
        self.owed = False  # a commit of the user's own transaction came after the last one

    def publish(self, duck) -> int:
        """Write snapshot ``seq + 1`` of the committed catalog; remove the snapshots no live
        reader pins (the newest stays)."""
        seq = self.seq + 1
        try:
            for table in _TABLES:
                path = _path(self.root, seq, table)
                duck.execute(f"COPY (SELECT * FROM {SCHEMA}.{table}) TO "
                             f"{quote_str(path + '.new')} (FORMAT parquet)")
            for table in _TABLES:
                path = _path(self.root, seq, table)
                os.replace(path + ".new", path)
        except BaseException:
            self.failed = True
            raise
        self.seq, self.failed, self.owed = seq, False, False
        self._prune(live_pins(self.root))
        return seq

    def current(self, duck) -> bool:
        """Whether the newest snapshot holds what the catalog holds (a writer that opens
        publishes only when not): every commit adds a version or removes a tensor row, so the
        rows' count, newest version and sum of versions tell."""
        if not self.seq:
            return False
        sql = "SELECT count(*), max(version), sum(version) FROM {}"
        try:
            snap = duck.execute(sql.format(
                f"read_parquet({quote_str(_path(self.root, self.seq, 'tensors'))})")).fetchall()
        except Exception:  # noqa: BLE001 - unreadable: publish anew
            return False
        return snap == duck.execute(sql.format(f"{SCHEMA}.tensors")).fetchall()

    def _prune(self, pins: list[int]) -> None:
        if pins and min(pins) == 0:
            return  # a reader choosing its snapshot: it may take any
        for seq in published(self.root):
            if seq < self.seq and seq not in pins:
                for table in ("tensors", "tiles"):  # the mark first: never a half snapshot
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(_path(self.root, seq, table))

    def retire(self, path: str, keep: bool, spares) -> None:
        """``path`` left the catalog in the commit just published: delete it (or keep it as a
        spare) now when no reader reads an older snapshot, else once none does."""
        first = self.seq + 1 if self.failed else self.seq
        pins = live_pins(self.root)
        if self.failed or (pins and min(pins) < first):  # unpublished: the newest names it
            self.deferred.append((path, first))
            return
        spares.retire(path, keep=keep)

    def collect(self) -> None:
        """Delete the deferred files no live reader may read any more."""
        if not self.deferred or self.failed:
            return
        pins = live_pins(self.root)
        low = min(pins) if pins else None
        keep = []
        for path, first in self.deferred:
            if low is None or low >= first:
                remove_payload(path)
            else:
                keep.append((path, first))
        self.deferred = keep
