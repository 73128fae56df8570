"""Fixtures of the executor tests (the suite's own are in ../conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A LocalCluster of 2 worker processes of one thread on 127.0.0.1
    (``exec.dask.local_cluster``), one per test module that asks for it, closed after that
    module's last test: a module whose tests kill workers (test_dask_failures.py) leaves the
    next module a fresh cluster."""
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    with local_cluster(2, local_directory=str(tmp_path_factory.mktemp("dask"))) as c:
        yield c
