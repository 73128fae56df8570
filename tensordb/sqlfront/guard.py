"""What user text may do: nothing writes inside the database directory, and a query spliced into
a larger statement is exactly one SELECT.

Which files a statement writes is DuckDB's to say, not ours: ``json_serialize_plan`` binds the
statement on the very connection that will run it (its tables, variables and settings) and
returns the logical plan, in which a COPY names its file (``file_path``, after DuckDB evaluated
an expression target such as ``('w.tdb' || '/catalog.duckdb')``), EXPORT DATABASE its directory,
ATTACH its database ``path``, SET the new value of a setting and a table function call its
arguments. Only statements that can write a file are bound this way (statement types from
``duckdb.extract_statements``); one that cannot be checked is refused rather than run unchecked.
Paths are resolved like the OS does (relative to the working directory, symlinks followed, ``~``
as DuckDB expands it) and compared with the resolved database directory.

The catalog's own tables (schema ``tensordb``) are tensordb's alone: a statement that would insert,
update, delete, create, alter or drop anything in a schema of that name is refused, whichever
database it is in. The written table is again DuckDB's to say (the bound plan names it, after the
search path is applied); reading the catalog tables is allowed.
"""
from __future__ import annotations

import os

import duckdb

from ..errors import ProgrammingError, Span
from ..storage import translating
from .sqltext import bound_plan as _plan
from .sqltext import explained as _explained
from .sqltext import prepared as _prepared
from .sqltext import single_select, single_statement, statements
from .sqltext import strings as _strings
from .sqltext import words as _words

__all__ = ["inside", "check_path", "statements", "check_statement", "single_select", "tables_made",
           "single_statement", "in_catalog_schema", "PATH_SETTINGS"]

# DuckDB settings that name a file or directory DuckDB writes (or that decides where "~" points,
# and with it the default secret and extension directories).
PATH_SETTINGS = frozenset({
    "temp_directory", "log_query_path", "profile_output", "profiling_output", "secret_directory",
    "extension_directory", "extension_directories", "home_directory",
    "extension_repository_directory"})
# Table functions that write files, and the arguments that name them.
_WRITING_FUNCTIONS = {"enable_logging": ("storage_path", "storage_config")}

_T = duckdb.StatementType
# Statement types that can write a file (or hold one that can, as EXPLAIN ANALYZE and PREPARE do).
# COPY FROM DATABASE is not among them: it writes into a database attached before, whose file was
# checked by its ATTACH.
_CHECKED = {_T.COPY, _T.EXPORT, _T.ATTACH, _T.SET, _T.PRAGMA, _T.CALL, _T.EXPLAIN, _T.PREPARE}


def _root(store) -> str:
    return os.path.realpath(str(store.root))


def _resolve(store, path: str) -> str | None:
    """The absolute path DuckDB's local file system would use, or None for a remote URL."""
    path = str(path)
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif path.startswith("file:"):
        path = path[len("file:"):]
    elif "://" in path:
        return None  # s3://, http://: not a local file
    if path == "~" or path.startswith("~/"):
        home = _setting(store, "home_directory") or os.path.expanduser("~")
        path = home + path[1:]
    return os.path.realpath(path)


def _setting(store, name: str) -> str:
    with translating():
        row = store.duck.execute("SELECT current_setting(?)", [name]).fetchall()
    value = row[0][0] if row else None
    return str(value) if value else ""


def inside(store, path) -> bool:
    """Whether ``path`` names the database directory or anything in it (after symlinks, ``..``
    and the working directory are resolved; a file not created yet counts as well), or is a hard
    link to one of its files."""
    resolved = _resolve(store, os.fspath(path))
    if resolved is None:
        return False
    roots = [_root(store)]
    tiles = getattr(store, "tiles_dir", None)  # an in-memory database's may be on a tmpfs
    if tiles is not None and not getattr(store, "persistent", True):
        tiles = os.path.dirname(os.path.realpath(tiles))  # its tiles/ and id file
        if tiles != roots[0]:
            roots.append(tiles)
    for root in roots:
        if resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return any(_hard_link_inside(resolved, root) for root in roots)


def _hard_link_inside(path: str, root: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_nlink < 2 or not os.path.isfile(path):
        return False
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                other = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return True
    return False


_HINT = ("the catalog, its WAL, the payload files in tiles/ and DuckDB's spill files live there; "
         "writing any of them would destroy tensors. Choose a path outside it")


def check_path(store, path, what: str) -> None:
    """ProgrammingError when ``what`` would use ``path`` inside the database directory."""
    if inside(store, path):
        raise ProgrammingError(
            f"{what}: {os.fspath(path)} is inside the database directory {store.root}", hint=_HINT)


# -- statements (what DuckDB says of them: sqltext.py) ---------------------------------------------

# Statement types that can change a table or schema, and the catalog schema they may not touch.
_TABLE_WRITERS = {_T.INSERT, _T.UPDATE, _T.DELETE, _T.CREATE, _T.DROP, _T.ALTER, _T.MERGE_INTO,
                  _T.COPY}
_CATALOG_SCHEMA = "tensordb"


def check_catalog_write(store, stmt) -> None:
    """ProgrammingError (nothing run) when ``stmt`` would change the catalog schema."""
    if stmt.type not in _TABLE_WRITERS:
        return
    if stmt.type == _T.COPY:
        target = _copy_from_target(stmt)
        if target is None:  # COPY ... TO writes a file, checked by check_statement
            return
        names = [target]
    else:
        names = _catalog_targets(store, stmt)
    for name in names:
        if in_catalog_schema(store, name):
            spelled = ".".join(p for p in name if p)
            raise ProgrammingError(
                f"{_kind(stmt)} statement refused: it would change {spelled}, part of "
                "tensordb's catalog", statement=stmt.query, span=Span(0, len(stmt.query)),
                hint="the tensordb schema describes every tensor and its payload files; change "
                     "tensors with tensordb's statements (DROP TENSOR, CREATE OR REPLACE TENSOR); "
                     "reading the catalog tables is allowed")


def in_catalog_schema(store, name: tuple) -> bool:
    """Whether a (catalog, schema, name) / (schema, name) / (name,) path lies in a schema called
    tensordb. A one-part name is in the current schema; a two-part ``a.b`` may be schema a or
    database a, and counts when ``a`` is tensordb."""
    parts = [str(p).lower() for p in name if p is not None]
    if len(parts) == 1:
        return _current_schema(store) == _CATALOG_SCHEMA
    return _CATALOG_SCHEMA in parts[-3:-1] if len(parts) >= 3 else parts[0] == _CATALOG_SCHEMA


def _current_schema(store) -> str:
    with translating():
        return str(store.duck.execute("SELECT current_schema()").fetchall()[0][0]).lower()


def _catalog_targets(store, stmt) -> list[tuple]:
    """The tables and schemas ``stmt`` writes, as qualified-name paths, from its bound plan; when
    DuckDB cannot serialize the plan, every name the statement spells (refusing is then safe)."""
    plan = _plan(store, stmt, refuse_unknown=False)
    if plan is None:
        words = {w.strip('"') for _, w, op in _words(stmt.query) if not op}
        return [(_CATALOG_SCHEMA, "?")] if _CATALOG_SCHEMA in words else [("?",)] * (
            _current_schema(store) == _CATALOG_SCHEMA)
    out = []
    for node in plan.get("plans", []):
        info = node.get("table_info") or node.get("info") or {}
        path = (info.get("qualified_name") or {}).get("path")
        if info.get("type") == "SCHEMA_ENTRY":  # DROP SCHEMA: the schema is its name
            out.append((info.get("schema") or "", info.get("name") or "", ""))
        elif path:
            out.append(tuple(path))
    return out


def tables_made(store, stmt) -> list[str]:
    """The names of the tables and views in the main schema (of this database, or temporary)
    that ``stmt`` creates or renames a table to, from DuckDB's bound plan: tensors share that
    namespace. However the name is spelled (quoted, qualified, after a comment)."""
    if stmt.type not in (_T.CREATE, _T.ALTER):
        return []
    plan = _plan(store, stmt, refuse_unknown=False)
    if plan is None:
        return []
    home = _current_database(store).lower()
    out = []
    for node in plan.get("plans", []):
        info = node.get("table_info") or node.get("info") or {}
        path = list((info.get("qualified_name") or {}).get("path") or ())
        if info.get("alter_table_type") == "RENAME_TABLE" and path:
            path[-1] = info.get("new_table_name") or path[-1]
        elif info.get("alter_view_type") == "RENAME_VIEW" and path:
            path[-1] = info.get("new_view_name") or path[-1]
        elif stmt.type == _T.ALTER or info.get("type") not in ("TABLE_ENTRY", "VIEW_ENTRY"):
            continue  # a macro, a sequence, a type, an index: names of their own kind
        if len(path) == 3 and path[0].lower() in (home, "temp") and path[1].lower() == "main":
            out.append(path[2])
    return out


def _copy_from_target(stmt) -> tuple | None:
    """The table a ``COPY table [(columns)] FROM ...`` writes, as its spelled name parts; None for
    COPY ... TO (the first FROM or TO outside parentheses tells which)."""
    depth, parts = 0, []
    for _, word, op in _words(stmt.query)[1:]:
        if op:
            depth += word.count("(") - word.count(")")
            continue
        if depth:
            continue
        if word in ("to", "from"):
            return tuple(parts) if word == "from" and parts else None
        parts.append(word.strip('"'))
    return None


def _kind(stmt) -> str:
    """The statement's name as the user wrote it: DuckDB parses USE, RESET and PRAGMA x = y as
    SET statements, which is not what a message should call them."""
    if stmt.type != _T.SET:
        return stmt.type.name
    first = next((w for _, w, op in _words(stmt.query) if not op), "")
    return first.upper() if first in ("use", "reset", "pragma") else stmt.type.name


def needs_check(stmt) -> bool:
    if stmt.type in _CHECKED:
        return True
    # A table function that writes (enable_logging) may also be called from a SELECT.
    return any(w.strip('"') in _WRITING_FUNCTIONS for _, w, op in _words(stmt.query) if not op)


def check_statement(store, stmt, parameters=None) -> None:
    """Refuse (ProgrammingError, nothing run) a statement that would write inside the database
    directory or change the catalog schema, or whose targets cannot be known before it runs."""
    check_catalog_write(store, stmt)
    if stmt.type == _T.PRAGMA:
        _check_pragma(stmt)
    if stmt.type == _T.COPY and _copy_from_target(stmt) is not None:
        return  # COPY ... FROM reads a file into a table: it writes no file
    if not needs_check(stmt):
        return
    what = f"{_kind(stmt)} statement"
    if stmt.type == _T.EXPLAIN:
        inner = _explained(stmt)
        if inner is not None:
            check_statement(store, inner, parameters)
        return
    if stmt.type == _T.PREPARE:
        inner = _prepared(stmt)
        if needs_check(inner):
            raise ProgrammingError(
                f"cannot PREPARE a {inner.type.name} statement: where it writes must be checked "
                "when it runs", hint="run it directly (a query may be prepared)")
        return
    if parameters:
        raise ProgrammingError(f"a {stmt.type.name} statement cannot take ? parameters: where it "
                               "writes must be checked before it runs",
                               hint="write the target into the statement")
    before = _directories(store) if stmt.type == _T.EXPORT else None
    try:
        plan = _plan(store, stmt)
        if plan is None:
            return
        _check_current_database(store, stmt, plan)
        for target in _targets(plan):
            if inside(store, target):
                # The caret goes under the target where the statement spells it out.
                at = stmt.query.find(target)
                raise ProgrammingError(
                    f"{what} refused: it would write {target}, inside the database directory "
                    f"{store.root}", hint=_HINT, statement=stmt.query,
                    span=Span(at, at + len(target)) if at >= 0 else Span(0, len(stmt.query)))
    except BaseException:
        if before is not None:
            _remove_new_directories(store, before)
        raise


def _check_pragma(stmt) -> None:
    """IMPORT DATABASE runs the statements of files tensordb cannot check before they run (any of
    them could delete the catalog's rows or write a payload file): refused."""
    words = [w for _, w, op in _words(stmt.query) if not op]
    if words[:1] == ["import"] or words[:2] == ["pragma", "import_database"]:
        raise ProgrammingError(
            "IMPORT DATABASE refused: it runs the statements in the directory's schema.sql and "
            "load.sql, which tensordb cannot check before they run", statement=stmt.query,
            span=Span(0, len(stmt.query)),
            hint="run the files' statements yourself, e.g. con.execute(open('dir/schema.sql')"
                 ".read()), so each one is checked")


def _check_current_database(store, stmt, plan) -> None:
    """USE / SET schema / SET search_path may not move the current database away from the
    catalog's: tensordb's own statements name the catalog schema without a database."""
    home = _current_database(store)
    with translating():
        others = {str(r[0]).lower() for r in store.duck.execute(
            "SELECT database_name FROM duckdb_databases() WHERE NOT internal").fetchall()}
    others.discard(home.lower())
    for node in plan.get("plans", []):
        if node.get("type") != "LOGICAL_SET" or \
                str(node.get("name", "")).lower() not in ("schema", "search_path"):
            continue
        for value in _strings(node.get("value")):
            for entry in value.split(","):
                first = entry.strip().strip('"').split(".")[0].strip('"').lower()
                if first in others:
                    raise ProgrammingError(
                        f"{_kind(stmt)} statement refused: it would make '{first}' the "
                        f"current database; tensordb's catalog is in '{home}'",
                        statement=stmt.query, span=Span(0, len(stmt.query)),
                        hint=f"name tables of an attached database in full ({first}.table)")


def _current_database(store) -> str:
    with translating():
        return str(store.duck.execute("SELECT current_database()").fetchall()[0][0])


def _targets(node):
    """Every path the plan writes, or points a setting (or a writing table function) at."""
    if isinstance(node, list):
        for item in node:
            yield from _targets(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "LOGICAL_COPY_TO_FILE" and node.get("file_path"):
        yield node["file_path"]
    elif kind == "LOGICAL_EXPORT":
        yield node["copy_info"]["file_path"]
    elif kind == "LOGICAL_ATTACH":
        path = node["info"].get("path") or ""
        if path and not path.startswith(":memory:"):
            yield path
    elif kind == "LOGICAL_SET" and str(node.get("name", "")).lower() in PATH_SETTINGS:
        for value in _strings(node.get("value")):
            if value:
                yield value
    elif kind == "LOGICAL_GET":
        name = (node.get("qname") or {}).get("path", [""])[-1]
        for key in _WRITING_FUNCTIONS.get(str(name).lower(), ()):
            for param in node.get("named_parameters", []):
                if param.get("key") == key:
                    for value in _strings(param.get("value")):
                        yield value
    for key in ("plans", "children"):
        yield from _targets(node.get(key, []))


# -- EXPORT DATABASE creates its directory while it is bound ---------------------------------------

def _directories(store) -> set[str]:
    out = set()
    for folder, dirs, _ in os.walk(_root(store)):
        out.update(os.path.join(folder, d) for d in dirs)
    return out


def _remove_new_directories(store, before: set[str]) -> None:
    """Remove the (empty) directories that binding a refused EXPORT created in the database."""
    for path in sorted(_directories(store) - before, key=len, reverse=True):
        try:
            os.rmdir(path)
        except OSError:
            pass
