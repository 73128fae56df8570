"""kill -9 around an on-disk commit whose catalog rows go to the redo log (storage/redolog.py).

A child process replaces A (two tiles) and B with new values in steps, each step one
statement (``A[i,j] = A[i,j] + 1 ...``: a computed output, its rows kept back and logged), and
is killed with SIGKILL at chosen points: after the payloads' syncs before the log's record,
in the middle of the record (half of its bytes written: a torn record), after the record's
fdatasync, after the flush's DuckDB COMMIT before the log is emptied, and, at the next open,
during the replay (before its COMMIT; after it, before the log is emptied). The parent
reopens the database and checks against numpy: A and B are exactly the values of the last
step that returned (or of the step killed, for points after its record), never a mix; every
payload file is referenced; CHECK DATABASE reports nothing wrong; and the log is empty.
"""
from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

import tensordb
from tensordb.storage import redolog
from tests.harness import assert_killed, assert_payloads_referenced, run_script

A0 = np.arange(64 * 16, dtype="float64").reshape(64, 16)
B0 = np.linspace(-1.0, 1.0, 32).astype("float32")
STEP = "A[i,j] = A[i,j] + 1.5; B[i] = B[i] * 2"

CHILD = textwrap.dedent("""
    import os, sys
    import tensordb
    from tensordb.storage import catalog, redolog, store as st
    from tests.harness import die, die_after, die_before, nth_call

    path, point, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    con = tensordb.connect(path)
    step = "A[i,j] = A[i,j] + 1.5; B[i] = B[i] * 2"
    for _ in range(steps):                 # logged steps (the first goes to DuckDB: this
        con.execute(step)                  # process had not read the old versions' tiles)
    if point == "before_record":            # payloads synced, rows kept, no record
        die_before(redolog.RedoLog, "append")
    elif point == "torn_record":            # half of the record's bytes, then the kill
        def torn(fd, data, offset):
            os.pwrite(fd, data[:len(data) // 2], offset)
            os.fdatasync(fd)
            die()
        redolog._write = torn
    elif point == "after_record":           # the record durable, the old payloads not retired
        die_after(redolog.RedoLog, "append")
    elif point == "after_flush":            # DuckDB's COMMIT of the logged rows, log not emptied
        die_before(redolog.RedoLog, "clear")
    elif point == "after_steps":            # every step returned, nothing flushed, no close
        con.execute(step)
        die()
    print("killing step", flush=True)
    con.execute(step)
    if point == "after_flush":
        con.sql("SELECT count(*) FROM tensordb.tensors").fetchall()  # flushes the log
    con.close()
""")

REPLAY = textwrap.dedent("""
    import sys
    import tensordb
    from tensordb.storage import redolog
    from tests.harness import die, die_after

    path, point = sys.argv[1], sys.argv[2]
    if point == "replay_before_commit":     # the rows applied in DuckDB's transaction
        die_after(redolog, "apply")
    elif point == "replay_after_commit":    # committed, the log not yet emptied
        redolog._truncate_path = lambda path: die()
    tensordb.connect(path)
""")


def expected(steps: int):
    a, b = A0.copy(), B0.copy()
    for _ in range(steps):
        a, b = a + 1.5, b * np.float32(2)
    return a, b


def make(path) -> None:
    with tensordb.connect(path) as c:
        c.load("A", A0, tile=(32, 16))
        c.load("B", B0)


def check_state(path, steps: int) -> None:
    with tensordb.connect(path) as c:
        assert_payloads_referenced(c)
        assert [r["problem"] for r in c.check()] == ["ok"]
        got_a, got_b = c.tensor("A"), c.tensor("B")
        assert [t["name"] for t in c.tensors()] == ["A", "B"]
    assert not os.path.exists(path / redolog.LOG_FILE)  # replayed, emptied, removed at close
    a, b = expected(steps)
    np.testing.assert_array_equal(got_a, a)
    np.testing.assert_array_equal(got_b, b)


def kill_child(path, point, steps):
    proc = run_script(CHILD, path, point, steps)
    assert_killed(proc.returncode, proc.stderr)
    return proc


@pytest.mark.parametrize("point, done", [
    ("before_record", 0), ("torn_record", 0), ("after_record", 1), ("after_flush", 1),
    ("after_steps", 1)])
def test_kill_around_the_redo_record(tmp_path, point, done):
    """Three steps returned (two of them logged) before the killed one; ``done``: whether the
    killed step's commit is in the state the reopen finds."""
    path = tmp_path / "db"
    make(path)
    kill_child(path, point, 3)
    log = path / redolog.LOG_FILE
    records, valid, size = redolog.read(str(log))
    if point == "torn_record":
        assert size > valid  # the torn tail is there, and ignored
    if point in ("before_record", "torn_record", "after_record", "after_steps"):
        assert len(records) >= 2  # the steps before were logged, not written to DuckDB
    a, b = expected(3 + done)
    with tensordb.connect(path, read_only=True) as r:  # a reader applies the log to its copy
        np.testing.assert_array_equal(r.tensor("A"), a)
        np.testing.assert_array_equal(r.tensor("B"), b)
        assert r.sql("SELECT version FROM tensordb.tensors WHERE name = 'A'").fetchall() == \
            [(r.store.meta("A").version,)]
    assert os.path.getsize(log) == size  # and leaves the log to the writer
    check_state(path, 3 + done)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["replay_before_commit", "replay_after_commit"])
def test_kill_during_replay(tmp_path, point):
    """A log of logged steps (the writer killed after its last record), then an open killed
    during the replay: the next open replays again (idempotent) and finds the same state."""
    path = tmp_path / "db"
    make(path)
    kill_child(path, "after_record", 2)
    assert len(redolog.read(str(path / redolog.LOG_FILE))[0]) >= 2
    proc = run_script(REPLAY, path, point)
    assert_killed(proc.returncode, proc.stderr)
    check_state(path, 3)


def test_torn_tail_opens_old_state_and_check_is_clean(tmp_path):
    """A log whose last record is cut short (a commit that never returned): opened in this
    process, the valid records apply, the tail is dropped; CHECK reports nothing wrong."""
    path = tmp_path / "db"
    make(path)
    with tensordb.connect(path) as c:
        for _ in range(3):
            c.execute(STEP)
        log = path / redolog.LOG_FILE
        size = os.path.getsize(log)
        assert size > 0 and len(c.store._pending) == 2  # two steps logged (A and B pending)
        records = redolog.read(str(log))[0]
        rows = records[-1]
        # keep the log of the two logged steps and add half of one more record
        with open(log, "rb") as f:
            data = f.read()
        extra = redolog.encode(rows)
        # simulate a crash: the catalog must not be flushed by this close
        c.store.redo.close()
        c.store.redo, c.store._pending = None, {}
        c.store._txn = None
    with open(log, "wb") as f:
        f.write(data + extra[: len(extra) // 2])
    check_state(path, 3)


def test_bad_checksum_ends_the_valid_prefix(tmp_path):
    """A record whose body does not match its crc32 ends the valid prefix: at the log's end it
    is a commit that never returned (dropped); followed by a valid record it is damage, not a
    torn append, and reading the log refuses (OperationalError) rather than drop commits that
    returned (test_redolog.py opens such a database)."""
    path = tmp_path / "db"
    make(path)
    with tensordb.connect(path) as c:
        metas = [c.store.meta("A"), c.store.meta("B")]
    one = redolog.encode([(metas[1], metas[1], "x", [])])
    bad = bytearray(one)
    bad[-2] ^= 0xFF
    (path / redolog.LOG_FILE).write_bytes(one + one + bytes(bad))
    records, valid, size = redolog.read(str(path / redolog.LOG_FILE))
    assert len(records) == 2 and valid == 2 * len(one) and size == 3 * len(one)
    (path / redolog.LOG_FILE).write_bytes(one + bytes(bad) + one)
    with pytest.raises(tensordb.OperationalError, match="damaged at byte"):
        redolog.read(str(path / redolog.LOG_FILE))
