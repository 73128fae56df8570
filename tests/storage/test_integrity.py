"""Payload integrity (issue 9, item 4): every tile's crc32 recorded on every write path, damaged
payload files (truncated, emptied, replaced by a directory, deleted) reported as tensordb errors
naming the tensor and the file on every read path, and CHECK TENSOR / CHECK DATABASE reporting
every bad tile, orphan file and catalog disagreement without changing anything.

Real database directories under tmp_path; files are really damaged on disk. Oracles: checksums
and nonzero counts computed here with zlib and numpy from the arrays themselves, tile offsets
read from the catalog with DuckDB.
"""
from __future__ import annotations

import os
import stat
import tracemalloc
import zlib

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb.storage import verify

A = np.arange(1, 65, dtype="float64").reshape(8, 8)  # tiles (4, 4): every tile nonzero
B = np.arange(64, dtype="float64").reshape(8, 8) % 5 - 2


def make_db(root, **kw):
    with tensordb.connect(root, **kw) as con:
        con.load("A", A, tile=(4, 4), dims=["i", "j"])
        con.load("B", B, dims=["j", "k"])
    return root


def tile_rows(root_or_con, name):
    """{coords: (file, offset, nbytes, nnz, crc32)} from the catalog, read with DuckDB itself."""
    sql = ('SELECT t.coords, t.file, t."offset", t.nbytes, t.nnz, t.crc32 FROM tensordb.tiles t '
           "JOIN tensordb.tensors m ON m.name = t.tensor AND m.version = t.version "
           "WHERE lower(t.tensor) = lower(?)")
    if isinstance(root_or_con, tensordb.Connection):
        rows = root_or_con.store.duck.execute(sql, [name]).fetchall()
    else:
        with duckdb.connect(os.path.join(root_or_con, "catalog.duckdb"), read_only=True) as d:
            rows = d.execute(sql, [name]).fetchall()
    return {tuple(c): (f, o, nb, nz, crc) for c, f, o, nb, nz, crc in rows}


def payload(root, name):
    files = {v[0] for v in tile_rows(root, name).values()}
    assert len(files) == 1
    return os.path.join(root, "tiles", files.pop())


def expected_tiles(array, tile):
    """{coords: (crc32, nnz)} of the nonzero tiles of ``array`` cut in ``tile`` blocks."""
    out = {}
    grid = [range(0, n, t) for n, t in zip(array.shape, tile)]
    for starts in np.ndindex(*[len(g) for g in grid]):
        box = tuple(slice(g[c], g[c] + t) for g, c, t in zip(grid, starts, tile))
        block = np.ascontiguousarray(array[box])
        if np.count_nonzero(block):
            out[starts] = (zlib.crc32(block.tobytes()), int(np.count_nonzero(block)))
    return out


def snapshot(root):
    """Every file under the database directory with its bytes (or 'dir', or its mode)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not stat.S_ISREG(os.lstat(p).st_mode):  # a FIFO: reading it would block
                out[os.path.relpath(p, root)] = os.lstat(p).st_mode
                continue
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


# -- a. checksums on every write path -----------------------------------------------------------

def test_every_write_path_records_the_crc32_of_each_tile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = str(tmp_path / "w.tdb")
    rng = np.random.default_rng(7)
    X = rng.standard_normal((9, 7)).astype("float32")
    X[3:6] = 0  # an all-zero row tile: no row, no checksum
    I = rng.integers(-5, 5, (6, 4)).astype("int64")
    np.save(tmp_path / "x.npy", X)
    coo = [(i, j, float(X[i, j])) for i, j in zip(*np.nonzero(X))]
    with tensordb.connect(root, workers=2) as con:
        con.load("A", A, tile=(4, 4), dims=["i", "j"])                    # numpy array
        con.load("B", B, dims=["j", "k"])
        con.load("N", str(tmp_path / "x.npy"), tile=(3, 7))                # .npy file
        con.sql("CREATE TABLE t AS SELECT * FROM (VALUES " +
                ", ".join(f"({i}, {j}, {v!r}::FLOAT)" for i, j, v in coo) + ") v(i, j, value)")
        con.load("Q", None, query="SELECT * FROM t", index=["i", "j"], shape=(9, 7),
                 tile=(3, 7))                                              # COO table
        con.load("D", None, query="SELECT * FROM range(12) r(a)", tile=(5, 1))  # dense table
        con.load("I", I, tile=(4, 4))
        con.execute("CREATE TENSOR Z (3, 4) INT32")                        # no tiles at all
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 2, k 1)")  # computed in place
        con.execute("E[i,j] = A[i,j] + 1")
        con.einsum("ij->ji", "I", into="IT")                              # Python API
        con.load("A", 2 * A, tile=(4, 4), replace=True, dims=["i", "j"])   # replace
        con.execute("CREATE OR REPLACE TENSOR B[j,k] AS B[j,k] * 3")            # replace by einsum
        expect = {
            "A": (2 * A, (4, 4)), "N": (X, (3, 7)), "Q": (X, (3, 7)),
            "D": (np.arange(12).reshape(12, 1).astype("int64"), (5, 1)), "I": (I, (4, 4)),
            "C": (A @ B, (4, 8)), "E": (A + 1, (8, 8)), "IT": (I.T, (4, 6)), "B": (B * 3, (8, 8)),
        }
        for name, (array, tile) in expect.items():
            got = con.tensor(name)
            np.testing.assert_array_equal(got, array)
            meta = con.store.meta(name)
            tile = meta.tile_shape
            rows = tile_rows(con, name)
            want = expected_tiles(got, tile)
            assert set(rows) == set(want), name
            for coords, (_, _, _, nnz, crc) in rows.items():
                assert (crc, nnz) == want[coords], (name, coords)
        assert tile_rows(con, "Z") == {}
        assert con.check() == [dict(tensor=None, tile=None, file=None, offset=None, problem="ok")]


def test_a_database_without_the_crc32_column_opens_and_works(tmp_path):
    """A catalog made before checksums (no crc32 column) opens read-only and for writing; its
    tiles are unverified, not bad; the column is added once, at the end; new tiles get one."""
    root = make_db(str(tmp_path / "old.tdb"))
    with duckdb.connect(os.path.join(root, "catalog.duckdb")) as d:
        d.execute("ALTER TABLE tensordb.tiles DROP COLUMN crc32")
    with tensordb.connect(root, read_only=True) as con:
        np.testing.assert_array_equal(con.tensor("A"), A)
        report = con.check()
        assert [r["tensor"] for r in report] == ["A", "B", None]
        assert all(r["problem"].startswith("unverified") and r["tile"] is None for r in report[:2])
        assert "4 of 4" in report[0]["problem"]
        assert report[-1]["problem"] == "ok"
    for _ in range(2):  # adding the column is idempotent
        with tensordb.connect(root) as con:
            cols = [r[0] for r in con.store.duck.execute(
                "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'tensordb' AND "
                "table_name = 'tiles'").fetchall()]
            assert cols[-1] == "crc32" and cols.count("crc32") == 1
            np.testing.assert_array_equal(con.tensor("A"), A)
            assert {v[4] for v in tile_rows(con, "A").values()} == {None}
    with tensordb.connect(root) as con:
        con.execute("C[i,k] = SUM(A[i,j] * B[j,k])")
        np.testing.assert_array_equal(con.tensor("C"), A @ B)
        [(_, _, _, nnz, crc)] = tile_rows(con, "C").values()
        assert crc == zlib.crc32(np.ascontiguousarray(A @ B).tobytes())
        report = con.check()
        assert [r["tensor"] for r in report] == ["A", "B", None]  # C is verified: no note
        assert report[-1]["problem"] == "ok"
    # Without a checksum the check still counts nonzeros: a zero turned nonzero is found.
    with open(payload(root, "B"), "r+b") as f:
        f.seek(2 * 8)  # B[0, 2] == 0
        f.write(np.float64(5).tobytes())
    with tensordb.connect(root, read_only=True) as con:
        bad = [r for r in con.check("B") if r["tile"] is not None]
        assert len(bad) == 1 and "nonzero count" in bad[0]["problem"]
        assert con.check("B")[-1]["problem"] != "ok"


# -- c. damaged payload files on every read path ------------------------------------------------

def _truncate(path):
    os.truncate(path, 100)


def _empty(path):
    os.truncate(path, 0)


def _directory(path):
    os.unlink(path)
    os.mkdir(path)


def _delete(path):
    os.unlink(path)


def _flip(path):
    """Four bytes of tile (1, 0) of A (bytes 256-383 of the file: tiles of 128 bytes) inverted,
    the file's size unchanged: only the checksum can tell."""
    with open(path, "r+b") as f:
        f.seek(300)
        data = f.read(4)
        f.seek(300)
        f.write(bytes(b ^ 0xFF for b in data))
    # Read as by a process that has not read the file yet (this one wrote it, and a change
    # within one tick of the file system's clock keeps its modification time).
    verify.forget_verified()


def _fifo(path):  # reading it would block forever
    os.unlink(path)
    os.mkfifo(path)


DAMAGE = {"truncated": (_truncate, tensordb.DataError, "truncated"),
          "empty": (_empty, tensordb.DataError, "truncated: it has 0 bytes"),
          "directory": (_directory, tensordb.OperationalError, "is a directory"),
          "deleted": (_delete, tensordb.OperationalError, "is missing"),
          "fifo": (_fifo, tensordb.OperationalError, "is a FIFO, not a regular file"),
          "flipped": (_flip, tensordb.DataError, "tile (1, 0) in its payload file")}

READS = {
    "tensor": lambda con, tmp: con.tensor("A"),
    "export_npy": lambda con, tmp: con.export("A", str(tmp / "a.npy")),
    "export_parquet": lambda con, tmp: con.export("A", str(tmp / "a.parquet")),
    "copy_to": lambda con, tmp: con.execute(f"COPY A TO '{tmp / 'a.csv'}'"),
    "sql_relation": lambda con, tmp: con.sql("SELECT * FROM A").fetchall(),
    "sql_statement": lambda con, tmp: con.execute("SELECT sum(value) FROM A").fetchall(),
    "einsum": lambda con, tmp: con.execute("C[i,k] = SUM(A[i,j] * B[j,k])"),
    "einsum_python": lambda con, tmp: con.einsum("ij,jk->ik", "A", "B", into="C"),
    "elementwise": lambda con, tmp: con.execute("C[i,j] = A[i,j] * 2"),
    "explain_analyze": lambda con, tmp: con.execute(
        "EXPLAIN ANALYZE C[i,k] = SUM(A[i,j] * B[j,k])"),
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("read", READS)
def test_a_damaged_payload_is_a_tensordb_error_on_every_path(tmp_path, damage, read):
    root = make_db(str(tmp_path / "w.tdb"))
    path = payload(root, "A")
    hurt, cls, words = DAMAGE[damage]
    hurt(path)
    before = snapshot(root)
    out = tmp_path / "out"
    out.mkdir()
    with tensordb.connect(root, workers=2) as con:
        with pytest.raises(tensordb.Error) as info:
            READS[read](con, out)
        err = info.value
        assert isinstance(err, cls), f"{type(err).__name__}: {err}"
        text = str(err)
        assert "'A'" in text and path in text and words in text, text
        assert "tile kernel failed" not in text and "Traceback" not in text, text
        assert not con.store.has("C")
        np.testing.assert_array_equal(con.tensor("B"), B)  # the other tensor still reads
    assert os.listdir(out) == []  # no partial export
    with tensordb.connect(root, read_only=True):
        pass
    after = snapshot(root)
    after.pop("catalog.duckdb.wal", None)
    before.pop("catalog.duckdb.wal", None)
    assert after.keys() == before.keys()
    assert {k: v for k, v in after.items() if k.startswith("tiles")} == \
        {k: v for k, v in before.items() if k.startswith("tiles")}


def test_a_reader_mapped_before_the_damage_still_reads_and_new_readers_fail(tmp_path):
    root = make_db(str(tmp_path / "w.tdb"))
    path = payload(root, "A")
    with tensordb.connect(root) as con:
        rel = con.sql("SELECT sum(value) FROM A")  # maps the file now: a snapshot
        os.unlink(path)
        assert rel.fetchall()[0][0] == A.sum()
        with pytest.raises(tensordb.OperationalError, match="is missing"):
            con.tensor("A")


# -- b. CHECK TENSOR / CHECK DATABASE -----------------------------------------------------------

def test_check_reports_every_bad_tile_and_orphan_and_changes_nothing(tmp_path):
    root = str(tmp_path / "w.tdb")
    with tensordb.connect(root) as con:
        con.load("A", A, tile=(4, 4), dims=["i", "j"])
        con.load("B", B, tile=(2, 8), dims=["j", "k"])
        con.load("C", A.T.copy(), tile=(8, 2))
        con.load("D", A, tile=(4, 8))
        con.load("E", -A, tile=(8, 8))
        con.load("F", A + 1, tile=(4, 8))
        assert con.check() == [dict(tensor=None, tile=None, file=None, offset=None, problem="ok")]
    a, b, c, d, e, f = (tile_rows(root, n) for n in "ABCDEF")
    # A: one bit flipped in tile (1, 0)
    with open(payload(root, "A"), "r+b") as fh:
        at = a[(1, 0)][1] + 37
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 0x10]))
    # B: cut inside its third tile: tiles 0, 1 fine, tile 2 and 3 short
    cut = b[(2, 0)][1] + 5
    os.truncate(payload(root, "B"), cut)
    # C: deleted; D: replaced by a directory; E: replaced by other bytes of the same length
    os.unlink(payload(root, "C"))
    _directory(payload(root, "D"))
    with open(payload(root, "E"), "r+b") as fh:
        size = len(fh.read())
        fh.seek(0)
        fh.write(np.random.default_rng(1).bytes(size))
    # orphans: a stray file and a stray directory in tiles/
    with open(os.path.join(root, "tiles", "999.bin"), "wb") as fh:
        fh.write(b"stray")
    os.mkdir(os.path.join(root, "tiles", "junk"))
    before = snapshot(root)

    def expect(name, rows, coords, problem):
        file, offset = rows[coords][0], rows[coords][1]
        return (name, coords, file, offset, problem)

    with tensordb.connect(root, read_only=True) as con:
        report = con.execute("CHECK DATABASE")
        assert report.columns == ["tensor", "tile", "file", "offset", "problem"]
        got = report.fetchall()
    size_b = cut
    want = [expect("A", a, (1, 0), "checksum mismatch"),
            *[expect("B", b, k, f"short file: {size_b} bytes") for k in [(2, 0), (3, 0)]],
            *[expect("C", c, k, "missing file") for k in sorted(c)],
            *[expect("D", d, k, "not a regular file (a directory)") for k in sorted(d)],
            expect("E", e, (0, 0), "checksum mismatch"),
            (None, None, "999.bin", None, "orphan file"),
            (None, None, "junk", None, "orphan file (a directory)")]
    assert len(got) == len(want), got
    for g, w in zip(got, want):
        assert g[:4] == w[:4] and g[4].startswith(w[4]), (g, w)
    assert "recorded crc32" in got[0][4]
    assert f"needs bytes {b[(2, 0)][1]} to {b[(2, 0)][1] + b[(2, 0)][2]}" in got[1][4]
    assert not any(r[4] == "ok" for r in got)
    assert snapshot(root) == before  # nothing changed, orphans included

    with tensordb.connect(root, read_only=True) as con:
        assert con.check("F") == [dict(tensor=None, tile=None, file=None, offset=None, problem="ok")]
        only_b = con.execute("CHECK TENSOR b").fetchall()  # names are case-insensitive
        assert [r[1] for r in only_b] == [(2, 0), (3, 0)]  # no orphans for one tensor
        with pytest.raises(tensordb.CatalogError, match="'nope' does not exist") as info:
            con.execute("CHECK TENSOR nope")
        assert "LINE 1: CHECK TENSOR nope" in str(info.value)
    assert snapshot(root) == before


def test_check_reports_catalog_rows_that_disagree(tmp_path):
    root = make_db(str(tmp_path / "w.tdb"))
    with duckdb.connect(os.path.join(root, "catalog.duckdb")) as db:
        db.execute("UPDATE tensordb.tensors SET tile_count = 7 WHERE name = 'A'")
        db.execute("INSERT INTO tensordb.tiles BY NAME SELECT * REPLACE (41 AS version) "
                   "FROM tensordb.tiles WHERE tensor = 'B'")
    with tensordb.connect(root, read_only=True) as con:
        got = con.check()
    assert [(r["tensor"], r["problem"].split(":")[0]) for r in got] == [("A", "catalog"),
                                                                         ("B", "catalog")]
    assert "tile_count is 7, tiles has 4" in got[0]["problem"]
    assert "version 41" in got[1]["problem"]


def test_check_streams_tiles_in_bounded_memory(tmp_path, monkeypatch):
    """One 32 MiB tile is read in chunks: a bit flipped in a late chunk is found, nonzeros are
    counted across chunks, and the check's own allocations stay far below the tile."""
    root = str(tmp_path / "w.tdb")
    big = np.random.default_rng(3).standard_normal((2048, 2048))
    big[:, ::3] = 0
    with tensordb.connect(root) as con:
        con.load("G", big, tile=big.shape)
    del big
    from tensordb.storage import integrity
    monkeypatch.setattr(integrity, "CHUNK", 1 << 20)
    with tensordb.connect(root, read_only=True) as con:
        tracemalloc.start()
        try:
            assert con.check("G")[-1]["problem"] == "ok"
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 4 << 20, peak
    [(_, offset, nbytes, _, _)] = tile_rows(root, "G").values()
    with open(payload(root, "G"), "r+b") as fh:
        fh.seek(offset + nbytes - 1000)
        byte = fh.read(1)[0]
        fh.seek(offset + nbytes - 1000)
        fh.write(bytes([byte ^ 1]))
    with tensordb.connect(root, read_only=True) as con:
        [row] = con.check("G")
    assert row["tile"] == (0, 0) and row["problem"].startswith("checksum mismatch")


def test_check_inside_a_block_and_a_tensor_named_check(tmp_path):
    root = make_db(str(tmp_path / "w.tdb"))
    with tensordb.connect(root) as con:
        con.execute("check[i,j] = A[i,j] + 1")  # CHECK is a keyword only before TENSOR/DATABASE
        np.testing.assert_array_equal(con.tensor("check"), A + 1)
        seen = []  # CHECK runs at COMMIT, inside the block's transaction, and sees X
        con.execute_script("BEGIN; X[i,j] = A[i,j] * 2; CHECK TENSOR X; COMMIT",
                           on_result=seen.append)
        assert [r.fetchall() for r in seen if r.kind == "rows"] == [[(None, None, None, None, "ok")]]
        rows = con.execute("CHECK /* every tensor */ DATABASE").fetchall()
        assert rows == [(None, None, None, None, "ok")]
        [(_, _, _, nnz, crc)] = tile_rows(con, "X").values()
        assert crc == zlib.crc32((2 * A).tobytes()) and nnz == 64


@pytest.mark.distributed
def test_a_damaged_payload_on_dask_workers_is_a_tensordb_error(tmp_path):
    """Dask worker processes map the payload files themselves: their errors reach the user as
    the same tensordb errors; results they compute get checksums too."""
    pytest.importorskip("distributed")
    from tensordb.exec.dask import local_cluster
    root = make_db(str(tmp_path / "w.tdb"))
    with tensordb.connect(root) as con:
        con.load("E", A + 1, dims=["i", "j"])
    damaged = {"A": "truncated", "E": "directory"}
    paths = {name: payload(root, name) for name in damaged}
    for name, damage in damaged.items():
        DAMAGE[damage][0](paths[name])
    with local_cluster(2, local_directory=str(tmp_path / "dask")) as cluster, \
            tensordb.connect(root, workers=2, executor=f"dask://{cluster.scheduler_address}") as con:
        for name, damage in damaged.items():
            _, cls, words = DAMAGE[damage]
            with pytest.raises(cls) as info:
                con.execute(f"C[i,k] = SUM({name}[i,j] * B[j,k])")
            text = str(info.value)
            assert f"'{name}'" in text and paths[name] in text and words in text, text
            assert not con.store.has("C")
        # Results computed on the workers are checksummed when the client records them.
        con.execute("F[j,k] = B[j,k] * 2")
        [(_, _, _, nnz, crc)] = tile_rows(con, "F").values()
        assert crc == zlib.crc32((2 * B).tobytes()) and nnz == np.count_nonzero(B)


# -- the checksum: zlib's values, from whichever implementation -------------------------------------

CHECKSUM_CASES = [np.zeros(0, np.float32), np.array(3.5), np.array([True, False]),
                  np.arange(1000, dtype=np.float16), np.arange(6, dtype=np.complex128).reshape(2, 3),
                  np.random.default_rng(1).standard_normal((300, 257)).astype(np.float32), b"",
                  b"tensordb" * 1001]


@pytest.mark.parametrize("fallback", [False, True], ids=["installed", "zlib fallback"])
def test_checksum_equals_zlib(fallback, monkeypatch):
    """``storage.checksum.crc32`` gives ``zlib.crc32``'s value for every dtype and size, with a
    running value too (the integrity check folds a tile in pieces), with ISA-L (where installed)
    and through the fallback that platforms without its wheel take."""
    from tensordb.storage import checksum
    if fallback:
        monkeypatch.setattr(checksum, "_fast_crc32", None)
    for data in CHECKSUM_CASES:
        assert checksum.crc32(data) == zlib.crc32(data)
        assert checksum.crc32(data, 12345) == zlib.crc32(data, 12345)
    big = CHECKSUM_CASES[5].reshape(-1).view(np.uint8)
    running = 0
    for lo in range(0, big.size, 4099):
        running = checksum.crc32(big[lo:lo + 4099], running)
    assert running == zlib.crc32(big)
    with pytest.raises(ValueError):  # a strided view is refused, as zlib refuses it
        checksum.crc32(np.arange(10.0)[::2])


def test_checksum_uses_isal_where_installed():
    """Where python-isal is installed (a dependency on x86-64 and ARM64), it computes the
    checksums; without it, zlib does."""
    import importlib.util
    from tensordb.storage import checksum
    installed = importlib.util.find_spec("isal") is not None
    assert checksum.IMPLEMENTATION == ("isal" if installed else "zlib")


GET_RID = {
    "drop": lambda con: con.execute("DROP TENSOR A"),
    "replace": lambda con: con.load("A", B, replace=True),
    "drop_in_a_block": lambda con: con.execute("BEGIN; DROP TENSOR A; DROP TENSOR B; COMMIT"),
}


@pytest.mark.parametrize("damage", ["fifo", "directory"])
@pytest.mark.parametrize("how", GET_RID)
def test_a_damaged_payload_can_be_dropped_or_replaced(tmp_path, damage, how):
    """Dropping or replacing the damaged tensor is how a user gets rid of it: the statement
    returns (a FIFO in the payload's place used to hang the file's removal), commits whole
    (a directory there used to raise after the COMMIT and leave the other tensors' files),
    and the database checks clean after it but for what it cannot remove (a directory)."""
    root = make_db(str(tmp_path / "w.tdb"))
    path = payload(root, "A")
    other = payload(root, "B")
    DAMAGE[damage][0](path)
    with tensordb.connect(root, workers=2) as con:
        GET_RID[how](con)
        names = sorted(m.name for m in con.store.list())
        if how == "replace":
            assert names == ["A", "B"]
            np.testing.assert_array_equal(con.tensor("A"), B)
        else:
            assert names == (["B"] if how == "drop" else [])
        assert not os.path.lexists(path) if damage == "fifo" else os.path.isdir(path)
        if how == "drop_in_a_block":
            assert not os.path.exists(other)
        problems = [r["problem"] for r in con.check()]
        if damage == "fifo":
            assert problems == ["ok"], problems
        else:  # the directory is never deleted, and CHECK says so
            assert len(problems) == 1 and "orphan file (a directory)" in problems[0] \
                and "never deletes a directory" in problems[0], problems
        assert all(os.path.isfile(p) for p in con.store.spares._files)  # no directory reused
