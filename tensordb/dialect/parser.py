"""Text -> statements (AST with spans into the full script).

A statement is ours when its first words say so (CREATE TENSOR, LOAD TENSOR, LET, EXPLAIN of one of
ours, SHOW TENSORS/ALL/<setting>, DESCRIBE <name>, DROP TENSOR, COPY <name> TO, SET <setting>,
BEGIN/COMMIT/ROLLBACK, or an assignment ``name[...] =`` / ``name =``); everything else is plain
SQL for DuckDB. Ours are parsed by lark (grammar.py), their depth checked here, and the tree
becomes the AST in build.py.

>>> [type(s).__name__ for s in parse("C[i,k] = A[i,j] * B[j,k]; SELECT 42")]
['AssignStmt', 'SqlStmt']
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import ParserError, Span, closest_keyword as _closest_keyword
from . import ast as A
from .build import build
from .grammar import EXPLAIN_FORMATS, READABLE, explain_grammar, grammar
from .lexer import _DOLLAR, Word, split, words

__all__ = ["parse", "parse_statement", "classify", "forget_parsed"]

# The names of tensordb's settings (config.Settings; a test checks they agree): ``SET workers``
# and ``SHOW workers`` are ours, any other SET or SHOW is DuckDB's.
SETTINGS = ("workers", "memory_limit", "executor", "tiling", "progress", "quiet",
            "blas_one_call", "pin_workers")
_SETTINGS = frozenset(SETTINGS)


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(grammar(), parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse(script: str) -> list[A.Statement]:
    """Every statement of ``script``; raises ParserError (with a caret) on the first bad one.
    A script parsed before is not split, parsed or built again: its statements (frozen ASTs)
    are kept by its text, as a training loop runs the same step text each time."""
    kept = _SCRIPTS.get(script)
    if kept is not None:
        return list(kept)
    statements = [parse_statement(script, span) for span in split(script)]
    if len(script) <= _SCRIPT_MAX:
        _SCRIPTS.put(script, tuple(statements))
    return statements


def parse_statement(script: str, span: Span) -> A.Statement:
    w = words(script, span.start, span.end)
    if w and w[0].upper == "EXPLAIN":
        return _explain(script, span)
    if classify(w) == "sql":
        return A.SqlStmt(script[span.start:span.end], span)
    return _parse_ours(script, span)


def _is_ident(word: Word) -> bool:
    return word.text[:1].isalpha() or word.text[:1] == "_"


def classify(w: list[Word]) -> str:
    """'ours' or 'sql', from the first words of a statement."""
    up = [x.upper for x in w]
    if not up:
        return "sql"
    first = up[0]
    nxt = up[1:]
    if first == "CREATE":
        return "ours" if nxt[:1] == ["TENSOR"] or nxt[:3] == ["OR", "REPLACE", "TENSOR"] else "sql"
    if first == "LOAD":
        return "ours" if nxt[:1] == ["TENSOR"] or nxt[:3] == ["OR", "REPLACE", "TENSOR"] else "sql"
    if first == "LET":
        return "ours"
    if first == "SHOW":
        if nxt[:1] in (["TENSORS"], ["TENSOR"]) or nxt == ["ALL"]:
            return "ours"
        return "ours" if len(w) == 2 and w[1].text.lower() in _SETTINGS else "sql"
    if first in ("DESCRIBE", "DESC"):
        return "ours" if len(w) == 2 and _is_ident(w[1]) else "sql"
    if first == "DROP":
        return "ours" if nxt[:1] == ["TENSOR"] else "sql"
    if first == "COPY":
        return "ours" if len(w) >= 3 and _is_ident(w[1]) and up[2] == "TO" else "sql"
    if first == "SET":
        return "ours" if len(w) >= 2 and w[1].text.lower() in _SETTINGS else "sql"
    if first in ("BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"):
        return "ours"
    if first == "CHECK" and nxt[:1] in (["TENSOR"], ["DATABASE"]):
        return "ours"
    if _is_ident(w[0]) and first not in _SQL_LEADS and len(w) >= 2 and w[1].text in ("[", "="):
        return "ours"
    return "sql"


# A query that begins with a list (SELECT [1, 2]) looks like an assignment to a tensor named
# SELECT, which DuckDB reserves: it is SQL. (Unreserved words such as CALL, PRAGMA or VALUES
# may name tensors, and assigning to them stays ours.)
_SQL_LEADS = frozenset({"SELECT"})


@functools.lru_cache(maxsize=1)
def _explain_lark() -> Lark:
    return Lark(explain_grammar(), start="explain", parser="lalr", maybe_placeholders=True)


def _explain(script: str, span: Span) -> A.Statement:
    """EXPLAIN [ANALYZE] [(FORMAT TEXT | JSON | DOT [, ANALYZE])] <statement>: the options by the
    grammar's ``explain`` rule; the statement explained is parsed as any statement is."""
    text = script[span.start:span.end]
    ip = _explain_lark().parse_interactive(text)
    opened = prev = None  # the '(' of an option list not yet closed; the token before
    try:
        for tok in ip.iter_parse():
            if tok.type == "LPAR":
                opened = tok
            elif tok.type == "RPAR":
                opened = None
            elif prev is not None and prev.type == "FORMAT":
                _check_format(script, span.start, tok)
            prev = tok
        tree = ip.feed_eof()
    except UnexpectedInput as exc:
        at_end = isinstance(exc, UnexpectedEOF) or \
            (isinstance(exc, UnexpectedToken) and exc.token.type == "$END")
        if opened is not None and at_end:
            raise ParserError("EXPLAIN options are not closed: expected ')'", statement=script,
                              span=Span(span.start + opened.start_pos, span.start + opened.start_pos + 1)
                              ) from None
        # Not our option list: let DuckDB judge the whole EXPLAIN.
        return A.SqlStmt(text, span)
    opts = [t for t in tree.iter_subtrees_topdown() if t.data in ("analyze", "format")]
    analyze = any(t.data == "analyze" for t in opts)
    fmt = next((str(t.children[1]).strip("'").lower() for t in reversed(opts) if t.data == "format"),
               "text")
    rest = tree.children[-1]  # [REST]: None when EXPLAIN has nothing to explain
    if rest is None:
        raise ParserError("EXPLAIN needs a statement to explain", statement=script,
                          span=Span(span.end, span.end))
    inner_span = Span(span.start + rest.start_pos, span.end)
    inner = parse_statement(script, inner_span)
    if isinstance(inner, A.SqlStmt):
        return A.SqlStmt(text, span)
    if not isinstance(inner, A.AssignStmt):
        raise ParserError("EXPLAIN works on tensor assignments (and on plain SQL)", statement=script,
                          span=inner_span)
    return A.ExplainStmt(inner, analyze, fmt, span)


def _check_format(script: str, base: int, tok: Token) -> None:
    if str(tok).strip("'").lower() not in EXPLAIN_FORMATS:
        raise ParserError(f"EXPLAIN format must be TEXT, JSON or DOT, not {tok}", statement=script,
                          span=Span(base + tok.start_pos, base + tok.start_pos + len(tok)))


# -- our statements: lark -----------------------------------------------------------------------

def _blank_subquery(script: str, span: Span) -> tuple[str, dict[int, str]]:
    """Replace the text of ``FROM ( <query> )`` with spaces (same length, so positions hold) and
    return it by the position of its '('; lark cannot parse arbitrary SQL, DuckDB will."""
    text = script[span.start:span.end]
    if "from" not in text.lower():  # most statements: no word to look for
        return text, {}
    w = words(script, span.start, span.end, 64)
    for k, word in enumerate(w[:-1]):
        if word.upper == "FROM" and w[k + 1].text == "(":
            open_at = w[k + 1].start - span.start
            close_at, comment_end = _matching_paren(text, open_at)
            if close_at is None:
                raise ParserError("the query after FROM is not closed: expected ')'",
                                  statement=script, span=Span(w[k + 1].start, w[k + 1].start + 1))
            query = text[open_at + 1:close_at].strip()
            if comment_end is not None and comment_end >= text.rindex(query, 0, close_at) + len(query):
                query += "\n"  # it ends in a -- comment: keep the line break that closes it
            blanked = text[:open_at + 1] + " " * (close_at - open_at - 1) + text[close_at:]
            return blanked, {open_at + span.start: query}
    return text, {}


def _matching_paren(text: str, open_at: int) -> tuple[int | None, int | None]:
    """The position of the ')' closing the '(' at ``open_at`` (None if unclosed), skipping
    strings, quoted names, dollar-quoted strings and comments as the statement splitter does;
    and the position of the line break that ends the last ``--`` comment seen (or None)."""
    depth, i, n = 0, open_at, len(text)
    comment_end = None
    while i < n:
        c = text[i]
        if c in "'\"":
            j = text.find(c, i + 1)
            if j < 0:
                return None, comment_end
            i = j + 1
            continue
        if c == "$" and (m := _DOLLAR.match(text, i)) and \
                not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            j = text.find(m.group(0), m.end())
            if j < 0:
                return None, comment_end
            i = j + len(m.group(0))
            continue
        if text.startswith("--", i):
            j = text.find("\n", i)
            comment_end = j
            i = n if j < 0 else j + 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i, comment_end
        i += 1
    return None, comment_end


def _parse_ours(script: str, span: Span) -> A.Statement:
    text, queries = _blank_subquery(script, span)
    tree = _TREES.get(text)
    if tree is None:
        try:
            tree = _lark().parse(text)
        except UnexpectedInput as exc:
            raise _syntax_error(exc, script, span, text) from None
        _check_depth(tree, script, span.start)
        _TREES.put(text, tree)
    return build(tree, script, span.start, queries)


class _Kept:
    """The last ``capacity`` values parsed, by their text (least recently used goes first).

    ``_TREES``: lark's trees of the statements parsed lately: a statement run again (a training
    loop's, a dashboard's) is not parsed again. A tree's positions are relative to its
    statement and nothing changes it (build.py reads it), so one serves wherever the text
    appears. ``_SCRIPTS``: whole scripts' statements (their spans are the script's own). Only
    what parsed and passed the depth check is kept."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str):
        with self._lock:
            value = self._kept.get(text)
            if value is not None:
                self._kept.move_to_end(text)
            return value

    def put(self, text: str, value) -> None:
        with self._lock:
            self._kept[text] = value
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


_TREES = _Kept()
_SCRIPTS = _Kept(capacity=128)
_SCRIPT_MAX = 1 << 16  # characters: a longer script is parsed statement by statement each time


def forget_parsed() -> None:
    """Forget the statements parsed so far (a benchmark measuring parsing, tests)."""
    _TREES.clear()
    _SCRIPTS.clear()


# The deepest parse tree a statement may have: every later stage (the AST builder, the binder, the
# join evaluator in the kernels) walks expressions recursively, and this bound keeps each well
# inside Python's recursion limit. A chain like ``a + b + c`` is one level per operator. The same
# bound as plan.scalar.MAX_EXPRESSION_DEPTH (the IR's, for joins built in Python; a test checks
# they agree).
MAX_EXPRESSION_DEPTH = 200


def _check_depth(tree, script: str, base: int) -> None:
    """Refuse a tree nested deeper than MAX_EXPRESSION_DEPTH, with a caret at the operator or
    parenthesis that goes too deep. lark's LALR parser builds the tree without recursion, so the
    depth is measured here, iteratively, before anything recursive sees the tree. A chain
    ``a + b + c`` (one flat node) counts one level per operator, as the BinOps it becomes, but
    at most CHAIN_LIMIT: a longer one is computed in parts of that length."""
    stack = [(tree, 0)]
    deepest, where = 0, None
    while stack:
        node, above = stack.pop()
        ops = (len(node.children) - 1) // 2 if node.data in ("sum", "product") else 1
        depth = above + min(ops, A.CHAIN_LIMIT)
        if depth > deepest:
            deepest = depth
            if where is None and depth > MAX_EXPRESSION_DEPTH:
                tok = next((c for c in node.children if isinstance(c, Token)), None)
                where = tok.start_pos if tok is not None else getattr(node.meta, "start_pos", 0)
        stack.extend((c, depth) for c in node.children if isinstance(c, Tree))
    if where is not None:
        raise ParserError(f"the expression is nested too deeply: {deepest} levels, at most "
                          f"{MAX_EXPRESSION_DEPTH} (each parenthesis, function call and sign is a "
                          f"level, and each operator of a chain such as a + b + c, up to "
                          f"{A.CHAIN_LIMIT} per chain)",
                          statement=script, span=Span(base + where, base + where + 1),
                          hint="split it into several statements, each computing a partial result")


def _syntax_error(exc: UnexpectedInput, script: str, span: Span, text: str) -> ParserError:
    expected: set[str] = set()
    if isinstance(exc, UnexpectedToken):
        expected = set(exc.expected) | set(getattr(exc, "accepts", None) or ())
        tok = exc.token
        if tok.type == "$END":
            pos, found = len(text), "the end of the statement"
        else:
            pos, found = tok.start_pos, repr(str(tok))
    elif isinstance(exc, UnexpectedCharacters):
        expected = set(exc.allowed or ())
        pos, found = exc.pos_in_stream, repr(text[exc.pos_in_stream])
    elif isinstance(exc, UnexpectedEOF):
        expected = set(exc.expected)
        pos, found = len(text), "the end of the statement"
    else:  # pragma: no cover - lark has no other kinds
        pos, found = 0, "this"
    names = sorted({READABLE.get(e, e.lower()) for e in expected if not e.startswith("__")})
    before = [w.upper for w in words(text, 0, min(pos, len(text)))]
    if "NAME" in expected and before and (before[-1] in ("TENSOR", "DESCRIBE", "DESC", "COPY") or
                                          before[-2:] == ["IF", "EXISTS"]):
        names = ["a tensor name" if n == READABLE["NAME"] else n for n in names]
    if len(names) > 8:
        names = names[:8] + ["..."]
    msg = f"syntax error at {found}"
    if names:
        msg += ": expected " + (names[0] if len(names) == 1 else "one of " + ", ".join(names))
    hint = None
    typed = found.strip("'")
    if found.startswith("'") and typed.isidentifier():  # a misspelt keyword: FORM for FROM
        kws = [e for e in expected if e in READABLE and READABLE[e] == e]
        close = _closest_keyword(typed.upper(), kws) if kws else None
        hint = f"did you mean {close}?" if close else None
    if isinstance(exc, UnexpectedToken) and exc.token.type in _COMPARING and "NAME" not in expected:
        hint = "a comparison is not associative: write (a < b) * (b < c) for both, or put " \
               "one comparison in parentheses"
    elif isinstance(exc, UnexpectedToken) and exc.token.type == "END" and "ELSE" in expected:
        hint = "CASE needs an ELSE: CASE WHEN c THEN a ELSE b END"
    pos = min(pos, len(text))
    end = pos + 1 if pos < len(text) else pos
    return ParserError(msg, statement=script, span=Span(span.start + pos, span.start + end), hint=hint)


# The comparison operators' terminals (grammar.py): a second comparison in a row is refused.
_COMPARING = frozenset({"EQ", "NE", "LT", "LE", "GT", "GE"})
