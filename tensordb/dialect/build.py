"""lark's parse tree of one of our statements -> its AST (ast.py), every node with its span in
the whole script. The parser (parser.py) has checked the tree's depth; this walk only builds.

>>> from tensordb.dialect.parser import parse
>>> stmt = parse("C[i] = 2 * A[i]")[0]
>>> type(stmt.expr).__name__, stmt.expr.span, stmt.expr.right.name
('BinOp', Span(start=7, end=15), 'A')
"""
from __future__ import annotations

from lark import Token, Transformer, v_args
from lark.exceptions import GrammarError, VisitError

from ..errors import ParserError, Span
from . import ast as A

__all__ = ["build"]


def build(tree, script: str, base: int, queries: dict[int, str]) -> A.Statement:
    """The AST of ``tree``, a statement starting at ``base`` in ``script``; ``queries`` holds
    the text of ``FROM ( <query> )`` blanked before lark parsed it, by the position of its '('."""
    try:
        return _Build(script, base, queries).transform(tree)
    except VisitError as exc:  # lark wraps what the transformer raises
        raise exc.orig_exc if isinstance(exc.orig_exc, ParserError) else exc from None


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


# The dialect's comparison operators -> the names of the join language (NumPy's, Python's).
_COMPARISONS = {"=": "==", "<>": "!=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


# Integer literals longer than this are refused (int64 holds 19 digits; Python refuses to convert
# more than 4300 to text).
MAX_INT_DIGITS = 100


@v_args(meta=True)
class _Build(Transformer):
    """lark tree -> AST. Positions are shifted by the statement's offset in the script."""

    def __init__(self, script: str, base: int, queries: dict[int, str]) -> None:
        super().__init__(visit_tokens=False)  # no callback reads a token on its own
        self.script, self.base, self.queries = script, base, queries

    def _call_userfunc(self, tree, new_children=None):
        # What lark's v_args(meta=True) does, without making a wrapper per node (most of the
        # time of building a statement's AST went there).
        children = new_children if new_children is not None else tree.children
        fn = _RULES.get(tree.data)
        if fn is None:
            return self.__default__(tree.data, children, tree.meta)
        try:
            return fn(self, tree.meta, children)
        except GrammarError:
            raise
        except Exception as e:
            raise VisitError(tree.data, tree, e)

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

    def param(self, meta, c):
        return A.Param(str(c[0]), self.sp(meta))

    def string(self, meta, c):
        return A.String(_unquote(c[0]), self.sp(meta))

    def labels(self, meta, c):
        return tuple(A.Label(str(t), self.ts(t)) for t in _toks(c, "NAME"))

    def subscripts(self, meta, c):
        subs = [x for x in c if isinstance(x, (A.Label, tuple))]
        for k, x in enumerate(subs):
            if isinstance(x, tuple) and k:
                raise ParserError("a gather subscript (E[tok[b], d]) selects rows: it must be the "
                                  "first subscript", statement=self.script, span=x[1])
        if not subs or not isinstance(subs[0], tuple):
            return tuple(subs)
        name, span, labels = subs[0]
        return ("gather", name, span, len(labels), tuple(labels) + tuple(subs[1:]))

    def sub_gather(self, meta, c):
        return (str(c[0]), self.ts(c[0]), c[2] or ())

    def sub_label(self, meta, c):
        return A.Label(str(c[0]), self.ts(c[0]) if c[1] is None else self.sp(meta), c[1])

    def sub_range(self, meta, c):
        # A slice without a label: a label of its own (no name can hold ':'), aggregated.
        sp = self.sp(meta)
        return A.Label(f":{sp.start}", sp, c[0], anonymous=True)

    def range(self, meta, c):
        bounds = [x for x in c if not isinstance(x, Token)]
        return (bounds[0], bounds[1])

    def pos_bound(self, meta, c):
        return self._bound(meta, str(c[0]))

    def neg_bound(self, meta, c):
        return -self._bound(meta, str(c[1]))

    def _bound(self, meta, text: str) -> int:
        if len(text) > MAX_INT_DIGITS:
            raise ParserError(f"a slice bound of {len(text)} digits", statement=self.script,
                              span=self.sp(meta))
        return int(text)

    def ref(self, meta, c):
        subs = c[2]
        if isinstance(subs, tuple) and subs and subs[0] == "gather":
            _, index, ispan, n, labels = subs
            if any(isinstance(x, tuple) for x in labels):
                raise ParserError("one gather per tensor reference", statement=self.script,
                                  span=self.sp(meta))
            return A.Ref(str(c[0]), labels, self.sp(meta), self.ts(c[0]), (index, ispan, n))
        return A.Ref(str(c[0]), subs or (), self.sp(meta), self.ts(c[0]))

    def bare_ref(self, meta, c):
        return A.Ref(str(c[0]), None, self.sp(meta), self.ts(c[0]))

    def args(self, meta, c):
        return tuple(x for x in c if not isinstance(x, Token))

    def call(self, meta, c):
        fn, args = str(c[0]).lower(), c[2] or ()
        if fn == "softmax" and len(args) == 2 and isinstance(args[1], A.Ref) \
                and args[1].labels is None:  # SOFTMAX(x, j): j is a label, not a tensor
            args = (args[0], A.Label(args[1].name, args[1].span))
        return A.Call(fn, args, self.sp(meta), self.ts(c[0]))

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

    def compare(self, meta, c):
        """``a = b``, ``a <> b`` ...: a BinOp named as NumPy's operator (``==``, ``!=``, ...)."""
        op = _COMPARISONS[str(c[1])]
        return A.BinOp(op, c[0], c[2], self.sp(meta))

    def when(self, meta, c):
        return (c[1], c[3])

    def case(self, meta, c):
        """CASE WHEN c1 THEN a1 WHEN c2 THEN a2 ... ELSE b END: nested WHERE(c, a, b) calls,
        as numpy.where computes them (each WHEN tested in order; the first true one wins)."""
        whens = [x for x in c if isinstance(x, tuple)]
        expr, fn_span = c[-2], self.ts(c[0])
        for cond, value in reversed(whens):
            expr = A.Call("where", (cond, value, expr), self.sp(meta), fn_span)
        return expr

    def neg(self, meta, c):
        if isinstance(c[1], A.Number):
            return A.Number(-c[1].value, self.sp(meta))
        return A.Neg(c[1], self.sp(meta))

    def pos(self, meta, c):
        return c[1]

    # -- pieces --------------------------------------------------------------------------------
    def or_replace(self, meta, c):
        return True

    if_exists = or_replace

    def if_not_exists(self, meta, c):
        return self.sp(meta)  # true, and where a contradicting OR REPLACE puts its caret

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
        if c[1] and c[3]:  # as DuckDB refuses it for tables
            raise ParserError("CREATE OR REPLACE cannot go with IF NOT EXISTS", statement=self.script,
                              span=c[3], hint="OR REPLACE replaces an existing tensor and IF NOT "
                              "EXISTS keeps it: choose one")
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

    def opt_duplicates(self, meta, c):
        word = str(c[1]).lower()
        if word not in ("sum", "error"):
            raise ParserError(f"DUPLICATES {c[1]}: expected DUPLICATES SUM or DUPLICATES ERROR",
                              statement=self.script, span=self.ts(c[1]))
        return ("duplicates", word)

    def opt_fill(self, meta, c):
        return ("fill", c[1])

    def fill_value(self, meta, c):
        """FILL 0 | 1.5 | +inf | -inf | inf: the value of the entries the table leaves out."""
        sign = -1.0 if c[0] is not None and c[0].type == "MINUS" else 1.0
        tok = c[-1]
        if tok.type == "NAME" and str(tok).lower() not in ("inf", "infinity"):
            raise ParserError(f"FILL {tok}: expected a number, +inf or -inf",
                              statement=self.script, span=self.ts(tok))
        return sign * float("inf" if tok.type == "NAME" else str(tok))

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
                          self.ts(name), sspan, opts.get("duplicates"), opts.get("fill"))

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


# The callbacks of _Build by rule name, as plain functions (``_call_userfunc``).
_RULES = {name: getattr(f, "base_func", f) for name, f in vars(_Build).items()
          if not name.startswith("_") and callable(getattr(f, "base_func", f))
          and name not in ("sp", "ts")}
