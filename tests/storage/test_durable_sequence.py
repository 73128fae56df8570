"""The durable steps of an on-disk commit (docs/storage.md "The durable steps of a commit"):
each new payload file fdatasynced once, the ``tiles/`` directory fsynced once for all the
outputs of the commit, both finished before DuckDB's COMMIT; nothing synced in memory.

Real databases under tmp_path, the real system calls (spied on, then made: the sync functions
are wrapped, not replaced). Oracles: the paths the calls were made on, read back from the
kernel (/proc/self/fd), the order of the calls against the catalog's COMMIT, and the arrays
read back through the catalog against the ones written.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import tensordb
from tensordb.storage import staging, store_commit
from tensordb.storage.writer import commit_all

RNG = np.random.default_rng(26)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="the spy names a descriptor's file through /proc")


class SyncSpy:
    """Every fdatasync/fsync a commit makes, as (call, path, finished at), and when the
    catalog's COMMIT began (Store._end, where a block's COMMIT runs)."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.commits: list[float] = []
        self._lock = threading.Lock()
        datasync, fsync, end = staging._datasync, os.fsync, store_commit.StoreCommits._end

        def spied(kind, real):
            def call(fd):
                path = os.readlink(f"/proc/self/fd/{fd}")
                real(fd)
                with self._lock:
                    self.calls.append((kind, path, time.perf_counter()))
            return call

        def spied_end(store, txn):
            self.commits.append(time.perf_counter())
            return end(store, txn)
        monkeypatch.setattr(staging, "_datasync", spied("fdatasync", datasync))
        monkeypatch.setattr(os, "fsync", spied("fsync", fsync))
        monkeypatch.setattr(store_commit.StoreCommits, "_end", spied_end)

    def on(self, path) -> list[str]:
        return [kind for kind, p, _ in self.calls if p == os.fspath(path)]


def _writer(store, name, a, tile):
    w = store.writer(name, a.shape, a.dtype, tile, replace=True)
    for i in range(0, a.shape[0], tile[0]):
        w.write_tile((i // tile[0], 0), a[i:i + tile[0]])
    return w


@pytest.mark.parametrize("outputs", [1, 4])
def test_each_payload_is_fdatasynced_and_the_directory_fsynced_once_before_commit(
        tmp_path, monkeypatch, outputs):
    """A commit of ``outputs`` new tensors (a training step's weights): one fdatasync per
    payload file, one fsync of tiles/ for all of them, every one finished before COMMIT."""
    arrays = {f"W{k}": RNG.standard_normal((64, 16)).astype(np.float32) for k in range(outputs)}
    with tensordb.connect(tmp_path / "db") as con:
        for name in arrays:  # a first version of each, so the commit below is a replace
            con.load(name, np.zeros((64, 16), np.float32), tile=(32, 16))
        store = con.store
        writers = [_writer(store, n, a, (32, 16)) for n, a in arrays.items()]
        paths = [w.path for w in writers]
        spy = SyncSpy(monkeypatch)
        commit_all(writers)
        for path in paths:
            assert spy.on(path) == ["fdatasync"], spy.calls
        assert spy.on(store.tiles_dir) == ["fsync"], spy.calls
        # nothing else in the database is synced (other threads' calls elsewhere do not count)
        mine = [c for c in spy.calls if c[1].startswith(os.fspath(tmp_path))]
        assert len(mine) == outputs + 1, spy.calls
        assert len(spy.commits) == 1
        assert max(t for _, _, t in mine) < spy.commits[0]  # payloads before the catalog
        for name, a in arrays.items():
            np.testing.assert_array_equal(con.tensor(name), a)
    with tensordb.connect(tmp_path / "db") as con:  # reopened: the committed versions
        for name, a in arrays.items():
            np.testing.assert_array_equal(con.tensor(name), a)
        assert [r["problem"] for r in con.check()] == ["ok"]


def test_a_statement_syncs_its_output_then_commits(tmp_path, monkeypatch):
    """One einsum statement on disk (an SSSP-like step replacing its own input): its payload
    and the directory are synced once each, before the COMMIT of its transaction."""
    n = 96
    d = np.full((n, n), np.inf)
    idx = RNG.integers(0, n, (400, 2))
    d[idx[:, 0], idx[:, 1]] = RNG.integers(1, 10, 400)
    np.fill_diagonal(d, 0.0)
    v = np.full(n, np.inf)
    v[0] = 0.0
    with tensordb.connect(tmp_path / "db") as con:
        con.load("D", d)
        con.load("v", v)
        spy = SyncSpy(monkeypatch)
        con.execute("CREATE OR REPLACE TENSOR v[k] AS MIN(v[j] + D[j,k])")
        want = np.min(v[:, None] + d, axis=0)
        np.testing.assert_array_equal(con.tensor("v"), want)
        payloads = {p for kind, p, _ in spy.calls if kind == "fdatasync"}
        assert len(payloads) == 1 and next(iter(payloads)).startswith(con.store.tiles_dir)
        assert spy.on(con.store.tiles_dir) == ["fsync"]
        mine = [t for _, p, t in spy.calls if p.startswith(os.fspath(tmp_path))]
        assert spy.commits and max(mine) < spy.commits[-1]


def test_nothing_is_synced_in_memory(monkeypatch):
    """An in-memory database has nothing to make durable: no payload or directory sync."""
    with tensordb.connect() as con:
        a = RNG.standard_normal((64, 16)).astype(np.float32)
        con.load("A", a, tile=(32, 16))
        spy = SyncSpy(monkeypatch)
        commit_all([_writer(con.store, "A", 2 * a, (32, 16))])
        con.execute("B[i,k] = SUM(A[i,j] * A[i,j]) * A[i,k]")
        assert spy.calls == []
        np.testing.assert_array_equal(con.tensor("A"), 2 * a)


def test_a_shared_directory_fsync_is_one_started_inside_the_block(tmp_path):
    """one_directory_sync: the files synced inside one block share the block's directory
    fsync; outside a block, and in a nested block (its files may be newer than the outer
    fsync), each gets one of its own. Every wait returns once its file is durable."""
    fsyncs = []
    real = os.fsync

    def counting(fd):
        fsyncs.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    def new_file(name):
        fd = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        staging.write_all(fd, b"x" * 4096)
        return fd
    mp = pytest.MonkeyPatch()
    mp.setattr(os, "fsync", counting)
    try:
        fds = [new_file(f"f{k}") for k in range(3)]
        with staging.one_directory_sync():
            waits = [staging.sync_in_background(fd, str(tmp_path)) for fd in fds[:2]]
            inner_fd = new_file("inner")
            with staging.one_directory_sync():
                waits.append(staging.sync_in_background(inner_fd, str(tmp_path)))
        waits.append(staging.sync_in_background(fds[2], str(tmp_path)))
        for wait in waits:
            wait()
    finally:
        mp.undo()
    # the block's two files: one fsync; the nested block's file: one; the file outside: one
    assert fsyncs.count(str(tmp_path)) == 3
    for name in ("f0", "f1", "f2", "inner"):
        assert (tmp_path / name).read_bytes() == b"x" * 4096


def test_a_logged_replace_syncs_the_payload_then_its_record(tmp_path, monkeypatch):
    """A replace of a version this process wrote goes to the redo log (storage/redolog.py):
    its payload and the directory synced once each, then the log's record written and
    fdatasynced once, and only then the replaced payload retired; DuckDB is not written
    (no COMMIT: the transaction never began there)."""
    from tensordb.storage import redolog, spares
    a = RNG.standard_normal((64, 16)).astype(np.float32)
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a, tile=(32, 16))
        commit_all([_writer(con.store, "A", 2 * a, (32, 16))])  # its entries now known here
        spy = SyncSpy(monkeypatch)
        real_sync, real_retire = redolog._sync, spares.SparePayloads.retire
        retired = []

        def log_sync(fd):
            real_sync(fd)
            spy.calls.append(("log", os.readlink(f"/proc/self/fd/{fd}"), time.perf_counter()))

        def retire(self, path, keep=True):
            retired.append(time.perf_counter())
            return real_retire(self, path, keep=keep)
        monkeypatch.setattr(redolog, "_sync", log_sync)
        monkeypatch.setattr(spares.SparePayloads, "retire", retire)
        w = _writer(con.store, "A", 3 * a, (32, 16))
        duck_before = con.store._conn
        commit_all([w])
        log = os.fspath(tmp_path / "db" / redolog.LOG_FILE)
        assert spy.on(w.path) == ["fdatasync"] and spy.on(con.store.tiles_dir) == ["fsync"]
        assert spy.on(log) == ["log"], spy.calls
        t_log = next(t for kind, _, t in spy.calls if kind == "log")
        assert max(t for kind, p, t in spy.calls if kind != "log" and
                   p.startswith(os.fspath(tmp_path))) < t_log  # the payload before its record
        assert retired and min(retired) > t_log  # the old payload retired after the record
        assert con.store._pending and con.store._conn is duck_before
        assert redolog.read(log)[0][-1][0][1] == con.store.meta("A")
        np.testing.assert_array_equal(con.tensor("A"), 3 * a)
    with tensordb.connect(tmp_path / "db") as con:
        np.testing.assert_array_equal(con.tensor("A"), 3 * a)
        assert [r["problem"] for r in con.check()] == ["ok"]
