"""Store: one database, a DuckDB catalog plus a directory of tile payload files (its layout,
the checks made when opening it and the sweep of leftover payloads: directory.py).

Every create, replace and drop is: write a new payload file, then swap catalog rows in one DuckDB
transaction, then delete the old payload file. A crash before the commit leaves an orphan file,
after it a stale one; opening for writing deletes every file the catalog does not reference.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Callable, Iterator, Sequence

import duckdb
import numpy as np

from ..errors import CatalogError, Error, InterfaceError, OperationalError, ProgrammingError
from ..geometry import BoxName, GatherName, IotaName, OneHotName
from . import catalog, deferred, directory, identity, readview, snapshots
from ._duck import quote_str, translate, translating
from .directory import CATALOG_FILE, TILES_DIR, remove as _remove, remove_leftover_members
from .boxes import BoxReader, GatherReader, IotaReader, OneHotReader
from .meta import TensorMeta, check_dims, check_fill, check_grid, check_name, supported_dtype
from .reader import TensorReader
from .spares import SparePayloads
from .spilldir import remove_leftover_runs
from .verify import mark_written
from .writer import StagingBuffers, TensorWriter

__all__ = ["Store", "TensorMeta", "TensorReader", "TensorWriter"]


class _Txn:
    """Files to delete when the surrounding transaction ends: new ones on rollback, replaced
    ones on commit."""

    def __init__(self, external: bool) -> None:
        self.external = external  # joined a transaction the user began: we neither commit nor undo
        self.created: list[str] = []
        self.retired: list[tuple[str, bool]] = []  # (path, may be kept as a spare)
        self.committed = False  # our COMMIT landed: what it references is the catalog's now
        self.replaced: list[str] = []  # tensors given new versions: their SQL views follow
        self.stored: list[TensorMeta] = []  # versions written, and versions replaced or dropped:
        self.gone: list[TensorMeta] = []    # told to the commit listeners once COMMIT lands
        # In memory (deferred.py): whether BEGIN has run in DuckDB (it waits for the first use
        # of the catalog connection), and the rows of the commits kept back until then.
        self.begun = True
        self.deferred: dict[str, tuple] = {}


# The stores connections share, by resolved path (Store.shared): a second connect to a database
# open in this process shares it, as DuckDB's connections share one database instance.
# Weak: a store no connection holds any more (one never closed, collected) is gone from it.
_SHARED: "weakref.WeakValueDictionary[str, Store]" = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


class Store:
    """A tensordb database. ``Store()`` is in memory (payloads in a temporary directory)."""

    @classmethod
    def shared(cls, path: str | os.PathLike | None, *, read_only: bool = False,
               storage: str = "local") -> "Store":
        """The store open at ``path`` in this process, shared (one more user), else a new one;
        ``release`` when done. A different ``read_only`` is refused, as DuckDB refuses a second
        connection of another configuration. In memory (None): a new store each time."""
        if path is None:
            return cls(None, read_only=read_only, storage=storage)
        key = str(Path(os.fspath(path)).expanduser().resolve())
        with _SHARED_LOCK:
            store = _SHARED.get(key)
            if store is not None and not store.closed:
                if store.read_only != read_only:
                    raise OperationalError(
                        f"database {store.root} is already open "
                        f"{'read-only' if store.read_only else 'for writing'} in this process",
                        hint="a second connection shares it, opened the same way (read_only)")
                if store.storage != identity.check_storage(storage):
                    raise OperationalError(
                        f"database {store.root} is already open in this process with "
                        f"storage={store.storage!r}",
                        hint="a second connection shares it, declared the same way (storage=)")
                store.users += 1
                return store
            store = cls(path, read_only=read_only, storage=storage)
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
                 storage: str = "local") -> None:
        self.read_only = read_only
        # In memory: the rows of landed commits not written to the catalog yet (deferred.py)
        self._pending: dict[str, tuple] = {}
        # Where the payloads are, as declared (identity.check_storage): "local" (the client's
        # disk) or "shared" (mounted at the same path on every worker).
        self.storage = identity.check_storage(storage)
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
        self._views: set[str] = set()
        # Python objects shown to SQL (pyobjects.py): registered by name (con.register), and
        # those a running statement scans by the name the user's code gives them
        self.registered: dict[str, object] = {}
        self.scanning: dict[str, object] = {}
        self.spares = SparePayloads()  # retired payload files kept for reuse (spares.py)
        self.staging = StagingBuffers()  # anonymous buffers of staged outputs, kept for reuse
        # Called as (versions stored, versions replaced or dropped), lists of TensorMeta, after
        # each COMMIT that lands (the GPU executor's device cache, exec/devcache.py); must not
        # raise.
        self.commit_listeners: list[Callable] = []
        if path is None:
            if read_only:
                raise ProgrammingError("an in-memory database cannot be opened read-only")
            self.root = Path(tempfile.mkdtemp(prefix="tensordb-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.root), True)
            self.persistent = False
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
        self.fsync = self.persistent
        self.tiles_dir = str(self.root / TILES_DIR)
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
                with translating(f"cannot open database {self.root} for readers"):
                    self.publisher.opened()
                    pinned = snapshots.pinned_files(str(self.root), self.duck)
            self._next_version = directory.sweep(self.duck, self.tiles_dir, read_only, pinned)
        except BaseException:
            self.close()
            raise

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the catalog; an in-memory database's payload files are deleted."""
        publisher = getattr(self, "publisher", None)
        if publisher is not None and getattr(self, "duck", None) is not None:
            publisher.close()  # before the lock: its thread may be waiting for it
        with self._lock:
            if getattr(self, "spares", None) is not None:
                self.spares.clear()
            if getattr(self, "staging", None) is not None:
                self.staging.clear()
            self._pending = {}  # in memory: the catalog goes with the database
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
            elif self._cleanup is not None:
                self._cleanup()

    _conn = None  # the catalog's DuckDB connection

    @property
    def duck(self):
        """The catalog's DuckDB connection. In memory, the rows of commits kept back are
        written first and an open transaction begins in DuckDB (deferred.py): whoever uses
        it, SQL or this package's code, sees every commit."""
        if self._pending or (self._txn is not None and not self._txn.begun):
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

    # -- reading the catalog -------------------------------------------------------------------
    def list(self) -> list[TensorMeta]:
        self._check_open()
        with self._lock, translating():
            return catalog.all_metas(self.duck)

    def has(self, name: str) -> bool:
        """Whether ``name`` is stored; a slice's, a gather's or positions' graph name (geometry)
        exists while the tensors it reads do (the plan cache keeps plans that read them)."""
        if isinstance(name, IotaName):
            return True
        if isinstance(name, BoxName):
            return self.has(name.base)
        if isinstance(name, GatherName):
            return self.has(name.base) and self.has(name.index)
        if isinstance(name, OneHotName):
            return self.has(name.index)
        return self._find(name) is not None

    def meta(self, name: str) -> TensorMeta:
        """The catalog entry of ``name`` (case-insensitive); CatalogError when there is none."""
        meta = self._find(name)
        if meta is None:
            known = [m.name for m in self.list()]
            raise CatalogError(f"tensor '{name}' does not exist",
                               hint=f"stored tensors: {', '.join(known)}" if known else
                               "the database holds no tensors yet")
        return meta

    def _find(self, name: str) -> TensorMeta | None:
        self._check_open()
        if not isinstance(name, str):
            raise ProgrammingError(f"a tensor name must be a string, got {name!r}")
        key = name.lower()
        with self._lock:
            if key not in self._cache:
                if not self._cache_full:
                    # One read of every tensor's row costs what one lookup costs (a scan): a
                    # script naming many tensors then pays one scan, not one per name.
                    with translating():
                        for m in catalog.all_metas(self.duck):
                            self._cache.setdefault(m.name.lower(), m)
                    self._cache_full = True
                    self._cache.setdefault(key, None)
                elif key not in self._changed:  # absent when the whole catalog was read
                    self._cache[key] = None
                else:
                    with translating():
                        self._cache[key] = catalog.find(self.duck, name)
            return self._cache[key]

    def _clear_cache(self) -> None:
        self.epoch += 1
        self._cache.clear()
        self._cache_full = False
        self._changed.clear()

    def _forget(self, name: str) -> None:
        self.epoch += 1
        self._cache.pop(name.lower(), None)
        self._changed.add(name.lower())

    def forget_cached(self) -> None:
        """Drop cached catalog reads (after SQL that may have changed the catalog). The tile
        entries, cached by version, stay: a version's tiles never change (the catalog schema
        is tensordb's alone, guard.py) and no version number is used twice."""
        with self._lock:
            self._clear_cache()

    def query(self, sql: str, params=None) -> list[tuple]:
        """Run SQL (with ``params`` for its ``?``) on the catalog connection itself (so it sees
        the writes of an open transaction block); the engine's tile joins go through here."""
        self._check_open()
        with self._lock, translating():
            return self.duck.execute(sql, params).fetchall()

    def open(self, name: str) -> TensorReader:
        """A reader for the current version of ``name``."""
        return self.open_many([name])[name]

    def open_many(self, names) -> dict[str, TensorReader]:
        """Readers for the current versions of ``names`` (the tile entries not cached yet are
        read in one query)."""
        if any(isinstance(name, (IotaName, OneHotName)) for name in names):  # computed (boxes.py)
            rest = self.open_many(list(dict.fromkeys(
                [n for n in names if not isinstance(n, (IotaName, OneHotName))]
                + [n.index for n in names if isinstance(n, OneHotName)])))
            return {name: IotaReader(name) if isinstance(name, IotaName) else
                    OneHotReader(rest[name.index], name) if isinstance(name, OneHotName) else
                    rest[name] for name in names}
        boxes = {name: name for name in names if isinstance(name, (BoxName, GatherName))}
        if boxes:  # slices and gathers: readers of the stored tensors they read (boxes.py)
            bases = self.open_many(list(dict.fromkeys(
                [b.base for b in boxes] + [b.index for b in boxes if isinstance(b, GatherName)]
                + [n for n in names if n not in boxes])))
            return {name: bases[name] if name not in boxes else
                    BoxReader(bases[name.base], name.box, name) if isinstance(name, BoxName) else
                    GatherReader(bases[name.base], bases[name.index], name) for name in names}
        metas = {name: self.meta(name) for name in names}
        with self._lock:
            missing = [m for m in metas.values() if m.version not in self._entries]
            if missing:
                with translating():
                    read = catalog.tile_entries_many(self.duck, missing, self._optional)
                if len(self._entries) + len(read) > max(256, 2 * len(read)):
                    self._entries.clear()
                self._entries.update(read)
            hits = {name: self._entries[m.version] for name, m in metas.items()}
        return {name: TensorReader(metas[name], os.path.join(self.tiles_dir, file) if file else None,
                                   entries, self.database)
                for name, (file, entries) in hits.items()}

    # -- writing -------------------------------------------------------------------------------
    def writer(self, name: str, shape: Sequence[int], dtype, grid, dims: Sequence[str] | None = None,
               replace: bool = False, check_tables: bool = True,
               fill: float = 0.0) -> TensorWriter:
        """A writer for a new tensor (or a new version of ``name`` when ``replace``).
        ``fill``: the value of its absent entries (``meta.check_fill``).

        ``grid`` is one tuple of boundaries per dimension, or a tile shape (one int each). A
        user table of that name is refused at once, and again, inside the transaction, at commit;
        ``check_tables=False`` leaves only the commit's check (one catalog query fewer)."""
        self._check_open(writing=True)
        check_name(name)
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ProgrammingError(f"tensor '{name}': negative extent in shape {shape}")
        dtype = supported_dtype(dtype, f"tensor '{name}'")
        dtype = np.dtype(dtype.name)  # native byte order
        grid = check_grid(grid, shape, name)
        dims = check_dims(dims, len(shape), name)
        fill = check_fill(fill, dtype, name)
        self.check_free(name, replace, tables=check_tables)
        with self._lock:
            version = self._next_version
            self._next_version += 1
        return TensorWriter(self, name, shape, dtype, grid, dims, replace, version, fill)

    def check_free(self, name: str, replace: bool, tables: bool = True) -> None:
        """CatalogError unless ``name`` may be created (or replaced, when ``replace``); with
        ``tables=False`` only the tensors are looked at (cached), not the user's tables."""
        with self._lock:
            if not replace and self.has(name):
                raise CatalogError(f"tensor '{self.meta(name).name}' already exists",
                                   hint="pass replace=True to overwrite it")
            if tables:
                self.check_no_tables([name])

    def check_no_tables(self, names) -> None:
        """CatalogError if a user table or view is named like one of ``names``: one catalog
        query for all of them (a commit of several writers asks once, inside its transaction,
        and marks them ``tables_checked``). A name that is a tensor already is not looked for:
        a new version of it leaves the shared namespace as it was (``sql.run`` refuses a table
        named like a tensor), and the query is 1-1.5 ms of a training step's commit."""
        with self._lock:
            names = [n for n in names if self._find(n) is None]
            if not names:
                return
            for name in names:
                for known in self.registered:
                    if known.lower() == name.lower():
                        raise CatalogError(f"cannot create tensor '{name}': a Python object is "
                                           f"registered as '{known}'",
                                           hint=f"con.unregister('{known}') first; tensors, "
                                                "tables and registered objects share one namespace")
            with translating():
                found = catalog.tables_named(self.duck, names)
            for name in names:
                table = found.get(name.lower())
                if table is not None:
                    raise CatalogError(f"cannot create tensor '{name}': a table named '{table}' "
                                       "exists", hint="tensors and tables share one namespace")

    def take_spare(self, size: int, path: str) -> int | None:
        """Rename a retired payload file of about ``size`` bytes to ``path`` (a writer's new
        file); its size, or None (spares.py)."""
        return self.spares.take(size, path)

    def _commit_writers(self, items: list[tuple[TensorWriter, Callable[[], None]]]
                        ) -> list[TensorMeta]:
        """Swap each writer's rows in, all in one transaction; each ``durable()`` waits until
        that writer's payload is on disk (and raises OSError if it cannot be): they return
        before the transaction commits. Writers of distinct names share batched catalog
        statements (catalog.store); two of one name are swapped in one after the other."""
        txns: list[_Txn] = []  # the transaction the swap ran in
        try:
            if len({w.name.lower() for w, _ in items}) < len(items):
                with self.transaction() as txn:
                    txns.append(txn)
                    return [m for item in items for m in self._swap_rows([item], txns)]
            metas = deferred.commit(self, items)  # in memory: the rows kept back
            return self._swap_rows(items, txns) if metas is None else metas
        except BaseException:
            if txns and txns[0].committed:
                # The COMMIT landed and something came after it (a Ctrl-C while the replaced
                # files were retired): the payloads are the catalog's, never to be deleted.
                for w, _ in items:
                    w._state = "committed"
            raise

    def _swap_rows(self, items, txns: list) -> list[TensorMeta]:
        rows = [(w, w.meta(), sorted(w.entries.values(), key=lambda e: e.offset))
                for w, _ in items]
        # The lock spans the whole swap: no other thread's commit can interleave with it.
        with self._lock, self.transaction() as txn:
            txns.append(txn)
            for w, _, _ in rows:
                if w.has_file:
                    txn.created.append(w.path)
            # inside the transaction: what it sees holds (the tables looked for already when
            # the caller asked for several writers' names at once, in this transaction)
            unchecked = [w.name for w, _, _ in rows if not w.tables_checked]
            if unchecked:
                self.check_no_tables(unchecked)
            olds = []
            for w, _, _ in rows:
                self.check_free(w.name, w.replace, tables=False)
                olds.append(self._find(w.name))
            names = ", ".join(f"'{w.name}'" for w, _, _ in rows)
            with translating(f"cannot store tensor{'s' if len(rows) > 1 else ''} {names}"):
                for old in olds:
                    if old is not None:
                        self._retire_file(old, txn, spare=True)
                        txn.gone.append(old)
                catalog.store(self.duck, [(old, meta, w.file, entries)
                                          for old, (w, meta, entries) in zip(olds, rows)])
            for w, durable in items:
                try:
                    durable()  # the payload before the catalog: COMMIT comes after this
                except OSError as exc:
                    raise OperationalError(f"cannot store tensor '{w.name}': syncing {w.path} "
                                           f"failed: {exc.strerror or exc}") from None
            for w, meta, entries in rows:
                self._forget(w.name)
                txn.replaced.append(w.name)
                self._cache[w.name.lower()] = meta  # exact: the rows just inserted
                txn.stored.append(meta)
                if len(self._entries) > 1024:
                    self._entries.clear()
                self._entries[meta.version] = (w.file if entries else None, entries)
                if entries:
                    mark_written(w.path, entries)  # checksummed from these bytes (verify.py)
        return [meta for _, meta, _ in rows]

    def drop(self, name: str, if_exists: bool = False) -> None:
        """Remove a tensor; CatalogError when it does not exist (unless ``if_exists``)."""
        self._check_open(writing=True)
        with self._lock, self.transaction() as txn:
            old = self._find(name)
            if old is None:
                if if_exists:
                    return
                self.meta(name)  # raises with the list of known tensors
            with translating(f"cannot drop tensor '{name}'"):
                self._retire(old, txn)
            self._forget(name)
        self._forget_view(old.name)
        self.spares.clear()  # a drop gives space back: the spares' too
        self.staging.clear()  # and memory: the staging buffers

    def _retire(self, old: TensorMeta, txn: _Txn) -> None:
        self._retire_file(old, txn)
        catalog.delete(self.duck, old)
        txn.gone.append(old)

    def _retire_file(self, old: TensorMeta, txn: _Txn, spare: bool = False) -> None:
        """Have ``old``'s payload file deleted once the transaction that removes its rows
        commits (its name from the cached tile entries when this session read or wrote it);
        ``spare``: or kept for reuse by a later output of its size (a replace, not a drop)."""
        hit = self._entries.get(old.version)
        file = hit[0] if hit is not None else catalog.payload_file(self.duck, old)
        if file:
            txn.retired.append((os.path.join(self.tiles_dir, file), spare))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Txn]:
        """Group writer commits and drops: all of them land, or none does. Nested blocks join
        the outermost one. The store lock is not held across the block: worker threads may read
        the catalog meanwhile (they see the block's uncommitted changes, as DuckDB does)."""
        self._check_open(writing=True)
        if self.user_transaction:
            raise ProgrammingError(
                "a transaction begun with SQL BEGIN is open: tensordb writes run in transactions "
                "of their own", hint="COMMIT or ROLLBACK it first, or group tensordb statements "
                "in the dialect's BEGIN ... COMMIT")
        with self._lock:
            joined = self._txn
            if joined is None and not self.persistent:
                txn = _Txn(external=False)  # begins in DuckDB at the first use (deferred.py)
                txn.begun = False
                self._txn = txn
            elif joined is None:
                try:
                    self.duck.execute("BEGIN TRANSACTION")
                    txn = _Txn(external=False)
                except duckdb.TransactionException:
                    txn = _Txn(external=True)  # the user began one: its COMMIT decides
                except duckdb.Error as exc:
                    raise translate(exc) from None
                self._txn = txn
        if joined is not None:
            yield joined
            return
        try:
            yield txn
        except BaseException:
            with self._lock:
                self._txn = None
                self._clear_cache()
                if not txn.external:
                    if txn.begun:
                        with contextlib.suppress(duckdb.Error):
                            self._conn.execute("ROLLBACK")
                    self._remove_created(txn)
            raise
        with self._lock:
            self._txn = None
            if txn.external:
                self._clear_cache()  # the user's own COMMIT or ROLLBACK decides what lands
                if self.publisher is not None:
                    self.publisher.committed()  # perhaps: the user's COMMIT decides
                self._tell_listeners([], txn.gone)  # forgetting what may go costs nothing
                return  # files are reconciled when the database is next opened
            try:
                if txn.begun:
                    self._conn.execute("COMMIT")
                else:
                    deferred.land(self, txn)
                txn.committed = True
            except duckdb.Error as exc:
                with contextlib.suppress(duckdb.Error):
                    self._conn.execute("ROLLBACK")
                self._remove_created(txn)
                raise translate(exc, "commit failed") from None
            if self.publisher is not None:
                try:  # numbered before a retired file goes: a reader that comes now waits
                    self.publisher.committed()  # for the snapshot without it
                except OSError:  # committed: what was retired waits for the next open
                    txn.retired = []
            for path, spare in txn.retired:  # a replaced payload may be reused; a dropped one goes
                try:
                    if self.publisher is None:
                        self.spares.retire(path, keep=spare)
                    else:  # or waits while a reader of another process may still read it
                        self.publisher.retire(path, spare, self.spares)
                except OSError:  # committed: what is left is reconciled at the next open
                    pass
            if self.publisher is not None:
                self.publisher.collect()  # what waited for readers that have moved on or gone
            self._refresh_views(txn.replaced)
            self._tell_listeners(txn.stored, txn.gone)

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

    def _tell_listeners(self, stored, gone) -> None:
        for listener in list(self.commit_listeners):
            try:
                listener(stored, gone)
            except Exception:  # noqa: BLE001 - committed all the same; a cache is no record
                pass

    def _refresh_views(self, names) -> None:
        """The SQL views of tensors just given new versions read the new ones: a user's view
        (CREATE VIEW v AS SELECT ... FROM A) and a relation not fetched yet read a tensor as it
        is when they run, never a version replaced since."""
        from .views import TensorStream
        for name in names:
            for view in [v for v in self._views if v.lower() == name.lower()]:
                try:
                    self._register_view(view, TensorStream(self.open(name)))
                except Error:  # committed all the same: the next query names it again
                    self._forget_view(view)

    def _remove_created(self, txn: _Txn) -> None:
        """Delete the payload files of a transaction that did not commit, each only once the
        catalog proves it unreferenced: should the catalog name one (its rows committed some
        other way), it stays. A catalog that cannot be read proves nothing; the files are then
        left to the sweep at the next open for writing."""
        try:
            unreferenced = directory.unreferenced(self.duck, txn.created)
        except duckdb.Error:
            return
        for path in unreferenced:
            _remove(path)

    # -- what the SQL front door and the file formats use (sqlfront/, formats/) ----------------
    @property
    def lock(self) -> threading.RLock:
        """The lock every use of ``duck`` holds (``with store.lock, translating(): store.duck...``):
        the store's own catalog calls take it too."""
        return self._lock

    @property
    def holds_rows(self) -> bool:
        """In memory: whether commits' catalog rows are held back, to be written before the
        catalog connection is next used (storage/deferred.py)."""
        return bool(self._pending)

    def check_open(self, writing: bool = False) -> None:
        """InterfaceError when the store is closed; OperationalError when ``writing`` and it is
        open read-only."""
        self._check_open(writing)

    @property
    def in_transaction(self) -> bool:
        """Whether tensordb's own catalog transaction (``transaction()``) is open."""
        return self._txn is not None

    def find(self, name: str) -> TensorMeta | None:
        """The catalog entry of ``name`` (case-insensitive), or None where ``meta`` raises."""
        return self._find(name)

    def views_of(self, name: str) -> list[str]:
        """The names under which ``name`` is registered with DuckDB as a view (views.py)."""
        return [v for v in self._views if v.lower() == name.lower()]

    def register_view(self, name: str, obj) -> None:
        """Show ``obj`` (a tensor's ``views.TensorStream``) to DuckDB as ``name``; a commit of a
        new version of the tensor registers it again."""
        self._register_view(name, obj)

    # -- SQL views of tensors (see relations.py) -----------------------------------------------
    def _register_view(self, name: str, obj) -> None:
        with self._lock, translating():
            self._conn.register(name, obj)  # reads no catalog row: nothing to write first
            self._views.add(name)

    def _forget_view(self, name: str) -> None:
        with self._lock:
            for view in [v for v in self._views if v.lower() == name.lower()]:
                self._views.discard(view)
                with contextlib.suppress(duckdb.Error):
                    self.duck.unregister(view)
