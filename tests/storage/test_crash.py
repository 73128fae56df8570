"""kill -9 at any moment leaves the old tensor or the new one, and reopening removes orphans.

A child process replaces a small tensor with a 256 MiB one and is killed with SIGKILL at chosen
points: in the middle of the payload write, after the payload but before the catalog
transaction, inside it before COMMIT, after COMMIT before the old payload is deleted, and after
the load returned without closing (DuckDB must replay its WAL). Another child is killed from
outside while its payload file grows. The parent reopens the database each time and checks.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tensordb
from tests.harness import assert_killed, assert_payloads_referenced, kill9, start_script
from tensordb.storage.identity import payload_name, read_id_file

COLS = 4096
ROWS = 16384            # 16384 x 4096 float32 = 256 MiB
TILE = (1024, COLS)     # 16 tiles of 16 MiB
OLD = np.full((8, 8), 7.0, "float32")

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensordb
    from tensordb.storage import catalog, spares, store as st, writer as wr
    from tests.harness import die, die_after, die_before, nth_call

    path, point, rows, cols, tile_rows = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])

    if point.startswith("tile"):           # after k tiles of the payload are written
        die_after(wr.TensorWriter, "write_tile", nth_call(int(point[4:])))
    elif point == "before_catalog":        # payload complete and synced, catalog untouched
        die_before(st.Store, "_commit_writers")
    elif point == "before_commit":         # rows written inside the transaction, no COMMIT
        die_after(catalog, "store")        # the rows of the new tensors, or the swapped ones
    elif point == "after_commit":          # COMMIT done, the old payload not yet deleted
        die_before(spares.SparePayloads, "retire")

    con = tensordb.connect(path)
    a = np.empty((rows, cols), "float32")
    a[:] = np.arange(rows, dtype="float32")[:, None] + 0.5 * np.arange(cols, dtype="float32")
    print("loading", flush=True)
    con.load("T", a, replace=True, tile=(tile_rows, cols))
    if point == "after_load":              # no close: the catalog change is only in the WAL
        die()
    con.close()
""")


def new_value():
    a = np.empty((ROWS, COLS), "float32")
    a[:] = np.arange(ROWS, dtype="float32")[:, None] + 0.5 * np.arange(COLS, dtype="float32")
    return a


@pytest.fixture(scope="module")
def expected_new():
    return new_value()


def child(path, point):
    return start_script(CHILD, path, point, ROWS, COLS, TILE[0])


def make_old(path):
    with tensordb.connect(path) as c:
        c.load("T", OLD)
        return c.store.meta("T").version


def state_after_crash(path, expected_new):
    """Reopen; check orphans are gone; return 'old' or 'new' (anything else fails the test)."""
    with tensordb.connect(path) as c:
        assert_payloads_referenced(c)
        assert [t["name"] for t in c.tensors()] == ["T"]
        got = c.tensor("T")
    if got.shape == OLD.shape:
        np.testing.assert_array_equal(got, OLD)
        return "old"
    assert got.shape == (ROWS, COLS)
    assert np.array_equal(got, expected_new), "a half-written tensor is visible"
    return "new"


@pytest.mark.parametrize("point, outcome", [
    ("tile1", "old"), ("tile9", "old"), ("before_catalog", "old"), ("before_commit", "old"),
    ("after_commit", "new"), ("after_load", "new")])
def test_kill_at_chosen_points(tmp_path, expected_new, point, outcome):
    path = tmp_path / "db"
    make_old(path)
    p = child(path, point)
    _, err = p.communicate(timeout=120)
    assert_killed(p.returncode, err)
    tiles = os.listdir(path / "tiles")
    if outcome == "old":
        assert len(tiles) == 2  # the old payload and the orphaned new one
    if point == "after_load":
        assert os.path.getsize(path / "catalog.duckdb.wal") > 0  # reopening must replay it
    assert state_after_crash(path, expected_new) == outcome


def test_kill_from_outside_while_payload_grows(tmp_path, expected_new):
    path = tmp_path / "db"
    old_version = make_old(path)
    p = child(path, "none")
    payload = path / "tiles" / payload_name(old_version + 1, read_id_file(str(path)))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if payload.exists() and payload.stat().st_size > 64 << 20:
            break
        time.sleep(0.005)
    kill9(p)
    assert state_after_crash(path, expected_new) == "old"


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.2, 0.6, 1.0, 1.4, 1.8, 2.2, 2.6, 3.0])
def test_kill_at_timed_moments(tmp_path, expected_new, delay):
    path = tmp_path / "db"
    make_old(path)
    p = child(path, "none")
    p.stdout.readline()  # the child is about to load
    time.sleep(delay)
    p.kill()
    p.wait()
    state_after_crash(path, expected_new)  # old or new; never anything else


def test_new_tensor_crash_leaves_nothing(tmp_path):
    path = tmp_path / "db"
    with tensordb.connect(path):
        pass
    p = child(path, "tile3")
    _, err = p.communicate(timeout=120)
    assert_killed(p.returncode, err)
    assert len(os.listdir(path / "tiles")) == 1
    with tensordb.connect(path) as c:
        assert c.tensors() == [] and os.listdir(c.store.tiles_dir) == []


HOLD = textwrap.dedent("""
    import sys, tensordb
    con = tensordb.connect(sys.argv[1], read_only=sys.argv[2] == "ro")
    print("ready", flush=True)
    sys.stdin.read()
    con.close()
""")


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_second_process_cannot_write(tmp_path, mode):
    path = tmp_path / "db"
    with tensordb.connect(path) as c:
        c.load("A", np.ones(3))
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), mode], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"ready"
        if mode == "rw":
            with pytest.raises(tensordb.OperationalError,
                               match=f"locked: process {p.pid}") as info:
                tensordb.connect(path)
            assert "one writer at a time" in str(info.value)
        else:  # a reader holds no lock on the catalog (readview.py): a writer opens beside it
            with tensordb.connect(path) as c:
                np.testing.assert_array_equal(c.tensor("A"), np.ones(3))
        # readers share with readers, and read a writer's published snapshot (snapshots.py)
        # or, with no writer open, their own copy of the catalog (readview.py)
        with tensordb.connect(path, read_only=True) as c:
            np.testing.assert_array_equal(c.tensor("A"), np.ones(3))
            assert c.store.view.own == (mode == "ro")
    finally:
        p.communicate(b"", timeout=60)
    with tensordb.connect(path) as c:  # the holder is gone: writable again, data intact
        np.testing.assert_array_equal(c.tensor("A"), np.ones(3))
