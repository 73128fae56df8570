"""Readers in other processes while one process writes (storage/snapshots.py), from the user's
side: real processes, a real database directory, every read checked with NumPy against one
committed version."""
from __future__ import annotations

import os
import subprocess
import textwrap
import time

import numpy as np
import pytest

import tensordb
from tests.harness import assert_payloads_referenced, kill9, start_script

N, TILE = 64, 16  # 16 tiles a tensor: a read that mixed two versions would show it

# Each commit stores A = k everywhere and B = 2k, together (one BEGIN ... COMMIT block).
WRITER = textwrap.dedent("""
    import os, sys, time, numpy as np, tensordb
    con = tensordb.connect(sys.argv[1])
    con.load("A", np.zeros((64, 64)), tile=(16, 16), replace=True)
    con.execute("B[i,j] = A[i,j] * 2")
    print("ready", flush=True)
    deadline, steps = time.monotonic() + float(sys.argv[2]), 0
    stop = sys.argv[1] + ".stop"  # the reader is done: it makes this file
    while time.monotonic() < deadline and not os.path.exists(stop):
        con.execute_script("BEGIN; A[i,j] = A[i,j] + 1; B[i,j] = A[i,j] * 2; COMMIT;")
        steps += 1
    if len(sys.argv) > 3:  # stay open, idle, as a REPL does
        print(steps, flush=True)
        sys.stdin.read()
    con.close()
    print(steps, flush=True)
""")

HOLD = textwrap.dedent("""
    import sys, tensordb
    con = tensordb.connect(sys.argv[1], read_only=sys.argv[2] == "ro")
    con.tensor("A")
    print("ready", flush=True)
    sys.stdin.read()
""")


def joined_version(con, k2: int) -> int:
    """The version ``k`` (A = k, B = 2k) that one SQL statement joining A and B read, checked
    whole: not older than ``k2``, read before. A tensor's SQL view holds its nonzeros only, so
    version 0 (the writer's first, all zeros) joins to no rows; the statement counts each side
    too, so that a half version (one side empty, the other not) is still told from it."""
    rows = con.execute("SELECT min(A.value), max(A.value), min(B.value), max(B.value), "
                       "count(*), (SELECT count(*) FROM A), (SELECT count(*) FROM B) "
                       "FROM A JOIN B USING (i, j)").fetchall()
    lo, hi, blo, bhi, count, in_a, in_b = rows[0]
    if count == 0:  # version 0: neither side has a row
        assert (lo, hi, blo, bhi, in_a, in_b) == (None, None, None, None, 0, 0), rows
        assert k2 == 0, rows
        return 0
    assert lo == hi and blo == bhi == 2 * lo and count == in_a == in_b == N * N, rows
    assert lo >= k2, rows  # never an older commit than one read before
    return lo


def test_a_reader_sees_whole_committed_versions_while_another_process_writes(tmp_path):
    root = str(tmp_path / "db")
    writer = start_script(WRITER, root, "60")
    try:
        assert writer.stdout.readline().strip() == b"ready"
        seen = []
        with tensordb.connect(root, read_only=True) as con:  # the writer holds the catalog
            assert not con.store.view.own  # a published snapshot
            start = time.monotonic()
            while len(set(seen)) < 8:  # eight versions, each read whole
                assert time.monotonic() - start < 50, seen  # the writer stops at 60 s
                a = con.tensor("A")
                k = a[0, 0]
                np.testing.assert_array_equal(a, np.full((N, N), k))  # one version, whole
                # A and B in one statement: the same commit, so B = 2 A everywhere
                both = con.einsum("ij,ij->ij", "A", "B")
                k2 = round((both[0, 0] / 2) ** 0.5)  # A = k2 and B = 2 k2: A B = 2 k2^2
                np.testing.assert_allclose(both, np.full((N, N), 2 * k2 * k2))
                lo = joined_version(con, k2)  # A and B in one SQL statement
                seen.append(k)
                assert k2 >= k and lo >= k2  # never an older commit than one read before
        open(root + ".stop", "w").close()
        out, _ = writer.communicate(timeout=120)
        assert writer.returncode == 0
        steps = int(out.split()[-1])
    finally:
        if writer.poll() is None:
            kill9(writer)
    with tensordb.connect(root) as con:  # the reader is gone: everything deferred is collected
        np.testing.assert_array_equal(con.tensor("A"), np.full((N, N), float(steps)))
        assert_payloads_referenced(con)
        assert os.listdir(os.path.join(root, "readers")) == []


def test_an_idle_writer_blocks_no_reader_and_a_second_writer_is_refused(tmp_path):
    root = str(tmp_path / "db")
    with tensordb.connect(root) as con:
        con.load("A", np.arange(12.0).reshape(3, 4))
    holder = start_script(HOLD, root, "rw", stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ready"
        with tensordb.connect(root, read_only=True) as con:
            np.testing.assert_array_equal(con.tensor("A"), np.arange(12.0).reshape(3, 4))
            assert con.execute("SELECT sum(value) FROM A").fetchall() == [(66.0,)]
            with pytest.raises(tensordb.OperationalError, match="read-only"):
                con.load("B", np.ones(2))
        with pytest.raises(tensordb.OperationalError,
                           match=f"locked: process {holder.pid} has it open for writing") as info:
            tensordb.connect(root)  # one writer at a time: refused at once, not waited for
        assert "one writer at a time" in str(info.value)
    finally:
        holder.communicate(b"", timeout=60)


def test_a_readers_snapshot_keeps_its_payload_files(tmp_path):
    root = str(tmp_path / "db")
    writer = start_script(WRITER, root, "1.5", "stay", stdin=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == b"ready"
        with tensordb.connect(root, read_only=True) as con:
            while con.tensor("A")[0, 0] == 0:  # a call: the newest commit (A = 0 needs no
                pass                               # payload file)
            # Store.open takes no new snapshot (a call does): the version this reader holds
            old = con.store.open("A")
            k = con.store.open("B").to_numpy()[0, 0] / 2
            files = reader_files(con)  # A's and B's payloads (dense: named by version)
            assert len(files) == 2 and all(os.path.exists(f) for f in files)
            steps = int(writer.stdout.readline())  # the writer has committed more since
            assert steps > 3
            assert all(os.path.exists(f) for f in files)  # none deleted, none reused
            np.testing.assert_array_equal(old.to_numpy(), np.full((N, N), k))
            np.testing.assert_array_equal(con.store.open("B").to_numpy(), np.full((N, N), 2 * k))
            newer = con.tensor("A")  # a call: the newest published commit
            assert newer[0, 0] > k
        writer.communicate(b"", timeout=60)
        assert writer.returncode == 0
    finally:
        if writer.poll() is None:
            kill9(writer)
    with tensordb.connect(root) as con:  # nobody reads the old snapshot now: its files go
        assert not any(os.path.exists(f) for f in files)
        assert_payloads_referenced(con)


def test_a_dead_readers_lease_pins_nothing(tmp_path):
    root = str(tmp_path / "db")
    with tensordb.connect(root) as con:
        con.load("A", np.ones((4, 4)))
        holder = start_script(HOLD, root, "ro", stdin=subprocess.PIPE)
        # a reader of our own process' commits: the database is held, so it reads snapshots
        assert holder.stdout.readline().strip() == b"ready"
        old = {os.path.join(con.store.tiles_dir, f) for f in os.listdir(con.store.tiles_dir)}
        con.load("A", np.full((4, 4), 2.0), replace=True)
        assert all(os.path.exists(f) for f in old)  # the live reader may still read them
        kill9(holder)
        con.load("A", np.full((4, 4), 3.0), replace=True)  # its lease is found dead
        assert not any(os.path.exists(f) for f in old)
        assert os.listdir(os.path.join(root, "readers")) == []
        referenced = {r[0] for r in con.store.duck.execute(
            "SELECT DISTINCT file FROM tensordb.tiles").fetchall()}
        kept = {f for f in os.listdir(con.store.tiles_dir)
                if os.path.join(con.store.tiles_dir, f) in con.store.spares}  # kept for reuse
        assert set(os.listdir(con.store.tiles_dir)) - kept == referenced


def reader_files(con) -> set[str]:
    from tests.storage.test_reader_before_writer import _files
    return _files(con)
