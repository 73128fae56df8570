"""A real S3 server on 127.0.0.1 for the object-store tests: moto's server mode (moto[server],
the test extra), started once per test session on a free port, in this process (its threads);
child processes and Dask workers reach it over loopback like any S3 endpoint.

    from tests.s3server import s3, s3_storage   # fixtures: the server; a fresh prefix per test

``s3_storage`` is ``(url, options)`` for ``tensordb.connect(path, storage=url,
storage_options=options)``, a prefix of its own in the session's bucket. Without moto the
tests that use them are skipped, saying so.
"""
from __future__ import annotations

import itertools
import logging
import uuid

import pytest

BUCKET = "tensordb-test"
_COUNT = itertools.count()


class S3Server:
    """moto's ThreadedMotoServer on a free port of 127.0.0.1, with one bucket."""

    def __init__(self) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:  # pragma: no cover - moto is in the test extra
            pytest.skip(f"moto[server] is not installed ({exc}): the object-store tests need "
                        "its S3 server (pip install 'moto[server]')")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.options = {"endpoint": self.endpoint, "access_key": "testing",
                        "secret_key": "testing", "region": "us-east-1"}
        self.admin().create_dir(BUCKET)

    def admin(self):
        """A pyarrow client allowed to create buckets (tensordb's never does)."""
        from pyarrow import fs
        host = self.endpoint.split("://", 1)[1]
        return fs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1",
                               endpoint_override=host, scheme="http", allow_bucket_creation=True)

    def prefix(self, name: str = "db") -> str:
        return f"s3://{BUCKET}/{name}-{next(_COUNT)}-{uuid.uuid4().hex[:8]}"

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="session")
def s3():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_storage(s3):
    return s3.prefix(), dict(s3.options)


def connect(path, storage=None, **kw):
    """A connection whose payloads live in ``storage`` ((url, options), as ``s3_storage``
    gives), or in the database's own directory when it is None."""
    import tensordb
    if storage is None:
        return tensordb.connect(path, **kw)
    url, options = storage
    return tensordb.connect(path, storage=url, storage_options=options, **kw)


def objects_of(storage) -> dict[str, int]:
    """The objects under ``storage``'s prefix: key -> size."""
    from tensordb.storage.objects import ObjectStore
    return dict(ObjectStore(*storage).list())


def referenced(con) -> set[str]:
    """The payload files (objects) the catalog's tile rows name."""
    return {r[0] for r in con.store.duck.execute("SELECT DISTINCT file FROM tensordb.tiles")
            .fetchall()}
