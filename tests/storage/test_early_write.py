"""Output tiles go to their payload file as each is finished, not all at the commit.

The worker that finishes an output tile hands it to its writer (``TensorWriter.write_early``): a
tile staged in anonymous memory is written by pwrite there and then, and on a database that
fsyncs, the write-back of its pages starts at once (storage/writeback.py), so the commit's fsync
finds little left. Checked on real files: the bytes in the payload file, the catalog rows, the
answer against numpy, the tiles the commit still writes itself, and a run that fails midway.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tensordb.storage.identity import payload_name
from tensordb.storage import reserved as reserved_mod, writeback, writer as writer_mod
from tests.files import payload_files

MATMUL = "C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 2, j 1, k 2)"


def _file_bytes(con, name):
    meta = con.store.meta(name)
    with open(os.path.join(con.store.tiles_dir, payload_name(meta.version, con.store.database)), "rb") as f:
        return f.read()


@pytest.fixture
def ab():
    rng = np.random.default_rng(3)
    return (rng.standard_normal((64, 48), dtype=np.float32),
            rng.standard_normal((48, 80), dtype=np.float32))


@pytest.mark.parametrize("where", ["disk", "memory"])
def test_each_output_tile_is_handed_to_its_file_before_the_commit(tmp_path, ab, where,
                                                                   monkeypatch):
    import sys
    lower = sys.modules["tensordb.physical.sink"]
    a, b = ab
    started = []
    real = writeback.start_writeback

    def counting(fd, offset, nbytes):
        started.append((offset, nbytes))
        return real(fd, offset, nbytes)
    monkeypatch.setattr(reserved_mod, "start_writeback", counting)  # write_early's (reserved.py)
    early = []
    real_early = writer_mod.TensorWriter.write_early

    def recording(self, coords):
        early.append(tuple(coords))
        return real_early(self, coords)
    monkeypatch.setattr(writer_mod.TensorWriter, "write_early", recording)
    real_commit = lower.commit_all
    monkeypatch.setattr(lower, "commit_all", lambda ws: (early.append("commit"),
                                                         real_commit(ws))[1])
    with tensordb.connect(tmp_path / "db" if where == "disk" else None, workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        con.execute(MATMUL)
        np.testing.assert_allclose(con.tensor("C"), a @ b, rtol=1e-5, atol=1e-5)
        assert early[-1] == "commit"
        assert sorted(early[:-1]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        # on disk each tile's write-back was started as it was written; in memory nothing syncs
        if where == "disk":
            assert sorted(n for _, n in started) == [32 * 40 * 4] * 4
        else:
            assert started == []
        assert [r["problem"] for r in con.check()] == ["ok"]  # the checksums match the bytes


def test_the_commit_writes_the_tiles_not_written_early(tmp_path):
    """A staged writer some of whose tiles were written early: the commit writes the others
    (and only the tiles it keeps), and the file holds every tile's bytes."""
    with tensordb.connect(tmp_path / "db") as con:
        w = con.store.writer("T", (4, 6), np.dtype(np.float64), ((0, 2, 4), (0, 3, 6)),
                             dims=("i", "j"), replace=False)
        bufs = w.reserve([(0, 0), (0, 1), (1, 0), (1, 1)])
        assert w.staged_bytes > 0
        want = np.arange(24, dtype=np.float64).reshape(4, 6) + 1
        for (i, j), buf in bufs.items():
            buf[...] = want[2 * i:2 * i + 2, 3 * j:3 * j + 3]
        bufs[(1, 1)][...] = 0  # an all-zero tile: no catalog row
        w.write_early((0, 1))
        w.write_early((1, 1))
        for coords, buf in bufs.items():
            w.write_tile(coords, buf)
        w.commit()
        got = con.tensor("T")
        want[2:, 3:] = 0
        np.testing.assert_array_equal(got, want)
        assert con.store.meta("T").tile_count == 3
        data = _file_bytes(con, "T")
        rows = con.store.duck.execute('SELECT coords, "offset", nbytes FROM tensordb.tiles '
                                      "WHERE tensor = 'T' ORDER BY coords").fetchall()
        assert [tuple(c) for c, _, _ in rows] == [(0, 0), (0, 1), (1, 0)]
        for (i, j), offset, nbytes in rows:
            tile = np.frombuffer(data[offset:offset + nbytes], np.float64).reshape(2, 3)
            np.testing.assert_array_equal(tile, want[2 * i:2 * i + 2, 3 * j:3 * j + 3])
        assert [r["problem"] for r in con.check()] == ["ok"]


def test_a_tensor_with_no_bytes_has_nothing_to_write_early(tmp_path):
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("E", np.zeros((0, 5), np.float32))
        con.load("F", np.ones((5, 3), np.float32))
        con.execute("G[i,k] = SUM(E[i,j] * F[j,k])")
        assert con.tensor("G").shape == (0, 3)


def test_a_run_that_fails_after_tiles_were_written_early_stores_nothing(tmp_path, ab,
                                                                       monkeypatch):
    """The second output tile's early write fails (a disk error): the run fails with a
    tensordb error, the tensor keeps its old value and rows, and the new payload file is gone."""
    a, b = ab
    with tensordb.connect(tmp_path / "db", workers=1) as con:
        con.load("A", a)
        con.load("B", b)
        con.execute(MATMUL)
        before = con.tensor("C").copy()
        files = payload_files(con.store)
        calls = []
        real_early = writer_mod.TensorWriter.write_early

        def failing(self, coords):
            calls.append(coords)
            if len(calls) == 2:
                raise tensordb.OperationalError("cannot write tiles of 'C': No space left")
            return real_early(self, coords)
        monkeypatch.setattr(writer_mod.TensorWriter, "write_early", failing)
        with pytest.raises(tensordb.OperationalError, match="No space left"):
            con.execute(MATMUL.replace("A[i,j]", "(A[i,j] + 1)"))
        np.testing.assert_array_equal(con.tensor("C"), before)
        assert payload_files(con.store) == files
        assert [r["problem"] for r in con.check()] == ["ok"]


def test_start_writeback_asks_the_kernel_or_does_nothing(tmp_path):
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"x" * 8192, 0)
        took = writeback.start_writeback(fd, 0, 8192)
        assert took is (writeback._sync_file_range is not None)
        assert writeback.start_writeback(fd, 0, 0) is False
        os.fsync(fd)
        assert os.pread(fd, 8192, 0) == b"x" * 8192
    finally:
        os.close(fd)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_output_too_large_to_stage_is_streamed_and_not_held(tmp_path, monkeypatch, workers):
    """On disk, an output larger than the staging cap is computed tile by tile as any other:
    each tile goes into its place in the file as soon as it is finished (before the commit),
    and the run keeps it no longer than its consumers need it, so the run holds a few tiles
    at a time, not the whole output. The answer is numpy's, block-sparse zeros included."""
    import sys
    lower = sys.modules["tensordb.physical.sink"]
    monkeypatch.setattr(reserved_mod, "STAGE_MAX", 1 << 20)  # reserve()'s (reserved.py)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2048, 256))  # 4 MiB of float64: 16 tiles of 256 KiB
    a[1024:1280] = 0  # two all-zero tiles of A: absent, so C's are never computed nor written
    events = []
    real_slot = writer_mod.TensorWriter._write_slot
    monkeypatch.setattr(writer_mod.TensorWriter, "_write_slot", lambda self, c, t: (
        events.append("tile"), real_slot(self, c, t))[1])
    real_commit = lower.commit_all
    monkeypatch.setattr(lower, "commit_all", lambda ws: (events.append("commit"),
                                                         real_commit(ws))[1])
    with tensordb.connect(tmp_path / "db", workers=workers) as con:
        con.load("A", a, tile=(128, 256))
        con.load("S", np.full((256,), 3.0))
        events.clear()
        # C is an output that another operation of the same script also reads
        con.execute("C[i,j] = A[i,j] * S[j] WITH (PIECES i 16, j 1); "
                    "R[i] = SUM(C[i,j]) WITH (PIECES i 16)")
        np.testing.assert_array_equal(con.tensor("C"), a * 3.0)
        np.testing.assert_allclose(con.tensor("R"), (a * 3.0).sum(1), rtol=1e-12)
        assert events == ["tile"] * 14 + ["commit"]
        assert con.store.meta("C").tile_count == 14
        assert con.last_run.peak_bytes <= a.nbytes // 2
        assert [r["problem"] for r in con.check()] == ["ok"]


def test_a_tile_given_again_after_its_early_write_is_written_again(tmp_path):
    """write_tile with other bytes than the reserved buffer's (a copy into it) after the buffer
    went to the file early: the commit writes the new bytes, not the early ones."""
    with tensordb.connect(tmp_path / "db") as con:
        w = con.store.writer("T", (2, 3), np.dtype(np.float32), ((0, 2), (0, 3)),
                             dims=("i", "j"), replace=False)
        bufs = w.reserve([(0, 0)])
        bufs[(0, 0)][...] = 1
        w.write_early((0, 0))
        w.write_tile((0, 0), np.full((2, 3), 7, np.float32))
        w.commit()
        np.testing.assert_array_equal(con.tensor("T"), np.full((2, 3), 7, np.float32))
        assert [r["problem"] for r in con.check()] == ["ok"]


def _abort_while_writing(tmp_path, con, w, write) -> None:
    """Run ``write()`` (a tile's bytes going to ``w``'s file) on another thread, abort ``w``
    while its ``_pwrite`` is held, open another file (which may take a closed descriptor's
    number), then let the write go on: nothing lands in the other file, the payload is gone,
    the writer's refusal (if any) is a tensordb error and the database checks clean."""
    import threading
    started, go = threading.Event(), threading.Event()
    original = w._pwrite

    def slow(fd, data, offset):
        started.set()
        go.wait(10)
        return original(fd, data, offset)
    w._pwrite = slow
    errors = []

    def run():
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - an aborted writer may refuse it
            errors.append(exc)
    th = threading.Thread(target=run)
    th.start()
    assert started.wait(10)
    w.abort()
    other = os.open(str(tmp_path / "other.bin"), os.O_RDWR | os.O_CREAT)
    try:
        go.set()
        th.join()
        assert os.fstat(other).st_size == 0  # nothing written through a reused number
    finally:
        os.close(other)
    assert not os.path.exists(w.path)
    assert all(isinstance(e, tensordb.Error) for e in errors), errors
    assert [r["problem"] for r in con.check()] == ["ok"]


def test_an_abort_while_a_tile_is_written_early_writes_into_no_other_file(tmp_path):
    """Review of issue 26 (the same race prod26 closed in ``_append``): a worker's early write
    took the writer's descriptor under the lock and wrote outside it; an abort on another
    thread (an error, Ctrl-C) closes that descriptor, and a file opened meanwhile takes its
    number, so the tile's bytes went into that file. Through a duplicate of the descriptor
    they land in the unlinked payload instead, and the other file is untouched."""
    with tensordb.connect(tmp_path / "db") as con:
        w = con.store.writer("T", (4, 6), np.dtype(np.float64), ((0, 2, 4), (0, 3, 6)),
                             dims=("i", "j"), replace=False)
        bufs = w.reserve([(0, 0), (0, 1), (1, 0), (1, 1)])
        assert w.staged_bytes > 0
        for buf in bufs.values():
            buf[...] = 7.0
        _abort_while_writing(tmp_path, con, w, lambda: w.write_early((0, 1)))


def test_an_abort_while_a_streamed_tile_is_written_writes_into_no_other_file(tmp_path):
    """The same race for a streamed output's tile (``_write_slot``: an output too large to
    stage where the commit fsyncs, each tile written into its place when finished)."""
    with tensordb.connect(tmp_path / "db") as con:
        assert con.store.fsync
        w = con.store.writer("T", (4, 6), np.dtype(np.float64), ((0, 2, 4), (0, 3, 6)),
                             dims=("i", "j"), replace=False)
        assert w.reserve([(0, 0), (0, 1), (1, 0), (1, 1)], stage_max=1) == {}
        assert w._slots  # streamed
        _abort_while_writing(tmp_path, con, w,
                             lambda: w.write_tile((0, 1), np.full((2, 3), 7.0)))
