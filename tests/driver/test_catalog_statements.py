"""How many statements a query sends to DuckDB, counted by DuckDB itself (its QueryLog, DuckDB
>= 1.3): a repeated 64 x 64 matmul stored to a stored tensor (its plan cached, its binding
reused) sends at most 5, a new one at most 6, and no query reads the same thing twice.

Counted on the catalog connection, which every catalog read and write of the store goes through
(storage/store.py); the results are checked against numpy, so that a query that sent fewer
statements by doing less would fail.
"""
from __future__ import annotations

import numpy as np
import pytest

import tensordb

REPEATED_MAX = 5  # BEGIN, the rows of the new version (tensor, tiles), COMMIT
NEW_MAX = 6       # and the user tables named like the output (inside the transaction)
MATMUL = "C[i,k] = SUM(A[i,j] * B[j,k])"


def statements(con, fn) -> list[str]:
    """The statements DuckDB ran while ``fn()`` ran on ``con``, in order, one line each."""
    duck = con.store.duck
    duck.execute("CALL enable_logging('QueryLog')")
    try:
        duck.execute("CALL truncate_duckdb_logs()")
        fn()
    finally:
        duck.execute("CALL disable_logging()")
    rows = duck.execute("SELECT message FROM duckdb_logs() WHERE type = 'QueryLog' "
                        "ORDER BY context_id").fetchall()
    out = [" ".join(m.split()) for (m,) in rows]
    assert out and out[-1] == "CALL disable_logging()", out
    return out[:-1]


def reads(log: list[str]) -> list[str]:
    return [s for s in log if s.startswith("SELECT")]


def assert_no_read_twice(log: list[str]) -> None:
    seen = reads(log)
    assert len(set(seen)) == len(seen), "a catalog read sent twice:\n" + "\n".join(log)


@pytest.fixture(params=["memory", "disk"])
def matmul(request, tmp_path):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))
    path = None if request.param == "memory" else tmp_path / "db"
    with tensordb.connect(path, workers=2) as con:
        con.load("A", a)
        con.load("B", b)
        yield con, a.astype(np.float64) @ b


def _close(got, want) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_a_new_and_a_repeated_matmul(matmul):
    con, want = matmul
    log = statements(con, lambda: con.execute(MATMUL))
    assert len(log) <= NEW_MAX, "\n".join(log)
    assert_no_read_twice(log)
    assert log[0] == "BEGIN TRANSACTION" and log[-1] == "COMMIT", log
    # the output's name is looked for among the user's tables, once, inside the transaction
    assert sum("duckdb_tables()" in s for s in log) == 1, log
    _close(con.tensor("C"), want)
    con.execute(MATMUL)  # the binding of a group whose output now exists is made once more
    hits = con.plan_cache_stats["hits"]
    for _ in range(2):
        log = statements(con, lambda: con.execute(MATMUL))
        assert len(log) <= REPEATED_MAX, "\n".join(log)
        assert_no_read_twice(log)
        # C is a tensor: no user table can be named like it (sql.run refuses one), nothing read
        assert reads(log) == [], log
    assert con.plan_cache_stats["hits"] == hits + 2
    _close(con.tensor("C"), want)


def test_a_new_matmul_on_a_connection_just_opened(tmp_path):
    """A new connection reads the catalog once: every tensor's row, then the tiles of the
    inputs, each in one statement (the tensors' rows and tile entries are cached after)."""
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))
    with tensordb.connect(tmp_path / "db") as con:
        con.load("A", a)
        con.load("B", b)
    with tensordb.connect(tmp_path / "db", workers=2) as con:
        log = statements(con, lambda: con.execute(MATMUL))
        assert len(log) <= NEW_MAX + 2, "\n".join(log)
        assert_no_read_twice(log)
        assert sum("FROM tensordb.tensors" in s for s in reads(log)) == 1, log
        assert sum("FROM tensordb.tiles" in s for s in reads(log)) == 1, log
        _close(con.tensor("C"), a.astype(np.float64) @ b)
        log = statements(con, lambda: con.execute("D[i,k] = SUM(B[i,j] * A[j,k])"))
        assert len(log) <= NEW_MAX and reads(log) == [log[1]], log  # the tables check only
        _close(con.tensor("D"), b.astype(np.float64) @ a)


@pytest.mark.parametrize("source", ["array", "npy", "npz"])
def test_a_load_looks_for_a_table_of_its_name_before_reading_and_at_commit(tmp_path, source):
    """Once before any data is read (to fail early), once inside the commit's transaction (what
    holds); not a third time when the writer opens. A table of that name is refused either way."""
    a = np.arange(12.0).reshape(3, 4)
    given = {"array": a, "npy": tmp_path / "a.npy", "npz": tmp_path / "a.npz"}[source]
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "a.npz", x=a)
    with tensordb.connect(tmp_path / "db") as con:
        given = given if source == "array" else str(given)
        log = statements(con, lambda: con.load("T", given))
        checks = [k for k, s in enumerate(log) if "duckdb_tables()" in s]
        begin = log.index("BEGIN TRANSACTION")
        assert len(checks) == 2 and checks[0] < begin < checks[1], "\n".join(log)
        np.testing.assert_array_equal(con.tensor("T"), a)
        con.sql("CREATE TABLE u (x INTEGER)")
        with pytest.raises(tensordb.CatalogError, match="a table named 'u' exists"):
            con.load("U", given)
        assert not con.store.has("U")


@pytest.mark.parametrize("query", ["SELECT 42", "CREATE TABLE t{k} AS SELECT 1 AS x",
                                   "BEGIN; ROLLBACK"])
def test_the_first_query_after_con_sql_sends_no_more(matmul, query):
    """Plain SQL may change the catalog, so the tensors' rows are read again after it (one
    statement); the tile entries, cached by version, are not: a version's tiles never change.
    A repeated query then sends at most 5 statements, a new one at most 6."""
    con, want = matmul
    con.execute(MATMUL)
    con.execute(MATMUL)
    for k, (sql, limit) in enumerate([(MATMUL, REPEATED_MAX),
                                      ("D[i,k] = SUM(B[i,j] * A[j,k])", NEW_MAX)]):
        con.sql(query.format(k=k))
        log = statements(con, lambda: con.execute(sql))
        assert len(log) <= limit, "\n".join(log)
        assert_no_read_twice(log)
        assert not any("FROM tensordb.tiles" in s for s in log), log
    _close(con.tensor("C"), want)
    a, b = con.tensor("A").astype(np.float64), con.tensor("B").astype(np.float64)
    _close(con.tensor("D"), b @ a)


def test_a_rolled_back_sql_transaction_leaves_no_stale_tile_entries(matmul):
    """The tile entries kept across con.sql are those of versions the catalog holds: after a
    ROLLBACK of plain SQL the query reads the versions that are there, as numpy says."""
    con, want = matmul
    con.execute(MATMUL)
    con.sql("BEGIN")
    con.sql("CREATE TABLE scratch AS SELECT 1 AS x")
    con.sql("ROLLBACK")
    con.execute("E[i,k] = SUM(C[i,j] * B[j,k])")
    _close(con.tensor("E"), want @ con.tensor("B").astype(np.float64))
