"""A payload whose tiles are appended as they come (a sparse kernel's CSR output tiles, written
by ``TensorWriter._append``): a replace writes into a spare file the size of the version it
replaces, and on disk a large tile starts the file's fdatasync as soon as its bytes are written,
the commit waiting for the last such sync instead of making another (docs/storage.md "The durable
steps of a commit", step b).

Real databases under tmp_path and the real system calls (spied on, then made). Oracles: the CSR
matrices written, read back through the catalog (scipy's own arrays compared); the inodes and
paths of the payload files read from the file system; the order of the fdatasync calls against
the catalog's COMMIT; CHECK DATABASE (every tile's checksum and count against its bytes).
"""
from __future__ import annotations

import errno
import os
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.errors import OperationalError
from tensordb.storage import staging, store_commit
from tensordb.storage.writer import EARLY_SYNC_MIN

ROWS, COLS = 512, 4096
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="the spy names a descriptor's file through /proc")


def _tile(seed: int, density: float) -> sp.csr_array:
    t = sp.random(ROWS, COLS, density=density, format="csr", random_state=seed, dtype=np.float64)
    t = sp.csr_array(t)
    t.sum_duplicates()
    t.data += 1.0  # no stored zero: every entry is a nonzero
    return t


LARGE = 0.07   # 147K entries, about 1.7 MiB as CSR: over EARLY_SYNC_MIN
SMALL = 0.002  # 4K entries, about 50 KiB


def _write(store, name, tiles, replace=True):
    """A writer of ``name`` (len(tiles) x 1 tiles of ROWS x COLS) with the CSR ``tiles`` written."""
    w = store.writer(name, (ROWS * len(tiles), COLS), np.float64, (ROWS, COLS), replace=replace)
    for r, t in enumerate(tiles):
        assert w.write_tile((r, 0), t)
    return w


def _want(tiles) -> np.ndarray:
    return sp.vstack(tiles, format="csr").toarray()


class Syncs:
    """Every fdatasync made (path, when it finished) and when the catalog's COMMIT began; the
    fdatasync raises ``fail`` (an OSError) for the first ``fail_first`` calls."""

    def __init__(self, monkeypatch, fail=None, fail_first=0, hold=None) -> None:
        self.calls: list[tuple[str, float]] = []
        self.commits: list[float] = []
        self.lock = threading.Lock()
        self.left = fail_first
        self.started = 0
        real, end = staging._datasync, store_commit.StoreCommits._end

        def datasync(fd):
            path = os.readlink(f"/proc/self/fd/{fd}")
            with self.lock:
                failing = self.left > 0
                self.left -= failing
                self.started += 1
            if failing:
                raise fail
            if hold is not None:
                assert hold.wait(30)
            real(fd)
            with self.lock:
                self.calls.append((path, time.perf_counter()))

        def spied_end(store, txn):
            self.commits.append(time.perf_counter())
            return end(store, txn)
        monkeypatch.setattr(staging, "_datasync", datasync)
        monkeypatch.setattr(store_commit.StoreCommits, "_end", spied_end)

    def on(self, path) -> list[float]:
        return [t for p, t in self.calls if p == os.fspath(path)]

    def wait_for(self, path, n: int) -> None:
        for _ in range(500):  # a sync runs on a helper thread, started by a tile's write
            if len(self.on(path)) >= n:
                return
            time.sleep(0.01)


def test_tiles_over_the_threshold_are_synced_as_written_and_the_commit_adds_no_sync(
        tmp_path, monkeypatch):
    tiles = [_tile(1, LARGE), _tile(2, LARGE)]
    assert min(t.data.nbytes for t in tiles) >= EARLY_SYNC_MIN
    with tensordb.connect(tmp_path / "db") as con:
        spy = Syncs(monkeypatch)
        w = con.store.writer("C", (2 * ROWS, COLS), np.float64, (ROWS, COLS))
        path = w.path
        for r, t in enumerate(tiles):
            assert w.write_tile((r, 0), t)
            spy.wait_for(path, r + 1)
        assert len(spy.on(path)) == 2 and not spy.commits  # both before the commit began
        w.commit()
        assert len(spy.on(path)) == 2, spy.calls  # the commit waited for them: no third
        assert max(spy.on(path)) < spy.commits[-1]
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(tiles))
    with tensordb.connect(tmp_path / "db") as con:
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(tiles))
        assert [r["problem"] for r in con.check()] == ["ok"]


def test_one_early_sync_runs_at_a_time_and_the_commit_covers_the_rest(tmp_path, monkeypatch):
    """A large tile written while the file's earlier sync still runs starts none of its own:
    the commit syncs the file after both, so two syncs in all, not one a tile."""
    tiles = [_tile(8, LARGE), _tile(9, LARGE)]
    hold = threading.Event()
    with tensordb.connect(tmp_path / "db") as con:
        spy = Syncs(monkeypatch, hold=hold)
        w = con.store.writer("C", (2 * ROWS, COLS), np.float64, (ROWS, COLS))
        assert w.write_tile((0, 0), tiles[0])
        for _ in range(500):
            if spy.started:
                break
            time.sleep(0.01)
        assert spy.started == 1  # the first tile's sync, held
        assert w.write_tile((1, 0), tiles[1])
        assert spy.started == 1  # none started for the second tile
        hold.set()
        w.commit()
        syncs = spy.on(w.path)
        assert len(syncs) == 2 and max(syncs) < spy.commits[-1], spy.calls
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(tiles))
        assert [r["problem"] for r in con.check()] == ["ok"]


def test_a_tile_written_after_the_last_early_sync_is_synced_by_the_commit(tmp_path, monkeypatch):
    tiles = [_tile(3, LARGE), _tile(4, SMALL)]
    with tensordb.connect(tmp_path / "db") as con:
        spy = Syncs(monkeypatch)
        w = _write(con.store, "C", tiles, replace=False)
        w.commit()
        syncs = spy.on(w.path)
        assert len(syncs) == 2, spy.calls  # the large tile's, then the commit's for all bytes
        assert max(syncs) < spy.commits[-1]
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(tiles))
        assert [r["problem"] for r in con.check()] == ["ok"]


def test_a_failed_early_sync_fails_the_commit_and_changes_nothing(tmp_path, monkeypatch):
    """A write-back error is reported to one fdatasync of the file only: the early one's must
    not be lost behind a later sync that succeeds."""
    old = [_tile(5, SMALL)]
    new = [_tile(6, LARGE), _tile(7, SMALL)]
    with tensordb.connect(tmp_path / "db") as con:
        _write(con.store, "C", old, replace=False).commit()
        Syncs(monkeypatch, fail=OSError(errno.EIO, "Input/output error"), fail_first=1)
        w = _write(con.store, "C", new)
        path = w.path
        with pytest.raises(OperationalError):
            w.commit()
        assert not os.path.exists(path)
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(old))
    with tensordb.connect(tmp_path / "db") as con:
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(old))
        assert [r["problem"] for r in con.check()] == ["ok"]


@pytest.mark.parametrize("memory", [False, True])
def test_a_replace_appends_into_the_spare_of_an_earlier_version(tmp_path, memory):
    versions = [[_tile(10 + k, LARGE / 4), _tile(20 + k, LARGE / 4)] for k in range(3)]
    with tensordb.connect(None if memory else tmp_path / "db") as con:
        store = con.store
        w = _write(store, "C", versions[0], replace=False)
        first = w.path
        w.commit()
        inode = os.stat(first).st_ino
        _write(store, "C", versions[1]).commit()  # the first version's file retired: a spare
        assert first in store.spares
        w = _write(store, "C", versions[2])
        assert os.stat(w.path).st_ino == inode  # the spare, renamed, written into
        assert not os.path.exists(first) and first not in store.spares
        w.commit()
        np.testing.assert_array_equal(con.sparse("C").toarray(), _want(versions[2]))
        assert [r["problem"] for r in con.check()] == ["ok"]
    if not memory:
        with tensordb.connect(tmp_path / "db") as con:
            np.testing.assert_array_equal(con.sparse("C").toarray(), _want(versions[2]))
            assert [r["problem"] for r in con.check()] == ["ok"]


@pytest.mark.parametrize("dir_job", [True, False])
def test_a_file_synced_early_is_synced_again_when_no_helper_can_start(tmp_path, monkeypatch,
                                                                       dir_job):
    """Review rev39a: a file whose early fdatasync ran during the run and had bytes written after
    it (not covered), closed when no helper thread can start (the interpreter shutting down:
    ``background.submit`` gives None) is synced and closed on the caller's thread, its directory
    too. ``sync_in_background`` looked at ``jobs[0]``/``jobs[1]`` for the file's and the
    directory's jobs, which are after the early ones: the file's last bytes went unsynced (its
    descriptor left open) before the redo record that names them."""
    from concurrent.futures import Future

    from tensordb.storage import staging
    path = tmp_path / "payload"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 4096)
    early = Future()
    early.set_result(None)  # the early sync, finished before the last bytes were written
    synced, dirs = [], []
    real_close, real_dir, real_submit = staging._fsync_close, staging._fsync_dir, \
        staging.background.submit

    def fsync_close(f):
        synced.append(f)
        real_close(f)

    def fsync_dir(d):
        dirs.append(d)
        real_dir(d)

    def submit(fn, *args):  # no helper for the file; the directory's as ``dir_job`` says
        return real_submit(fn, *args) if dir_job and fn is fsync_dir else None
    monkeypatch.setattr(staging, "_fsync_close", fsync_close)
    monkeypatch.setattr(staging, "_fsync_dir", fsync_dir)
    monkeypatch.setattr(staging.background, "submit", submit)
    wait = staging.sync_in_background(fd, str(tmp_path), [early], covered=False)
    wait()
    assert synced == [fd]  # the file's bytes synced, here
    with pytest.raises(OSError):
        os.fstat(fd)  # and its descriptor closed
    assert dirs == [str(tmp_path)]  # the directory synced once
