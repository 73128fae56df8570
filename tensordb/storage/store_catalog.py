"""The catalog reads of a ``Store`` (a mixin ``Store`` inherits): tensors' rows by name (cached,
one scan of ``tensors`` filling the cache), readers of their current versions (the tile entries
of several tensors read in one query, cached by version), SQL on the catalog connection, and the
accessors the SQL front door and the file formats use (the lock, the transaction's state, the
tensors shown to DuckDB as views).
"""
from __future__ import annotations

import contextlib
import os
import threading

import duckdb

from ..errors import CatalogError, Error, InterfaceError, ProgrammingError
from ..geometry import BoxName, GatherName, IotaName, OneHotName
from . import catalog
from ._duck import translating
from .boxes import BoxReader, GatherReader, IotaReader, OneHotReader
from .meta import TensorMeta
from .objreader import ObjectTensorReader
from .reader import TensorReader

__all__ = ["StoreCatalog", "KEPT_READERS"]

KEPT_READERS = 64  # readers of current versions kept between calls (``_reader``), at most


class StoreCatalog:
    """Reading the catalog, and the SQL views of tensors (state set up by ``Store.__init__``)."""


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
        self._let_readers_go()
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
        kept = self._open_kept(names)
        if kept is not None:
            return kept
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
            with self._lock:
                return {name: bases[name] if name not in boxes else self._box_reader(name, bases)
                        for name in names}
        # The versions looked up and their readers made under one hold of the lock, where a
        # commit retires what it replaced: a payload kept in memory (memfiles.py) is taken by
        # its reader when it is made, and must not be let go between the lookup and that.
        with self._lock:
            metas = {name: self.meta(name) for name in names}
            missing = [m for m in metas.values() if m.version not in self._entries]
            if missing:
                with translating():
                    read = catalog.tile_entries_many(self.duck, missing, self._optional)
                if len(self._entries) + len(read) > max(256, 2 * len(read)):
                    self._entries.clear()
                self._entries.update(read)
            hits = {name: self._entries[m.version] for name, m in metas.items()}
            if self.objects is not None:
                return {name: ObjectTensorReader(metas[name], file, entries, self.database,
                                                 self.objects)
                        for name, (file, entries) in hits.items()}
            return {name: self._reader(metas[name], file, entries)
                    for name, (file, entries) in hits.items()}

    def _open_kept(self, names) -> dict | None:
        """``open_many`` of plain names and slices whose readers are all kept for their
        current versions (a training step's data and its last weights), found under one lock
        without the general path's passes; None where any is not (the general path)."""
        self._check_open()
        if self.objects is not None:
            return None
        out = {}
        cache, readers, boxes = self._cache, self._kept_readers, self._kept_boxes
        with self._lock:
            for name in names:
                kind = type(name)
                if kind is str or kind is BoxName:
                    meta = cache.get((name if kind is str else name.base).lower())
                    if meta is None:
                        return None
                    reader = readers.get(meta.version)
                    if reader is None or reader.meta is not meta:
                        return None
                    if kind is BoxName:
                        reader = boxes.get((kind, name))
                        if reader is None or reader.base is not readers[meta.version]:
                            return None
                    out[name] = reader
                else:
                    return None
        return out

    def _reader(self, meta: TensorMeta, file, entries) -> TensorReader:
        """The reader of ``meta``'s version, kept between calls while that version is current
        (a training step reads its data and weights again each call): its payload's mapping,
        checksum checks and layout are made once. A commit that replaces or drops the version
        lets it go (``_let_readers_go``), and so does anything that clears the cached rows (a
        rollback, SQL that may have changed the catalog): no replaced payload stays mapped by
        it, so the spare-file reuse and the deletion of a dropped tensor's file are as before."""
        kept = self._kept_readers.get(meta.version)
        if kept is not None and (kept.meta is meta or kept.meta == meta):
            return kept
        reader = TensorReader(meta, os.path.join(self.tiles_dir, file) if file else None,
                              entries, self.database)
        if len(self._kept_readers) >= KEPT_READERS:
            self._kept_readers.clear()
        self._kept_readers[meta.version] = reader
        return reader

    def _keep_written(self, w, meta: TensorMeta, entries, ident) -> None:
        """A version just committed by writer ``w`` whose payload bytes it still holds in
        anonymous memory (``w.kept_bytes``: a small output of an in-memory database, staged):
        its reader is kept reading them (``TensorReader.preload``), so the next call does not
        open and map the new file. ``ident``: the file's identity (``verify.mark_written``)."""
        data = getattr(w, "kept_bytes", None)
        if data is None or ident is None or not entries or any(
                e.offset + e.nbytes > len(data) for e in entries):  # a tile written after them
            return
        reader = TensorReader(meta, w.path, entries, self.database).preload(data, ident)
        if len(self._kept_readers) >= KEPT_READERS:
            self._kept_readers.clear()
        self._kept_readers[meta.version] = reader

    def _box_reader(self, name, bases: dict):
        """The reader of a slice or a gather over the readers ``bases`` (by name), kept while it
        reads those very readers (kept ones: ``_reader``)."""
        base = bases[name.base]
        index = bases[name.index] if isinstance(name, GatherName) else None
        if self.objects is not None:  # an object store's readers are made each time
            return BoxReader(base, name.box, name) if index is None else \
                GatherReader(base, index, name)
        key = (type(name), name)
        kept = self._kept_boxes.get(key)
        if kept is not None and kept.base is base and getattr(kept, "index", None) is index:
            return kept
        reader = BoxReader(base, name.box, name) if index is None else \
            GatherReader(base, index, name)
        if len(self._kept_boxes) >= KEPT_READERS:
            self._kept_boxes.clear()
        self._kept_boxes[key] = reader
        return reader

    def _let_readers_go(self, gone=None) -> None:
        """Forget the kept readers of the versions ``gone`` (TensorMetas), and the slices and
        gathers that read them; or all of them."""
        if gone is None:
            self._kept_readers.clear()
            self._kept_boxes.clear()
            return
        versions = {meta.version for meta in gone}
        for v in versions:
            self._kept_readers.pop(v, None)
        for key, r in list(self._kept_boxes.items()):
            if r.base.meta.version in versions or (
                    getattr(r, "index", None) is not None and r.index.meta.version in versions):
                del self._kept_boxes[key]

    def _refresh_views(self, names) -> None:
        """The SQL views of tensors just given new versions read the new ones: a user's view
        (CREATE VIEW v AS SELECT ... FROM A) and a relation not fetched yet read a tensor as it
        is when they run, never a version replaced since."""
        if not self._views:  # none registered (a training loop's commits: 4 us a call)
            return
        from .views import TensorStream
        for name in names:
            for view in [v for v in self._views if v.lower() == name.lower()]:
                try:
                    self._register_view(view, TensorStream(self.open(name)))
                except Error:  # committed all the same: the next query names it again
                    self._forget_view(view)

    # -- what the SQL front door and the file formats use (sqlfront/, formats/) ----------------
    @property
    def lock(self) -> threading.RLock:
        """The lock every use of ``duck`` holds (``with store.lock, translating(): store.duck...``):
        the store's own catalog calls take it too."""
        return self._lock

    @property
    def holds_rows(self) -> bool:
        """Whether commits' catalog rows are held back (in memory; on disk, in the redo log), to
        be written before the catalog connection is next used (storage/deferred.py)."""
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
