"""Store: one database, a DuckDB catalog plus a directory of tile payload files.

    <root>/catalog.duckdb   the catalog (and the user's own tables)
    <root>/tiles/<v>.bin    one payload file per tensor version

Every create, replace and drop is: write a new payload file, then swap catalog rows in one DuckDB
transaction, then delete the old payload file. A crash before the commit leaves an orphan file,
after it a stale one; opening for writing deletes every file the catalog does not reference.
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Iterator, Sequence

import duckdb
import numpy as np

from ..errors import CatalogError, InterfaceError, OperationalError, ProgrammingError
from . import catalog
from ._duck import quote_str, translate, translating
from .meta import TensorMeta, check_dims, check_grid, check_name, supported_dtype
from .reader import TensorReader
from .spilldir import remove_leftover_runs
from .writer import TensorWriter

__all__ = ["Store", "TensorMeta", "TensorReader", "TensorWriter"]

CATALOG_FILE = "catalog.duckdb"
TILES_DIR = "tiles"
_PAYLOAD = re.compile(r"(\d+)\.bin\Z")

# Writable stores open in this process, by root: DuckDB lets one process open a file twice, but
# two writers would hand out the same versions and delete each other's files in flight.
_OPEN: "weakref.WeakValueDictionary[str, Store]" = weakref.WeakValueDictionary()
_OPEN_LOCK = threading.Lock()


class _Txn:
    """Files to delete when the surrounding transaction ends: new ones on rollback, replaced
    ones on commit."""

    def __init__(self, external: bool) -> None:
        self.external = external  # joined a transaction the user began: we neither commit nor undo
        self.created: list[str] = []
        self.retired: list[str] = []


class Store:
    """A tensordb database. ``Store()`` is in memory (payloads in a temporary directory)."""

    def __init__(self, path: str | os.PathLike | None = None, *, read_only: bool = False) -> None:
        self.read_only = read_only
        self.closed = True
        self._lock = threading.RLock()
        self._txn: _Txn | None = None
        # Catalog reads are cached: metadata by lower-cased name (None: no such tensor), tile
        # entries by version (a version's tiles never change). Writes keep both exact; a rolled
        # back transaction clears them.
        self._cache: dict[str, TensorMeta | None] = {}
        self.user_transaction = False  # a transaction begun with SQL (con.sql("BEGIN")) is open
        self._entries: dict[int, tuple] = {}
        self._views: set[str] = set()
        if path is None:
            if read_only:
                raise ProgrammingError("an in-memory database cannot be opened read-only")
            self.root = Path(tempfile.mkdtemp(prefix="tensordb-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.root), True)
            self.persistent = False
            self.duck = self._connect(":memory:")
            # DuckDB spills big sorts (COO loads) to ./.tmp by default; keep them in our directory.
            self.duck.execute(f"SET temp_directory = {quote_str(str(self.root / 'spill'))}")
        else:
            self.root = Path(os.fspath(path)).expanduser().absolute()
            self._cleanup = None
            self.persistent = True
            self._check_root()
            self._claim()
            try:
                self.duck = self._connect(str(self.root / CATALOG_FILE))
            except BaseException:
                self._release()
                raise
        # Power-loss safety for payloads costs one fsync per tensor; an in-memory db has no use.
        self.fsync = self.persistent
        self.tiles_dir = str(self.root / TILES_DIR)
        try:
            with translating(f"cannot open database {self.root}"):
                self.duck.execute("SET enable_progress_bar = false")  # a library prints nothing
                self._duck_memory_default = self.duck.execute(
                    "SELECT current_setting('memory_limit')").fetchall()[0][0]
                if not read_only:
                    self._check_catalog()
                    catalog.create(self.duck)  # also adds columns an older catalog lacks
                elif not catalog.exists(self.duck):
                    raise OperationalError(f"{self.root} holds no tensordb catalog")
                # Columns added after the first release that this catalog has: a read-only open
                # of an older database cannot add them, and reads them as NULL (not known).
                self._optional = frozenset(c for c in ("crc32", "nonfinite")
                                           if catalog.has_column(self.duck, "tiles", c))
                self.nonfinite_column = "nonfinite" if "nonfinite" in self._optional \
                    else "NULL::BOOLEAN"
            if not read_only:
                os.makedirs(self.tiles_dir, exist_ok=True)
                remove_leftover_runs(self.root)  # spill files of a killed run (spilldir.py)
            self.closed = False
            self._next_version = self._start_version()
        except BaseException:
            self.close()
            raise

    # -- opening -------------------------------------------------------------------------------
    def _check_root(self) -> None:
        root = self.root
        if root.exists() and not root.is_dir():
            raise OperationalError(f"cannot open database {root}: it is a file, not a database "
                                   "directory", hint="a tensordb database is a directory holding "
                                   f"{CATALOG_FILE} and {TILES_DIR}/")
        if not root.exists():
            if self.read_only:
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

    def _check_catalog(self) -> None:
        """Refuse a catalog file without the tensordb tables (replaced, or emptied) while payload
        files exist: creating fresh tables would make every payload look like an orphan."""
        if catalog.exists(self.duck) or not os.path.isdir(self.tiles_dir):
            return
        payloads = os.listdir(self.tiles_dir)
        if payloads:
            raise OperationalError(
                f"cannot open database {self.root}: {self.root / CATALOG_FILE} holds no tensordb "
                f"catalog, but {TILES_DIR}/ holds {len(payloads)} payload file(s)",
                hint=f"restore the database's own {CATALOG_FILE}; nothing was changed or deleted")

    def _claim(self) -> None:
        key = str(self.root.resolve())
        with _OPEN_LOCK:
            other = _OPEN.get(key)
            if other is not None and not other.closed:
                gc.collect()  # an unreachable connection may still be waiting for collection
                other = _OPEN.get(key)
            if other is not None and not other.closed and not (other.read_only and self.read_only):
                raise OperationalError(
                    f"database {self.root} is already open in this process",
                    hint="close the other connection first (one writer per database)")
            if not self.read_only:
                _OPEN[key] = self

    def _release(self) -> None:
        with _OPEN_LOCK:
            key = str(self.root.resolve())
            if _OPEN.get(key) is self:
                del _OPEN[key]

    def _connect(self, target: str):
        try:
            return duckdb.connect(target, read_only=self.read_only)
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" in text.lower():
                pid = re.search(r"PID (\d+)", text)
                who = f"process {pid.group(1)}" if pid else "another process"
                mode = _holder_mode(target, pid.group(1) if pid else None)
                if mode is None:  # only a writer keeps a reader out; a writer is kept out by any
                    mode = "open for writing" if self.read_only else "open"
                hint = "a database has one writer at a time; close the other connection " \
                    "(readers may share it with read_only=True when nobody writes)"
                if mode == "open read-only":
                    hint = "a database has one writer at a time, and none while another " \
                        "process reads it: close the reader, or open this one read_only=True too"
                raise OperationalError(f"database {self.root} is locked: {who} has it {mode}",
                                       hint=hint) from None
            if "not a valid DuckDB database" in text:
                raise OperationalError(f"cannot open database {self.root}: {CATALOG_FILE} is not a "
                                       "DuckDB database file") from None
            raise translate(exc, f"cannot open database {self.root}") from None
        except duckdb.Error as exc:
            raise translate(exc, f"cannot open database {self.root}") from None

    def _start_version(self) -> int:
        """Delete unreferenced payload files (crash leftovers) and pick the next version.

        A file goes only when the catalog, read without error, proves it unreferenced: no tile
        row names it and no tensor row has its version (so a damaged tiles table cannot make a
        live tensor's payload look orphaned). Directories are never ours: they stay."""
        with translating("cannot read the catalog"):
            newest = catalog.max_version(self.duck)
            keep = catalog.referenced_files(self.duck) if not self.read_only else set()
            live = catalog.versions(self.duck) if not self.read_only else set()
        if not os.path.isdir(self.tiles_dir):
            return newest + 1  # read-only, before any tensor was written
        for entry in os.scandir(self.tiles_dir):
            m = _PAYLOAD.match(entry.name)
            if m:
                newest = max(newest, int(m.group(1)))
            if self.read_only or entry.name in keep or (m and int(m.group(1)) in live):
                continue
            if entry.is_dir(follow_symlinks=False):
                continue
            _remove(entry.path)
        return newest + 1

    def close(self) -> None:
        """Close the catalog; an in-memory database's payload files are deleted."""
        with self._lock:
            if getattr(self, "duck", None) is not None:
                try:
                    if self._txn is not None and not self._txn.external:
                        self.duck.execute("ROLLBACK")
                    self.duck.close()
                except duckdb.Error:
                    pass
                self.duck = None
            self._txn = None
            self.closed = True
            if self.persistent:
                self._release()
            elif self._cleanup is not None:
                self._cleanup()

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
                with translating():
                    self._cache[key] = catalog.find(self.duck, name)
            return self._cache[key]

    def forget_cached(self) -> None:
        """Drop cached catalog reads (after SQL that may have changed the catalog)."""
        with self._lock:
            self._cache.clear()
            self._entries.clear()

    def query(self, sql: str) -> list[tuple]:
        """Run SQL on the catalog connection itself (so it sees the writes of an open
        transaction block); the engine's tile joins go through here."""
        self._check_open()
        with self._lock, translating():
            return self.duck.execute(sql).fetchall()

    def open(self, name: str) -> TensorReader:
        """A reader for the current version of ``name``."""
        meta = self.meta(name)
        with self._lock:
            hit = self._entries.get(meta.version)
            if hit is None:
                with translating():
                    hit = catalog.tile_entries(self.duck, meta, self._optional)
                if len(self._entries) > 256:
                    self._entries.clear()
                self._entries[meta.version] = hit
            file, entries = hit
        return TensorReader(meta, os.path.join(self.tiles_dir, file) if file else None, entries)

    # -- writing -------------------------------------------------------------------------------
    def writer(self, name: str, shape: Sequence[int], dtype, grid, dims: Sequence[str] | None = None,
               replace: bool = False) -> TensorWriter:
        """A writer for a new tensor (or a new version of ``name`` when ``replace``).

        ``grid`` is one tuple of boundaries per dimension, or a tile shape (one int each)."""
        self._check_open(writing=True)
        check_name(name)
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ProgrammingError(f"tensor '{name}': negative extent in shape {shape}")
        dtype = supported_dtype(dtype, f"tensor '{name}'")
        dtype = np.dtype(dtype.name)  # native byte order
        grid = check_grid(grid, shape, name)
        dims = check_dims(dims, len(shape), name)
        self.check_free(name, replace)
        with self._lock:
            version = self._next_version
            self._next_version += 1
        return TensorWriter(self, name, shape, dtype, grid, dims, replace, version)

    def check_free(self, name: str, replace: bool) -> None:
        """CatalogError unless ``name`` may be created (or replaced, when ``replace``)."""
        with self._lock:
            if not replace and self.has(name):
                raise CatalogError(f"tensor '{self.meta(name).name}' already exists",
                                   hint="pass replace=True to overwrite it")
            with translating():
                table = catalog.table_named(self.duck, name)
            if table is not None:
                raise CatalogError(f"cannot create tensor '{name}': a table named '{table}' exists",
                                   hint="tensors and tables share one namespace")

    def _commit_writer(self, w: TensorWriter) -> TensorMeta:
        meta = w.meta()
        entries = sorted(w.entries.values(), key=lambda e: e.offset)
        # The lock spans the whole swap: no other thread's commit can interleave with it.
        with self._lock, self.transaction() as txn:
            if w.has_file:
                txn.created.append(w.path)
            self.check_free(w.name, w.replace)
            old = self._find(w.name)
            with translating(f"cannot store tensor '{w.name}'"):
                if old is not None:
                    self._retire(old, txn)
                catalog.insert(self.duck, meta, w.file, entries)
            self._cache.pop(w.name.lower(), None)
        return meta

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
            self._cache.pop(name.lower(), None)
        self._forget_view(old.name)

    def _retire(self, old: TensorMeta, txn: _Txn) -> None:
        file, _ = catalog.tile_entries(self.duck, old, self._optional)
        catalog.delete(self.duck, old)
        if file:
            txn.retired.append(os.path.join(self.tiles_dir, file))

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
            if joined is None:
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
                self._cache.clear()
                if not txn.external:
                    with contextlib.suppress(duckdb.Error):
                        self.duck.execute("ROLLBACK")
                    for path in txn.created:
                        _remove(path)
            raise
        with self._lock:
            self._txn = None
            if txn.external:
                self._cache.clear()  # the user's own COMMIT or ROLLBACK decides what lands
                return  # files are reconciled when the database is next opened
            try:
                self.duck.execute("COMMIT")
            except duckdb.Error as exc:
                with contextlib.suppress(duckdb.Error):
                    self.duck.execute("ROLLBACK")
                for path in txn.created:
                    _remove(path)
                raise translate(exc, "commit failed") from None
            for path in txn.retired:
                _remove(path)

    # -- SQL views of tensors (see relations.py) -----------------------------------------------
    def _register_view(self, name: str, obj) -> None:
        with self._lock, translating():
            self.duck.register(name, obj)
            self._views.add(name)

    def _forget_view(self, name: str) -> None:
        with self._lock:
            for view in [v for v in self._views if v.lower() == name.lower()]:
                self._views.discard(view)
                with contextlib.suppress(duckdb.Error):
                    self.duck.unregister(view)


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


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
