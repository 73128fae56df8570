"""A database's identity: an id recorded in its catalog, carried by its payloads, and checked by
every process that reads them without having opened the catalog itself (a Dask worker).

    tensordb.identity(id VARCHAR, created TIMESTAMP)   one row: the database's id (a UUID)
    <root>/database.id                                 the same id, for readers with no catalog
    tiles/<version>-<id16>.bin                         a payload, named with the id's first 16
                                                       hex digits

A database gets its id when it is created, and an older one on its first open for writing; a
read-only open of an older database has none (its readers check checksums only). Payloads
written before ids keep their names (``<version>.bin``; the catalog's ``file`` column names
each tensor's file) and stay readable. Two databases' payloads therefore never share a name,
and a worker that sees another database at the same path (its own disk) fails with an
OperationalError naming itself and the path, before it reads a byte, rather than computing with
the other database's tiles.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import uuid

from ..errors import OperationalError, ProgrammingError

__all__ = ["STORAGE", "check_storage", "ID_FILE", "TABLE", "ensure_id", "read_catalog_id", "read_id_file", "check_database",
           "sees_database", "set_process_label", "named", "process_label", "payload_name"]

STORAGE = ("local", "shared")
ID_FILE = "database.id"
TABLE = "tensordb.identity"
_LOCK = threading.Lock()
_SEEN: dict[str, tuple] = {}  # root -> (inode, mtime, size, id) of its id file, as last read
_LABEL: str | None = None


def check_storage(storage) -> str:
    """The declared storage location: ``local`` (payloads on the client's disk; executors whose
    workers cannot be shown to see them get the tiles from the client), ``shared`` (a file
    system mounted at the same path on every worker; a worker that does not see the database
    there is an error), or an object store URL ``s3://bucket/prefix`` (objects.py; returned in
    its normal spelling)."""
    if not isinstance(storage, str):
        raise ProgrammingError(f"storage must be a string, got {storage!r}",
                               hint="storage='local', storage='shared' or "
                                    "storage='s3://bucket/prefix'")
    kind = storage.strip().lower()
    if "://" in kind:
        from .objects import ObjectStore
        return ObjectStore(storage).url
    if kind not in STORAGE:
        raise ProgrammingError(f"unknown storage '{storage}'",
                               hint="storage='local' (the client's disk, the default), "
                                    "storage='shared' (mounted at the same path on every "
                                    "worker) or storage='s3://bucket/prefix' (an object store)")
    return kind


def read_catalog_id(duck) -> str | None:
    """The id recorded in the catalog, or None (an older database, or one opened read-only)."""
    found = duck.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = "
                         "current_database() AND schema_name = 'tensordb' AND table_name = "
                         "'identity'").fetchall()[0][0]
    if not found:
        return None
    row = duck.execute(f"SELECT id FROM {TABLE} ORDER BY created LIMIT 1").fetchall()
    return row[0][0] if row else None


def ensure_id(duck, root: str) -> str:
    """The database's id, made and recorded now if it has none (an open for writing), and its
    id file written where it is missing or wrong."""
    found = read_catalog_id(duck)
    if found is None:
        found = uuid.uuid4().hex
        duck.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id VARCHAR NOT NULL, "
                     "created TIMESTAMP NOT NULL DEFAULT current_localtimestamp())")
        duck.execute(f"INSERT INTO {TABLE} (id) VALUES (?)", [found])
    if _read_file(os.path.join(root, ID_FILE)) != found:
        _write_file(root, found)
    return found


def payload_name(version: int, database: str | None) -> str:
    """A payload file's name: the version, and the first 16 hex digits of the database's id."""
    return f"{version}.bin" if database is None else f"{version}-{database[:16]}.bin"


def _read_file(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(256).decode("ascii", "replace").strip() or None
    except OSError:
        return None


def _write_file(root: str, ident: str) -> None:
    tmp = os.path.join(root, f".{ID_FILE}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(ident + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, ID_FILE))
    except OSError as exc:
        raise OperationalError(f"cannot write the database's id file {root}/{ID_FILE}: "
                               f"{exc.strerror or exc}") from None


def read_id_file(root: str) -> str | None:
    """The id in ``root``'s id file (None: no such file), re-read only when the file changed."""
    path = os.path.join(root, ID_FILE)
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    with _LOCK:
        seen = _SEEN.get(root)
    if seen is not None and seen[:3] == stamp:
        return seen[3]
    found = _read_file(path)
    with _LOCK:
        _SEEN[root] = stamp + (found,)
    return found


def set_process_label(label: str) -> None:
    """How errors name this process (a Dask worker sets its address)."""
    global _LABEL
    _LABEL = label


def named() -> bool:
    """Whether this process was given a label (``set_process_label``)."""
    return _LABEL is not None


def process_label() -> str:
    if _LABEL:
        return _LABEL
    if "distributed" in sys.modules:  # a Dask worker's thread that tensordb's task did not name
        try:
            from distributed import get_worker
            return f"Dask worker {get_worker().address}"
        except (ImportError, ValueError, AttributeError):
            pass
    return f"process {os.getpid()} on {socket.gethostname()}"


def check_database(payload_path: str, expected: str | None, tensor: str | None = None) -> None:
    """That the database at the path of ``payload_path`` (``<root>/tiles/<file>``) is the one
    whose id is ``expected``; else an OperationalError naming this process and the path. A
    reader of an older database (no id) is not checked here: its checksums are."""
    if expected is None:
        return
    problem = _problem(os.path.dirname(os.path.dirname(payload_path)), expected)
    if problem is not None:
        what = f" cannot read tensor '{tensor}' from {payload_path}:" if tensor else ""
        raise OperationalError(f"{process_label()}{what} {problem}", hint=_HINT)


def sees_database(root: str, expected: str) -> str | None:
    """None when this process sees the database ``expected`` at ``root``, else why not (a probe
    that an executor runs on each worker)."""
    problem = _problem(root, expected)
    return None if problem is None else f"{process_label()}: {problem}"


def _problem(root: str, expected: str) -> str | None:
    found = read_id_file(root)
    if found == expected:
        return None
    if found is None:
        if not os.path.isdir(root):
            return f"there is no directory {root} here, so no database"
        return f"there is no tensordb database at {root} here (no {ID_FILE})"
    return (f"the database at {root} here is another database (id {found}), not the one "
            f"this connection opened (id {expected})")


_HINT = ("the worker does not see the client's database directory: declare where the storage is "
         "(connect(..., storage='local') lets the client send the tiles to such workers; "
         "storage='shared' needs the directory mounted at the same path on every worker)")
