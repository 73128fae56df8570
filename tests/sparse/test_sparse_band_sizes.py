"""The sizes of a large sparse call's row bands (exec/sparse_bands.py): the cumulative work per
row is read off the operands' row pointers where asked (``_Cumulative``), no per-row array made.
Its values equal a cumulative sum of the per-row work counted from the densified operands, its
bisection equals ``np.searchsorted`` on that sum, and calls banded by those sizes (not forced
ones) give the one call's answer bit for bit, numpy's on the densified operands."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.exec import sparse_bands
from tensordb.exec.sparse_bands import _Cumulative, _entries_before
from tensordb.storage.sparse import Filled, RowSlabs
from tests.sparse.test_sparse_interrupt import _bits, _cases, _method


def _matrix(rows, cols, density, seed):
    m = sp.random_array((rows, cols), density=density, rng=np.random.default_rng(seed),
                        format="csr", dtype=np.float64)
    m.data += 1.0  # no stored zero: the densified matrix's nonzeros are its entries
    return m


def _slabs(m, starts):
    """``m`` as a RowSlabs box of its rows ``[s, e)`` for each ``(s, e)`` (rows between them
    absent, as a box over stored row tiles with an absent tile)."""
    parts = tuple((s, sp.csr_array(m[s:e])) for s, e in starts)
    kept = sp.lil_array(m.shape)
    for s, p in parts:
        kept[s:s + p.shape[0]] = p
    return RowSlabs(m.shape, m.dtype, parts), sp.csr_array(kept)


def _oracle(dense_rows: list, per_entry: float, per_row: float) -> np.ndarray:
    work = np.count_nonzero(dense_rows[0], axis=1) * per_entry + per_row
    for d in dense_rows[1:]:
        work = work + np.count_nonzero(d, axis=1)
    return np.concatenate([[0.0], np.cumsum(work)])


@pytest.mark.parametrize("form", ["csr", "filled", "slabs"])
def test_cumulative_work_is_the_sum_of_the_rows_work(form):
    m = _matrix(300, 40, 0.07, 1)
    m = m.tolil()
    m[120:150, :] = 0  # empty rows
    m = sp.csr_array(m)
    m.eliminate_zeros()
    if form == "csr":
        a, kept = m, m
    elif form == "filled":
        a, kept = Filled(m, np.inf), m
    else:  # a gap before the first slab and between slabs, the last rows absent
        a, kept = _slabs(m, [(5, 100), (100, 170), (200, 290)])
    other = _matrix(300, 25, 0.1, 2)  # a second operand banded on its rows (a join's)
    dense = [kept.toarray(), other.toarray()]
    before = _entries_before(a)
    assert [before(r) for r in range(301)] == \
        np.concatenate([[0], np.cumsum(np.count_nonzero(dense[0], axis=1))]).tolist()
    for per_entry, per_row in [(1.0, 0.0), (2.5, 7.0), (64.0, 64.0)]:
        cw = _Cumulative(300, per_row, [(per_entry, before), (1.0, _entries_before(other))])
        want = _oracle(dense, per_entry, per_row)
        assert len(cw) == want.size
        np.testing.assert_allclose([cw[r] for r in range(301)], want, rtol=1e-12)
        rng = np.random.default_rng(3)
        for _ in range(200):
            r0 = int(rng.integers(0, 300))
            limit = want[r0] + float(rng.random()) * (want[-1] - want[r0] + 10)
            assert cw.last_within(r0, limit) == \
                int(np.searchsorted(want, limit, side="right")) - 1
        assert cw.last_within(0, want[-1]) == 300
        assert cw.last_within(17, want[17]) == int(np.searchsorted(want, want[17], "right")) - 1


@pytest.fixture
def sized(monkeypatch):
    """Every call over a few rows' work banded by the sizing rule (``FORCE_ROWS`` off), the
    band time so short that each band after the first is its smallest (``SMALL_WORK``)."""
    made = []
    rows = sparse_bands._rows

    def counted(a, ax, r0, r1):
        made.append((r0, r1))
        return rows(a, ax, r0, r1)
    monkeypatch.setattr(sparse_bands, "_rows", counted)
    monkeypatch.setattr(sparse_bands, "FORCE_ROWS", None)
    monkeypatch.setattr(sparse_bands, "BAND_SECONDS", 1e-9)

    def small(work):
        monkeypatch.setattr(sparse_bands, "SMALL_WORK", work)
    return made, small


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
@pytest.mark.parametrize("tile", [None, (16, 70)])
def test_sized_bands_equal_the_one_call_bit_for_bit(tmp_path, sized, dtype, tile):
    made, small = sized
    ops, cases = _cases(dtype)
    with tensordb.connect(tmp_path / "s.tdb", workers=2) as con:
        for name, a in ops.items():
            con.load(name, a, **({"tile": tile} if tile is not None and a.ndim == 2 and
                                 sp.issparse(a) else {}))
        for sql, method, expect in cases:
            assert _method(con, sql) == method, sql
            name = sql.split("[")[0].split(" ")[0]
            small(1 << 62)
            del made[:]
            con.execute(sql)
            assert not made, sql
            one = con.tensor(name)
            small(24)
            del made[:]
            con.execute(sql)
            banded = con.tensor(name)
            assert _bits(banded) == _bits(one), sql
            np.testing.assert_allclose(np.asarray(banded, np.float64),
                                       np.asarray(expect, np.float64), rtol=1e-5, err_msg=sql)
            if method in ("spmm", "sddmm", "spjoin", "masked"):
                assert len(made) > 1 and all(r1 > r0 for r0, r1 in made), sql  # banded


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_a_band_views_its_matrix_entries(fmt):
    """A band of a few rows (columns of a CSC matrix) shares the matrix's entry arrays: scipy's
    constructor would copy a view under half of its array (``prune``), a copy at every band."""
    m = _matrix(400, 300, 0.05, 4)
    m = m if fmt == "csr" else sp.csc_array(m)
    band = sparse_bands._major(m, 30, 60)
    assert np.shares_memory(band.data, m.data) and np.shares_memory(band.indices, m.indices)
    dense = m.toarray()
    want = dense[30:60] if fmt == "csr" else dense[:, 30:60]
    assert band.format == fmt and band.shape == want.shape
    np.testing.assert_array_equal(band.toarray(), want)
    x = np.arange(band.shape[1], dtype=np.float64)
    sliced = m[30:60] if fmt == "csr" else m[:, 30:60]  # scipy's own copy of the rows
    np.testing.assert_array_equal(band @ x, sliced @ x)
    np.testing.assert_allclose(band @ x, want @ x, rtol=1e-12)
