"""The integrity check (CHECK TENSOR / CHECK DATABASE, ``con.check``): read every stored tile back
and compare it with its catalog row, in the spirit of SQLite's ``PRAGMA integrity_check``.

For each tile: its payload file exists and is a regular file, the file holds the tile's bytes,
the bytes' zlib.crc32 equals the recorded one, and the nonzero count equals the catalog's. For a
whole database also: files in ``tiles/`` that no catalog row references (orphans) and catalog
rows that disagree with each other. Tiles are read in chunks of ``CHUNK`` bytes with ``preadv``
(no mapping, no tile held whole), so a tensor larger than memory is checked in bounded memory.
The check only reads: it changes nothing, and works on a read-only database.

One row per problem, ``(tensor, tile, file, offset, problem)``; tiles written before checksums
were recorded (NULL ``crc32``) are listed once per tensor as unverified, which is not a problem.
The last row is ``(None, None, None, None, 'ok')`` when no problem was found.
"""
from __future__ import annotations

import math
import os
import stat

import numpy as np

from ..geometry import tile_box
from . import catalog, memfiles, objectdb
from ._duck import translating
from .checksum import crc32
from .identity import ID_FILE, read_id_file
from .meta import TensorMeta
from .writer import count_nonzero
from .reader import TileEntry, file_kind
from .sparse import decode, validate
from ..errors import DataError
from ..sparsity import SPARSE_FORMATS

__all__ = ["check", "COLUMNS", "CHUNK"]

COLUMNS = ("tensor", "tile", "file", "offset", "problem")
CHUNK = 4 << 20  # bytes read at a time: a multiple of every itemsize


def check(store, name: str | None = None) -> list[tuple]:
    """The rows described above, for tensor ``name`` or (None) the whole database."""
    store._check_open()
    metas = [store.meta(name)] if name is not None else store.list()
    rows: list[tuple] = []
    objects = getattr(store, "objects", None)  # payloads in an object store (objectdb.py)
    for meta in metas:
        rows += _check_tensor(store, meta) if objects is None else objectdb.check_tensor(
            store, meta, _catalog_problems, decode, validate, count_nonzero)
    if name is None:
        rows += _dangling_rows(store)
        rows += _orphans(store) if objects is None else objectdb.orphans(store)
        rows += _identity_rows(store) if objects is None else objectdb.identity_rows(store)
    if all(r[4].startswith("unverified") for r in rows):  # notes only: no problem
        rows.append((None, None, None, None, "ok"))
    return rows


def _check_tensor(store, meta: TensorMeta) -> list[tuple]:
    reader = store.open(meta.name)
    entries = sorted(reader.entries.values(), key=lambda e: e.offset)
    file = os.path.basename(reader.path) if reader.path else None
    rows = [(meta.name, None, file, None, p) for p in _catalog_problems(meta, entries)]
    if not entries:
        return rows

    def bad(e: TileEntry, problem: str) -> None:
        rows.append((meta.name, e.coords, file, e.offset, problem))

    kept = memfiles.get(reader.path)
    if kept is not None:  # an in-memory database's small payload: bytes, no file
        return rows + _check_kept(meta, entries, kept[0], file)
    try:
        fd = os.open(reader.path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        for e in entries:
            bad(e, "missing file")
        return rows
    except OSError as exc:
        for e in entries:
            bad(e, f"cannot open the file: {exc.strerror or exc}")
        return rows
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            for e in entries:
                bad(e, f"not a regular file ({file_kind(st.st_mode)})")
            return rows
        size = min(CHUNK, max(e.nbytes for e in entries))
        buf = bytearray(max(size - size % meta.dtype.itemsize, meta.dtype.itemsize))
        unverified = 0
        for e in entries:
            if e.sparse:
                rows += _check_sparse(fd, st.st_size, meta, e, file)
                continue
            need = math.prod(e.shape) * meta.dtype.itemsize
            if e.nbytes != need:
                bad(e, f"catalog row says {e.nbytes} bytes, its shape {e.shape} needs {need}")
                continue
            if e.offset + e.nbytes > st.st_size:
                bad(e, f"short file: {st.st_size} bytes, the tile needs bytes {e.offset} to "
                       f"{e.offset + e.nbytes}")
                continue
            try:
                crc, nnz = _read_tile(fd, buf, e, meta.dtype, meta.fill)
            except EOFError as exc:
                bad(e, f"short file: {exc}")
                continue
            except OSError as exc:
                bad(e, f"cannot read the tile: {exc.strerror or exc}")
                continue
            if e.crc32 is None:
                unverified += 1
            elif crc != e.crc32:
                bad(e, f"checksum mismatch: recorded crc32 {e.crc32:08x}, read {crc:08x}")
                continue
            if nnz != e.nnz:
                bad(e, f"nonzero count mismatch: the catalog records {e.nnz}, the tile has {nnz}")
        if unverified:
            rows.append((meta.name, None, file, None,
                         f"unverified: {unverified} of {len(entries)} tile(s) have no recorded "
                         "checksum (written before checksums were recorded); their sizes and "
                         "nonzero counts were checked"))
    finally:
        os.close(fd)
    return rows


def _check_kept(meta: TensorMeta, entries, data: np.ndarray, file) -> list[tuple]:
    """The problems of a payload kept in memory (memfiles.py; dense tiles, as a computed output
    is): each tile's size, bounds, checksum and nonzero count, read from its bytes."""
    rows = []
    raw = memoryview(data).cast("B")
    for e in entries:
        def bad(problem: str) -> None:
            rows.append((meta.name, e.coords, file, e.offset, problem))
        need = math.prod(e.shape) * meta.dtype.itemsize
        if e.sparse:
            bad(f"a {e.format} tile in a payload kept in memory")
        elif e.nbytes != need:
            bad(f"catalog row says {e.nbytes} bytes, its shape {e.shape} needs {need}")
        elif e.offset + e.nbytes > len(raw):
            bad(f"short payload: {len(raw)} bytes in memory, the tile needs bytes {e.offset} "
                f"to {e.offset + e.nbytes}")
        else:
            part = raw[e.offset:e.offset + e.nbytes]
            crc = crc32(part)
            if e.crc32 is not None and crc != e.crc32:
                bad(f"checksum mismatch: recorded crc32 {e.crc32:08x}, read {crc:08x}")
                continue
            values = np.frombuffer(part, meta.dtype)
            nnz = count_nonzero(values) if not meta.fill else int(np.count_nonzero(
                values != meta.fill))
            if nnz != e.nnz:
                bad(f"nonzero count mismatch: the catalog records {e.nnz}, the tile has {nnz}")
    return rows


def _check_sparse(fd: int, size: int, meta: TensorMeta, e: TileEntry, file) -> list[tuple]:
    """The problems of one sparse tile: its bytes read whole (a sparse tile is proportional to
    its entries), checksummed, decoded and its index structure and nonzero count checked."""
    def bad(problem: str) -> list[tuple]:
        return [(meta.name, e.coords, file, e.offset, problem)]
    if e.format not in SPARSE_FORMATS:
        return bad(f"unknown tile format {e.format!r}")
    if e.offset + e.nbytes > size:
        return bad(f"short file: {size} bytes, the tile needs bytes {e.offset} to "
                   f"{e.offset + e.nbytes}")
    buf = bytearray(e.nbytes)
    try:
        got = os.preadv(fd, [buf], e.offset)
    except OSError as exc:
        return bad(f"cannot read the tile: {exc.strerror or exc}")
    if got != e.nbytes:
        return bad(f"short file: the tile ended after {got} of its {e.nbytes} bytes")
    crc = crc32(memoryview(buf))
    if e.crc32 is not None and crc != e.crc32:
        return bad(f"checksum mismatch: recorded crc32 {e.crc32:08x}, read {crc:08x}")
    try:
        tile = decode(bytes(buf), 0, e.nbytes, e.shape, meta.dtype, e.format, meta.name)
    except DataError as exc:
        return bad(f"sparse tile: {exc.message}")
    problems = validate(tile, meta.name, e.coords)
    if problems:
        return bad(problems[0])
    values = tile.values if hasattr(tile, "values") else tile.data
    # a tensor with another fill stores the entries that differ from it, and counts them all
    nnz = count_nonzero(np.asarray(values)) if not meta.fill else int(np.asarray(values).size)
    if nnz != e.nnz:
        return bad(f"nonzero count mismatch: the catalog records {e.nnz}, the tile has {nnz}")
    return []


def _read_tile(fd: int, buf: bytearray, e: TileEntry, dtype: np.dtype,
               fill: float = 0.0) -> tuple[int, int]:
    """(crc32, nonzero count) of one tile, read ``len(buf)`` bytes at a time (of a tensor with
    another fill than 0: the count of elements that are not the fill)."""
    view = memoryview(buf)
    crc, nnz, done = 0, 0, 0
    while done < e.nbytes:
        want = min(len(buf), e.nbytes - done)
        got = 0
        while got < want:
            n = os.preadv(fd, [view[got:want]], e.offset + done + got)
            if n <= 0:
                raise EOFError(f"the file ended at byte {e.offset + done + got} while reading")
            got += n
        crc = crc32(view[:want], crc)
        part = np.frombuffer(buf, dtype, want // dtype.itemsize)
        nnz += count_nonzero(part) if not fill else int(np.count_nonzero(part != fill))
        done += want
    return crc, nnz


def _catalog_problems(meta: TensorMeta, entries: list[TileEntry]) -> list[str]:
    """Disagreements between a tensor's catalog row and its tile rows."""
    out = []
    if len(entries) != meta.tile_count:
        out.append(f"catalog: tensors.tile_count is {meta.tile_count}, tiles has "
                   f"{len(entries)} row(s)")
    if sum(e.nnz for e in entries) != meta.nnz:
        out.append(f"catalog: tensors.nnz is {meta.nnz}, its tiles sum to "
                   f"{sum(e.nnz for e in entries)}")
    grid = meta.grid_shape
    for e in entries:
        inside = len(e.coords) == meta.ndim and all(0 <= c < n for c, n in zip(e.coords, grid))
        if not inside or tile_box(meta.grid, e.coords) != (
                e.starts, tuple(s + n for s, n in zip(e.starts, e.shape))):
            out.append(f"catalog: tile {e.coords} does not fit the tensor's grid")
    return out


def _dangling_rows(store) -> list[tuple]:
    """Tile rows of no stored tensor version."""
    with store._lock, translating("cannot read the catalog"):
        found = store.duck.execute(
            "SELECT t.tensor, t.version, any_value(t.file), count(*) "
            f"FROM {catalog.SCHEMA}.tiles t "
            f"ANTI JOIN {catalog.SCHEMA}.tensors m ON m.name = t.tensor AND m.version = t.version "
            "GROUP BY ALL ORDER BY ALL").fetchall()
    return [(tensor, None, file, None, f"catalog: {n} tile row(s) of version {version}, which is "
             "not a stored tensor") for tensor, version, file, n in found]


def _identity_rows(store) -> list[tuple]:
    """The id file that workers check (identity.py) must hold the catalog's id."""
    if store.database is None:  # an older database opened read-only: it has no id yet
        return []
    found = read_id_file(str(store.root))
    if found == store.database:
        return []
    said = "is missing" if found is None else f"holds {found}"
    return [(None, None, ID_FILE, None, f"identity: {ID_FILE} {said}, the catalog's id is "
             f"{store.database} (Dask workers refuse to read the payloads; the next open for "
             "writing rewrites it)")]


def _orphans(store) -> list[tuple]:
    """Entries of ``tiles/`` that no catalog row references (a writable open deletes them)."""
    if not os.path.isdir(store.tiles_dir):
        return []
    with store._lock, translating("cannot read the catalog"):
        keep = catalog.referenced_files(store.duck)
    rows = []
    for entry in sorted(os.scandir(store.tiles_dir), key=lambda d: d.name):
        if entry.name not in keep and entry.path not in store.spares:  # spares: kept for reuse
            try:
                kind = "" if entry.is_file(follow_symlinks=False) else \
                    f" ({file_kind(entry.stat(follow_symlinks=False).st_mode)})"
                fate = "tensordb never deletes a directory: remove it by hand" \
                    if entry.is_dir(follow_symlinks=False) else \
                    "the next open for writing deletes it"
            except OSError:  # gone while we looked
                continue
            rows.append((None, None, entry.name, None,
                         f"orphan file{kind}: no catalog row references it ({fate})"))
    return rows
