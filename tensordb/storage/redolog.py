"""The redo log of an on-disk database: a commit's kept-back catalog rows, durable without DuckDB.

DuckDB costs an on-disk commit four statements and a COMMIT (UPDATE ``tensors``, DELETE and
INSERT ``tiles``, the WAL's fdatasync): 2.5-3.3 ms of a 14.7 ms SSSP step. A commit that only
gives existing tensors new versions (deferred.py) instead appends its rows to
``<root>/catalog.redo`` as one record and fdatasyncs it (0.1-0.5 ms), after its payloads are
durable; the rows then wait in the store, as in memory, until the next use of the catalog
connection (or ``close``, or the log passing ``MAX_RECORDS``/``MAX_BYTES``) writes them in one
DuckDB transaction and empties the log (``flush``).

A record is ``magic (4 bytes) | length (u32) | crc32 of the body (u32) | body``, little-endian;
the body is UTF-8 JSON (self-describing; never pickle): a list of rows ``{"old": meta,
"meta": meta, "file": name, "entries": [...]}``. Opening the database replays the valid prefix
(``replay``): a record cut short or with a bad checksum is a commit that never returned (its
writer died inside ``append``), dropped with everything after it; one followed by a valid
record is damage, not a torn append: OperationalError, the log kept (``read``). Replay is idempotent: a row
applies only where the catalog holds exactly the version it replaced, so a log whose rows
DuckDB already holds (a crash after the flush's COMMIT, before the log was emptied) changes
nothing. docs/storage.md, "The durable steps of a commit".
"""
from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np

from ..errors import OperationalError
from . import catalog
from .meta import TensorMeta
from .reader import TileEntry

__all__ = ["LOG_FILE", "ENABLED", "RedoLog", "read", "apply", "replay", "MAX_RECORDS",
           "MAX_BYTES"]

LOG_FILE = "catalog.redo"
MAGIC = b"TDR1"
_HEAD = struct.Struct("<4sII")
ENABLED = True  # read at each open for writing: False keeps every commit's rows in DuckDB
MAX_RECORDS = 256  # a log this long (or this large) is written to DuckDB at the next commit
MAX_BYTES = 4 << 20


# -- the encoding ---------------------------------------------------------------------------------
def _meta_out(m: TensorMeta) -> dict:
    return {"name": m.name, "version": m.version, "dtype": m.dtype.name, "shape": list(m.shape),
            "dims": list(m.dims), "grid": [list(b) for b in m.grid], "nbytes": m.nbytes,
            "tile_count": m.tile_count, "nnz": m.nnz, "density": m.density, "fill": m.fill}


def _meta_in(d: dict) -> TensorMeta:
    return TensorMeta(str(d["name"]), int(d["version"]), np.dtype(d["dtype"]),
                      tuple(int(n) for n in d["shape"]), tuple(str(x) for x in d["dims"]),
                      tuple(tuple(int(n) for n in b) for b in d["grid"]), int(d["nbytes"]),
                      int(d["tile_count"]), int(d["nnz"]), float(d["density"]),
                      float(d["fill"]))


def _entry_out(e: TileEntry) -> list:
    return [list(e.coords), list(e.starts), list(e.shape), e.offset, e.nbytes, e.nnz, e.crc32,
            e.nonfinite, e.format, e.file]


def _entry_in(x: list) -> TileEntry:
    c, s, sh, o, nb, nz, crc, nf, fmt, f = x
    return TileEntry(tuple(c), tuple(s), tuple(sh), int(o), int(nb), int(nz),
                     None if crc is None else int(crc), None if nf is None else bool(nf),
                     str(fmt), None if f is None else str(f))


def encode(rows) -> bytes:
    """One record of rows ``(old, meta, file, entries)``: header and body."""
    body = json.dumps([{"old": _meta_out(old), "meta": _meta_out(meta), "file": file,
                        "entries": [_entry_out(e) for e in entries]}
                       for old, meta, file, entries in rows],
                      separators=(",", ":")).encode()
    return _HEAD.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _decode(body: bytes) -> list[tuple]:
    return [(_meta_in(r["old"]), _meta_in(r["meta"]), r["file"],
             [_entry_in(e) for e in r["entries"]]) for r in json.loads(body)]


def read(path: str) -> tuple[list[list[tuple]], int, int]:
    """``(records, valid bytes, file size)`` of the log at ``path``: the records of its valid
    prefix, each a list of rows; a missing log is empty."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], 0, 0
    records, at = [], 0
    while at + _HEAD.size <= len(data):
        magic, length, crc = _HEAD.unpack_from(data, at)
        body = data[at + _HEAD.size: at + _HEAD.size + length]
        if magic != MAGIC or len(body) != length or zlib.crc32(body) != crc:
            break
        try:
            records.append(_decode(body))
        except (ValueError, KeyError, TypeError):
            break
        at += _HEAD.size + length
    if at < len(data):
        _check_tail(path, data, at, len(records))
    return records, at, len(data)


def _valid_at(data: bytes, at: int) -> bool:
    """Whether a whole record with a good checksum starts at ``at``."""
    if at + _HEAD.size > len(data):
        return False
    magic, length, crc = _HEAD.unpack_from(data, at)
    body = data[at + _HEAD.size: at + _HEAD.size + length]
    return magic == MAGIC and len(body) == length and zlib.crc32(body) == crc


def _check_tail(path: str, data: bytes, at: int, count: int) -> None:
    """The bytes from ``at`` on are not a record. A torn append is the log's last record (an
    append that fails is cut back, or no append follows it): if a valid record follows, the
    log is damaged in the middle, and dropping the rest would lose commits that returned.
    OperationalError then, leaving the log as it is."""
    find = data.find(MAGIC, at + 1)
    while find >= 0:
        if _valid_at(data, find):
            raise OperationalError(
                f"the redo log {path} is damaged at byte {at} (record {count + 1}) and valid "
                f"records follow it at byte {find}: they are commits that returned, so tensordb "
                "does not drop them; keep a copy of the log and the database, and restore from "
                "a backup (or move the log aside to open the catalog without them)")
        find = data.find(MAGIC, find + 1)


# -- applying records to a catalog ----------------------------------------------------------------
def apply(duck, records) -> int:
    """Write the rows of ``records`` (in order) that the catalog ``duck`` does not hold yet,
    merged (a tensor replaced many times since is one row swap), in the caller's transaction.
    A row applies where the catalog holds exactly the version it replaced: one it holds
    already, or one whose tensor has moved on, is skipped. The number of rows written."""
    current: dict[str, TensorMeta | None] = {}
    merged: dict[str, tuple] = {}
    for rows in records:
        for old, meta, file, entries in rows:
            key = meta.name.lower()
            if key not in current:
                current[key] = catalog.find(duck, old.name)
            held = current[key]
            if held is None or held.version != old.version:
                continue
            base = merged[key][0] if key in merged else held
            merged[key] = (base, meta, file, entries)
            current[key] = meta
    if merged:
        catalog.store(duck, list(merged.values()))
    return len(merged)


def replay(duck, root: str) -> int:
    """At an open for writing: land the log's valid records in the catalog (one DuckDB
    transaction), then empty the log (a torn tail goes with it). The rows written."""
    path = os.path.join(root, LOG_FILE)
    records, _, size = read(path)
    if not size:
        return 0
    n = 0
    if records:
        duck.execute("BEGIN TRANSACTION")
        try:
            n = apply(duck, records)
            duck.execute("COMMIT")
        except BaseException:
            try:
                duck.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the error that brought us here says more
                pass
            raise
    _truncate_path(path)
    return n


def _truncate_path(path: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, 0)
        _sync(fd)
    finally:
        os.close(fd)


# -- the writer's log ------------------------------------------------------------------------------
def _write(fd: int, data: bytes, offset: int) -> None:
    """The record's bytes at ``offset`` (a function of its own: the crash tests tear it)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _sync(fd: int) -> None:
    os.fdatasync(fd) if hasattr(os, "fdatasync") else os.fsync(fd)


class RedoLog:
    """An open database's log file: ``append`` a commit's rows, ``clear`` once DuckDB holds them."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, LOG_FILE)
        existed = os.path.exists(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size  # replayed and emptied at open: 0
        self.records = 0
        self.broken = False  # a failed append could not be undone: no more appends until cleared
        if not existed:  # the new file's name durable before any record names a commit
            dfd = os.open(root, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    @property
    def dirty(self) -> bool:
        """Whether the log holds anything to write to DuckDB or to empty."""
        return bool(self.size) or self.broken

    @property
    def full(self) -> bool:
        return self.records >= MAX_RECORDS or self.size >= MAX_BYTES

    def append(self, rows) -> None:
        """One record of ``rows``, durable when this returns; OperationalError (with
        ``undone``: whether the log is as before for certain) when it cannot be."""
        if self.broken or self.fd < 0:
            exc = OperationalError(f"cannot write the redo log {self.path}: an earlier write "
                                   "failed and could not be undone")
            exc.undone = True  # nothing of this record was written
            raise exc
        data = encode(rows)
        try:
            _write(self.fd, data, self.size)
            _sync(self.fd)
        except BaseException as err:  # a Ctrl-C too: the record may be on disk, not counted
            undone = True
            try:
                os.ftruncate(self.fd, self.size)
                _sync(self.fd)
            except OSError:
                undone, self.broken = False, True
            if not isinstance(err, OSError):
                err.undone = undone  # the caller undoes the commit as for a failed write
                raise
            exc = OperationalError(f"cannot write the redo log {self.path}: "
                                   f"{err.strerror or err}")
            exc.undone = undone
            raise exc from None
        self.size += len(data)
        self.records += 1

    def clear(self) -> None:
        """Empty the log (its records are in DuckDB, committed); OSError when it cannot be."""
        if self.size or self.broken:
            os.ftruncate(self.fd, 0)
            _sync(self.fd)
        self.size, self.records, self.broken = 0, 0, False

    def close(self) -> None:
        """Close the file; an empty log is removed (a database closed cleanly holds none: an
        empty one a power loss brings back is harmless)."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
                if not self.size and not self.broken:
                    os.unlink(self.path)
            except OSError:
                pass
            self.fd = -1
