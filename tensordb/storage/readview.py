"""A read-only connection's view of a database: a copy of its catalog in memory, under a lease;
never DuckDB's lock on ``catalog.duckdb`` beyond the moment the catalog is read.

DuckDB locks its file per process, and a read-only connection's shared lock keeps every writer
out. So a reader never keeps ``catalog.duckdb`` open. It reads the catalog into an in-memory
DuckDB in the form a writer's published snapshots take (snapshots.py), so one code path serves
both:

- **No writer holds the file.** The reader opens ``catalog.duckdb`` read-only just long enough
  to read the ``tiles`` and ``tensors`` rows into Arrow tables, and closes it (milliseconds; a
  writer that arrives meanwhile retries for up to ``directory.READER_GRACE`` seconds, and is
  never refused for a reader). It then loads them into its in-memory DuckDB and pins its own
  copy: the payload files its rows name go to ``readers/<id>.files.arrow``, then the pin
  ``<n> own`` to ``readers/<id>.seq``, ``<n>`` being the newest published snapshot's number
  (or 1): no later writer's commit is numbered at or below it, so each file such a commit
  retires waits for the reader (snapshots.Publisher.retire).
- **A writer holds it.** The reader reads the writer's published snapshots (snapshots.py).

The race (a writer opens between the reader's read and its pin) is closed by order: the lease
comes first. It appears already locked and, until the reader names what it reads, pins every
payload file: a writer that opens after it keeps all of them (``pinned_files`` is None), and
defers every file its commits retire. By the time the reader names its own copy's files, that
list covers everything the catalog it read references; a file outside it was unreferenced then
and is read by nobody.

Each call on a reader's connection (Turns) moves it to the newest committed state: a
snapshot newer than what it holds if one is published (a writer while readers live publishes
every commit, and its last at close); otherwise, when the catalog file changed since the reader
last looked and no writer holds it (the kernel's lock table says so, without trying an open),
the catalog is read again in the same brief way (a writer killed before publishing leaves a
committed catalog no snapshot holds).

The user's own DuckDB tables and views are not copied. A statement naming one of them
(``user_tables``) runs with ``catalog.duckdb`` attached read-only for that statement only
(``View.attach_user_tables``); while a writer holds the file the attach fails, and the query
says that a writer has the database open.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import duckdb

from ..errors import OperationalError
from . import catalog, directory, identity, redolog, snapshots
from ._duck import quote_ident, quote_str, translating
from .catalog import SCHEMA

__all__ = ["View", "open_view", "Turns", "load_tables", "load_newest", "open_reader"]

_TABLES = ("tiles", "tensors")
_ATTACHED = "tensordb_user_tables"  # the alias catalog.duckdb is attached by for a statement


def _stamp(root: str):
    """What tells that the catalog file changed: its and its write-ahead log's identity, size
    and modification time."""
    out = []
    for name in (directory.CATALOG_FILE, directory.CATALOG_FILE + ".wal", redolog.LOG_FILE):
        try:
            st = os.stat(os.path.join(root, name))
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def read_catalog(root: str):
    """``(tables, seq, database id, stamp, user table names)`` read from ``catalog.duckdb``
    itself, open read-only only while it is read; the lock error (``locked`` set) when a writer
    holds it."""
    stamp = _stamp(root)
    try:
        duck = directory.connect(os.path.join(root, directory.CATALOG_FILE), Path(root), True)
    except OperationalError as exc:
        if getattr(exc, "locked", False):
            return exc
        raise
    try:
        with translating(f"cannot read database {root}"):
            if not catalog.exists(duck):
                raise OperationalError(f"{root} holds no tensordb catalog")
            seq = snapshots.newest(root) or 1  # no writer can publish while this lock is held
            tables = {t: duck.sql(f"SELECT * FROM {SCHEMA}.{t}").to_arrow_table()
                      for t in _TABLES}
            if duck.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND "
                            "table_name = 'payload_store'", [SCHEMA]).fetchall()[0][0]:
                # where an object store database keeps its payloads (objectdb.py)
                tables["payload_store"] = duck.sql(
                    f"SELECT * FROM {SCHEMA}.payload_store").to_arrow_table()
            database = identity.read_catalog_id(duck) or identity.read_id_file(root)
            user = {r[0].lower() for r in duck.execute(
                "SELECT table_name FROM duckdb_tables() WHERE NOT internal AND schema_name <> "
                f"'{SCHEMA}' UNION ALL SELECT view_name FROM duckdb_views() WHERE NOT internal"
            ).fetchall()}
            # commits a writer logged and did not write to DuckDB (it died): read under the
            # same lock (no writer appends meanwhile), landed in the copy as its open would
            records = redolog.read(os.path.join(root, redolog.LOG_FILE))[0]
    finally:
        duck.close()
    if records:
        tables = _with_records(tables, records)
    return tables, seq, database, stamp, frozenset(user)


def _with_records(tables: dict, records) -> dict:
    """The catalog ``tables`` (Arrow) with the redo log's ``records`` applied (redolog.apply)."""
    scratch = duckdb.connect(":memory:")
    try:
        load_tables(scratch, {t: tables[t] for t in _TABLES}, None)
        scratch.execute("BEGIN TRANSACTION")
        redolog.apply(scratch, records)
        scratch.execute("COMMIT")
        out = dict(tables)
        for t in _TABLES:
            out[t] = scratch.sql(f"SELECT * FROM {SCHEMA}.{t}").to_arrow_table()
        return out
    finally:
        scratch.close()


def load(duck, root, seq: int, database: str | None) -> None:
    """Make ``duck`` (an in-memory DuckDB) hold snapshot ``seq``'s catalog tables;
    FileNotFoundError when the writer has removed it meanwhile (take the newest again)."""
    paths = {t: snapshots.snapshot_path(root, seq, t) for t in _TABLES}
    tables = {t: snapshots.read_arrow(p) for t, p in paths.items()}  # FileNotFoundError
    load_tables(duck, tables, database)


def load_tables(duck, tables: dict, database: str | None) -> None:
    """Make ``duck`` hold the catalog ``tables`` (Arrow tables by name: a published snapshot's,
    or those a reader read from the catalog itself) in one transaction."""
    duck.execute("BEGIN TRANSACTION")
    try:
        duck.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        for name, table in tables.items():
            duck.register("_tensordb_snapshot", table)
            try:
                duck.execute(f"CREATE OR REPLACE TABLE {SCHEMA}.{name} AS "
                             "SELECT * FROM _tensordb_snapshot")
            finally:
                duck.unregister("_tensordb_snapshot")
        duck.execute(f"CREATE OR REPLACE TABLE {SCHEMA}.identity AS SELECT ?::VARCHAR AS id, "
                     "current_localtimestamp() AS created", [database])
        duck.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(Exception):
            duck.execute("ROLLBACK")
        raise


def load_newest(duck, root, database: str | None, lease: snapshots.Lease, after: int = 0
                ) -> int | None:
    """Load the newest snapshot newer than ``after`` into ``duck`` and pin it; its number, or
    None when there is none newer."""
    for _ in range(20):  # the writer may remove a superseded snapshot between list and read
        seq = snapshots.newest(root)
        if seq is None or seq <= after:
            return None
        try:
            load(duck, root, seq, database)
        except FileNotFoundError:
            continue
        lease.pin(seq)
        return seq
    return None


def open_reader(duck, root, database: str | None, lease: snapshots.Lease, timeout: float = 10.0
                ) -> int | None:
    """Load, into ``duck``, a snapshot holding every commit made before ``lease`` appeared,
    and pin it: the writer's thread acknowledges a new lease with the snapshot of its newest
    commit (publishing it first when needed). None when there is no snapshot directory (a
    writer from before snapshots)."""
    if not os.path.isdir(os.path.join(root, snapshots.SNAPSHOTS_DIR)):
        return None
    deadline = time.monotonic() + timeout
    catalog_file = os.path.join(root, directory.CATALOG_FILE)
    looks = 0
    while (floor := lease.acknowledged()) is None:
        looks += 1
        if looks % 50 == 0 and not directory.writer_holds(catalog_file) \
                and not lease.acknowledged():
            raise _WriterGone  # it closed or died without answering: read the catalog itself
        if time.monotonic() > deadline:
            raise OperationalError(
                f"database {root}: the process writing it did not answer a reader in "
                f"{timeout:g} s", hint="it publishes from a thread of its own; is it stopped "
                "(a debugger, SIGSTOP), its disk full, or is it a tensordb from before "
                "readers could share a database with a writer?")
        time.sleep(0.002)
    for _ in range(100):
        seq = load_newest(duck, root, database, lease, after=floor - 1)
        if seq is not None:
            return seq
    return None


class _WriterGone(Exception):
    pass


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


class View:
    """A reader's lease and what its in-memory DuckDB holds: published snapshot ``seq``, or
    (``own``) its own copy of the catalog read at ``stamp``."""

    def __init__(self, root: str, lease: snapshots.Lease) -> None:
        self.root, self.lease = root, lease
        self.seq: int | None = None
        self.own = False
        self.stamp = None
        self.database: str | None = None
        # the names of the database's own DuckDB tables and views (lower case), which a reader
        # does not see; None when not known (read from a writer's snapshot)
        self.user_tables: frozenset[str] | None = None

    def _take(self, duck, got) -> None:
        tables, seq, database, stamp, user = got
        load_tables(duck, tables, database)
        self.lease.pin_own(seq, tables)  # after the load: the files it now reads
        self.seq, self.own, self.stamp, self.database = seq, True, stamp, database
        self.user_tables = user

    def refresh(self, duck) -> bool:
        """Move ``duck`` to the newest committed state; whether it changed."""
        seq = load_newest(duck, self.root, self.database, self.lease, after=self.seq)
        if seq is not None:
            self.seq, self.own = seq, False
            self.stamp = None
            return True
        if directory.writer_holds(os.path.join(self.root, directory.CATALOG_FILE)):
            return False  # it publishes what it commits
        stamp = _stamp(self.root)
        if stamp == self.stamp:
            return False
        got = read_catalog(self.root)
        if isinstance(got, Exception):  # a writer came: its snapshots follow
            return False
        self._take(duck, got)
        return True

    def close(self) -> None:
        self.lease.close()

    @contextlib.contextmanager
    def attach_user_tables(self, duck):
        """``catalog.duckdb`` attached to ``duck`` read-only, its tables and views reachable by
        their unqualified names (``search_path``), for one statement: detached (and the search
        path restored) on the way out, so a writer arriving later can open the file. Yields
        False without attaching when a writer holds the file (DuckDB's lock)."""
        path = os.path.join(self.root, directory.CATALOG_FILE)
        if directory.writer_holds(path):
            yield False
            return
        alias = quote_ident(_ATTACHED)
        with translating(f"cannot read database {self.root}"):
            old = duck.execute("SELECT current_setting('search_path')").fetchone()[0]
            here = duck.execute("SELECT current_database()").fetchone()[0]
        try:
            duck.execute(f"ATTACH {quote_str(path)} AS {alias} (READ_ONLY)")
        except duckdb.Error as exc:
            if "lock" not in str(exc).lower():
                with translating(f"cannot read database {self.root}"):
                    raise
            yield False  # a writer opened it meanwhile
            return
        try:
            first = old if old else f"{here}.main"  # names DuckDB gave, not the user's
            with translating(f"cannot read database {self.root}"):
                duck.execute(f"SET search_path = {quote_str(f'{first},{_ATTACHED}.main')}")
            yield True
        finally:
            try:
                duck.execute(f"SET search_path = {quote_str(old)}" if old
                             else "RESET search_path")
            finally:
                duck.execute(f"DETACH DATABASE IF EXISTS {alias}")


def open_view(root: str) -> tuple[duckdb.DuckDBPyConnection, View | None]:
    """An in-memory DuckDB holding the database's newest committed catalog, and the view that
    keeps it (its lease registered first; closed with the view). Where no lease can be written
    (a read-only medium, no permission on the directory) nothing could protect a copy's files
    from a writer: then ``catalog.duckdb`` itself, read-only, held open as DuckDB holds it
    (keeping writers out while it is open), and no view."""
    try:
        lease = snapshots.Lease(root)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        return directory.connect(os.path.join(root, directory.CATALOG_FILE), Path(root),
                                 True), None
    view = View(root, lease)
    duck = duckdb.connect(":memory:")
    try:
        for _ in range(100):
            got = read_catalog(root)
            if not isinstance(got, Exception):
                view._take(duck, got)
                break
            # a writer holds the file: read what it publishes
            view.database = identity.read_id_file(root)
            try:
                seq = open_reader(duck, root, view.database, lease)
            except _WriterGone:
                continue
            if seq is None:  # a tensordb from before snapshots writes it
                raise got
            view.seq = seq
            break
        else:
            raise got
    except BaseException:
        duck.close()
        lease.close()
        raise
    return duck, view
