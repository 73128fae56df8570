"""The tile join's SQL, built in this one module: which kernel calls of an operation run.

For an operation whose inputs are not all complete, DuckDB joins the present tiles of each input,
cut to the operation's grid, on their shared labels (``join``). Per input a relation of piece
coordinates (c0, c1, ...; ``one`` for a 0-d input) with what the catalog knows of each piece
(``f``: it holds no NaN/inf; ``n``: it holds no 0 and no NaN):

- ``stored_pieces``: a stored tensor's ``tiles`` rows, interval-joined against the pieces;
- ``made_pieces``: an earlier operation's output tiles, listed in a temporary table
  (``coords_table``) of the plan's own coordinates.

A row is kept unless the join is certainly zero there (plan/skip.py's analysis, here written as
SQL: ``nonzero_test``). Values reach DuckDB as parameters (a tensor's name and version) or as
integers the planner made (piece bounds, coordinates); labels and names never appear in the
text, and every relation and column is named by position.

>>> sql, params = stored_pieces("Zebra", 3, ((0, 4, 8),), ((0, 2, 4, 6, 8),), ("i",))
>>> params, "Zebra" in sql
(['Zebra', 3], False)
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

from ..plan import skip
from ..storage.catalog import SCHEMA

__all__ = ["stored_pieces", "every_piece", "made_pieces", "coords_table", "drop_coords_table", "join",
           "nonzero_test"]


def _list(values) -> str:
    return "[" + ",".join(str(int(v)) for v in values) + "]"


def _pieces(bounds) -> str:
    """A relation (p, lo, hi) of the pieces of one dimension."""
    n = len(bounds) - 1
    return (f"(SELECT unnest(range({n})) AS p, unnest({_list(bounds[:-1])}) AS lo, "
            f"unnest({_list(bounds[1:])}) AS hi)")


def _diagonal(sql: str, keys) -> str:
    """Only the pieces with equal indices on dimensions with equal ``keys`` (a diagonal)."""
    where = [f"c{keys.index(k)} = c{d}" for d, k in enumerate(keys) if keys.index(k) != d]
    return f"SELECT * FROM ({sql}) WHERE {' AND '.join(where)}" if where else sql


def stored_pieces(name: str, version: int, grid, bounds, keys,
                  nonfinite_column: str = "nonfinite") -> tuple[str, list]:
    """The pieces of ``bounds`` that a present stored tile of tensor ``name`` (``version``, its
    tiles on ``grid``) overlaps, with ``f`` and ``n`` (every element lies in a stored tile with
    nnz = its size and no NaN/inf); ``nonfinite_column`` is ``NULL::BOOLEAN`` for a catalog
    without the column. (SQL, parameters)."""
    r = range(len(bounds))
    src = (f"(SELECT coords, starts, shape, nnz, {nonfinite_column} AS nonfinite FROM {SCHEMA}.tiles "
           f"WHERE tensor = ? AND version = ?)")
    lo = [f"s.starts[{d + 1}]" for d in r]
    hi = [f"s.starts[{d + 1}] + s.shape[{d + 1}]" for d in r]
    # Where the pieces are the stored tiles themselves, a tile is its piece: no interval join.
    same = [tuple(bounds[d]) == tuple(grid[d]) for d in r]
    q_p = [f"s.coords[{d + 1}]" if same[d] else f"q{d}.p" for d in r]
    q_lo = [lo[d] if same[d] else f"q{d}.lo" for d in r]
    q_hi = [hi[d] if same[d] else f"q{d}.hi" for d in r]
    joins = [f"JOIN {_pieces(bounds[d])} AS q{d} ON {lo[d]} < q{d}.hi AND {hi[d]} > q{d}.lo"
             for d in r if not same[d]]
    cols = [f"{q_p[d]} AS c{d}" for d in r]
    keys_sql = ", ".join(cols) or "1 AS one"
    # A piece is free of zeros when the stored tiles with no zero (and no NaN) cover it.
    size = " * ".join(f"s.shape[{d + 1}]" for d in r) or "1"
    overlap = " * ".join(f"(least({hi[d]}, {q_hi[d]}) - greatest({lo[d]}, {q_lo[d]}))"
                         for d in r) or "1"
    volume = " * ".join(f"any_value({q_hi[d]} - {q_lo[d]})" for d in r) or "1"
    full = f"s.nnz = {size} AND s.nonfinite IS FALSE"
    group = f" GROUP BY {', '.join(f'c{d}' for d in r)}" if cols else ""
    sql = (f"SELECT {keys_sql}, bool_and(coalesce(NOT s.nonfinite, FALSE)) AS f, "
           f"sum(CASE WHEN {full} THEN {overlap} ELSE 0 END) = {volume} AS n "
           f"FROM {src} AS s {' '.join(joins)}{group} HAVING count(*) > 0")
    return _diagonal(sql, list(keys)), [name, int(version)]


def coords_table(table: str, coords, rank: int) -> str:
    """The statement that makes temporary table ``table`` (a name the lowering makes: c0, c1,
    ...) of tile coordinates."""
    cols = [f"c{d}" for d in range(rank)] or ["one"]
    rows = [tuple(c) for c in coords] if rank else ([(1,)] if coords else [])
    values = ", ".join("(" + ", ".join(str(int(v)) for v in row) + ")" for row in rows)
    body = f"SELECT * FROM (VALUES {values}) AS v({', '.join(cols)})" if rows else \
        f"SELECT {', '.join(f'NULL::BIGINT AS {c}' for c in cols)} WHERE FALSE"
    return f"CREATE OR REPLACE TEMP TABLE {table} AS {body}"


def drop_coords_table(table: str) -> str:
    return f"DROP TABLE IF EXISTS {table}"


def every_piece(bounds, keys, finite: bool) -> tuple[str, list]:
    """Every piece of ``bounds`` (an input with no catalog tiles: a slice's, a gather's or
    positions' reader, storage/boxes.py, which reads zeros where no stored tile lies): ``f``
    is ``finite``, ``n`` false. (SQL, parameters)."""
    r = range(len(bounds))
    cols = [f"q{d}.p AS c{d}" for d in r]
    parts = [f"{_pieces(bounds[d])} AS q{d}" for d in r]
    src = ", ".join(parts) if parts else "(SELECT 1) AS unit"
    sql = (f"SELECT {', '.join(cols) or '1 AS one'}, {'TRUE' if finite else 'FALSE'} AS f, "
           f"FALSE AS n FROM {src}")
    return _diagonal(sql, list(keys)), []


def made_pieces(table: str, grid, bounds, keys) -> tuple[str, list]:
    """The pieces of ``bounds`` that a tile listed in ``table`` (a ``coords_table`` of tiles on
    ``grid``) overlaps; nothing is known of their values (``f`` and ``n`` are false)."""
    cols, joins = [], []
    for d in range(len(bounds)):
        if tuple(grid[d]) == tuple(bounds[d]):
            cols.append(f"s.c{d} AS c{d}")
            continue
        joins.append(f"JOIN {_pieces(grid[d])} AS g{d} ON g{d}.p = s.c{d}")
        joins.append(f"JOIN {_pieces(bounds[d])} AS q{d} ON g{d}.lo < q{d}.hi "
                     f"AND g{d}.hi > q{d}.lo")
        cols.append(f"q{d}.p AS c{d}")
    keys_sql = ", ".join(cols) or "1 AS one"
    sql = f"SELECT DISTINCT {keys_sql}, FALSE AS f, FALSE AS n FROM {table} AS s {' '.join(joins)}"
    return _diagonal(sql, list(keys)), []


class _Sql:
    """plan/skip.py's booleans as SQL text, folding TRUE and FALSE."""

    true, false = "TRUE", "FALSE"

    @staticmethod
    def const(value: bool) -> str:
        return "TRUE" if value else "FALSE"

    @staticmethod
    def and_(a: str, b: str) -> str:
        if a == "FALSE" or b == "FALSE":
            return "FALSE"
        return b if a == "TRUE" else a if b == "TRUE" else f"({a} AND {b})"

    @staticmethod
    def or_(a: str, b: str) -> str:
        if a == "TRUE" or b == "TRUE":
            return "TRUE"
        return b if a == "FALSE" else a if b == "FALSE" else f"({a} OR {b})"


def _not(sql: str) -> str:
    return {"TRUE": "FALSE", "FALSE": "TRUE"}.get(sql, f"(NOT {sql})")


def nonzero_test(expr, present: Callable[[int], str], finite: Callable[[int], str],
                 nonzero: Callable[[int], str]) -> str:
    """A SQL boolean that is false only where ``expr`` is certainly zero (``skip.certainly_zero``).
    The callables give, per input, SQL for: its tile is present; it holds no NaN/inf (true for an
    absent tile); it holds no 0 and no NaN (false for an absent tile).

    >>> from tensordb.plan.scalar import parse_join
    >>> nonzero_test(parse_join("x0 * x1"), lambda k: "TRUE", lambda k: "TRUE", lambda k: "FALSE")
    'TRUE'
    """
    facts = (lambda k: _not(present(k)), finite, nonzero)
    return _not(skip.certainly_zero(expr, _Sql, facts))


def join(op, pieces: Mapping[str, int], inner: Sequence[int], outer: Sequence[int],
         whole: set, relation: Callable[[int], tuple[str, list]]) -> tuple[str, list]:
    """The tile join of ``op`` (an EinOp) with ``pieces`` per label: the ``inner`` inputs joined
    on shared labels, the ``outer`` ones left-joined (a presence flag each), the rows kept that
    ``nonzero_test`` does not prove zero from their pieces' facts. ``whole``: complete stored
    inputs known finite, left out (their labels range over the whole grid) unless the test
    reads their facts; ``relation(k)``: input k's pieces relation (``stored_pieces`` or
    ``made_pieces``). One row per kernel call: the label piece indices in ``op.labels`` order,
    then the outer inputs' flags. (SQL, parameters)."""
    present = {k: "TRUE" for k in inner} | {
        k: f"(in{k}.{'c0' if op.inputs[k].labels else 'one'} IS NOT NULL)" for k in outer}
    whole = set(whole)
    while True:
        test = nonzero_test(op.join, lambda k: present[k],
                            lambda k: "TRUE" if k in whole else f"coalesce(in{k}.f, TRUE)",
                            lambda k: f"coalesce(in{k}.n, FALSE)")
        needed = {k for k in whole if f"in{k}." in test}
        if not needed:
            break
        whole -= needed
    ctes, params = [], []
    for k in range(len(op.inputs)):
        if k not in whole:
            sql, values = relation(k)
            ctes.append(f"in{k} AS ({sql})")
            params += values
    number = {l: i for i, l in enumerate(op.labels)}
    label_col: dict[int, str] = {}
    from_parts, conds = [], []
    for k in inner:
        if k in whole:
            continue
        from_parts.append(f"in{k}")
        for d, l in enumerate(op.inputs[k].labels):
            col = f"in{k}.c{d}"
            if number[l] in label_col:
                conds.append(f"{label_col[number[l]]} = {col}")
            else:
                label_col[number[l]] = col
    for l, i in number.items():
        if i not in label_col:
            ctes.append(f"r_{len(label_col)} AS (SELECT unnest(range({int(pieces[l])})) AS c0)")
            from_parts.append(f"r_{len(label_col)}")
            label_col[i] = f"r_{len(label_col)}.c0"
    if not from_parts:  # no labels and no input that must be present: one call
        from_parts.append("(SELECT 1 AS one) AS unit")
    sql_from = from_parts[0]
    for part in from_parts[1:]:
        sql_from += f" CROSS JOIN {part}" if not conds else f" JOIN {part} ON TRUE"
    flags = []
    for k in outer:
        on = " AND ".join(f"in{k}.c{d} = {label_col[number[l]]}"
                          for d, l in enumerate(op.inputs[k].labels))
        sql_from += f" LEFT JOIN in{k} ON {on or 'TRUE'}"
        flags.append(f"{present[k]} AS p{k}")
    conds.append(test)
    select = [f"{label_col[i]} AS l{i}" for i in number.values()] + flags
    return (f"WITH {', '.join(ctes)} SELECT {', '.join(select) or '1'} FROM {sql_from} "
            f"WHERE {' AND '.join(conds)}"), params
