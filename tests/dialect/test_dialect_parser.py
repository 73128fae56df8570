"""The dialect's front end: splitting, classification, parsing to AST with spans, syntax errors."""
from __future__ import annotations

import pytest

from tensordb.dialect import ast as A
from tensordb.dialect import is_complete, parse, split
from tensordb.errors import ParserError


def one(text):
    stmts = parse(text)
    assert len(stmts) == 1
    return stmts[0]


def at(text, span):
    return text[span.start:span.end]


# -- splitting -----------------------------------------------------------------------------------

@pytest.mark.parametrize("script, parts", [
    ("SELECT 1; SELECT 2", ["SELECT 1", "SELECT 2"]),
    ("SELECT ';' ; ;  ", ["SELECT ';'"]),
    ("SELECT 'it''s;'", ["SELECT 'it''s;'"]),
    ('SELECT 1 AS "a;b"', ['SELECT 1 AS "a;b"']),
    ("-- a; comment\nSELECT 1 /* ; */;", ["SELECT 1 /* ; */"]),
    ("SELECT $$ ; $$; SELECT 2", ["SELECT $$ ; $$", "SELECT 2"]),
    ("", []),
    ("  ;;  -- only a comment", []),
])
def test_split(script, parts):
    assert [script[s.start:s.end] for s in split(script)] == parts


@pytest.mark.parametrize("text, where", [("SELECT 'abc", 7), ("SELECT 1 /* x", 9), ('SELECT "ab', 7)])
def test_split_unterminated(text, where):
    with pytest.raises(ParserError, match="unterminated") as info:
        split(text)
    assert info.value.span.start == where


def test_is_complete():
    assert is_complete("SELECT 1;")
    assert is_complete("SELECT 1; -- trailing comment")
    assert not is_complete("SELECT 1")
    assert not is_complete("SELECT ';")
    assert not is_complete("SELECT 1; SELECT 2")
    assert not is_complete("")


# -- which statements are ours ---------------------------------------------------------------------

@pytest.mark.parametrize("text, kind", [
    ("SELECT 1", A.SqlStmt), ("CREATE TABLE t (x INT)", A.SqlStmt), ("INSERT INTO t VALUES (1)", A.SqlStmt),
    ("SHOW TABLES", A.SqlStmt), ("DESCRIBE SELECT 1", A.SqlStmt), ("SET threads = 2", A.SqlStmt),
    ("COPY (SELECT 1) TO 'x.csv'", A.SqlStmt), ("DROP TABLE t", A.SqlStmt), ("LOAD json", A.SqlStmt),
    ("EXPLAIN SELECT 1", A.SqlStmt), ("WITH x AS (SELECT 1) SELECT * FROM x", A.SqlStmt),
    ("CREATE TENSOR A (i 3)", A.CreateStmt), ("create tensor a (3)", A.CreateStmt),
    ("CREATE OR REPLACE TENSOR A (3)", A.CreateStmt), ("LOAD TENSOR B FROM 'b.npy'", A.LoadStmt),
    ("CREATE TENSOR R FROM (SELECT 1 AS v) ", A.LoadStmt), ("C[i] = A[i]", A.AssignStmt),
    ("s = SUM(A[i])", A.AssignStmt), ("LET H[i] = A[i]", A.AssignStmt),
    ("CREATE TENSOR C AS EINSUM('i->', A)", A.AssignStmt), ("EXPLAIN C[i] = A[i]", A.ExplainStmt),
    ("SHOW TENSORS", A.ShowTensorsStmt), ("SHOW ALL", A.ShowSettingStmt),
    ("SHOW workers", A.ShowSettingStmt), ("DESCRIBE A", A.DescribeStmt), ("DESC A", A.DescribeStmt),
    ("SHOW TENSOR A", A.DescribeStmt),
    ("DROP TENSOR A", A.DropStmt), ("COPY C TO 'c.npy'", A.CopyStmt), ("SET workers = 2", A.SetStmt),
    ("BEGIN", A.BeginStmt), ("BEGIN TRANSACTION", A.BeginStmt), ("COMMIT", A.CommitStmt),
    ("END", A.CommitStmt), ("ROLLBACK", A.RollbackStmt),
])
def test_classification(text, kind):
    assert isinstance(one(text), kind)


def test_sql_keeps_its_text():
    s = one("  SELECT 1 ;")
    assert s.text == "SELECT 1"


# -- statements --------------------------------------------------------------------------------

def test_create_zeros():
    s = one("CREATE TENSOR A (i 4096, k 1024) FLOAT32 TILE (i 512, k 1024)")
    assert (s.name, s.dtype, s.replace, s.if_not_exists) == ("A", "FLOAT32", False, False)
    assert [(d.name, d.size) for d in s.dims] == [("i", 4096), ("k", 1024)]
    assert [(p.label, p.value) for p in s.tile] == [("i", 512), ("k", 1024)]
    s = one("create or replace tensor B (3, 4)")
    assert s.replace and not s.if_not_exists and s.dtype == "float64" and s.tile is None
    assert [d.name for d in s.dims] == [None, None]
    s = one("create tensor if not exists B (3, 4)")
    assert s.if_not_exists and not s.replace
    with pytest.raises(ParserError, match="OR REPLACE cannot go with IF NOT EXISTS"):
        one("create or replace tensor if not exists B (3, 4)")  # they contradict each other


def test_load_options():
    s = one("LOAD TENSOR B (i, j) FROM 'b.npz' ARRAY 'w' FORMAT NPZ TILE (i 2, j 3)")
    assert (s.path, s.array, s.format) == ("b.npz", "w", "npz")
    assert [d.name for d in s.dims] == ["i", "j"]
    s = one("CREATE OR REPLACE TENSOR R FROM (SELECT u, i, r FROM t WHERE s = ')') "
            "INDEX (u, i) VALUE r SHAPE (10, 20)")
    assert s.query == "SELECT u, i, r FROM t WHERE s = ')'" and s.replace
    assert (s.index, s.value, s.shape) == (("u", "i"), "r", (10, 20))
    s = one("CREATE TENSOR E FROM edges INDEX (src, dst) VALUE w")
    assert s.table == "edges" and s.path is None and s.query is None


def test_option_twice_is_an_error():
    with pytest.raises(ParserError, match="twice"):
        parse("LOAD TENSOR B FROM 'b.csv' VALUE v VALUE w")


def test_assignment_ast_and_spans():
    text = "C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 4, k 2)"
    s = one(text)
    assert s.mode == "assign" and s.target.name == "C"
    assert [l.name for l in s.target.labels] == ["i", "k"]
    call = s.expr
    assert isinstance(call, A.Call) and call.fn == "sum" and at(text, call.span) == "SUM(A[i,j] * B[j,k])"
    prod = call.args[0]
    assert isinstance(prod, A.BinOp) and prod.op == "*"
    assert at(text, prod.left.span) == "A[i,j]" and at(text, prod.right.labels[0].span) == "j"
    assert [(p.label, p.value) for p in s.pieces] == [("i", 4), ("k", 2)]
    assert at(text, s.pieces[1].span) == "k 2"


@pytest.mark.parametrize("old", ["WITH (TILE (i 4, k 2))", "WITH (TILE (i 4), TILE (k 2))"])
def test_with_tile_is_the_old_spelling_of_pieces(old):
    new = one("C[i,k] = A[i,j] * B[j,k] WITH (PIECES i 4, k 2)")
    text = f"C[i,k] = A[i,j] * B[j,k] {old}"
    s = one(text)
    assert [(p.label, p.value) for p in s.pieces] == [(p.label, p.value) for p in new.pieces]
    assert at(text, s.pieces[1].span) == "k 2"


def test_pieces_is_a_keyword_only_where_expected():
    s = one("pieces[i] = tile[i] * 2")  # still names of tensors
    assert s.target.name == "pieces" and s.expr.left.name == "tile"


def test_spans_are_offsets_in_the_whole_script():
    text = "SELECT 1;\n  X[i] = Y[i] + 2"
    s = parse(text)[1]
    assert at(text, s.span) == "X[i] = Y[i] + 2"
    assert at(text, s.expr.left.name_span) == "Y"


def test_expression_precedence_and_unary_minus():
    s = one("C[i] = -A[i] + 2 * B[i] / 4 - -3")
    e = s.expr
    assert e.op == "-" and isinstance(e.right, A.Number) and e.right.value == -3.0
    assert e.left.op == "+" and isinstance(e.left.left, A.Neg)
    assert e.left.right.op == "/" and e.left.right.left.op == "*"


def test_keywords_case_insensitive_and_not_reserved_as_names():
    s = one("create or replace tensor value[index] as Sum(index[index, from_])")
    assert s.mode == "replace" and s.target.name == "value"
    assert s.expr.fn == "sum" and s.expr.args[0].name == "index"


def test_multi_character_labels_and_scalars():
    s = one("s = SUM(X[row, col] * W[col])")
    assert s.target.labels is None
    assert [l.name for l in s.expr.args[0].left.labels] == ["row", "col"]


def test_einsum_form():
    s = one("C = EINSUM('...ij,...jk->...ik', A, B)")
    assert s.expr.fn == "einsum" and s.expr.args[0].value == "...ij,...jk->...ik"
    assert [a.name for a in s.expr.args[1:]] == ["A", "B"]


@pytest.mark.parametrize("text, mode", [("CREATE TENSOR C[i] AS A[i]", "create"),
                                        ("CREATE OR REPLACE TENSOR C[i] AS A[i]", "replace"),
                                        ("LET C[i] = A[i]", "let"), ("C[i] = A[i]", "assign")])
def test_modes(text, mode):
    assert one(text).mode == mode


def test_explain_options():
    s = one("EXPLAIN ANALYZE (FORMAT JSON) C[i] = A[i]")
    assert s.analyze and s.format == "json" and isinstance(s.statement, A.AssignStmt)
    s = one("EXPLAIN (FORMAT TEXT, ANALYZE) C[i] = A[i]")
    assert s.analyze and s.format == "text"
    assert isinstance(one("EXPLAIN ANALYZE SELECT 1"), A.SqlStmt)


def test_other_statements():
    assert one("DROP TENSOR IF EXISTS A").if_exists
    c = one("COPY C TO 'c.parquet' (FORMAT PARQUET)")
    assert (c.name, c.path, c.format) == ("C", "c.parquet", "parquet")
    assert one("COPY C TO 'c.csv' FORMAT csv").format == "csv"
    assert one("SET memory_limit = '2GB'").value == "2GB"
    assert one("SET workers TO 4").value == 4
    assert one("SET progress = off").value == "off"
    assert one("SHOW workers").name == "workers" and one("SHOW ALL").name is None


# -- syntax errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, found, expected, col", [
    ("C[i,k] = A[i,j] *", "the end of the statement", "a name", 17),
    ("C[i,k] = A[i,j] ** B[j,k]", "'*'", "a number", 17),
    ("CREATE TENSOR A (i 4, k)", "')'", "an integer", 23),
    ("C[i,k = A[i,j]", "'='", "']'", 6),
    ("LET = 3", "'='", "a name", 4),
    ("C[i] = A[i) + 1", "')'", "']'", 10),
    ("DROP TENSOR", "the end of the statement", "IF", 11),
    ("C[i] = A[i] $ 2", "'$'", "'+'", 12),
])
def test_syntax_errors_name_position_and_expected(text, found, expected, col):
    with pytest.raises(ParserError) as info:
        parse(text)
    err = info.value
    assert f"syntax error at {found}" in err.message
    assert "expected" in err.message and expected in err.message
    assert err.span.start == col
    lines = str(err).splitlines()
    assert lines[1].startswith("LINE 1: ") and lines[2].index("^") == len("LINE 1: ") + col


def test_syntax_error_on_a_later_line_names_that_line():
    text = "SELECT 1;\nC[i] = A[i) + 1"
    with pytest.raises(ParserError) as info:
        parse(text)
    assert "LINE 2: C[i] = A[i) + 1" in str(info.value)


def test_unclosed_subquery_and_explain_format():
    with pytest.raises(ParserError, match="not closed"):
        parse("CREATE TENSOR X FROM (SELECT 1")
    with pytest.raises(ParserError, match="TEXT, JSON or DOT"):
        parse("EXPLAIN (FORMAT XML) C[i] = A[i]")
    with pytest.raises(ParserError, match="needs a statement"):
        parse("EXPLAIN")
    with pytest.raises(ParserError, match="needs a query"):
        parse("CREATE TENSOR X FROM ( ) INDEX (a) VALUE v")


@pytest.mark.parametrize("text, message, caret", [
    ("EXPLAIN (FORMAT XML) C[i] = A[i]", "TEXT, JSON or DOT, not XML", "XML"),
    ("EXPLAIN ANALYZE (FORMAT 'yaml', ANALYZE) C[i] = A[i]", "not 'yaml'", "'yaml'"),
    ("EXPLAIN (FORMAT JSON", "not closed", "("),
    ("EXPLAIN ANALYZE (ANALYZE) (", "not closed", "("),
    ("EXPLAIN SHOW TENSORS", "tensor assignments", "SHOW TENSORS"),
])
def test_explain_option_errors_point_at_the_option(text, message, caret):
    """EXPLAIN's options are read by the grammar; an error's caret is under the word at fault."""
    with pytest.raises(ParserError, match=message) as info:
        parse(text)
    err = info.value
    assert text[err.span.start:err.span.end] == caret
    assert text.rindex(caret) == err.span.start  # the last one: ( of the unclosed list


@pytest.mark.parametrize("text, fmt, analyze", [
    ("EXPLAIN C[i] = A[i]", "text", False),
    ("explain analyze C[i] = A[i]", "text", True),
    ("EXPLAIN (FORMAT 'dot') C[i] = A[i]", "dot", False),
    ("EXPLAIN (FORMAT JSON ANALYZE) C[i] = A[i]", "json", True),
    ("EXPLAIN /* why */ (FORMAT json) -- the plan\n  C[i] = A[i]", "json", False),
])
def test_explain_options_and_the_statement_span(text, fmt, analyze):
    s = one(text)
    assert (s.format, s.analyze) == (fmt, analyze)
    assert at(text, s.statement.span) == "C[i] = A[i]"


@pytest.mark.parametrize("text", ["EXPLAIN (VERBOSE) SELECT 1", "EXPLAIN (FORMAT JSON) SELECT 1",
                                  "EXPLAIN (SELECT 1)", "EXPLAIN (FORMAT JSON C[i] = A[i]"])
def test_explain_that_is_not_ours_goes_to_duckdb_whole(text):
    s = one(text)
    assert isinstance(s, A.SqlStmt) and s.text == text
