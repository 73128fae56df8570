"""Shared test fixtures: database paths and connections (options live in ../conftest.py)."""
from __future__ import annotations

import os

import pytest

import tensordb


@pytest.fixture
def db_path(tmp_path):
    """A path for a new on-disk database (not created yet)."""
    return tmp_path / "test.tdb"


@pytest.fixture
def con():
    """An in-memory connection, closed after the test."""
    with tensordb.connect() as c:
        yield c


@pytest.fixture
def disk_con(db_path):
    """A connection to a new on-disk database at ``db_path``."""
    with tensordb.connect(db_path) as c:
        yield c


@pytest.fixture
def snapshot():
    """``snapshot(con)`` -> the catalog rows and payload files; equal before and after means a
    statement changed nothing."""
    def take(c):
        store = c.store
        tensors = store.duck.execute(
            "SELECT name, version, dtype, shape, dims, grid, nbytes, tile_count, nnz "
            "FROM tensordb.tensors ORDER BY name").fetchall()
        tiles = store.duck.execute(
            'SELECT * FROM tensordb.tiles ORDER BY tensor, file, "offset"').fetchall()
        files = sorted([(e.name, e.stat().st_size) for e in os.scandir(store.tiles_dir)]
                       + _kept_payloads(store))
        return tensors, tiles, files
    return take


def _kept_payloads(store) -> list[tuple[str, int]]:
    """The payloads an in-memory database keeps as bytes, not files (storage/memfiles.py), as
    (name, size): part of what a statement that changed nothing left as it was."""
    from tensordb.storage import memfiles
    return [(os.path.basename(p), len(memfiles.get(p)[0]))
            for p in memfiles.paths_under(store.tiles_dir) if memfiles.get(p) is not None]
