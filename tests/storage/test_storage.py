"""The Store interface: writers, memory-mapped readers, read_box views, transactions, catalog."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import tensordb
from tensordb.storage.identity import payload_name
from tests.files import payload_files
from tensordb.geometry import even_bounds
from tensordb.storage import Store, TensorReader


def write(store, name, a, tile, **kw):
    with store.writer(name, a.shape, a.dtype, tile, **kw) as w:
        for c in np.ndindex(*w._grid_shape):
            lo, hi = tensordb.geometry.tile_box(w.grid, c)
            w.write_tile(c, a[tuple(slice(x, y) for x, y in zip(lo, hi))])
    return w.meta()


@pytest.fixture
def store():
    with Store() as s:
        yield s


@pytest.fixture
def slabs(store):
    """A (40, 6) tensor in row tiles of 8; tile 2 (rows 16..24) is all zero."""
    a = np.arange(240, dtype="float64").reshape(40, 6) + 1
    a[16:24] = 0
    write(store, "S", a, (8, 6))
    return a, store.open("S")


def test_catalog_tables_have_the_documented_columns(store):
    cols = store.duck.execute("SELECT column_name, data_type FROM duckdb_columns() "
                              "WHERE schema_name = 'tensordb' AND table_name = 'tiles'").fetchall()
    assert cols == [("tensor", "VARCHAR"), ("version", "BIGINT"), ("coords", "BIGINT[]"),
                    ("starts", "BIGINT[]"), ("shape", "BIGINT[]"), ("file", "VARCHAR"),
                    ("offset", "BIGINT"), ("nbytes", "BIGINT"), ("nnz", "BIGINT"),
                    ("crc32", "BIGINT"), ("nonfinite", "BOOLEAN"), ("format", "VARCHAR")]
    cols = store.duck.execute("SELECT column_name FROM duckdb_columns() "
                              "WHERE schema_name = 'tensordb' AND table_name = 'tensors'").fetchall()
    assert [c for (c,) in cols] == ["name", "version", "dtype", "shape", "dims", "grid", "nbytes",
                                    "tile_count", "nnz", "density", "created", "fill"]


def test_meta_and_layout(store, slabs):
    a, r = slabs
    m = store.meta("s")
    assert (m.name, m.shape, m.dims, m.tile_shape, m.grid_shape) == ("S", (40, 6), ("i", "j"),
                                                                      (8, 6), (5, 1))
    assert (m.tile_count, m.total_tiles, m.nnz, m.size) == (4, 5, 192, 240)
    assert m.nbytes == 4 * 8 * 6 * 8 and m.density == 192 / 240
    rows = store.duck.execute('SELECT "offset", file FROM tensordb.tiles ORDER BY "offset"').fetchall()
    assert all(off % 64 == 0 for off, _ in rows)
    assert {f for _, f in rows} == {payload_name(m.version, store.database)}
    assert os.listdir(store.tiles_dir) == [payload_name(m.version, store.database)]
    assert r.coords() == [(0, 0), (1, 0), (3, 0), (4, 0)]


def test_tiles_are_read_only_views(slabs):
    a, r = slabs
    t = r.tile((1, 0))
    np.testing.assert_array_equal(t, a[8:16])
    assert not t.flags.writeable and not t.flags.owndata
    with pytest.raises(ValueError):
        t[0, 0] = 5
    assert r.tile((2, 0)) is None


def test_read_box_views_and_copies(slabs):
    a, r = slabs
    one = r.read_box((8, 0), (16, 6))  # exactly one tile: a view
    assert np.shares_memory(one, r.tile((1, 0)))
    inner = r.read_box((9, 2), (12, 5))  # inside one tile: a view of it
    assert np.shares_memory(inner, r.tile((1, 0)))
    np.testing.assert_array_equal(inner, a[9:12, 2:5])
    run = r.read_box((0, 0), (16, 6))  # two adjacent row tiles: ONE view over both
    assert np.shares_memory(run, r.tile((0, 0))) and np.shares_memory(run, r.tile((1, 0)))
    np.testing.assert_array_equal(run, a[:16])
    run2 = r.read_box((26, 0), (40, 6))  # rows 24..40: tiles 3 and 4, a view sliced to the box
    assert np.shares_memory(run2, r.tile((3, 0)))
    np.testing.assert_array_equal(run2, a[26:40])
    gap = r.read_box((4, 1), (30, 6))  # spans the absent tile: an assembled copy with zeros
    assert gap.flags.owndata or not np.shares_memory(gap, r.tile((0, 0)))
    np.testing.assert_array_equal(gap, a[4:30, 1:6])
    assert r.read_box((16, 0), (24, 6)) is None  # only the absent tile
    assert r.read_box((17, 1), (20, 3)) is None
    np.testing.assert_array_equal(r.read_box((0, 0), (40, 6)), a)
    with pytest.raises(tensordb.OperationalError, match="outside"):
        r.read_box((0, 0), (41, 6))


def test_read_box_across_column_tiles(store):
    a = np.random.default_rng(0).random((20, 30))
    write(store, "C", a, (10, 7))
    r = store.open("C")
    for lo, hi in [((0, 0), (20, 30)), ((3, 5), (17, 29)), ((10, 7), (20, 14)), ((0, 28), (20, 30))]:
        np.testing.assert_array_equal(r.read_box(lo, hi), a[lo[0]:hi[0], lo[1]:hi[1]])
    assert np.shares_memory(r.read_box((10, 7), (20, 14)), r.tile((1, 1)))
    np.testing.assert_array_equal(r.to_numpy(), a)


def test_uneven_grid_and_scalar(store):
    a = np.arange(30, dtype="int32").reshape(10, 3)
    grid = (even_bounds(10, 3), (0, 3))
    write(store, "E", a, grid, dims=["x", "y"])
    r = store.open("E")
    assert r.meta.grid == ((0, 4, 7, 10), (0, 3))
    np.testing.assert_array_equal(r.read_box((2, 0), (9, 3)), a[2:9])
    s = np.array(4.5)
    write(store, "Z", s, ())
    r = store.open("Z")
    assert r.coords() == [()] and r.read_box((), ()) == 4.5 and r.to_numpy().shape == ()


def test_reader_pickles_without_handles(slabs):
    a, r = slabs
    r.tile((0, 0))  # maps the file
    state = r.__getstate__()
    assert "_map" not in state and "_lock" not in state
    r2 = pickle.loads(pickle.dumps(r))
    assert isinstance(r2, TensorReader) and r2._map is None
    np.testing.assert_array_equal(r2.read_box((0, 0), (40, 6)), a)


def test_writer_checks(store):
    w = store.writer("W", (4, 4), "float32", (2, 2))
    with pytest.raises(tensordb.DataError, match=r"should have shape \(2, 2\)"):
        w.write_tile((0, 0), np.ones((3, 2)))
    with pytest.raises(tensordb.InternalError, match="outside its grid"):
        w.write_tile((2, 0), np.ones((2, 2)))
    assert w.write_tile((0, 0), np.zeros((2, 2))) is False  # all zero: not stored
    assert w.write_tile((1, 1), np.ones((2, 2), "float64")) is True  # cast to float32
    with pytest.raises(tensordb.InternalError, match="written twice"):
        w.write_tile((1, 1), np.ones((2, 2)))
    assert not store.has("W")  # nothing visible before commit
    meta = w.commit()
    assert meta.tile_count == 1 and store.meta("W").dtype == np.float32
    with pytest.raises(tensordb.InterfaceError):
        w.commit()
    with pytest.raises(tensordb.CatalogError, match="already exists"):
        store.writer("w", (1,), "int32", (1,))


def test_abort_and_exception_leave_nothing(store):
    w = store.writer("X", (4,), "int64", (2,))
    w.write_tile((0,), np.ones(2, "int64"))
    assert len(os.listdir(store.tiles_dir)) == 1
    w.abort()
    assert os.listdir(store.tiles_dir) == [] and not store.has("X")
    with pytest.raises(RuntimeError):
        with store.writer("X", (4,), "int64", (2,)) as w:
            w.write_tile((0,), np.ones(2, "int64"))
            raise RuntimeError("boom")
    assert os.listdir(store.tiles_dir) == [] and not store.has("X")


def test_commit_rechecks_the_name(store):
    w1 = store.writer("N", (2,), "int32", (2,))
    w2 = store.writer("N", (2,), "int32", (2,))
    w1.write_tile((0,), np.ones(2, "int32"))
    w2.write_tile((0,), np.full(2, 2, "int32"))
    w1.commit()
    with pytest.raises(tensordb.CatalogError, match="already exists"):
        w2.commit()
    np.testing.assert_array_equal(store.open("N").to_numpy(), [1, 1])
    assert len(os.listdir(store.tiles_dir)) == 1


def test_transaction_all_or_nothing(store):
    write(store, "Keep", np.ones(3), (3,))
    before = sorted(os.listdir(store.tiles_dir))
    with pytest.raises(RuntimeError):
        with store.transaction():
            write(store, "New", np.ones(3), (3,))
            write(store, "Keep", np.full(3, 9.0), (3,), replace=True)
            with store.transaction():  # nested: joins the outer one
                store.drop("New")
                write(store, "Other", np.ones(2), (2,))
            assert store.has("Other") and not store.has("New")
            raise RuntimeError("statement 3 failed")
    assert [m.name for m in store.list()] == ["Keep"]
    np.testing.assert_array_equal(store.open("Keep").to_numpy(), np.ones(3))
    assert sorted(os.listdir(store.tiles_dir)) == before
    with store.transaction():
        write(store, "Keep", np.full(3, 9.0), (3,), replace=True)
        write(store, "More", np.ones(2), (2,))
    assert [m.name for m in store.list()] == ["Keep", "More"]
    assert len(payload_files(store)) == 2  # the replaced payload is gone (or a spare to reuse)


def test_replace_while_reading_old_version(store):
    a = np.arange(12.0).reshape(3, 4) + 1
    write(store, "R", a, (1, 4))
    old = store.open("R")
    view = old.read_box((0, 0), (3, 4))
    write(store, "R", -a, (1, 4), replace=True)
    np.testing.assert_array_equal(view, a)  # the mapping outlives the deleted file
    np.testing.assert_array_equal(store.open("R").to_numpy(), -a)


def test_orphans_removed_on_open(db_path):
    with tensordb.connect(db_path) as c:
        c.load("A", np.ones((4, 4)))
        tiles = c.store.tiles_dir
        kept = os.listdir(tiles)
    for junk in ("999.bin", "12.bin.tmp", "stray"):
        with open(os.path.join(tiles, junk), "wb") as f:
            f.write(b"x" * 100)
    with tensordb.connect(db_path, read_only=True) as c:
        assert len(os.listdir(tiles)) == 4  # a reader never deletes anything
    with tensordb.connect(db_path) as c:
        assert os.listdir(tiles) == kept
        np.testing.assert_array_equal(c.tensor("A"), np.ones((4, 4)))
        c.load("B", np.ones(2))
        assert c.store.meta("B").version > 999  # never reuse a number a leftover file used


def test_in_memory_cleans_up(store):
    s = Store()
    write(s, "T", np.ones(3), (3,))
    root = s.root
    assert root.exists()
    s.close()
    assert not root.exists()
    s.close()  # idempotent
    with pytest.raises(tensordb.InterfaceError):
        s.meta("T")


def test_same_process_second_writer_refused(db_path):
    """Two Stores of one path in one process are refused; connections share one (as DuckDB's
    connections share a database instance: tests/sqlfront/test_duckapi.py)."""
    with Store(db_path):
        with pytest.raises(tensordb.OperationalError, match="already open in this process"):
            Store(db_path)
    with tensordb.connect(db_path):
        with pytest.raises(tensordb.OperationalError, match="already open for writing"):
            tensordb.connect(db_path, read_only=True)
    with tensordb.connect(db_path) as c:  # closed: open again
        assert c.tensors() == []
    with tensordb.connect(db_path, read_only=True), tensordb.connect(db_path, read_only=True):
        pass  # readers share


def test_closed_connection(db_path):
    c = tensordb.connect(db_path)
    c.close()
    with pytest.raises(tensordb.InterfaceError, match="closed"):
        c.tensor("A")


def test_threads_write_tiles_and_read_during_a_transaction(store):
    import concurrent.futures as cf
    write(store, "In", np.arange(8.0), (2,))
    with store.transaction():
        w = store.writer("Out", (64, 8), "float64", (8, 8))
        with cf.ThreadPoolExecutor(4) as pool:
            # Worker threads read the catalog and write tiles while the block is open.
            list(pool.map(lambda k: w.write_tile((k, 0), np.full((8, 8), k + 1.0)
                                                 + store.open("In").to_numpy()), range(8)))
        w.commit()
    got = store.open("Out").to_numpy()
    np.testing.assert_array_equal(got, np.repeat(np.arange(1.0, 9), 8)[:, None] + np.arange(8.0))


def _read_in_child(reader, box):
    return reader.read_box(*box).copy()


def test_reader_works_in_another_process(slabs):
    import concurrent.futures as cf
    import multiprocessing
    a, r = slabs
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        got = pool.submit(_read_in_child, r, ((3, 1), (37, 5))).result(timeout=60)
    np.testing.assert_array_equal(got, a[3:37, 1:5])


def test_read_box_matches_numpy_slicing():
    from hypothesis import given, settings, strategies as st
    store = Store()

    @settings(max_examples=150, deadline=None)
    @given(st.data())
    def check(data):
        ndim = data.draw(st.integers(1, 3))
        shape = tuple(data.draw(st.integers(1, 9)) for _ in range(ndim))
        tile = tuple(data.draw(st.integers(1, n)) for n in shape)
        rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
        a = rng.integers(1, 5, shape).astype("int32")
        for c in np.ndindex(*(-(-n // t) for n, t in zip(shape, tile))):
            if rng.random() < 0.3:  # drop some tiles: they must read as zeros
                a[tuple(slice(k * t, (k + 1) * t) for k, t in zip(c, tile))] = 0
        starts = tuple(data.draw(st.integers(0, n)) for n in shape)
        stops = tuple(data.draw(st.integers(s, n)) for s, n in zip(starts, shape))
        write(store, "T", a, tile, replace=True)
        got = store.open("T").read_box(starts, stops)
        want = a[tuple(slice(x, y) for x, y in zip(starts, stops))]
        if got is None:
            assert not want.any()
        else:
            np.testing.assert_array_equal(got, want)

    try:
        check()
    finally:
        store.close()


def test_listing_and_describe(con):
    con.load("b", np.zeros((100, 10), "int32"), tile=(25, 10))
    a = np.zeros((64, 32), "float32")
    a[:16] = 1.5
    con.load("A", a, dims=["i", "j"], tile=(16, 32))
    listing = con.tensors()
    assert [t["name"] for t in listing] == ["A", "b"]
    t = listing[0]
    assert {k: t[k] for k in ("shape", "dtype", "dims", "tile_shape", "grid", "bytes", "dense_bytes",
                               "tile_count", "total_tiles", "nnz", "density")} == {
        "shape": (64, 32), "dtype": "float32", "dims": ("i", "j"), "tile_shape": (16, 32),
        "grid": (4, 1), "bytes": 16 * 32 * 4, "dense_bytes": 64 * 32 * 4, "tile_count": 1,
        "total_tiles": 4, "nnz": 512, "density": 0.25}
    d = con.describe("a")
    assert d["tile_density"] == 0.25
    assert d["dimensions"][0] == {"name": "i", "size": 64, "tile": 16, "tiles": 4,
                                  "bounds": (0, 16, 32, 48, 64)}
    assert os.path.exists(d["file"])
    assert listing[1]["tile_count"] == 0 and listing[1]["bytes"] == 0


@pytest.mark.parametrize("how", ["staged", "streamed", "mapped", "mapped, large tiles"])
def test_reserved_tiles_mapped_staged_or_streamed_land_in_the_file(tmp_path, monkeypatch, how):
    """Reserved tiles are anonymous memory written into the payload file at commit (up to
    ``STAGE_MAX``); over it, where the commit fsyncs, there are no buffers and each tile is
    written into its place as it is given (streamed), and where it does not, a mapping of the
    file. Either way the reopened database reads the computed bytes, with their checksums; an
    all-zero tile gets no row; an aborted writer leaves no file. Tiles over ``STREAM_TILE_MAX``
    are mapped on disk too."""
    from tensordb.storage import reserved as wr  # reserve() reads the caps (reserved.py)
    monkeypatch.setattr(wr, "STAGE_MAX", 1 << 30 if how == "staged" else 0)
    if how == "mapped, large tiles":
        monkeypatch.setattr(wr, "STREAM_TILE_MAX", 1024)  # a tile here is 2560 bytes
    rng = np.random.default_rng(5)
    a = rng.standard_normal((48, 20))
    a[16:32] = 0
    with Store(tmp_path / "db") as store:
        store.fsync = how != "mapped"  # as in memory: nothing synced
        w = store.writer("R", a.shape, a.dtype, (16, 20))
        bufs = w.reserve([(0, 0), (1, 0), (2, 0)])
        assert (w._map is not None) == how.startswith("mapped")
        assert w.streams == (how == "streamed")
        if how == "streamed":
            assert bufs == {}
            kept = [w.write_tile((i, 0), a[16 * i:16 * (i + 1)].copy()) for i in range(3)]
            assert kept == [True, False, True]
        for (i, _), buf in bufs.items():
            np.copyto(buf, a[16 * i:16 * (i + 1)])
            w.write_tile((i, 0), buf)
        w.commit()
        meta = store.meta("R")
        assert meta.tile_count == 2 and meta.nnz == np.count_nonzero(a)
        w2 = store.writer("Q", a.shape, a.dtype, (16, 20))
        w2.reserve([(0, 0)])
        path = w2.path
        w2.abort()
        assert not os.path.exists(path)
    with tensordb.connect(tmp_path / "db") as con:
        np.testing.assert_array_equal(con.tensor("R"), a)
        assert [r["problem"] for r in con.check()] == ["ok"]
        assert not con.store.has("Q")


def test_a_killed_loads_inflated_npz_member_goes_at_the_next_open(tmp_path):
    """A compressed .npz member is inflated into a file in the database root for the length of
    its load; a process killed meanwhile leaves it there. The next open for writing removes it
    (a read-only open changes nothing), and nothing else of the root."""
    root = tmp_path / "db"
    with tensordb.connect(root) as con:
        con.load("A", np.arange(6.0))
    left = root / ".npz-member-abc123.npy"
    left.write_bytes(b"\x93NUMPY partial")
    other = root / "notes.txt"
    other.write_text("the user's")
    with tensordb.connect(root, read_only=True) as con:
        np.testing.assert_array_equal(con.tensor("A"), np.arange(6.0))
    assert left.exists()
    with tensordb.connect(root) as con:
        np.testing.assert_array_equal(con.tensor("A"), np.arange(6.0))
    assert not left.exists() and other.read_text() == "the user's"
