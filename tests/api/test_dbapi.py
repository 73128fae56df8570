"""DB-API 2.0 (PEP 249): module attributes, cursors, commit and rollback; checked against DuckDB's
own answers for the same SQL and against numpy for tensors."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

import tensordb

PEP249_ERRORS = ("Warning", "Error", "InterfaceError", "DatabaseError", "DataError",
                 "OperationalError", "IntegrityError", "InternalError", "ProgrammingError",
                 "NotSupportedError")


def test_module_attributes():
    assert tensordb.apilevel == "2.0"
    assert tensordb.threadsafety in (0, 1, 2, 3)
    assert tensordb.paramstyle == "qmark"
    for name in PEP249_ERRORS:
        cls = getattr(tensordb, name)
        assert issubclass(cls, Exception)
    assert issubclass(tensordb.Error, Exception) and not issubclass(tensordb.Error, tensordb.Warning)
    for name in PEP249_ERRORS[2:]:
        assert issubclass(getattr(tensordb, name), tensordb.Error)
    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError",
                 "ProgrammingError", "NotSupportedError"):
        assert issubclass(getattr(tensordb, name), tensordb.DatabaseError)
    # type objects compare equal to the type codes in cursor.description
    assert tensordb.NUMBER == "BIGINT" and tensordb.NUMBER == "DOUBLE"
    assert tensordb.STRING == "VARCHAR" and tensordb.STRING != "BIGINT"
    assert tensordb.DATETIME == "TIMESTAMP" and tensordb.NUMBER == "DECIMAL(18,3)"


def test_cursor_fetches_like_duckdb(con):
    query = ("SELECT x, x * 1.5 AS y, 'r' || x::VARCHAR AS s FROM range(7) t(x) ORDER BY x")
    want = duckdb.connect()
    expected = want.execute(query).fetchall()
    cur = con.cursor()
    assert cur.execute(query) is cur  # calls chain, as in DuckDB and sqlite3
    assert [d[0] for d in cur.description] == ["x", "y", "s"]
    assert [d[1] for d in cur.description] == [str(d[1]) for d in want.execute(query).description]
    assert all(len(d) == 7 for d in cur.description)
    assert cur.description[0][1] == tensordb.NUMBER and cur.description[2][1] == tensordb.STRING
    assert cur.rowcount in (-1, len(expected))
    assert cur.arraysize == 1
    assert cur.fetchone() == expected[0]
    assert cur.fetchmany() == expected[1:2]  # arraysize rows
    cur.arraysize = 2
    assert cur.fetchmany() == expected[2:4]
    assert cur.fetchmany(10) == expected[4:]
    assert cur.fetchone() is None and cur.fetchall() == [] and cur.fetchmany(3) == []
    assert list(cur.execute(query)) == expected


def test_parameters_and_executemany(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE t (k INTEGER, v DOUBLE)")
    rows = [(k, k / 4) for k in range(5)]
    cur.executemany("INSERT INTO t VALUES (?, ?)", rows)
    assert cur.rowcount == len(rows)
    assert cur.execute("SELECT k, v FROM t WHERE k >= ? ORDER BY k", [2]).fetchall() == rows[2:]
    assert cur.execute("INSERT INTO t VALUES (?, ?)", (9, 1.0)).rowcount == 1
    assert cur.execute("SELECT count(*) FROM t").fetchone() == (len(rows) + 1,)


def test_bad_arguments_are_programming_errors(con):
    cur = con.cursor()
    with pytest.raises(tensordb.ProgrammingError, match="sequence of parameter sequences"):
        cur.executemany("SELECT ?", 5)
    with pytest.raises(tensordb.ProgrammingError, match="must be a string"):
        cur.execute(42)
    cur.execute("SELECT 1")
    with pytest.raises(tensordb.ProgrammingError, match="fetchmany size"):
        cur.fetchmany(-1)
    with pytest.raises(tensordb.ProgrammingError, match="fetchmany size"):
        cur.fetchmany("2")
    assert cur.fetchall() == [(1,)]


def test_executemany_is_all_or_nothing(con):
    cur = con.cursor()
    cur.execute("CREATE TABLE t (k INTEGER)")
    with pytest.raises(tensordb.DataError) as err:
        cur.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), ("not a number",), (4,)])
    assert "INSERT INTO t" in str(err.value) and "^" in str(err.value)
    assert str(err.value).count("LINE 1") == 1
    assert cur.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_einsum_statement_through_a_cursor(con):
    a = np.arange(12.0).reshape(3, 4)
    a[2] = 0
    con.load("A", a)
    cur = con.cursor()
    cur.execute("G[i,k] = SUM(A[i,j] * A[k,j])")
    np.testing.assert_allclose(cur.result.tensor(), a @ a.T)
    np.testing.assert_allclose(np.asarray(cur.result), a @ a.T)
    # the result's rows are the stored tensor's relation: one row per nonzero
    assert [d[0] for d in cur.description] == ["i", "k", "value"]
    g = a @ a.T
    assert sorted(cur.fetchall()) == [(i, k, g[i, k]) for i, k in zip(*np.nonzero(g))]


def test_fetching_without_rows_is_a_programming_error(con):
    cur = con.cursor()
    with pytest.raises(tensordb.ProgrammingError, match="no statement"):
        cur.fetchall()
    cur.execute("CREATE TENSOR Z (2, 3) FLOAT32")
    assert cur.description is None and cur.rowcount == -1
    with pytest.raises(tensordb.ProgrammingError, match="no rows"):
        cur.fetchone()


def test_closed_cursor_and_connection():
    con = tensordb.connect()
    cur = con.cursor()
    cur.execute("SELECT 1")
    cur.close()
    for call in (lambda: cur.execute("SELECT 1"), cur.fetchone, cur.fetchall,
                 lambda: cur.fetchmany(2), lambda: cur.executemany("SELECT ?", [(1,)])):
        with pytest.raises(tensordb.ProgrammingError, match="cursor is closed"):
            call()
    other = con.cursor()
    con.close()
    with pytest.raises(tensordb.ProgrammingError, match="connection is closed"):
        other.execute("SELECT 1")
    with pytest.raises(tensordb.InterfaceError, match="closed"):
        con.cursor()
    with pytest.raises(tensordb.InterfaceError, match="closed"):
        con.commit()


def test_cursor_errors_change_nothing(con, snapshot):
    con.load("A", np.ones((2, 3)))
    before = snapshot(con)
    cur = con.cursor()
    with pytest.raises(tensordb.BinderError) as err:
        cur.execute("C[i,k] = SUM(A[i,j] * A[j,k])")
    assert "LINE 1" in str(err.value)
    with pytest.raises(tensordb.ProgrammingError, match="the statements have none"):
        cur.execute("B[i,j] = A[i,j] + 1", [1])  # a value for no parameter
    assert snapshot(con) == before


def test_commit_without_a_transaction_is_a_no_op(con, snapshot):
    con.load("A", np.eye(3))
    before = snapshot(con)
    con.commit()
    con.rollback()
    assert snapshot(con) == before


def test_commit_ends_a_begin_block(disk_con, tmp_path):
    con = disk_con
    a = np.arange(6.0).reshape(2, 3)
    con.load("A", a)
    cur = con.cursor()
    cur.execute("BEGIN")
    cur.execute("T[i,k] = SUM(A[i,j] * A[k,j])")
    assert not any(t["name"] == "T" for t in con.tensors())  # queued until COMMIT
    con.commit()
    np.testing.assert_allclose(con.tensor("T"), a @ a.T)
    con.commit()  # nothing open: nothing to do


def test_rollback_discards_a_begin_block(con, snapshot):
    con.load("A", np.ones((2, 2)))
    before = snapshot(con)
    con.execute("BEGIN")
    con.execute("U[i] = SUM(A[i,j])")
    con.rollback()
    assert snapshot(con) == before
    con.execute("V[i] = SUM(A[i,j])")  # no block open any more: runs at once
    np.testing.assert_allclose(con.tensor("V"), [2.0, 2.0])


def test_commit_and_rollback_of_a_sql_transaction(con):
    con.sql("CREATE TABLE t (k INTEGER)")
    con.sql("BEGIN")
    con.sql("INSERT INTO t VALUES (1)")
    con.rollback()
    assert con.sql("SELECT count(*) FROM t").fetchall() == [(0,)]
    con.sql("BEGIN")
    con.sql("INSERT INTO t VALUES (2)")
    con.commit()
    con.rollback()  # committed: nothing to undo
    assert con.sql("SELECT k FROM t").fetchall() == [(2,)]
    con.load("A", np.ones(2))  # tensordb writes work again: no SQL transaction is open
    assert con.tensor("A").tolist() == [1.0, 1.0]


def test_columns_of_one_name_are_all_kept():
    """SELECT 1 AS a, 2 AS a and a self-join's *: DuckDB returns every column; the rows were
    once made as dicts, which kept the last column of a name."""
    ref = duckdb.connect()
    with tensordb.connect() as con:
        con.load("A", np.array([[1.0, 0.0], [2.0, 3.0]]))
        for q in ["SELECT 1 AS a, 2 AS a, 3 AS b"]:
            assert con.execute(q).fetchall() == ref.execute(q).fetchall() == [(1, 2, 3)]
        cur = con.cursor().execute("SELECT * FROM A x JOIN A y ON x.i = y.j ORDER BY ALL")
        rows = cur.fetchall()
        assert len(cur.description) == 6 and all(len(r) == 6 for r in rows)
        a = np.array([[1.0, 0.0], [2.0, 3.0]])
        coo = [(i, j, a[i, j]) for i in range(2) for j in range(2) if a[i, j]]
        assert rows == sorted(x + y for x in coo for y in coo if x[0] == y[1])


def test_a_mapping_of_parameters_names_them():
    """A dict gives $name parameters, as DuckDB takes it; once its keys were bound as values
    (SELECT ? with {'x': 5} returned 'x')."""
    with tensordb.connect() as con:
        cur = con.cursor()
        assert cur.execute("SELECT $x + 1 AS v", {"x": 5}).fetchall() == [(6,)]
        with pytest.raises(tensordb.Error):
            cur.execute("SELECT ? AS v", {"x": 5})
        con.execute("CREATE TABLE t (k VARCHAR)")
        cur.executemany("INSERT INTO t VALUES ($k)", [{"k": "secret"}, {"k": "other"}])
        assert sorted(con.execute("SELECT k FROM t").fetchall()) == [("other",), ("secret",)]


@pytest.mark.parametrize("q", ["SELECT [1, 2] AS l", "SELECT [1, 2][1] AS x",
                               "SELECT [i * 2 FOR i IN range(3)] AS l"])
def test_a_select_of_a_list_is_sql(q):
    """SELECT [ ... ] was taken for a tensor assignment (a name followed by '[')."""
    with tensordb.connect() as con:
        assert con.execute(q).fetchall() == duckdb.connect().execute(q).fetchall()


def test_parameterized_statements_in_a_block_wait_for_its_commit():
    """Plain SQL in a BEGIN block takes part in it, with ? parameters too: once such a
    statement ran and committed at once, and ROLLBACK left it stored."""
    with tensordb.connect() as con:
        con.execute("CREATE TABLE kv (k INTEGER, v DOUBLE)")
        con.execute("BEGIN")
        con.execute("INSERT INTO kv VALUES (?, ?)", [1, 0.5])
        con.cursor().executemany("INSERT INTO kv VALUES (?, ?)", [[2, 1.5], [3, 2.5]])
        assert con.sql("SELECT count(*) FROM kv").fetchall() == [(0,)]  # queued
        con.execute("ROLLBACK")
        assert con.sql("SELECT count(*) FROM kv").fetchall() == [(0,)]
        con.execute("BEGIN")
        con.execute("INSERT INTO kv VALUES (?, ?)", [4, 3.5])
        con.commit()
        assert con.sql("SELECT * FROM kv").fetchall() == [(4, 3.5)]


def test_a_tensor_result_read_after_its_tensor_changed_says_so():
    """A statement's result is its tensor's rows, read when first fetched: once that tensor
    was replaced (another cursor's statement), the fetch returned the new tensor's rows under
    the old description. It is an error now; a result fetched in time keeps its rows."""
    with tensordb.connect() as con:
        con.load("A", np.array([[1.0, 0.0], [0.0, 2.0]]), dims=["i", "j"])
        c1, c2 = con.cursor(), con.cursor()
        c1.execute("T[i] = SUM(A[i,j])")
        c2.execute("T[x,y] = A[x,y] * 100")
        with pytest.raises(tensordb.ProgrammingError, match="'T' was replaced after"):
            c1.fetchall()
        with pytest.raises(tensordb.ProgrammingError, match="'T' was replaced after"):
            c1.result.tensor()
        c1.execute("U[i] = SUM(A[i,j])")
        rows = c1.fetchall()
        c2.execute("DROP TENSOR U")
        assert rows == [(0, 1.0), (1, 2.0)]
        c1.execute("V[i] = SUM(A[i,j])")
        c2.execute("DROP TENSOR V")
        with pytest.raises(tensordb.ProgrammingError, match="'V' was dropped after"):
            c1.fetchall()


def test_sql_and_reads_run_inside_a_transaction_begun_with_sql():
    """After con.sql("BEGIN"), statements that are DuckDB's (or only read) run in the user's
    transaction, as DuckDB runs them: once con.execute and cursors refused even a SELECT.
    tensordb's own writes are still refused; ROLLBACK discards what ran."""
    with tensordb.connect() as con:
        con.load("A", np.eye(2))
        con.sql("CREATE TABLE kv (k INTEGER)")
        con.sql("BEGIN")
        assert con.execute("SELECT count(*) FROM A").fetchall() == [(2,)]
        con.cursor().execute("INSERT INTO kv VALUES (?)", [1])
        con.execute("INSERT INTO kv VALUES (2)")
        assert con.execute("SHOW TENSORS").fetchall()[0][0] == "A"
        with pytest.raises(tensordb.ProgrammingError, match="begun with SQL BEGIN"):
            con.execute("B[i] = SUM(A[i,j])")
        assert sorted(con.sql("SELECT k FROM kv").fetchall()) == [(1,), (2,)]
        con.sql("ROLLBACK")
        assert con.sql("SELECT count(*) FROM kv").fetchall() == [(0,)]
        assert not con.store.has("B")


def test_fetches_after_fetchone_take_the_rest_as_duckdb_does():
    """fetchnumpy, fetch_arrow_table and df after fetchone/fetchmany return the rows not
    fetched yet, as DuckDB's do; they returned every row."""
    q = "SELECT range AS x, range * 2 AS y FROM range(6)"
    ref = duckdb.connect()
    with tensordb.connect() as con:
        cur = con.cursor().execute(q)
        ref.execute(q)
        assert cur.fetchone() == ref.fetchone()
        got, want = cur.fetchnumpy(), ref.fetchnumpy()
        assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in got)
        assert cur.fetchall() == ref.fetchall() == []
        cur.execute(q)
        ref.execute(q)
        assert cur.fetchmany(4) == ref.fetchmany(4)
        assert cur.fetch_arrow_table().to_pydict() == {"x": [4, 5], "y": [8, 10]}
        assert cur.fetchone() is None


def test_sql_cannot_begin_or_end_a_transaction_while_a_block_is_open():
    """A BEGIN ... COMMIT block queues its statements for its COMMIT; con.sql("BEGIN") was
    accepted meanwhile, and the block was then lost when its COMMIT failed."""
    with tensordb.connect() as con:
        con.load("A", np.eye(2))
        con.execute("BEGIN")
        con.execute("B[i] = SUM(A[i,j])")
        for q in ["BEGIN", "COMMIT", "/* x */ ROLLBACK"]:
            with pytest.raises(tensordb.ProgrammingError, match="block of tensordb statements"):
                con.sql(q)
        assert con.sql("SELECT 42").fetchall() == [(42,)]
        con.execute("COMMIT")
        np.testing.assert_array_equal(con.tensor("B"), [1.0, 1.0])


def test_a_replaced_tensors_result_is_not_printed_either():
    """A result's preview (what the command line prints) checks its version as its fetches
    do: read by its corners, it once showed the newer tensor."""
    with tensordb.connect() as con:
        con.load("A", np.ones(4))
        r = con.execute("B[i] = A[i] * 2")
        con.execute("B[i] = A[i] * 3")
        with pytest.raises(tensordb.ProgrammingError, match="'B' was replaced after"):
            r.preview(max_elements=1)
