"""A database whose payloads are in an object store (objects.py): what a Store does on opening
(the declared location checked against the catalog's record, the prefix claimed for its id, the
orphan sweep by listing) and what CHECK DATABASE reads there.

The catalog records where its payloads are (``tensordb.payload_store(url)``): a database made
with ``storage='s3://...'`` opened with another declaration, or a database with payload files
opened with an object store URL, is an OperationalError naming both, before anything is read or
deleted. A database with no tensors may move (the record follows the declaration).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np

from ..errors import DataError, Error, OperationalError
from . import catalog
from ._duck import translating
from .checksum import crc32
from .objects import ObjectStore, is_part, part_start, payload_versions

__all__ = ["check_location", "open_objects", "check_tensor", "orphans", "identity_rows",
           "unreferenced"]

TABLE = "tensordb.payload_store"


def _recorded(duck) -> str | None:
    found = duck.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = "
                         "current_database() AND schema_name = 'tensordb' AND table_name = "
                         "'payload_store'").fetchall()[0][0]
    if not found:
        return None
    row = duck.execute(f"SELECT url FROM {TABLE} LIMIT 1").fetchall()
    return row[0][0] if row else None


def check_location(duck, root, objects: ObjectStore | None, read_only: bool,
                   copy: bool = False) -> None:
    """That the declared location is where the catalog's payloads are (see above); an open for
    writing records an object store URL. ``copy``: ``duck`` is a reader's copy of the catalog
    (readview.py); one taken from a writer's published snapshot holds the tensors' rows only,
    so with nothing recorded there is nothing to check against: a wrongly declared location
    then fails at the first read (payload names carry the database's id, every range its CRC)."""
    with translating(f"cannot open database {root}"):
        recorded = _recorded(duck)
        declared = objects.url if objects is not None else None
        if recorded == declared or (copy and recorded is None):
            return
        tensors = bool(duck.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {catalog.SCHEMA}.tiles LIMIT 1)").fetchall()[0][0])
        if tensors:
            where = recorded or f"files in {root}/tiles"
            said = f"storage='{declared}'" if declared else "local storage (storage='local' " \
                                                            "or 'shared')"
            raise OperationalError(
                f"database {root} keeps its payloads in {where}, but it was opened with {said}",
                hint=f"connect with storage='{recorded}' (and its storage_options)" if recorded
                else "connect without an object store URL: this database's payloads are files")
        if read_only:
            return
        duck.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (url VARCHAR NOT NULL)")
        duck.execute(f"DELETE FROM {TABLE}")
        if declared is not None:
            duck.execute(f"INSERT INTO {TABLE} VALUES (?)", [declared])


def open_objects(duck, tiles_dir: str, objects: ObjectStore, database: str | None,
                 read_only: bool, newest: int) -> int:
    """On opening: the prefix claimed for ``database`` (or, read-only, checked to be its), the
    objects the catalog proves unreferenced deleted (and the uploads in parts left open), the local staging files of a killed commit
    removed; returns the next version (past every payload name seen)."""
    if database is None:  # an older database opened read-only: it never had objects
        return newest
    if read_only:
        problem = objects.problem(database)
        if problem is not None:
            raise OperationalError(f"cannot open the payloads of this database: {problem}")
        return newest
    objects.claim(database)
    with translating("cannot read the catalog"):
        keep, live = catalog.referenced_files(duck), catalog.versions(duck)
    found = payload_versions([name for name, _ in objects.list()], database)
    for name, version in found.items():
        newest = max(newest, version + 1)
        # a part object is referenced by its tile rows alone: one of a live version that no row
        # names was put by an attempt given up (a worker killed after its put, the run retried)
        if name not in keep and (version not in live or is_part(name)):
            objects.delete(name)
    # an upload in parts a killed writer left open (objparts.py): no object yet, but its parts
    # take space until aborted; this open is the database's only writer, so none is in use
    for name, upload_id in objects.uploads():
        version = payload_versions([name], database).get(name)
        if version is not None:
            newest = max(newest, version + 1)
            objects.abort_upload(name, upload_id)
    # the local tiles/ of such a database holds only staging files: a commit killed after its
    # upload leaves one behind, referenced or not
    with contextlib.suppress(OSError):
        for entry in os.scandir(tiles_dir):
            if entry.name in payload_versions([entry.name], database) and \
                    entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    return newest


def unreferenced(duck, files) -> list[str]:
    """Those of the payload ``files`` that the catalog proves unreferenced."""
    keep, live = catalog.referenced_files(duck), catalog.versions(duck)
    out = []
    for name in files:
        version = name.split("-", 1)[0].split(".", 1)[0]
        if name not in keep and not (version.isdigit() and int(version) in live):
            out.append(name)
    return out


# -- CHECK DATABASE ------------------------------------------------------------------------------
def check_tensor(store, meta, catalog_problems, decode, validate, count_nonzero) -> list[tuple]:
    """CHECK's rows for one tensor whose payload is an object: each tile fetched by its byte
    range, its CRC-32 and nonzero count compared with its row."""
    reader = store.open(meta.name)
    entries = sorted(reader.entries.values(), key=lambda e: e.offset)
    rows = [(meta.name, None, reader.file, None, p) for p in catalog_problems(meta, entries)]
    handles: dict = {}  # object -> (handle, size), or the error opening it
    for e in entries:
        file = e.file or reader.file  # a version Dask workers wrote in parts: its part object
        if file not in handles:
            try:
                handle, _ = store.objects.open(file, meta.name)
                handles[file] = (handle, handle.size())
            except Error as exc:
                handles[file] = exc
        if isinstance(handles[file], Error):
            rows.append((meta.name, e.coords, file, e.offset, f"cannot open the object: "
                         f"{handles[file].message}"))
            continue
        handle, size = handles[file]
        at = e.offset - part_start(file)
        if at + e.nbytes > size:
            rows.append((meta.name, e.coords, file, e.offset, f"short object: {size} bytes, the "
                         f"tile needs bytes {at} to {at + e.nbytes}"))
            continue
        try:
            data = store.objects.read(handle, file, meta.name, at, e.nbytes)
        except Error as exc:
            rows.append((meta.name, e.coords, file, e.offset, f"cannot read the tile: "
                         f"{exc.message}"))
            continue
        crc = crc32(memoryview(data))
        if e.crc32 is not None and crc != e.crc32:
            rows.append((meta.name, e.coords, file, e.offset, f"checksum mismatch: recorded "
                         f"crc32 {e.crc32:08x}, read {crc:08x}"))
            continue
        try:
            if e.sparse:
                tile = decode(data, 0, e.nbytes, e.shape, meta.dtype, e.format, meta.name)
                problems = validate(tile, meta.name, e.coords)
                if problems:
                    rows.append((meta.name, e.coords, file, e.offset, problems[0]))
                    continue
                values = tile.values if hasattr(tile, "values") else tile.data
            else:
                values = np.frombuffer(data, meta.dtype)
        except DataError as exc:
            rows.append((meta.name, e.coords, file, e.offset, f"sparse tile: {exc.message}"))
            continue
        nnz = count_nonzero(np.asarray(values))
        if nnz != e.nnz:
            rows.append((meta.name, e.coords, file, e.offset, f"nonzero count mismatch: the "
                         f"catalog records {e.nnz}, the tile has {nnz}"))
    return rows


def orphans(store) -> list[tuple]:
    """Payload objects of this database that no catalog row references."""
    if store.database is None:
        return []
    with store.lock, translating("cannot read the catalog"):
        keep = catalog.referenced_files(store.duck)
    found = payload_versions([n for n, _ in store.objects.list()], store.database)
    return [(None, None, name, None, "orphan object: no catalog row references it (the next "
             "open for writing deletes it)") for name in sorted(found) if name not in keep]


def identity_rows(store) -> list[tuple]:
    """The prefix's database.id must hold the catalog's id."""
    if store.database is None:
        return []
    found = store.objects.read_id()
    if found == store.database:
        return []
    said = "is missing" if found is None else f"holds {found}"
    fate = "the next open for writing writes it" if found is None else \
        "the prefix is another database's: the next open for writing refuses it"
    return [(None, None, "database.id", None, f"identity: {store.objects.url}/database.id "
             f"{said}, the catalog's id is {store.database} ({fate})")]
