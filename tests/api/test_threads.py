"""Threads sharing one connection (DB-API threadsafety 1 says they should not, but they may):
each call waits its turn (tensordb/calls.py), so no call joins another's transaction, no
acknowledged write is lost, and the connection's caches are never changed under a call.

Real threads on a real on-disk database; results against numpy, stored state after a reopen.
"""
from __future__ import annotations

import threading

import numpy as np

import tensordb


def test_a_load_from_another_thread_is_not_rolled_back_with_a_failing_call(tmp_path):
    """Thread A's call runs (held inside its run by its progress callback) and then fails;
    thread B loads a tensor through a cursor meanwhile. B's load returns only once A's call
    has ended, in a transaction of its own, and stays stored. (It once joined A's
    transaction, returned at once, and was rolled back with A.)"""
    root = tmp_path / "db"
    a = np.arange(64.0).reshape(8, 8)
    con = tensordb.connect(root, workers=2)
    con.load("A", a)
    running, b_done = threading.Event(), threading.Event()

    def progress(done, total):
        if not running.is_set():
            running.set()
            b_done.wait(0.5)  # B would have finished by now, were it not waiting for A

    con.progress_callback = progress
    errors = []

    def a_call():
        try:
            con.execute("S[i,k] = SUM(A[i,j] * A[j,k]); DROP TENSOR NoSuchTensor")
        except tensordb.CatalogError as exc:
            errors.append(exc)

    def b_call():
        running.wait(30)
        con.cursor().execute("LOAD TENSOR RB FROM (SELECT range AS i, range * 1.0 AS v "
                             "FROM range(10)) INDEX (i) VALUE v")
        b_done.set()

    threads = [threading.Thread(target=a_call), threading.Thread(target=b_call)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 1 and "NoSuchTensor" in str(errors[0])
    assert not con.store.has("S")
    np.testing.assert_array_equal(con.tensor("RB"), np.arange(10.0))
    con.close()
    with tensordb.connect(root) as again:
        assert sorted(m.name for m in again.store.list()) == ["A", "RB"]
        np.testing.assert_array_equal(again.tensor("RB"), np.arange(10.0))
        assert [r["problem"] for r in again.check()] == ["ok"]


def test_threads_running_einsums_through_their_own_cursors(tmp_path):
    """Four threads, ten statements each, every result stored under a name of its own: all
    succeed, every stored value is numpy's, and the catalog checks clean."""
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((48, 48)) for _ in range(4)]
    con = tensordb.connect(tmp_path / "db", workers=2)
    for t, m in enumerate(mats):
        con.load(f"M{t}", m)
    errors = []

    def work(t):
        cur = con.cursor()
        for k in range(10):
            try:
                cur.execute(f"R{t}_{k}[i,k] = SUM(M{t}[i,j] * M{t}[j,k]) + {k}")
                cur.execute(f"SELECT count(*) FROM tensordb.tensors").fetchall()
            except Exception as exc:  # noqa: BLE001 - every failure is the test's failure
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert errors == []
    for t, m in enumerate(mats):
        for k in range(10):
            np.testing.assert_allclose(con.tensor(f"R{t}_{k}"), m @ m + k, rtol=1e-12)
    assert [r["problem"] for r in con.check()] == ["ok"]
    con.close()


def test_a_progress_callback_may_use_the_connection(tmp_path):
    """Progress is reported on the thread that runs the statement, never on a worker: a
    callback that asks the connection something (its calls wait for the running one, which
    waits for the workers) once waited for ever."""
    a = np.ones((512, 512))
    con = tensordb.connect(tmp_path / "db", workers=2)
    con.load("A", a, tile=(128, 128))
    seen = []

    def progress(done, total):
        seen.append((threading.get_ident(), con.describe("A")["shape"]))

    con.progress_callback = progress
    done = threading.Event()

    def run():
        con.execute("B[i,k] = SUM(A[i,j] * A[j,k])")
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert done.wait(60), "the statement did not finish: the callback waited for the connection"
    assert seen and {s[1] for s in seen} == {(512, 512)} and {s[0] for s in seen} == {t.ident}
    np.testing.assert_allclose(con.tensor("B"), a @ a)
    con.close()
