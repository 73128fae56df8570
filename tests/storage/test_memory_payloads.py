"""A small output of an in-memory database has no payload file: its staged bytes are kept in the
process under the file's name (storage/memfiles.py). Everything that reads a payload (readers,
``to_numpy``, SQL, export, CHECK, a pickled reader) reads them; a version's bytes go only when the
catalog no longer references it (a replace or drop committed, a failed statement rolled back, the
database closed); a reader that holds them keeps its version. Checked against numpy and zlib."""
from __future__ import annotations

import os
import pickle
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

import tensordb
from tensordb.storage import memfiles


def _path(con, name: str) -> str:
    (file,) = {r[0] for r in con.sql(
        f"SELECT DISTINCT file FROM tensordb.tiles WHERE tensor = '{name}'").fetchall()}
    return os.path.join(con.store.tiles_dir, file)


def _kept(con) -> set[str]:
    return {os.path.basename(p) for p in memfiles.paths_under(con.store.tiles_dir)}


def _referenced(con) -> set[str]:
    return {r[0] for r in con.sql("SELECT DISTINCT file FROM tensordb.tiles").fetchall()}


@pytest.fixture
def con():
    c = tensordb.connect(None, workers=2)
    yield c
    c.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_a_small_output_round_trips_without_a_file(con, dtype, tmp_path):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((40, 24)) * 10).astype(dtype)
    b = (rng.standard_normal((40, 24)) * 10).astype(dtype)
    con.load("A", a)
    con.load("B", b)
    con.execute("C[i,k] = A[i,k] * B[i,k] - A[i,k]")  # elementwise: numpy's very bytes
    want = a * b - a
    got = con.tensor("C")
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    path = _path(con, "C")
    assert not os.path.exists(path)  # no file for it: the catalog names it all the same
    data, _ = memfiles.get(path)
    # the catalog's row of the tile: its checksum and nonzeros are those of the kept bytes
    ((offset, nbytes, crc, nnz),) = con.sql(
        "SELECT \"offset\", nbytes, crc32, nnz FROM tensordb.tiles WHERE tensor = 'C'").fetchall()
    assert crc == zlib.crc32(memoryview(data)[offset:offset + nbytes])
    assert nnz == np.count_nonzero(want)
    assert con.sql("SELECT nnz FROM tensordb.tensors WHERE name = 'C'").fetchall() == [(nnz,)]
    # SQL reads it, export writes it, CHECK verifies it
    rows = con.sql("SELECT i, k, value FROM C ORDER BY i, k").fetchall()  # its nonzeros
    assert rows == [(int(i), int(k), want[i, k].item()) for i, k in zip(*np.nonzero(want))]
    con.export("C", tmp_path / "c.npy")
    exported = np.load(tmp_path / "c.npy")
    assert exported.dtype == want.dtype and exported.tobytes() == want.tobytes()
    assert [r["problem"] for r in con.check()] == ["ok"]
    # a reader shipped to another process (as to a Dask worker) carries the bytes
    reader = pickle.loads(pickle.dumps(con.store.open("C")))
    assert reader.to_numpy().tobytes() == want.tobytes()


def test_an_output_over_file_max_and_an_on_disk_output_are_files(tmp_path, monkeypatch):
    monkeypatch.setattr(memfiles, "FILE_MAX", 1 << 20)  # (8 MiB: a smaller test)
    a = np.ones((512, 520), np.float32)  # just over 1 MiB
    with tensordb.connect(None) as mem:
        mem.load("A", a)
        mem.execute("B[i,j] = A[i,j] * 2")
        assert os.path.exists(_path(mem, "B")) and _kept(mem) == set()
        np.testing.assert_array_equal(mem.tensor("B"), a * 2)
    a = a[:, :512]
    with tensordb.connect(None) as mem:
        mem.load("A", a)
        mem.execute("B[i,j] = A[i,j] * 2")
        assert not os.path.exists(_path(mem, "B")) and _kept(mem) == {os.path.basename(
            _path(mem, "B"))}
        np.testing.assert_array_equal(mem.tensor("B"), a * 2)
    with tensordb.connect(tmp_path / "db") as disk:
        disk.load("A", a[:4, :4])
        disk.execute("B[i,j] = A[i,j] * 2")
        assert os.path.exists(_path(disk, "B"))
        assert memfiles.paths_under(disk.store.tiles_dir) == []


def test_old_versions_go_only_when_unreferenced(con):
    w = np.linspace(-1, 1, 32).reshape(4, 8)
    con.load("W", w)
    con.execute("W[i,j] = W[i,j] * 0.5")
    first = _path(con, "W")
    before = con.store.open("W")  # a reader of this version, taken before the next replace
    for step in range(20):
        con.execute("W[i,j] = W[i,j] * 0.5")
        assert _kept(con) <= _referenced(con)  # nothing kept that the catalog does not name
    assert memfiles.get(first) is None  # replaced, committed: its bytes were let go
    np.testing.assert_array_equal(before.to_numpy(), w * 0.5)  # the reader kept its version
    np.testing.assert_array_equal(con.tensor("W"), w * 0.5 ** 21)
    assert memfiles.held_bytes(con.store.tiles_dir) == w.nbytes  # one version held, not 21
    con.execute("DROP TENSOR W")
    assert _kept(con) == set()
    np.testing.assert_array_equal(before.to_numpy(), w * 0.5)


def test_a_reader_in_another_thread_keeps_its_snapshot(con):
    w = np.arange(12.0).reshape(3, 4)
    con.load("W", w)
    con.execute("W[i,j] = W[i,j] + 1")
    opened, replaced, seen = threading.Event(), threading.Event(), []

    def read():
        reader = con.store.open_many(["W"])["W"]  # its snapshot of W: version 1 step in
        opened.set()
        replaced.wait(30)
        seen.append(reader.to_numpy())
        seen.append(reader.read_box((0, 0), (3, 4)).copy())
    t = threading.Thread(target=read)
    t.start()
    assert opened.wait(30)
    for _ in range(3):
        con.execute("W[i,j] = W[i,j] + 1")
    replaced.set()
    t.join(30)
    for got in seen:
        np.testing.assert_array_equal(got, w + 1)
    np.testing.assert_array_equal(con.tensor("W"), w + 4)


def test_a_failed_statement_leaves_nothing(con):
    a = np.arange(6.0).reshape(2, 3)
    con.load("A", a)
    con.execute("A[i,j] = A[i,j] + 1")
    kept, rows = _kept(con), con.sql("SELECT name, version FROM tensordb.tensors").fetchall()
    with pytest.raises(tensordb.Error):  # the first commits into the unit's transaction
        con.execute("A[i,j] = A[i,j] * 10; B[i] = SUM(A[i,j] * Nope[i,j]);")
    with pytest.raises(tensordb.Error):
        con.execute("BEGIN; A[i,j] = A[i,j] * 10; C[i,j] = A[i,j] * 3; "
                    "D[i] = SUM(A[i,j] * Nope[i,j]); COMMIT;")
    assert _kept(con) == kept
    assert con.sql("SELECT name, version FROM tensordb.tensors").fetchall() == rows
    np.testing.assert_array_equal(con.tensor("A"), a + 1)
    assert [r["problem"] for r in con.check()] == ["ok"]


def test_check_finds_damaged_kept_bytes(con):
    con.load("A", np.arange(8.0))
    con.execute("B[i] = A[i] * 3")
    path = _path(con, "B")
    data, _ = memfiles.get(path)
    damaged = data.copy()
    damaged[3] ^= 0xFF
    damaged.flags.writeable = False
    memfiles.keep(path, damaged)  # as a stray write into the bytes would leave them
    problems = [r["problem"] for r in con.check() if r["tensor"] == "B"]
    assert len(problems) == 1 and problems[0].startswith("checksum mismatch")
    con.store._kept_readers.clear()  # a reader opened now reads the damaged bytes
    with pytest.raises(tensordb.DataError, match="damaged"):
        con.store.open("B").to_numpy()


def test_close_lets_every_kept_payload_go():
    c = tensordb.connect(None)
    c.load("A", np.ones(4))
    c.execute("B[i] = A[i] + 1")
    c.execute("C[i] = B[i] * 2")
    tiles = c.store.tiles_dir
    assert len(memfiles.paths_under(tiles)) == 2
    c.close()
    assert memfiles.paths_under(tiles) == [] and memfiles.held_bytes(tiles) == 0


def test_ctrl_c_in_the_commit_leaves_nothing(con, monkeypatch):
    """A KeyboardInterrupt after the first output's bytes were kept and before the second's
    commit: neither version lands and no bytes are left kept."""
    from tensordb.storage import writer
    x = np.arange(12.0).reshape(3, 4)
    con.load("X", x)
    con.execute("W[i,j] = X[i,j] * 2; L = SUM(X[i,j]);")
    kept, rows = _kept(con), con.sql("SELECT name, version FROM tensordb.tensors").fetchall()
    real, calls = writer.TensorWriter._finish, []

    def interrupted(self):
        calls.append(self.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self)
    monkeypatch.setattr(writer.TensorWriter, "_finish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        con.execute("W[i,j] = X[i,j] * 3; L = SUM(X[i,j] * 3);")
    monkeypatch.undo()
    assert len(calls) == 2
    assert _kept(con) == kept
    assert con.sql("SELECT name, version FROM tensordb.tensors").fetchall() == rows
    np.testing.assert_array_equal(con.tensor("W"), x * 2)
    assert float(con.tensor("L")) == x.sum()
    con.execute("W[i,j] = X[i,j] * 3;")  # and the next statement stores as ever
    np.testing.assert_array_equal(con.tensor("W"), x * 3)


def test_explain_analyze_and_grad_read_kept_payloads(con):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 3)), rng.standard_normal((3, 2))
    con.load("X", x)
    con.load("W0", w)
    con.execute("W[d,c] = W0[d,c] * 1")  # a small output: kept as bytes
    assert _kept(con) and memfiles.get(_path(con, "W")) is not None
    got = con.execute("EXPLAIN ANALYZE Z[b,c] = SUM(X[b,d] * W[d,c])").fetchall()
    assert "W" in "\n".join(" ".join(str(v) for v in r) for r in got)
    np.testing.assert_allclose(con.tensor("Z"), x @ w, rtol=1e-13)
    con.execute("L = SUM(X[b,d] * W[d,c] * X[b,d] * W[d,c]); dW = GRAD(L, W)")
    np.testing.assert_allclose(con.tensor("dW"), 2 * w * (x ** 2).sum(0)[:, None], rtol=1e-12)


def test_a_tile_reserve_did_not_lay_out_sends_the_output_to_a_file(con):
    """A writer whose reserved tiles were to be kept in memory, then given a tile it did not
    reserve (appended after them), writes a file after all: both tiles land, nothing kept."""
    st = con.store
    w = st.writer("T", (8,), np.dtype(np.float64), ((0, 4, 8),), dims=("i",))
    bufs = w.reserve([(0,)])
    bufs[(0,)][...] = [1.0, 2.0, 3.0, 4.0]
    w.write_tile((0,), bufs[(0,)])
    w.write_tile((1,), np.array([5.0, 6.0, 7.0, 8.0]))
    w.commit()
    np.testing.assert_array_equal(con.tensor("T"), np.arange(1.0, 9.0))
    path = _path(con, "T")
    assert os.path.exists(path) and memfiles.get(path) is None
    assert [r["problem"] for r in con.check()] == ["ok"]


def test_a_small_output_of_a_writer_used_directly_is_kept(con):
    st = con.store
    w = st.writer("T", (8,), np.dtype(np.float64), ((0, 4, 8),), dims=("i",))
    bufs = w.reserve([(0,), (1,)])
    for c, buf in bufs.items():
        buf[...] = np.arange(4.0) + 4 * c[0]
        w.write_tile(c, buf)
    w.commit()
    path = _path(con, "T")
    assert not os.path.exists(path) and memfiles.get(path) is not None
    np.testing.assert_array_equal(con.tensor("T"), np.arange(8.0))


def test_a_database_never_closed_lets_its_kept_payloads_go_when_collected():
    """A store dropped without close (no connection around it): its kept payloads go with its
    temporary directory, when it is collected."""
    import gc
    from tensordb.storage import Store
    st = Store(None)
    w = st.writer("T", (4,), np.dtype(np.float64), ((0, 4),), dims=("i",))
    (buf,) = w.reserve([(0,)]).values()
    buf[...] = 1.0
    w.write_tile((0,), buf)
    w.commit()
    tiles = st.tiles_dir
    assert memfiles.paths_under(tiles)
    del st, w, buf
    gc.collect()
    assert memfiles.paths_under(tiles) == [] and memfiles.held_bytes(tiles) == 0


@pytest.mark.parametrize("how", ["kept", "load"])
def test_ctrl_c_after_an_in_memory_commit_landed_keeps_the_new_version(con, monkeypatch, how):
    """A replace committed on its own (a store writer's commit, a load: the in-memory catalog's
    rows kept back, deferred.py) and interrupted after it landed, while the replaced payload is
    retired: the new version is the catalog's, so its bytes (kept, or its file) must stay. They
    were deleted as a failed writer's, leaving the catalog naming a payload that was gone."""
    from tensordb.storage import spares
    old, new = np.arange(8.0), np.arange(8.0) + 100

    def put(values):
        if how == "load":
            con.load("T", values, tile=(4,), replace=True)
            return
        w = con.store.writer("T", (8,), np.dtype(np.float64), ((0, 4, 8),), dims=("i",),
                             replace=True)
        for c, buf in w.reserve([(0,), (1,)]).items():
            buf[...] = values[4 * c[0]:4 * c[0] + 4]
            w.write_tile(c, buf)
        w.commit()
    put(old)
    path = _path(con, "T")

    def interrupted(self, path, keep=True):
        raise KeyboardInterrupt
    monkeypatch.setattr(spares.SparePayloads, "retire", interrupted)
    with pytest.raises(KeyboardInterrupt):
        put(new)
    monkeypatch.undo()
    assert _path(con, "T") != path  # the commit landed: the catalog names the new version
    np.testing.assert_array_equal(con.tensor("T"), new)
    # nothing damaged or missing; the replaced file whose retiring was interrupted is left
    # (an orphan until the database closes, as the docs say of a retired file after a crash)
    assert {r["problem"] for r in con.check()} - {"ok"} <= {
        "orphan file: no catalog row references it (the next open for writing deletes it)"}
    con.execute("T[i] = T[i] * 2")  # and the next statement stores as ever
    np.testing.assert_array_equal(con.tensor("T"), new * 2)


def test_a_reader_opened_while_another_thread_replaces_reads_a_whole_version(con, monkeypatch):
    """``open_many`` in one thread looks a version up; another thread's commit replaces it
    before the reader is made (the store's general path: the kept reader let go, as a rollback
    or the kept readers' cap leaves it). The reader must read the version it looked up (its
    bytes were still the catalog's) or the new one, never fail for bytes let go meanwhile:
    the lookup and the reader are made under the store's lock, where a commit retires."""
    w = np.arange(12.0).reshape(3, 4)
    con.load("W", w)
    con.execute("W[i,j] = W[i,j] + 1")
    store = con.store
    real_meta, replaced, errors = store.meta, threading.Event(), []

    def replace():
        try:
            con.execute("W[i,j] = W[i,j] + 1")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        replaced.set()

    def meta_then_replace(name):
        meta = real_meta(name)
        if not threads and threading.current_thread() is main:  # once, from this thread
            t = threading.Thread(target=replace)
            t.start()
            threads.append(t)
            replaced.wait(2.0)  # done at once unless the lookup holds the store's lock
        return meta
    threads: list[threading.Thread] = []
    main = threading.current_thread()
    store._kept_readers.clear()  # the general path of open_many
    monkeypatch.setattr(store, "meta", meta_then_replace)
    reader = store.open_many(["W"])["W"]
    got = reader.to_numpy()
    monkeypatch.undo()
    for t in threads:
        t.join(30)
    assert not errors and replaced.is_set()
    assert any(np.array_equal(got, w + k) for k in (1, 2)), got
    np.testing.assert_array_equal(con.tensor("W"), w + 2)


def test_a_reader_shipped_on_again_carries_the_bytes(con):
    """A reader of a kept payload unpickled in another process (a Dask worker), then pickled
    there once more, or narrowed there to some tiles (``with_entries``) and pickled: the bytes
    go with it each time, since no process but this one has them under that path."""
    import subprocess
    import sys
    a = np.arange(24.0).reshape(4, 6)
    con.load("A", a, tile=(2, 6))
    con.execute("B[i,j] = A[i,j] * 3")
    assert memfiles.get(_path(con, "B")) is not None
    child = (
        "import pickle, sys\n"
        "r = pickle.loads(sys.stdin.buffer.read())\n"
        "again = pickle.loads(pickle.dumps(r))\n"
        "first = sorted(r.entries.values(), key=lambda e: e.offset)[:1]\n"
        "part = pickle.loads(pickle.dumps(r.with_entries(first)))\n"
        "box = (first[0].starts, first[0].shape)\n"
        "sys.stdout.buffer.write(pickle.dumps((again.to_numpy(), part.to_numpy(), box)))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(con.store.open("B")),
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    again, part, (starts, shape) = pickle.loads(done.stdout)
    want = a * 3
    np.testing.assert_array_equal(again, want)
    one = np.zeros_like(want)  # its one tile; the others absent: zeros
    box = tuple(slice(s, s + n) for s, n in zip(starts, shape))
    one[box] = want[box]
    np.testing.assert_array_equal(part, one)


def _address(con, name: str) -> int:
    return memfiles.get(_path(con, name))[0].__array_interface__["data"][0]


def test_a_let_go_allocation_is_reused_only_when_nothing_refers_to_it(con, monkeypatch):
    """A repeated 2 MiB output (over the staging cache's 1 MiB floor, under FILE_MAX) is kept
    in the process and computed into the allocation of the version it replaced two steps
    before (memfiles.take); a view of a version held by the caller is never written into: its
    bytes stay that version's, and its allocation is reused only once the view is gone."""
    w = np.random.default_rng(5).standard_normal((1024, 512), dtype=np.float32)  # 2 MiB
    con.load("W", w)
    step = "W[i,j] = W[i,j] * 0.5 + 1"
    taken, take = [], memfiles.take

    def counting(path, nbytes):
        got = take(path, nbytes)
        taken.append(None if got is None else got.__array_interface__["data"][0])
        return got
    monkeypatch.setattr(memfiles, "take", counting)
    seen = set()
    for _ in range(6):
        con.execute(step)
        w = w * np.float32(0.5) + np.float32(1)
        assert not os.path.exists(_path(con, "W"))  # no file: kept here
        seen.add(_address(con, "W"))
    assert len(seen) <= 3  # the allocations take turns, not a new one each step
    assert len(taken) == 6 and sum(t is not None for t in taken[-3:]) == 3, taken
    assert memfiles.spare_bytes(con.store.tiles_dir) <= memfiles.SPARE_BYTES
    np.testing.assert_array_equal(con.tensor("W"), w)
    held_version = w
    held = con.store.open("W").mapping()  # a view of this version's bytes, held
    held_at = held.__array_interface__["data"][0]
    del taken[:]
    for _ in range(6):
        con.execute(step)
        w = w * np.float32(0.5) + np.float32(1)
        assert _address(con, "W") != held_at and held_at not in taken
        np.testing.assert_array_equal(con.tensor("W"), w)
    reread = np.ndarray(held_version.shape, held_version.dtype, held, 0)
    np.testing.assert_array_equal(reread, held_version)  # never written into
    assert [r["problem"] for r in con.check()] == ["ok"]
    del held, reread
    import gc
    gc.collect()
    del taken[:]
    for _ in range(4):
        con.execute(step)
        w = w * np.float32(0.5) + np.float32(1)
    np.testing.assert_array_equal(con.tensor("W"), w)
    assert sum(t is not None for t in taken) >= 3, taken
    tiles_dir = con.store.tiles_dir
    assert 0 < memfiles.spare_bytes(tiles_dir) <= memfiles.SPARE_BYTES
    con.close()
    assert memfiles.spare_bytes(tiles_dir) == 0  # closing lets the spares go


def test_an_spmm_output_of_12_mib_is_kept_in_the_process_and_reuses_its_spare(con):
    """The issue's SpMM shape (a sparse matrix times 64 dense columns, 12.2 MiB of float32
    output; FILE_MAX 16 MiB since spmv40b) has no payload file in an in-memory database: a
    repeated statement computes into the allocation a replaced version let go (no new pages),
    and every answer is numpy's product of the densified inputs."""
    import scipy.sparse as sp
    rng = np.random.default_rng(9)
    n, cols = 50_000, 64
    G = sp.csr_array(sp.coo_array((rng.random(20_000, dtype=np.float32) + 0.5,
                                   (rng.integers(0, n, 20_000), rng.integers(0, n, 20_000))),
                                  shape=(n, n)))
    G.sum_duplicates()
    X = rng.standard_normal((n, cols), dtype=np.float32)
    con.load("G", G)
    con.load("X", X)
    want = (G.astype(np.float64) @ X.astype(np.float64))
    seen = set()
    for _ in range(4):
        con.execute("Y[i,k] = SUM(G[i,j] * X[j,k])")
        assert not os.path.exists(_path(con, "Y"))  # no file: kept here
        seen.add(_address(con, "Y"))
        np.testing.assert_allclose(con.tensor("Y"), want, rtol=1e-5, atol=1e-5)
    assert len(seen) <= 3  # the allocations take turns, not a new one each statement
    assert memfiles.spare_bytes(con.store.tiles_dir) <= memfiles.SPARE_BYTES
