"""Payloads in an S3-compatible object store (``connect(path, storage="s3://bucket/prefix")``):
the catalog stays in the client's directory, the payload of each tensor version is one immutable
object.

    s3://bucket/prefix/database.id                    the database's id (identity.py), one object
    s3://bucket/prefix/tiles/<version>-<id16>.bin     a payload, named as a file would be
    s3://bucket/prefix/tiles/<version>-<id16>.<start>-<run>.bin   one part of a payload that
                                                      Dask workers wrote, an object each

- Written once, before the catalog's COMMIT: whole (``put`` of a local staging file, as a local
  database's; ``put_bytes`` of an output staged in memory), in part objects the Dask workers
  that computed them put (their tiles' rows name them), or in parts of a multipart upload the
  pool's threads upload and the commit completes (objparts.py). The COMMIT is the catalog
  transaction, as for files: a crash before it leaves orphan objects (or an open upload,
  aborted by the next open), after it stale ones.
- Read by byte range: a reader opens its object once (one HEAD: size and ETag) and fetches each
  tile's bytes with a ranged GET (``read_at``), never the whole object; every tile's CRC-32 is
  checked on its first read in a process, as for files (verify.py).
- Orphans removed by listing: the next open for writing lists ``tiles/`` and deletes the objects
  named as payloads of *this* database (its id's 16 hex digits) that the catalog proves
  unreferenced; anything else under the prefix (another database's, a user's) is never touched.
- Identity: a new database refuses a prefix whose ``database.id`` names another database, and a
  reader in another process (a Dask worker) checks that object before its first read.

The reads go through ``pyarrow.fs.S3FileSystem`` (pyarrow is a dependency already; its ranged
reads are C++); the writes through boto3 where it is installed (the ``s3`` extra): one
PutObject for a whole payload, and the calls of a multipart upload, whose parts the processes
that computed them put (objparts.py); without boto3, pyarrow's upload stream (docs/storage.md,
"Object storage"). ``storage_options``: ``endpoint`` (e.g.
``http://127.0.0.1:9000`` for MinIO), ``access_key``, ``secret_key``, ``session_token``,
``region``, ``anonymous``; absent keys come from the AWS environment, as the AWS SDK finds them.
"""
from __future__ import annotations

import os
import re
import threading
from urllib.parse import urlparse

from ..errors import DataError, NotSupportedError, OperationalError, ProgrammingError

__all__ = ["ObjectStore", "is_object_url", "SCHEMES", "OPTIONS", "part_name", "parts_prefix",
           "part_start"]

SCHEMES = ("s3",)
OPTIONS = ("endpoint", "access_key", "secret_key", "session_token", "region", "anonymous",
           "connect_timeout", "request_timeout")
ID_OBJECT = "database.id"
TILES = "tiles"
_FILESYSTEMS: dict[tuple, object] = {}  # (url's options) -> S3FileSystem, one per process
_CLIENTS: dict[tuple, object] = {}  # (url's options) -> boto3's S3 client, one per process
_LOCK = threading.Lock()
_SEEN_IDS: dict[tuple, str] = {}  # (location, expected id) checked in this process
# Opened payloads (a HEAD each), by URL: objects are immutable, so the next query's readers of
# a version reuse its handle rather than ask again. Every byte fetched through one is checked
# against its tile's CRC-32 all the same (objreader.py), so an object rewritten outside tensordb
# is found at its next read.
_HANDLES: dict[str, tuple] = {}
_HANDLES_MAX = 512


def is_object_url(storage) -> bool:
    return isinstance(storage, str) and "://" in storage


class ObjectStore:
    """One database's payload location in an object store. Picklable: a Dask worker makes its
    own client from the URL and the options."""

    def __init__(self, url: str, options: dict | None = None) -> None:
        parsed = urlparse(url.strip())
        if parsed.scheme.lower() not in SCHEMES:
            raise NotSupportedError(f"storage '{url}': the object store scheme "
                                    f"'{parsed.scheme}' is not supported",
                                    hint="storage='s3://bucket/prefix' (S3, MinIO, or any "
                                         "S3-compatible store with storage_options={'endpoint': "
                                         "...}), 'local' or 'shared'")
        if not parsed.netloc or parsed.query or parsed.fragment:
            raise ProgrammingError(f"storage '{url}' is not an object store URL of the form "
                                   "s3://bucket/prefix")
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ProgrammingError(f"unknown storage option(s) {', '.join(map(repr, unknown))}",
                                   hint=f"storage_options keys: {', '.join(OPTIONS)}")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.options = options
        self._base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket

    def __getstate__(self):
        return {"url": self.url, "options": self.options}

    def __setstate__(self, state) -> None:
        self.__init__(state["url"], state["options"])

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectStore) and (self.url, self.options) == (other.url,
                                                                              other.options)

    def __hash__(self) -> int:
        return hash(self.url)

    # -- names ---------------------------------------------------------------------------------
    def key(self, file: str) -> str:
        """pyarrow's path of payload ``file`` (``bucket/prefix/tiles/file``)."""
        return f"{self._base}/{TILES}/{file}"

    def url_of(self, file: str) -> str:
        """The URL of payload ``file``, as errors name it."""
        return f"{self.url}/{TILES}/{file}"

    # -- the client ----------------------------------------------------------------------------
    @property
    def fs(self):
        key = tuple(sorted(self.options.items()))
        with _LOCK:
            found = _FILESYSTEMS.get(key)
            if found is None:
                found = _FILESYSTEMS[key] = self._make_fs()
            return found

    def _make_fs(self):
        from pyarrow import fs
        o = self.options
        # allow_delayed_open: an object written in one part goes up as one PutObject, not a
        # multipart upload of three requests
        kwargs = {"allow_delayed_open": True, "connect_timeout": float(o.get("connect_timeout", 5)),
                  "request_timeout": float(o.get("request_timeout", 60))}
        if o.get("anonymous"):
            kwargs["anonymous"] = True
        for ours, theirs in (("access_key", "access_key"), ("secret_key", "secret_key"),
                             ("session_token", "session_token"), ("region", "region")):
            if o.get(ours) is not None:
                kwargs[theirs] = str(o[ours])
        endpoint = o.get("endpoint")
        if endpoint:
            parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs["endpoint_override"] = parsed.netloc
            kwargs["scheme"] = parsed.scheme or "https"
            kwargs.setdefault("region", "us-east-1")
        try:
            return fs.S3FileSystem(**kwargs)
        except (OSError, ValueError, TypeError) as exc:
            raise OperationalError(f"cannot reach the object store {self.url}: {exc}") from None

    @property
    def multipart(self) -> bool:
        """Whether payloads can be written in parts by the processes that compute them
        (objparts.py): boto3 is installed (pyarrow's client has no part API)."""
        return _boto3() is not None

    @property
    def s3(self):
        """boto3's S3 client for these options (one per process; boto3 clients are
        thread-safe once made)."""
        key = tuple(sorted(self.options.items()))
        with _LOCK:
            found = _CLIENTS.get(key)
            if found is None:
                found = _CLIENTS[key] = self._make_client()
            return found

    def _make_client(self):
        boto3 = _boto3()
        if boto3 is None:  # (a Dask worker's write says which worker: objparts.py)
            raise OperationalError(f"cannot write to the object store {self.url}: "
                                   "boto3 is not installed",
                                   hint="pip install 'tensordb[s3]' wherever tensordb runs "
                                        "(every Dask worker too)")
        from botocore.config import Config
        o = self.options
        config = {"connect_timeout": float(o.get("connect_timeout", 5)),
                  "read_timeout": float(o.get("request_timeout", 60)),
                  "retries": {"max_attempts": 3, "mode": "standard"},
                  "max_pool_connections": 16}
        if o.get("anonymous"):
            from botocore import UNSIGNED
            config["signature_version"] = UNSIGNED
        try:  # each tile has its CRC-32 in the catalog: no second checksum per request
            cfg = Config(request_checksum_calculation="when_required",
                         response_checksum_validation="when_required", **config)
        except TypeError:  # pragma: no cover - a botocore before 1.36
            cfg = Config(**config)
        kwargs = {"config": cfg}
        for ours, theirs in (("access_key", "aws_access_key_id"),
                             ("secret_key", "aws_secret_access_key"),
                             ("session_token", "aws_session_token"), ("region", "region_name")):
            if o.get(ours) is not None:
                kwargs[theirs] = str(o[ours])
        endpoint = o.get("endpoint")
        if endpoint:
            kwargs["endpoint_url"] = endpoint if "://" in endpoint else f"https://{endpoint}"
            kwargs.setdefault("region_name", "us-east-1")
        try:
            return boto3.session.Session().client("s3", **kwargs)
        except Exception as exc:  # noqa: BLE001 - botocore's errors are many
            raise OperationalError(f"cannot reach the object store {self.url}: {exc}") from None

    def object_key(self, file: str) -> str:
        """The S3 key of payload ``file`` (``prefix/tiles/file``)."""
        return f"{self.prefix}/{TILES}/{file}" if self.prefix else f"{TILES}/{file}"

    def _call(self, what: str, fn, **kwargs):
        try:
            return fn(Bucket=self.bucket, **kwargs)
        except Exception as exc:  # noqa: BLE001 - botocore's ClientError and connection errors
            raise self._error(what, exc) from None

    def create_upload(self, file: str, database: str | None) -> str:
        """Open a multipart upload of payload ``file``; its id."""
        meta = {"tensordb-database": database} if database else {}
        return self._call(f"cannot start the upload of {self.url_of(file)}",
                          self.s3.create_multipart_upload, Key=self.object_key(file),
                          Metadata=meta)["UploadId"]

    def upload_part(self, file: str, upload_id: str, number: int, data) -> str:
        """Upload part ``number`` (1-based) of an open upload; its ETag."""
        return self._call(f"cannot upload part {number} of {self.url_of(file)}",
                          self.s3.upload_part, Key=self.object_key(file), UploadId=upload_id,
                          PartNumber=number, Body=data)["ETag"]

    def complete_upload(self, file: str, upload_id: str, parts) -> None:
        """Complete an upload from its ``(number, etag)`` parts: the object exists from now."""
        with _LOCK:
            _HANDLES.pop(self.url_of(file), None)
        self._call(f"cannot complete the upload of {self.url_of(file)}",
                   self.s3.complete_multipart_upload, Key=self.object_key(file),
                   UploadId=upload_id,
                   MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]})

    def abort_upload(self, file: str, upload_id: str) -> None:
        """Abort an upload (its parts are deleted; gone already: nothing to do)."""
        try:
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=self.object_key(file),
                                           UploadId=upload_id)
        except Exception as exc:  # noqa: BLE001
            if "NoSuchUpload" not in str(exc):
                raise self._error(f"cannot abort the upload of {self.url_of(file)}", exc) \
                    from None

    def uploads(self) -> list[tuple[str, str]]:
        """(payload name, upload id) of every multipart upload open under ``tiles/`` (none
        without boto3: then nothing opens one)."""
        if not self.multipart:
            return []
        prefix, out = self.object_key(""), []
        kwargs = {"Prefix": prefix}
        while True:
            page = self._call(f"cannot list the uploads under {self.url}/{TILES}",
                              self.s3.list_multipart_uploads, **kwargs)
            for u in page.get("Uploads", []):
                name = u["Key"][len(prefix):]
                if "/" not in name:
                    out.append((name, u["UploadId"]))
            if not page.get("IsTruncated"):
                return out
            kwargs.update(KeyMarker=page.get("NextKeyMarker", ""),
                          UploadIdMarker=page.get("NextUploadIdMarker", ""))

    def _error(self, what: str, exc: BaseException) -> OperationalError:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return OperationalError(f"{what}: {text}", hint=_HINT)

    # -- objects -------------------------------------------------------------------------------
    def put(self, local_path: str, file: str, database: str | None) -> None:
        """Upload the local file ``local_path`` whole as payload ``file`` (with the database's
        id in the object's metadata)."""
        meta = {"tensordb-database": database} if database else None
        if self.multipart and os.path.getsize(local_path) <= _PUT_MAX:
            # one PutObject: pyarrow's stream goes up as a multipart upload above 5 MiB, which
            # took moto twice as long for 32 MiB (docs/benchmarks.md)
            with _LOCK:
                _HANDLES.pop(self.url_of(file), None)
            with open(local_path, "rb") as src:
                self._call(f"cannot upload the payload {self.url_of(file)}", self.s3.put_object,
                           Key=self.object_key(file), Body=src, Metadata=meta or {})
            return
        try:
            with open(local_path, "rb") as src, \
                    self.fs.open_output_stream(self.key(file), metadata=meta) as out:
                while True:
                    chunk = src.read(_CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
        except OSError as exc:
            raise self._error(f"cannot upload the payload {self.url_of(file)}", exc) from None

    def put_bytes(self, data: bytes, file: str, database: str | None) -> None:
        """Upload ``data`` whole as payload ``file``: one PutObject (boto3), else pyarrow's
        stream."""
        meta = {"tensordb-database": database} if database else None
        with _LOCK:
            _HANDLES.pop(self.url_of(file), None)
        if self.multipart and len(data) <= _PUT_MAX:
            self._call(f"cannot upload the payload {self.url_of(file)}", self.s3.put_object,
                       Key=self.object_key(file), Body=data, Metadata=meta or {})
            return
        try:
            with self.fs.open_output_stream(self.key(file), metadata=meta) as out:
                out.write(data)
        except OSError as exc:
            raise self._error(f"cannot upload the payload {self.url_of(file)}", exc) from None

    def open(self, file: str, tensor: str):
        """(a random-access handle, its identity for verify.py) of payload ``file``: one HEAD."""
        url = self.url_of(file)
        with _LOCK:
            hit = _HANDLES.get(url)
        if hit is not None and hit[2] == self.options:
            return hit[0], hit[1]
        try:
            handle = self.fs.open_input_file(self.key(file))
            meta = handle.metadata()
        except FileNotFoundError:
            raise OperationalError(f"the payload object {url} of tensor '{tensor}' is missing",
                                   hint="the tensor was replaced or dropped since it was "
                                        "opened, or the object was deleted outside tensordb; "
                                        "CHECK DATABASE lists every damaged tile") from None
        except OSError as exc:
            raise self._error(f"cannot open the payload object {url} of tensor '{tensor}'",
                              exc) from None
        etag = meta.get("ETag", meta.get("etag", b""))
        ident = ("object", url, bytes(etag), handle.size())
        with _LOCK:
            if len(_HANDLES) >= _HANDLES_MAX:
                _HANDLES.clear()
            _HANDLES[url] = (handle, ident, self.options)
        return handle, ident

    def read(self, handle, file: str, tensor: str, offset: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at ``offset`` of an opened payload (one ranged GET)."""
        try:
            data = handle.read_at(nbytes, offset)
        except OSError as exc:
            raise self._error(f"cannot read the payload object {self.url_of(file)} of tensor "
                              f"'{tensor}'", exc) from None
        if len(data) != nbytes:
            raise DataError(f"the payload object {self.url_of(file)} of tensor '{tensor}' ended "
                            f"early: bytes {offset} to {offset + nbytes} asked, "
                            f"{len(data)} read", hint=_CHECK_HINT)
        return data

    def delete(self, file: str) -> None:
        """Delete payload ``file`` (missing already: nothing to do)."""
        with _LOCK:
            _HANDLES.pop(self.url_of(file), None)
        try:
            self.fs.delete_file(self.key(file))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._error(f"cannot delete the payload object {self.url_of(file)}", exc) \
                from None

    def list(self) -> list[tuple[str, int]]:
        """(name, size) of every object under ``tiles/`` (not below a further '/')."""
        from pyarrow import fs
        try:
            infos = self.fs.get_file_info(fs.FileSelector(f"{self._base}/{TILES}",
                                                          allow_not_found=True))
        except OSError as exc:
            raise self._error(f"cannot list the payload objects under {self.url}/{TILES}",
                              exc) from None
        return [(i.base_name, i.size) for i in infos if i.type == fs.FileType.File]

    def names_starting(self, prefix: str) -> list[str]:
        """The payload names under ``tiles/`` that begin with ``prefix`` (boto3's listing, by
        key prefix: the part objects of one version)."""
        base, out = self.object_key(""), []
        kwargs = {"Prefix": base + prefix}
        while True:
            page = self._call(f"cannot list {self.url_of(prefix)}*", self.s3.list_objects_v2,
                              **kwargs)
            out += [o["Key"][len(base):] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return [n for n in out if "/" not in n]
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    # -- the database's identity ---------------------------------------------------------------
    def read_id(self) -> str | None:
        """The id in ``database.id`` under the prefix, or None when there is no such object."""
        try:
            with self.fs.open_input_stream(f"{self._base}/{ID_OBJECT}") as f:
                found = f.read(256).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(f"cannot read {self.url}/{ID_OBJECT}", exc) from None
        return found or None

    def claim(self, database: str) -> None:
        """Record ``database`` as the prefix's database; OperationalError when the prefix
        belongs to another one (two databases never share payload objects)."""
        found = self.read_id()
        if found == database:
            return
        if found is not None:
            raise OperationalError(
                f"the object store prefix {self.url} holds another database's payloads (id "
                f"{found}), not this catalog's (id {database})",
                hint="give each database its own prefix (storage='s3://bucket/other-prefix')")
        self.ensure_bucket()
        try:
            with self.fs.open_output_stream(f"{self._base}/{ID_OBJECT}") as out:
                out.write((database + "\n").encode("ascii"))
        except OSError as exc:
            raise self._error(f"cannot write {self.url}/{ID_OBJECT}", exc) from None

    def ensure_bucket(self) -> None:
        from pyarrow import fs
        try:
            info = self.fs.get_file_info(self.bucket)
        except OSError as exc:
            raise self._error(f"cannot reach the object store {self.url}", exc) from None
        if info.type == fs.FileType.NotFound:
            raise OperationalError(f"the bucket '{self.bucket}' of {self.url} does not exist",
                                   hint="create the bucket first (tensordb never creates "
                                        "buckets)")

    def problem(self, expected: str) -> str | None:
        """None when the prefix is database ``expected``'s (read once per process), else why
        not: what a worker probes and a reader checks before its first read."""
        key = (self.url, expected)
        if key in _SEEN_IDS:
            return None
        try:
            found = self.read_id()
        except OperationalError as exc:
            return str(exc.args[0] if exc.args else exc)
        if found == expected:
            _SEEN_IDS[key] = found
            return None
        if found is None:
            return f"there is no tensordb database at {self.url} (no {ID_OBJECT} object)"
        return (f"the database at {self.url} is another database (id {found}), not the one "
                f"this connection opened (id {expected})")


def part_name(file: str, start: int, run: str) -> str:
    """The object of the bytes from ``start`` of payload ``file``'s layout, put by a Dask worker
    in run (attempt) ``run`` as an object of its own (objparts.py):
    ``<version>-<id16>.<start>-<run>.bin``. The run keeps an attempt given up from ever
    deleting what the next attempt put."""
    return f"{parts_prefix(file)}{int(start)}-{run}.bin"


def parts_prefix(file: str) -> str:
    """What the names of payload ``file``'s part objects begin with."""
    return f"{file[:-4] if file.endswith('.bin') else file}."


def part_start(name: str) -> int:
    """Where the bytes of object ``name`` start in its tensor version's layout (the catalog's
    offsets): 0 for a whole payload, ``start`` for a ``part_name``."""
    m = _PART.match(name)
    return int(m.group(1)) if m else 0


_PART = re.compile(r"^\d+-[0-9a-f]+\.(\d+)-\w+\.bin$")


def is_part(name: str) -> bool:
    """Whether object ``name`` is a ``part_name``: referenced by tile rows only, never as a
    version's whole payload."""
    return _PART.match(name) is not None


def payload_versions(names, database: str) -> dict[str, int]:
    """{object name: version} of the names that are payloads of ``database`` (whole, or the
    objects of a version written in parts, ``part_name``)."""
    pattern = re.compile(r"^(\d+)-" + re.escape(database[:16]) + r"(?:\.\d+-\w+)?\.bin$")
    out = {}
    for name in names:
        m = pattern.match(name)
        if m:
            out[name] = int(m.group(1))
    return out


_CHUNK = 8 << 20
_PUT_MAX = 1 << 30  # larger payloads go up through pyarrow's multipart stream


_BOTO3: list = []  # [boto3 or None], once looked for


def _boto3():
    if not _BOTO3:
        try:
            import boto3
        except ImportError:
            boto3 = None
        _BOTO3.append(boto3)
    return _BOTO3[0]
_HINT = ("check the object store's URL, endpoint and credentials (storage_options), and that it "
         "is reachable from this process")
_CHECK_HINT = "the object was changed outside tensordb; CHECK DATABASE lists every damaged tile"
