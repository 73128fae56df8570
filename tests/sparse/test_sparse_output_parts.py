"""A large sparse output written in parts (issue 26, the whole-graph products): each worker's
CSR tile goes into the payload at its own place while the other's is written (``TensorWriter
._append``: the place taken under the lock, the bytes written outside it), its statistics and
checksum taken in one sweep of its values (``_csr_stats``). The answers are checked against
scipy and numpy, every tile's catalog checksum against zlib's CRC-32 of the bytes in the file
and by CHECK, on real on-disk catalogs."""
from __future__ import annotations

import os
import threading
import zlib

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.errors import InterfaceError
from tensordb.storage import Store
from tensordb.storage.integrity import check
from tensordb.storage.sparse import Filled
from tensordb.sparsity import sparse_nbytes
from tests.bench.bench_sparse_graph import rmat, stored_csr

INF = np.inf


def _rmat(scale, seed):
    rng = np.random.default_rng(seed)
    i, j = rmat(scale, 8, rng)
    n = 1 << scale
    w = rng.integers(1, 11, i.size).astype(np.float64)  # integral weights: sums are exact
    g = sp.csr_array(sp.coo_array((w, (i, j)), shape=(n, n)))
    g.sum_duplicates()
    return g


def _min_plus(a, fill=INF):
    """numpy's MIN(D[i,j] + D[j,k]) on the dense D (absent entries ``fill``), rows in slabs."""
    d = np.full(a.shape, fill)
    coo = a.tocoo()
    d[coo.row, coo.col] = coo.data
    out = np.empty(a.shape)
    for lo in range(0, a.shape[0], 32):
        out[lo:lo + 32] = (d[lo:lo + 32, :, None] + d[None, :, :]).min(axis=1)
    return out


def _crcs_match_the_file(con, name):
    """Every stored tile's catalog checksum is zlib's CRC-32 of its bytes in the payload file,
    the tiles do not overlap, and each starts 64-byte aligned."""
    reader = con.store.open(name)
    spans = []
    for e in reader.entries.values():
        with open(reader.path, "rb") as f:
            f.seek(e.offset)
            data = f.read(e.nbytes)
        assert len(data) == e.nbytes
        assert zlib.crc32(data) == e.crc32, (name, e.coords)
        assert e.offset % 64 == 0
        spans.append((e.offset, e.offset + e.nbytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    return reader


@pytest.mark.parametrize("pieces", ["", " WITH (PIECES i 2)", " WITH (PIECES k 2)",
                                    " WITH (PIECES i 2, k 2)"])
def test_whole_graph_spgemm_written_in_parts_equals_scipy(tmp_path, pieces):
    g = _rmat(9, 1)
    ref = g @ g
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("G", g)
        for _ in range(2):  # the second replaces the first: its own file, its own parts
            con.execute("C[i,k] = SUM(G[i,j] * G[j,k])" + pieces)
            reader = _crcs_match_the_file(con, "C")
            for e in reader.entries.values():
                assert e.format == "csr"
                assert e.nbytes == sparse_nbytes(e.shape, e.nnz, np.float64, "csr")
            got = stored_csr(con, "C", sp)
            assert abs(got - ref).max() == 0 and got.nnz == ref.nnz
            assert con.store.meta("C").nnz == ref.nnz
            assert [r["problem"] for r in con.check()] == ["ok"]
        np.testing.assert_array_equal(con.tensor("C"), ref.toarray())


@pytest.mark.parametrize("pieces", ["", " WITH (PIECES k 2)", " WITH (PIECES i 2, k 2)"])
def test_whole_graph_min_plus_written_in_parts_equals_numpy(tmp_path, pieces):
    g = _rmat(8, 2)
    ref = _min_plus(g)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("D", g, fill_value=INF)
        con.execute("P[i,k] = MIN(D[i,j] + D[j,k])" + pieces)
        reader = _crcs_match_the_file(con, "P")
        assert all(e.format == "csr" for e in reader.entries.values())
        assert con.store.meta("P").nnz == int(np.isfinite(ref).sum())
        assert [r["problem"] for r in con.check()] == ["ok"]
        np.testing.assert_array_equal(con.tensor("P"), ref)


def _csr_tile(n, density, seed, values=None):
    a = sp.random(n, n, density=density, random_state=seed, format="csr")
    a.sort_indices()
    if values is not None:
        a.data[:values.size] = values
    return sp.csr_array(a)


@pytest.mark.parametrize("odd", [None, np.array([0.0]), np.array([-0.0, 2.0]),
                                 np.array([INF, np.nan])])
def test_a_csr_tile_with_zeros_or_nonfinite_values_is_stored_as_before(tmp_path, odd):
    """A value to be left out (0) or kept with its sign (-0.0) takes the fallback that drops
    it; NaN and inf set the nonfinite flag: the catalog's nnz and flag are numpy's, the bytes
    those of the entries kept, the checksum zlib's."""
    a = _csr_tile(300, 0.05, 3, odd)
    dense = np.zeros(a.shape)  # the entries assigned, not added (scipy's toarray: -0.0 + 0)
    coo = a.tocoo()
    dense[coo.row, coo.col] = coo.data
    with Store(str(tmp_path / "db")) as store:
        with store.writer("T", a.shape, a.dtype, a.shape) as w:
            assert w.write_tile((0, 0), a)
        (e,) = store.open("T").entries.values()
        assert e.format == "csr"
        assert e.nnz == np.count_nonzero(dense)
        assert e.nonfinite == (not np.isfinite(dense).all())
        kept = a.nnz - int((a.data == 0).sum() - np.signbit(a.data[a.data == 0]).sum())
        assert e.nbytes == sparse_nbytes(a.shape, kept, a.dtype, "csr")
        got = store.open("T").read_box((0, 0), a.shape)
        np.testing.assert_array_equal(got, dense)
        assert np.signbit(got).sum() == np.signbit(dense).sum()  # a -0.0 kept
        assert [r[4] for r in check(store, "T")] == ["ok"]


def test_a_filled_csr_tile_leaves_out_entries_at_its_fill(tmp_path):
    a = _csr_tile(200, 0.05, 4)
    a.data[::7] = INF  # entries at the fill (+inf) are absent, as numpy's MIN sees them
    dense = np.full(a.shape, INF)
    coo = a.tocoo()
    dense[coo.row, coo.col] = coo.data
    with Store(str(tmp_path / "db")) as store:
        with store.writer("F", a.shape, a.dtype, a.shape, fill=INF) as w:
            w.write_tile((0, 0), Filled(a, INF))
        (e,) = store.open("F").entries.values()
        assert e.nnz == int(np.isfinite(dense).sum()) == a.nnz - a.data[::7].size
        np.testing.assert_array_equal(store.open("F").read_box((0, 0), a.shape), dense)


def test_tiles_appended_by_threads_at_once_keep_their_bytes(tmp_path):
    """Eight threads append large CSR tiles to one writer at once (a barrier lines them up):
    every tile reads back as written, its checksum verified, the catalog's offsets disjoint."""
    n, k = 8, 400
    tiles = [_csr_tile(k, 0.2, 10 + t) for t in range(n)]
    with Store(str(tmp_path / "db")) as store:
        w = store.writer("M", (k * n, k), np.float64, (k, k))
        barrier = threading.Barrier(n)
        errors = []

        def put(t):
            try:
                barrier.wait()
                assert w.write_tile((t, 0), tiles[t])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
        threads = [threading.Thread(target=put, args=(t,)) for t in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors
        w.commit()
        reader = store.open("M")
        spans = sorted((e.offset, e.offset + e.nbytes) for e in reader.entries.values())
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        want = np.concatenate([t.toarray() for t in tiles])
        np.testing.assert_array_equal(reader.read_box((0, 0), (k * n, k)), want)
        assert [r[4] for r in check(store)] == ["ok"]


class _SlowWriter:
    """Holds a writer's first payload write until the test has aborted the writer."""

    def __init__(self, w):
        self.w, self.started, self.go = w, threading.Event(), threading.Event()
        original = w._pwrite

        def pwrite(fd, data, offset):
            self.started.set()
            self.go.wait(10)
            return original(fd, data, offset)
        w._pwrite = pwrite


def test_an_abort_while_a_tile_is_written_leaves_no_file_and_no_tensor(tmp_path):
    """The bytes of a tile go out through a duplicate of the file's descriptor: an abort on
    another thread closes and unlinks the file meanwhile, the write lands in the unlinked file
    (never in another file that took the descriptor's number) and the writer refuses it."""
    a = _csr_tile(300, 0.1, 5)
    with Store(str(tmp_path / "db")) as store:
        w = store.writer("Z", a.shape, a.dtype, a.shape)
        slow = _SlowWriter(w)
        result = []

        def put():
            try:
                w.write_tile((0, 0), a)
                result.append("written")
            except InterfaceError as exc:
                result.append(exc)
        th = threading.Thread(target=put)
        th.start()
        assert slow.started.wait(10)
        w.abort()
        other = os.open(os.path.join(str(tmp_path), "other.bin"), os.O_RDWR | os.O_CREAT)
        slow.go.set()
        th.join()
        try:
            assert os.fstat(other).st_size == 0  # nothing written through a reused number
        finally:
            os.close(other)
        assert isinstance(result[0], InterfaceError)
        assert not os.path.exists(w.path)
        assert [m.name for m in store.list()] == []
        assert [r[4] for r in check(store)] == ["ok"]  # no orphan payload either
