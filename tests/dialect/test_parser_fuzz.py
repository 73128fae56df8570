"""Property tests: random and mutated statements only ever raise tensordb errors, and a statement
that fails changes nothing."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensordb
from tensordb.config import Settings
from tensordb.dialect import parse

CORPUS = [
    "CREATE TENSOR Z (i 4, k 3) FLOAT32 TILE (i 2, k 3)",
    "CREATE OR REPLACE TENSOR Z (2, 2)",
    "C[i,k] = SUM(A[i,j] * B[j,k])",
    "C[i,k] = A[i,j] * B[j,k] WITH (PIECES i 2, k 1)",
    "M[i] = MAX(A[i,j])",
    "P[i,j] = MIN(S[i,k] + S[k,j])",
    "H[b,f] = RELU(SUM(A[b,h] * B[h,f]) + v[f])",
    "s = SUM(A[i,j] * A[i,j])",
    "E[i,j] = EXP(A[i,j] - MAX(A[i,k])) / 2",
    "C = EINSUM('ij,jk->ik', A, B)",
    "C = EINSUM('...j,jk->...k', A, B)",
    "CREATE TENSOR C AS EINSUM('ij->j', A)",
    "CREATE OR REPLACE TENSOR C[i] AS -A[i,j] + POW(A[i,j], 2)",
    "LET T[i,k] = A[i,j] * B[j,k]; U[i] = SUM(T[i,k])",
    "BEGIN; C[i] = v[i] + 1; COMMIT",
    "BEGIN; C[i] = v[i]; ROLLBACK",
    "CREATE TENSOR R FROM (SELECT x, y, x + y AS w FROM grid) INDEX (x, y) VALUE w SHAPE (3, 3)",
    "CREATE TENSOR R FROM grid INDEX (x, y) VALUE w",
    "EXPLAIN C[i,k] = A[i,j] * B[j,k]",
    "EXPLAIN (FORMAT JSON) C[i,k] = A[i,j] * B[j,k]",
    "SHOW TENSORS", "SHOW ALL", "SHOW workers", "DESCRIBE A", "DROP TENSOR IF EXISTS v",
    "SET workers = 2", "SET memory_limit = '1GB'",
    "SELECT i, j, value FROM A WHERE value > 1 ORDER BY i",
    "SELECT count(*) FROM grid",
]
VOCAB = ["[", "]", "(", ")", ",", ";", "=", "+", "-", "*", "/", "'", "SUM", "MAX", "EINSUM", "TENSOR",
         "CREATE", "LET", "WITH", "TILE", "FROM", "AS", "i", "j", "A", "B", "0", "99", "--", "/*",
         "BEGIN", "COMMIT", "SELECT", "'x'", "...", "$", "\"", "EXPLAIN"]
TOKEN = re.compile(r"'[^']*'|\w+|\.\.\.|\S")

BASE = {"A": np.arange(12.0).reshape(3, 4) - 4, "B": np.linspace(-1, 1, 8).reshape(4, 2),
        "v": np.array([1.0, -2.0]), "S": np.array([[0, 1.5, 9], [2, 0, 1], [4, 3, 0]])}


@st.composite
def mutated(draw):
    tokens = TOKEN.findall(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "unicode", "chars"]))
        k = draw(st.integers(0, max(0, len(tokens) - 1)))
        if op == "delete" and tokens:
            del tokens[k]
        elif op == "duplicate" and tokens:
            tokens.insert(k, tokens[k])
        elif op == "swap" and len(tokens) > 1:
            m = draw(st.integers(0, len(tokens) - 1))
            tokens[k], tokens[m] = tokens[m], tokens[k]
        elif op == "insert":
            tokens.insert(k, draw(st.sampled_from(VOCAB)))
        elif op == "unicode":
            tokens.insert(k, draw(st.text(min_size=1, max_size=3)))
        elif tokens:
            t = tokens[k]
            i = draw(st.integers(0, len(t)))
            tokens[k] = t[:i] + draw(st.characters()) + t[i:]
    return " ".join(tokens)


def _setup(con):
    for name, arr in BASE.items():
        con.load(name, arr, replace=True)
    con.execute("CREATE OR REPLACE TABLE grid AS SELECT x, y, (x * y)::DOUBLE AS w "
                "FROM range(3) a(x), range(3) b(y)")


def _state(con, versions=True):
    tensors = {t["name"]: (t["version"] if versions else None, t["shape"], t["dtype"],
                           con.tensor(t["name"]).tobytes()) for t in con.tensors()}
    tables = sorted(con.sql("SELECT table_name FROM information_schema.tables "
                            "WHERE table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall())
    return tensors, tables


def _reset(con, base):
    """Back to the base state after a statement (a success may have changed anything)."""
    s = con.session
    s.block, s.block_failed = None, False
    s.lets.clear()
    defaults = Settings()
    for key, value in defaults.items():
        if getattr(con.settings, key) != value:
            con.set(key, value)
    if _state(con, versions=False) == base:
        return
    for t in con.tensors():
        if t["name"] not in BASE:
            con.drop(t["name"])
    for (name,) in con.sql("SELECT table_name FROM information_schema.tables "
                           "WHERE table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall():
        if name != "grid":
            con.sql(f'DROP TABLE "{name}"')
    _setup(con)


@pytest.fixture(scope="module")
def fuzz_con(tmp_path_factory):
    import os
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("fuzz"))  # COPY ... TO writes relative paths here
    with tensordb.connect() as con:
        _setup(con)
        yield con, _state(con, versions=False)
    os.chdir(old)


@settings(max_examples=400, deadline=None)
@given(st.one_of(mutated(), st.text(max_size=60)))
def test_parser_raises_only_parser_errors(text):
    try:
        parse(text)
    except tensordb.ParserError as exc:
        assert exc.span is not None and str(exc)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(mutated(), mutated(), st.text(max_size=40)))
def test_execute_raises_only_tensordb_errors_and_failures_change_nothing(fuzz_con, text):
    con, base = fuzz_con
    before = _state(con)
    try:
        con.execute(text)
    except tensordb.Error as exc:
        assert str(exc)
        if con.pending_statements() is None:
            assert _state(con) == before, f"the database changed after a failed statement: {text!r}"
    finally:
        _reset(con, base)


def test_corpus_is_valid(fuzz_con):
    con, base = fuzz_con
    for text in CORPUS:
        try:
            con.execute(text)
        finally:
            _reset(con, base)
