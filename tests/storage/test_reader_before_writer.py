"""A reader opened while no writer is open never blocks a writer that comes later
(storage/readview.py): it reads catalog.duckdb only while it copies the catalog, under a lease
taken first. Real processes and a real database directory; every read checked with NumPy."""
from __future__ import annotations

import os
import subprocess
import textwrap
import time

import numpy as np
import pytest

import tensordb
from tensordb.storage import directory, identity
from tests.harness import assert_payloads_referenced, kill9, run_script, start_script
from tests.storage.test_concurrent_readers import HOLD, N, TILE, WRITER, joined_version

# A writer that opens (beside a live reader), replaces A ``argv[2]`` times (A = previous + 1,
# B = 2 A, one commit each) and closes; it prints how long its open took.
REPLACE = textwrap.dedent("""
    import sys, time, tensordb
    start = time.monotonic()
    con = tensordb.connect(sys.argv[1])
    print(time.monotonic() - start, flush=True)
    for _ in range(int(sys.argv[2])):
        con.execute_script("BEGIN; A[i,j] = A[i,j] + 1; B[i,j] = A[i,j] * 2; COMMIT;")
    con.close()
""")


def _make(root: str) -> None:
    with tensordb.connect(root) as con:
        con.load("A", np.ones((N, N)), tile=(TILE, TILE))  # not zeros: those need no file
        con.execute("B[i,j] = A[i,j] * 2")


def _files(con) -> set[str]:
    """The payload files what the reader holds names: the tiles' files and each tensor
    version's dense payload (named by its version, identity.payload_name)."""
    duck = con.store.duck
    names = {r[0] for r in duck.execute("SELECT DISTINCT file FROM tensordb.tiles").fetchall()}
    names |= {identity.payload_name(v, con.store.database) for (v,) in
              duck.execute("SELECT version FROM tensordb.tensors WHERE nnz > 0").fetchall()}
    return {os.path.join(con.store.tiles_dir, n) for n in names}


def _check(con) -> float:
    """A and B read in one call: one committed version, whole (A = k everywhere, B = 2k)."""
    a = con.tensor("A")
    k = a[0, 0]
    np.testing.assert_array_equal(a, np.full((N, N), k))
    both = con.einsum("ij,ij->ij", "A", "B")  # A = k2, B = 2 k2 of one commit: 2 k2^2
    k2 = round((both[0, 0] / 2) ** 0.5)
    np.testing.assert_array_equal(both, np.full((N, N), 2.0 * k2 * k2))
    assert k2 >= k  # the einsum's call may see a newer commit, never an older one
    return k


def test_a_writer_opens_and_commits_beside_a_reader_opened_first(tmp_path):
    root = str(tmp_path / "db")
    _make(root)
    with tensordb.connect(root, read_only=True) as con:
        assert con.store.view.own  # no writer was open: its own copy of the catalog
        assert _check(con) == 1
        writer = start_script(WRITER, root, "60")  # opens while this reader lives
        try:
            assert writer.stdout.readline().strip() == b"ready", writer.stderr.read()
            seen, start, checked = [], time.monotonic(), 0
            while len(set(seen)) < 8:
                assert time.monotonic() - start < 50, seen
                k = _check(con)
                assert not seen or k >= seen[-1]  # never an older commit than one read before
                files = _files(con)  # (none while A = 0: zeros need no payload)
                assert all(os.path.exists(f) for f in files)  # none deleted, none reused
                checked += bool(files)
                joined_version(con, k)  # A and B in one SQL statement (A = 0: no rows)
                seen.append(k)
            assert checked >= 6
            assert not con.store.view.own  # it moved on to the writer's published snapshots
            open(root + ".stop", "w").close()
            out, err = writer.communicate(timeout=120)
            assert writer.returncode == 0, err
            steps = int(out.split()[-1])
        finally:
            if writer.poll() is None:
                kill9(writer)
        np.testing.assert_array_equal(con.tensor("A"), np.full((N, N), float(steps)))
    with tensordb.connect(root) as con:
        np.testing.assert_array_equal(con.tensor("A"), np.full((N, N), float(steps)))
        assert_payloads_referenced(con)
        assert os.listdir(os.path.join(root, "readers")) == []


def test_a_writers_sweep_keeps_every_file_a_readers_copy_names(tmp_path):
    root = str(tmp_path / "db")
    _make(root)
    with tensordb.connect(root, read_only=True) as con:
        old_a, old_b = con.store.open("A"), con.store.open("B")  # what it holds now: A = 1
        files = _files(con)
        assert len(files) == 2 and all(os.path.exists(f) for f in files)
        for _ in range(2):  # each writer replaces A and B; the second one's open sweeps the
            done = run_script(REPLACE, root, "3")  # files the first retired but kept for us
            assert done.returncode == 0, done.stderr
            assert float(done.stdout.split()[0]) < 3  # a reader does not hold a writer back
        assert all(os.path.exists(f) for f in files)  # none deleted, none reused
        np.testing.assert_array_equal(old_a.to_numpy(), np.ones((N, N)))
        np.testing.assert_array_equal(old_b.to_numpy(), np.full((N, N), 2.0))
        np.testing.assert_array_equal(con.tensor("A"), np.full((N, N), 7.0))  # a call: newest
        np.testing.assert_array_equal(con.tensor("B"), np.full((N, N), 14.0))
    with tensordb.connect(root) as con:  # nobody reads A = 1 now: its files go
        assert not any(os.path.exists(f) for f in files)
        assert_payloads_referenced(con)


def test_a_killed_readers_lease_is_cleaned(tmp_path):
    root = str(tmp_path / "db")
    _make(root)
    holder = start_script(HOLD, root, "ro", stdin=subprocess.PIPE)  # reads first, then dies
    assert holder.stdout.readline().strip() == b"ready"
    with tensordb.connect(root) as con:  # the reader holds no lock: this writer opens
        old = {os.path.join(con.store.tiles_dir, f) for f in os.listdir(con.store.tiles_dir)}
        assert len(old) == 2  # A's and B's
        con.load("A", np.full((N, N), 2.0), tile=(TILE, TILE), replace=True)
        assert all(os.path.exists(f) for f in old)  # the live reader may still read them
        kill9(holder)
        con.load("A", np.full((N, N), 3.0), tile=(TILE, TILE), replace=True)  # found dead
        assert os.listdir(os.path.join(root, "readers")) == []
        gone = {f for f in old if not os.path.exists(f)}
        assert len(gone) == 1  # A's first version: nobody reads it now; B's is still B's
        np.testing.assert_array_equal(con.tensor("A"), np.full((N, N), 3.0))
    with tensordb.connect(root) as con:
        assert_payloads_referenced(con)


# A process that holds catalog.duckdb read-only for argv[2] seconds, as DuckDB itself would.
HOLD_FILE = textwrap.dedent("""
    import sys, time, duckdb
    duck = duckdb.connect(sys.argv[1], read_only=True)
    print("ready", flush=True)
    time.sleep(float(sys.argv[2]))
    duck.close()
""")


def test_a_writer_waits_out_a_brief_read_of_the_catalog_and_no_longer(tmp_path, monkeypatch):
    root = str(tmp_path / "db")
    _make(root)
    catalog = os.path.join(root, directory.CATALOG_FILE)
    brief = start_script(HOLD_FILE, catalog, "0.5")
    assert brief.stdout.readline().strip() == b"ready"
    start = time.monotonic()
    with tensordb.connect(root) as con:  # waits for the read to end, then opens
        assert time.monotonic() - start < directory.READER_GRACE
        np.testing.assert_array_equal(con.tensor("A"), np.ones((N, N)))
    brief.communicate(timeout=60)
    monkeypatch.setattr(directory, "READER_GRACE", 0.3)
    held = start_script(HOLD_FILE, catalog, "30")  # not a tensordb reader: holds it on
    try:
        assert held.stdout.readline().strip() == b"ready"
        with pytest.raises(tensordb.OperationalError,
                           match=f"locked: process {held.pid} has it open read-only"):
            tensordb.connect(root)
    finally:
        kill9(held)


def test_a_reader_reads_the_databases_own_tables_while_no_writer_is_open(tmp_path):
    root = str(tmp_path / "db")
    _make(root)
    with tensordb.connect(root) as con:
        con.execute("CREATE TABLE people AS SELECT 1 AS id")
        truth = con.execute("SELECT sum(value) FROM A").fetchall()
    with tensordb.connect(root, read_only=True) as con:
        assert con.execute("SELECT sum(value) FROM A").fetchall() == truth  # tensors: seen
        assert con.execute("SELECT * FROM people").fetchall() == [(1,)]  # tables: attached
        held = start_script(HOLD, root, "rw", stdin=subprocess.PIPE)  # a writer holds it
        try:
            assert held.stdout.readline().strip() == b"ready", held.stderr.read()
            with pytest.raises(tensordb.ProgrammingError) as info:
                con.execute("SELECT * FROM people")
            text = str(info.value)
            assert "people is not visible to a read-only connection" in text
            assert "own DuckDB tables" in text and "SELECT * FROM people" in text
            assert "writer has the database open" in text
        finally:
            kill9(held)
        with pytest.raises(tensordb.ProgrammingError) as info:  # a name that is nowhere
            con.execute("SELECT * FROM nobody")
        assert "read-only" not in str(info.value) and "nobody" in str(info.value)


# A writer killed before its thread published what it committed (the thread is kept from
# running, so that the kill surely comes first): only the catalog file holds the commit.
UNPUBLISHED = textwrap.dedent("""
    import sys, numpy as np, tensordb
    from tensordb.storage import snapshots
    snapshots.Publisher._serve = lambda self: None
    con = tensordb.connect(sys.argv[1])
    con.load("A", np.full((64, 64), 5.0), tile=(16, 16), replace=True)
    print("stored", flush=True)
    sys.stdin.read()
""")


def test_a_reader_rereads_the_catalog_a_killed_writer_left_unpublished(tmp_path):
    root = str(tmp_path / "db")
    _make(root)
    with tensordb.connect(root, read_only=True) as con:
        np.testing.assert_array_equal(con.tensor("A"), np.ones((N, N)))
        writer = start_script(UNPUBLISHED, root, stdin=subprocess.PIPE)
        assert writer.stdout.readline().strip() == b"stored"
        np.testing.assert_array_equal(con.tensor("A"), np.ones((N, N)))  # nothing published
        kill9(writer)
        np.testing.assert_array_equal(con.tensor("A"), np.full((N, N), 5.0))  # the catalog's
        assert con.store.view.own
        np.testing.assert_array_equal(con.tensor("B"), np.full((N, N), 2.0))
    with tensordb.connect(root) as con:
        np.testing.assert_array_equal(con.tensor("A"), np.full((N, N), 5.0))
        assert_payloads_referenced(con)


READ_A = textwrap.dedent("""
    import sys, tensordb
    print("opening", flush=True)
    with tensordb.connect(sys.argv[1], read_only=True) as con:
        a = con.tensor("A")
        print(a.min(), a.max(), con.store.view.own, flush=True)
""")


def test_a_reader_waiting_for_a_writer_that_dies_reads_the_catalog(tmp_path):
    root = str(tmp_path / "db")
    _make(root)
    writer = start_script(UNPUBLISHED, root, stdin=subprocess.PIPE)  # never answers a reader
    try:
        assert writer.stdout.readline().strip() == b"stored"
        reader = start_script(READ_A, root)
        assert reader.stdout.readline().strip() == b"opening"
        time.sleep(0.5)
        assert reader.poll() is None  # waiting for the writer's answer
        kill9(writer)
        out, err = reader.communicate(timeout=60)
        assert reader.returncode == 0, err
        assert out.split() == [b"5.0", b"5.0", b"True"]  # the killed writer's commit, whole
    finally:
        if writer.poll() is None:
            kill9(writer)
