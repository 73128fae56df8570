"""Tensors in plain SQL: one column per dimension plus value, one row per nonzero element."""
from __future__ import annotations

import numpy as np
import pytest

import tensordb


@pytest.fixture
def a():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 40)).astype("float32")
    x[:, 10:30] = 0  # whole absent tiles with tile=(16, 10)
    return x


def test_select_where_matches_numpy(con, a):
    con.load("A", a, dims=["i", "j"], tile=(16, 10))
    rows = con.sql("SELECT i, j, value FROM A WHERE value > 0").fetchall()
    i, j = np.nonzero(a > 0)
    assert sorted((int(r[0]), int(r[1])) for r in rows) == sorted(zip(i.tolist(), j.tolist()))
    assert all(a[r[0], r[1]] == r[2] for r in rows)
    assert con.sql("SELECT count(*) FROM a").fetchall() == [(np.count_nonzero(a),)]
    types = dict(zip(*[con.sql("SELECT * FROM A").columns, map(str, con.sql("SELECT * FROM A").types)]))
    assert types == {"i": "BIGINT", "j": "BIGINT", "value": "FLOAT"}


def test_default_dims_and_dtypes(con):
    con.load("B", np.array([[0, 5], [7, 0]], "int64"))
    assert con.sql("SELECT i, j, value FROM B ORDER BY i").fetchall() == [(0, 1, 5), (1, 0, 7)]
    con.load("V", np.arange(4, dtype="int32"), dims=["k"])
    assert con.sql('SELECT sum(value) FROM "V"').fetchall() == [(6,)]
    con.load("S", np.array(2.5))
    assert con.sql("SELECT * FROM S").fetchall() == [(2.5,)]


def test_join_with_ordinary_table(con, a):
    con.load("A", a, dims=["i", "j"], tile=(16, 10))
    con.sql("CREATE TABLE weights (i BIGINT, w DOUBLE)")
    con.sql("INSERT INTO weights SELECT range, range * 0.5 FROM range(50)")
    got = con.sql("SELECT A.i, sum(A.value * weights.w) AS s FROM A JOIN weights ON A.i = weights.i "
                  "GROUP BY A.i ORDER BY A.i").fetchall()
    want = (a.astype(np.float64) * (np.arange(50) * 0.5)[:, None]).sum(axis=1)
    nonzero_rows = [k for k in range(50) if np.any(a[k])]
    assert [r[0] for r in got] == nonzero_rows
    np.testing.assert_allclose([r[1] for r in got], want[nonzero_rows], rtol=1e-5)


def test_relation_reruns_and_chains(con, a):
    con.load("A", a, dims=["i", "j"])
    rel = con.sql("SELECT i, value FROM A")
    n = np.count_nonzero(a)
    assert len(rel.fetchall()) == n and len(rel.fetchall()) == n  # rescannable
    assert len(rel.filter("i < 10").fetchall()) == np.count_nonzero(a[:10])
    assert rel.fetchnumpy()["value"].dtype == np.float32


def test_tensor_and_table_in_one_query(con):
    con.load("M", np.eye(3, dtype="float64"), dims=["r", "c"])
    con.sql("CREATE TABLE names AS SELECT * FROM (VALUES (0, 'a'), (1, 'b'), (2, 'c')) t(r, label)")
    got = con.sql("SELECT label, value FROM M NATURAL JOIN names ORDER BY label").fetchall()
    assert got == [("a", 1.0), ("b", 1.0), ("c", 1.0)]


def test_names_in_strings_and_comments_are_not_tensors(con):
    con.load("A", np.ones(2))
    assert con.sql("SELECT 'A' AS x -- A\n").fetchall() == [("A",)]


def test_replace_and_drop_seen_by_sql(con):
    con.load("A", np.ones(3), dims=["i"])
    assert con.sql("SELECT sum(value) FROM A").fetchall() == [(3.0,)]
    con.load("A", np.full(2, 5.0), dims=["i"], replace=True)
    assert con.sql("SELECT sum(value) FROM A").fetchall() == [(10.0,)]
    con.drop("A")
    with pytest.raises(tensordb.CatalogError):
        con.sql("SELECT * FROM A").fetchall()
    con.sql("CREATE TABLE A AS SELECT 1 AS x")  # the name is free again, for a table
    assert con.sql("SELECT x FROM A").fetchall() == [(1,)]


def test_sql_errors_are_tensordb_errors(con):
    con.load("A", np.ones(2))
    with pytest.raises(tensordb.ParserError):
        con.sql("SELEC 1")
    with pytest.raises(tensordb.BinderError):
        con.sql("SELECT nope FROM A")
    rel = con.sql("SELECT 'x'::INTEGER")
    with pytest.raises(tensordb.DataError):
        rel.fetchall()


def test_sql_on_reopened_database(db_path):
    with tensordb.connect(db_path) as c:
        c.load("A", np.arange(1, 5, dtype="int32"), dims=["k"])
    with tensordb.connect(db_path, read_only=True) as c:
        assert c.sql("SELECT sum(value) FROM A").fetchall() == [(10,)]


def test_table_cannot_take_a_tensor_name(con):
    con.load("A", np.ones(2))
    for stmt in ("CREATE TABLE a AS SELECT 1 AS x", 'CREATE OR REPLACE TABLE "A" (x INT)',
                 "create view main.A as select 1"):
        with pytest.raises(tensordb.CatalogError, match="a tensor named 'A' exists"):
            con.sql(stmt)
    assert con.sql("SELECT count(*) FROM A").fetchall() == [(2,)]


def test_sql_transactions_and_tensordb_writes_do_not_mix():
    """Inside a transaction begun with SQL, tensordb writes refuse (they commit on their own);
    the SQL ROLLBACK still works and writes work again afterwards."""
    with tensordb.connect() as con:
        con.load("A", np.eye(2))
        con.sql("BEGIN")
        with pytest.raises(tensordb.ProgrammingError, match="BEGIN"):
            con.load("B", np.ones((2, 2)))
        con.sql("ROLLBACK")
        con.load("B", np.ones((2, 2)))
        assert con.tensor("B").sum() == 4


def test_catalog_rows_cannot_be_changed_with_sql():
    """The catalog schema is tensordb's: plain SQL may read it, never change it (a deleted row
    would let the next open delete the payload as unreferenced)."""
    with tensordb.connect() as con:
        con.load("A", np.eye(2), dims=["i", "j"])
        with pytest.raises(tensordb.ProgrammingError, match="tensordb's catalog"):
            con.sql("UPDATE tensordb.tensors SET dims = ['x', 'y'] WHERE name = 'A'")
        with pytest.raises(tensordb.ProgrammingError, match="tensordb's catalog"):
            con.execute("DELETE FROM tensordb.tensors WHERE name = ?", ["A"])
        assert con.store.meta("A").dims == ("i", "j")
        assert con.sql("SELECT dims FROM tensordb.tensors").fetchall() == [(["i", "j"],)]
        np.testing.assert_array_equal(con.tensor("A"), np.eye(2))


def test_absurd_grids_are_refused_before_they_fill_the_memory():
    with tensordb.connect() as con:
        with pytest.raises(tensordb.ProgrammingError, match="tiles"):
            con.execute("CREATE TENSOR Z (i 100000000, j 100000000) FLOAT32 TILE (i 1, j 1)")
        assert con.tensors() == []


@pytest.mark.parametrize("q", ["SELECT $$it's$$ AS s, sum(value) AS t FROM A WHERE 'x' <> 'y'",
                               "SELECT E'\\'' AS s, sum(value) AS t FROM \"A\"",
                               "SELECT 'a' AS s, /* it's */ sum(value) AS t FROM A"])
def test_a_tensor_is_found_in_sql_with_any_kind_of_string(q):
    """The tensors a query names are found with DuckDB's tokenizer: a $$...$$ or E'...' string
    once threw the search off, and the query failed ('Table A does not exist'), or read a
    stale version of A after it was replaced."""
    with tensordb.connect() as con:
        con.load("A", np.array([1.0, 2.0]))
        assert con.sql(q).fetchall()[0][1] == 3.0
        con.load("A", np.array([10.0, 20.0]), replace=True)
        assert con.sql(q).fetchall()[0][1] == 30.0


def test_a_view_over_a_tensor_follows_its_replacements():
    """CREATE VIEW over a tensor reads the current version: once it kept reading the version
    registered when a query last named the tensor (sums of 3 after the tensor summed 300)."""
    with tensordb.connect() as con:
        con.load("A", np.array([[1.0, 0.0], [0.0, 2.0]]), dims=["i", "j"])
        con.execute("CREATE VIEW v AS SELECT i, j, value FROM A")
        assert con.execute("SELECT sum(value) FROM v").fetchall() == [(3.0,)]
        con.execute("A[i,j] = A[i,j] * 10")
        con.execute("A[i,j] = A[i,j] * 10")
        assert con.execute("SELECT sum(value) FROM v").fetchall() == [(300.0,)]
        rel = con.sql("SELECT sum(value) FROM A")
        con.load("A", np.full((2, 2), 5.0), dims=["i", "j"], replace=True)
        assert rel.fetchall() == [(20.0,)]  # a relation reads the tensor when it runs
        con.execute("DROP TENSOR A")
        with pytest.raises(tensordb.CatalogError):
            con.execute("SELECT sum(value) FROM v")


@pytest.mark.parametrize("q", ['CREATE TABLE "main"."A" (x INT)', "CREATE TABLE memory.main.a AS SELECT 1",
                               "CREATE /* c */ TABLE a (x INT)", "ALTER TABLE t RENAME TO a",
                               "CREATE VIEW a AS SELECT 1", "CREATE TEMP TABLE a (x INT)",
                               "ALTER VIEW w RENAME TO a"])
def test_a_table_named_like_a_tensor_is_refused_however_spelled(q):
    """Tensors and tables share one namespace; the check read the statement with a pattern,
    which quoting, qualifying, a comment or a rename got past (and the table then could not
    be read: its name gave the tensor). It reads DuckDB's bound plan now."""
    with tensordb.connect() as con:
        con.load("A", np.ones(2))
        con.sql("CREATE TABLE t (x INT)")
        con.sql("CREATE VIEW w AS SELECT 1 AS x")
        with pytest.raises(tensordb.CatalogError, match="a tensor named 'A' exists"):
            con.sql(q)
        tables = {r[0].lower() for r in con.sql(
            "SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM "
            "duckdb_views() WHERE NOT internal AND NOT temporary").fetchall()}  # tensors: temporary
        assert "a" not in tables and "t" in tables
        np.testing.assert_array_equal(con.tensor("A"), np.ones(2))
        con.sql("CREATE TABLE other (x INT)")  # other names are free


@pytest.mark.parametrize("q", ["CREATE MACRO a(x) AS x", "CREATE SEQUENCE a", "CREATE TYPE a AS INT",
                               "CREATE INDEX a ON t(x)"])
def test_objects_of_other_kinds_may_share_a_tensors_name(q):
    """Macros, sequences, types and indexes have names of their own kind: a tensor's name is
    free for them (the check once refused them as tables)."""
    with tensordb.connect() as con:
        con.load("A", np.ones(2))
        con.sql("CREATE TABLE t (x INT)")
        con.sql(q)
        np.testing.assert_array_equal(con.tensor("A"), np.ones(2))
