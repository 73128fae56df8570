"""Running parsed statements: blocks, transactions, groups of einsum statements, everything else.

One ``execute`` call is one unit: parsed completely (by the Connection) before anything runs,
then run inside one store transaction, so a failing statement leaves the database as it was
before the call. BEGIN ... COMMIT makes a unit of statements sent in several calls (the REPL).
Consecutive einsum statements of a unit go to the driver as one group (``con.engine``,
tensordb/driver/: bind, optimize, lower, place, run, commit); the other
statements go to their handlers (``statements.py``). The per-connection state (LETs, the open
BEGIN block) is a ``Session`` the Connection owns (``con.session``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..bind import LetDef, internal_error as _internal
from ..dialect import ast as A
from ..errors import BinderError, Error, NotSupportedError, ProgrammingError, Span, Warning
from ..result import Result
from ..storage import is_interrupt
from ..sqlfront.guard import single_statement
from . import statements
from .undo import UnitState

__all__ = ["Session", "run_script", "explain_script"]

Emit = Callable[[Result], None]


@dataclass
class Session:
    """Per-connection dialect state: LET definitions and an open BEGIN block."""

    lets: dict[str, LetDef] = field(default_factory=dict)
    block: list[tuple[str, A.Statement]] | None = None
    block_failed: bool = False

    def pending(self) -> int | None:
        """Statements queued in the open BEGIN block; None when no block is open."""
        return None if self.block is None else len(self.block)

    def abort_block(self) -> None:
        """A statement failed (or did not parse): an open block can only be rolled back now."""
        if self.block is not None:
            self.block_failed = True


def run_script(con, script: str, stmts: list[A.Statement], parameters=None,
               on_result: Emit | None = None, last: bool = False) -> list[Result]:
    """Run the statements ``stmts`` parsed from ``script``; ``on_result`` sees each result as
    soon as it exists. ``last``: only the last statement's result is wanted (``execute``), so
    the results of a group of einsum statements but its last are not made (``_run_group``);
    every other statement's result is made as before (the last one may be any of them)."""
    sess = con.session
    results: list[Result] = []

    if on_result is None:
        emit = results.append
    else:
        def emit(r: Result) -> None:
            results.append(r)
            on_result(r)
    if last and on_result is None:
        emit = _LastOnly(results)

    try:
        if parameters and stmts and all(isinstance(s, A.AssignStmt) for s in stmts):
            # einsum statements: each carries the values of its parameters, and runs as any
            stmts, parameters = bind_parameters(script, stmts, parameters), None
        if parameters and sess.block is not None:  # queued with its values, as any statement
            _check_parameterized(script, stmts)
            sess.block.append((script, _Parameterized(stmts[0], parameters)))
            emit(Result.status("queued until COMMIT", _text(script, stmts[0])))
            return results
        if parameters:
            return _run_with_parameters(con, script, stmts, parameters, emit) or results
        unit: list[tuple[str, A.Statement]] = []
        for stmt in stmts:
            if sess.block is not None:
                text = _text(script, stmt)
                if isinstance(stmt, A.CommitStmt):
                    block, failed = sess.block, sess.block_failed
                    sess.block, sess.block_failed = None, False
                    if failed:
                        raise ProgrammingError("the transaction was aborted by an earlier error; "
                                               "nothing was stored", statement=script, span=stmt.span)
                    run_unit(con, block, emit, each=on_result is not None)
                    emit(_committed("COMMIT", text))
                elif isinstance(stmt, A.RollbackStmt):
                    sess.block, sess.block_failed = None, False
                    emit(Result.status("ROLLBACK", text))
                elif isinstance(stmt, A.BeginStmt):
                    raise ProgrammingError("a transaction is already open", statement=script,
                                           span=stmt.span, hint="COMMIT or ROLLBACK it first")
                else:
                    sess.block.append((script, stmt))
                    emit(Result.status("queued until COMMIT", text))
                continue
            if isinstance(stmt, A.BeginStmt):
                run_unit(con, unit, emit, each=on_result is not None)
                unit = []
                sess.block = []
                emit(_committed("BEGIN", _text(script, stmt)))
            elif isinstance(stmt, (A.CommitStmt, A.RollbackStmt)):
                raise ProgrammingError("no transaction is open", statement=script, span=stmt.span,
                                       hint="BEGIN starts one")
            else:
                unit.append((script, stmt))
        run_unit(con, unit, emit, each=on_result is not None)
    except Error:
        sess.abort_block()
        raise
    return results


def _committed(message: str, text: str) -> Result:
    """The status of a BEGIN or COMMIT: the unit before it is stored now."""
    r = Result.status(message, text)
    r.commits = True
    return r


def _text(script: str, stmt) -> str:
    return script[stmt.span.start:stmt.span.end]


def run_unit(con, items: list[tuple[str, A.Statement]], emit: Emit, each: bool = False) -> None:
    """Run statements atomically: on any error the database, the LETs and the settings are as
    before (undo.py).

    ``each``: every result is looked at as it comes (the CLI prints it), so a group of einsum
    statements is cut before a statement that reassigns a name the group already assigned: the
    earlier statement's result is then stored, and shown, before the later one replaces it
    (in one group it would be a temporary, and its printout would show the final value)."""
    if not items:
        return
    store = con.store
    # In a transaction the user began with SQL BEGIN, tensordb writes nothing (its writes run
    # in transactions of their own: store.transaction refuses), but statements that are
    # DuckDB's, or only read, run in the user's transaction as DuckDB would run them. DuckDB's
    # settings are then the user's transaction's to keep or not: a failed statement may have
    # aborted it, and nothing can be read in it until the user's ROLLBACK.
    reads = store.user_transaction and all(isinstance(st, _IN_USER_TRANSACTION) for _, st in items)
    # einsum statements alone change no setting: the unit keeps none to put back
    assign = A.AssignStmt
    state = UnitState(con, duck=not reads,
                      settings=not all(type(st) is assign or isinstance(st, assign)
                                       for _, st in items))
    txn = contextlib.nullcontext() if store.read_only or reads else store.transaction()
    try:
        with txn:
            group: list[tuple[str, A.AssignStmt]] = []
            for script, stmt in items:
                if isinstance(stmt, A.AssignStmt):
                    if each and stmt.mode != "let" and _assigns(group, stmt.target.name):
                        _run_group(con, group, emit)
                        group = []
                    group.append((script, stmt))
                    continue
                _run_group(con, group, emit)
                group = []
                state.will_run(script, stmt)
                emit(_timed(lambda: _run_one(con, script, stmt), script, stmt.span))
            _run_group(con, group, emit)
    except BaseException as exc:
        try:
            state.restore()
        except Exception as failed:  # noqa: BLE001 - the unit's own error is the one to see
            exc.add_note(f"(the settings the unit changed could not all be put back: {failed})")
        raise


def _assigns(group: list[tuple[str, A.AssignStmt]], name: str) -> bool:
    key = name.lower()
    return any(s.mode != "let" and s.target.name.lower() == key for _, s in group)


def _internal_or_interrupt(exc: Exception, script: str, span: Span) -> BaseException:
    """A library's error nobody translated: an internal error, unless it is DuckDB's report of
    a Ctrl-C, which stays the KeyboardInterrupt it was (the command line says "interrupted")."""
    if isinstance(exc, Warning):  # a tensordb warning the caller's filter made an error
        return exc
    return KeyboardInterrupt() if is_interrupt(exc) else _internal(exc, script, span)


def _timed(fn, script: str, span: Span) -> Result:
    t0 = time.perf_counter()
    try:
        result = fn()
    except Error as exc:
        raise exc.with_source(script, span)
    except Exception as exc:  # a bug, or a library error nobody translated
        raise _internal_or_interrupt(exc, script, span) from exc
    result.elapsed = time.perf_counter() - t0
    return result


class _LastOnly:
    """``emit`` of a call that wants only its last result (``run_script(last=True)``): a
    group of einsum statements makes the result of its last statement only (the others
    would be replaced at once: a training step's LETs and outputs, 4 results a call)."""

    __slots__ = ("append",)

    def __init__(self, results: list) -> None:
        self.append = results.append

    def __call__(self, r: Result) -> None:
        self.append(r)


def _run_group(con, group: list[tuple[str, A.AssignStmt]], emit: Emit) -> None:
    if not group:
        return
    t0 = time.perf_counter()
    try:
        con.engine.run_statements(group)
    except Error as exc:
        raise exc.with_source(*_group_source(group))
    except Exception as exc:
        raise _internal_or_interrupt(exc, *_group_source(group)) from exc
    elapsed = time.perf_counter() - t0
    for script, stmt in (group[-1:] if type(emit) is _LastOnly else group):
        text = _text(script, stmt)
        if stmt.mode == "let":
            let = con.session.lets[stmt.target.name.lower()]
            r = Result.status(f"LET {let.name}: {let.dtype} {let.shape}", text)
        else:
            r = Result.for_tensor(con, stmt.target.name, text)
        r.elapsed = elapsed
        emit(r)


def _group_source(group: list[tuple[str, A.AssignStmt]]) -> tuple[str, Span]:
    """The script of a failed group and the span its error points into: its statements'."""
    script, first = group[0]
    span = first.span if len(group) == 1 or group[-1][0] is not script else \
        Span(first.span.start, group[-1][1].span.end)
    return script, span


def _run_one(con, script: str, stmt) -> Result:
    if isinstance(stmt, _Parameterized):  # a block's statement with its values
        return _sql_with_parameters(con, script, stmt.stmt, stmt.parameters)
    text = _text(script, stmt)
    if isinstance(stmt, A.ExplainStmt):
        return Result.explain(explain_statements(con, [(script, stmt.statement)], stmt.format,
                                                 stmt.analyze), text)
    if isinstance(stmt, A.DescribeStmt) and stmt.name.lower() in con.session.lets:
        let = con.session.lets[stmt.name.lower()]
        return Result.rows(["property", "value"], [
            ("name", let.name), ("kind", "LET (computed where used, never stored)"),
            ("shape", let.shape), ("dtype", let.dtype), ("definition", _text(let.script, let.stmt))],
            text)
    if isinstance(stmt, A.DropStmt) and stmt.name.lower() in con.session.lets:
        del con.session.lets[stmt.name.lower()]
        return Result.status(f"DROP LET {stmt.name}", text)
    if isinstance(stmt, A.SqlStmt) and stmt.text.strip().lower() in con.session.lets:
        let = con.session.lets[stmt.text.strip().lower()]
        labels = ",".join(f"d{i}" for i in range(len(let.shape)))
        shown = f"{let.name}[{labels}]" if labels else let.name
        raise BinderError(f"'{let.name}' is a LET: it is computed where it is used and never "
                          "stored, so there is nothing to print", statement=script, span=stmt.span,
                          hint=f"assign it to see it: {let.name}_value{'[' + labels + ']' if labels else ''}"
                               f" = {shown}; or DESCRIBE {let.name}")
    if isinstance(stmt, (A.CreateStmt, A.LoadStmt)) and stmt.name.lower() in con.session.lets:
        raise BinderError(f"'{stmt.name}' is a LET intermediate", statement=script,
                          span=stmt.name_span, hint=f"DROP TENSOR {stmt.name} to forget the LET first")
    return statements.run(con, script, stmt, text)


def explain_statements(con, items: list[tuple[str, A.AssignStmt]], format: str = "text",
                       analyze: bool = False) -> str:
    script, first = items[0]
    if any(s.mode == "let" for _, s in items):
        if analyze and all(s.mode == "let" for _, s in items):  # (a step's LET gradients run)
            let = next(s for _, s in items if s.mode == "let")
            raise ProgrammingError("EXPLAIN ANALYZE of a LET: a LET is computed only where it is "
                                   "used", statement=script, span=let.span,
                                   hint="EXPLAIN ANALYZE a statement that uses it")
        if all(s.mode == "let" for _, s in items):
            # LETs alone are explained as the computations they stand for
            items = [(sc, dataclasses.replace(s, mode="assign")) for sc, s in items]
    # EXPLAIN ANALYZE runs the statements: their results are stored, atomically. The LETs of
    # the group are inlined where they are used, as when it runs, and not kept: EXPLAIN
    # defines nothing.
    txn = con.store.transaction() if analyze else contextlib.nullcontext()
    lets_before = dict(con.session.lets)
    try:
        with txn:
            return con.engine.explain_statements(items, format, analyze)
    except Error as exc:
        raise exc.with_source(script, first.span)
    finally:
        con.session.lets.clear()
        con.session.lets.update(lets_before)


FORMATS = ("text", "json", "dot", "svg")  # explain.FORMATS (a test checks they agree)


def explain_format(format) -> str:
    """``Connection.explain``'s format, checked before anything is parsed or planned."""
    fmt = str(format).lower()
    if fmt not in FORMATS:
        raise ProgrammingError(f"EXPLAIN format must be one of {', '.join(map(repr, FORMATS))}, "
                               f"not {format!r}")
    return fmt


def explain_script(con, sql: str, stmts: list[A.Statement], fmt: str = "text",
                   analyze: bool = False) -> str:
    """``Connection.explain``: the plan of the einsum statements ``stmts`` parsed from ``sql``
    (or DuckDB's plan of one SQL statement); ``fmt`` is checked by ``explain_format``."""
    if len(stmts) == 1 and isinstance(stmts[0], A.ExplainStmt):
        s = stmts[0]
        return explain_statements(con, [(sql, s.statement)], fmt if fmt != "text" else s.format,
                                  s.analyze or analyze)
    if len(stmts) == 1 and isinstance(stmts[0], A.SqlStmt):
        if fmt in ("dot", "svg"):
            raise ProgrammingError(f"EXPLAIN format '{fmt}' draws einsum plans; a SQL statement's "
                                   "plan is DuckDB's, as text", statement=sql, span=stmts[0].span)
        prefix = "EXPLAIN ANALYZE " if analyze else "EXPLAIN "
        single_statement(stmts[0].text, "EXPLAIN's statement")  # spliced: exactly one, or none
        rel = con.sql(prefix + stmts[0].text)
        return "\n".join(str(r[-1]) for r in rel.fetchall())
    if not stmts or not all(isinstance(s, A.AssignStmt) for s in stmts):
        bad = next((s for s in stmts if not isinstance(s, A.AssignStmt)), None)
        raise ProgrammingError("EXPLAIN works on einsum statements (or one SQL statement)",
                               statement=sql, span=bad.span if bad else Span(0, len(sql)))
    return explain_statements(con, [(sql, s) for s in stmts], fmt, analyze)


@dataclass(frozen=True)
class _Parameterized:
    """A plain SQL statement and its ``?`` parameters, queued in a BEGIN block until COMMIT."""

    stmt: A.SqlStmt
    parameters: object

    @property
    def span(self) -> Span:
        return self.stmt.span


# what runs in a transaction the user began with SQL BEGIN (see run_unit)
_IN_USER_TRANSACTION = (A.SqlStmt, A.ShowTensorsStmt, A.ShowSettingStmt, A.DescribeStmt,
                        A.SetStmt, _Parameterized)


def bind_parameters(script: str, stmts: list, parameters) -> list:
    """Einsum statements with the values of their parameters (``AssignStmt.params``): a list
    for ``?`` (numbered across the statements, in order) and ``$1``, ``$2`` ...; a dict for
    ``$name``. Each value is a Python or NumPy int or float, used as a literal would be.

    Where each parameter sits is found once per parsed text (``_sites``); the same values as
    the last call's give the very statements bound then (a training step's learning rate), so
    that a repeated call is recognised by the prepared-statement cache at once."""
    by_name = type(parameters) is dict or (type(parameters) not in (list, tuple)
                                           and isinstance(parameters, Mapping))
    sites = _sites(script, stmts)
    values: list[list] = [[] for _ in stmts]
    used, got = set(), []
    for k, node, key in sites:
        text = node.text
        if by_name != isinstance(key, str):
            raise ProgrammingError(f"parameter {text} takes its value from a "
                                   f"{'list' if isinstance(key, int) else 'dict'}, but a "
                                   f"{'dict' if by_name else 'list'} was given",
                                   statement=script, span=node.span)
        try:
            value = parameters[key]
        except (KeyError, IndexError):
            raise ProgrammingError(f"no value for parameter {text}: "
                                   f"{len(parameters)} given", statement=script,
                                   span=node.span) from None
        if isinstance(value, np.generic) and value.dtype.kind in "iuf":
            value = value.item()
        if type(value) not in (int, float):
            raise ProgrammingError(f"parameter {text} is {type(value).__name__}: einsum "
                                   "parameters are ints or floats", statement=script,
                                   span=node.span)
        name = key if isinstance(key, str) else str(key + 1)
        values[k].append((node.span.start, name, value))
        got.append((type(value), value, repr(value)))  # 0.0 and -0.0 give other results
        used.add(key)
    if not used:
        raise ProgrammingError("parameters were given, but the statements have none",
                               statement=script, span=stmts[0].span,
                               hint="write $1, ? or $name where a value goes")
    if not by_name and len(used) != len(parameters):
        raise ProgrammingError(f"{len(parameters)} parameter values given for {len(used)} "
                               "parameter(s)", statement=script, span=stmts[0].span)
    last = _BOUND.get(script)
    got = tuple(got)
    if last is not None and last[0] == got and len(last[1]) == len(stmts) and all(
            a is b for a, b in zip(last[1], stmts)):
        return list(last[2])
    out = [dataclasses.replace(s, params=tuple(v)) for s, v in zip(stmts, values)]
    if len(_BOUND) >= 64:
        _BOUND.clear()
    _BOUND[script] = (got, tuple(stmts), tuple(out))
    return out


# script -> (parsed statements, [(statement index, Param node, key)]): where the parameters
# are, in the order ``?`` counts them; and script -> (values, statements, bound statements)
_SITES: dict[str, tuple] = {}
_BOUND: dict[str, tuple] = {}


def _sites(script: str, stmts: list) -> list:
    kept = _SITES.get(script)
    if kept is not None and len(kept[0]) == len(stmts) and all(
            a is b for a, b in zip(kept[0], stmts)):
        return kept[1]
    sites, asked = [], 0
    for k, stmt in enumerate(stmts):
        for node in sorted((n for n in A.walk(stmt.expr) if isinstance(n, A.Param)),
                           key=lambda n: n.span.start):  # ? counts in the order written
            text = node.text
            key = asked if text == "?" else int(text[1:]) - 1 if text[1:].isdigit() else text[1:]
            asked += text == "?"
            sites.append((k, node, key))
    if len(_SITES) >= 64:
        _SITES.clear()
    _SITES[script] = (tuple(stmts), sites)
    return sites


def _check_parameterized(script: str, stmts: list) -> None:
    if len(stmts) != 1 or not isinstance(stmts[0], A.SqlStmt):
        raise NotSupportedError("parameters are supported for one plain SQL statement",
                                statement=script, span=stmts[0].span if stmts else None)


def _run_with_parameters(con, script, stmts, parameters, emit) -> list[Result] | None:
    """``?`` parameters: for one plain SQL statement, passed to DuckDB."""
    _check_parameterized(script, stmts)
    emit(_timed(lambda: _sql_with_parameters(con, script, stmts[0], parameters), script,
                stmts[0].span))
    return None


def _sql_with_parameters(con, script: str, stmt: A.SqlStmt, parameters) -> Result:
    try:
        return statements.sql_with_parameters(con, stmt.text, parameters)
    except Error as exc:  # DuckDB's caret becomes ours (one LINE, into the script)
        raise statements.position_from_message(exc, script, stmt.span)

