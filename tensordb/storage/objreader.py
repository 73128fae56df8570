"""ObjectTensorReader: a TensorReader whose payload is an object (objects.py), read by byte range.

The tile API is the file reader's (``tile``, ``stored_tile``, ``read_box``, ``tiles``,
``to_numpy``): where that reader makes a view of its mapping, this one fetches the bytes of the
tiles asked for (one ranged GET per tile, or per run of adjacent tiles a box covers) and returns
a read-only array over them. The object is opened once per reader (one HEAD, which also gives the
identity: URL, ETag, size; the handle is kept per process, objects.py), and in a process the
reader was shipped to (a Dask worker) the prefix's ``database.id`` is checked first, once per
process. Every range fetched is checked against its tiles' CRC-32s (the CRC, about 1 ms per
16 MiB, costs little beside the request), then kept in this process's cache of ranges
(``RangeCache``, 256 MiB, least recently used first out; a range over a quarter of that is not
kept), so the tasks of one query that load the same tile fetch it once.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from ..errors import OperationalError
from .identity import process_label
from .objects import ObjectStore, part_start
from .reader import TensorReader, TileEntry
from .verify import verify_tile

__all__ = ["ObjectTensorReader", "RangeCache", "RANGE_CACHE_BYTES"]

RANGE_CACHE_BYTES = 256 << 20


class RangeCache:
    """Ranges fetched in this process, verified, least recently used first out, at most
    ``limit`` bytes: a query whose tasks load one input tile several times (a matmul's row tile
    for each column block) fetches it once, as a file's tiles are read once into the page
    cache. Objects are immutable, so a cached range is never stale while its object exists; a
    deleted object's ranges age out."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._items: "OrderedDict[tuple, bytes]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
            return data

    def put(self, key, data: bytes) -> None:
        if len(data) > self.limit // 4:  # a range this large would push out everything else
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = data
            self.bytes += len(data)
            while self.bytes > self.limit:
                _, old = self._items.popitem(last=False)
                self.bytes -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


_RANGES = RangeCache(RANGE_CACHE_BYTES)


class ObjectTensorReader(TensorReader):
    """Read access to one tensor version whose payload ``file`` lives in ``objects``."""

    def __init__(self, meta, file: str | None, entries: Sequence[TileEntry],
                 database: str | None, objects: ObjectStore) -> None:
        super().__init__(meta, objects.url_of(file) if file else None, entries, database)
        self.file = file  # the payload object; a version Dask workers wrote in parts has
        self.objects = objects  # several, named by its entries (TileEntry.file)
        self._handles: dict = {}

    def __getstate__(self):
        return {"meta": self.meta, "path": self.path, "entries": self.entries,
                "database": self.database, "file": self.file, "objects": self.objects}

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._handles = {}

    def with_entries(self, entries) -> "ObjectTensorReader":
        return ObjectTensorReader(self.meta, self.file, entries, self.database, self.objects)

    # -- the object ----------------------------------------------------------------------------
    def mapping(self):
        """The opened object (a random-access handle; there is no mapping)."""
        return self._handle(self.file)

    def _handle(self, file):
        handle = self._handles.get(file)
        if handle is None:
            with self._lock:
                handle = self._handles.get(file)
                if handle is None:
                    handle = self._handles[file] = self._open(file)
        return handle

    def _open(self, file=None):
        file = self.file if file is None else file
        if file is None:
            raise OperationalError(f"tensor '{self.meta.name}' has tiles but no payload object "
                                   "in the catalog")
        if self.shipped and self.database is not None:
            problem = self.objects.problem(self.database)
            if problem is not None:
                raise OperationalError(f"{process_label()} cannot read tensor "
                                       f"'{self.meta.name}' from {self.path}: {problem}")
        handle, ident = self.objects.open(file, self.meta.name)
        if file == self.file:
            self._ident = ident
        start, size = part_start(file), handle.size()
        short = min((e for e in self.entries.values() if (e.file or self.file) == file
                     and e.offset - start + e.nbytes > size),
                    key=lambda e: e.offset, default=None)
        if short is not None:
            from ..errors import DataError
            raise DataError(f"the payload object {self.objects.url_of(file)} of tensor "
                            f"'{self.meta.name}' is truncated: it has {size} bytes, tile "
                            f"{short.coords} needs bytes {short.offset - start} to "
                            f"{short.offset - start + short.nbytes}")
        return handle

    def _fetch(self, offset: int, nbytes: int, tiles: Sequence[TileEntry]) -> bytes:
        """The bytes ``[offset, offset + nbytes)``, ``tiles`` (which lie in them) verified: from
        this process's cache of fetched ranges, else one ranged GET (one per object, for a run
        of tiles over the parts of a version written in parts)."""
        key = (self.path, offset, nbytes)
        data = _RANGES.get(key)
        if data is not None:
            self._handle(tiles[0].file or self.file if tiles else self.file)  # the id checked
            return data
        pieces = _by_object(offset, nbytes, tiles, self.file)
        chunks = []
        for file, a, b in pieces:
            handle = self._handle(file)  # first: a shipped reader checks the prefix's id
            start = part_start(file)
            chunks.append(self.objects.read(handle, file, self.meta.name, a - start, b - a))
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        view = memoryview(data)
        for e in tiles:  # every fetch: its bytes are new (no ident: never skipped)
            verify_tile(self.meta.name, self.path if e.file is None else
                        self.objects.url_of(e.file), None, e,
                        view[e.offset - offset:e.offset - offset + e.nbytes], what="object")
        _RANGES.put(key, data)
        return data

    # -- what the file reader does through its mapping -----------------------------------------
    def _view(self, offset: int, shape: tuple[int, ...], tiles: Sequence[TileEntry]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * self.meta.dtype.itemsize
        end = max([offset + nbytes] + [e.offset + e.nbytes for e in tiles])
        data = self._fetch(offset, end - offset, tiles)
        return np.frombuffer(data, self.meta.dtype, count, 0).reshape(shape)

    def _verify(self, tiles) -> None:  # every fetch is verified as it arrives (_fetch)
        return None

    def stored_tile(self, coords: Sequence[int]):
        e = self.entries.get(tuple(int(c) for c in coords))
        if e is None or not e.sparse:
            return None if e is None else self._view(e.offset, e.shape, (e,))
        from .sparse import decode
        data = self._fetch(e.offset, e.nbytes, (e,))
        return decode(data, 0, e.nbytes, e.shape, self.meta.dtype, e.format, self.meta.name)

    def to_numpy(self) -> np.ndarray:
        meta = self.meta
        out = np.zeros(meta.shape, meta.dtype)
        for e, tile in self.tiles():
            if meta.shape:
                out[tuple(slice(s, s + n) for s, n in zip(e.starts, e.shape))] = tile
            else:
                out[...] = tile
        return out

    def close(self) -> None:
        self._handles = {}


def _by_object(offset: int, nbytes: int, tiles, file) -> list[tuple[str, int, int]]:
    """``(object, start, stop)`` of the bytes ``[offset, offset + nbytes)``: one object, or,
    where ``tiles`` (back to back, covering the range) lie in several (``TileEntry.file``),
    the run of each."""
    if not tiles or all(e.file is None or e.file == tiles[0].file for e in tiles):
        return [((tiles[0].file if tiles else None) or file, offset, offset + nbytes)]
    out: list = []
    for e in sorted(tiles, key=lambda e: e.offset):
        f = e.file or file
        if out and out[-1][0] == f:
            out[-1][2] = e.offset + e.nbytes
        else:
            out.append([f, e.offset, e.offset + e.nbytes])
    out[0][1], out[-1][2] = offset, offset + nbytes
    return [tuple(p) for p in out]

