"""The redo log of an on-disk database (storage/redolog.py) in one process: a failed append
changes nothing, the log's bound writes it to DuckDB, a reader in another process sees the
logged versions, and replay applies only what the catalog does not hold. Real databases under
tmp_path; oracles: numpy's values and DuckDB's own rows."""
from __future__ import annotations

import dataclasses
import os
import textwrap

import numpy as np
import pytest

import tensordb
from tensordb.storage import catalog, redolog
from tests.harness import assert_payloads_referenced, run_script

STEP = "A[i,j] = A[i,j] * 2 + 1"
A0 = np.arange(32.0).reshape(8, 4)


def _db(path):
    con = tensordb.connect(path)
    con.load("A", A0, tile=(4, 4))
    con.execute(STEP)  # the first replace: A's old tiles now known to this process
    return con


@pytest.mark.parametrize("undone", [True, False], ids=["cut-back", "cut-back-fails"])
def test_a_failed_append_changes_nothing(tmp_path, monkeypatch, undone):
    """The record's fdatasync fails (a full disk): the statement raises OperationalError and
    nothing lands. ``undone``: the log is cut back to its length before the record (and the
    new payload removed); else that fails too, the payload is kept (a record may name it) and
    the next commit writes DuckDB, emptying the log first."""
    con = _db(tmp_path / "db")
    want = A0 * 2 + 1
    try:
        con.execute(STEP)  # logged
        want = want * 2 + 1
        log = tmp_path / "db" / redolog.LOG_FILE
        size = os.path.getsize(log)
        assert size
        files = set(os.listdir(con.store.tiles_dir))
        version = con.store.meta("A").version
        real, calls = redolog._sync, []

        def failing(fd):
            calls.append(fd)
            if len(calls) == 1 or not undone:
                raise OSError(28, "No space left on device")
            real(fd)
        monkeypatch.setattr(redolog, "_sync", failing)
        with pytest.raises(tensordb.OperationalError) as e:
            con.execute(STEP)
        assert "redo log" in str(e.value) and "No space left" in str(e.value)
        monkeypatch.undo()
        assert con.store.meta("A").version == version
        np.testing.assert_array_equal(con.tensor("A"), want)
        after = set(os.listdir(con.store.tiles_dir))
        if undone:  # cut back (then emptied: the cleanup's catalog read wrote the rows)
            assert os.path.getsize(log) in (0, size)
            assert all(m.version <= version for r in redolog.read(str(log))[0]
                       for _, m, _, _ in r)
            assert after <= files  # its new payload removed
        else:
            assert len(after - files) == 1  # kept; the log emptied by the next catalog read
            assert os.path.getsize(log) == 0 and not con.store.redo.broken
        con.execute(STEP)  # logged again
        want = want * 2 + 1
        assert os.path.getsize(log) > 0 and not con.store.redo.broken
        np.testing.assert_array_equal(con.tensor("A"), want)
    finally:
        con.close()
    with tensordb.connect(tmp_path / "db") as con:
        np.testing.assert_array_equal(con.tensor("A"), want)
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert_payloads_referenced(con)  # the kept payload swept as an orphan


def test_the_bound_writes_the_log_to_duckdb(tmp_path, monkeypatch):
    monkeypatch.setattr(redolog, "MAX_RECORDS", 3)
    con = _db(tmp_path / "db")
    try:
        log = tmp_path / "db" / redolog.LOG_FILE
        sizes = []
        for _ in range(7):
            con.execute(STEP)
            sizes.append(os.path.getsize(log))
            held = catalog.find(con.store._conn, "A").version  # DuckDB's row, read directly
            assert (held == con.store.meta("A").version) == (sizes[-1] == 0)
        zeros = [k for k, n in enumerate(sizes) if n == 0]
        assert len(zeros) == 2 and zeros[1] - zeros[0] == 3  # at every third record
    finally:
        con.close()
    want = A0
    for _ in range(8):
        want = want * 2 + 1
    with tensordb.connect(tmp_path / "db") as con:
        np.testing.assert_array_equal(con.tensor("A"), want)


READER = textwrap.dedent("""
    import sys
    import tensordb
    with tensordb.connect(sys.argv[1], read_only=True) as r:
        print(r.store.meta("A").version, float(r.tensor("A").sum()))
""")


def test_a_reader_in_another_process_sees_the_logged_version(tmp_path):
    """The writer keeps its rows in the log; a reader that comes gets a snapshot the writer
    publishes after writing them to DuckDB (snapshots.Publisher.publish)."""
    con = _db(tmp_path / "db")
    try:
        for _ in range(3):
            con.execute(STEP)
        assert con.store._pending  # kept back, in the log
        meta = con.store.meta("A")
        proc = run_script(READER, tmp_path / "db")
        assert proc.returncode == 0, proc.stderr
        version, total = proc.stdout.split()
        assert int(version) == meta.version
        assert float(total) == float(con.tensor("A").sum())
    finally:
        con.close()


def test_replay_applies_only_what_the_catalog_lacks(tmp_path):
    """Records whose old version the catalog no longer holds (a crash after the flush's
    COMMIT) are skipped; the rest apply in order, merged."""
    path = tmp_path / "db"
    with tensordb.connect(path) as con:
        con.load("A", A0, tile=(4, 4))
        con.load("B", A0[0])
        a1, b = con.store.meta("A"), con.store.meta("B")
        w = con.store.writer("A", A0.shape, A0.dtype, (4, 4), replace=True)
        w.write_tile((0, 0), A0[:4] + 100)
        w.write_tile((1, 0), A0[4:] + 100)
        a2 = w.commit()
        entries = catalog.tile_entries(con.store.duck, a2)[1]
        file = catalog.payload_file(con.store.duck, a2)
    stale = (a1, a1, "nothing.bin", [])  # the catalog holds a2: a1 -> a1 is not applied
    again = (a1, a2, file, entries)      # applied already: skipped
    ghost = dataclasses.replace(b, name="C")
    other = (ghost, ghost, "nothing.bin", [])  # no tensor C: skipped
    (path / redolog.LOG_FILE).write_bytes(
        redolog.encode([stale]) + redolog.encode([again]) + redolog.encode([other]))
    with tensordb.connect(path) as con:
        np.testing.assert_array_equal(con.tensor("A"), A0 + 100)
        assert con.store.meta("A") == a2 and con.store.meta("B") == b
        assert [t["name"] for t in con.tensors()] == ["A", "B"]
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert_payloads_referenced(con)


def test_sql_check_and_export_see_the_logged_version(tmp_path):
    """SQL over the tensor and the catalog, CHECK and an export, each while the newest
    version's rows are only in the log: each sees that version (numpy's values). (A step
    after SQL plans again, reading the catalog: its rows go to DuckDB; the next is logged.)"""
    con = _db(tmp_path / "db")
    want = A0 * 2 + 1

    def steps():
        nonlocal want
        for _ in range(2):
            con.execute(STEP)
            want = want * 2 + 1
        assert con.store._pending
    try:
        steps()
        assert con.sql("SELECT sum(value) FROM A").fetchall() == [(float(want.sum()),)]
        steps()
        assert con.sql("SELECT version FROM tensordb.tensors").fetchall() == \
            [(con.store.meta("A").version,)]
        steps()
        assert [r["problem"] for r in con.check("A")] == ["ok"]
        steps()
        out = tmp_path / "a.npy"
        con.export("A", str(out))
        np.testing.assert_array_equal(np.load(out), want)
    finally:
        con.close()


KILLED_AFTER_LOGGING = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import tensordb
    con = tensordb.connect(sys.argv[1])
    con.load("A", np.arange(32.0).reshape(8, 4), tile=(4, 4))
    con.execute("A[i,j] = A[i,j] * 2 + 1")
    for _ in range(3):
        con.execute("A[i,j] = A[i,j] * 2 + 1")  # each a record of the log
    assert os.path.getsize(os.path.join(sys.argv[1], "catalog.redo"))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_damaged_record_before_valid_ones_refuses_the_open(tmp_path):
    """kill -9 with four records in the log (four replaces), then a byte of the first record's body damaged
    (the disk, not a torn append: valid records follow it). Dropping it and what follows would
    lose commits that returned (and the sweep would delete their payloads): the open refuses
    with OperationalError naming the log, and leaves the log and the payloads as they were. The
    same log with the damage at its last record is a torn tail: dropped, the open goes on."""
    from tests.harness import assert_killed
    path = tmp_path / "db"
    proc = run_script(KILLED_AFTER_LOGGING, path)
    assert_killed(proc.returncode, proc.stderr)
    log = path / redolog.LOG_FILE
    records, valid, size = redolog.read(str(log))
    assert len(records) == 4 and valid == size
    data = bytearray(log.read_bytes())
    first = redolog._HEAD.size + redolog._HEAD.unpack_from(data, 0)[1]
    damaged = bytearray(data)
    damaged[first - 2] ^= 0xFF  # inside the first record's body
    log.write_bytes(bytes(damaged))
    files = sorted(os.listdir(path / "tiles"))
    for read_only in (False, True):
        with pytest.raises(tensordb.OperationalError) as e:
            tensordb.connect(path, read_only=read_only)
        assert redolog.LOG_FILE in str(e.value) and "damaged" in str(e.value)
    assert log.read_bytes() == bytes(damaged)
    assert sorted(os.listdir(path / "tiles")) == files
    torn = bytearray(data)
    torn[-2] ^= 0xFF  # the last record's body: a torn tail
    log.write_bytes(bytes(torn))
    want = A0
    for _ in range(3):  # the first three records; the fourth, torn, dropped
        want = want * 2 + 1
    with tensordb.connect(path) as con:
        np.testing.assert_array_equal(con.tensor("A"), want)
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert_payloads_referenced(con)


CTRL_C_IN_THE_SYNC = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import tensordb
    from tensordb.storage import redolog
    path, out = sys.argv[1], sys.argv[2]
    STEP = "A[i,j] = A[i,j] * 2 + 1"
    con = tensordb.connect(path)
    con.load("A", np.arange(32.0).reshape(8, 4), tile=(4, 4))
    con.execute(STEP)
    con.execute(STEP)
    real, calls = redolog._sync, []
    def interrupted(fd):  # the signal's handler runs when fdatasync returns
        real(fd)
        calls.append(fd)
        if len(calls) == 1:
            raise KeyboardInterrupt
    redolog._sync = interrupted
    try:
        con.execute(STEP)
        sys.exit("no KeyboardInterrupt")
    except KeyboardInterrupt:
        pass
    redolog._sync = real
    con.execute(STEP)  # returns: its new state must survive the kill
    np.save(out, np.asarray(con.tensor("A")))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_ctrl_c_in_the_logs_sync_then_a_step_then_kill(tmp_path):
    """A Ctrl-C as the record's fdatasync returns: the statement raises KeyboardInterrupt, and
    the log is cut back (the store reads the old version again) rather than the record left
    uncounted, for the next record to overwrite while the process goes on with the version
    that record named (whose successor replay then skips). The next step returns, kill -9:
    the reopened database holds what that process last read (numpy's values), CHECK ok."""
    from tests.harness import assert_killed
    path, out = tmp_path / "db", tmp_path / "want.npy"
    proc = run_script(CTRL_C_IN_THE_SYNC, path, out)
    assert_killed(proc.returncode, proc.stderr)
    want = np.load(out)
    with tensordb.connect(path) as con:
        np.testing.assert_array_equal(con.tensor("A"), want)
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert_payloads_referenced(con)
