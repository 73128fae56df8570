"""Readers in other processes while one process writes: published catalog snapshots and leases.

DuckDB locks its file per process: while a writer has ``catalog.duckdb`` open, no other process
can open it, not even read-only. So the writer publishes what it committed, and a read-only
connection that finds the catalog held by a writer reads a published snapshot instead (SQLite's
WAL mode and TileDB give readers the same: the last committed version, never a half one).
Payload files are immutable, so a snapshot's rows are all a reader needs.

    <root>/snapshots/<n>.tiles.arrow     the ``tiles`` rows as of commit <n> (Arrow IPC)
    <root>/snapshots/<n>.tensors.arrow   its ``tensors`` rows (written last: the mark that
                                         the snapshot is complete)
    <root>/readers/<id>.lock             a reader's lease, flock-ed while the reader lives
    <root>/readers/<id>.ack              the writer's answer: a snapshot holding every commit
                                         made before it saw the lease
    <root>/readers/<id>.seq              the snapshot the reader reads (absent: any of them)

The writer's thread (``Publisher``) publishes only while some reader lives. A new reader's
lease appears already locked; the thread, having listed it, publishes the newest commit when
snapshots lag and answers with that snapshot's number, which the reader waits for
(``readview.open_reader``). So a commit either came before the thread listed the lease (and is
in the snapshot the reader gets) or after the lease appeared (and sees it). A file a commit
retires is still named by the snapshots before that commit: it is deleted (never recycled as a
spare) only once every live lease reads a later snapshot; until then it is deferred. A lease
pins every snapshot until its reader names one; a lease whose lock can be taken belongs to a
dead process and is removed. A writer that opens the database keeps, besides what its catalog references,
every payload file a pinned snapshot names (``pinned_files``): no file a reader may still read
is deleted.

The reader's side is readview.py: a reader picks up newer snapshots at the start of each call
on its connection (``readview.Turns``), and with no writer open reads the catalog itself.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import time
import uuid
import weakref

import pyarrow as pa
import pyarrow.ipc as ipc

from .catalog import SCHEMA
from .directory import remove_payload

__all__ = ["SNAPSHOTS_DIR", "READERS_DIR", "newest", "Publisher", "Lease", "pinned_files",
           "live_pins", "snapshot_path", "read_arrow"]

SNAPSHOTS_DIR = "snapshots"
READERS_DIR = "readers"
_SNAP = re.compile(r"(\d+)\.tensors\.arrow\Z")
_TABLES = ("tiles", "tensors")
# (written in this order: tensors last marks a snapshot complete)


def _path(root, seq: int, table: str) -> str:
    return os.path.join(root, SNAPSHOTS_DIR, f"{seq}.{table}.arrow")


def _write(path: str, table) -> None:
    """An Arrow IPC file (a third of what Parquet costs for the catalog's list columns)."""
    with pa.OSFile(path, "wb") as f, ipc.new_file(f, table.schema) as w:
        w.write_table(table)


def _read(path: str):
    with pa.memory_map(path) as f:
        return ipc.open_file(f).read_all()


snapshot_path, read_arrow = _path, _read  # for the reader's side (readview.py)


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
    locks = {n[:-len(".lock")] for n in names if n.endswith(".lock")}
    for name in names:  # what a reader that closed or died left beside its lease
        base, _, suffix = name.partition(".")
        if base not in locks and suffix in ("seq", "ack", "seq.new", "ack.new", "files.arrow",
                                            "files.arrow.new"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(where, name))
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
            base = lock[:-len(".lock")]
            for path in (base + ".seq", base + ".ack", base + ".files.arrow", lock):  # gone
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        finally:
            os.close(fd)
    return pins


def _read_pin(path: str) -> int:
    return _read_pin_text(path)[0]


def _read_pin_text(path: str) -> tuple[int, bool]:
    """The pin (0: not named yet, or being renamed into place: pins all) and whether it names
    the reader's own copy of the catalog (``<id>.files.arrow``) rather than a snapshot."""
    try:
        with open(path) as f:
            words = f.read().split()
        return int(words[0]), words[1:] == ["own"]
    except (OSError, ValueError, IndexError):
        return 0, False


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

    def acknowledged(self) -> int | None:
        """The snapshot the writer named when it saw this lease (``<id>.ack``): it holds every
        commit made before then; None until the writer has seen it."""
        try:
            with open(self.base + ".ack") as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def pin(self, seq: int) -> None:
        """Read published snapshot ``seq`` (its own copy's files, if any, go after)."""
        _write_text(self.base + ".seq", str(seq))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.base + ".files.arrow")

    def pin_own(self, seq: int, tables) -> None:
        """Read the catalog as read from ``catalog.duckdb`` itself (readview.py): the payload
        files its rows name (``tiles.file``, and the dense payloads by ``tensors.version``)
        are written beside the lease first, then the pin, so a writer that reads the pin finds
        them; ``seq`` (the newest snapshot then, or 1) orders it before every commit of a
        writer that opens later."""
        files = tables["tiles"].column("file").unique().to_pylist()
        versions = tables["tensors"].column("version").to_pylist()
        named = pa.table({"file": pa.array(files + [None] * len(versions), pa.string()),
                          "version": pa.array([None] * len(files) + versions, pa.int64())})
        _write(self.base + ".files.arrow.new", named)
        os.replace(self.base + ".files.arrow.new", self.base + ".files.arrow")
        _write_text(self.base + ".seq", f"{seq} own")

    def close(self) -> None:
        if self.fd is None:
            return
        for suffix in (".seq", ".ack", ".files.arrow", ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.base + suffix)
        os.close(self.fd)
        self.fd = None


def pinned_files(root, duck) -> tuple[set[str], set[int]] | None:
    """The payload files named by what live readers read (a published snapshot, or their own
    copy of the catalog): the tiles' file names and the tensors' versions (a dense payload is
    named by its version, directory.sweep); None when that cannot be told (a reader has not
    named its snapshot yet, or names one no longer there): then every file must be kept."""
    live_pins(root)  # dead readers' leases go first
    files: set[str] = set()
    versions: set[int] = set()
    for base in _leases(root):
        seq, own = _read_pin_text(base + ".seq")
        if not seq:
            if os.path.exists(base + ".lock"):
                return None
            continue  # closed meanwhile
        try:
            if own:
                named = _read(base + ".files.arrow")
                tiles, tensors = named, named
            else:
                tiles = _read(_path(root, seq, "tiles"))
                tensors = _read(_path(root, seq, "tensors"))
            files.update(f for f in tiles.column("file").unique().to_pylist() if f is not None)
            versions.update(v for v in tensors.column("version").to_pylist() if v is not None)
        except Exception:  # noqa: BLE001 - gone or unreadable: nothing proves a file unneeded
            if os.path.exists(base + ".lock"):
                return None
    return files, versions


# -- the writer's side -------------------------------------------------------------------------
POLL = 0.05  # how often the publisher looks for readers while commits wait unpublished
MIN_INTERVAL = 0.02  # at most one snapshot per this many seconds under a stream of commits


def readers_present(root) -> bool:
    return bool(_leases(root))


def _leases(root) -> list[str]:
    """The leases' paths, without their ``.lock``."""
    where = os.path.join(root, READERS_DIR)
    try:
        return [os.path.join(where, n[:-len(".lock")]) for n in os.listdir(where)
                if n.endswith(".lock")]
    except FileNotFoundError:
        return []


def _write_text(path: str, text: str) -> None:
    with open(path + ".new", "w") as f:
        f.write(text)
    os.replace(path + ".new", path)


class Publisher:
    """The writer's snapshots, published by a thread of its own off the statements' path, and
    the payload files retired while readers may still read them.

    A commit costs the writer a look at the readers' leases (``committed``, ``retire``: a
    directory listing); the thread publishes the catalog as of the newest commit while some
    reader lives, at most every ``MIN_INTERVAL`` (commits in between share one snapshot), and
    with none, never. It looks for new leases every ``POLL`` seconds and answers each with the
    snapshot of the newest commit, published first when needed (``<id>.ack``): a reader waits
    for that answer (``readview.open_reader``), so a file a commit retired before the reader
    came (and recycled at once) is in no snapshot it reads; a commit after the lease appeared
    sees it."""

    def __init__(self, root, duck, store_lock) -> None:
        self.root = root
        os.makedirs(os.path.join(root, SNAPSHOTS_DIR), exist_ok=True)
        os.makedirs(os.path.join(root, READERS_DIR), exist_ok=True)  # a reader then adds none
        self.seq = newest(root) or 0  # the newest snapshot published
        self.counter = self.seq  # the newest commit's number
        self.dirty = False  # commits since the newest snapshot
        self.deferred: list[tuple[str, int]] = []  # (payload path, first commit without it)
        self._duck, self._store_lock = duck, store_lock
        self._lock = threading.Lock()  # deferred, seq
        self._wake = threading.Event()
        self._stop = False
        self._cursor = None
        self._thread: threading.Thread | None = None
        # called with the publisher's cursor, under the store's lock, before the catalog is
        # read: a writer's rows kept back in its redo log go to DuckDB first, on that cursor
        # (deferred.flush_pending)
        self.before_publish = None

    def opened(self) -> None:
        """At the writer's open: a catalog its newest snapshot does not hold (a writer that
        died before publishing, a database from before snapshots) becomes a commit to publish."""
        if not self.current(self._duck):
            self.committed()
        # the thread holds the publisher weakly: a store never closed, once collected, takes
        # its DuckDB connection (and the file's lock) with it, and the thread ends
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._wake),
                                        name="tensordb-snapshots", daemon=True)
        self._thread.start()

    def current(self, duck) -> bool:
        """Whether the newest snapshot holds what the catalog holds: every commit adds a
        version or removes a tensor row, so the rows' count, newest version and sum of versions
        tell."""
        if not self.seq:
            return False
        try:
            versions = _read(_path(self.root, self.seq, "tensors")).column("version").to_pylist()
        except Exception:  # noqa: BLE001 - unreadable: publish anew
            return False
        snap = (len(versions), max(versions, default=None), sum(versions) if versions else None)
        return [snap] == duck.execute("SELECT count(*), max(version), sum(version) FROM "
                                      f"{SCHEMA}.tensors").fetchall()

    def committed(self) -> None:
        """A COMMIT landed (called under the store's lock, before any file it retired goes)."""
        self.counter += 1
        self.dirty = True
        if readers_present(self.root):
            self._wake.set()

    def retire(self, path: str, keep: bool, spares) -> None:
        """``path`` left the catalog in the newest commit: delete it (or keep it as a spare)
        now when no reader reads an older snapshot, else once none does."""
        pins = live_pins(self.root)
        if pins and min(pins) < self.counter:
            with self._lock:
                self.deferred.append((path, self.counter))
            return
        spares.retire(path, keep=keep)

    def collect(self) -> None:
        """Delete the deferred files no live reader may read any more."""
        with self._lock:
            if not self.deferred:
                return
            pins = live_pins(self.root)
            low = min(pins) if pins else None
            gone = [(p, r) for p, r in self.deferred if low is None or low >= r]
            self.deferred = [d for d in self.deferred if d not in gone]
        for path, _ in gone:
            remove_payload(path)

    # -- the thread ------------------------------------------------------------------------------
    def _serve(self) -> None:
        """One round of the thread: publish while readers live, answer new ones."""
        leases = _leases(self.root)  # listed before the snapshot below is taken
        waiting = [b for b in leases if not os.path.exists(b + ".ack")]
        start = time.monotonic()
        if leases and self.dirty:
            self.publish()
        for base in waiting:  # new readers: a snapshot holding every commit before them
            _write_text(base + ".ack", str(self.seq))
        self.collect()
        if leases:
            time.sleep(max(0.0, MIN_INTERVAL - (time.monotonic() - start)))

    def publish(self) -> int:
        """Write the snapshot of the newest commit; remove those no live reader pins."""
        if self._cursor is None:
            self._cursor = self._duck.cursor()
        cur = self._cursor
        with self._store_lock:  # the number and the rows of one commit
            if self.before_publish is not None:
                self.before_publish(cur)
            seq = self.counter
            cur.execute("BEGIN TRANSACTION")
            cur.execute(f"SELECT count(*) FROM {SCHEMA}.tensors").fetchall()
            self.dirty = False
        try:
            tables = {t: cur.sql(f"SELECT * FROM {SCHEMA}.{t}").to_arrow_table()
                      for t in _TABLES}
            cur.execute("COMMIT")
            for table in _TABLES:
                _write(_path(self.root, seq, table) + ".new", tables[table])
            for table in _TABLES:
                path = _path(self.root, seq, table)
                os.replace(path + ".new", path)
        except BaseException:
            self.dirty = True
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK")
            raise
        with self._lock:
            self.seq = max(self.seq, seq)
        self._prune(live_pins(self.root))
        return seq

    def _prune(self, pins: list[int]) -> None:
        if pins and min(pins) == 0:
            return  # a reader choosing its snapshot: it may take any
        for seq in published(self.root):
            if seq < self.seq and seq not in pins:
                for table in ("tensors", "tiles"):  # the mark first: never a half snapshot
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(_path(self.root, seq, table))

    def close(self) -> None:
        """Stop the thread; with readers still reading, publish what they have not seen."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(Exception):
            leases = _leases(self.root)
            if leases and self.dirty:
                self.publish()
            for base in leases:  # a reader still waiting for its answer gets it
                if not os.path.exists(base + ".ack") and not self.dirty:
                    _write_text(base + ".ack", str(self.seq))
        with contextlib.suppress(Exception):
            self.collect()
        if self._cursor is not None:
            with contextlib.suppress(Exception):
                self._cursor.close()
            self._cursor = None


def _run(ref, wake: threading.Event) -> None:
    """The publisher's thread, until it is closed or collected."""
    while True:
        wake.wait(POLL)
        wake.clear()
        publisher = ref()
        if publisher is None or publisher._stop:
            return
        try:
            publisher._serve()
        except Exception:  # noqa: BLE001 - a full disk, say: tried again at the next round
            time.sleep(POLL)
        finally:
            del publisher
