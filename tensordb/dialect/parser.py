"""Text -> statements (AST with spans into the full script).

A statement is ours when its first words say so (CREATE TENSOR, LOAD TENSOR, LET, EXPLAIN of one of
ours, SHOW TENSORS/ALL/<setting>, DESCRIBE <name>, DROP TENSOR, COPY <name> TO, SET <setting>,
BEGIN/COMMIT/ROLLBACK, or an assignment ``name[...] =`` / ``name =``); everything else is plain
SQL for DuckDB.

>>> [type(s).__name__ for s in parse("C[i,k] = A[i,j] * B[j,k]; SELECT 42")]
['AssignStmt', 'SqlStmt']
"""
from __future__ import annotations

import functools

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken,
                             VisitError)

from ..errors import ParserError, Span, closest_keyword as _closest_keyword
from . import ast as A
from .grammar import EXPLAIN_FORMATS, READABLE, explain_grammar, grammar
from .lexer import _DOLLAR, Word, split, words

__all__ = ["parse", "parse_statement", "classify"]

# The names of tensordb's settings (config.Settings; a test checks they agree): ``SET workers``
# and ``SHOW workers`` are ours, any other SET or SHOW is DuckDB's.
SETTINGS = ("workers", "memory_limit", "executor", "tiling", "progress")
_SETTINGS = frozenset(SETTINGS)


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(grammar(), parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse(script: str) -> list[A.Statement]:
    """Every statement of ``script``; raises ParserError (with a caret) on the first bad one."""
    return [parse_statement(script, span) for span in split(script)]


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
    if _is_ident(w[0]) and len(w) >= 2 and w[1].text in ("[", "="):
        return "ours"
    return "sql"


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
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, script, span, text) from None
    _check_depth(tree, script, span.start)
    try:
        return _Build(script, span.start, queries).transform(tree)
    except VisitError as exc:  # lark wraps what the transformer raises
        raise exc.orig_exc if isinstance(exc.orig_exc, ParserError) else exc from None


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
    pos = min(pos, len(text))
    end = pos + 1 if pos < len(text) else pos
    return ParserError(msg, statement=script, span=Span(span.start + pos, span.start + end), hint=hint)


def _span(meta, base: int) -> Span:
    if getattr(meta, "empty", True):
        return Span(base, base)
    return Span(base + meta.start_pos, base + meta.end_pos)


def _tspan(tok: Token, base: int) -> Span:
    return Span(base + tok.start_pos, base + tok.end_pos)


def _unquote(tok: Token) -> str:
    return str(tok)[1:-1].replace("''", "'")


def _toks(children, kind: str) -> list[Token]:
    return [c for c in children if isinstance(c, Token) and c.type == kind]


# Integer literals longer than this are refused (int64 holds 19 digits; Python refuses to convert
# more than 4300 to text).
MAX_INT_DIGITS = 100


@v_args(meta=True)
class _Build(Transformer):
    """lark tree -> AST. Positions are shifted by the statement's offset in the script."""

    def __init__(self, script: str, base: int, queries: dict[int, str]) -> None:
        super().__init__()
        self.script, self.base, self.queries = script, base, queries

    def sp(self, meta) -> Span:
        return _span(meta, self.base)

    def ts(self, tok: Token) -> Span:
        return _tspan(tok, self.base)

    def start(self, meta, c):
        return c[0]

    # -- expressions ---------------------------------------------------------------------------
    def number(self, meta, c):
        # `2` is an int and `2.0` a float, as in Python: literals are weak scalars (NEP 50).
        text = str(c[0])
        if text.isdigit() and len(text) > MAX_INT_DIGITS:
            raise ParserError(f"an integer literal of {len(text)} digits: at most {MAX_INT_DIGITS}",
                              hint="write it as a float (1e30) if that is what you mean",
                              statement=self.script, span=self.sp(meta))
        value = int(text) if text.isdigit() else float(text)
        return A.Number(value, self.sp(meta))

    def string(self, meta, c):
        return A.String(_unquote(c[0]), self.sp(meta))

    def labels(self, meta, c):
        return tuple(A.Label(str(t), self.ts(t)) for t in _toks(c, "NAME"))

    def ref(self, meta, c):
        return A.Ref(str(c[0]), c[2] or (), self.sp(meta), self.ts(c[0]))

    def bare_ref(self, meta, c):
        return A.Ref(str(c[0]), None, self.sp(meta), self.ts(c[0]))

    def args(self, meta, c):
        return tuple(x for x in c if not isinstance(x, Token))

    def call(self, meta, c):
        return A.Call(str(c[0]).lower(), c[2] or (), self.sp(meta), self.ts(c[0]))

    def paren(self, meta, c):
        return c[1]

    def chain(self, meta, c):
        """``a + b - c ...``: nested BinOps, left to right; a Chain when longer than CHAIN_LIMIT."""
        first, rest = c[0], tuple((str(c[k]), c[k + 1]) for k in range(1, len(c), 2))
        if len(rest) > A.CHAIN_LIMIT:
            return A.Chain(first, rest, Span(first.span.start, rest[-1][1].span.end))
        expr = first
        for op, operand in rest:
            expr = A.BinOp(op, expr, operand, Span(first.span.start, operand.span.end))
        return expr

    sum = product = chain

    def neg(self, meta, c):
        if isinstance(c[1], A.Number):
            return A.Number(-c[1].value, self.sp(meta))
        return A.Neg(c[1], self.sp(meta))

    def pos(self, meta, c):
        return c[1]

    # -- pieces --------------------------------------------------------------------------------
    def or_replace(self, meta, c):
        return True

    if_not_exists = if_exists = or_replace

    def named_dim(self, meta, c):
        return A.Dim(str(c[0]), int(c[1]), self.sp(meta))

    def bare_dim(self, meta, c):
        return A.Dim(None, int(c[0]), self.sp(meta))

    def named_value(self, meta, c):
        return A.LabelValue(str(c[0]), int(c[1]), self.sp(meta))

    def bare_value(self, meta, c):
        return A.LabelValue(None, int(c[0]), self.sp(meta))

    def tile(self, meta, c):
        return tuple(x for x in c if isinstance(x, A.LabelValue))

    def dimnames(self, meta, c):
        return tuple(A.Label(str(t), self.ts(t)) for t in _toks(c, "NAME"))

    def bare_target(self, meta, c):
        return A.Target(str(c[0]), None, self.sp(meta), self.ts(c[0]))

    def labeled_target(self, meta, c):
        return A.Target(str(c[0]), c[2] or (), self.sp(meta), self.ts(c[0]))

    def with_clause(self, meta, c):
        # PIECES lists its label values; the old TILE (...) groups come as tuples of them.
        return tuple(p for x in c if isinstance(x, (tuple, A.LabelValue))
                     for p in (x if isinstance(x, tuple) else (x,)))

    # -- statements ----------------------------------------------------------------------------
    def create_zeros(self, meta, c):
        names = _toks(c, "NAME")
        name = names[0]
        dtype_tok = names[1] if len(names) > 1 else None
        dims = tuple(x for x in c if isinstance(x, A.Dim))
        tile = c[-1] if isinstance(c[-1], tuple) else None
        dspan = self.ts(dtype_tok) if dtype_tok is not None else self.sp(meta)
        return A.CreateStmt(str(name), dims, str(dtype_tok) if dtype_tok else "float64", tile,
                            bool(c[1]), bool(c[3]), self.sp(meta), self.ts(name), dspan)

    def src_file(self, meta, c):
        return ("path", _unquote(c[0]), self.sp(meta))

    def src_query(self, meta, c):
        query = self.queries.get(self.base + c[0].start_pos, "")
        return ("query", query, self.sp(meta))

    def src_table(self, meta, c):
        return ("table", str(c[0]), self.sp(meta))

    def opt_format(self, meta, c):
        return ("format", str(c[1]).lower())

    def opt_array(self, meta, c):
        return ("array", _unquote(c[1]))

    def opt_index(self, meta, c):
        return ("index", tuple(str(t) for t in _toks(c, "NAME")))

    def opt_value(self, meta, c):
        return ("value", str(c[1]))

    def opt_shape(self, meta, c):
        return ("shape", tuple(int(t) for t in _toks(c, "INT")))

    def opt_tile(self, meta, c):
        return ("tile", c[0])

    def _load(self, meta, c):
        name = next(x for x in c if isinstance(x, Token) and x.type == "NAME")
        dims = next((x for x in c if isinstance(x, tuple) and x and isinstance(x[0], A.Label)), None)
        source = next(x for x in c if isinstance(x, tuple) and len(x) == 3 and x[0] in ("path", "query", "table"))
        opts: dict = {}
        for x in c:
            if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str):
                if x[0] in opts:
                    raise ParserError(f"option {x[0].upper()} is given twice", statement=self.script,
                                      span=self.sp(meta))
                opts[x[0]] = x[1]
        kind, value, sspan = source
        if kind == "query" and not value:
            raise ParserError("FROM ( ) needs a query", statement=self.script, span=sspan)
        return A.LoadStmt(str(name), dims, value if kind == "path" else None,
                          value if kind == "query" else None, value if kind == "table" else None,
                          opts.get("format"), opts.get("array"), opts.get("index"), opts.get("value"),
                          opts.get("shape"), opts.get("tile"), bool(c[1]), self.sp(meta),
                          self.ts(name), sspan)

    create_load = load = _load

    def _assign(self, meta, c, mode):
        target = next(x for x in c if isinstance(x, A.Target))
        expr = c[c.index(target) + 2]
        pieces = c[-1] if isinstance(c[-1], tuple) else ()
        return A.AssignStmt(target, expr, pieces, mode, self.sp(meta))

    def create_as(self, meta, c):
        return self._assign(meta, c, "replace" if c[1] else "create")

    def assign(self, meta, c):
        return self._assign(meta, c, "assign")

    def let(self, meta, c):
        return self._assign(meta, c, "let")

    def show_tensors(self, meta, c):
        return A.ShowTensorsStmt(self.sp(meta))

    def show_all(self, meta, c):
        return A.ShowSettingStmt(None, self.sp(meta))

    def show_setting(self, meta, c):
        return A.ShowSettingStmt(str(c[1]).lower(), self.sp(meta))

    def describe(self, meta, c):
        return A.DescribeStmt(str(c[-1]), self.sp(meta), self.ts(c[-1]))

    def drop(self, meta, c):
        return A.DropStmt(str(c[-1]), bool(c[2]), self.sp(meta), self.ts(c[-1]))

    def copy_format(self, meta, c):
        return str(_toks(c, "NAME")[0]).lower()

    def copy(self, meta, c):
        return A.CopyStmt(str(c[1]), _unquote(c[3]), c[4], self.sp(meta), self.ts(c[1]))

    def set_number(self, meta, c):
        v = float(c[0])
        return int(v) if v.is_integer() and "." not in str(c[0]) else v

    def set_negative(self, meta, c):
        return -self.set_number(meta, c[1:])

    def set_string(self, meta, c):
        return _unquote(c[0])

    def set_name(self, meta, c):
        return str(c[0])

    def set(self, meta, c):
        return A.SetStmt(str(c[1]).lower(), c[3], self.sp(meta))

    def check_tensor(self, meta, c):
        return A.CheckStmt(str(c[2]), self.sp(meta), self.ts(c[2]))

    def check_database(self, meta, c):
        return A.CheckStmt(None, self.sp(meta), None)

    def begin(self, meta, c):
        return A.BeginStmt(self.sp(meta))

    def commit(self, meta, c):
        return A.CommitStmt(self.sp(meta))

    def rollback(self, meta, c):
        return A.RollbackStmt(self.sp(meta))
