"""Passes over a whole tile that the executor makes besides the kernel's own.

A re-tiling (``exec.tasks.run_assemble``): a piece that fills the new tile whole is copied
without zeroing it first; anything less leaves zeros where no piece lands.

A stored tile's nonzero count (its catalog ``nnz``): ``storage.writer.count_nonzero``, the
fast count the executor takes of every output tile, against numpy's ``count_nonzero``, on the
values where a float's count is delicate (-0.0, NaN, inf, subnormals), on tiles larger than
its block, and on a real catalog after a statement ran. ``tile_stats``, the count, the NaN/inf flag
and the checksum of a finished tile in one sweep over its blocks, against numpy's count, numpy's
``isfinite`` and ``zlib.crc32``, with the special value in every position of a block."""
from __future__ import annotations

import contextlib
import zlib

import numpy as np
import pytest

import tensordb
from tensordb.exec.tasks import run_assemble
from tensordb.physical.plan import Assemble
from tensordb.storage import writer
from tensordb.storage.writer import count_nonzero, tile_stats


def _awkward(rng, shape, dtype):
    a = rng.normal(size=shape).astype(dtype)
    flat = a.reshape(-1)
    flat[rng.random(flat.size) < 0.4] = 0
    specials = [-0.0, np.nan, np.inf, -np.inf]
    if np.dtype(dtype).kind == "f":
        specials.append(np.finfo(dtype).smallest_subnormal)
    idx = rng.choice(flat.size, size=min(flat.size, len(specials) * 3), replace=False)
    for i, k in enumerate(idx):
        flat[k] = specials[i % len(specials)]
    return a


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("size", [0, 1, 1000, writer._NNZ_BLOCK, 3 * writer._NNZ_BLOCK + 7])
def test_a_float_count_is_numpys(dtype, size):
    a = _awkward(np.random.default_rng(size), (size,), dtype)
    assert count_nonzero(a) == np.count_nonzero(a)
    assert count_nonzero(-a) == np.count_nonzero(-a)  # -0.0 where a had +0.0


def test_complex_int_bool_and_strided_tiles_count_as_numpy_does():
    rng = np.random.default_rng(3)
    c = _awkward(rng, (700, 800), np.float32).astype(np.complex64)
    c.imag[::5] = 1.0  # a zero real part with a nonzero imaginary one is nonzero
    i = rng.integers(-2, 3, size=(700, 800)).astype(np.int32)
    f = _awkward(rng, (700, 800), np.float64)
    for a in (c, i, i != 0, f, f.T, f[::2, 3:], f[:, ::3]):
        assert count_nonzero(a) == np.count_nonzero(a)
    assert count_nonzero(np.zeros((700, 800), np.float32)) == 0
    assert count_nonzero(np.full((700, 800), -0.0, np.float32)) == 0


@contextlib.contextmanager
def _stored(path, seed: int, shape, names: str):
    """A database at ``path`` holding awkward float32 tensors of ``shape``, one per letter of
    ``names``: (connection, arrays)."""
    rng = np.random.default_rng(seed)
    arrays = [_awkward(rng, shape, np.float32) for _ in names]
    with tensordb.connect(path, workers=2) as con:
        for name, a in zip(names, arrays):
            con.load(name, a)
        yield con, arrays


def test_a_stored_result_records_numpys_count(tmp_path):
    """A computed tile larger than the count's block, with zeros, -0.0 and NaN in it: the
    catalog's nnz is numpy's count of numpy's result."""
    with _stored(tmp_path / "db", 4, (640, 512), "AB") as (con, (a, b)):
        con.execute("C[i,j] = A[i,j] * B[i,j] - 0.5 * A[i,j]")
        with np.errstate(all="ignore"):
            ref = a * b - np.float32(0.5) * a
        np.testing.assert_array_equal(con.tensor("C"), ref)
        assert ref.size > writer._NNZ_BLOCK
        assert con.store.meta("C").nnz == np.count_nonzero(ref)


def test_a_retiling_copies_its_pieces_and_zeros_only_what_no_piece_fills():
    rng = np.random.default_rng(5)
    src = rng.normal(size=(300, 200)).astype(np.float32)
    # one piece, the whole new tile: a column split of the producer tile (a strided view)
    whole = Assemble(1, (300, 100), "float32", ((0, ((0, 300), (100, 200)), ((0, 300), (0, 100))),))
    np.testing.assert_array_equal(run_assemble(whole, [src]), src[:, 100:])
    # one piece, part of the new tile; and two pieces with a gap between them
    part = Assemble(2, (300, 100), "float64", ((0, ((0, 300), (0, 60)), ((0, 300), (0, 60))),))
    ref = np.zeros((300, 100))
    ref[:, :60] = src[:, :60]
    got = run_assemble(part, [src])
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, ref)
    two = Assemble(3, (300, 100), "float32", ((0, ((0, 100), (0, 100)), ((0, 100), (0, 100))),
                                              (0, ((200, 300), (0, 100)), ((200, 300), (0, 100)))))
    ref = np.zeros((300, 100), np.float32)
    ref[:100], ref[200:] = src[:100, :100], src[200:, :100]
    for _ in range(3):  # fresh tiles from memory the earlier ones freed: still zeros in the gap
        np.testing.assert_array_equal(run_assemble(two, [src, src]), ref)


def _stats_oracle(a):
    return (int(np.count_nonzero(a)), not bool(np.isfinite(a).all()),
            zlib.crc32(np.ascontiguousarray(a)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("size", [0, 5, writer._STATS_BLOCK // 4, 3 * writer._STATS_BLOCK // 2 + 3])
def test_tile_stats_are_the_three_passes(dtype, size):
    """Count, NaN/inf flag and checksum in one sweep, against numpy and zlib: awkward values
    (-0.0, NaN, inf, subnormals), a finite tile, and a finite tile whose sum overflows."""
    a = _awkward(np.random.default_rng(size), (size,), dtype)
    assert tile_stats(a) == _stats_oracle(a)
    finite = np.nan_to_num(a, nan=1.0, posinf=2.0, neginf=-2.0)
    assert tile_stats(finite) == _stats_oracle(finite)
    if np.dtype(dtype).kind == "f" and size:
        big = np.full(size, np.finfo(dtype).max, dtype)  # all finite, the sum is not
        assert tile_stats(big) == _stats_oracle(big)


@pytest.mark.parametrize("where", ["first", "last", "boundary"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_tile_stats_find_one_nonfinite_anywhere(where, value):
    """One NaN or inf in a multi-block tile, in the first block, the last, or straddling the
    boundary between two blocks: flagged, whichever block holds it."""
    step = writer._STATS_BLOCK // 4
    a = np.ones(4 * step + 11, np.float32)
    at = {"first": 0, "last": a.size - 1, "boundary": 2 * step}[where]
    a[at] = value
    a[at - 1 if at else 1] = 0.0
    assert tile_stats(a) == _stats_oracle(a)
    assert tile_stats(a.reshape(-1, 1))[1]  # a 2-d contiguous tile too


def test_tile_stats_of_other_dtypes_and_layouts():
    rng = np.random.default_rng(5)
    i = rng.integers(-2, 3, size=(700, 800)).astype(np.int32)
    assert tile_stats(i) == _stats_oracle(i)
    assert tile_stats(i != 0) == _stats_oracle(i != 0)
    with pytest.raises(ValueError):  # as zlib: a strided view has no contiguous bytes
        tile_stats(np.ones((700, 800))[:, ::2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.int32, np.bool_])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_tile_stats_taken_slab_by_slab_are_the_whole_tiles(dtype, rows):
    """``TileStats`` fed a tile's slabs of rows in order (as a slabbed kernel hands them
    over) gives what ``tile_stats`` gives for the whole tile: numpy's count, the NaN/inf flag
    and zlib's checksum, whatever the slab size, with special values in any slab."""
    rng = np.random.default_rng(rows)
    a = _awkward(rng, (300, 257), np.float64)
    if np.dtype(dtype).kind == "f" or np.dtype(dtype).kind == "c":
        a = a.astype(dtype)
    else:
        a = np.nan_to_num(a, nan=0, posinf=3, neginf=-3).astype(dtype)
    stats = writer.TileStats()
    for lo in range(0, a.shape[0], rows):
        stats.add(a[lo:lo + rows])
    assert stats.nbytes == a.nbytes
    assert stats.result() == _stats_oracle(a) == tile_stats(a)


def test_a_slabbed_stored_output_records_the_sinks_statistics(tmp_path, monkeypatch):
    """An SGD-style update large enough to be computed in slabs, stored: its catalog rows
    (nnz, the NaN/inf flag, the checksum) are numpy's count, isfinite and zlib's CRC of
    numpy's result, taken from the slabs as the kernel wrote them. The pool's sweep over the
    finished tile is not made for it (a wrapper records each sweep of a tile over 1 MiB), and
    CHECK DATABASE agrees."""
    from tensordb.exec import fastrows, pool_run
    with _stored(tmp_path / "db", 6, (1024, 768), "WD") as (con, (w, d)):
        swept = []
        real = pool_run.tile_stats
        def sweep(a):
            if a.nbytes > 1 << 20:
                swept.append(a.shape)
            return real(a)
        monkeypatch.setattr(pool_run, "tile_stats", sweep)
        monkeypatch.setattr(fastrows, "tile_stats", sweep)  # a small plan's straight line
        con.execute("W2[f,h] = W[f,h] - 0.01 * D[f,h] WITH (PIECES f 2)")
        with np.errstate(all="ignore"):
            ref = w - np.float32(0.01) * d
        np.testing.assert_array_equal(con.tensor("W2"), ref)
        assert swept == []
        rows = con.store.duck.execute(
            'SELECT coords, nnz, nonfinite, crc32 FROM tensordb.tiles WHERE tensor = ? '
            'ORDER BY coords', ["W2"]).fetchall()
        assert len(rows) == 2
        for (i, _), nnz, nonfinite, crc in rows:
            tile = ref[i * 512:(i + 1) * 512]
            assert (nnz, nonfinite, crc) == _stats_oracle(tile)
        assert con.execute("CHECK DATABASE").fetchall()
