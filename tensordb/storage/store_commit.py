"""The writes of a ``Store`` (a mixin ``Store`` inherits): writers of new tensors and versions,
the commit that swaps their catalog rows in (one transaction for several writers), drops, and the
transaction itself (``_Txn``: the payload files to delete when it ends, new ones on rollback,
replaced ones on commit, and what its commit listeners are told).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Sequence

import duckdb
import numpy as np

from ..errors import CatalogError, Error, OperationalError, ProgrammingError
from . import catalog, deferred, directory, objectdb
from ._duck import held_interrupt, translate, translating
from .directory import remove as _remove
from .meta import TensorMeta, check_dims, check_fill, check_grid, check_name, supported_dtype
from .verify import mark_written
from .writer import TensorWriter

__all__ = ["StoreCommits"]


class _Block:
    """``Store.transaction()``: entering begins the store's transaction or joins the one open;
    leaving the outermost block commits it (or, on an exception, rolls it back)."""

    __slots__ = ("store", "txn", "joined")

    def __init__(self, store) -> None:
        self.store = store

    def __enter__(self) -> "_Txn":
        self.txn, self.joined = self.store._begin()
        return self.txn

    def __exit__(self, kind, exc, tb) -> bool:
        if not self.joined:
            if kind is not None:
                self.store._abort(self.txn)
            else:
                self.store._end(self.txn)
        return False


class _Txn:
    """Files to delete when the surrounding transaction ends: new ones on rollback, replaced
    ones on commit."""

    def __init__(self, external: bool) -> None:
        self.external = external  # joined a transaction the user began: we neither commit nor undo
        self.created: list[str] = []
        self.retired: list[tuple[str, bool]] = []  # (path, may be kept as a spare)
        self.committed = False  # our COMMIT landed: what it references is the catalog's now
        self.replaced: list[str] = []  # tensors given new versions: their SQL views follow
        self.uploaded: list[str] = []  # payload objects put (objects.py): gone on rollback
        self.stored: list[TensorMeta] = []  # versions written, and versions replaced or dropped:
        self.gone: list[TensorMeta] = []    # told to the commit listeners once COMMIT lands
        # In memory (deferred.py): whether BEGIN has run in DuckDB (it waits for the first use
        # of the catalog connection), and the rows of the commits kept back until then.
        self.begun = True
        self.deferred: dict[str, tuple] = {}


def _check_writer(name, shape, dtype, grid, dims, fill) -> tuple:
    """A writer's arguments checked and made canonical: (shape, dtype, grid, dims, fill)."""
    check_name(name)
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ProgrammingError(f"tensor '{name}': negative extent in shape {shape}")
    dtype = supported_dtype(dtype, f"tensor '{name}'")
    dtype = np.dtype(dtype.name)  # native byte order
    grid = check_grid(grid, shape, name)
    dims = check_dims(dims, len(shape), name)
    return shape, dtype, grid, dims, check_fill(fill, dtype, name)


# (name, shape, dtype, grid, dims, fill as written) -> what _check_writer made of them: the
# checks depend on nothing else
_CHECKED: dict[tuple, tuple] = {}


class StoreCommits:
    """Writing, committing and dropping tensors (state set up by ``Store.__init__``)."""

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
        shape, dims = tuple(shape), None if dims is None else tuple(dims)
        try:  # the arguments of a repeated output (a training step's weights) checked once
            key = (name, shape, dtype, grid, dims, repr(fill))
            checked = _CHECKED.get(key)
        except TypeError:  # unhashable: checked each time
            key = checked = None
        if checked is None:
            checked = _check_writer(name, shape, dtype, grid, dims, fill)
            if key is not None:
                if len(_CHECKED) >= 256:
                    _CHECKED.clear()
                _CHECKED[key] = checked
        shape, dtype, grid, dims, fill = checked
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
                    metas = [m for item in items for m in self._swap_rows([item], txns)]
            else:
                metas = deferred.commit(self, items, txns)  # in memory: the rows kept back
                if metas is None:
                    metas = self._swap_rows(items, txns)
            # marked here, not by the caller once this returns: a Ctrl-C in between would
            # have its ``commit_all`` delete payloads that a landed commit names
            for w, _ in items:
                w._state = "committed"
            return metas
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
                if self.objects is not None and w.has_file:  # uploaded whole, then COMMIT
                    txn.uploaded.extend(w.payload_objects())
                    w.upload()  # its parts completed (objparts.py), or its file put whole
            for w, meta, entries in rows:
                self._forget(w.name)
                txn.replaced.append(w.name)
                self._cache[w.name.lower()] = meta  # exact: the rows just inserted
                txn.stored.append(meta)
                if len(self._entries) > 1024:
                    self._entries.clear()
                self._entries[meta.version] = (w.file if entries else None, entries)
                if entries and self.objects is None:
                    # checksummed from these bytes (verify.py)
                    self._keep_written(w, meta, entries, mark_written(w.path, entries))
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
        if self.objects is not None:  # a version Dask workers wrote in parts: every part
            files = sorted({e.file or hit[0] for e in hit[1]}) if hit is not None and \
                hit[0] else catalog.payload_files(self.duck, old)
        else:
            file = hit[0] if hit is not None else catalog.payload_file(self.duck, old)
            files = [file] if file else []
        for file in files:
            txn.retired.append((os.path.join(self.tiles_dir, file), spare))

    def transaction(self) -> "_Block":
        """Group writer commits and drops: all of them land, or none does. Nested blocks join
        the outermost one. The store lock is not held across the block: worker threads may read
        the catalog meanwhile (they see the block's uncommitted changes, as DuckDB does). (A
        context manager class, not a generator: a call enters several nested blocks.)
        BEGIN waits for the first use of ``duck`` in memory, and on disk where commits are
        logged (deferred.py: a transaction whose rows all go to the redo log never begins in
        DuckDB)."""
        return _Block(self)

    def _begin(self) -> tuple[_Txn, bool]:
        """The transaction a block enters, and whether it joined one open already."""
        self._check_open(writing=True)
        if self.user_transaction:
            raise ProgrammingError(
                "a transaction begun with SQL BEGIN is open: tensordb writes run in transactions "
                "of their own", hint="COMMIT or ROLLBACK it first, or group tensordb statements "
                "in the dialect's BEGIN ... COMMIT")
        with self._lock:
            joined = self._txn
            if joined is not None:
                return joined, True
            if not self.persistent or self.redo is not None:
                txn = _Txn(external=False)  # begins in DuckDB at the first use (deferred.py)
                txn.begun = False
            else:
                try:
                    self.duck.execute("BEGIN TRANSACTION")
                    txn = _Txn(external=False)
                except duckdb.TransactionException:
                    txn = _Txn(external=True)  # the user began one: its COMMIT decides
                except duckdb.Error as exc:
                    raise translate(exc) from None
            self._txn = txn
        return txn, False

    def _abort(self, txn: _Txn) -> None:
        """The outermost block of ``txn`` ended by an exception: nothing of it lands."""
        with self._lock:
            self._txn = None
            self._clear_cache()
            if not txn.external:
                if txn.begun:
                    with contextlib.suppress(duckdb.Error):
                        self._conn.execute("ROLLBACK")
                self._remove_created(txn)

    def _end(self, txn: _Txn) -> None:
        """The outermost block of ``txn`` ended: commit it, then retire the replaced files.
        A Ctrl-C is held from before the commit point (DuckDB's COMMIT, or the redo record's
        append) until all of this is done, then raised (``held_interrupt``): one that came
        after the commit point and before the process recorded the commit would have left a
        durable commit that the process had forgotten (and its writers' payloads deleted)."""
        with held_interrupt(), self._lock:
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
                self._clear_cache()  # as _abort: no reader of what did not land is kept
                with contextlib.suppress(duckdb.Error):
                    self._conn.execute("ROLLBACK")
                self._remove_created(txn)
                raise translate(exc, "commit failed") from None
            except OperationalError as exc:  # the redo log's record could not be written
                self._clear_cache()
                if getattr(exc, "undone", False):  # else a record may name them: kept
                    self._remove_created(txn)  # (the next open's sweep knows)
                raise
            except BaseException as exc:  # a Ctrl-C inside the log's append: as a failed one
                if getattr(exc, "undone", None) is None:
                    raise
                self._clear_cache()
                if exc.undone:
                    self._remove_created(txn)
                raise
            if self.publisher is not None:
                try:  # numbered before a retired file goes: a reader that comes now waits
                    self.publisher.committed()  # for the snapshot without it
                except OSError:  # committed: what was retired waits for the next open
                    txn.retired = []
            for path, spare in txn.retired:  # a replaced payload may be reused; a dropped one goes
                try:
                    if self.objects is not None:
                        self.objects.delete(os.path.basename(path))
                    elif self.publisher is None:
                        self.spares.retire(path, keep=spare)
                    else:  # or waits while a reader of another process may still read it
                        self.publisher.retire(path, spare, self.spares)
                except (OSError, Error):  # committed: what is left is reconciled at the next open
                    if not self.persistent and self.objects is None:
                        self._strays.append(path)  # an in-memory one has none: the next commit
            if self._strays and not self.persistent and self.objects is None:
                self._reclaim_strays()
            if self.publisher is not None:
                self.publisher.collect()  # what waited for readers that have moved on or gone
            for file in txn.uploaded:  # the staging files of what is in the object store now
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.tiles_dir, file))
            self._let_readers_go(txn.gone)
            self._refresh_views(txn.replaced)
            self._tell_listeners(txn.stored, txn.gone)

    def _reclaim_strays(self) -> None:
        """Retire again the payloads of an in-memory database whose retire failed (an error,
        an interrupt in a thread where none is held), each only once the catalog proves it
        unreferenced (``directory.unreferenced``); one that fails again waits for the next
        commit. (On disk the next open's sweep deletes them.)"""
        strays, self._strays = self._strays, []
        try:
            gone = set(directory.unreferenced(self.duck, strays))
        except duckdb.Error:  # proves nothing: kept for the next commit
            self._strays = strays
            return
        for path in strays:
            if path not in gone:
                continue  # referenced again (never, versions are not reused): not ours to delete
            try:
                self.spares.retire(path, keep=False)
            except (OSError, Error):
                self._strays.append(path)

    def _tell_listeners(self, stored, gone) -> None:
        for listener in list(self.commit_listeners):
            try:
                listener(stored, gone)
            except Exception:  # noqa: BLE001 - committed all the same; a cache is no record
                pass

    def _remove_created(self, txn: _Txn) -> None:
        """Delete the payload files of a transaction that did not commit, each only once the
        catalog proves it unreferenced: should the catalog name one (its rows committed some
        other way), it stays. A catalog that cannot be read proves nothing; the files are then
        left to the sweep at the next open for writing."""
        try:
            unreferenced = directory.unreferenced(self.duck, txn.created)
            objects = objectdb.unreferenced(self.duck, txn.uploaded) if txn.uploaded else []
        except (duckdb.Error, OperationalError):
            return
        for path in unreferenced:
            _remove(path)
        for file in objects:
            with contextlib.suppress(Error):
                self.objects.delete(file)
