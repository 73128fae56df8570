"""The tile join's relations (physical/tilejoin.py), run by DuckDB on a real
catalog and checked against the stored array with NumPy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensordb
from tensordb.physical import tilejoin

TILE = (3, 5)


def _array():
    """A (12, 10) tensor on (3, 5) tiles: some tiles absent, one with an inf, one with a zero."""
    rng = np.random.default_rng(4)
    a = rng.uniform(1, 2, (12, 10))
    for ti, tj in [(0, 1), (2, 0), (3, 1)]:
        a[3 * ti:3 * ti + 3, 5 * tj:5 * tj + 5] = 0
    a[4, 2] = np.inf
    a[10, 1] = 0.0
    return a


def _tiles(a):
    """Per stored tile: its box, whether it holds no NaN/inf, and whether it holds no 0."""
    out = []
    for ti, tj in itertools.product(range(4), range(2)):
        box = ((3 * ti, 3 * ti + 3), (5 * tj, 5 * tj + 5))
        t = a[box[0][0]:box[0][1], box[1][0]:box[1][1]]
        if np.any(t != 0):
            out.append((box, bool(np.isfinite(t).all()), bool((t != 0).all())))
    return out


@pytest.mark.parametrize("bounds", [
    ((0, 4, 8, 12), (0, 2, 7, 10)),     # pieces across stored tiles
    ((0, 3, 6, 9, 12), (0, 5, 10)),     # the stored grid itself
    ((0, 12), (0, 10)),                 # one piece
])
def test_tiles_cut_to_grid_is_the_interval_join_of_present_tiles(bounds):
    a = _array()
    with tensordb.connect() as con:
        con.load("A", a, tile=TILE)
        meta = con.store.meta("A")
        sql = tilejoin.stored_pieces(meta.name, meta.version, meta.grid, bounds, ("i", "j"),
                                     con.store.nonfinite_column)
        got = {(p, q): (f, n) for p, q, f, n in con.store.query(*sql)}
    want = {}
    for p, q in itertools.product(range(len(bounds[0]) - 1), range(len(bounds[1]) - 1)):
        lo = (bounds[0][p], bounds[1][q])
        hi = (bounds[0][p + 1], bounds[1][q + 1])
        hits = [t for t in _tiles(a) if all(t[0][d][0] < hi[d] and t[0][d][1] > lo[d] for d in (0, 1))]
        if not hits:
            continue
        covered = np.zeros(a.shape, bool)  # elements inside a stored tile with no 0 and no inf
        for box, finite, nonzero in hits:
            if finite and nonzero:
                covered[box[0][0]:box[0][1], box[1][0]:box[1][1]] = True
        want[(p, q)] = (all(f for _, f, _ in hits), bool(covered[lo[0]:hi[0], lo[1]:hi[1]].all()))
    assert got == want


def test_a_repeated_key_keeps_the_diagonal_pieces():
    a = _array()[:10, :10]
    with tensordb.connect() as con:
        con.load("A", a, tile=(5, 5))
        bounds = ((0, 5, 10), (0, 5, 10))
        meta = con.store.meta("A")
        rows = con.store.query(*tilejoin.stored_pieces("A", meta.version, meta.grid, bounds, ("i", "i")))
        both = con.store.query(*tilejoin.stored_pieces("A", meta.version, meta.grid, bounds, ("i", "j")))
    assert sorted(r[:2] for r in rows) == sorted(r[:2] for r in both if r[0] == r[1])
    stored = [p for p in range(2) if a[5 * p:5 * p + 5, 5 * p:5 * p + 5].any()]
    assert sorted(r[:2] for r in rows) == [(p, p) for p in stored]


def test_coords_cut_to_grid_recuts_a_list_of_tiles():
    grid = ((0, 4, 8), (0, 3, 6, 9))
    present = [(0, 0), (1, 2)]
    bounds = ((0, 2, 8), (0, 9))
    with tensordb.connect() as con:
        con.store.query(tilejoin.coords_table("__t", present, 2))
        try:
            got = sorted(con.store.query(*tilejoin.made_pieces("__t", grid, bounds, ("a", "b"))))
            same = sorted(con.store.query(*tilejoin.made_pieces("__t", grid, grid, ("a", "b"))))
        finally:
            con.store.query(tilejoin.drop_coords_table("__t"))
    want = set()
    for c0, c1 in present:
        for p, q in itertools.product(range(len(bounds[0]) - 1), range(len(bounds[1]) - 1)):
            if grid[0][c0] < bounds[0][p + 1] and grid[0][c0 + 1] > bounds[0][p] and \
                    grid[1][c1] < bounds[1][q + 1] and grid[1][c1 + 1] > bounds[1][q]:
                want.add((p, q, False, False))
    assert got == sorted(want)
    assert same == sorted((c0, c1, False, False) for c0, c1 in present)


def test_open_many_reads_every_version_in_one_query_and_equals_open(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {"A": _array(), "B": rng.standard_normal((7, 4)), "C": np.zeros((6, 6))}
    with tensordb.connect(tmp_path / "db") as con:
        for name, a in arrays.items():
            con.load(name, a, tile=(3, 2))
    with tensordb.connect(tmp_path / "db") as con:  # cold caches
        readers = con.store.open_many(["A", "b", "C"])
        assert set(readers) == {"A", "b", "C"}
        for name, r in readers.items():
            one = con.store.open(name)
            assert r.meta == one.meta and r.entries == one.entries
            np.testing.assert_array_equal(r.to_numpy(), arrays[name.upper()])
        assert readers["C"].entries == {}  # all zeros: no tile stored
        with pytest.raises(tensordb.CatalogError, match="'D' does not exist"):
            con.store.open_many(["A", "D"])


def test_the_catalog_cache_follows_writes_and_drops(tmp_path):
    """Names are read from the whole catalog at once; later writes and drops stay exact."""
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", np.ones((2, 2)))
        assert con.store.has("a") and not con.store.has("Nope")  # the first lookup reads all
        con.load("Nope", np.full((3,), 2.0))                   # written after the full read
        assert con.store.meta("NOPE").shape == (3,)
        con.store.drop("A")
        assert not con.store.has("A")
        con.load("A", np.ones((4,)), replace=True)
        assert con.store.meta("A").shape == (4,)
        con.execute("B[i] = SUM(A[i] * Nope[j])")
        np.testing.assert_array_equal(con.tensor("B"), np.full((4,), 6.0))
    with tensordb.connect(tmp_path / "db") as con:
        assert [m.name for m in con.store.list()] == ["A", "B", "Nope"]
        assert con.store.has("b") and not con.store.has("C")
