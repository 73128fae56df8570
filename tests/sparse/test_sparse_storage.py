"""Sparse tiles in storage: the format rule, payloads, the catalog's format column, every read
path densifying exactly (``-0.0`` and NaN kept), relations yielding only nonzeros, CHECK over
sparse payloads, and an older catalog without the column."""
from __future__ import annotations

import os
import zlib

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb.sparsity import choose_format, index_dtype, sparse_nbytes, sparse_tile_shape
from tensordb.storage.sparse import CooTile, decode, densify, encode, encode_dense, validate


def random_sparse(shape, nnz, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    a = np.zeros(shape, dtype)
    lin = rng.choice(a.size, size=min(nnz, a.size), replace=False)
    if np.dtype(dtype).kind == "b":
        a.reshape(-1)[lin] = True
    else:
        a.reshape(-1)[lin] = (rng.integers(1, 100, lin.size) * rng.choice([-1, 1], lin.size)
                              ).astype(dtype)
    return a


def formats(con, name):
    return sorted(r[0] for r in con.execute(
        "SELECT coalesce(format, 'dense') FROM tensordb.tiles WHERE tensor = ?", [name]).fetchall())


# -- the rule and the payload ---------------------------------------------------------------------
def test_the_rule_is_byte_counting():
    for shape in [(100, 100), (7, 3000), (5, 6, 7), (1000,)]:
        for dtype in ["float32", "float64", "int32", "bool"]:
            size = int(np.prod(shape)) * np.dtype(dtype).itemsize
            for nse in [0, 1, 10, 100, 1000, 3000]:
                nse = min(nse, int(np.prod(shape)))
                fmt = choose_format(shape, nse, dtype)
                guess = "coo"  # a matrix is CSR unless COO is half its bytes (hypersparse)
                if len(shape) == 2 and sparse_nbytes(shape, nse, dtype, "csr") <= \
                        2 * sparse_nbytes(shape, nse, dtype, "coo"):
                    guess = "csr"
                sparse = sparse_nbytes(shape, nse, dtype, guess)
                assert fmt == (guess if sparse < size / 2 else "dense")
    assert choose_format((), 0, "float64") == "dense"
    assert index_dtype((10, 10), 5) == np.int32 and index_dtype((1 << 31, 2), 5) == np.int64


@pytest.mark.parametrize("shape", [(40, 30), (1, 50), (50, 1), (9, 8, 7), (300,), (3, 4, 5, 6)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_encode_decode_round_trip(shape, dtype):
    a = random_sparse(shape, max(1, int(np.prod(shape)) // 20), dtype, seed=len(shape))
    fmt = "csr" if len(shape) == 2 else "coo"
    payload = encode_dense(a, fmt)
    assert payload.nbytes == sparse_nbytes(shape, np.count_nonzero(a), dtype, fmt)
    tile = decode(payload, 0, payload.nbytes, shape, dtype, fmt)
    assert validate(tile, "A", ()) == []
    back = densify(tile)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, a)


def test_decode_refuses_a_payload_whose_count_does_not_fit():
    a = random_sparse((20, 20), 10)
    payload = encode_dense(a, "csr").copy()
    payload[:8].view(np.int64)[0] = 11
    with pytest.raises(tensordb.DataError, match="11 entries"):
        decode(payload, 0, payload.nbytes, (20, 20), "float64", "csr", "A")


def test_sparse_tile_shape_is_sized_by_nonzeros():
    assert sparse_tile_shape((1_000_000, 1_000_000), 10_000_000, "float32") == (200_000, 1_000_000)
    assert sparse_tile_shape((50, 60, 70), 3, "float32") == (50, 60, 70)
    assert sparse_tile_shape((0, 5), 0, "float64") == (1, 5)


# -- stored tensors -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_a_sparse_array_is_stored_sparse_and_reads_back_on_every_path(tmp_path, dtype):
    a = random_sparse((200, 150), 300, dtype)
    c = random_sparse((30, 20, 10), 40, dtype, seed=3)
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("A", a, tile=(64, 150))
        con.load("C", c)
        assert set(formats(con, "A")) == {"csr"} and formats(con, "C") == ["coo"]
        meta = con.describe("A")
        assert meta["nnz"] == np.count_nonzero(a)
        assert meta["bytes"] < a.nbytes / 2
        np.testing.assert_array_equal(con.tensor("A"), a)
        np.testing.assert_array_equal(con.tensor("C"), c)
        # the relation: nonzeros only, with their coordinates
        rows = con.execute("SELECT i, j, value FROM A ORDER BY i, j").fetchall()
        nz = np.nonzero(a)
        assert rows == [(int(i), int(j), a[i, j].item()) for i, j in zip(*nz)]
        assert con.execute("SELECT count(*) FROM C").fetchall()[0][0] == np.count_nonzero(c)
        # exports
        con.export("A", str(tmp_path / "a.npy"))
        np.testing.assert_array_equal(np.load(str(tmp_path / "a.npy")), a)
        con.export("C", str(tmp_path / "c.parquet"))
        con.load("C2", str(tmp_path / "c.parquet"))
        np.testing.assert_array_equal(con.tensor("C2"), c)
        assert con.check()[-1]["problem"] == "ok"
    with tensordb.connect(str(tmp_path / "db"), read_only=True) as con:
        np.testing.assert_array_equal(con.tensor("A"), a)


def test_negative_zero_and_nonfinite_values_survive_sparse_tiles(tmp_path):
    a = np.zeros((100, 100))
    a[1, 1], a[2, 2], a[3, 3], a[4, 4] = -0.0, np.nan, np.inf, -2.5
    with tensordb.connect() as con:
        con.load("A", a)
        con.export("A", str(tmp_path / "a.npy"))  # entries written into the file's zeros
        back = np.load(str(tmp_path / "a.npy"))
        np.testing.assert_array_equal(back, a)
        assert np.signbit(back[1, 1])
    with tensordb.connect() as con:
        con.load("A", a)
        assert formats(con, "A") == ["coo"]  # 4 entries in 100 rows: COO, a sixth of CSR's bytes
        back = con.tensor("A")
        np.testing.assert_array_equal(back, a)
        assert np.signbit(back[1, 1]) and not np.signbit(back[0, 0])
        row = con.execute("SELECT nnz, nonfinite FROM tensordb.tiles WHERE tensor = 'A'").fetchall()
        assert row == [(3, True)]
        # a query reading it computes numpy's answer (the tile densified on its way in)
        con.execute("B[i,j] = 1 / A[i,j]")
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(con.tensor("B"), 1 / a)


def test_the_crc32_is_of_the_sparse_payload_and_check_finds_damage(tmp_path):
    a = random_sparse((120, 80), 300)  # more entries than rows in each tile: CSR
    root = str(tmp_path / "db")
    with tensordb.connect(root) as con:
        con.load("A", a, tile=(60, 80))
        rows = con.execute('SELECT file, "offset", nbytes, crc32, format FROM tensordb.tiles '
                           "WHERE tensor = 'A' ORDER BY \"offset\"").fetchall()
    path = os.path.join(root, "tiles", rows[0][0])
    data = open(path, "rb").read()
    for _, off, nb, crc, fmt in rows:
        assert fmt == "csr" and zlib.crc32(data[off:off + nb]) == crc
    _, off, nb, _, _ = rows[1]
    with open(path, "r+b") as f:  # a column index of the second tile pushed out of range
        f.seek(off + nb - 4)
        f.write(np.int32(5000).tobytes())
    with tensordb.connect(root, read_only=True) as con:
        bad = [r for r in con.check("A") if r["tile"] is not None]
        assert [r["tile"] for r in bad] == [(1, 0)] and "checksum" in bad[0]["problem"]
    with duckdb.connect(os.path.join(root, "catalog.duckdb")) as d:  # forget the checksum
        d.execute("UPDATE tensordb.tiles SET crc32 = NULL")
    with tensordb.connect(root, read_only=True) as con:
        bad = [r for r in con.check("A") if r["tile"] is not None]
        assert [r["tile"] for r in bad] == [(1, 0)] and "outside" in bad[0]["problem"]


def test_a_database_without_the_format_column_opens_and_works(tmp_path):
    root = str(tmp_path / "old.tdb")
    dense = np.arange(12.0).reshape(3, 4)
    with tensordb.connect(root) as con:
        con.load("D", dense)
    with duckdb.connect(os.path.join(root, "catalog.duckdb")) as d:
        d.execute("ALTER TABLE tensordb.tiles DROP COLUMN format")
    with tensordb.connect(root, read_only=True) as con:
        np.testing.assert_array_equal(con.tensor("D"), dense)
    with tensordb.connect(root) as con:
        np.testing.assert_array_equal(con.tensor("D"), dense)
        a = random_sparse((100, 100), 200)
        con.load("A", a)
        assert formats(con, "A") == ["csr"] and formats(con, "D") == ["dense"]
        np.testing.assert_array_equal(con.tensor("A"), a)


@pytest.mark.parametrize("shape, tile", [((60, 50), (25, 50)), ((60, 50), (60, 50)),
                                         ((12, 10, 9), (5, 10, 9))])
def test_a_box_of_sparse_tiles_reads_exactly(shape, tile):
    """read_box of any box (the engine's loads of pieces that cut tiles, a result's preview)
    makes only the box dense: checked against the array, boxes at random."""
    a = random_sparse(shape, 40, "float64", seed=9)
    a.reshape(-1)[7] = -0.0 if a.reshape(-1)[7] == 0 else a.reshape(-1)[7]
    rng = np.random.default_rng(0)
    with tensordb.connect() as con:
        con.load("A", a, tile=tile)
        assert set(formats(con, "A")) <= {"csr", "coo"}
        reader = con.store.open("A")
        for _ in range(40):
            lo = [int(rng.integers(0, n)) for n in shape]
            hi = [int(rng.integers(l + 1, n + 1)) for l, n in zip(lo, shape)]
            got = reader.read_box(lo, hi)
            want = a[tuple(slice(l, h) for l, h in zip(lo, hi))]
            if got is None:  # no stored tile overlaps the box
                assert not want.any()
                continue
            np.testing.assert_array_equal(got, want)
            assert np.array_equal(np.signbit(got), np.signbit(want))
