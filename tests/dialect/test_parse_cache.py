"""Statements parsed again are not parsed again (dialect/parser.py keeps lark's trees by
statement text): the AST of a statement found in the cache equals the one a fresh parse gives,
with spans where the statement sits in its own script; what fails to parse fails every time."""
from __future__ import annotations

import pytest

from tensordb.dialect import parse
from tensordb.dialect.parser import MAX_EXPRESSION_DEPTH, _TREES, forget_parsed
from tensordb.errors import ParserError

STATEMENTS = [
    "H1[b,f] = RELU(SUM(H0[b,d] * W1[d,f]) + c1[f])",
    "C[i,k] = SUM(A[i,j] * B[j,k]) WITH (PIECES i 4)",
    "LET T[i] = 2.5 * A[i,j]",
    "CREATE TENSOR Z FROM (SELECT i, j, sin(i + j) AS v FROM range(6) r(i), range(4) s(j))",
    "EXPLAIN (FORMAT JSON) C[i] = MAX(A[i,j])",
]


def _fresh(script):
    forget_parsed()
    try:
        return parse(script)
    finally:
        forget_parsed()


@pytest.mark.parametrize("stmt", STATEMENTS)
def test_a_statement_parsed_again_is_the_statement_parsed_afresh(stmt):
    forget_parsed()
    alone = parse(stmt)
    later = f"SELECT 1;\n  {stmt};  {stmt}"  # the same text at two other offsets
    again = parse(later)
    assert alone == _fresh(stmt)
    assert again == _fresh(later)
    assert again[1].span.start == later.index(stmt) and again[2].span.start == later.rindex(stmt)
    assert later[again[2].span.start:again[2].span.end] == stmt


@pytest.mark.parametrize("bad", ["C[i,k] = SUM(A[i,j] * ", "C[i] = " + "(" * (MAX_EXPRESSION_DEPTH + 5)
                                 + "A[i]" + ")" * (MAX_EXPRESSION_DEPTH + 5)])
def test_what_fails_to_parse_fails_every_time_at_its_own_place(bad):
    forget_parsed()
    carets = []
    for script in (bad, "SELECT 1; " + bad):
        for _ in range(2):
            with pytest.raises(ParserError) as err:
                parse(script)
            carets.append(err.value.span.start - script.index(bad))
    assert len(set(carets)) == 1
    assert _TREES.get(bad) is None


def test_a_script_parsed_again_is_the_script_parsed_afresh():
    """A whole script run again comes from the script cache: the same statements (spans in
    the script, LETs, SQL between them) as a fresh parse, in a list of its own."""
    from tensordb.dialect.parser import _SCRIPTS
    script = "; ".join(STATEMENTS) + "; SELECT 42"
    want = _fresh(script)
    first = parse(script)
    assert _SCRIPTS.get(script) is not None
    again = parse(script)
    assert first == again == want
    again.pop()  # the caller's list: the cache keeps its own
    assert parse(script) == want
    forget_parsed()
    assert _SCRIPTS.get(script) is None


def test_a_script_that_fails_is_not_kept():
    from tensordb.dialect.parser import _SCRIPTS
    script = STATEMENTS[0] + "; C[i = A[i]"
    for _ in range(2):
        with pytest.raises(ParserError):
            parse(script)
    assert _SCRIPTS.get(script) is None
