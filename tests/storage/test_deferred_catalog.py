"""In memory, a replace keeps its catalog rows back until the catalog is next used
(storage/deferred.py): what SQL, the catalog and a failed statement then see, against numpy."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tensordb
from tensordb.storage import memfiles


class _Counting:
    """The store's DuckDB connection, its statements counted."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.statements: list[str] = []

    def execute(self, sql, *args, **kwargs):
        self.statements.append(sql)
        return self.conn.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def _catalog(con):
    rows = con.sql("SELECT name, version FROM tensordb.tensors ORDER BY name").fetchall()
    tiles = con.sql('SELECT tensor, version, file FROM tensordb.tiles ORDER BY tensor').fetchall()
    return rows, tiles


def test_steps_write_no_catalog_row_until_sql_looks(con):
    a = np.arange(6.0).reshape(2, 3)
    con.load("A", a)
    counting = _Counting(con.store._conn)
    con.store._conn = counting
    try:
        for _ in range(5):
            con.execute("A[i,j] = A[i,j] * 2 + 1")
            a = a * 2 + 1
        assert counting.statements == []  # five replaces, no DuckDB statement
        np.testing.assert_array_equal(con.tensor("A"), a)
        got = con.sql("SELECT i, j, value FROM A ORDER BY i, j").fetchall()
        assert [v for _, _, v in got] == a.ravel().tolist()
        # the five versions' rows were swapped in once: one transaction, one row swap
        assert counting.statements.count("BEGIN TRANSACTION") == 1
    finally:
        con.store._conn = counting.conn
    rows, tiles = _catalog(con)
    version = con.store.meta("A").version
    assert rows == [("A", version)]
    assert [(t, v) for t, v, _ in tiles] == [("A", version)]
    # a small output of an in-memory database: its payload is kept in memory, not in a file
    path = os.path.join(con.store.tiles_dir, tiles[0][2])
    assert memfiles.get(path) is not None and not os.path.exists(path)


def test_two_tensors_replaced_together_and_apart(con):
    w, g = np.linspace(-1, 1, 12).reshape(3, 4), np.arange(1.0, 13.0).reshape(3, 4)
    con.load("W", w)
    con.load("G", g)
    for step in range(3):
        con.execute("W[i,j] = W[i,j] - $lr * G[i,j]; G[i,j] = G[i,j] * 0.5",
                    {"lr": 0.1 * (step + 1)})
        w, g = w - 0.1 * (step + 1) * g, g * 0.5
        con.execute("W[i,j] = W[i,j] + 1")
        w = w + 1
    for name, want in (("W", w), ("G", g)):
        np.testing.assert_allclose(con.tensor(name), want, rtol=1e-15)
        got = con.sql(f"SELECT value FROM {name} ORDER BY i, j").fetchall()
        np.testing.assert_allclose([v for (v,) in got], want.ravel(), rtol=1e-15)
    rows, tiles = _catalog(con)
    assert rows == [("G", con.store.meta("G").version), ("W", con.store.meta("W").version)]
    assert sorted((t, v) for t, v, _ in tiles) == rows


def test_failed_statement_drops_the_kept_rows(con, snapshot):
    con.load("A", np.ones((2, 2)))
    con.execute("A[i,j] = A[i,j] + 1")  # landed, rows kept back
    before = con.tensor("A").copy()
    snap = snapshot(con)  # writes them: the catalog as it stands
    con.execute("A[i,j] = A[i,j] + 1")  # landed again, rows kept back
    before = con.tensor("A").copy()
    # one unit: the first statement's commit is kept in the unit's transaction, the second fails
    with pytest.raises(tensordb.Error):
        con.execute("A[i,j] = A[i,j] * 10; B[i] = A[i,j] * nope[j];")
    np.testing.assert_array_equal(con.tensor("A"), before)
    assert con.sql("SELECT max(value) FROM A").fetchall() == [(float(before.max()),)]
    tensors, tiles, _ = snapshot(con)
    assert [r[0] for r in tensors] == ["A"] and [r[0] for r in tiles] == ["A"]
    assert tensors[0][1] == con.store.meta("A").version != snap[0][0][1]
    referenced = {os.path.basename(r[5]) for r in tiles}
    on_disk = set(os.listdir(con.store.tiles_dir))
    in_memory = {os.path.basename(p) for p in memfiles.paths_under(con.store.tiles_dir)}
    assert referenced <= on_disk | in_memory
    assert in_memory <= referenced  # the failed statement's output was let go


def test_drop_and_create_after_kept_rows(con):
    con.load("A", np.ones(4))
    con.load("C", np.zeros(4))
    con.execute("A[i] = A[i] + 1")
    con.execute("DROP TENSOR A")
    assert con.sql("SELECT name FROM tensordb.tensors").fetchall() == [("C",)]
    assert con.sql("SELECT DISTINCT tensor FROM tensordb.tiles").fetchall() == []  # C is zeros
    con.execute("C[i] = C[i] + 3")
    con.load("A", np.full(4, 7.0))
    con.execute("C[i] = C[i] + A[i]")
    np.testing.assert_array_equal(con.tensor("C"), np.full(4, 10.0))
    assert con.sql("SELECT sum(value) FROM C").fetchall() == [(40.0,)]


def test_on_disk_rows_wait_in_the_redo_log(db_path):
    """On disk a replace's rows wait too, each commit durable as one record of the redo log
    (storage/redolog.py); the next use of the catalog writes them and empties the log."""
    from tensordb.storage import redolog
    log = os.path.join(db_path, redolog.LOG_FILE)
    with tensordb.connect(db_path) as con:
        con.load("A", np.arange(4.0))
        con.execute("A[i] = A[i] * 3")
        con.execute("A[i] = A[i] * 3")
        assert con.store._txn is None
        assert list(con.store._pending) == ["a"]
        records = redolog.read(log)[0]
        assert records and [len(r) for r in records] == [1] * len(records)
        assert records[-1][0][1] == con.store.meta("A")  # the newest version, as committed
        if len(records) == 2:  # each record replaces the version of the one before
            assert records[1][0][0].version == records[0][0][1].version
        assert con.sql("SELECT version FROM tensordb.tensors").fetchall() == \
            [(con.store.meta("A").version,)]
        assert con.store._pending == {} and os.path.getsize(log) == 0
        con.execute("A[i] = A[i] + 1")
    assert not os.path.exists(log)  # written to DuckDB at close, the empty log removed
    with tensordb.connect(db_path) as con:
        np.testing.assert_array_equal(con.tensor("A"), np.arange(4.0) * 9 + 1)


def test_digits_steps_match_numpy_and_write_no_row():
    """The natural-form training steps of tests/bench/bench_ml_steps.py (a slice per batch,
    MEAN, LOGSUMEXP, GRAD, the learning rate a parameter, ARGMAX for the accuracy) against
    numpy's steps by hand; in memory their commits run no DuckDB statement."""
    from tests.bench.bench_ml_steps import check, data, load, step_sql, LR
    x, y, _ = data()
    got = check(x, y, 3, 2)  # raises unless loss, weights and accuracy match numpy's
    assert set(got) == {"log", "mlp"} and all(r["err"] < 1e-10 for r in got.values())
    with tensordb.connect(None, workers=2) as con:
        load(con, x, y)
        con.execute(step_sql("mlp"), {"lr": LR})  # planned: reads the catalog
        counting = _Counting(con.store._conn)
        con.store._conn = counting
        try:
            for _ in range(3):
                con.execute(step_sql("mlp") * 2, {"lr": LR})
            assert counting.statements == []
        finally:
            con.store._conn = counting.conn
        rows = con.sql("SELECT name, version FROM tensordb.tensors ORDER BY name").fetchall()
        assert rows == sorted((m.name, m.version) for m in con.store.list())
        assert {n for n, _ in rows} == {"L", "W", "W1", "W2", "X", "Y"}


def test_a_relation_made_before_the_steps_reads_the_newest_rows(con):
    con.load("A", np.ones(3))
    tensors = con.sql("SELECT name, version FROM tensordb.tensors")
    total = con.sql("SELECT sum(value) FROM A")
    assert tensors.fetchall() == [("A", con.store.meta("A").version)]
    for k in range(3):
        con.execute("A[i] = A[i] * 2")
        assert tensors.fetchall() == [("A", con.store.meta("A").version)]
        assert total.fetchall() == [(3.0 * 2 ** (k + 1),)]

