"""The grammar of our statements (lark, LALR). Plain SQL never reaches it: see parser.classify.

Keywords are case-insensitive and only reserved where the grammar expects them (lark's contextual
lexer), so ``value`` or ``index`` still work as tensor names and labels. Function names are plain
names: the binder checks them, so an unknown function gets a precise error instead of a syntax one.
"""
from __future__ import annotations

KEYWORDS = (
    "CREATE", "OR", "REPLACE", "TENSOR", "IF", "NOT", "EXISTS", "FROM", "FORMAT", "ARRAY", "INDEX",
    "VALUE", "SHAPE", "TILE", "PIECES", "AS", "LOAD", "LET", "WITH", "SHOW", "TENSORS", "ALL", "DESCRIBE",
    "DESC", "DROP", "COPY", "TO", "SET", "BEGIN", "START", "TRANSACTION", "COMMIT", "END",
    "ROLLBACK", "ABORT", "DATABASE", "DUPLICATES", "CASE", "WHEN", "THEN", "ELSE", "FILL",
)

_RULES = r"""
start: create_zeros | create_load | load | create_as | assign | let
     | show | describe | drop | copy | set | begin | commit | rollback | check

or_replace: OR REPLACE
if_not_exists: IF NOT EXISTS
if_exists: IF EXISTS

create_zeros: CREATE [or_replace] TENSOR [if_not_exists] NAME LPAR dim (COMMA dim)* RPAR [NAME] [tile]
dim: NAME INT -> named_dim
   | INT -> bare_dim

create_load: CREATE [or_replace] TENSOR NAME [dimnames] FROM source load_opt*
load: LOAD [or_replace] TENSOR NAME [dimnames] FROM source load_opt*
dimnames: LPAR NAME (COMMA NAME)* RPAR
source: STRING -> src_file
      | LPAR RPAR -> src_query
      | NAME -> src_table
load_opt: FORMAT NAME -> opt_format
        | ARRAY STRING -> opt_array
        | INDEX LPAR NAME (COMMA NAME)* RPAR -> opt_index
        | VALUE NAME -> opt_value
        | SHAPE LPAR INT (COMMA INT)* RPAR -> opt_shape
        | DUPLICATES NAME -> opt_duplicates
        | FILL fill_value -> opt_fill
        | tile -> opt_tile
fill_value: [PLUS | MINUS] (NUMBER | NAME)
tile: TILE LPAR label_value (COMMA label_value)* RPAR
label_value: NAME INT -> named_value
           | INT -> bare_value

create_as: CREATE [or_replace] TENSOR target AS expr [with_clause]
assign: target EQ expr [with_clause]
let: LET target EQ expr [with_clause]
target: NAME -> bare_target
      | NAME LSQB [labels] RSQB -> labeled_target
labels: NAME (COMMA NAME)*
// WITH (TILE (i 4)) is the old spelling of WITH (PIECES i 4), still accepted
with_clause: WITH LPAR PIECES label_value (COMMA label_value)* RPAR
           | WITH LPAR tile (COMMA tile)* RPAR

// A comparison is not associative (a < b < c is refused): SQL and Python read it differently.
?expr: comparison
?comparison: sum
    | sum (EQ | NE | LT | LE | GT | GE) sum -> compare
?sum: product ((PLUS | MINUS) product)*
?product: unary ((STAR | SLASH) unary)*
?unary: atom
    | MINUS unary -> neg
    | PLUS unary -> pos
?atom: NUMBER -> number
    | STRING -> string
    | NAME LSQB [subscripts] RSQB -> ref
    | NAME -> bare_ref
    | NAME LPAR [args] RPAR -> call
    | PARAM -> param
    | LPAR expr RPAR -> paren
    | CASE when+ ELSE expr END -> case
    | CASE LSQB [labels] RSQB -> ref       // a tensor named case, as any other name
    | CASE -> bare_ref
when: WHEN expr THEN expr
args: expr (COMMA expr)*
// A tensor reference's subscripts: labels, and slices (X[i 0:100, d]; a bare 0:100 has a label
// of its own, aggregated), numpy's half-open ranges with Python's negative and omitted bounds;
// a gather, E[tok[b], d]: the rows of E that the values of tok select.
subscripts: subscript (COMMA subscript)*
subscript: NAME [range] -> sub_label
         | range -> sub_range
         | NAME LSQB labels RSQB -> sub_gather
range: [bound] COLON [bound]
bound: INT -> pos_bound
     | MINUS INT -> neg_bound

show: SHOW TENSORS -> show_tensors
    | SHOW ALL -> show_all
    | SHOW NAME -> show_setting
describe: (DESCRIBE | DESC) NAME
        | SHOW TENSOR NAME
drop: DROP TENSOR [if_exists] NAME
copy: COPY NAME TO STRING [copy_format]
check: CHECK TENSOR NAME -> check_tensor
     | CHECK DATABASE -> check_database
copy_format: LPAR FORMAT NAME RPAR | FORMAT NAME
set: SET NAME (EQ | TO) set_value
set_value: NUMBER -> set_number
    | MINUS NUMBER -> set_negative
    | STRING -> set_string
    | NAME -> set_name
begin: BEGIN [TRANSACTION] | START TRANSACTION
commit: COMMIT [TRANSACTION] | END [TRANSACTION]
rollback: ROLLBACK [TRANSACTION] | ABORT [TRANSACTION]

NAME: /[^\W\d]\w*/
INT: /\d+/
NUMBER: /(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?/
PARAM: /\?|\$\d+|\$[^\W\d]\w*/
STRING: /'(?:[^']|'')*'/
LPAR: "("
RPAR: ")"
LSQB: "["
RSQB: "]"
COMMA: ","
COLON: ":"
EQ: "="
NE: "<>" | "!="
LE: "<="
GE: ">="
LT: "<"
GT: ">"
PLUS: "+"
MINUS: "-"
STAR: "*"
SLASH: "/"

COMMENT: /--[^\n]*/ | /\/\*(.|\n)*?\*\//
%import common.WS
%ignore WS
%ignore COMMENT
"""


# CHECK is a keyword only before TENSOR or DATABASE (comments may come between), so a tensor
# named ``check`` can still be assigned at the start of a statement: ``check[i] = ...``.
_CHECK = r"/check\b(?=(?:\s|--[^\n]*|\/\*(?:.|\n)*?\*\/)*(?:tensor|database)\b)/i"


def grammar() -> str:
    # Keywords outrank NAME (priority 2) and need a word boundary, so ``created`` stays a name.
    kw = "\n".join(f"{k}.2: /{k.lower()}\\b/i" for k in KEYWORDS)
    return _RULES + "\n" + kw + f"\nCHECK.2: {_CHECK}\n"


# EXPLAIN's head: its options, then the statement explained as one REST token (lowest priority, so
# every option word and '(' is tried first). The statement may be ours or plain SQL, which this
# grammar cannot parse: parser.parse_statement classifies REST's text like any statement's.
_EXPLAIN_RULES = r"""
explain: EXPLAIN option* [REST]
option: ANALYZE -> analyze
      | LPAR item ([COMMA] item)* RPAR -> options
item: ANALYZE -> analyze
    | FORMAT (NAME | STRING | INT) -> format

EXPLAIN.2: /explain\b/i
ANALYZE.2: /analyze\b/i
FORMAT.2: /format\b/i
NAME: /[^\W\d]\w*/
INT: /\d+/
STRING: /'(?:[^']|'')*'/
LPAR: "("
RPAR: ")"
COMMA: ","
REST.-1: /[\s\S]+/

COMMENT: /--[^\n]*/ | /\/\*(.|\n)*?\*\//
%import common.WS
%ignore WS
%ignore COMMENT
"""

EXPLAIN_FORMATS = ("text", "json", "dot")


def explain_grammar() -> str:
    """EXPLAIN [ANALYZE] [(FORMAT TEXT | JSON | DOT [, ANALYZE])] <statement>."""
    return _EXPLAIN_RULES


# Readable names for lark's terminals in "expected ..." messages.
READABLE = {
    "NAME": "a name", "INT": "an integer", "NUMBER": "a number", "PARAM": "a parameter",
    "STRING": "a 'string'",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "COMMA": "','", "COLON": "':'",
    "EQ": "'='", "NE": "'<>'", "LT": "'<'", "LE": "'<='", "GT": "'>'", "GE": "'>='",
    "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "$END": "the end of the statement",
    "<END-OF-FILE>": "the end of the statement",
    **{k: k for k in KEYWORDS}, "CHECK": "CHECK",
}
