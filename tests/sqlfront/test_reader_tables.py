"""A read-only connection queries the database's own DuckDB tables and views: catalog.duckdb is
attached read-only for the statement only (storage/readview.py View.attach_user_tables), so a
writer in another process opens and commits while the reader lives. Real processes, a real
database directory; rows checked against DuckDB's own answer and NumPy."""
from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb.storage import directory
from tests.harness import child_env, kill9, start_script
from tests.storage.test_concurrent_readers import HOLD

QUERY = "SELECT i, w, name FROM t ORDER BY i"


def _make(root: str) -> np.ndarray:
    a = np.array([1.5, 0.0, 2.5, 4.0])
    with tensordb.connect(root) as con:
        con.load("A", a, dims=["i"])
        con.sql("CREATE TABLE t AS SELECT range AS i, range * 10 AS w, 'n' || range AS name "
                "FROM range(4)")
        con.sql("CREATE VIEW big AS SELECT * FROM t WHERE w >= 20")
    return a


def _writer(root: str, script: str) -> subprocess.CompletedProcess:
    """The CLI in another process: it opens the database for writing, runs ``script``, closes."""
    return subprocess.run([sys.executable, "-m", "tensordb", root, "-c", script],
                          capture_output=True, timeout=120, env=child_env())


def test_a_reader_queries_the_databases_tables_and_a_writer_opens_after(tmp_path):
    root = str(tmp_path / "db")
    a = _make(root)
    catalog = os.path.join(root, directory.CATALOG_FILE)
    with tensordb.connect(root, read_only=True) as con:
        rows = con.sql(QUERY).fetchall()
        assert con.execute(QUERY).fetchall() == rows
        assert sorted(con.sql("SELECT i FROM big").fetchall()) == [(2,), (3,)]
        # joined with a tensor's relation (its nonzeros): w * A[i], checked with NumPy
        rel = con.sql("SELECT t.i, w * value AS x FROM t JOIN A USING (i) ORDER BY t.i")
        want = [(i, 10 * i * a[i]) for i in range(4) if a[i] != 0]
        assert rel.fetchall() == want
        assert rel.filter("i > 1").fetchall() == want[1:]  # the lazy relation still runs
        assert not directory.writer_holds(catalog)
        names = [r[0] for r in con.store.duck.execute(
            "SELECT database_name FROM duckdb_databases()").fetchall()]
        assert all("user" not in n for n in names), names  # detached after each statement
        done = _writer(root, "CREATE TABLE u AS SELECT 7 AS x; C[i] = A[i] * 2")
        assert done.returncode == 0, done.stderr.decode()
        assert con.sql("SELECT count(*), sum(w) FROM t").fetchall() == [(4, 60)]
        np.testing.assert_array_equal(con.tensor("C"), a * 2)  # the writer's commit
        assert con.sql("SELECT x FROM u").fetchall() == [(7,)]  # its new table, read again
    with duckdb.connect(catalog, read_only=True) as duck:  # DuckDB's own answer
        assert duck.execute(QUERY).fetchall() == rows


def test_a_reader_says_a_writer_holds_the_tables(tmp_path):
    root = str(tmp_path / "db")
    _make(root)
    with tensordb.connect(root, read_only=True) as con:
        first = con.sql(QUERY).fetchall()
        held = start_script(HOLD, root, "rw", stdin=subprocess.PIPE)  # a writer stays open
        try:
            assert held.stdout.readline().strip() == b"ready", held.stderr.read()
            with pytest.raises(tensordb.ProgrammingError) as info:
                con.execute(QUERY)
            text = str(info.value)
            assert "t is not visible to a read-only connection" in text
            assert "writer has the database open" in text
            np.testing.assert_array_equal(con.tensor("A"), [1.5, 0.0, 2.5, 4.0])
        finally:
            kill9(held)
        assert con.sql(QUERY).fetchall() == first  # the writer gone: read again
