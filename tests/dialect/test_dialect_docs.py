"""docs/sql.md stays true: its ```sql examples run, in order, in one database; ```sql error
examples fail with a tensordb error and change nothing; the ```python examples run too."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import tensordb

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql.md"
FENCE = re.compile(r"^```(sql|sql error|python)\n(.*?)^```", re.S | re.M)


def blocks():
    text = DOC.read_text()
    for m in FENCE.finditer(text):
        yield m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1


def test_sql_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ran = 0
    with tensordb.connect() as con:
        for kind, code, line in blocks():
            if kind == "sql":
                try:
                    con.execute(code)
                except tensordb.Error as exc:
                    pytest.fail(f"docs/sql.md:{line}: example failed:\n{exc}")
                ran += 1
            elif kind == "sql error":
                before = [(t["name"], t["version"]) for t in con.tensors()]
                with pytest.raises(tensordb.Error):
                    con.execute(code)
                assert [(t["name"], t["version"]) for t in con.tensors()] == before
    assert ran >= 20


def test_python_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    codes = [c for kind, c, _ in blocks() if kind == "python"]
    assert len(codes) >= 2
    namespace: dict = {}
    for code in codes:  # in order, in one namespace: a later example uses the earlier's `con`
        exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102


def test_every_statement_has_an_example():
    sql = "\n".join(c for kind, c, _ in blocks() if kind == "sql").upper()
    for needle in ("CREATE TENSOR", "CREATE OR REPLACE TENSOR", "IF NOT EXISTS", "TILE (", "FROM (SELECT",
                   "LOAD TENSOR", "LOAD OR REPLACE", "INDEX (", "SHAPE (", "FORMAT CSV", "] = SUM(",
                   "= MAX(", "= MIN(", "PROD(", "EINSUM(", " AS EINSUM", "LET ", "WITH (PIECES",
                   "BEGIN;", "COMMIT;", "ROLLBACK;", "EXPLAIN ANALYZE", "EXPLAIN (FORMAT JSON)",
                   "SHOW TENSORS", "SHOW ALL", "DESCRIBE ", "DROP TENSOR IF EXISTS", "COPY ",
                   "SET WORKERS", "SET MEMORY_LIMIT", "SELECT ", "CHECK TENSOR", "CHECK DATABASE"):
        assert needle in sql, needle
