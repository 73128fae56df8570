"""The redo log's remaining windows (storage/redolog.py), each proven in a child process with a
real SIGINT sent to itself at the point, or a real DuckDB error, then kill -9; the parent
reopens the real database and compares with numpy's values and DuckDB's own rows.

- a Ctrl-C in the bytecodes after the record's fdatasync (and after DuckDB's COMMIT, on the
  path that writes DuckDB, and as the commit returns to its writers): the process and the
  disk agree that the step landed;
- a flush whose DuckDB statements fail (SQL's, the publisher's, close's), then kill -9: every
  step that returned is there;
- DROP / CREATE of a name whose replace was logged and not flushed, then kill -9: the
  reopen shows the DROP's or CREATE's state, and the sweep keeps every named payload;
- the publisher thread flushing the log beside a user's relations not fetched yet (one of
  them failing inside the flush's transaction);
- what a tensordb from before the log reads of a database a crash left with a log.
"""
from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

import tensordb
from tensordb.storage import redolog
from tests.harness import assert_killed, assert_payloads_referenced, run_script

A0 = np.arange(32.0).reshape(8, 4)
STEP = "A[i,j] = A[i,j] * 2 + 1"


def _steps(n: int, a=A0):
    for _ in range(n):
        a = a * 2 + 1
    return a


CTRL_C = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import tensordb
    from tensordb.storage import redolog
    path, out, where = sys.argv[1], sys.argv[2], sys.argv[3]
    STEP = "A[i,j] = A[i,j] * 2 + 1"
    if where in ("commit", "load"):
        redolog.ENABLED = False  # every commit writes DuckDB (read at the open)
    con = tensordb.connect(path)
    con.load("A", np.arange(32.0).reshape(8, 4), tile=(4, 4))
    con.execute(STEP)
    con.execute(STEP)  # logged (where == "record"): this process knows A's tiles now

    class Conn:  # the catalog connection, sending a Ctrl-C to the process after its COMMIT
        def __init__(self, conn):
            self.conn = conn
        def execute(self, sql, *args):
            out = self.conn.execute(sql, *args)
            if sql == "COMMIT":
                os.kill(os.getpid(), signal.SIGINT)
            return out
        def __getattr__(self, attr):
            return getattr(self.conn, attr)

    real = redolog.RedoLog.append
    if where == "returned":  # the commit returned to the writer's commit_all, not yet marked
        from tensordb.storage import store as st
        commit_writers = st.Store._commit_writers
        def returned(self, items):
            metas = commit_writers(self, items)
            os.kill(os.getpid(), signal.SIGINT)
            return metas
        st.Store._commit_writers = returned
    if where == "record":
        def append(self, rows):
            real(self, rows)  # the record durable: the Ctrl-C arrives in the bytecodes after
            os.kill(os.getpid(), signal.SIGINT)
        redolog.RedoLog.append = append
    elif where != "returned":
        con.store.duck = Conn(con.store._conn)
    try:
        if where in ("load", "returned"):  # the step as a load: a commit of its own
            con.load("A", np.asarray(con.tensor("A")) * 2 + 1, tile=(4, 4), replace=True)
        else:
            con.execute(STEP)
        raised = False
    except KeyboardInterrupt:
        raised = True
    redolog.RedoLog.append = real
    if where in ("commit", "load"):
        con.store.duck = con.store._conn.conn
    if where == "returned":
        st.Store._commit_writers = commit_writers
    live = np.asarray(con.tensor("A"))  # what this process goes on with
    with open(out + ".raised", "w") as f:
        f.write(str(raised))
    np.save(out + ".sql.npy", np.array(  # SQL's view of A, and DuckDB's rows (a flush)
        [con.sql("SELECT sum(value) FROM A").fetchall()[0][0], live.sum(),
         con.sql("SELECT count(*) FROM tensordb.tensors").fetchall()[0][0]]))
    np.save(out + ".after.npy", np.asarray(con.tensor("A")))
    con.execute(STEP)  # the next step (logged or not) and its flush
    con.sql("SELECT count(*) FROM tensordb.tensors").fetchall()
    np.save(out, np.asarray(con.tensor("A")))
    np.save(out + ".first.npy", live)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("where", ["record", "commit", "load", "returned"])
def test_ctrl_c_after_the_commit_point_then_kill(tmp_path, where):
    """A real SIGINT right after the redo record's fdatasync (``record``), or after DuckDB's
    COMMIT returned (``commit``, the log off; ``load``: a load's replace, whose commit is
    its own transaction rather than the dialect's unit; ``returned``: the load's commit has
    returned to its writers, which are not marked committed yet): the statement raises
    KeyboardInterrupt (the signal is sent at the point only), the step having landed (the
    Ctrl-C is held until the process has recorded the commit), and what the process reads
    afterwards is what the reopen after kill -9 finds. Without the hold (``record``) the
    process forgot a durable record, and its next flush emptied the log under DuckDB's older
    row; after a load's COMMIT (``load``, ``returned``) the writer deleted the payload that
    the committed row named. ``commit`` (a dialect statement) agreed before too."""
    path, out = tmp_path / "db", tmp_path / "live.npy"
    proc = run_script(CTRL_C, path, out, where)
    assert_killed(proc.returncode, proc.stderr)
    assert (tmp_path / "live.npy.raised").read_text() == "True"  # the user saw the Ctrl-C
    first = np.load(str(out) + ".first.npy")
    np.testing.assert_array_equal(first, _steps(3))  # the step landed in the process
    sql_sum, want_sum, rows = np.load(str(out) + ".sql.npy")
    assert (sql_sum, rows) == (want_sum, 1)  # SQL reads the same version; one catalog row
    np.testing.assert_array_equal(np.load(str(out) + ".after.npy"), first)  # flushed: kept
    live = np.load(out)
    np.testing.assert_array_equal(live, _steps(4))
    with tensordb.connect(path) as con:  # and on disk, the same
        np.testing.assert_array_equal(con.tensor("A"), live)
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert_payloads_referenced(con)


FAILED_FLUSH = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import tensordb
    from tensordb.storage import catalog, deferred, redolog
    path, then = sys.argv[1], sys.argv[2]
    STEP = "A[i,j] = A[i,j] * 2 + 1"
    log = os.path.join(path, redolog.LOG_FILE)
    con = tensordb.connect(path)
    con.load("A", np.arange(32.0).reshape(8, 4), tile=(4, 4))
    con.load("B", np.ones(4))
    for _ in range(3):
        con.execute(STEP)  # logged (the load's tiles are known to this process)
    real = catalog.store
    def store(duck, rows):  # the rows written, then DuckDB refuses the next INSERT
        real(duck, rows)
        duck.execute("INSERT INTO tensordb.tiles (tensor) VALUES (NULL)")
    deferred.catalog.store = store
    try:
        if then == "publisher":  # the publisher's flush (its thread's call) fails
            con.store.publisher.publish()
        else:  # SQL's flush fails
            con.sql("SELECT count(*) FROM tensordb.tensors").fetchall()
        sys.exit("the flush did not fail")
    except tensordb.OperationalError as exc:
        assert "cannot write the catalog rows" in str(exc), exc
    deferred.catalog.store = real
    assert len(redolog.read(log)[0]) == 3, "the log lost records"
    if then == "step":  # a step after SQL writes DuckDB (flushing the log), the next is logged
        con.execute(STEP)
        con.execute(STEP)
    elif then == "publisher":  # logged after the two records kept
        con.execute(STEP)
        assert len(redolog.read(log)[0]) == 4, "the step was not logged"
    elif then == "close":  # close's flush fails the same way: the log stays for the open
        con.execute(STEP)  # after SQL: to DuckDB (the log flushed first)
        con.execute(STEP)  # logged
        deferred.catalog.store = store
        con.close()  # closes all the same
        deferred.catalog.store = real
        assert len(redolog.read(log)[0]) >= 1, "close emptied the log"
        with tensordb.connect(path, read_only=True) as r:  # released; a reader applies the log
            want = np.arange(32.0).reshape(8, 4)
            for _ in range(5):
                want = want * 2 + 1
            assert np.array_equal(np.asarray(r.tensor("A")), want), "the reader lost a step"
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("then, steps", [("kill", 3), ("step", 5), ("publisher", 4),
                                         ("close", 5)])
def test_a_failed_flush_then_kill_keeps_every_returned_commit(tmp_path, then, steps):
    """The flush's INSERT fails inside DuckDB (a real DuckDB error after the rows were
    written in its transaction, as a full disk would), for SQL's flush or the publisher
    thread's: OperationalError, DuckDB rolls back, the log keeps its records; then kill -9 at
    once, or after more steps (or after a close whose flush fails too): the reopen holds
    every step that returned (numpy's values)."""
    path = tmp_path / "db"
    proc = run_script(FAILED_FLUSH, path, then)
    assert_killed(proc.returncode, proc.stderr)
    with tensordb.connect(path) as con:
        np.testing.assert_array_equal(con.tensor("A"), _steps(steps))
        np.testing.assert_array_equal(con.tensor("B"), np.ones(4))
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert_payloads_referenced(con)
        rows = con.sql("SELECT name, version FROM tensordb.tensors ORDER BY name").fetchall()
        assert rows == [("A", con.store.meta("A").version), ("B", con.store.meta("B").version)]


DROP_CREATE = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import tensordb
    from tensordb.storage import redolog
    path, what = sys.argv[1], sys.argv[2]
    STEP = "A[i,j] = A[i,j] * 2 + 1"
    con = tensordb.connect(path)
    con.load("A", np.arange(32.0).reshape(8, 4), tile=(4, 4))
    con.execute(STEP)
    con.execute(STEP)  # logged, not flushed
    log = os.path.join(path, redolog.LOG_FILE)
    assert redolog.read(log)[0], "the replace was not logged"
    if what in ("drop", "drop-create"):
        con.execute("DROP TENSOR A")
    if what == "drop-create":
        con.execute("CREATE TENSOR A (i 3, j 2) FLOAT32")
        con.execute("A[i,j] = A[i,j] + 7")
    if what == "replace-drop":  # logged again after the drop and a new A
        con.execute("DROP TENSOR A")
        con.load("A", np.full((8, 4), 5.0), tile=(4, 4))
        con.execute(STEP)
        con.execute(STEP)
        assert redolog.read(log)[0], "the new A's replace was not logged"
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("what", ["drop", "drop-create", "replace-drop"])
def test_drop_or_create_after_a_logged_replace_then_kill(tmp_path, what):
    """DROP TENSOR (and a CREATE of the same name, and a new A replaced and logged again)
    after a logged replace of A, then kill -9: the reopen shows what the DROP/CREATE left,
    never the old A replayed; the sweep deleted nothing that the catalog names."""
    path = tmp_path / "db"
    proc = run_script(DROP_CREATE, path, what)
    assert_killed(proc.returncode, proc.stderr)
    with tensordb.connect(path) as con:
        names = [t["name"] for t in con.tensors()]
        if what == "drop":
            assert names == []
        elif what == "drop-create":
            assert names == ["A"]
            np.testing.assert_array_equal(con.tensor("A"), np.full((3, 2), 7, "float32"))
        else:
            assert names == ["A"]
            np.testing.assert_array_equal(con.tensor("A"), _steps(2, np.full((8, 4), 5.0)))
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert_payloads_referenced(con)
        assert len(os.listdir(con.store.tiles_dir)) == len(names)


READER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import tensordb
    r = tensordb.connect(sys.argv[1], read_only=True)  # its lease: the writer publishes
    print("ready", flush=True)
    for line in sys.stdin:  # a file of the value the writer's last step returned
        want = np.load(line.strip())
        for _ in range(2000):  # the newest snapshot, published by the writer's thread
            if np.array_equal(np.asarray(r.tensor("A")), want):
                break
            time.sleep(0.005)
        print("read" if np.array_equal(np.asarray(r.tensor("A")), want) else "stale",
              flush=True)
""")


def test_the_publishers_flush_beside_a_relation_not_fetched(tmp_path):
    """A reader in another process makes the writer's publisher thread flush the log into
    DuckDB (on the writer's catalog connection, under the store's lock) while the writer's
    own relations over A, made before the steps, are not fetched yet, and are then fetched
    while the thread may flush again: no deadlock (the child's timeout and pytest's fail it),
    and each relation reads the version current when it runs, by numpy; the reader reads the
    same; the catalog's rows are DuckDB's."""
    from tests.harness import start_script
    path = tmp_path / "db"
    con = tensordb.connect(path)
    reader = None
    try:
        con.load("A", A0, tile=(4, 4))
        con.execute(STEP)
        rel = con.sql("SELECT sum(value) AS s, count(*) AS n FROM A")
        lazy = con.sql("SELECT i, j, value FROM A ORDER BY i, j")
        want = _steps(1)
        reader = start_script(READER, path, stdin=__import__("subprocess").PIPE)
        assert reader.stdout.readline().strip() == b"ready"
        for k in range(8):
            con.execute(STEP)  # logged; the thread flushes it to publish for the reader
            want = want * 2 + 1
            if k % 2:
                assert rel.fetchall() == [(want.sum(), want.size)]
            else:  # the reader asks for a snapshot holding this step: the thread flushes
                out = tmp_path / f"r{k}.npy"
                np.save(out, want)
                reader.stdin.write(f"{out}\n".encode())
                reader.stdin.flush()
                assert reader.stdout.readline().strip() == b"read"
        got = lazy.fetchall()
        assert got == [(i, j, want[i, j]) for i in range(8) for j in range(4)]
        version = con.store.meta("A").version
        assert con.sql("SELECT version FROM tensordb.tensors").fetchall() == [(version,)]
        assert os.path.getsize(path / redolog.LOG_FILE) == 0  # the SQL above flushed it
    finally:
        if reader is not None:
            reader.communicate(timeout=60)  # its stdin closed: it ends
        con.close()
    with tensordb.connect(path) as con:
        np.testing.assert_array_equal(con.tensor("A"), want)
        assert [r["problem"] for r in con.check()] == ["ok"]


OLDER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import tensordb
    con = tensordb.connect(sys.argv[1])
    con.load("A", np.arange(32.0).reshape(8, 4), tile=(4, 4))
    for _ in range(3):
        con.execute("A[i,j] = A[i,j] * 2 + 1")  # logged
    print(con.store.meta("A").version, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _raw_catalog(path):
    """What a tensordb without the redo log reads: DuckDB's own rows, by plain DuckDB."""
    import duckdb
    duck = duckdb.connect(str(path / "catalog.duckdb"), read_only=True)
    try:
        versions = duck.execute("SELECT name, version FROM tensordb.tensors").fetchall()
        files = {r[0] for r in duck.execute("SELECT file FROM tensordb.tiles").fetchall()}
    finally:
        duck.close()
    return versions, files


def test_a_log_left_by_a_crash_and_what_an_older_version_would_read(tmp_path):
    """kill -9 with records in the log: DuckDB's own rows (all that a tensordb from before the
    redo log reads, by plain DuckDB) still name A's first version, whose payload the logged
    replaces retired, and not the payloads the log names, which such a version's sweep
    deletes (docs/storage.md: no catalog version refuses it). An open for writing by this
    version, closed, replays the log into DuckDB and removes it: the raw rows then name
    exactly the payload files there are, with the newest version (numpy's values)."""
    path = tmp_path / "db"
    proc = run_script(OLDER, path)
    assert_killed(proc.returncode, proc.stderr)
    newest = int(proc.stdout.split()[0])
    log = path / redolog.LOG_FILE
    assert len(redolog.read(str(log))[0]) == 3
    versions, files = _raw_catalog(path)
    assert versions[0][1] < newest  # DuckDB holds an older version than the log
    on_disk = set(os.listdir(path / "tiles"))
    assert not (on_disk <= files)  # payloads only the log names: an older sweep's victims
    with tensordb.connect(path) as con:  # this version: replayed, before its sweep
        np.testing.assert_array_equal(con.tensor("A"), _steps(3))
    assert not log.exists()
    versions, files = _raw_catalog(path)
    assert versions == [("A", newest)]
    assert files == set(os.listdir(path / "tiles"))


def test_a_users_query_beside_the_publishers_flush(tmp_path):
    """The user's relations run on the catalog connection without the store's lock (a
    relation keeps no result: each call runs it). One that fails (a real DuckDB conversion
    error) and one that reads, each run while the publisher thread's flush has its DuckDB
    transaction open: the user gets the error and the rows; the flush is not dragged into
    the user's failure (it runs on the publisher's own cursor, a transaction of its own) and
    lands: DuckDB holds the newest version, the log is empty."""
    import threading
    from tensordb.storage import catalog, deferred
    path = tmp_path / "db"
    con = tensordb.connect(path)
    try:
        con.load("A", A0, tile=(4, 4))
        bad = con.sql("SELECT CAST(x AS INTEGER) AS y FROM (SELECT 'x' AS x)")
        good = con.sql("SELECT 42 AS x")
        con.execute(STEP)  # logged: held back
        con.execute(STEP)
        assert con.store.holds_rows
        real, seen = catalog.store, []

        def user():
            try:
                bad.fetchall()
                seen.append("no error")
            except tensordb.DataError as exc:
                seen.append(type(exc).__name__)
            seen.append(good.fetchall())

        def store(duck, rows):  # inside the flush's transaction, in the publisher's thread
            real(duck, rows)
            thread = threading.Thread(target=user)
            thread.start()
            thread.join(30)

        deferred.catalog.store = store
        try:
            thread = threading.Thread(target=con.store.publisher.publish)
            thread.start()
            thread.join(60)
        finally:
            deferred.catalog.store = real
        assert seen == ["DataError", [(42,)]], seen  # the user's error, then the rows
        assert not con.store.holds_rows  # the flush landed
        assert os.path.getsize(path / redolog.LOG_FILE) == 0
        version = con.store.meta("A").version
        assert con.sql("SELECT version FROM tensordb.tensors").fetchall() == [(version,)]
        np.testing.assert_array_equal(con.tensor("A"), _steps(2))
    finally:
        con.close()
    with tensordb.connect(path) as con:
        np.testing.assert_array_equal(con.tensor("A"), _steps(2))
        assert [r["problem"] for r in con.check()] == ["ok"]
