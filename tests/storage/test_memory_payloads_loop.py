"""An in-memory database's outputs of up to memfiles.FILE_MAX (16 MiB) computed in anonymous
memory (storage/memfiles.py), replaced many times in a loop while another thread reads: each read
is one whole version (numpy's product of that version's inputs, exactly: small integers), and
the process's resident memory, the bytes kept and the spare allocations stay bounded; rolled-back
blocks return what they took."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tensordb
from tensordb.storage import memfiles

N, R = 1024, 32  # the output: 1024 x 1024 float64, 8 MiB (above the 1 MiB of before blk39)

pytestmark = pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"),
                                reason="reads /proc")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.fixture
def con():
    c = tensordb.connect(None, workers=2)
    yield c
    c.close()


def _data():
    rng = np.random.default_rng(0)
    A = rng.integers(-3, 4, (N, R)).astype(np.float64)
    Bs = [rng.integers(-3, 4, (R, N)).astype(np.float64) for _ in range(4)]
    return A, Bs, [A @ B for B in Bs]


def test_replaces_under_a_reading_thread_read_whole_versions_in_bounded_memory(con):
    A, Bs, wants = _data()
    con.load("A", A)
    for k, B in enumerate(Bs):
        con.load(f"B{k}", B)
    con.execute("W[i,k] = SUM(A[i,j] * B0[j,k])")
    assert memfiles.held_bytes(con.store.tiles_dir) == N * N * 8  # kept here, no file
    stop, bad, reads = threading.Event(), [], [0]

    def read():
        while not stop.is_set():
            reader = con.store.open_many(["W"])["W"]
            got = reader.to_numpy()
            box = reader.read_box((0, 0), (N, N))
            if not any(np.array_equal(got, w) for w in wants) or not np.array_equal(box, got):
                bad.append(reads[0])
            reads[0] += 1

    t = threading.Thread(target=read)
    t.start()
    try:
        for step in range(8):  # warm: the spares are made
            con.execute(f"W[i,k] = SUM(A[i,j] * B{step % 4}[j,k])")
        before = _rss()
        for step in range(8, 48):
            con.execute(f"W[i,k] = SUM(A[i,j] * B{step % 4}[j,k])")
        grown = _rss() - before
    finally:
        stop.set()
        t.join(60)
    assert not bad and reads[0] > 0
    np.testing.assert_array_equal(con.tensor("W"), wants[47 % 4])
    assert memfiles.held_bytes(con.store.tiles_dir) == N * N * 8  # one version, not 48
    assert memfiles.spare_bytes(con.store.tiles_dir) <= memfiles.SPARE_BYTES
    assert grown < 6 * N * N * 8, grown  # 40 replaces of 8 MiB: not 320 MiB more


def test_rolled_back_blocks_return_their_allocations(con):
    A, Bs, wants = _data()
    con.load("A", A)
    for k, B in enumerate(Bs):
        con.load(f"B{k}", B)
    con.execute("W[i,k] = SUM(A[i,j] * B0[j,k])")
    for step in range(6):
        con.execute("BEGIN")
        con.execute(f"W[i,k] = SUM(A[i,j] * B{step % 4}[j,k])")
        con.execute("ROLLBACK")
    before = _rss()
    for step in range(30):
        con.execute("BEGIN")
        con.execute(f"W[i,k] = SUM(A[i,j] * B{step % 4}[j,k])")
        con.execute(f"V[i,k] = SUM(A[i,j] * B{(step + 1) % 4}[j,k])")
        con.execute("ROLLBACK")
    grown = _rss() - before
    np.testing.assert_array_equal(con.tensor("W"), wants[0])
    assert not con.store.has("V")
    assert memfiles.held_bytes(con.store.tiles_dir) == N * N * 8
    assert memfiles.spare_bytes(con.store.tiles_dir) <= memfiles.SPARE_BYTES
    assert grown < 6 * N * N * 8, grown


def test_on_the_dask_executor_every_output_is_a_file_its_workers_read():
    """Dask workers are other processes: an in-memory database's 8 MiB output gets a payload
    file there (nothing kept in this process), and the next statement's workers read it."""
    A, Bs, wants = _data()
    with tensordb.connect(None, workers=2, executor="dask") as con:
        con.load("A", A)
        con.load("B", Bs[0])
        for step in range(2):
            if step:
                con.load("B", Bs[1], replace=True)
            con.execute("W[i,k] = SUM(A[i,j] * B[j,k])")
            con.execute("s[i] = SUM(W[i,k])")
            assert memfiles.held_bytes(con.store.tiles_dir) == 0
            np.testing.assert_array_equal(con.tensor("W"), wants[step])
            np.testing.assert_array_equal(con.tensor("s"), wants[step].sum(axis=1))
