"""Transaction statements that tensordb did not see coming: a COMMIT hidden from the script
splitter inside an escape string, BEGIN or COMMIT behind a comment, and a COMMIT that reaches
DuckDB while a group of tensordb statements is open. None may lose a committed payload or
leave tensordb believing a transaction is open that is not.

The oracle for splitting is DuckDB's own parser (``duckdb.extract_statements``); the oracle for
"nothing lost" is the tensor read back after a reopen of the on-disk database, and CHECK
DATABASE.
"""
from __future__ import annotations

import os

import duckdb
import numpy as np
import pytest

import tensordb
from tensordb.dialect.lexer import split

W = np.arange(12.0).reshape(3, 4)

TEXTS = [
    r"SELECT E'\''; COMMIT; SELECT E'\''",
    r"SELECT e'a\\'; SELECT 2",
    r"SELECT E'it''s; fine', 'x;y'; SELECT 3",
    r"SELECT E'\\\'' AS v; SELECT 4",
    "SELECT note'x'; SELECT 5",
    r"SELECT 'a\'; SELECT 6",
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_script_splitter_splits_as_duckdb_does(text):
    ours = [text[s.start:s.end] for s in split(text)]
    try:
        theirs = [s.query.strip().rstrip(";").strip() for s in duckdb.extract_statements(text)]
    except duckdb.ParserError:  # DuckDB rejects the text (here: not a valid statement)
        pytest.skip("DuckDB does not parse this text")
    assert ours == theirs


def _reopened(root):
    with tensordb.connect(root) as con:
        assert [r["problem"] for r in con.check()] == ["ok"]
        return con.tensor("W"), sorted(os.listdir(os.path.join(root, "tiles")))


@pytest.mark.parametrize("script", [
    r"W[i,j] = W[i,j] * 2; SELECT E'\''; COMMIT; SELECT E'\''",
    r"W[i,j] = W[i,j] * 2; SELECT E'\''; COMMIT; SELECT E'\''; DROP TENSOR nosuch",
    r"SELECT E'\''; ROLLBACK; SELECT E'\''; V[i,j] = W[i,j] + 1",
])
def test_a_commit_inside_an_escape_string_changes_nothing(tmp_path, script):
    """The text is one SELECT of a quote, then the dialect's COMMIT with no BEGIN (an error),
    then another SELECT: the error leaves the database as it was. (The splitter once missed the
    escape, DuckDB ran the COMMIT inside the group's transaction, and the group's failed COMMIT
    deleted the new payload that the catalog already named: W was lost.)"""
    root = str(tmp_path / "w.tdb")
    with tensordb.connect(root, workers=1) as con:
        con.load("W", W)
        files = sorted(os.listdir(os.path.join(root, "tiles")))
        with pytest.raises(tensordb.Error):
            con.execute(script)
        np.testing.assert_array_equal(con.tensor("W"), W)
        assert not con.store.has("V")
    again, after = _reopened(root)
    np.testing.assert_array_equal(again, W)
    assert after == files


@pytest.mark.parametrize("word", ["COMMIT", "/* done */ COMMIT", "ROLLBACK", "-- x\nROLLBACK",
                                  "BEGIN", "/* c */ BEGIN TRANSACTION"])
def test_sql_transaction_statements_refused_inside_a_group(tmp_path, word):
    """A transaction statement reaching DuckDB while tensordb's own transaction is open would
    commit or roll back the group's rows behind its back: it is refused, and the group rolls
    back whole."""
    root = str(tmp_path / "w.tdb")
    con = _replace_w_in_a_group(root, lambda con: con.sql(word), tensordb.ProgrammingError,
                                "inside a group of tensordb")
    with con:
        assert not con.store.user_transaction
        np.testing.assert_array_equal(con.tensor("W"), W)
        con.load("U", W)  # writes still run
    again, _ = _reopened(root)
    np.testing.assert_array_equal(again, W)


def _replace_w_in_a_group(root: str, then, error, match: str):
    """Load W; in one tensordb transaction replace it with W * 2, then call ``then(con)``,
    which (or the transaction's end) must raise ``error``. Returns the open connection."""
    con = tensordb.connect(root, workers=1)
    con.load("W", W)
    with pytest.raises(error, match=match):
        with con.store.transaction():
            con.load("W", W * 2, replace=True)
            then(con)
    return con


def test_a_commit_behind_tensordbs_back_keeps_the_payloads_it_committed(tmp_path):
    """Should DuckDB's transaction end some other way while a group is open (here: a COMMIT on
    the same DuckDB connection), the group's own COMMIT fails. The payload files it wrote are
    then deleted only where the catalog proves them unreferenced: these are referenced (the
    rows were committed), so they stay and the new W reads back."""
    root = str(tmp_path / "w.tdb")
    con = _replace_w_in_a_group(root, lambda con: con.store.duck.execute("COMMIT"),
                                tensordb.Error, "commit failed")
    with con:
        np.testing.assert_array_equal(con.tensor("W"), W * 2)
    again, _ = _reopened(root)
    np.testing.assert_array_equal(again, W * 2)


@pytest.mark.parametrize("begin,end", [("BEGIN", "/* done */ COMMIT"),
                                       ("/* c */ BEGIN", "-- x\nROLLBACK"),
                                       ("BEGIN TRANSACTION", "COMMIT")])
def test_commented_transaction_statements_are_recognised(tmp_path, begin, end):
    """BEGIN and COMMIT are known by DuckDB's parse, not by their first characters: a comment
    before them no longer hides them. While the user's transaction is open tensordb's writes
    are refused with a message saying why; once it ends, they run."""
    with tensordb.connect(str(tmp_path / "w.tdb"), workers=1) as con:
        con.load("W", W)
        con.sql(begin)
        assert con.store.user_transaction
        with pytest.raises(tensordb.ProgrammingError, match="begun with SQL BEGIN"):
            con.load("U", W)
        con.sql(end)
        assert not con.store.user_transaction
        con.load("U", W)
        np.testing.assert_array_equal(con.tensor("U"), W)
