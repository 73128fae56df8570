"""More of DuckDB's connection methods, each call run on a plain ``duckdb.connect()`` too and
compared (DuckDB is the oracle): values, from_query, append, begin/commit/rollback, duplicate,
and fetchnumpy's conversions."""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

import tensordb


def on_both(call):
    theirs = call(duckdb.connect())
    with tensordb.connect() as con:
        ours = call(con)
    return ours, theirs


@pytest.mark.parametrize("call", [
    lambda c: c.values([1, "a", 2.5]).fetchall(),
    lambda c: c.from_query("SELECT 9 AS n").fetchall(),
    lambda c: (c.execute("CREATE TABLE t(x BIGINT, y DOUBLE)"),
               c.append("t", pd.DataFrame({"x": [1, 2], "y": [0.5, 1.5]})),
               c.sql("SELECT * FROM t ORDER BY x").fetchall())[-1],
    lambda c: (c.execute("CREATE TABLE t(y DOUBLE, x BIGINT)"),
               c.append("t", pd.DataFrame({"x": [3], "y": [4.5]}), by_name=True),
               c.sql("SELECT * FROM t").fetchall())[-1],
    lambda c: (c.execute("CREATE TABLE t(a INT)"), c.begin(), c.execute("INSERT INTO t VALUES (1)"),
               c.commit(), c.sql("SELECT count(*) FROM t").fetchall())[-1],
    lambda c: (c.execute("CREATE TABLE t(a INT)"), c.begin(), c.execute("INSERT INTO t VALUES (1)"),
               c.rollback(), c.sql("SELECT count(*) FROM t").fetchall())[-1],
    lambda c: c.duplicate().execute("SELECT 6").fetchall(),
], ids=["values", "from_query", "append", "append-by-name", "begin-commit", "begin-rollback",
        "duplicate"])
def test_as_duckdb_does(call):
    ours, theirs = on_both(call)
    assert ours == theirs


def test_fetchnumpy_converts_as_duckdb_does():
    sql = ("SELECT range AS i, range * 0.5 AS dec, CASE WHEN range > 1 THEN range END AS n, "
           "'a' AS s, DATE '2020-01-01' + range::INT AS d FROM range(4)")
    ours, theirs = on_both(lambda c: c.execute(sql).fetchnumpy())
    assert ours.keys() == theirs.keys()
    for column in theirs:
        assert ours[column].dtype == theirs[column].dtype, column
        assert type(ours[column]) is type(theirs[column]), column  # masked where NULLs are
        np.testing.assert_array_equal(np.ma.getmaskarray(ours[column]),
                                      np.ma.getmaskarray(theirs[column]))
        assert ours[column].tolist() == theirs[column].tolist()


def test_a_block_begun_in_python_holds_tensor_statements_too():
    with tensordb.connect() as con:
        con.load("A", np.eye(3))
        con.begin()
        con.execute("B[i,j] = A[i,j] * 2")
        assert not con.store.has("B")  # waits for the COMMIT
        con.commit()
        np.testing.assert_array_equal(con.tensor("B"), 2 * np.eye(3))
        with pytest.raises(tensordb.ProgrammingError, match="cannot append to .A.: it is a tensor"):
            con.append("A", pd.DataFrame({"i": [0], "j": [0], "value": [1.0]}))
