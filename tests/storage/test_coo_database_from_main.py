"""A database written by main before COO tiles could be written from their coordinates
(commit 9b6af80, tests/storage/data/main_9b6af80_coo.tar.gz: a 10^5-cubed rank-3 tensor T of
50 entries and a 2M x 2M hypersparse matrix G of 5 entries, both stored COO) opens, reads,
checks clean and takes new writes: the COO payload is the same bytes whichever way it is
written (``storage.sparse.encode_coo``)."""
from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

import tensordb
from tensordb.storage.sparse import encode, encode_coo

DATA = Path(__file__).parent / "data" / "main_9b6af80_coo.tar.gz"


def _want_t():
    ext = 10**5
    return {(r * 7919 % ext, r * 104729 % ext, r * 31 % ext): 1.0 + r for r in range(50)}


def test_a_database_written_by_main_opens_and_reads(tmp_path):
    with tarfile.open(DATA) as tar:
        tar.extractall(tmp_path, filter="data")
    with tensordb.connect(str(tmp_path / "db")) as con:
        got = {(a, b, c): v for a, b, c, v in con.execute("SELECT * FROM T").fetchall()}
        assert got == _want_t()
        g = con.sparse("G")
        assert g.shape == (2_000_000, 2_000_000)
        want_g = {(r * 7, r * 11): 2.0 * r - 3 for r in range(5)}
        assert dict(zip(zip(g.row.tolist(), g.col.tolist()), g.data.tolist())) == want_g
        assert all(r[-1] == "ok" for r in con.execute("CHECK DATABASE").fetchall())
        formats = {f for (f,) in con.execute("SELECT DISTINCT format FROM tensordb.tiles")
                   .fetchall()}
        assert formats == {"coo"}
        con.execute("S[a] = SUM(T[a,b,c])")
        con.execute("H[i,j] = G[i,j] * G[i,j]")
    with tensordb.connect(str(tmp_path / "db")) as con:  # reopened: old and new tensors
        sums: dict = {}
        for (a, _, _), v in _want_t().items():
            sums[a] = sums.get(a, 0.0) + v
        assert dict(con.execute("SELECT * FROM S").fetchall()) == sums
        assert sorted(con.execute("SELECT * FROM H").fetchall()) == \
            sorted((r * 7, r * 11, (2.0 * r - 3) ** 2) for r in range(5))


def test_a_coo_payload_is_the_same_from_coordinates_or_linear_ids():
    rng = np.random.default_rng(0)
    shape = (30, 40, 50)
    lin = np.sort(rng.choice(30 * 40 * 50, 200, replace=False))
    for dtype in ("float64", "float32", "int64", "int32", "bool"):
        v = (rng.integers(1, 9, 200)).astype(dtype)
        a = encode(shape, dtype, lin, v, "coo")
        b = encode_coo(shape, dtype, np.stack(np.unravel_index(lin, shape)), v)
        assert a.tobytes() == b.tobytes(), dtype
    assert encode((3, 4), "float64", np.zeros(0, np.int64), np.zeros(0), "coo").tobytes() == \
        encode_coo((3, 4), "float64", np.zeros((2, 0), np.int64), np.zeros(0)).tobytes()


def test_check_finds_a_coo_tile_out_of_order_past_int64_elements():
    from tensordb.storage.sparse import CooTile, validate
    shape = (10**7,) * 3  # 10^21 elements: no linear id
    good = CooTile(shape, np.array([[0, 5, 5], [9, 0, 0], [1, 2, 3]]), np.ones(3))
    assert validate(good, "T", (0, 0, 0)) == []
    swapped = CooTile(shape, np.array([[5, 0, 5], [0, 9, 0], [2, 1, 3]]), np.ones(3))
    repeated = CooTile(shape, np.array([[0, 0], [9, 9], [1, 1]]), np.ones(2))
    outside = CooTile(shape, np.array([[0], [9], [10**7]]), np.ones(1))
    for bad in (swapped, repeated):
        assert validate(bad, "T", (0, 0, 0)) == ["sparse tile: entries out of order or repeated"]
    assert validate(outside, "T", (0, 0, 0)) == ["sparse tile: a coordinate is outside the tile"]
