"""Catalog rows kept back in an in-memory database: a training step's commit without DuckDB.

A DuckDB statement costs 0.2-0.5 ms whatever it does, and giving a tensor a new version takes
two (its ``tensors`` row, its ``tiles`` rows) inside a BEGIN ... COMMIT: a small training step
spent 1.5-4 ms of its 3-9 ms there. In an in-memory database nothing has to be durable and no
other process reads the catalog, so a transaction of the store (``Store.transaction``) does
not begin in DuckDB until something reads or writes the catalog connection (``Store.duck``),
and a commit that only gives existing tensors new versions (``commit``) lands in the store's
caches, which answer every lookup of the engine, with its rows kept in the transaction
(``_Txn.deferred``). When the transaction ends without having begun in DuckDB, its rows join
the store's ``_pending`` (``land``); the next use of ``Store.duck``, by SQL or by the code of
this package, writes them first (``flush``): a tensor replaced many times since is then one
row swap, from the version DuckDB holds to the newest. A transaction that began in DuckDB
writes its kept rows into it then (so what it reads holds them) and commits or rolls back as
before; one that fails before that drops them with the caches (``Store._clear_cache``).

On disk (redolog.py) the same commit is durable when it returns: ``land`` first appends the
transaction's rows to the database's redo log as one record and fdatasyncs it (after the
payloads' syncs, before any replaced payload is retired); ``flush`` writes the pending rows to
DuckDB and then empties the log, at the next use of ``Store.duck``, before a snapshot is
published for readers of other processes, at ``close``, and when the log passes its bound.
A transaction of several commits lands (and logs its rows) once, when its outermost block ends.
A Ctrl-C from before the record's append until the commit is recorded is held and raised after
(``Store._end``, ``_duck.held_interrupt``); a flush that fails keeps its rows pending (they are
in the log), and the snapshot publisher's flush writes them on its own cursor.
"""
from __future__ import annotations

import contextlib
import os

import duckdb

from ..errors import OperationalError
from . import catalog
from ._duck import held_interrupt, translating
from .meta import TensorMeta
from .verify import mark_written

__all__ = ["commit", "flush", "flush_pending", "land"]


def _merge(into: dict, rows) -> None:
    """Rows ``(old, meta, file, entries)`` into ``into`` (lower-cased name -> row): a name
    there already keeps the old version it had (the one DuckDB holds)."""
    for old, meta, file, entries in rows:
        key = meta.name.lower()
        base = into[key][0] if key in into else old
        into[key] = (base, meta, file, entries)


def flush_pending(store, cursor=None) -> None:
    """Write the rows ``land`` kept back (in a transaction of their own) and, on disk, empty
    the redo log that held them. On an error writing them they stay pending and
    OperationalError says so; on one emptying the log (its rows are DuckDB's now) too.
    ``cursor``: a connection of the catalog's own to write them on (the snapshot publisher's,
    in its thread: a user's relation, which runs on the store's connection without the lock,
    then cannot run inside this transaction, nor spoil it by failing)."""
    with store._lock:
        if store._conn is None:
            return
        conn = store._conn if cursor is None else cursor
        pending, store._pending = store._pending, {}
        if pending:
            try:
                with held_interrupt():  # a Ctrl-C: after the COMMIT, or never in the middle
                    conn.execute("BEGIN TRANSACTION")
                    catalog.store(conn, list(pending.values()))
                    conn.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(duckdb.Error):
                    conn.execute("ROLLBACK")
                store._pending = {**pending, **store._pending}  # still in the log: kept
                if not isinstance(exc, duckdb.Error):
                    raise
                raise OperationalError(
                    "cannot write the catalog rows of tensor(s) " + ", ".join(
                        repr(m.name) for _, m, _, _ in pending.values())
                    + f", stored earlier: {exc}") from None
        redo = store.redo
        if redo is not None and redo.dirty:
            try:
                redo.clear()  # a crash before this: replay finds DuckDB holding the rows
            except OSError as exc:
                raise OperationalError(f"cannot empty the redo log {redo.path} (its rows are "
                                       f"in the catalog): {exc.strerror or exc}") from None


def flush(store) -> None:
    """Write the rows ``land`` kept back (``flush_pending``), then begin the store's open
    transaction in DuckDB if it has not begun, with the rows it kept (so what runs in it sees
    them)."""
    with store._lock:
        conn = store._conn
        if conn is None:
            return
        flush_pending(store)
        txn = store._txn
        if txn is not None and not txn.begun:
            txn.begun = True
            try:
                conn.execute("BEGIN TRANSACTION")
            except duckdb.TransactionException:
                txn.external = True  # the user began one: its COMMIT decides
            rows, txn.deferred = list(txn.deferred.values()), {}
            if rows:
                with translating("cannot store tensor(s) " + ", ".join(
                        repr(r[1].name) for r in rows)):
                    catalog.store(conn, rows)


def land(store, txn) -> None:
    """A transaction that never began in DuckDB commits: its kept rows join the pending
    ones (written by the next ``flush``). On disk they are first one record of the redo log,
    durable when this returns (OperationalError, with ``undone``, when it cannot be: the
    commit did not land); a log past its bound is written to DuckDB at once."""
    if store.persistent and txn.deferred and store.redo is not None:
        store.redo.append(list(txn.deferred.values()))
    _merge(store._pending, txn.deferred.values())
    txn.deferred = {}
    if store.persistent and store.redo is not None and store.redo.full:
        with contextlib.suppress(OperationalError):  # durable all the same: flushed later
            flush_pending(store)


def commit(store, items, txns: list | None = None) -> list[TensorMeta] | None:
    """Commit writers ``(writer, durable)`` of distinct names that all give existing tensors
    new versions, in a transaction that has not begun in DuckDB (the open one, or one of their
    own; on disk its rows are logged when it lands): their rows are kept in it; the caches,
    the payload files and the transaction's lists are as ``Store._swap_rows`` leaves them. None when it cannot
    (the caller writes the rows). The transaction the rows went into is appended to ``txns``
    (as ``_swap_rows`` does): should anything after its landing raise (a Ctrl-C while the
    replaced payloads are retired), the caller then knows the payloads are the catalog's."""
    if not all(w.replace for w, _ in items):
        return None
    if store.persistent and (store.redo is None or store.redo.broken or
                             store.objects is not None):
        return None  # an object store's payloads are uploaded at commit: today's path (and
        # after a failed append, until the log is emptied: DuckDB's, which flushes it first)
    with store._lock:
        txn = store._txn
        if store.user_transaction or (txn is not None and (txn.begun or txn.external)):
            return None
        olds = [store._find(w.name) for w, _ in items]
        if any(old is None for old in olds):
            return None
        # the replaced versions' payload files (retired as spares once the commit lands)
        files = []
        for old in olds:
            hit = store._entries.get(old.version)
            if hit is None:
                return None  # its file is known to the catalog only: write the rows
            files.append(hit[0])
        with store.transaction() as txn:
            if txn.begun:  # the catalog was read meanwhile
                return None
            rows = [(w, w.meta(), sorted(w.entries.values(), key=lambda e: e.offset))
                    for w, _ in items]
            for w, durable in items:
                if w.has_file:
                    txn.created.append(w.path)
            for w, durable in items:
                try:
                    durable()
                except OSError as exc:
                    raise OperationalError(f"cannot store tensor '{w.name}': syncing {w.path} "
                                           f"failed: {exc.strerror or exc}") from None
            if txns is not None:
                txns.append(txn)  # its rows are in it from here: they land if it commits
            _merge(txn.deferred, [(old, meta, w.file, entries)
                                  for old, (w, meta, entries) in zip(olds, rows)])
            for old, file in zip(olds, files):
                if file:
                    txn.retired.append((os.path.join(store.tiles_dir, file), True))
                txn.gone.append(old)
            for w, meta, entries in rows:
                store._forget(w.name)
                txn.replaced.append(w.name)
                store._cache[w.name.lower()] = meta
                txn.stored.append(meta)
                if len(store._entries) > 1024:
                    store._entries.clear()
                store._entries[meta.version] = (w.file if entries else None, entries)
                if entries:
                    store._keep_written(w, meta, entries, mark_written(w.path, entries))
        return [meta for _, meta, _ in rows]
