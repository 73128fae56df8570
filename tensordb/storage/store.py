"""Store: one database, a DuckDB catalog plus a directory of tile payload files (its layout,
the checks made when opening it and the sweep of leftover payloads: directory.py).

Every create, replace and drop is: write a new payload file, then swap catalog rows in one DuckDB
transaction, then delete the old payload file. A crash before the commit leaves an orphan file,
after it a stale one; opening for writing deletes every file the catalog does not reference.

This module opens and closes a store (shared by the connections of a process; read-only opens
of a database another process writes read its published snapshots, snapshots.py). What a store
does once open is in two mixins ``Store`` inherits: store_catalog.py (catalog reads, readers,
the SQL views of tensors) and store_commit.py (writers, the commit, drops, transactions).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Callable

import duckdb

from ..errors import InterfaceError, OperationalError, ProgrammingError
from . import (catalog, deferred, directory, identity, memfiles, objectdb, readview, redolog,
               snapshots)
from ._duck import quote_str, translating
from .directory import CATALOG_FILE, TILES_DIR, remove_leftover_members
from .meta import TensorMeta
from .objects import ObjectStore, is_object_url
from .reader import TensorReader
from .spares import SparePayloads
from .spilldir import remove_leftover_runs
from .store_catalog import StoreCatalog
from .store_commit import StoreCommits, _Txn
from .writer import StagingBuffers, TensorWriter

__all__ = ["Store", "TensorMeta", "TensorReader", "TensorWriter"]


# The stores connections share, by resolved path (Store.shared): a second connect to a database
# open in this process shares it, as DuckDB's connections share one database instance.
# Weak: a store no connection holds any more (one never closed, collected) is gone from it.
_SHARED: "weakref.WeakValueDictionary[str, Store]" = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


# Where an in-memory database keeps its payload files: a directory of its own in the first of
# these that is a writable tmpfs (shared memory: no journal, no write-back), else in its
# temporary directory. Empty by default (opt-in: ``("/dev/shm",)``): a large output written on
# a tmpfs took 1.4-1.6x the time it takes in the page cache of /tmp (a 512 MB SpMM result,
# bench_sparse_scale), its pages cannot be written back under memory pressure, and a small
# step gained about 1% (its outputs are read back from the bytes written, on either).
# docs/storage.md, "In memory".
MEMORY_PAYLOADS: tuple = ()


def memory_payload_dir() -> str | None:
    """A new directory on a tmpfs for an in-memory database's payload files (in its
    ``tiles/``, beside the database's id file, as in any database's directory), or None
    (they go in its temporary directory, as on any system without a tmpfs)."""
    for base in MEMORY_PAYLOADS:
        try:
            if not (os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK)):
                continue
            if os.statvfs(base).f_bavail <= 0:
                continue
            return tempfile.mkdtemp(prefix="tensordb-", dir=base)
        except OSError:
            continue
    return None


def _remove_trees(paths) -> None:
    for path in paths:
        if path:
            memfiles.forget_under(str(Path(path) / TILES_DIR))  # its payloads kept in memory
            shutil.rmtree(path, True)


def _flusher(ref):
    """What a publisher calls before it reads the catalog (snapshots.py): the store's logged
    rows written first, on the publisher's cursor (weakly held: the publisher's thread must
    not keep the store alive)."""
    def flush(cursor) -> None:
        store = ref()
        if store is not None and (store._pending or (
                store.redo is not None and store.redo.dirty)):
            deferred.flush_pending(store, cursor)
    return flush


class Store(StoreCatalog, StoreCommits):
    """A tensordb database. ``Store()`` is in memory (payloads in a temporary directory).
    Its catalog reads are in store_catalog.py, its writes and transactions in store_commit.py."""

    @classmethod
    def shared(cls, path: str | os.PathLike | None, *, read_only: bool = False,
               storage: str = "local", storage_options: dict | None = None) -> "Store":
        """The store open at ``path`` in this process, shared (one more user), else a new one;
        ``release`` when done. A different ``read_only`` is refused, as DuckDB refuses a second
        connection of another configuration. In memory (None): a new store each time."""
        if path is None:
            return cls(None, read_only=read_only, storage=storage,
                       storage_options=storage_options)
        key = str(Path(os.fspath(path)).expanduser().resolve())
        with _SHARED_LOCK:
            store = _SHARED.get(key)
            if store is not None and not store.closed:
                if store.read_only != read_only:
                    raise OperationalError(
                        f"database {store.root} is already open "
                        f"{'read-only' if store.read_only else 'for writing'} in this process",
                        hint="a second connection shares it, opened the same way (read_only)")
                if store.storage != identity.check_storage(storage) or (
                        store.objects is not None and
                        store.objects.options != dict(storage_options or {})):
                    raise OperationalError(
                        f"database {store.root} is already open in this process with "
                        f"storage={store.storage!r}",
                        hint="a second connection shares it, declared the same way (storage=)")
                store.users += 1
                return store
            store = cls(path, read_only=read_only, storage=storage,
                        storage_options=storage_options)
            _SHARED[key] = store
            return store

    def release(self) -> None:
        """One user of a shared store is done; the last one closes it."""
        with _SHARED_LOCK:
            self.users -= 1
            if self.users > 0:
                return
            for key in [k for k, v in _SHARED.items() if v is self]:
                del _SHARED[key]
            # closed before the lock goes: a connect in another thread that finds no shared
            # store must find the database closed too (directory.claim), not still held
            self.close()

    def __init__(self, path: str | os.PathLike | None = None, *, read_only: bool = False,
                 storage: str = "local", storage_options: dict | None = None) -> None:
        self.read_only = read_only
        # The rows of landed commits not written to the catalog yet (deferred.py); on disk
        # each is in the redo log (redolog.py), which ``redo`` appends to (None: not used)
        self._pending: dict[str, tuple] = {}
        self.redo: redolog.RedoLog | None = None
        # Where the payloads are, as declared (identity.check_storage): "local" (the client's
        # disk), "shared" (mounted at the same path on every worker) or an object store URL
        # (then ``objects``: objects.py; ``tiles/`` holds the writers' staging files only).
        self.storage = identity.check_storage(storage)
        self.objects = ObjectStore(self.storage, storage_options) \
            if is_object_url(self.storage) else None
        if self.objects is None and storage_options:
            raise ProgrammingError("storage_options apply to an object store only",
                                   hint="storage='s3://bucket/prefix'")
        if self.objects is not None and path is None:
            raise ProgrammingError(f"storage='{self.storage}' needs a database path: the catalog "
                                   "is kept in that directory, the payloads in the object store")
        self.closed = True
        self.users = 1  # connections sharing it (shared/release)
        # The calls of every connection using this store take turns (calls.py): they share its
        # DuckDB connection, its transaction and its caches.
        self.call_lock = threading.RLock()
        # Readers in other processes (snapshots.py): a writer's publisher of catalog
        # snapshots; a reader's lease and the snapshot it reads, when a writer holds the catalog
        self.publisher: snapshots.Publisher | None = None
        self.view: readview.View | None = None
        self.database: str | None = None  # the database's id (identity.py)
        self._lock = threading.RLock()
        self._txn: _Txn | None = None
        # Catalog reads are cached: metadata by lower-cased name (None: no such tensor), tile
        # entries by version (a version's tiles never change). Writes keep both exact; a rolled
        # back transaction clears them.
        self._cache: dict[str, TensorMeta | None] = {}
        self._cache_full = False  # _cache was filled from the whole catalog since it was cleared
        self._changed: set[str] = set()  # names written or dropped since then
        # Counts the changes of the cached catalog answers (a write, a drop, a rollback, SQL
        # that may have changed the catalog): an answer read at one epoch holds while it lasts
        # (the driver's prepared statements are validated by it, driver/cache.py).
        self.epoch = 0
        self.user_transaction = False  # a transaction begun with SQL (con.sql("BEGIN")) is open
        self._entries: dict[int, tuple] = {}
        self._kept_readers: dict[int, object] = {}  # version -> its TensorReader (store_catalog)
        self._kept_boxes: dict[tuple, object] = {}  # (type, slice or gather name) -> its reader
        self._views: set[str] = set()
        # Python objects shown to SQL (pyobjects.py): registered by name (con.register), and
        # those a running statement scans by the name the user's code gives them
        self.registered: dict[str, object] = {}
        self.scanning: dict[str, object] = {}
        self.spares = SparePayloads()  # retired payload files kept for reuse (spares.py)
        self._strays: list[str] = []  # retired payloads whose retire failed (store_commit.py)
        self.staging = StagingBuffers()  # anonymous buffers of staged outputs, kept for reuse
        # Called as (versions stored, versions replaced or dropped), lists of TensorMeta, after
        # each COMMIT that lands (the GPU executor's device cache, exec/devcache.py); must not
        # raise.
        self.commit_listeners: list[Callable] = []
        # Called with the store once it is closed (the graph cache lets go of its payloads'
        # views, exec/graphcache.py); must not raise.
        self.close_listeners: list[Callable] = []
        if path is None:
            if read_only:
                raise ProgrammingError("an in-memory database cannot be opened read-only")
            self.root = Path(tempfile.mkdtemp(prefix="tensordb-"))
            # payload files in memory (tmpfs) where there is one: a replace renames a spare
            # file per output, which on a disk's file system waits for its journal
            self._memory_tiles = memory_payload_dir()
            self._cleanup = weakref.finalize(self, _remove_trees,
                                             [str(self.root), self._memory_tiles])
            self.persistent = False
            self.spares.private = True  # its directory is this process's own (spares.py)
            self.duck = directory.connect(":memory:", self.root, read_only)
            # DuckDB spills big sorts (COO loads) to ./.tmp by default; keep them in our directory.
            self.duck.execute(f"SET temp_directory = {quote_str(str(self.root / 'spill'))}")
        else:
            self.root = Path(os.fspath(path)).expanduser().absolute()
            self._cleanup = None
            self.persistent = True
            directory.check_root(self.root, read_only)
            directory.claim(self)
            try:
                if read_only:  # a copy of the catalog, never DuckDB's lock (readview.py)
                    self.duck, self.view = readview.open_view(str(self.root))
                    if self.view is not None:
                        self.call_lock = readview.Turns(self.refresh_snapshot)
                else:
                    self.duck = directory.connect(str(self.root / CATALOG_FILE), self.root, False)
            except BaseException:
                directory.release(self)
                raise
        # Power-loss safety for payloads costs one fsync per tensor; an in-memory db has no use.
        # With an object store the upload is the payload's durability: no local fsync.
        self.fsync = self.persistent and self.objects is None
        self.tiles_dir = str(Path(self._memory_tiles or self.root) / TILES_DIR)
        try:
            # an in-memory database's directory is a temporary one of ours: not the user's word
            where = f"database {self.root}" if self.persistent else "an in-memory database"
            with translating(f"cannot open {where}"):
                # A library prints nothing. DuckDB starts with it off in a Jupyter kernel, and
                # there refuses any change to it unless ipywidgets is installed: set it only on.
                if self.duck.execute("SELECT current_setting('enable_progress_bar')").fetchall()[0][0]:
                    self.duck.execute("SET enable_progress_bar = false")
                self._duck_memory_default = self.duck.execute(
                    "SELECT current_setting('memory_limit')").fetchall()[0][0]
                if not read_only:
                    directory.check_catalog(self.duck, self.root, self.tiles_dir)
                    catalog.create(self.duck)  # also adds columns an older catalog lacks
                    if self.persistent:  # commits logged but not in DuckDB (before the sweep)
                        self._open_redo()
                elif not catalog.exists(self.duck):
                    raise OperationalError(f"{self.root} holds no tensordb catalog")
                # Columns added after the first release that this catalog has: a read-only open
                # of an older database cannot add them, and reads them as NULL (not known).
                self._optional = frozenset(c for c in ("crc32", "nonfinite", "format")
                                           if catalog.has_column(self.duck, "tiles", c))
                self.nonfinite_column = "nonfinite" if "nonfinite" in self._optional \
                    else "NULL::BOOLEAN"
                # The database's identity (identity.py): made on the first open for writing.
                self.database = identity.read_catalog_id(self.duck) if read_only else \
                    identity.ensure_id(self.duck, str(self.root))
                if self._memory_tiles is not None:  # readers of its payloads check it there
                    identity.ensure_id(self.duck, self._memory_tiles)
            if not read_only:
                os.makedirs(self.tiles_dir, exist_ok=True)
                remove_leftover_runs(self.root)  # spill files of a killed run (spilldir.py)
                remove_leftover_members(self.root)  # and a killed load's inflated npz member
            self.closed = False
            pinned = (set(), set())
            if self.persistent and not read_only:
                # numbered before the sweep: a reader that comes now waits for the snapshot of
                # what the catalog holds, and one that came before is seen by pinned_files
                self.publisher = snapshots.Publisher(str(self.root), self.duck, self._lock)
                self.publisher.before_publish = _flusher(weakref.ref(self))
                with translating(f"cannot open database {self.root} for readers"):
                    self.publisher.opened()
                    pinned = snapshots.pinned_files(str(self.root), self.duck)
            self._next_version = directory.sweep(self.duck, self.tiles_dir, read_only, pinned)
            objectdb.check_location(self.duck, self.root, self.objects, read_only,
                                    copy=self.view is not None)
            if self.objects is not None:  # the prefix claimed, its orphans swept (objectdb.py)
                self._next_version = objectdb.open_objects(
                    self.duck, self.tiles_dir, self.objects, self.database, read_only,
                    self._next_version)
        except BaseException:
            self.close()
            raise

    def _open_redo(self) -> None:
        """Replay the redo log into the catalog (redolog.replay), then open it for appends
        (not for an object store's database: its commits write DuckDB as before)."""
        try:
            redolog.replay(self.duck, str(self.root))
            if self.objects is None and redolog.ENABLED:
                self.redo = redolog.RedoLog(str(self.root))
        except OSError as exc:
            raise OperationalError(f"cannot open database {self.root}: its redo log "
                                   f"{redolog.LOG_FILE}: {exc.strerror or exc}") from None

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the catalog; an in-memory database's payload files are deleted."""
        publisher = getattr(self, "publisher", None)
        # _conn, not duck: that would write the logged rows first, and a failure there (a
        # full disk) must not keep the database from closing (the log keeps them)
        if publisher is not None and self._conn is not None:
            publisher.close()  # before the lock: its thread may be waiting for it
        with self._lock:
            if getattr(self, "spares", None) is not None:
                self.spares.clear()
            if getattr(self, "staging", None) is not None:
                self.staging.clear()
            if self._conn is not None and self.persistent and (
                    self._pending or (self.redo is not None and self.redo.dirty)):
                try:  # the logged rows into DuckDB (else the next open replays them)
                    deferred.flush_pending(self)
                except Exception:  # noqa: BLE001 - durable in the log all the same
                    pass
            self._pending = {}  # in memory: the catalog goes with the database
            if getattr(self, "redo", None) is not None:
                self.redo.close()
            self._kept_readers, self._kept_boxes = {}, {}  # their mappings go with them
            if self._conn is not None:
                try:
                    if self._txn is not None and not self._txn.external and self._txn.begun:
                        self._conn.execute("ROLLBACK")
                    self._conn.close()
                except duckdb.Error:
                    pass
                self._conn = None
            self._txn = None
            self.closed = True
            if getattr(self, "view", None) is not None:
                self.view.close()
            if self.persistent:
                directory.release(self)
            else:
                if getattr(self, "tiles_dir", None) is not None:
                    memfiles.forget_under(self.tiles_dir)  # its payloads kept in memory
                if self._cleanup is not None:
                    self._cleanup()
        for listener in list(getattr(self, "close_listeners", ())):
            try:
                listener(self)
            except Exception:  # noqa: BLE001 - closed all the same; a cache is no record
                pass

    _conn = None  # the catalog's DuckDB connection
    _memory_tiles = None  # an in-memory database's directory on a tmpfs (or None)

    @property
    def duck(self):
        """The catalog's DuckDB connection. In memory, the rows of commits kept back are
        written first and an open transaction begins in DuckDB (deferred.py): whoever uses
        it, SQL or this package's code, sees every commit."""
        if self._pending or (self._txn is not None and not self._txn.begun) or (
                self.redo is not None and self.redo.dirty):
            deferred.flush(self)
        return self._conn

    @duck.setter
    def duck(self, conn) -> None:
        self._conn = conn

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.root if self.persistent else ":memory:"
        return f"<tensordb.Store {where}{' read-only' if self.read_only else ''}>"

    def _check_open(self, writing: bool = False) -> None:
        if self.closed:
            raise InterfaceError("the database is closed")
        if writing and self.read_only:
            raise OperationalError(f"database {self.root} is open read-only")

    # -- readers (readview.py, snapshots.py) ---------------------------------------------------
    def refresh_snapshot(self) -> None:
        """A reader moves to the newest committed state (each call does, on entry; readview.py)."""
        if self.closed or self.view is None:
            return
        with self._lock:
            if self._txn is not None or self.user_transaction:
                return
            with translating(f"cannot read a snapshot of database {self.root}"):
                if not self.view.refresh(self.duck):
                    return
            self._clear_cache()
            self._entries.clear()
            self._refresh_views(list(self._views))
