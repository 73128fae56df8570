"""The database directory (storage/directory.py): a missing or foreign catalog deletes no payload
file, the sweep at open removes only orphan payloads, and an empty directory opens.

Real database directories on disk; the oracle is the bytes of every file before and after, and
the arrays loaded.
"""
from __future__ import annotations

import os

import duckdb
import numpy as np
import pytest

import tensordb

A = np.arange(1.0, 13.0).reshape(3, 4)
B = np.arange(1, 7, dtype=np.int64).reshape(2, 3)


def files_of(root) -> dict[str, bytes]:
    """Every file under the database directory and its bytes (the WAL may legitimately change,
    so it and DuckDB's own temporary files are left out)."""
    out = {}
    for folder, _, names in os.walk(root):
        for n in names:
            if n.endswith(".wal") or ".tmp" in n:
                continue
            p = os.path.join(folder, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def _database_with_payloads(path):
    with tensordb.connect(path) as con:
        con.load("A", A, tile=(1, 4))
        con.load("B", B)
    return files_of(path)


def test_missing_catalog_refused_and_nothing_deleted(tmp_path):
    path = tmp_path / "w.tdb"
    _database_with_payloads(path)
    os.unlink(path / "catalog.duckdb")
    if (path / "catalog.duckdb.wal").exists():
        os.unlink(path / "catalog.duckdb.wal")
    before = files_of(path)
    assert any(name.startswith("tiles") for name in before)
    for read_only in (False, True):
        with pytest.raises(tensordb.OperationalError) as e:
            tensordb.connect(path, read_only=read_only)
        assert "catalog.duckdb" in str(e.value) and "missing" in str(e.value)
        assert files_of(path) == before
        # no new catalog was created either (the database's id file stays, as it was, and
        # the snapshots and readers directories of the writer that had it open)
        assert sorted(os.listdir(path)) == ["database.id", "readers", "snapshots", "tiles"]


@pytest.mark.parametrize("damage", ["empty duckdb file", "zero bytes", "tables dropped",
                                    "tiles table dropped", "tiles rows deleted"])
def test_foreign_or_damaged_catalog_deletes_no_payload(tmp_path, damage):
    path = tmp_path / "w.tdb"
    _database_with_payloads(path)
    payloads = sorted(os.listdir(path / "tiles"))
    catalog = str(path / "catalog.duckdb")
    if damage == "empty duckdb file":
        os.unlink(catalog)
        duckdb.connect(catalog).close()
    elif damage == "zero bytes":
        open(catalog, "wb").close()
    else:
        with duckdb.connect(catalog) as d:
            d.execute({"tables dropped": "DROP SCHEMA tensordb CASCADE",
                       "tiles table dropped": "DROP TABLE tensordb.tiles",
                       "tiles rows deleted": "DELETE FROM tensordb.tiles"}[damage])
    tiles_before = {n: (path / "tiles" / n).read_bytes() for n in payloads}
    if damage == "tiles rows deleted":
        # The tensors table still names both versions: their payloads are not orphans.
        tensordb.connect(path).close()
    else:
        with pytest.raises(tensordb.OperationalError) as e:
            tensordb.connect(path)
        assert "catalog" in str(e.value)
    assert {n: (path / "tiles" / n).read_bytes() for n in sorted(os.listdir(path / "tiles"))} \
        == tiles_before


def test_orphan_cleanup_keeps_directories_and_still_removes_orphans(tmp_path):
    path = tmp_path / "w.tdb"
    _database_with_payloads(path)
    os.makedirs(path / "tiles" / "user_dir")
    (path / "tiles" / "user_dir" / "keep.txt").write_text("mine")
    (path / "tiles" / "999.bin").write_bytes(b"x" * 64)  # a crash leftover: no row names it
    with tensordb.connect(path) as con:
        assert (path / "tiles" / "user_dir" / "keep.txt").read_text() == "mine"
        assert not (path / "tiles" / "999.bin").exists()
        np.testing.assert_array_equal(con.tensor("A"), A)


def test_empty_directory_and_empty_tiles_still_open(tmp_path):
    (tmp_path / "fresh").mkdir()
    with tensordb.connect(tmp_path / "fresh") as con:
        con.load("A", A)
    (tmp_path / "t" / "tiles").mkdir(parents=True)  # a database that crashed while being made
    with tensordb.connect(tmp_path / "t") as con:
        assert con.tensors() == []
