"""Several writers committed together (storage.writer.commit_all, catalog.store): a statement
storing several tensors swaps all their catalog rows in one transaction, with batched
statements where the replaced tensors keep their name and layout.

Real database directories under tmp_path. Oracles: the arrays written (read back through the
catalog), the catalog's rows read with DuckDB itself against the writers' own entries, and
CHECK DATABASE (every tile's checksum and count against its bytes, no orphan file).
"""
from __future__ import annotations

import numpy as np
import pytest

import tensordb
from tensordb.errors import CatalogError
from tensordb.storage.writer import commit_all

from tests.files import payload_files

RNG = np.random.default_rng(7)


def _write(store, name, a, tile, replace=True):
    w = store.writer(name, a.shape, a.dtype, tile, replace=replace)
    for coords, (lo, hi) in _tiles(a.shape, tile):
        w.write_tile(coords, a[tuple(slice(l, h) for l, h in zip(lo, hi))])
    return w


def _tiles(shape, tile):
    import itertools
    counts = [-(-n // t) for n, t in zip(shape, tile)]
    for coords in itertools.product(*[range(c) for c in counts]):
        lo = [c * t for c, t in zip(coords, tile)]
        hi = [min(l + t, n) for l, t, n in zip(lo, tile, shape)]
        yield coords, (lo, hi)


def _rows(con, name):
    """(version, coords, offset, nbytes, nnz, crc32) of the current version's tiles, by DuckDB."""
    return sorted(con.store.duck.execute(
        'SELECT t.version, t.coords, t."offset", t.nbytes, t.nnz, t.crc32 FROM tensordb.tiles t '
        "JOIN tensordb.tensors m ON m.name = t.tensor AND m.version = t.version "
        "WHERE m.name = ?", [name]).fetchall())


def _clean(con):
    assert [r["problem"] for r in con.check()] == ["ok"]
    referenced = {r[0] for r in con.store.duck.execute(
        "SELECT DISTINCT file FROM tensordb.tiles").fetchall()}
    assert set(payload_files(con.store)) == referenced


def test_replacements_new_tensors_and_empty_ones_land_together(tmp_path):
    """A batch of every kind: three replacements of the same layout (the batched statements),
    one with a new tiling, a new tensor, and an all-zero replacement (no tile rows)."""
    path = tmp_path / "db"
    arrays = {n: RNG.standard_normal((6, 5)).astype(np.float32) for n in ("A", "B", "C", "D", "Z")}
    with tensordb.connect(path) as con:
        for n, a in arrays.items():
            con.load(n, a, tile=(3, 5))
        new = {n: RNG.standard_normal((6, 5)).astype(np.float32) for n in ("A", "B", "C", "D", "E")}
        new["Z"] = np.zeros((6, 5), np.float32)
        tiles = {"A": (3, 5), "B": (3, 5), "C": (3, 5), "D": (2, 2), "E": (4, 4), "Z": (3, 5)}
        writers = [_write(con.store, n, new[n], tiles[n]) for n in new]
        metas = commit_all(writers)
        assert [m.name for m in metas] == list(new)
        for (n, a), w, m in zip(new.items(), writers, metas):
            np.testing.assert_array_equal(con.tensor(n), a)
            assert con.store.meta(n) == m
            want = sorted((m.version, list(e.coords), e.offset, e.nbytes, e.nnz, e.crc32)
                          for e in w.entries.values())
            assert _rows(con, n) == want
            assert m.nnz == np.count_nonzero(a)
        _clean(con)
    with tensordb.connect(path) as con:  # what the catalog holds, reopened
        for n, a in new.items():
            np.testing.assert_array_equal(con.tensor(n), a)
        _clean(con)


def test_a_failing_writer_leaves_every_tensor_as_it_was(tmp_path):
    """The third writer's name is a user table's: nothing of the batch lands, the first two
    tensors keep their old values and rows, and their new payload files are gone."""
    with tensordb.connect(tmp_path / "db") as con:
        old = {n: RNG.standard_normal((4, 4)) for n in ("A", "B")}
        for n, a in old.items():
            con.load(n, a, tile=(2, 4))
        before = {n: _rows(con, n) for n in old}
        files = payload_files(con.store)
        writers = [_write(con.store, n, RNG.standard_normal((4, 4)), (2, 4)) for n in old]
        writers.append(_write(con.store, "T", np.ones((2, 2)), (2, 2)))
        con.sql("CREATE TABLE t (x INT)")
        with pytest.raises(CatalogError, match="a table named 't' exists"):
            commit_all(writers)
        for n, a in old.items():
            np.testing.assert_array_equal(con.tensor(n), a)
            assert _rows(con, n) == before[n]
        assert not con.store.has("T")
        assert payload_files(con.store) == files
        _clean(con)


def test_two_writers_of_one_name_land_in_order(tmp_path):
    """Two writers of one name in one batch: the second replaces the first, as two commits in
    a row would, in one transaction."""
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", np.zeros((3, 3)), tile=(3, 3))
        first, second = np.full((3, 3), 1.0), np.full((3, 3), 2.0)
        w1 = _write(con.store, "A", first, (3, 3))
        w2 = _write(con.store, "a", second, (3, 3))
        commit_all([w1, w2])
        np.testing.assert_array_equal(con.tensor("A"), second)
        assert con.store.meta("A").version == w2.version
        _clean(con)


def test_a_training_step_stores_its_outputs_in_a_batch(tmp_path):
    """A script's outputs (the loss and both new weights of an SGD step, same layout each
    step) through the executor: each step's values are numpy's, and the catalog stays clean
    over steps that recycle payload files."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 8))
    w1, w2 = rng.standard_normal((8, 6)), rng.standard_normal((6, 3))
    step = ("LET H[b,h] = RELU(SUM(X[b,f] * W1[f,h])); LET Z[b,c] = SUM(H[b,h] * W2[h,c]); "
            "L = SUM(Z[b,c] * Z[b,c]) / 16; LET g1 = GRAD(L, W1); LET g2 = GRAD(L, W2); "
            "W1[f,h] = W1[f,h] - 0.01 * g1[f,h]; W2[h,c] = W2[h,c] - 0.01 * g2[h,c];")
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        con.load("X", x)
        con.load("W1", w1)
        con.load("W2", w2)
        for _ in range(4):
            pre = x @ w1
            h = np.maximum(pre, 0)
            z = h @ w2
            loss = np.sum(z * z) / 16
            dz = 2 * z / 16
            g2 = h.T @ dz
            g1 = x.T @ ((dz @ w2.T) * (pre > 0))
            w1, w2 = w1 - 0.01 * g1, w2 - 0.01 * g2
            con.execute(step)
            np.testing.assert_allclose(con.tensor("L"), loss, rtol=1e-12)
            np.testing.assert_allclose(con.tensor("W1"), w1, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(con.tensor("W2"), w2, rtol=1e-12, atol=1e-14)
        _clean(con)


def test_an_interrupt_after_the_commit_keeps_what_it_committed(tmp_path):
    """Ctrl-C that lands after DuckDB's COMMIT (here: while the replaced file is retired) must
    not make the writer delete a payload the catalog now references: the new value stays
    readable, now and after reopening, and CHECK DATABASE finds it whole."""
    path = tmp_path / "db"
    old, new = np.arange(12.0).reshape(3, 4), -np.arange(12.0).reshape(3, 4)
    with tensordb.connect(path) as con:
        con.load("A", old)

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt
        con.store.spares.retire = interrupted
        w = _write(con.store, "A", new, (3, 4))
        with pytest.raises(KeyboardInterrupt):
            commit_all([w])
        del con.store.spares.retire
        np.testing.assert_array_equal(con.tensor("A"), new)
        assert [r["problem"] for r in con.check("A")] == ["ok"]
    with tensordb.connect(path) as con:
        np.testing.assert_array_equal(con.tensor("A"), new)
        assert [r["problem"] for r in con.check()] == ["ok"]
