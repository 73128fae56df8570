"""A matrix loaded from a stream of scipy row slabs (formats/slabs.py): ``con.load(name, slabs,
shape=...)`` writes one band of tile rows at a time and commits once. Answers against the
matrix scipy stacks from the same slabs; errors leave nothing stored (the old tensor in place,
no payload file left); the slow test measures a child's anonymous memory against memory_limit
while it loads a graph many times the limit and runs its SpMM."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tests.harness import HAS_PROC, SampledChild

ROOT = Path(__file__).parents[2]


def matrix(rows=100, cols=37, density=0.1, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return sp.random_array((rows, cols), density=density, format="csr", dtype=dtype, rng=rng)


def cut(a, sizes):
    """``a``'s rows in slabs of ``sizes`` rows, as a generator."""
    r = 0
    for s in sizes:
        yield sp.csr_array(a[r:r + s])
        r += s


def tile_formats(con, name):
    return sorted({r[0] for r in con.execute(
        "SELECT coalesce(format, 'dense') FROM tensordb.tiles WHERE tensor = ?",
        [name]).fetchall()})


def payload_files(con):
    return sorted(os.listdir(con.store.tiles_dir))


@pytest.mark.parametrize("sizes, tile", [
    ([10, 25, 5, 60], (16, 37)),   # slabs across tile boundaries: bands stacked
    ([16] * 6 + [4], (16, 37)),    # slabs of the tile's height: written as they come
    ([50, 50], (16, 10)),          # column tiles cut from each band
    ([100], None),                 # the default tile, from the first slab's density
])
def test_stream_round_trips_against_scipy(sizes, tile):
    a = matrix()
    with tensordb.connect() as con:
        con.load("G", cut(a, sizes), shape=a.shape, tile=tile)
        np.testing.assert_array_equal(con.tensor("G"), a.toarray())
        assert (con.sparse("G") != a).nnz == 0
        d = con.describe("G")
        assert d["nnz"] == a.nnz and d["dtype"] == "float32"
        if tile is not None:
            assert d["tile_shape"] == tile
        assert tile_formats(con, "G") == ["csr"]
        assert con.check()[-1]["problem"] == "ok"
        # an SpMM over it, against scipy
        x = np.random.default_rng(1).random((a.shape[1], 3), dtype=np.float32)
        con.load("X", x)
        con.execute("Y[i,k] = SUM(G[i,j] * X[j,k]);")
        np.testing.assert_allclose(con.tensor("Y"), a @ x, rtol=1e-5)


def test_a_list_of_slabs_and_other_sparse_kinds_load():
    a = matrix(60, 20, 0.2, seed=3)
    with tensordb.connect() as con:
        parts = [a[:20].tocoo(), sp.csc_matrix(a[20:45]), sp.csr_matrix(a[45:])]
        con.load("G", parts, shape=a.shape, tile=(30, 20))
        np.testing.assert_array_equal(con.tensor("G"), a.toarray())


def test_stream_matches_loading_the_whole_matrix():
    a = matrix(300, 80, 0.05, seed=4)
    with tensordb.connect() as con:
        con.load("S", cut(a, [100, 100, 100]), shape=a.shape, tile=(64, 80))
        con.load("W", a, tile=(64, 80))
        assert con.describe("S")["bytes"] == con.describe("W")["bytes"]
        np.testing.assert_array_equal(con.tensor("S"), con.tensor("W"))


def test_int_slabs_widen_and_a_safe_cast_is_taken():
    a = sp.csr_array(np.array([[0, 2, 0], [1, 0, 0]], np.int16))
    b = sp.csr_array(np.array([[0, 0, 3]], np.int8))
    with tensordb.connect() as con:
        con.load("G", iter([a, b]), shape=(3, 3))
        got = con.tensor("G")
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.vstack([a.toarray(), b.toarray()]))


def test_zeros_in_a_slab_are_left_out_and_negative_zero_kept():
    data = np.array([1.0, 0.0, -0.0, 2.0, 0.0], np.float64)
    a = sp.csr_array((data, np.array([0, 1, 2, 0, 2]), np.array([0, 3, 5])), shape=(2, 64))
    with tensordb.connect() as con:
        con.load("G", iter([a]), shape=(2, 64))
        got = con.tensor("G")
        np.testing.assert_array_equal(got, a.toarray())
        assert np.signbit(got[0, 2]) and not np.signbit(got[0, 1])
        d = con.describe("G")
        assert d["nnz"] == 2 and tile_formats(con, "G") == ["csr"]
        # 3 stored entries (the -0.0 too): a payload of 3 values and 3 column indices
        from tensordb.sparsity import sparse_nbytes
        assert d["bytes"] == sparse_nbytes((2, 64), 3, np.float64, "csr")


def test_repeated_columns_are_summed_or_refused():
    a = sp.csr_array((np.array([1.0, 2.0, 5.0]), np.array([1, 1, 0]), np.array([0, 2, 3])),
                     shape=(2, 3))
    assert not a.has_canonical_format
    with tensordb.connect() as con:
        con.load("G", iter([a]), shape=(2, 3))
        np.testing.assert_array_equal(con.tensor("G"), [[0, 3, 0], [5, 0, 0]])
        with pytest.raises(tensordb.DataError,
                           match=r"coordinate \(i=0, j=1\) appears more than once"):
            con.load("H", iter([a]), shape=(2, 3), duplicates="error")
        assert not con.store.has("H")


def test_fill_value_is_kept():
    a = sp.csr_array(np.array([[0, 2.0], [1.0, 0]]))
    with tensordb.connect() as con:
        con.load("D", iter([a]), shape=(2, 2), fill_value=float("inf"))
        got = con.tensor("D")
        np.testing.assert_array_equal(got, [[np.inf, 2.0], [1.0, np.inf]])
        assert con.describe("D")["fill"] == float("inf")


def _fails(con, exc, match, slabs, **kw):
    before = payload_files(con)
    with pytest.raises(exc, match=match):
        con.load("G", slabs, replace=True, **kw)
    assert payload_files(con) == before  # no payload file left behind


def test_errors_change_nothing():
    a = matrix(40, 10, 0.3, seed=5)
    old = np.arange(6.0).reshape(2, 3)
    with tensordb.connect() as con:
        con.load("G", old)
        bad_col = sp.csr_array((np.array([1.0], np.float32), np.array([12]), np.array([0, 1, 1])),
                               shape=(2, 10))
        neg_col = sp.csr_array((np.array([1.0, 1.0], np.float32), np.array([3, -1]),
                                np.array([0, 1, 2])), shape=(2, 10))
        cases = [
            (tensordb.DataError, r"the slabs hold 30 rows; shape \(40, 10\) says 40",
             cut(a, [10, 20]), {"shape": (40, 10), "tile": (8, 10)}),
            (tensordb.DataError, r"slab 2 \(rows 30 to 44\) goes past the 40 rows",
             cut(matrix(50, 10, 0.3), [10, 20, 15]), {"shape": (40, 10), "tile": (8, 10)}),
            (tensordb.DataError, r"slab 1 \(from row 20\) has shape \(20, 9\)",
             iter([a[:20], matrix(20, 9)]), {"shape": (40, 10)}),
            (tensordb.DataError, r"coordinate \(i=20, j=12\) is outside shape \(40, 10\)",
             iter([a[:20], bad_col, a[22:]]), {"shape": (40, 10), "tile": (8, 10)}),
            (tensordb.DataError, r"coordinate \(r=21, c=-1\) is outside",
             iter([a[:20], neg_col, a[22:]]), {"shape": (40, 10), "dims": ["r", "c"]}),
            (tensordb.DataError, r"slab 1 \(from row 20\) is a ndarray, not a scipy.sparse",
             iter([a[:20], a[20:].toarray()]), {"shape": (40, 10)}),
            (tensordb.DataError, r"slab 1 \(from row 20\) holds float64 values; the first "
             r"slab's make the tensor float32",
             iter([a[:20], a[20:].astype(np.float64)]), {"shape": (40, 10)}),
            (tensordb.ProgrammingError, r"needs shape=\(rows, columns\)", cut(a, [40]), {}),
            (tensordb.ProgrammingError, r"takes shape=, tile=, dims=", cut(a, [40]),
             {"shape": (40, 10), "index": ["i", "j"]}),
            (tensordb.OutOfMemoryError, r"more than the memory_limit", cut(a, [40]),
             {"shape": (40, 10), "memory_limit": 100}),
        ]
        for exc, match, slabs, kw in cases:
            if "memory_limit" in kw:  # a connection's limit, not a load option
                from tensordb.formats.slabs import load_slabs
                before = payload_files(con)
                with pytest.raises(exc, match=match):
                    load_slabs(con.store, "G", slabs, shape=kw["shape"], replace=True,
                               memory_limit=kw["memory_limit"])
                assert payload_files(con) == before
            else:
                _fails(con, exc, match, slabs, **kw)
            np.testing.assert_array_equal(con.tensor("G"), old)


def test_an_error_inside_the_generator_leaves_the_old_tensor():
    a = matrix(40, 10, 0.3, seed=6)

    def slabs():
        yield a[:16]
        yield a[16:32]
        raise RuntimeError("the source went away")

    with tensordb.connect() as con:
        con.load("G", a)
        before = payload_files(con)
        with pytest.raises(RuntimeError, match="the source went away"):
            con.load("G", slabs(), shape=a.shape, tile=(8, 10), replace=True)
        assert payload_files(con) == before
        np.testing.assert_array_equal(con.tensor("G"), a.toarray())
        assert con.check()[-1]["problem"] == "ok"


def test_an_empty_stream_of_an_empty_matrix():
    with tensordb.connect() as con:
        con.load("E", iter([]), shape=(0, 5))
        assert con.tensor("E").shape == (0, 5)
        with pytest.raises(tensordb.DataError, match="the slabs hold 0 rows"):
            con.load("F", iter([]), shape=(3, 5))
        assert not con.store.has("F")


# -- memory: a graph many times the limit, loaded and multiplied under it ---------------------

@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="samples /proc/<pid>/status (Linux)")
def test_streamed_load_and_spmm_keep_the_memory_limit(tmp_path):
    from tests.sparse.stream_child import slab, x_matrix
    limit = 64 << 20
    n, per_row, tile_rows, slab_rows = 1 << 18, 96, 8192, 4096  # 25M entries: ~200 MiB of CSR
    db = tmp_path / "g.tdb"
    argv = [sys.executable, "-m", "tests.sparse.stream_child", str(db), str(limit), str(n),
            str(per_row), str(tile_rows), str(slab_rows)]
    child = SampledChild(argv, "load")
    out = child.finish(timeout=600)
    assert out["bytes"] > 2.5 * limit  # the matrix is far larger than the limit
    assert child.grew <= 1.25 * limit, (child.grew, limit)
    with tensordb.connect(db) as con:
        con.load("X", x_matrix(n), tile=(n, 4), dims=["j", "k"])
    child = SampledChild(argv, "spmm")
    out = child.finish(timeout=600)
    assert not out["over_budget"]
    assert child.grew <= 1.25 * limit, (child.grew, limit)
    x = x_matrix(n).astype(np.float64)
    with tensordb.connect(db, read_only=True) as con:
        assert con.describe("G")["nnz"] > 0
        y = con.store.open("Y")
        for s in (0, n // slab_rows // 2, n // slab_rows - 1):
            want = slab(s, slab_rows, n, per_row).astype(np.float64) @ x
            got = y.read_box((s * slab_rows, 0), ((s + 1) * slab_rows, 4))
            np.testing.assert_allclose(got, want, rtol=1e-5)
